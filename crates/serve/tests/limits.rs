//! The server under long prompts, abusive clients and its own bugs: a long prompt is
//! prefilled in chunks and dropped at the next chunk when its client leaves, a panic fails
//! only its own request, and the limits on bodies, headers, prompt sizes, prompt counts and
//! the queue answer with the statuses clients expect. Each test starts its own server on an
//! ephemeral port over a model written here (the tiny checkpoint's tokenizer), so what the
//! model does per token is known.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use frognano_model::cache::{Cache, KvType, LayerCache};
use frognano_model::CausalLm;
use frognano_serve::{spawn_server_with_model, ServeConfig, ServerHandle};
use serde_json::{json, Value};

/// A model that writes one token forever and takes `per_token` for every position it runs,
/// prompt or generated (as a real model's prefill takes time per token); counts the
/// positions it ran. A prompt holding `poison` panics inside `forward`, as a bug in a
/// model's kernels would.
struct SlowLm {
    vocab: usize,
    token: u32,
    per_token: Duration,
    poison: Option<u32>,
    positions: Arc<AtomicUsize>,
}

impl CausalLm for SlowLm {
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn max_context(&self) -> usize {
        16384
    }
    fn new_cache(&self) -> Cache {
        Cache::new(vec![LayerCache::attention(KvType::F32, 1, 1)])
    }
    fn forward(&self, ids: &[u32], cache: &mut Cache, _all: bool) -> frognano_model::Result<Vec<f32>> {
        if let Some(p) = self.poison {
            assert!(!ids.contains(&p), "index out of bounds in a kernel (token {p})");
        }
        std::thread::sleep(self.per_token * ids.len() as u32);
        self.positions.fetch_add(ids.len(), Ordering::SeqCst);
        let LayerCache::Attention { k, v } = &mut cache.layers[0] else { unreachable!() };
        k.push(&ids.iter().map(|&i| i as f32).collect::<Vec<_>>());
        v.push(&vec![0.0; ids.len()]);
        cache.pos += ids.len();
        let mut logits = vec![0.0; self.vocab];
        logits[self.token as usize] = 10.0;
        Ok(logits)
    }
}

/// A server over a [`SlowLm`]; returns it and the model's position counter.
fn slow_server(
    per_token: Duration,
    poison: Option<u32>,
    tune: impl FnOnce(&mut ServeConfig),
) -> (ServerHandle, Arc<AtomicUsize>) {
    let mut loaded = frognano_model::load(tiny()).unwrap();
    let token = loaded.tokenizer().unwrap().encode("a").unwrap()[0];
    let positions = Arc::new(AtomicUsize::new(0));
    loaded.model = Box::new(SlowLm {
        vocab: loaded.model.vocab_size(),
        token,
        per_token,
        poison,
        positions: Arc::clone(&positions),
    });
    let mut a = args("slow");
    tune(&mut a);
    (spawn_server_with_model(loaded, a).unwrap(), positions)
}

fn health(url: &str) -> Value {
    get(&format!("{url}/health")).1
}

