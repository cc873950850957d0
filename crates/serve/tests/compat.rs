//! Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`,
//! `/api/version`, `/`) and Anthropic's
//! Messages API (`/v1/messages`) over plain HTTP, read as their clients read them: Ollama's
//! stream line by line, Anthropic's events in order. Greedy replies match the OpenAI
//! endpoint's for the same conversation; tool calls make the round trip through the Qwen3.5
//! template on a scripted model.

use crate::common;

use std::io::{BufRead, BufReader};

use common::*;
use serde_json::{json, Value};

const MODEL: &str = "qwen35-tiny";

fn openai_chat(url: &str, messages: &Value, max_tokens: u64) -> Value {
    let (st, body) = post(
        &format!("{url}/v1/chat/completions"),
        &json!({"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": max_tokens,
                "chat_template_kwargs": {"enable_thinking": false}}),
    );
    assert_eq!(st, 200, "{body}");
    body
}

/// POSTs to an Ollama streaming endpoint; returns the content type and every line as JSON.
fn ndjson(url: &str, body: &Value) -> (String, Vec<Value>) {
    let resp = ureq::post(url).send_json(body.clone()).unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let kind = resp.header("content-type").unwrap_or_default().to_string();
    let lines = BufReader::new(resp.into_reader())
        .lines()
        .map(|l| l.expect("line"))
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(&l).unwrap_or_else(|e| panic!("line is not JSON ({e}): {l}")))
        .collect();
    (kind, lines)
}

/// Checks an Ollama stream's shape: every line but the last has `done: false`, the last
/// `done: true` with the counts; returns the concatenated `field` (a path into each line).
fn ollama_stream_text(lines: &[Value], pick: impl Fn(&Value) -> &Value) -> String {
    let (last, parts) = lines.split_last().expect("at least one line");
    for p in parts {
        assert_eq!(p["done"], false, "{p}");
        assert!(p["created_at"].as_str().is_some_and(|t| t.ends_with('Z') && t.contains('T')), "{p}");
        assert_eq!(p["model"], "qwen35-tiny:latest");
    }
    assert_eq!(last["done"], true, "{last}");
    for field in ["total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count"] {
        assert!(last[field].is_u64(), "{field} in {last}");
    }
    parts.iter().map(|p| pick(p).as_str().unwrap_or_default().to_string()).collect()
}

/// The Anthropic headers a client sends; the server accepts them.
fn anthropic(url: &str, body: &Value) -> (u16, Value) {
    let resp = ureq::post(&format!("{url}/v1/messages"))
        .set("x-api-key", "not-needed")
        .set("anthropic-version", "2023-06-01")
        .send_json(body.clone());
    let resp = match resp {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST /v1/messages: {e}"),
    };
    (resp.status(), resp.into_json().expect("JSON body"))
}

/// A streamed `/v1/messages` reply as `(event name, data)` pairs, in order.
fn anthropic_events(url: &str, body: &Value) -> Vec<(String, Value)> {
    let resp = ureq::post(&format!("{url}/v1/messages"))
        .set("anthropic-version", "2023-06-01")
        .send_json(body.clone())
        .expect("stream accepted");
    sse_events(resp)
}

