//! Tool calls in the model's own format through the HTTP API: a Qwen2.5-style template gets
//! Hermes JSON parsed (a malformed call next to a good one keeps the good one, streaming and
//! not), `--tool-parser` overrides the template, and a template without tool support
//! (SmolLM2's, from the demo model) gets the tools described, says so in the
//! `x-frognano-tool-prompt` header, and renders a tool round instead of refusing it; a format
//! without a grammar (Mistral's) is served unconstrained by default.

use crate::common;

use common::*;
use frognano_model::chat::ChatTemplate;
use frognano_protocol::codec::ToolParser;
use serde_json::{json, Value};

fn read_tool() -> Value {
    json!({"type": "function", "function": {"name": "Read", "description": "Read a text file.",
        "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["file_path"]}}})
}

fn qwen25_template() -> ChatTemplate {
    ChatTemplate::from_file(root().join("fixtures/tokenizer/qwen25-coder/chat_template.jinja")).expect("template")
}

/// The tiny checkpoint with `template`, writing `reply`; `parser` overrides the format.
fn server(template: ChatTemplate, reply: &str, parser: Option<ToolParser>) -> frognano_serve::ServerHandle {
    let mut loaded = frognano_model::load(tiny()).expect("tiny model loads");
    loaded.chat_template = Some(template);
    let loaded = scripted(loaded, reply);
    let mut a = args("tiny");
    a.tool_parser = parser;
    frognano_serve::spawn_server_with_model(loaded, a).expect("server starts")
}

fn request(stream: bool) -> Value {
    json!({"stream": stream, "tools": [read_tool()],
        "messages": [{"role": "user", "content": "Read hello.txt and a.txt."}]})
}

/// POSTs `body`; the status, the `x-frognano-tool-prompt` header and the JSON body.
fn post_with_header(url: &str, body: &Value) -> (u16, Option<String>, Value) {
    let resp = match ureq::post(url).send_json(body.clone()) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST {url}: {e}"),
    };
    let header = resp.header("x-frognano-tool-prompt").map(str::to_string);
    (resp.status(), header, resp.into_json().expect("JSON"))
}

const HERMES_REPLY: &str = "I will read both.\n<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"hello.txt\", \"limit\": }\n</tool_call>\n<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"a.txt\", \"limit\": 5}}\n</tool_call>";

#[test]
fn hermes_calls_of_a_qwen25_template_come_back_as_tool_calls() {
    let s = server(qwen25_template(), HERMES_REPLY, None);
    let url = format!("{}/v1/chat/completions", s.url());
    let (st, header, r) = post_with_header(&url, &request(false));
    assert_eq!(st, 200, "{r}");
    assert_eq!(header, None, "the template shows tools itself");
    let msg = &r["choices"][0]["message"];
    assert_eq!(r["choices"][0]["finish_reason"], "tool_calls");
    let calls = msg["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{msg}");
    assert_eq!(calls[0]["function"]["name"], "Read");
    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"file_path": "a.txt", "limit": 5}));
    // The malformed call reaches the client as the text the model wrote.
    let content = msg["content"].as_str().unwrap();
    assert!(content.starts_with("I will read both.\n<tool_call>\n{\"name\": \"Read\""), "{content}");
    assert!(content.contains("\"limit\": }\n</tool_call>"), "{content}");

    // Streaming gives the same call and text.
    let chunks = chunks(&stream(&url, &request(true)));
    let text: String =
        chunks.iter().filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str().map(str::to_string)).collect();
    assert_eq!(text.trim(), content);
    let streamed: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
    assert_eq!(streamed[0][0]["function"]["name"], "Read");
    assert_eq!(serde_json::from_str::<Value>(streamed[1][0]["function"]["arguments"].as_str().unwrap()).unwrap(), args);
}