/// Polls `/health` until `ok` holds (a minute at most: the machine may be loaded).
fn wait_for(url: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let t = Instant::now();
    loop {
        let h = health(url);
        if ok(&h) {
            return h;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "waited a minute for {what}: {h}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A raw HTTP/1.1 POST of `body` to `path`, left open.
fn raw_post(addr: std::net::SocketAddr, path: &str, body: &Value) -> TcpStream {
    let mut sock = TcpStream::connect(addr).unwrap();
    let body = body.to_string();
    write!(
        sock,
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    sock
}

/// Whether the server closes `sock` within `within` (reads until end of stream); what it
/// sent before closing.
fn closed_within(sock: &mut TcpStream, within: Duration) -> Option<String> {
    sock.set_read_timeout(Some(within)).unwrap();
    let mut got = Vec::new();
    match sock.read_to_end(&mut got) {
        Ok(_) => Some(String::from_utf8_lossy(&got).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(String::from_utf8_lossy(&got).into_owned()),
        Err(_) => None,
    }
}

#[test]
fn a_client_that_leaves_during_a_long_prefill_cancels_it_at_the_next_chunk() {
    // 1 ms per prompt token, 64 per chunk: the 6,000-token prompt would take 6 s to come in.
    let (s, positions) = slow_server(Duration::from_millis(1), None, |a| a.prefill_chunk = 64);
    let url = s.url();
    let long: Vec<u32> = (0..6000).map(|i| 5 + i % 50).collect();

    // Non-streaming: the client hangs up while the prompt is being prefilled.
    let sock = raw_post(s.addr(), "/v1/completions", &json!({"prompt": long, "max_tokens": 4}));
    wait_for(&url, "the long prompt's prefill", |h| h["prefilling"] == 1);
    sock.shutdown(std::net::Shutdown::Both).unwrap();
    drop(sock);
    let h = wait_for(&url, "the cancel", |h| h["cancelled"] == 1 && h["prefilling"] == 0);
    let ran = positions.load(Ordering::SeqCst);
    assert!(ran < 6000, "the whole prompt ran ({ran} positions) although its client had left: {h}");
    assert!(h["prefill_chunks"].as_u64().unwrap() < 6000 / 64, "{h}");
    // The next request is served at once.
    let (st, short) = post(&format!("{url}/v1/completions"), &json!({"prompt": [5, 6], "max_tokens": 2}));
    assert_eq!(st, 200, "{short}");

    // Streaming: the client gets the response's headers and leaves. (Another prompt: the
    // first one's prefix, kept for reuse, would not run again.)
    let before = positions.load(Ordering::SeqCst);
    let other: Vec<u32> = (0..6000).map(|i| 60 + i % 50).collect();
    let resp = ureq::post(&format!("{url}/v1/completions"))
        .send_json(json!({"prompt": other, "max_tokens": 4, "stream": true}))
        .unwrap();
    wait_for(&url, "the second long prefill", |h| h["prefilling"] == 1);
    drop(resp);
    let h = wait_for(&url, "the streamed request's cancel", |h| h["cancelled"] == 2 && h["prefilling"] == 0);
    let ran = positions.load(Ordering::SeqCst) - before;
    assert!(ran < 6000, "the whole streamed prompt ran ({ran} positions) after its client left: {h}");
    assert_eq!(h["completed"], 1, "{h}");
}

#[test]
fn a_long_prompt_does_not_stop_a_running_stream() {
    let (s, _) = slow_server(Duration::from_millis(1), None, |a| a.prefill_chunk = 32);
    let url = s.url();
    let resp = ureq::post(&format!("{url}/v1/completions"))
        .send_json(json!({"prompt": [5, 6, 7], "max_tokens": 400, "stream": true}))
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(resp.into_reader()));
    let mut next_chunk = || loop {
        let line = lines.next().expect("the stream goes on").unwrap();
        if line.starts_with("data: ") {
            return line;
        }
    };
    next_chunk();
    let long: Vec<u32> = (0..3000).map(|i| 5 + i % 50).collect();
    let cmpl = format!("{url}/v1/completions");
    let long_request = std::thread::spawn(move || post(&cmpl, &json!({"prompt": long, "max_tokens": 2})));
    wait_for(&url, "the long prefill", |h| h["prefilling"] == 1);
    // While the 3,000-token prompt comes in (94 chunks), the stream keeps getting tokens.
    let chunks_at_start = health(&url)["prefill_chunks"].as_u64().unwrap();
    for _ in 0..20 {
        next_chunk();
    }
    let h = health(&url);
    assert_eq!(h["prefilling"], 1, "20 stream tokens arrived while the long prompt was still being prefilled: {h}");
    assert!(h["prefill_chunks"].as_u64().unwrap() > chunks_at_start, "{h}");
    let (st, body) = long_request.join().unwrap();
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["usage"]["prompt_tokens"], 3000);
}

#[test]
fn a_panic_in_one_request_is_a_500_and_the_others_are_served() {
    let poison = 77;
    let (s, _) = slow_server(Duration::from_millis(2), Some(poison), |_| {});
    let url = s.url();
    let cmpl = format!("{url}/v1/completions");
    let stream_url = cmpl.clone();
    let streaming = std::thread::spawn(move || {
        stream(&stream_url, &json!({"prompt": [5, 6, 7], "max_tokens": 300, "stream": true}))
    });
    wait_for(&url, "the stream", |h| h["running"] == 1);
    let (st, body) = post(&cmpl, &json!({"prompt": [5, 6, poison, 8], "max_tokens": 3}));
    assert_eq!(st, 500, "{body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("panicked while prefilling the prompt") && msg.contains("index out of bounds"), "{msg}");
    assert_eq!(body["error"]["type"], "server_error");
    let events = streaming.join().unwrap();
    let chunks = chunks(&events);
    let finish = chunks.last().unwrap()["choices"][0]["finish_reason"].clone();
    assert_eq!(finish, "length", "the stream beside the panic ran to its end");
    let h = health(&url);
    assert_eq!(
        (h["panics"].as_u64(), h["failed"].as_u64(), h["completed"].as_u64()),
        (Some(1), Some(1), Some(1)),
        "{h}"
    );
    let (st, after) = post(&cmpl, &json!({"prompt": [5, 6], "max_tokens": 2}));
    assert_eq!(st, 200, "{after}");
}

#[test]
fn slow_and_idle_connections_are_closed_and_a_slow_body_is_a_408() {
    let (s, _) = slow_server(Duration::ZERO, None, |a| {
        a.header_timeout_secs = 1;
        a.body_timeout_secs = 1;
    });
    // Idle: a connection that never sends anything.
    let mut idle = TcpStream::connect(s.addr()).unwrap();
    assert!(closed_within(&mut idle, Duration::from_secs(20)).is_some(), "an idle connection was kept open");
    // Slowloris: headers that never end.
    let mut slow = TcpStream::connect(s.addr()).unwrap();
    write!(slow, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: a").unwrap();
    assert!(
        closed_within(&mut slow, Duration::from_secs(20)).is_some(),
        "a connection with unfinished headers was kept open"
    );
    // Kept alive after a request, then idle.
    let mut kept = raw_post(s.addr(), "/v1/completions", &json!({"prompt": [5], "max_tokens": 1}));
    let reply = closed_within(&mut kept, Duration::from_secs(20)).expect("an idle kept-alive connection was kept open");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // A body that stops arriving.
    let mut body = TcpStream::connect(s.addr()).unwrap();
    write!(body, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"prompt\"").unwrap();
    let reply = closed_within(&mut body, Duration::from_secs(20)).expect("a stalled body was waited for forever");
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("did not arrive within 1 s"), "{reply}");
}

#[test]
fn a_prompt_too_long_for_the_context_is_refused_before_it_is_tokenized() {
    let mut a = args(&tiny());
    a.ctx = Some(64);
    let s = frognano_serve::spawn_server(a).unwrap();
    let tok = frognano_model::load(tiny()).unwrap().tokenizer.unwrap();
    let longest = frognano_serve::routes::longest_token_bytes(&tok);
    assert!((4..200).contains(&longest), "longest token {longest} bytes");
    // At least 64 tokens whatever the text: the bytes alone say it cannot fit.
    let huge = "frog ".repeat(64 * longest * 2 / 5 + 10);
    let (st, body) = post(&format!("{}/v1/completions", s.url()), &json!({"prompt": huge}));
    assert_eq!(st, 400, "{body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("maximum context length is 64 tokens"), "{msg}");
    assert!(msg.contains(&format!("prompt 0 is {} bytes of text, which is at least", huge.len())), "{msg}");
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    let (st, body) =
        post(&format!("{}/v1/chat/completions", s.url()), &json!({"messages": [{"role": "user", "content": huge}]}));
    assert_eq!(st, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("bytes of text"), "{body}");
    // A text under the bound is tokenized and measured exactly.
    let (st, body) = post(&format!("{}/v1/completions", s.url()), &json!({"prompt": "frog ".repeat(80)}));
    assert_eq!(st, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("your prompt has"), "{body}");
}

#[test]
fn too_many_prompts_is_a_400_and_a_full_queue_a_429_with_retry_after() {
    let (s, _) = slow_server(Duration::from_millis(2), None, |a| {
        a.max_concurrent = 1;
        a.max_waiting = 2;
        a.max_prompts_per_request = 4;
    });
    let url = s.url();
    let cmpl = format!("{url}/v1/completions");
    let (st, body) = post(&cmpl, &json!({"prompt": [[5], [6], [7], [8], [9]], "max_tokens": 1}));
    assert_eq!(st, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("at most 4 per request"), "{body}");
    assert_eq!(body["error"]["param"], "prompt");

    // One running, two waiting: the queue is full.
    let running = ureq::post(&cmpl).send_json(json!({"prompt": [5], "max_tokens": 5000, "stream": true})).unwrap();
    wait_for(&url, "the running stream", |h| h["running"] == 1);
    let waiting: Vec<_> = (0..2)
        .map(|i| {
            let cmpl = cmpl.clone();
            std::thread::spawn(move || post(&cmpl, &json!({"prompt": [5 + i], "max_tokens": 2})))
        })
        .collect();
    wait_for(&url, "two waiting requests", |h| h["waiting"] == 2);
    let resp = match ureq::post(&cmpl).send_json(json!({"prompt": [9], "max_tokens": 2})) {
        Err(ureq::Error::Status(429, r)) => r,
        other => panic!("expected a 429, got {other:?}"),
    };
    let retry: u64 = resp.header("retry-after").expect("a Retry-After header").parse().unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    let body: Value = resp.into_json().unwrap();
    assert_eq!(body["error"]["code"], "server_overloaded");
    // A request with several prompts is queued whole or not at all.
    let (st, _) = post(&cmpl, &json!({"prompt": [[5], [6]], "max_tokens": 1}));
    assert_eq!(st, 429);
    assert_eq!(health(&url)["waiting"], 2, "no prompt of the refused request was queued");
    drop(running);
    for w in waiting {
        let (st, body) = w.join().unwrap();
        assert_eq!(st, 200, "{body}");
    }
}