/// Checks the event grammar (message_start, blocks opened, filled and closed one at a time
/// with indices 0, 1, …, message_delta, message_stop) and folds the blocks as a client does.
fn fold_anthropic_stream(events: &[(String, Value)]) -> (Vec<Value>, Value) {
    for (name, data) in events {
        assert_eq!(data["type"], name.as_str(), "the event name is the data's type");
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).filter(|n| *n != "ping").collect();
    assert_eq!(names.first(), Some(&"message_start"), "{names:?}");
    assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"], "{names:?}");
    assert_eq!(events[0].1["message"]["content"], json!([]));
    let mut blocks: Vec<Value> = Vec::new();
    let mut open: Option<usize> = None;
    let mut partial_json = String::new();
    for (name, data) in events {
        match name.as_str() {
            "content_block_start" => {
                assert_eq!(open, None, "a block opens only after the last one closed");
                let index = data["index"].as_u64().unwrap() as usize;
                assert_eq!(index, blocks.len(), "block indices count up from 0");
                blocks.push(data["content_block"].clone());
                open = Some(index);
                partial_json.clear();
            }
            "content_block_delta" => {
                let index = data["index"].as_u64().unwrap() as usize;
                assert_eq!(open, Some(index), "a delta belongs to the open block");
                let d = &data["delta"];
                let block = &mut blocks[index];
                match d["type"].as_str().unwrap() {
                    "text_delta" => {
                        block["text"] =
                            json!(format!("{}{}", block["text"].as_str().unwrap(), d["text"].as_str().unwrap()))
                    }
                    "thinking_delta" => {
                        block["thinking"] =
                            json!(format!("{}{}", block["thinking"].as_str().unwrap(), d["thinking"].as_str().unwrap()))
                    }
                    "input_json_delta" => partial_json.push_str(d["partial_json"].as_str().unwrap()),
                    other => panic!("unknown delta {other}"),
                }
            }
            "content_block_stop" => {
                let index = data["index"].as_u64().unwrap() as usize;
                assert_eq!(open, Some(index));
                if blocks[index]["type"] == "tool_use" {
                    blocks[index]["input"] = serde_json::from_str(&partial_json).expect("the input JSON parses");
                }
                open = None;
            }
            _ => {}
        }
    }
    assert_eq!(open, None, "every block is closed");
    let delta = events.iter().find(|(n, _)| n == "message_delta").unwrap().1.clone();
    (blocks, delta)
}

fn text_of_blocks(blocks: &[Value], kind: &str, field: &str) -> String {
    blocks.iter().filter(|b| b["type"] == kind).map(|b| b[field].as_str().unwrap().to_string()).collect()
}

#[test]
fn ollama_chat_whole_and_streamed_match_the_openai_endpoint() {
    let s = tiny_server();
    let messages = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]);
    let openai = openai_chat(&s.url(), &messages, 12);
    let want = openai["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let usage = &openai["usage"];

    let chat = format!("{}/api/chat", s.url());
    let body = json!({"model": MODEL, "messages": messages, "stream": false, "think": false,
                      "options": {"temperature": 0, "num_predict": 12, "num_ctx": 4096, "mirostat": 0}});
    let (st, whole) = post(&chat, &body);
    assert_eq!(st, 200, "{whole}");
    assert_eq!(whole["message"]["role"], "assistant");
    assert_eq!(whole["message"]["content"], want.as_str(), "the same greedy reply as /v1/chat/completions");
    assert_eq!(whole["done"], true);
    let finish = openai["choices"][0]["finish_reason"].as_str().unwrap();
    assert_eq!(whole["done_reason"], if finish == "length" { "length" } else { "stop" });
    assert_eq!(whole["prompt_eval_count"], usage["prompt_tokens"]);
    assert_eq!(whole["eval_count"], usage["completion_tokens"]);
    let total = whole["total_duration"].as_u64().unwrap();
    let parts = whole["prompt_eval_duration"].as_u64().unwrap() + whole["eval_duration"].as_u64().unwrap();
    assert!(total >= parts && parts > 0, "{whole}");

    // Streamed by default, as Ollama does; the model may be named with its tag.
    let mut body = body;
    body.as_object_mut().unwrap().remove("stream");
    body["model"] = json!("qwen35-tiny:latest");
    let (kind, lines) = ndjson(&chat, &body);
    assert_eq!(kind, "application/x-ndjson");
    assert!(lines.len() >= 2, "{lines:?}");
    let streamed = ollama_stream_text(&lines, |l| &l["message"]["content"]);
    assert_eq!(streamed, want);
    let last = lines.last().unwrap();
    assert_eq!(last["message"]["content"], "");
    assert_eq!(last["eval_count"], usage["completion_tokens"]);
    assert_eq!(last["done_reason"], whole["done_reason"]);

    // No messages: Ollama's "load the model" reply.
    let (st, load) = post(&chat, &json!({"model": MODEL, "messages": []}));
    assert_eq!((st, load["done_reason"].as_str(), load["done"].as_bool()), (200, Some("load"), Some(true)), "{load}");
}

