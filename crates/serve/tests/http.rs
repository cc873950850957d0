//! The server over plain HTTP, started in-process on an ephemeral port with the tiny
//! checkpoint (random weights) or a scripted model that writes a known reply.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::time::{Duration, Instant};

use common::*;
use frognano_model::cache::{Cache, KvType, LayerCache};
use frognano_model::CausalLm;
use frognano_serve::spawn_server_with_model;
use serde_json::{json, Value};

fn chat_body(text: &str) -> Value {
    json!({"model": "qwen35-tiny", "messages": [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": text}], "temperature": 0, "max_tokens": 12})
}

#[test]
fn models_health_tokenize_detokenize() {
    let s = tiny_server();
    let (st, models) = get(&format!("{}/v1/models", s.url()));
    assert_eq!(st, 200);
    assert_eq!(models["data"][0]["id"], "qwen35-tiny");
    assert_eq!(models["data"][0]["max_model_len"], 4096);
    let (st, one) = get(&format!("{}/v1/models/qwen35-tiny", s.url()));
    assert_eq!((st, one["object"].as_str()), (200, Some("model")));
    let (st, health) = get(&format!("{}/health", s.url()));
    assert_eq!((st, health["status"].as_str()), (200, Some("ok")));

    let (st, tok) = post(&format!("{}/tokenize", s.url()), &json!({"prompt": "hello world"}));
    assert_eq!(st, 200);
    let ids = tok["tokens"].as_array().unwrap().clone();
    assert_eq!(tok["count"].as_u64().unwrap() as usize, ids.len());
    assert!(!ids.is_empty());
    let (st, text) = post(&format!("{}/detokenize", s.url()), &json!({"tokens": ids}));
    assert_eq!((st, text["prompt"].as_str()), (200, Some("hello world")));

    let (st, chat) = post(&format!("{}/tokenize", s.url()), &json!({"messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(st, 200);
    assert_eq!(chat["prompt"], "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

#[test]
fn chat_greedy_is_deterministic_reports_usage_and_reuses_the_prompt() {
    let s = tiny_server();
    let url = format!("{}/v1/chat/completions", s.url());
    let (st, a) = post(&url, &chat_body("Say something."));
    assert_eq!(st, 200, "{a}");
    assert_eq!(a["object"], "chat.completion");
    assert_eq!(a["choices"][0]["message"]["role"], "assistant");
    let finish = a["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(finish == "length" || finish == "stop", "{finish}");
    let usage = &a["usage"];
    let (_, tok) =
        post(&format!("{}/tokenize", s.url()), &json!({"messages": chat_body("Say something.")["messages"]}));
    assert_eq!(usage["prompt_tokens"], tok["count"]);
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=12).contains(&completion));
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), usage["prompt_tokens"].as_u64().unwrap() + completion);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);

    let (_, b) = post(&url, &chat_body("Say something."));
    assert_eq!(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"], "greedy is deterministic");
    // The same prompt again lands on the session that holds it.
    assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], b["usage"]["prompt_tokens"]);
}

#[test]
fn follow_up_turn_only_runs_the_new_tokens() {
    let s = tiny_server();
    let url = format!("{}/v1/chat/completions", s.url());
    let first = chat_body("Tell me about frogs.");
    let (_, a) = post(&url, &first);
    let reply = a["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let p1 = a["usage"]["prompt_tokens"].as_u64().unwrap();
    let mut second = first.clone();
    let msgs = second["messages"].as_array_mut().unwrap();
    msgs.push(json!({"role": "assistant", "content": reply}));
    msgs.push(json!({"role": "user", "content": "And toads?"}));
    let (st, b) = post(&url, &second);
    assert_eq!(st, 200, "{b}");
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached >= p1, "follow-up reused {cached} tokens, the first prompt had {p1}");
    assert!(cached < b["usage"]["prompt_tokens"].as_u64().unwrap());
}

#[test]
fn streaming_chat_matches_non_streaming() {
    let s = tiny_server();
    let url = format!("{}/v1/chat/completions", s.url());
    let (_, whole) = post(&url, &chat_body("Stream please."));
    let mut body = chat_body("Stream please.");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let chunks = chunks(&stream(&url, &body));
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String =
        chunks.iter().filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str().map(str::to_string)).collect();
    assert_eq!(text, whole["choices"][0]["message"]["content"].as_str().unwrap(), "the same text, untrimmed");
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]);
    let finish = &chunks[chunks.len() - 2]["choices"][0]["finish_reason"];
    assert_eq!(finish, &whole["choices"][0]["finish_reason"]);
    assert!(chunks[..chunks.len() - 2].iter().all(|c| c["choices"][0]["finish_reason"].is_null()));
}

