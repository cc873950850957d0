//! Structured outputs through the HTTP server on the real demo model (SmolLM2-135M-Instruct,
//! sampled at temperature 1): `response_format` `json_object` and `json_schema` replies always
//! parse (streamed and not), `tool_choice` required or named always yields a call of the
//! offered tools, and schemas or combinations that cannot be enforced are 400s naming the
//! field.

use crate::common;

use common::*;
use frognano_serve::{spawn_server, ServerHandle};
use serde_json::{json, Value};

fn demo_server() -> Option<ServerHandle> {
    let model = frognano_testkit::demo_model()?;
    let mut a = args(model.to_str().unwrap());
    a.model_name = Some("demo".into());
    Some(spawn_server(a).expect("server starts"))
}

/// A chat request with `extra` fields, sampled at temperature 1 unless `extra` says.
fn chat(server: &ServerHandle, extra: Value) -> (u16, Value) {
    let mut body = json!({
        "messages": [{"role": "user", "content": "Describe a cat as JSON."}],
        "temperature": 1.0,
        "max_tokens": 200,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    post(&format!("{}/v1/chat/completions", server.url()), &body)
}

fn content(body: &Value) -> &str {
    body["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("no content: {body}"))
}

/// Any JSON object: greedy, so the reply is one the model completes (an object's string
/// values are unbounded, and this small model sampled hot can loop inside one until
/// `max_tokens`); streamed, the same request gives the same text.
#[test]
fn json_object_replies_parse_streamed_or_not() {
    let Some(server) = demo_server() else { return };
    let messages = json!([{"role": "user", "content": "Reply with a JSON object holding a cat's name and age."}]);
    let request = json!({"temperature": 0.0, "messages": messages, "response_format": {"type": "json_object"}});
    let (status, body) = chat(&server, request.clone());
    assert_eq!(status, 200, "{body}");
    let text = content(&body).to_string();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert!(v.is_object(), "{v}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
    let mut streamed = json!({"stream": true, "max_tokens": 200});
    for (k, v) in request.as_object().unwrap() {
        streamed[k] = v.clone();
    }
    let events = stream(&format!("{}/v1/chat/completions", server.url()), &streamed);
    let streamed: String =
        chunks(&events).iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed.trim(), text.trim(), "streamed and whole replies differ");
}

#[test]
fn json_schema_replies_follow_the_schema() {
    let Some(server) = demo_server() else { return };
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20},
        "legs": {"type": "integer", "minimum": 0, "maximum": 8},
        "mood": {"enum": ["happy", "grumpy"]}},
        "required": ["name", "legs", "mood"], "additionalProperties": false});
    for seed in 0..3 {
        let (status, body) = chat(
            &server,
            json!({"seed": seed, "response_format": {"type": "json_schema",
                "json_schema": {"name": "Animal", "schema": schema, "strict": true}}}),
        );
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(content(&body)).unwrap_or_else(|e| panic!("seed {seed}: {e}: {body}"));
        assert!(v["name"].as_str().is_some_and(|n| n.chars().count() <= 20), "seed {seed}: {v}");
        assert!(v["legs"].as_i64().is_some_and(|l| (0..=8).contains(&l)), "seed {seed}: {v}");
        assert!(matches!(v["mood"].as_str(), Some("happy" | "grumpy")), "seed {seed}: {v}");
        assert_eq!(v.as_object().unwrap().len(), 3, "seed {seed}: {v}");
    }
}

/// The tools' strings are bounded (`maxLength`), so at temperature 1 every reply completes
/// within `max_tokens`, and the grammar makes each one a call of the offered tools.
#[test]
fn tool_choice_required_or_named_always_calls() {
    let Some(server) = demo_server() else { return };
    let weather = json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"]}}});
    let bash = json!({"type": "function", "function": {"name": "Bash",
        "parameters": {"type": "object", "properties": {"command": {"type": "string", "maxLength": 40}},
        "required": ["command"]}}});
    let tools = json!([bash, weather]);
    for seed in 0..3 {
        let (status, body) = chat(
            &server,
            json!({"seed": seed, "tools": tools, "messages": [{"role": "user", "content": "Weather in Oslo?"}],
                   "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        );
        assert_eq!(status, 200, "{body}");
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "seed {seed}: {body}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap_or_else(|| panic!("no calls: {body}"));
        assert_eq!(calls.len(), 1, "{body}");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(args["city"].is_string(), "{args}");

        let (status, body) = chat(
            &server,
            json!({"seed": seed, "tools": tools, "tool_choice": "required",
                   "messages": [{"role": "user", "content": "List the files here."}]}),
        );
        assert_eq!(status, 200, "{body}");
        let calls = body["choices"][0]["message"]["tool_calls"].as_array().unwrap_or_else(|| panic!("{body}"));
        assert!(!calls.is_empty(), "{body}");
        for call in calls {
            assert!(matches!(call["function"]["name"].as_str(), Some("Bash" | "get_weather")), "{call}");
        }
    }
}

#[test]
fn unenforceable_requests_are_400s_naming_the_field() {
    let Some(server) = demo_server() else { return };
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "X",
                "schema": {"type": "integer", "minimum": 10, "maximum": 1}}}}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "X", "schema": {"type": "frog"}}}}),
            "response_format.json_schema.schema",
        ),
        (json!({"response_format": {"type": "yaml"}}), "response_format.type"),
        (
            json!({"tools": [bash_tool(), {"type": "function", "function": {"name": "f",
                "parameters": {"type": "object", "properties": {"a": {"type": "frog"}}}}}], "tool_choice": "required"}),
            "tools[1].function.parameters",
        ),
        (
            json!({"response_format": {"type": "json_object"}, "tools": [bash_tool()], "tool_choice": "required"}),
            "response_format",
        ),
    ];
    for (extra, param) in cases {
        let (status, body) = chat(&server, extra.clone());
        assert_eq!(status, 400, "{extra}: {body}");
        assert_eq!(body["error"]["param"], param, "{extra}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(param), "{extra}: {message:?} does not start with {param}");
        // llguidance's position in, and quotes of, the grammar built around the schema are
        // not the client's to read.
        assert!(!message.contains(" | ") && !message.contains("at 1("), "{extra}: {message:?}");
    }
}