#[test]
fn ollama_generate_templated_and_raw() {
    let s = tiny_server();
    let url = format!("{}/api/generate", s.url());
    let chat = openai_chat(
        &s.url(),
        &json!([{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say something."}]),
        10,
    );
    let want = chat["choices"][0]["message"]["content"].as_str().unwrap();
    let body = json!({"model": MODEL, "prompt": "Say something.", "system": "Be brief.", "stream": false,
                      "think": false, "options": {"temperature": 0, "num_predict": 10}});
    let (st, whole) = post(&url, &body);
    assert_eq!(st, 200, "{whole}");
    assert_eq!(whole["response"], want, "the prompt goes through the chat template as a user turn");
    assert_eq!(whole["prompt_eval_count"], chat["usage"]["prompt_tokens"]);
    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let (_, lines) = ndjson(&url, &streaming);
    assert_eq!(ollama_stream_text(&lines, |l| &l["response"]), want);
    assert_eq!(lines.last().unwrap()["response"], "");

    // raw: the prompt as it is, as /v1/completions reads it.
    let (_, cmpl) = post(
        &format!("{}/v1/completions", s.url()),
        &json!({"model": MODEL, "prompt": "The frog", "max_tokens": 6, "temperature": 0}),
    );
    let raw = json!({"model": MODEL, "prompt": "The frog", "raw": true, "stream": false,
                     "options": {"temperature": 0, "num_predict": 6}});
    let (st, whole) = post(&url, &raw);
    assert_eq!(st, 200, "{whole}");
    assert_eq!(whole["response"], cmpl["choices"][0]["text"]);
    assert_eq!(whole["eval_count"], cmpl["usage"]["completion_tokens"]);
    let (st, e) = post(&url, &json!({"model": MODEL, "prompt": "x", "suffix": "y"}));
    assert_eq!(st, 400);
    assert!(e["error"].as_str().unwrap().starts_with("suffix is not supported"), "{e}");
}

#[test]
fn ollama_tags_and_show_describe_the_gguf() {
    let Some(demo) = frognano_testkit::demo_model() else { return };
    let server = frognano_serve::spawn_server(args(&demo.to_string_lossy())).expect("server starts");
    let (st, tags) = get(&format!("{}/api/tags", server.url()));
    assert_eq!(st, 200, "{tags}");
    let m = &tags["models"][0];
    assert_eq!(m["name"], "SmolLM2-135M-Instruct.Q4_1:latest");
    assert_eq!(m["model"], m["name"]);
    assert_eq!(m["size"].as_u64(), Some(std::fs::metadata(&demo).unwrap().len()));
    let digest = m["digest"].as_str().unwrap();
    assert!(digest.len() == 64 && digest.chars().all(|c| c.is_ascii_hexdigit()), "{digest}");
    let d = &m["details"];
    assert_eq!((d["format"].as_str(), d["family"].as_str()), (Some("gguf"), Some("llama")), "{d}");
    assert_eq!(d["quantization_level"], "Q4_1");
    assert_eq!(d["parameter_size"], "134.52M", "SmolLM2-135M has 134,515,008 weights");
    assert!(m["modified_at"].as_str().unwrap().ends_with('Z'));

    let show = format!("{}/api/show", server.url());
    let (st, info) = post(&show, &json!({"model": "SmolLM2-135M-Instruct.Q4_1"}));
    assert_eq!(st, 200, "{info}");
    assert!(info["template"].as_str().unwrap().contains("im_start"), "the chat template: {info}");
    assert_eq!(info["details"], *d);
    assert_eq!(info["model_info"]["general.architecture"], "llama");
    assert_eq!(info["model_info"]["general.parameter_count"], 134_515_008u64);
    assert_eq!(info["model_info"]["llama.context_length"], 8192);
    assert!(info["capabilities"].as_array().unwrap().contains(&json!("completion")));
    let (st, e) = post(&show, &json!({"model": "llama3.2"}));
    assert_eq!(st, 404);
    assert!(e["error"].as_str().unwrap().starts_with("model 'llama3.2' not found"), "{e}");
}

#[test]
fn ollama_ps_version_and_heartbeat_answer_as_ollama_does() {
    let Some(demo) = frognano_testkit::demo_model() else { return };
    let server = frognano_serve::spawn_server(args(&demo.to_string_lossy())).expect("server starts");
    let (st, ps) = get(&format!("{}/api/ps", server.url()));
    assert_eq!(st, 200, "{ps}");
    let m = &ps["models"][0];
    assert_eq!(m["name"], "SmolLM2-135M-Instruct.Q4_1:latest");
    assert_eq!(m["model"], m["name"]);
    assert_eq!(m["context_length"], 8192);
    // The weights (the GGUF's tensor bytes) and one full context of f16 keys and values:
    // 30 layers × 3 KV heads × 64 dims × (K, V) × 2 bytes × 8,192 positions.
    assert_eq!(m["size"].as_u64(), Some(96_576_768 + 30 * 3 * 64 * 2 * 2 * 8192), "{m}");
    assert_eq!(m["size_vram"], 0, "on the CPU");
    assert!(m["expires_at"].as_str().is_some_and(|t| t.starts_with("2318-")), "never unloaded: {m}");
    let (_, tags) = get(&format!("{}/api/tags", server.url()));
    assert_eq!((&m["digest"], &m["details"]), (&tags["models"][0]["digest"], &tags["models"][0]["details"]));

    let (st, v) = get(&format!("{}/api/version", server.url()));
    assert_eq!(st, 200, "{v}");
    let version: Vec<u32> = v["version"].as_str().unwrap().split('.').map(|p| p.parse().unwrap()).collect();
    assert!(version.len() == 3 && version >= vec![0, 9, 0], "a version with tools and `think`: {v}");

    // The `ollama` CLI's heartbeat is `HEAD /`; browsers and scripts `GET /`.
    let root = ureq::get(&format!("{}/", server.url())).call().expect("GET /");
    assert_eq!(root.into_string().unwrap(), "Ollama is running");
    let head = ureq::head(&format!("{}/", server.url())).call().expect("HEAD /");
    assert_eq!(head.status(), 200);
}

#[test]
fn ollama_tool_calls_and_their_results_make_the_round_trip() {
    let s = qwen_server(Some(TOOL_REPLY));
    let chat = format!("{}/api/chat", s.url());
    let history = json!([{"role": "user", "content": "List files."}]);
    let body = json!({"model": MODEL, "messages": history, "tools": [bash_tool()], "think": true, "stream": false});
    let (st, whole) = post(&chat, &body);
    assert_eq!(st, 200, "{whole}");
    let m = &whole["message"];
    assert_eq!(m["thinking"], "Let me list the files.\n");
    assert_eq!(m["content"].as_str().unwrap().trim(), "");
    let call = &m["tool_calls"][0]["function"];
    assert_eq!(call["name"], "Bash");
    assert_eq!(call["arguments"], json!({"command": "ls -la", "timeout": 30}), "arguments are an object");
    assert_eq!(call["index"], 0);
    assert_eq!(whole["done_reason"], "stop");

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let (_, lines) = ndjson(&chat, &streaming);
    let thinking = ollama_stream_text(&lines, |l| &l["message"]["thinking"]);
    assert_eq!(thinking, "Let me list the files.\n");
    let calls: Vec<&Value> = lines.iter().filter_map(|l| l["message"].get("tool_calls")).collect();
    assert_eq!(calls.len(), 1, "one line carries the call: {lines:?}");
    assert_eq!(calls[0][0]["function"]["arguments"]["command"], "ls -la");

    // The call and its result go back; the conversation renders as its OpenAI form does.
    let mut assistant = m.clone();
    assistant.as_object_mut().unwrap().remove("thinking");
    let turn = json!([{"role": "user", "content": "List files."}, assistant,
        {"role": "tool", "content": "a.py\nb.py", "tool_name": "Bash"}]);
    let (st, second) = post(
        &chat,
        &json!({"model": MODEL, "messages": turn, "tools": [bash_tool()], "stream": false,
        "think": true}),
    );
    assert_eq!(st, 200, "{second}");
    let openai_form = json!([{"role": "user", "content": "List files."},
        {"role": "assistant", "content": m["content"], "tool_calls": [{"type": "function", "function": {"name": "Bash",
            "arguments": "{\"command\":\"ls -la\",\"timeout\":30}"}}]},
        {"role": "tool", "content": "a.py\nb.py"}]);
    let (_, tok) = post(
        &format!("{}/tokenize", s.url()),
        &json!({"messages": openai_form, "tools": [bash_tool()], "chat_template_kwargs": {"enable_thinking": true}}),
    );
    let prompt = tok["prompt"].as_str().unwrap();
    assert!(prompt.contains("<tool_response>\na.py\nb.py\n</tool_response>"), "{prompt}");
    assert!(prompt.contains("<parameter=command>\nls -la\n</parameter>"), "{prompt}");
    assert_eq!(second["prompt_eval_count"], tok["count"], "the same prompt as the OpenAI form renders");
}

#[test]
fn ollama_errors_are_ollamas() {
    let s = tiny_server();
    let chat = format!("{}/api/chat", s.url());
    let user = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (json!({"messages": user}), 400, "model is required"),
        (json!({"model": "gpt-4o", "messages": user}), 404, "model 'gpt-4o' not found"),
        (json!({"model": MODEL, "messages": "hi"}), 400, "Invalid value for `messages`: invalid type: string"),
        (json!({"model": MODEL, "messages": user, "options": {"temperature": "hot"}}), 400, "`options.temperature`"),
        (
            json!({"model": MODEL, "messages": user, "options": {"repeat_penalty": 0}}),
            400,
            "options.repeat_penalty must be > 0",
        ),
        (json!({"model": MODEL, "messages": user, "think": "hard"}), 400, "think must be true, false"),
        (json!({"model": MODEL, "messages": user, "format": 7}), 400, "format must be \"json\""),
        // A schema llguidance refuses is named by Ollama's field, not OpenAI's.
        (json!({"model": MODEL, "messages": user, "format": {"type": "frog"}}), 400, "format cannot be enforced: "),
        (
            json!({"model": MODEL, "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}),
            400,
            "messages[0].images: this model reads text only",
        ),
        (json!({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}), 400, "messages[0].role"),
        (
            json!({"model": MODEL, "messages": [{"role": "user", "content": "frog ".repeat(5000)}]}),
            400,
            "maximum context length",
        ),
    ];
    for (body, status, needle) in cases {
        let (st, e) = post(&chat, &body);
        assert_eq!(st, status, "{body}: {e}");
        let msg = e["error"].as_str().unwrap_or_else(|| panic!("{{\"error\": string}}: {e}"));
        assert!(msg.contains(needle), "{body}: {msg:?} lacks {needle:?}");
        assert!(!msg.contains("response_format"), "{body}: {msg:?} names an OpenAI field");
    }
    let (st, e) = post_raw(&chat, "{\"model\": ");
    assert_eq!(st, 400);
    assert!(e["error"].as_str().unwrap().contains("not valid JSON"), "{e}");
}

#[test]
fn anthropic_messages_whole_and_streamed_match_the_openai_endpoint() {
    let s = tiny_server();
    let openai = openai_chat(
        &s.url(),
        &json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]),
        12,
    );
    let want = openai["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let usage = &openai["usage"];
    let body = json!({"model": MODEL, "max_tokens": 12, "temperature": 0,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say something."}]}],
        "metadata": {"user_id": "u1"}});
    let (st, whole) = anthropic(&s.url(), &body);
    assert_eq!(st, 200, "{whole}");
    assert_eq!((whole["type"].as_str(), whole["role"].as_str()), (Some("message"), Some("assistant")));
    assert!(whole["id"].as_str().unwrap().starts_with("msg_"));
    let blocks = whole["content"].as_array().unwrap();
    let text = text_of_blocks(blocks, "text", "text");
    if want.trim().is_empty() {
        assert!(blocks.is_empty(), "blank text makes no block: {whole}");
    } else {
        assert_eq!(text, want, "the same greedy reply as /v1/chat/completions");
    }
    let finish = openai["choices"][0]["finish_reason"].as_str().unwrap();
    assert_eq!(whole["stop_reason"], if finish == "length" { "max_tokens" } else { "end_turn" });
    assert_eq!(whole["stop_sequence"], Value::Null);
    let u = &whole["usage"];
    assert_eq!(u["output_tokens"], usage["completion_tokens"]);
    assert_eq!(
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap(),
        "{u}"
    );
    assert!(u["cache_read_input_tokens"].as_u64().unwrap() > 0, "the prompt was reused from the OpenAI call: {u}");

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let events = anthropic_events(&s.url(), &streaming);
    assert_eq!(events[1].0, "ping", "a ping follows message_start");
    let (blocks, delta) = fold_anthropic_stream(&events);
    assert_eq!(Value::Array(blocks), whole["content"], "streamed and whole replies carry the same blocks");
    assert_eq!(delta["delta"]["stop_reason"], whole["stop_reason"]);
    assert_eq!(delta["usage"]["output_tokens"], u["output_tokens"]);

    // A stop sequence the reply reaches ends it there and is named.
    if let Some(stop) = want.split_whitespace().nth(1).filter(|_| finish == "length") {
        let mut stopped = body.clone();
        stopped["stop_sequences"] = json!([stop]);
        let (_, r) = anthropic(&s.url(), &stopped);
        assert_eq!(
            (r["stop_reason"].as_str(), r["stop_sequence"].as_str()),
            (Some("stop_sequence"), Some(stop)),
            "{r}"
        );
        assert!(want.starts_with(&text_of_blocks(r["content"].as_array().unwrap(), "text", "text")));
    }
}

/// A request shaped as Claude Code 2.1 sends its turns: `max_tokens` past the context, the
/// system prompt in blocks with
/// `cache_control`, a system message after the user's (its mid-conversation system messages),
/// adaptive thinking, `context_management` and `output_config.effort`, and a title request
/// whose reply must follow a JSON schema (`output_config.format`).
#[test]
fn anthropic_takes_the_requests_claude_code_sends() {
    let s = qwen_server(Some("Let me greet.\n</think>\n\nHello."));
    // Claude Code asks for 32,000 tokens whatever the model; past what the context leaves,
    // `max_tokens` is a cap, not a 400 (here 100,000 against a context of 65,536).
    let body = json!({"model": MODEL, "max_tokens": 100_000, "stream": false,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1;"},
                   {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello.",
                                                   "cache_control": {"type": "ephemeral"}}]},
                     {"role": "system", "content": "Available agent types: claude, Explore."}],
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "{\"session_id\": \"s1\"}"}});
    let (st, r) = anthropic(&s.url(), &body);
    assert_eq!(st, 200, "{r}");
    let blocks = r["content"].as_array().unwrap();
    assert_eq!(text_of_blocks(blocks, "thinking", "thinking"), "Let me greet.\n");
    assert_eq!(text_of_blocks(blocks, "text", "text"), "Hello.");
    // The late system message is a user turn in its place (Qwen3.5's template takes one
    // system message, at the start): the prompt renders as that chat form does.
    let chat = json!([{"role": "system", "content": "x-anthropic-billing-header: cc_version=2.1;\n\nYou are a coding agent."},
        {"role": "user", "content": "Say hello."}, {"role": "user", "content": "Available agent types: claude, Explore."}]);
    let (st, openai) = post(
        &format!("{}/v1/chat/completions", s.url()),
        &json!({"model": MODEL, "messages": chat, "chat_template_kwargs": {"enable_thinking": true}}),
    );
    assert_eq!(st, 200, "{openai}");
    let u = &r["usage"];
    assert_eq!(
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap(),
        openai["usage"]["prompt_tokens"].as_u64().unwrap()
    );

    // The session title: text under a schema, enforced by a grammar (a random model here).
    let plain = tiny_server();
    let schema = json!({"type": "object", "properties": {"title": {"type": "string", "maxLength": 20}},
                        "required": ["title"], "additionalProperties": false});
    let title = json!({"model": MODEL, "max_tokens": 200, "temperature": 1.0,
        "messages": [{"role": "user", "content": "<session>Say hello.</session>"}],
        "output_config": {"effort": "high", "format": {"type": "json_schema", "schema": schema}}});
    let (st, r) = anthropic(&plain.url(), &title);
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["stop_reason"], "end_turn", "{r}");
    let text = text_of_blocks(r["content"].as_array().unwrap(), "text", "text");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(v["title"].is_string(), "{v}");
    let mut bad = title.clone();
    bad["output_config"]["format"]["schema"] = json!({"type": "frog"});
    let (st, e) = anthropic(&plain.url(), &bad);
    assert_eq!(st, 400, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().starts_with("output_config.format"), "{e}");
}