#[test]
fn logprobs_in_chat_and_completions() {
    let s = tiny_server();
    let mut body = chat_body("Numbers.");
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let (st, r) = post(&format!("{}/v1/chat/completions", s.url()), &body);
    assert_eq!(st, 200, "{r}");
    let entries = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    let completion = r["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    let eos = usize::from(r["choices"][0]["finish_reason"] == "stop");
    assert_eq!(entries.len(), completion - eos, "one entry per visible token");
    for e in entries {
        let lp = e["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0);
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"], e["token"]);
        assert!((top[0]["logprob"].as_f64().unwrap() - lp).abs() < 1e-6);
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
        let bytes: Vec<u8> = e["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
        assert_eq!(String::from_utf8_lossy(&bytes), e["token"].as_str().unwrap());
    }

    let (st, c) = post(
        &format!("{}/v1/completions", s.url()),
        &json!({"prompt": "The frog", "max_tokens": 5, "temperature": 0, "logprobs": 2}),
    );
    assert_eq!(st, 200, "{c}");
    let lp = &c["choices"][0]["logprobs"];
    let n = lp["tokens"].as_array().unwrap().len();
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), n);
    assert_eq!(lp["text_offset"].as_array().unwrap().len(), n);
    assert!(lp["top_logprobs"].as_array().unwrap().iter().all(|m| m.as_object().unwrap().len() <= 2));
    let joined: String = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, c["choices"][0]["text"].as_str().unwrap());
}

#[test]
fn completions_accept_text_and_token_ids() {
    let s = tiny_server();
    let url = format!("{}/v1/completions", s.url());
    let (_, tok) = post(&format!("{}/tokenize", s.url()), &json!({"prompt": "Once upon a time"}));
    let (st, by_text) = post(&url, &json!({"prompt": "Once upon a time", "temperature": 0, "max_tokens": 6}));
    assert_eq!(st, 200, "{by_text}");
    assert_eq!(by_text["object"], "text_completion");
    let (_, by_ids) = post(&url, &json!({"prompt": tok["tokens"], "temperature": 0, "max_tokens": 6}));
    assert_eq!(by_text["choices"][0]["text"], by_ids["choices"][0]["text"]);
    let (_, two) = post(&url, &json!({"prompt": ["a b", "c d"], "temperature": 0, "max_tokens": 3}));
    assert_eq!(two["choices"].as_array().unwrap().len(), 2);
    assert_eq!(two["choices"][1]["index"], 1);
    let (_, default_len) = post(&url, &json!({"prompt": "x", "temperature": 0}));
    assert!(default_len["usage"]["completion_tokens"].as_u64().unwrap() <= 16);

    let chunks = chunks(&stream(
        &url,
        &json!({"prompt": "Once upon a time", "temperature": 0, "max_tokens": 6, "stream": true}),
    ));
    let text: String = chunks.iter().map(|c| c["choices"][0]["text"].as_str().unwrap().to_string()).collect();
    assert_eq!(text, by_text["choices"][0]["text"].as_str().unwrap());
}

fn tool_request(stream: bool) -> Value {
    json!({"model": "qwen35-tiny", "stream": stream, "tools": [bash_tool()],
        "chat_template_kwargs": {"enable_thinking": true},
        "messages": [{"role": "system", "content": "You are a software-engineering agent."},
                     {"role": "user", "content": "List files."}]})
}

