//! The Tinker client against an in-process HTTP/1.1 server that speaks the protocol the way
//! SkyRL's Tinker API does: every call's method, path and body are checked, futures answer
//! 408 (still running) once before their result, and one full step — connect, capabilities,
//! forward_backward, optim_step, save_weights_for_sampler, archive download, save_weights,
//! load_weights — goes through the real client.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use frognano_rl::loss::{Datum, LossConfig};
use frognano_rl::optim::AdamWConfig;
use frognano_rl::tinker::{choose_loss, find_file, unpack, TinkerClient};
use serde_json::{json, Value};

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    body: Value,
}

/// The fake server's memory: every request, the futures it handed out, how often each was
/// polled, and the archive it serves.
#[derive(Default)]
struct State {
    seen: Vec<Seen>,
    /// request_id → the result `retrieve_future` gives once the future is done.
    futures: HashMap<String, Value>,
    polls: HashMap<String, usize>,
    archive: Vec<u8>,
}

const MODEL: &str = "model-7";

/// Serves until the test ends (the thread dies with the process); returns the base URL.
fn serve(state: Arc<Mutex<State>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let state = state.clone();
            std::thread::spawn(move || handle(stream, &state));
        }
    });
    url
}

/// Reads one request (headers, then `Content-Length` bytes of body), answers it and closes.
fn handle(stream: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
    let mut length = 0;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        if header.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = header.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    let body: Value = if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).unwrap() };
    let (status, content_type, payload) = answer(state, &method, &path, &body);
    let mut stream = stream;
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        payload.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&payload).unwrap();
}

fn json_answer(v: Value) -> (&'static str, &'static str, Vec<u8>) {
    ("200 OK", "application/json", v.to_string().into_bytes())
}

/// A future for `request_id` whose result is `result`.
fn future(st: &mut State, request_id: &str, result: Value) -> (&'static str, &'static str, Vec<u8>) {
    st.futures.insert(request_id.to_string(), result);
    json_answer(json!({"request_id": request_id}))
}