#[test]
fn anthropic_tool_use_and_tool_result_make_the_round_trip() {
    let s = qwen_server(Some(TOOL_REPLY));
    let tool = json!({"name": "Bash", "description": "Run a shell command in the repository workdir.",
        "input_schema": bash_tool()["function"]["parameters"]});
    let body = json!({"model": MODEL, "max_tokens": 200, "tools": [tool],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [{"role": "user", "content": "List files."}]});
    let (st, whole) = anthropic(&s.url(), &body);
    assert_eq!(st, 200, "{whole}");
    assert_eq!(whole["stop_reason"], "tool_use");
    let blocks = whole["content"].as_array().unwrap();
    let kinds: Vec<&str> = blocks.iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["thinking", "tool_use"], "{whole}");
    assert_eq!(blocks[0]["thinking"], "Let me list the files.\n");
    let call = &blocks[1];
    assert_eq!(call["name"], "Bash");
    assert_eq!(call["input"], json!({"command": "ls -la", "timeout": 30}));
    let id = call["id"].as_str().unwrap();
    assert!(id.starts_with("toolu_"), "{id}");

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let (streamed, delta) = fold_anthropic_stream(&anthropic_events(&s.url(), &streaming));
    assert_eq!(streamed.len(), 2);
    assert_eq!(streamed[1]["input"], call["input"], "input_json_delta pieces parse to the input");
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");

    // The reply and a tool_result go back: the conversation renders as its OpenAI form does.
    let turn = json!([{"role": "user", "content": "List files."},
        {"role": "assistant", "content": blocks},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id,
            "content": [{"type": "text", "text": "a.py\nb.py"}]}]}]);
    let mut second = body.clone();
    second["messages"] = turn;
    let count = ureq::post(&format!("{}/v1/messages/count_tokens", s.url()))
        .send_json(second.clone())
        .expect("count_tokens")
        .into_json::<Value>()
        .unwrap();
    let openai_form = json!([{"role": "user", "content": "List files."},
        {"role": "assistant", "content": "", "reasoning_content": "Let me list the files.\n",
         "tool_calls": [{"id": id, "type": "function", "function": {"name": "Bash",
            "arguments": "{\"command\":\"ls -la\",\"timeout\":30}"}}]},
        {"role": "tool", "tool_call_id": id, "content": "a.py\nb.py"}]);
    let (_, tok) = post(
        &format!("{}/tokenize", s.url()),
        &json!({"messages": openai_form,
        "tools": [bash_tool()], "chat_template_kwargs": {"enable_thinking": true}}),
    );
    assert!(tok["prompt"].as_str().unwrap().contains("<tool_response>\na.py\nb.py\n</tool_response>"), "{tok}");
    assert_eq!(count["input_tokens"], tok["count"], "the same prompt as the OpenAI form renders");
    let (st, r) = anthropic(&s.url(), &second);
    assert_eq!(st, 200, "{r}");
    let u = &r["usage"];
    assert_eq!(
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap(),
        tok["count"].as_u64().unwrap()
    );
}