#[test]
fn the_tool_parser_flag_overrides_the_template() {
    // Mistral's call of a tool that was not offered: Hermes (the template's format) reads
    // such JSON only for offered tools, Mistral reads its own syntax for any.
    let mistral = "[TOOL_CALLS][{\"name\": \"Glob\", \"arguments\": {\"pattern\": \"*.txt\"}}]";
    let url = |s: &frognano_serve::ServerHandle| format!("{}/v1/chat/completions", s.url());
    let s = server(qwen25_template(), mistral, None);
    let (_, _, r) = post_with_header(&url(&s), &request(false));
    assert!(r["choices"][0]["message"].get("tool_calls").is_none(), "{r}");
    let s = server(qwen25_template(), mistral, Some(ToolParser::from_name("mistral").unwrap()));
    let (_, _, r) = post_with_header(&url(&s), &request(false));
    assert_eq!(r["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "Glob", "{r}");
}

#[test]
fn a_template_without_tool_support_gets_the_tools_described() {
    let Some(demo) = frognano_testkit::demo_model() else { return };
    let smollm2 = frognano_model::load(demo.to_str().unwrap()).expect("demo model loads");
    let template = smollm2.chat_template.expect("SmolLM2 has a chat template");
    assert!(!template.supports_tools());
    let reply = "<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"hello.txt\"}}\n</tool_call>";
    let s = server(template, reply, None);
    let url = format!("{}/v1/chat/completions", s.url());
    let (st, header, r) = post_with_header(&url, &request(false));
    assert_eq!(st, 200, "{r}");
    assert_eq!(header.as_deref(), Some("injected"));
    assert_eq!(r["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "Read", "{r}");

    // The second turn, sent back as the SDK sends it (content null, the call, its result).
    let mut next = request(false);
    let msgs = next["messages"].as_array_mut().unwrap();
    msgs.push(json!({"role": "assistant", "content": null, "tool_calls": r["choices"][0]["message"]["tool_calls"]}));
    msgs.push(json!({"role": "tool", "tool_call_id": r["choices"][0]["message"]["tool_calls"][0]["id"],
        "content": "1. hello"}));
    let (st, prompt) =
        post(&format!("{}/tokenize", s.url()), &json!({"messages": next["messages"], "tools": next["tools"]}));
    assert_eq!(st, 200, "{prompt}");
    let prompt = prompt["prompt"].as_str().unwrap();
    assert!(prompt.starts_with("<|im_start|>system\n# Tools\n"), "{prompt}");
    assert!(
        prompt.ends_with(
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"hello.txt\"}}\n\
             </tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n1. hello\n</tool_response><|im_end|>\n\
             <|im_start|>assistant\n"
        ),
        "{prompt}"
    );
    let (st, header, r) = post_with_header(&url, &next);
    assert_eq!(st, 200, "{r}");
    assert_eq!(header.as_deref(), Some("injected"));
    // Without tools and tool turns, nothing is injected.
    let plain = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(post_with_header(&url, &plain).1, None);
}

/// `frognano serve --constrain-tools` over the tiny model with Qwen2.5's template, writing
/// [`HERMES_REPLY`] where the grammar lets it.
fn constrained_server() -> frognano_serve::ServerHandle {
    let mut loaded = frognano_model::load(tiny()).expect("tiny model loads");
    loaded.chat_template = Some(qwen25_template());
    let loaded = scripted(loaded, HERMES_REPLY);
    let mut a = args("tiny");
    a.constrain_tools = Some(true);
    frognano_serve::spawn_server_with_model(loaded, a).expect("server starts")
}

/// `frognano serve --constrain-tools`: a `tool_choice: "auto"` reply is sampled under the
/// tools' grammar, so the malformed call the model wants to write (`"limit": }`) cannot come
/// out; whatever it writes instead is free text or calls whose arguments parse.
#[test]
fn constrained_auto_replies_carry_no_malformed_call() {
    let s = constrained_server();
    let url = format!("{}/v1/chat/completions", s.url());
    for seed in 0..4 {
        let mut body = request(false);
        body["seed"] = json!(seed);
        body["temperature"] = json!(1.0);
        body["max_tokens"] = json!(120);
        let (st, _, r) = post_with_header(&url, &body);
        assert_eq!(st, 200, "{r}");
        let msg = &r["choices"][0]["message"];
        let content = msg["content"].as_str().unwrap_or("");
        assert!(!content.contains("\"limit\": }"), "seed {seed}: the malformed call came out: {msg}");
        for call in msg["tool_calls"].as_array().into_iter().flatten() {
            assert_eq!(call["function"]["name"], "Read", "seed {seed}: {call}");
            let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
            assert!(args["file_path"].is_string(), "seed {seed}: {args}");
            assert!(args.get("limit").is_none_or(Value::is_i64), "seed {seed}: {args}");
        }
        if r["choices"][0]["finish_reason"] == "stop" {
            assert!(!content.contains("<tool_call>"), "seed {seed}: a finished reply with an unparsed call: {msg}");
        }
    }
}

/// A tool whose schema the grammar cannot take (Claude Code's `TaskCreate` uses
/// `propertyNames`) does not fail a constrained `auto` request, which the client did not ask
/// to be constrained: its calls' arguments are any JSON object, the other tools' stay under
/// their schemas. A call the client forces of that tool is still a 400 naming it.
#[test]
fn a_schema_the_grammar_cannot_take_does_not_fail_an_auto_request() {
    let s = constrained_server();
    let url = format!("{}/v1/chat/completions", s.url());
    let task = json!({"type": "function", "function": {"name": "TaskCreate", "description": "Create a task.",
        "parameters": {"type": "object", "properties": {"metadata": {"type": "object",
            "propertyNames": {"pattern": "^[a-z]+$"}}}}}});
    let mut body = request(false);
    body["tools"] = json!([read_tool(), task]);
    body["max_tokens"] = json!(120);
    let (st, _, r) = post_with_header(&url, &body);
    assert_eq!(st, 200, "{r}");
    for call in r["choices"][0]["message"]["tool_calls"].as_array().into_iter().flatten() {
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(args.is_object(), "{call}");
    }
    body["tool_choice"] = json!({"type": "function", "function": {"name": "TaskCreate"}});
    let (st, _, e) = post_with_header(&url, &body);
    assert_eq!(st, 400, "{e}");
    assert_eq!(e["error"]["param"], "tools[1].function.parameters", "{e}");
}

/// A model that is not Qwen3.5 and answers in a format without a grammar (Mistral's here,
/// Granite's too) is served unconstrained by default: its requests with tools are answered
/// and its calls parsed, not refused because the calls cannot be constrained.
#[test]
fn a_format_without_a_grammar_is_served_unconstrained_by_default() {
    let mut loaded = frognano_model::load(root().join("fixtures/arch/mistral-tiny.gguf").to_str().unwrap())
        .expect("mistral-tiny loads");
    assert_eq!(loaded.architecture, "llama");
    let nemo = root().join("fixtures/tokenizer/llama-cpp-templates/mistralai-Mistral-Nemo-Instruct-2407.jinja");
    let template = ChatTemplate::from_file(nemo).expect("template");
    loaded.chat_template =
        Some(template.with_special_token("bos_token", "<s>").with_special_token("eos_token", "</s>"));
    let loaded = scripted(loaded, "[TOOL_CALLS][{\"name\": \"Read\", \"arguments\": {\"file_path\": \"a.txt\"}}]");
    let s = frognano_serve::spawn_server_with_model(loaded, args("mistral-tiny")).expect("server starts");
    let (st, _, r) = post_with_header(&format!("{}/v1/chat/completions", s.url()), &request(false));
    assert_eq!(st, 200, "{r}");
    let calls = r["choices"][0]["message"]["tool_calls"].as_array().expect("tool calls");
    assert_eq!(calls[0]["function"]["name"], "Read");
    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"file_path": "a.txt"}));
}