/// The protocol: what each endpoint takes and gives. A call the client should not make, or
/// a body missing what the server needs, gets an error status (which fails the client).
fn answer(state: &Mutex<State>, method: &str, path: &str, body: &Value) -> (&'static str, &'static str, Vec<u8>) {
    let mut st = state.lock().unwrap();
    st.seen.push(Seen { method: method.into(), path: path.into(), body: body.clone() });
    let bad = |why: &str| ("422 Unprocessable Entity", "text/plain", why.as_bytes().to_vec());
    let model_call = |st: &State| body["model_id"] == MODEL && body["seq_id"].as_u64() == Some(seq_calls(st) - 1);
    match (method, path) {
        ("GET", "/api/v1/healthz") => json_answer(json!({"status": "ok"})),
        ("POST", "/api/v1/create_session") if body["tags"].is_array() && body["sdk_version"].is_string() => {
            json_answer(json!({"session_id": "sess-1"}))
        }
        ("POST", "/api/v1/create_model")
            if body["session_id"] == "sess-1"
                && body["base_model"] == "Qwen/Qwen3.5-4B"
                && body["lora_config"] == json!({"rank": 8, "seed": 3}) =>
        {
            future(&mut st, "req-model", json!({"model_id": MODEL}))
        }
        ("GET", "/api/v1/get_server_capabilities") => {
            json_answer(json!({"supported_loss_fns": ["cross_entropy", "importance_sampling", "ppo"]}))
        }
        ("POST", "/api/v1/forward_backward") if model_call(&st) => {
            let input = &body["forward_backward_input"];
            let data = input["data"].as_array().cloned().unwrap_or_default();
            let shaped = data.iter().all(|d| {
                let n = d["model_input"]["chunks"][0]["tokens"].as_array().map_or(0, Vec::len);
                let f = &d["loss_fn_inputs"];
                n > 0
                    && ["target_tokens", "weights", "logprobs", "advantages"]
                        .iter()
                        .all(|k| f[k]["data"].as_array().map(Vec::len) == Some(n))
            });
            if data.is_empty() || !shaped || input["loss_fn"] != "ppo" || !input["loss_fn_config"].is_object() {
                return bad("forward_backward_input needs data of equal-length arrays, loss_fn and its config");
            }
            let outputs: Vec<Value> = data.iter().map(|_| json!({"logprobs": {"data": [-0.25]}})).collect();
            let id = format!("fb-{}", body["seq_id"]);
            future(&mut st, &id, json!({"loss_fn_outputs": outputs, "metrics": {"loss:sum": 1.5}}))
        }
        ("POST", "/api/v1/optim_step") if model_call(&st) => {
            let adam = &body["adam_params"];
            if ["learning_rate", "beta1", "beta2", "eps", "weight_decay"].iter().any(|k| !adam[k].is_number()) {
                return bad("adam_params incomplete");
            }
            let id = format!("opt-{}", body["seq_id"]);
            future(&mut st, &id, json!({"metrics": {"lr": adam["learning_rate"]}}))
        }
        ("POST", "/api/v1/save_weights_for_sampler") if model_call(&st) && body["path"] == "step-000001" => {
            future(&mut st, "save-sampler", json!({"path": format!("tinker://{MODEL}/sampler_weights/step-000001")}))
        }
        // Answered at once, without a future: the client must take either form.
        ("POST", "/api/v1/save_weights") if model_call(&st) && body["path"] == "resume-1" => {
            json_answer(json!({"path": format!("tinker://{MODEL}/weights/resume-1")}))
        }
        ("POST", "/api/v1/load_weights")
            if model_call(&st) && body["path"] == format!("tinker://{MODEL}/weights/resume-1") =>
        {
            future(&mut st, "load", json!({}))
        }
        ("GET", p) if p == format!("/api/v1/training_runs/{MODEL}/checkpoints/step-000001/archive") => {
            ("200 OK", "application/gzip", st.archive.clone())
        }
        ("POST", "/api/v1/retrieve_future") => {
            let id = body["request_id"].as_str().unwrap_or_default().to_string();
            let Some(result) = st.futures.get(&id).cloned() else { return bad("unknown request_id") };
            let polls = st.polls.entry(id).or_insert(0);
            *polls += 1;
            // Every future is still running at its first poll.
            if *polls == 1 {
                ("408 Request Timeout", "application/json", br#"{"detail":"still running"}"#.to_vec())
            } else {
                json_answer(result)
            }
        }
        _ => ("404 Not Found", "text/plain", format!("no {method} {path} here: {body}").into_bytes()),
    }
}

/// How many `seq_id`-numbered calls the server has seen (the current one included).
fn seq_calls(st: &State) -> u64 {
    let numbered = ["forward_backward", "optim_step", "save_weights_for_sampler", "save_weights", "load_weights"];
    st.seen.iter().filter(|s| numbered.iter().any(|e| s.path == format!("/api/v1/{e}"))).count() as u64
}

/// A `.tar.gz` holding `ckpt/sampler_weights/step-000001/adapter_model.safetensors`.
fn adapter_archive(bytes: &[u8]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let inner = dir.path().join("sampler_weights/step-000001");
    std::fs::create_dir_all(&inner).unwrap();
    std::fs::write(inner.join("adapter_model.safetensors"), bytes).unwrap();
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tb = tar::Builder::new(gz);
    tb.append_dir_all("ckpt", dir.path()).unwrap();
    tb.into_inner().unwrap().finish().unwrap()
}

fn datum(n: usize, advantage: f32) -> Datum {
    Datum {
        input: (10..10 + n as u32).collect(),
        targets: (11..11 + n as u32).collect(),
        old_logprobs: vec![-0.5; n],
        trainer_logprobs: None,
        weights: (0..n).map(|i| if i + 2 >= n { 1.0 } else { 0.0 }).collect(),
        advantage,
        group: 0,
        scale: 0.5,
    }
}

#[test]
fn one_train_step_and_checkpoint_go_through_the_tinker_protocol() {
    let state = Arc::new(Mutex::new(State { archive: adapter_archive(b"adapter bytes"), ..State::default() }));
    let url = serve(state.clone());

    let mut client = TinkerClient::connect(&url, "Qwen/Qwen3.5-4B", 8, 3).unwrap();
    assert_eq!((client.session_id.as_str(), client.model_id.as_str()), ("sess-1", MODEL));

    let caps = client.capabilities().unwrap();
    let (loss_fn, loss_config) = choose_loss(&caps, &LossConfig::default()).unwrap();
    assert_eq!(loss_fn, "ppo");
    let data = [datum(6, 1.0), datum(4, -0.5)];
    let adam = AdamWConfig::default();
    let (fb, opt) = client.train_step(&data, &loss_fn, loss_config.as_ref(), &adam).unwrap();
    assert_eq!(fb.len(), 1, "two small datums fit one body");
    assert_eq!(fb[0]["metrics"]["loss:sum"], 1.5);
    assert_eq!(fb[0]["loss_fn_outputs"].as_array().unwrap().len(), 2);
    assert!((opt["metrics"]["lr"].as_f64().unwrap() - adam.lr).abs() < 1e-9, "{opt}");

    let sampler = client.save_for_sampler("step-000001").unwrap();
    assert_eq!(sampler, format!("tinker://{MODEL}/sampler_weights/step-000001"));
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("step.tar.gz");
    client.download("step-000001", &archive).unwrap();
    unpack(&archive, &dir.path().join("out")).unwrap();
    let adapter = find_file(&dir.path().join("out"), "adapter_model.safetensors").unwrap();
    assert_eq!(std::fs::read(adapter).unwrap(), b"adapter bytes");

    let resume = client.save_weights("resume-1").unwrap();
    assert_eq!(resume, format!("tinker://{MODEL}/weights/resume-1"));
    client.load_weights(&resume).unwrap();
    assert_eq!(client.seq_id, 5, "five numbered calls, each numbered once");

    let st = state.lock().unwrap();
    let calls: Vec<String> = st.seen.iter().map(|s| format!("{} {}", s.method, s.path)).collect();
    let expected = [
        "GET /api/v1/healthz",
        "POST /api/v1/create_session",
        "POST /api/v1/create_model",
        "POST /api/v1/retrieve_future",
        "POST /api/v1/retrieve_future",
        "GET /api/v1/get_server_capabilities",
        "POST /api/v1/forward_backward",
        "POST /api/v1/retrieve_future",
        "POST /api/v1/retrieve_future",
        "POST /api/v1/optim_step",
        "POST /api/v1/retrieve_future",
        "POST /api/v1/retrieve_future",
        "POST /api/v1/save_weights_for_sampler",
        "POST /api/v1/retrieve_future",
        "POST /api/v1/retrieve_future",
        &format!("GET /api/v1/training_runs/{MODEL}/checkpoints/step-000001/archive"),
        "POST /api/v1/save_weights",
        "POST /api/v1/load_weights",
        "POST /api/v1/retrieve_future",
        "POST /api/v1/retrieve_future",
    ];
    assert_eq!(calls, expected);
    // Each future was polled past its 408 exactly once more, for the id it was given.
    let polled: Vec<&str> = st.seen.iter().filter_map(|s| s.body["request_id"].as_str()).collect();
    assert_eq!(
        polled,
        ["req-model", "req-model", "fb-0", "fb-0", "opt-1", "opt-1", "save-sampler", "save-sampler", "load", "load"]
    );

    // The datums as sent: the normaliser folded into the advantage of the trained tokens.
    let fb_body = &st.seen[6].body;
    let sent = fb_body["forward_backward_input"]["data"].as_array().unwrap();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0]["model_input"]["chunks"][0]["tokens"], json!([10, 11, 12, 13, 14, 15]));
    assert_eq!(sent[0]["loss_fn_inputs"]["target_tokens"]["data"], json!([11, 12, 13, 14, 15, 16]));
    assert_eq!(sent[0]["loss_fn_inputs"]["advantages"]["data"], json!([0.0, 0.0, 0.0, 0.0, 0.5, 0.5]));
    assert_eq!(sent[1]["loss_fn_inputs"]["advantages"]["data"], json!([0.0, 0.0, -0.25, -0.25]));
    let close = |sent: &Value, want: &Value| (sent.as_f64().unwrap() - want.as_f64().unwrap()).abs() < 1e-9;
    let config_sent = &fb_body["forward_backward_input"]["loss_fn_config"];
    let config = loss_config.unwrap();
    for k in ["clip_low_threshold", "clip_high_threshold"] {
        assert!(close(&config_sent[k], &config[k]), "{k}: {config_sent} vs {config}");
    }
    let adam_sent = &st.seen[9].body["adam_params"];
    assert!(close(&adam_sent["learning_rate"], &json!(adam.lr)), "{adam_sent}");
    assert!(close(&adam_sent["beta2"], &json!(adam.beta2)), "{adam_sent}");
}

#[test]
fn a_server_error_names_the_endpoint_and_the_servers_words() {
    let state = Arc::new(Mutex::new(State::default()));
    let url = serve(state);
    let err = TinkerClient::connect(&url, "some/other-model", 8, 3).err().unwrap().to_string();
    assert!(err.contains("/api/v1/create_model: the Tinker server answered HTTP 404"), "{err}");
    assert!(err.contains("no POST /api/v1/create_model here"), "{err}");
}