#[test]
fn anthropic_errors_are_anthropics() {
    let s = tiny_server();
    let user = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (json!({"model": MODEL, "messages": user}), 400, "invalid_request_error", "max_tokens: Field required"),
        (json!({"max_tokens": 5, "messages": user}), 400, "invalid_request_error", "model: Field required"),
        (json!({"model": MODEL, "max_tokens": 5}), 400, "invalid_request_error", "messages: Field required"),
        (
            json!({"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": user}),
            404,
            "not_found_error",
            "model: claude-sonnet-4-5 not found",
        ),
        (
            json!({"model": MODEL, "max_tokens": 5, "messages": user, "temperature": "hot"}),
            400,
            "invalid_request_error",
            "`temperature`: invalid type: string",
        ),
        (
            json!({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}]}]}),
            400,
            "invalid_request_error",
            "messages[0].content[0] is a block of type \"image\"",
        ),
        (
            json!({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "The answer is"}]}),
            400,
            "invalid_request_error",
            "prefilled reply",
        ),
        (
            // `max_tokens` past the context is a cap; a prompt past it is refused.
            json!({"model": MODEL, "max_tokens": 99999, "messages": [{"role": "user", "content": "hello ".repeat(5000)}]}),
            400,
            "invalid_request_error",
            "prompt is too long: ",
        ),
        (
            json!({"model": MODEL, "max_tokens": 5, "messages": user, "tools": [{"name": "f"}]}),
            400,
            "invalid_request_error",
            "tools[0].input_schema: Field required",
        ),
        (
            // A forced call of a tool whose schema cannot be enforced names that tool's
            // schema, not the grammar built around it.
            json!({"model": MODEL, "max_tokens": 5, "messages": user, "tool_choice": {"type": "tool", "name": "g"},
                "tools": [{"name": "f", "input_schema": {"type": "object"}},
                          {"name": "g", "input_schema": {"type": "object", "properties": {"a": {"type": "frog"}}}}]}),
            400,
            "invalid_request_error",
            "tools[1].input_schema (tool \"g\") cannot be enforced: ",
        ),
    ];
    for (body, status, kind, needle) in cases {
        let (st, e) = anthropic(&s.url(), &body);
        assert_eq!(st, status, "{body}: {e}");
        assert_eq!(e["type"], "error", "{e}");
        assert_eq!(e["error"]["type"], kind, "{body}: {e}");
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{body}: {msg:?} lacks {needle:?}");
        assert!(!msg.contains(" | "), "{body}: {msg:?} quotes the grammar");
    }
}