#[test]
fn tool_calls_come_back_in_openai_shape() {
    let s = qwen_server(Some(TOOL_REPLY));
    let url = format!("{}/v1/chat/completions", s.url());
    let (st, r) = post(&url, &tool_request(false));
    assert_eq!(st, 200, "{r}");
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let msg = &choice["message"];
    // Exactly the text before `</think>`, as the stream sends it.
    assert_eq!(msg["reasoning_content"], "Let me list the files.\n");
    assert!(msg["content"].is_null(), "{msg}");
    let call = &msg["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(call["function"]["name"], "Bash");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"command": "ls -la", "timeout": 30}), "typed by the schema");

    // Streaming: reasoning deltas, then the call as OpenAI sends it (name first, then arguments).
    let chunks = chunks(&stream(&url, &tool_request(true)));
    let reasoning: String = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["delta"]["reasoning_content"].as_str().map(str::to_string))
        .collect();
    assert_eq!(reasoning, msg["reasoning_content"].as_str().unwrap());
    let calls: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0][0]["index"], 0);
    assert_eq!(calls[0][0]["function"]["name"], "Bash");
    assert_eq!(calls[0][0]["function"]["arguments"], "");
    let streamed_args: Value = serde_json::from_str(calls[1][0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(streamed_args, args);
    assert!(chunks
        .iter()
        .all(|c| c["choices"].get(0).is_none_or(|ch| ch["delta"].get("content").is_none_or(|t| t == ""))));
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");

    // Round trip: the call and its result go back as history, rendered as the model was trained.
    let mut next = tool_request(false);
    let msgs = next["messages"].as_array_mut().unwrap();
    msgs.push(json!({"role": "assistant", "content": null, "reasoning_content": msg["reasoning_content"],
        "tool_calls": msg["tool_calls"]}));
    msgs.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "a.py\nb.py"}));
    let (st, rendered) = post(
        &format!("{}/tokenize", s.url()),
        &json!({"messages": next["messages"],
        "tools": next["tools"], "chat_template_kwargs": {"enable_thinking": true}}),
    );
    assert_eq!(st, 200, "{rendered}");
    let prompt = rendered["prompt"].as_str().unwrap();
    assert!(
        prompt.ends_with(
            "<|im_start|>assistant\n<think>\nLet me list the files.\n</think>\n\n<tool_call>\n<function=Bash>\n\
         <parameter=command>\nls -la\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n</function>\n\
         </tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\na.py\nb.py\n</tool_response><|im_end|>\n\
         <|im_start|>assistant\n<think>\n"
        ),
        "{prompt}"
    );
    let (st, r2) = post(&url, &next);
    assert_eq!(st, 200, "{r2}");
    assert_eq!(r2["choices"][0]["finish_reason"], "tool_calls");
    assert!(r2["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0);

    // tool_choice "none": the call text stays text.
    let mut none = tool_request(false);
    none["tool_choice"] = json!("none");
    let (_, r3) = post(&url, &none);
    assert!(r3["choices"][0]["message"].get("tool_calls").is_none());
    assert!(r3["choices"][0]["message"]["content"].as_str().unwrap().contains("<function=Bash>"));
    assert_eq!(r3["choices"][0]["finish_reason"], "stop");
}

#[test]
fn thinking_off_gives_plain_content_and_stop_strings_cut() {
    let s = qwen_server(Some("alpha beta STOP gamma"));
    let url = format!("{}/v1/chat/completions", s.url());
    let body = json!({"messages": [{"role": "user", "content": "go"}], "stop": ["STOP"]});
    let (st, r) = post(&url, &body);
    assert_eq!(st, 200, "{r}");
    // The text before the stop string, exactly as the stream sends it (its space included).
    assert_eq!(r["choices"][0]["message"]["content"], "alpha beta ");
    assert!(r["choices"][0]["message"].get("reasoning_content").is_none());
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let text: String = chunks(&stream(&url, &streamed))
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, "alpha beta ");
    let (_, whole) = post(&url, &json!({"messages": [{"role": "user", "content": "go"}]}));
    assert_eq!(whole["choices"][0]["message"]["content"], "alpha beta STOP gamma");
}

fn assert_error(resp: (u16, Value), status: u16, needle: &str) -> Value {
    let (st, body) = resp;
    assert_eq!(st, status, "{body}");
    let err = &body["error"];
    let msg = err["message"].as_str().unwrap_or_else(|| panic!("OpenAI error shape: {body}"));
    assert!(msg.contains(needle), "{msg:?} should contain {needle:?}");
    assert!(err["type"].is_string());
    err.clone()
}

