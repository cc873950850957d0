//! OpenAI's Responses API (`/v1/responses`) over plain HTTP, read as Codex reads it: the
//! events in order, each named as its data's `type` and numbered, building the same items as
//! the whole reply. Greedy replies match `/v1/chat/completions` for the same conversation;
//! tool calls and their outputs make the round trip through the Qwen3.5 template on a
//! scripted model.

use crate::common;

use common::*;
use serde_json::{json, Value};

const MODEL: &str = "qwen35-tiny";

/// POSTs a streaming request; returns every event as (name, data).
fn events(url: &str, body: &Value) -> Vec<(String, Value)> {
    sse_events(ureq::post(&format!("{url}/v1/responses")).send_json(body.clone()).expect("stream accepted"))
}

/// Checks the event grammar (numbered in order from 0, `response.created` and
/// `response.in_progress` first, items added, filled and done one at a time, one final
/// `response.completed` or `response.incomplete`) and rebuilds the output items from the
/// events alone; returns them and the final response.
fn fold(events: &[(String, Value)]) -> (Vec<Value>, Value) {
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str(), "the event name is the data's type");
        assert_eq!(data["sequence_number"], i, "events are numbered in order: {data}");
    }
    assert_eq!(events[0].0, "response.created");
    assert_eq!(events[1].0, "response.in_progress");
    assert_eq!(events[0].1["response"]["status"], "in_progress");
    assert_eq!(events[0].1["response"]["output"], json!([]));
    let (last_name, last) = events.last().expect("events");
    assert!(last_name == "response.completed" || last_name == "response.incomplete", "{last_name}");
    let mut items: Vec<Value> = Vec::new();
    let mut open: Option<usize> = None;
    for (name, data) in &events[2..events.len() - 1] {
        let index = data["output_index"].as_u64().expect("output_index") as usize;
        match name.as_str() {
            "response.output_item.added" => {
                assert_eq!(open, None, "one item at a time");
                assert_eq!(index, items.len(), "items in order");
                items.push(data["item"].clone());
                open = Some(index);
            }
            "response.content_part.added" => items[index]["content"] = json!([data["part"]]),
            "response.output_text.delta" | "response.reasoning_text.delta" => {
                assert_eq!(open, Some(index));
                let part = &mut items[index]["content"][0];
                part["text"] = json!(format!("{}{}", part["text"].as_str().unwrap(), data["delta"].as_str().unwrap()));
            }
            "response.function_call_arguments.delta" => {
                let item = &mut items[index];
                item["arguments"] =
                    json!(format!("{}{}", item["arguments"].as_str().unwrap(), data["delta"].as_str().unwrap()));
            }
            "response.output_text.done" | "response.reasoning_text.done" => {
                assert_eq!(data["text"], items[index]["content"][0]["text"]);
            }
            "response.function_call_arguments.done" => assert_eq!(data["arguments"], items[index]["arguments"]),
            "response.content_part.done" => assert_eq!(data["part"], items[index]["content"][0]),
            "response.output_item.done" => {
                assert_eq!(open.take(), Some(index));
                let mut built = items[index].clone();
                if built.get("status").is_some() {
                    built["status"] = json!("completed");
                }
                assert_eq!(data["item"], built, "the done item is the one its events built");
                items[index] = built;
            }
            other => panic!("unexpected event {other}: {data}"),
        }
    }
    assert_eq!(open, None, "every item is done before the end");
    (items, last["response"].clone())
}

/// Items without their ids and call ids (each response has its own).
fn without_ids(items: &Value) -> Value {
    let mut items = items.clone();
    for item in items.as_array_mut().unwrap() {
        let item = item.as_object_mut().unwrap();
        item.remove("id");
        item.remove("call_id");
    }
    items
}

fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .map(|p| p["text"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn responses_whole_and_streamed_match_the_chat_endpoint() {
    let s = tiny_server();
    let (st, openai) = post(
        &format!("{}/v1/chat/completions", s.url()),
        &json!({"model": MODEL, "temperature": 0, "max_tokens": 12,
                "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]}),
    );
    assert_eq!(st, 200, "{openai}");
    let want = openai["choices"][0]["message"]["content"].as_str().unwrap();
    let body = json!({"model": MODEL, "instructions": "Be brief.", "max_output_tokens": 12, "temperature": 0,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say something."}]}],
        "store": false, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k1"});
    let url = format!("{}/v1/responses", s.url());
    let (st, whole) = post(&url, &body);
    assert_eq!(st, 200, "{whole}");
    assert_eq!(whole["object"], "response");
    assert!(whole["id"].as_str().unwrap().starts_with("resp_"), "{whole}");
    assert_eq!(whole["model"], MODEL);
    assert_eq!(whole["instructions"], "Be brief.");
    if !want.trim().is_empty() {
        assert_eq!(output_text(&whole), want, "the same greedy reply as /v1/chat/completions");
    }
    let finish = openai["choices"][0]["finish_reason"].as_str().unwrap();
    if finish == "length" {
        assert_eq!(whole["status"], "incomplete");
        assert_eq!(whole["incomplete_details"], json!({"reason": "max_output_tokens"}));
    } else {
        assert_eq!(whole["status"], "completed");
    }
    let u = &whole["usage"];
    assert_eq!(u["input_tokens"], openai["usage"]["prompt_tokens"], "the same rendered prompt");
    assert_eq!(u["output_tokens"], openai["usage"]["completion_tokens"]);
    assert_eq!(u["total_tokens"], openai["usage"]["total_tokens"]);
    assert!(u["input_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0, "reused from the chat call: {u}");

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let events = events(&s.url(), &streaming);
    let (items, last) = fold(&events);
    assert_eq!(
        without_ids(&json!(items)),
        without_ids(&whole["output"]),
        "streamed and whole replies carry the same items"
    );
    assert_eq!(last["status"], whole["status"]);
    assert_eq!(last["usage"]["output_tokens"], u["output_tokens"]);
    let final_name = &events.last().unwrap().0;
    assert_eq!(final_name, if finish == "length" { "response.incomplete" } else { "response.completed" });

    // The same path without `/v1`, and a bare string as the input.
    let (st, bare) = post(
        &format!("{}/responses", s.url()),
        &json!({"model": MODEL, "input": "Say something.", "max_output_tokens": 4, "temperature": 0}),
    );
    assert_eq!(st, 200, "{bare}");
    assert_eq!(bare["usage"]["output_tokens"], 4);
    assert_eq!(bare["status"], "incomplete");
}

#[test]
fn responses_function_calls_and_their_outputs_make_the_round_trip() {
    let s = qwen_server(Some(TOOL_REPLY));
    let bash = bash_tool();
    let tool = json!({"type": "function", "name": "Bash", "description": bash["function"]["description"],
        "parameters": bash["function"]["parameters"], "strict": false});
    // `max_output_tokens` past what the context leaves is a cap (65,536 here).
    let body = json!({"model": MODEL, "tools": [tool], "tool_choice": "auto", "parallel_tool_calls": false,
        "max_output_tokens": 100_000,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List files."}]}]});
    let url = format!("{}/v1/responses", s.url());
    let (st, whole) = post(&url, &body);
    assert_eq!(st, 200, "{whole}");
    assert_eq!(whole["status"], "completed");
    let output = whole["output"].as_array().unwrap();
    let kinds: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["reasoning", "function_call"], "{whole}");
    assert_eq!(output[0]["content"][0], json!({"type": "reasoning_text", "text": "Let me list the files.\n"}));
    let call = &output[1];
    assert_eq!((call["name"].as_str(), call["status"].as_str()), (Some("Bash"), Some("completed")));
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).expect("arguments are JSON text");
    assert_eq!(args, json!({"command": "ls -la", "timeout": 30}));
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"), "{call}");
    assert!(call["id"].as_str().unwrap().starts_with("fc_"), "{call}");
    let reasoning_tokens = whole["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap();
    assert!(reasoning_tokens > 0 && reasoning_tokens < whole["usage"]["output_tokens"].as_u64().unwrap());

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let (items, _) = fold(&events(&s.url(), &streaming));
    assert_eq!(
        without_ids(&json!(items)),
        without_ids(&whole["output"]),
        "streamed and whole replies carry the same items"
    );

    // Codex sends the output items back with the call's output and the whole history; the
    // prompt renders as its chat form does (the same token count).
    let mut input = body["input"].as_array().unwrap().clone();
    input.extend(output.iter().cloned());
    input.push(json!({"type": "function_call_output", "call_id": call["call_id"], "output": "a.py\nb.py"}));
    let mut second = body.clone();
    second["input"] = json!(input);
    let (st, again) = post(&url, &second);
    assert_eq!(st, 200, "{again}");
    let chat = json!([{"role": "user", "content": "List files."},
        {"role": "assistant", "content": "", "reasoning_content": "Let me list the files.\n",
         "tool_calls": [{"id": call["call_id"], "type": "function",
                         "function": {"name": "Bash", "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["call_id"], "content": "a.py\nb.py"}]);
    let (st, openai) = post(
        &format!("{}/v1/chat/completions", s.url()),
        &json!({"model": MODEL, "messages": chat, "tools": [bash], "chat_template_kwargs": {"enable_thinking": true}}),
    );
    assert_eq!(st, 200, "{openai}");
    assert_eq!(again["usage"]["input_tokens"], openai["usage"]["prompt_tokens"], "{again}");

    // As Codex sends its tools: functions in a namespace (their calls name it) and a hosted
    // web search, which cannot run here: not offered to the model, and named in a header.
    let mut codex = body.clone();
    codex["tools"] = json!([{"type": "web_search", "external_web_access": false},
        {"type": "namespace", "name": "leaf", "description": "The Leaf harness.", "tools": [tool]}]);
    let resp = ureq::post(&url).send_json(codex).expect("accepted");
    assert_eq!(resp.header("x-frognano-tools-not-offered"), Some("web_search"));
    let r: Value = resp.into_json().unwrap();
    let call = &r["output"][1];
    assert_eq!((call["name"].as_str(), call["namespace"].as_str()), (Some("Bash"), Some("leaf")), "{r}");
}

#[test]
fn responses_refuse_what_they_cannot_do_and_name_the_field() {
    let s = tiny_server();
    let url = format!("{}/v1/responses", s.url());
    let cases = [
        (json!({"model": MODEL}), "input"),
        (json!({"model": MODEL, "input": "x", "previous_response_id": "resp_1"}), "previous_response_id"),
        (json!({"model": MODEL, "input": "x", "tools": [{"type": "namespace", "name": "n"}]}), "tools[0].tools"),
        (
            json!({"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
            "input[0].content[0]",
        ),
        (json!({"model": MODEL, "input": "x", "reasoning": {"effort": "max"}}), "reasoning.effort"),
        (json!({"model": MODEL, "input": "x", "text": {"format": {"type": "yaml"}}}), "text.format.type"),
    ];
    for (body, param) in cases {
        let (st, e) = post(&url, &body);
        assert_eq!(st, 400, "{body}: {e}");
        assert_eq!(e["error"]["param"], param, "{body}: {e}");
        assert_eq!(e["error"]["type"], "invalid_request_error");
    }
    let (st, e) = post(&url, &json!({"model": "gpt-5", "input": "x"}));
    assert_eq!(st, 404, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("gpt-5"), "{e}");

    // A schema in `text.format` shapes the reply as `response_format` does.
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                        "additionalProperties": false});
    let (st, r) = post(
        &url,
        &json!({"model": MODEL, "input": "A number.", "max_output_tokens": 40, "temperature": 0,
                "text": {"format": {"type": "json_schema", "name": "N", "schema": schema, "strict": true}}}),
    );
    assert_eq!(st, 200, "{r}");
    let (st, e) = post(
        &url,
        &json!({"model": MODEL, "input": "x",
        "text": {"format": {"type": "json_schema", "name": "F", "schema": {"type": "frog"}}}}),
    );
    assert_eq!(st, 400, "{e}");
    assert!(e["error"]["param"].as_str().unwrap().starts_with("text.format"), "{e}");
    if r["status"] == "completed" {
        let v: Value = serde_json::from_str(&output_text(&r)).expect("the reply is JSON");
        assert!(v["n"].is_i64(), "{v}");
    }
}