#[test]
fn a_full_queue_is_a_429_and_a_large_body_a_413_in_each_apis_own_form() {
    let mut a = args(&tiny());
    a.max_waiting = 0;
    a.max_body_bytes = 4096;
    let s = frognano_serve::spawn_server(a).expect("server starts");
    let big = json!([{"role": "user", "content": "frog ".repeat(1000)}]);
    let (st, e) = post(&format!("{}/api/chat", s.url()), &json!({"model": MODEL, "messages": big}));
    assert_eq!(st, 413, "{e}");
    assert!(e["error"].as_str().unwrap().contains("larger than the server's limit of 4096 bytes"), "{e}");
    let (st, e) = anthropic(&s.url(), &json!({"model": MODEL, "max_tokens": 4, "messages": big}));
    assert_eq!((st, e["error"]["type"].as_str()), (413, Some("request_too_large")), "{e}");
    let user = json!([{"role": "user", "content": "hi"}]);
    let refused = |path: &str, body: Value| match ureq::post(&format!("{}{path}", s.url())).send_json(body) {
        Err(ureq::Error::Status(429, r)) => {
            assert!(r.header("retry-after").is_some(), "{path}: a Retry-After header");
            r.into_json::<Value>().unwrap()
        }
        other => panic!("{path}: expected a 429, got {other:?}"),
    };
    let e = refused("/api/chat", json!({"model": MODEL, "messages": user}));
    assert!(e["error"].as_str().unwrap().contains("The server is busy"), "{e}");
    let e = refused("/v1/messages", json!({"model": MODEL, "max_tokens": 4, "messages": user}));
    assert_eq!(e["error"]["type"], "rate_limit_error", "{e}");
}