#[test]
fn bad_input_gets_openai_errors_and_the_server_keeps_serving() {
    let mut a = args(&tiny());
    a.ctx = Some(64);
    a.max_body_bytes = 8192;
    let s = frognano_serve::spawn_server(a).unwrap();
    let chat = format!("{}/v1/chat/completions", s.url());
    let cmpl = format!("{}/v1/completions", s.url());
    assert_error(post_raw(&chat, "{\"messages\": ["), 400, "not valid JSON");
    assert_error(post_raw(&chat, "[1, 2]"), 400, "JSON object");
    let e = assert_error(
        post(&chat, &json!({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"})),
        400,
        "invalid type",
    );
    assert_eq!(e["param"], "temperature");
    assert_error(post(&chat, &json!({"model": "x"})), 400, "missing field `messages`");
    let e = assert_error(
        post(&chat, &json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})),
        404,
        "gpt-4o",
    );
    assert_eq!(e["code"], "model_not_found");
    let long = "frog ".repeat(200);
    let e = assert_error(
        post(&chat, &json!({"messages": [{"role": "user", "content": long}]})),
        400,
        "maximum context length",
    );
    assert_eq!(e["code"], "context_length_exceeded");
    assert_error(post(&cmpl, &json!({"prompt": long})), 400, "maximum context length");
    // `max_tokens` is a cap: past what the context of 64 leaves, the reply ends with it.
    let (st, r) = post(
        &chat,
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000,
        "temperature": 0}),
    );
    assert_eq!(st, 200, "{r}");
    let u = &r["usage"];
    if r["choices"][0]["finish_reason"] == "length" {
        assert_eq!(u["total_tokens"], 64, "the reply filled the context: {r}");
    }
    assert_error(post_raw(&chat, &format!("{{\"messages\": [], \"pad\": \"{}\"}}", "x".repeat(20_000))), 413, "limit");
    let e = assert_error(
        post(
            &chat,
            &json!({"messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object", "properties": "command"}}}]}),
        ),
        400,
        "properties",
    );
    assert_eq!(e["param"], "tools[0].function.parameters");
    assert_error(
        post(&chat, &json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]})),
        400,
        "tools[0].function",
    );
    assert_error(post(&chat, &json!({"messages": [{"role": "wizard", "content": "hi"}]})), 400, "role");
    assert_error(post(&chat, &json!({"messages": []})), 400, "at least one message");
    assert_error(
        post(&chat, &json!({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 50, "logprobs": true})),
        400,
        "top_logprobs",
    );
    assert_error(post(&chat, &json!({"messages": [{"role": "user", "content": "hi"}], "n": 2})), 400, "n = 1");
    assert_error(post(&chat, &json!({"messages": [{"role": "user", "content": "hi"}], "top_p": 0})), 400, "top_p");
    assert_error(
        post(
            &chat,
            &json!({"messages": [{"role": "assistant", "content": null,
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}]}]}),
        ),
        400,
        "arguments",
    );
    assert_error(post(&cmpl, &json!({"prompt": [5, 99999]})), 400, "outside the vocabulary");
    assert_error(post(&cmpl, &json!({"prompt": {"text": "hi"}})), 400, "prompt");
    assert_error(post(&format!("{}/detokenize", s.url()), &json!({"tokens": [99999]})), 400, "99999");
    assert_error(post(&format!("{}/v1/nothing", s.url()), &json!({})), 404, "No such endpoint");
    assert_error(get(&chat), 405, "Method not allowed");
    // Still serving.
    let (st, ok) = post(&chat, &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}));
    assert_eq!(st, 200, "{ok}");
    // Tool-call arguments some clients send as an object rather than a JSON string are accepted.
    // (On a server with the model's full context: this template has no tool support, so the
    // call and its result are written into the turns, which needs more than 64 tokens.)
    let full = frognano_serve::spawn_server(args(&tiny())).unwrap();
    let (st, ok) = post(
        &format!("{}/v1/chat/completions", full.url()),
        &json!({"max_tokens": 3, "messages": [{"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "tool_call_id": "c", "content": "done"}]}),
    );
    assert_eq!(st, 200, "{ok}");
}

/// A model that writes the same token forever, slowly (2 ms per token).
struct EndlessLm {
    vocab: usize,
    token: u32,
}

impl CausalLm for EndlessLm {
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn max_context(&self) -> usize {
        8192
    }
    fn new_cache(&self) -> Cache {
        Cache::new(vec![LayerCache::attention(KvType::F32, 1, 1)])
    }
    fn forward(&self, ids: &[u32], cache: &mut Cache, _all: bool) -> frognano_model::Result<Vec<f32>> {
        std::thread::sleep(Duration::from_millis(2));
        let LayerCache::Attention { k, v } = &mut cache.layers[0] else { unreachable!() };
        k.push(&ids.iter().map(|&i| i as f32).collect::<Vec<_>>());
        v.push(&vec![0.0; ids.len()]);
        cache.pos += ids.len();
        let mut logits = vec![0.0; self.vocab];
        logits[self.token as usize] = 10.0;
        Ok(logits)
    }
}

fn health(url: &str) -> Value {
    get(&format!("{url}/health")).1
}

fn wait_idle(url: &str, cancelled: u64) -> Value {
    let t = Instant::now();
    loop {
        let h = health(url);
        if h["cancelled"].as_u64() >= Some(cancelled) && h["running"] == 0 {
            return h;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "generation did not stop after the client left: {h}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn client_disconnect_stops_generation() {
    let mut loaded = frognano_model::load(tiny()).unwrap();
    let token = loaded.tokenizer().unwrap().encode("a").unwrap()[0];
    loaded.model = Box::new(EndlessLm { vocab: loaded.model.vocab_size(), token });
    let s = spawn_server_with_model(loaded, args("endless")).unwrap();
    let url = s.url();

    // Streaming: read a few chunks, then hang up.
    let resp = ureq::post(&format!("{url}/v1/chat/completions"))
        .send_json(json!({"messages": [{"role": "user", "content": "go"}], "max_tokens": 3000, "stream": true}))
        .unwrap();
    let mut lines = BufReader::new(resp.into_reader()).lines();
    let mut seen = 0;
    while seen < 5 {
        if lines.next().unwrap().unwrap().starts_with("data: ") {
            seen += 1;
        }
    }
    drop(lines);
    let h = wait_idle(&url, 1);
    assert!(h["generated_tokens"].as_u64().unwrap() < 1000, "{h}");

    // Non-streaming: send the request on a raw socket and close it while it runs.
    let before = h["generated_tokens"].as_u64().unwrap();
    let mut sock = std::net::TcpStream::connect(s.addr()).unwrap();
    let body = json!({"messages": [{"role": "user", "content": "go"}], "max_tokens": 3000}).to_string();
    write!(sock, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(health(&url)["running"], 1);
    sock.shutdown(std::net::Shutdown::Both).unwrap();
    let mut rest = Vec::new();
    let _ = sock.read_to_end(&mut rest);
    drop(sock);
    let h = wait_idle(&url, 2);
    assert!(h["generated_tokens"].as_u64().unwrap() - before < 1000, "{h}");
}

#[test]
fn a_quantized_kv_cache_serves_and_reuses_prompts() {
    // `serve --kv-cache q8_0`: the cache holds ggml Q8_0 rows; replies stay deterministic and a
    // repeated prompt is still served from the session that holds it.
    let mut a = args(&tiny());
    a.kv_cache = Some(KvType::Q8_0);
    let s = frognano_serve::spawn_server(a).expect("server starts with --kv-cache q8_0");
    assert_eq!(health(&s.url())["kv_cache"], "q8_0");
    assert_eq!(health(&tiny_server().url())["kv_cache"], "f32", "a checkpoint folder keeps f32 unless asked");
    let url = format!("{}/v1/chat/completions", s.url());
    let (st, first) = post(&url, &chat_body("Say something."));
    assert_eq!(st, 200, "{first}");
    let (_, second) = post(&url, &chat_body("Say something."));
    assert_eq!(first["choices"][0]["message"]["content"], second["choices"][0]["message"]["content"]);
    assert_eq!(second["usage"]["prompt_tokens_details"]["cached_tokens"], second["usage"]["prompt_tokens"]);
}
