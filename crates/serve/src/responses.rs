//! OpenAI's Responses API (`POST /v1/responses`), what Codex and the newer OpenAI SDK clients
//! speak (Codex talks to no other API since mid-2026), so they can point at `frognano serve`.
//! A request is read into the server's chat form and runs on the same path as
//! `/v1/chat/completions` ([`crate::routes::start_chat`]): the model's chat template, its
//! tool-call codec, structured outputs, the same limits. The reply is a list of output items
//! (`reasoning`, `message`, `function_call`), streamed as the API's server-sent events
//! (`response.created`, `response.output_item.added`, `response.output_text.delta`, …,
//! `response.completed`). Nothing is stored: every request carries its whole conversation
//! (`store: false`, as Codex sends it). Errors are OpenAI's, as on the other endpoints. Field by
//! field: docs/serve.md §10.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use frognano_protocol::{Message, MessageContent, ToolCall};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::api::{parse_body, validate_tools, SamplingFields, ToolChoice};
use crate::error::ApiError;
use crate::output::{Delta, PartEvent, PartKind, PartWriter};
use crate::pool::{JobEvent, JobSummary};
use crate::routes::{
    collect, next_event_keeping_alive, read_body, sse_response, start_chat, unix_now, AppState, ChatInput,
};
use crate::structured::ResponseFormat;

/// A comment line is sent when nothing else was for this long (a long prompt being
/// prefilled), so clients and proxies with read timeouts keep the stream.
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(10);

/// What the text of several input parts, or of several system and developer messages, is
/// joined with.
const PART_SEPARATOR: &str = "\n\n";

/// The Responses endpoint, also without the `/v1` prefix as the OpenAI endpoints are.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/responses", post(responses)).route("/responses", post(responses))
}

// ---- requests -----------------------------------------------------------------------------------

/// `POST /v1/responses`. Fields the server has no use for (`store`, `include`,
/// `parallel_tool_calls`, `metadata`, `user`, `prompt_cache_key`, `truncation`,
/// `service_tier`, …) are ignored.
#[derive(Debug, Clone, Deserialize)]
struct ResponsesRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    instructions: Option<Value>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    reasoning: Option<Value>,
    #[serde(default)]
    text: Option<Value>,
    #[serde(default)]
    previous_response_id: Option<Value>,
    #[serde(default)]
    conversation: Option<Value>,
    #[serde(default)]
    background: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<u64>,
}

fn field_error(at: &str, what: &str, found: &Value) -> ApiError {
    ApiError::invalid_param(at, format!("{at} must be {what}, found {found}"))
}

fn string_field<'a>(item: &'a Value, at: &str, field: &str) -> Result<&'a str, ApiError> {
    match item.get(field) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(field_error(&format!("{at}.{field}"), "a string", other)),
        None => Err(ApiError::invalid_param(format!("{at}.{field}"), format!("{at}.{field} is required"))),
    }
}

/// What a tool output's image, file or audio part becomes: the model reads text, and an
/// agent's session must go on after a tool (Codex's `view_image`) returns a picture.
const NOT_READ: &str = frognano_protocol::NOT_READ_PART;

/// The text of a message's `content`: a string, or parts (`input_text`, `output_text`,
/// `text`, `refusal`) joined by [`PART_SEPARATOR`]; images, files and audio are refused.
fn content_text(content: Option<&Value>, at: &str) -> Result<String, ApiError> {
    content_text_or(content, at, None)
}

/// [`content_text`], with `stand_in` (if given) as the text of a part that is not text
/// instead of a 400.
fn content_text_or(content: Option<&Value>, at: &str, stand_in: Option<&str>) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let at = format!("{at}[{j}]");
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => texts.push(string_field(part, &at, "text")?),
                    Some("refusal") => texts.push(string_field(part, &at, "refusal")?),
                    Some(_) if stand_in.is_some() => texts.push(stand_in.unwrap_or_default()),
                    Some(other) => {
                        return Err(ApiError::invalid_param(
                            &at,
                            format!("{at} is a part of type {other:?}; this model reads text only"),
                        ))
                    }
                    None => return Err(field_error(&format!("{at}.type"), "a part type like \"input_text\"", part)),
                }
            }
            Ok(texts.join(PART_SEPARATOR))
        }
        Some(other) => Err(field_error(at, "a string or a list of content parts", other)),
    }
}

/// The text of a reasoning item: its `content` (`reasoning_text` parts), else its `summary`
/// (`summary_text` parts).
fn reasoning_text(item: &Value, at: &str) -> Result<String, ApiError> {
    let pieces = |field: &str| -> Result<Vec<String>, ApiError> {
        match item.get(field) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(parts)) => parts
                .iter()
                .enumerate()
                .map(|(j, p)| string_field(p, &format!("{at}.{field}[{j}]"), "text").map(str::to_string))
                .collect(),
            Some(other) => Err(field_error(&format!("{at}.{field}"), "a list of text parts", other)),
        }
    };
    let content = pieces("content")?;
    let texts = if content.is_empty() { pieces("summary")? } else { content };
    Ok(texts.join(PART_SEPARATOR))
}

/// An assistant turn being read from consecutive items (its reasoning, text and calls).
#[derive(Default)]
struct AssistantTurn {
    reasoning: Vec<String>,
    text: Vec<String>,
    calls: Vec<ToolCall>,
}

impl AssistantTurn {
    fn into_message(self) -> Message {
        Message {
            role: "assistant".into(),
            content: Some(MessageContent::Text(self.text.join(PART_SEPARATOR))),
            reasoning_content: (!self.reasoning.is_empty()).then(|| self.reasoning.join(PART_SEPARATOR)),
            tool_calls: (!self.calls.is_empty()).then_some(self.calls),
            tool_call_id: None,
            name: None,
        }
    }
}

/// `instructions` and `input` in the server's chat form: `instructions` and the `system` or
/// `developer` messages before the first turn make the system prompt (a later one is a user
/// turn in its place); consecutive `reasoning`, assistant `message` and `function_call` items make
/// one assistant turn; a `function_call_output` is a tool message.
fn to_messages(instructions: Option<&Value>, input: &Value) -> Result<Vec<Message>, ApiError> {
    let mut system: Vec<String> = Vec::new();
    match instructions {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => system.push(s.clone()),
        Some(other) => return Err(field_error("instructions", "a string", other)),
    }
    let items: Vec<Value> = match input {
        Value::String(s) => vec![json!({"type": "message", "role": "user", "content": s})],
        Value::Array(items) => items.clone(),
        other => return Err(field_error("input", "a string or a list of input items", other)),
    };
    let mut turns: Vec<Message> = Vec::new();
    let mut assistant: Option<AssistantTurn> = None;
    // Tool names by call id, for the outputs that answer them.
    let mut names: Vec<(String, String)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        if !item.is_object() {
            return Err(field_error(&at, "an input item object", item));
        }
        // An item with a role and no type is a message (the API's "easy input message").
        let kind = match item.get("type") {
            None | Some(Value::Null) => "message",
            Some(Value::String(t)) => t.as_str(),
            Some(other) => return Err(field_error(&format!("{at}.type"), "a string", other)),
        };
        match kind {
            "message" => {
                let role = string_field(item, &at, "role")?;
                let text = content_text(item.get("content"), &format!("{at}.content"))?;
                match role {
                    "assistant" => assistant.get_or_insert_with(AssistantTurn::default).text.push(text),
                    // Before the first turn: the system prompt. Later (Codex's updates to
                    // its instructions) a user turn in its place: chat templates take one
                    // system message, at the start, and the prefix already run stays valid.
                    "system" | "developer" if turns.is_empty() && assistant.is_none() => system.push(text),
                    "system" | "developer" => {
                        turns.extend(assistant.take().map(AssistantTurn::into_message));
                        turns.push(Message::user(text));
                    }
                    "user" => {
                        turns.extend(assistant.take().map(AssistantTurn::into_message));
                        turns.push(Message::user(text));
                    }
                    other => {
                        return Err(ApiError::invalid_param(
                            format!("{at}.role"),
                            format!(
                            "{at}.role must be \"user\", \"assistant\", \"system\" or \"developer\"; found {other:?}"
                        ),
                        ))
                    }
                }
            }
            "reasoning" => {
                let text = reasoning_text(item, &at)?;
                if !text.is_empty() {
                    assistant.get_or_insert_with(AssistantTurn::default).reasoning.push(text);
                }
            }
            "function_call" => {
                let call_id = string_field(item, &at, "call_id")?.to_string();
                let name = string_field(item, &at, "name")?.to_string();
                let arguments = match item.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    Some(o @ Value::Object(_)) => o.to_string(),
                    None | Some(Value::Null) => "{}".to_string(),
                    Some(other) => return Err(field_error(&format!("{at}.arguments"), "a JSON string", other)),
                };
                names.push((call_id.clone(), name.clone()));
                let call = ToolCall { id: call_id, ..ToolCall::new(name, arguments) };
                assistant.get_or_insert_with(AssistantTurn::default).calls.push(call);
            }
            "function_call_output" => {
                turns.extend(assistant.take().map(AssistantTurn::into_message));
                let call_id = string_field(item, &at, "call_id")?.to_string();
                let output = content_text_or(item.get("output"), &format!("{at}.output"), Some(NOT_READ))?;
                let mut tool = Message::tool(call_id.clone(), output);
                tool.name = names.iter().find(|(id, _)| *id == call_id).map(|(_, n)| n.clone());
                turns.push(tool);
            }
            "item_reference" => {
                return Err(ApiError::invalid_param(
                    &at,
                    format!("{at} refers to a stored item; this server stores none: send the item itself"),
                ))
            }
            other => {
                return Err(ApiError::invalid_param(
                    format!("{at}.type"),
                    format!(
                        "{at}.type {other:?} is not an item this server reads (message, reasoning, function_call, \
                         function_call_output)"
                    ),
                ))
            }
        }
    }
    turns.extend(assistant.take().map(AssistantTurn::into_message));
    if !turns.iter().any(|m| m.role == "user") {
        return Err(ApiError::invalid_param("input", "input has no user message"));
    }
    let system: Vec<String> = system.into_iter().filter(|s| !s.is_empty()).collect();
    if !system.is_empty() {
        turns.insert(0, Message::system(system.join(PART_SEPARATOR)));
    }
    Ok(turns)
}

/// The request's tools as the model is shown them.
#[derive(Debug)]
struct Tools {
    /// Function tools in the chat form (a namespace's functions among them, flat).
    chat: Vec<Value>,
    choice: ToolChoice,
    /// The namespace of each function offered from a `namespace` tool: its calls name it.
    namespaces: Vec<(String, String)>,
    /// The types of the tools not offered (hosted and free-form ones), in order, once each.
    not_offered: Vec<String>,
    /// Where each chat tool is in the request (`tools[4].tools[1]`), for errors.
    origin: Vec<String>,
}

/// A function tool (`{type: "function", name, description, parameters}`) in the chat form.
fn chat_function(tool: &Value) -> Value {
    let mut function = Map::new();
    for field in ["name", "description", "parameters"] {
        if let Some(v) = tool.get(field).filter(|v| !v.is_null()) {
            function.insert(field.into(), v.clone());
        }
    }
    json!({"type": "function", "function": function})
}

/// The Responses API's tools as the chat form's function tools, and `tool_choice` (`auto`,
/// `none`, `required`, or `{type: "function", name}`) as the value [`validate_tools`] reads.
/// A `namespace` tool's functions are offered under their own names, and their calls carry
/// the namespace. Tools that OpenAI's servers run (`web_search`, `file_search`, …) and
/// free-form `custom` tools cannot run here: they are not offered (Codex sends some with
/// every request), and the reply names them (`x-frognano-tools-not-offered`).
fn to_tools(tools: &[Value], choice: Option<&Value>) -> Result<Tools, ApiError> {
    let mut chat = Vec::with_capacity(tools.len());
    let mut namespaces = Vec::new();
    let mut not_offered: Vec<String> = Vec::new();
    let mut skip = |kind: &str| {
        if !not_offered.iter().any(|k| k == kind) {
            not_offered.push(kind.to_string());
        }
    };
    // Where each chat tool came from, for errors in the request's names.
    let mut origin: Vec<String> = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        if !tool.is_object() {
            return Err(field_error(&at, "a tool object", tool));
        }
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {
                chat.push(chat_function(tool));
                origin.push(at);
            }
            Some("namespace") => {
                let namespace = string_field(tool, &at, "name")?;
                let inner = match tool.get("tools") {
                    Some(Value::Array(inner)) => inner,
                    Some(other) => return Err(field_error(&format!("{at}.tools"), "a list of tools", other)),
                    None => {
                        return Err(ApiError::invalid_param(format!("{at}.tools"), format!("{at}.tools is required")))
                    }
                };
                for (j, t) in inner.iter().enumerate() {
                    match t.get("type").and_then(Value::as_str) {
                        Some("function") => {
                            chat.push(chat_function(t));
                            origin.push(format!("{at}.tools[{j}]"));
                            let name = t.get("name").and_then(Value::as_str).unwrap_or_default();
                            namespaces.push((name.to_string(), namespace.to_string()));
                        }
                        Some(other) => skip(other),
                        None => return Err(field_error(&format!("{at}.tools[{j}].type"), "a tool type", t)),
                    }
                }
            }
            Some(other) => skip(other),
            None => return Err(ApiError::invalid_param(format!("{at}.type"), format!("{at}.type is required"))),
        }
    }
    let chat_choice = match choice.filter(|c| !c.is_null()) {
        None => None,
        Some(c @ Value::String(_)) => Some(c.clone()),
        Some(c) if c.get("type").and_then(Value::as_str) == Some("function") => {
            let name = string_field(c, "tool_choice", "name")?;
            Some(json!({"type": "function", "function": {"name": name}}))
        }
        Some(c) => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                format!(
                    "tool_choice must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"name\": …}}; \
                     found {c}"
                ),
            ))
        }
    };
    let rename = |s: &str| request_place(s, &origin);
    let choice = validate_tools(&chat, chat_choice.as_ref()).map_err(|e| ApiError {
        param: e.param.as_deref().map(rename),
        message: rename(&e.message),
        ..e
    })?;
    Ok(Tools { chat, choice, namespaces, not_offered, origin })
}

/// [`validate_tools`] names the chat form's places (`tools[3].function.name`, one in a
/// message); this says the request's (`tools[1].tools[0].name`), `origin` giving each chat
/// tool's place.
fn request_place(s: &str, origin: &[String]) -> String {
    let s = s.replace("tool_choice.function.name", "tool_choice.name");
    let Some(start) = s.find("tools[") else { return s };
    let digits = start + "tools[".len();
    let Some(len) = s[digits..].find(']') else { return s };
    let Some(at) = s[digits..digits + len].parse::<usize>().ok().and_then(|k| origin.get(k)) else { return s };
    let rest = &s[digits + len + 1..];
    format!("{}{at}{}", &s[..start], rest.strip_prefix(".function").unwrap_or(rest))
}

/// `reasoning.effort`: `none` and `minimal` turn the model's thinking off, `low` to `xhigh`
/// on (`enable_thinking` of the chat template, which has no levels); unset leaves the
/// template's default.
fn thinking(reasoning: Option<&Value>) -> Result<Option<bool>, ApiError> {
    let Some(r) = reasoning.filter(|r| !r.is_null()) else { return Ok(None) };
    if !r.is_object() {
        return Err(field_error("reasoning", "an object like {\"effort\": \"medium\"}", r));
    }
    match r.get("effort") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(e)) => match e.as_str() {
            "none" | "minimal" => Ok(Some(false)),
            "low" | "medium" | "high" | "xhigh" => Ok(Some(true)),
            other => Err(ApiError::invalid_param(
                "reasoning.effort",
                format!(
                    "reasoning.effort must be \"none\", \"minimal\", \"low\", \"medium\", \"high\" or \"xhigh\", \
                     found {other:?}"
                ),
            )),
        },
        Some(other) => Err(field_error("reasoning.effort", "a string", other)),
    }
}

/// `text.format` (`text`, `json_object`, or `json_schema` with `name` and `schema` beside
/// `type`) as the chat form's `response_format`, with errors in the Responses names.
fn response_format(text: Option<&Value>) -> Result<ResponseFormat, ApiError> {
    let Some(format) = text.and_then(|t| t.get("format")).filter(|f| !f.is_null()) else {
        return Ok(ResponseFormat::Text);
    };
    let chat = match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            let mut schema = format.as_object().cloned().unwrap_or_default();
            schema.remove("type");
            json!({"type": "json_schema", "json_schema": schema})
        }
        _ => format.clone(),
    };
    let rename =
        |s: &str| s.replace("response_format.json_schema", "text.format").replace("response_format", "text.format");
    crate::structured::parse_response_format(Some(&chat)).map_err(|e| ApiError {
        param: e.param.as_deref().map(rename),
        message: rename(&e.message),
        ..e
    })
}

// ---- replies ------------------------------------------------------------------------------------

/// A reply's parts ([`PartWriter`]) as output items and the stream events that build them:
/// reasoning in `reasoning` items (`reasoning_text` content), text in `message` items
/// (`output_text` content), each tool call a `function_call` item. `items` holds every item as
/// it stands; the whole reply is the same items, built from the same events.
struct ItemWriter {
    parts: PartWriter,
    /// The response id's unique part, which item ids share.
    stem: String,
    /// The namespace of each function offered from a `namespace` tool (its calls name it).
    namespaces: Vec<(String, String)>,
    items: Vec<Value>,
}

impl ItemWriter {
    fn new(response_id: &str, namespaces: Vec<(String, String)>) -> Self {
        let stem = response_id.strip_prefix("resp_").unwrap_or(response_id).to_string();
        ItemWriter { parts: PartWriter::default(), stem, namespaces, items: Vec::new() }
    }

    fn push(&mut self, delta: &Delta) -> Vec<Value> {
        let events = self.parts.push(delta);
        events.into_iter().flat_map(|e| self.events_of(e)).collect()
    }

    fn finish(&mut self) -> Vec<Value> {
        let events = self.parts.finish();
        events.into_iter().flat_map(|e| self.events_of(e)).collect()
    }

    /// The reasoning text of every item (for `usage.output_tokens_details`).
    fn reasoning(&self) -> String {
        self.items
            .iter()
            .filter(|i| i["type"] == "reasoning")
            .filter_map(|i| i["content"][0]["text"].as_str())
            .collect::<Vec<_>>()
            .join(PART_SEPARATOR)
    }

    fn item_id(&self, prefix: &str, index: usize) -> String {
        format!("{prefix}_{}{index:02x}", self.stem)
    }

    fn events_of(&mut self, event: PartEvent) -> Vec<Value> {
        match event {
            PartEvent::Open(index, kind, text) => {
                let (item, part) = match kind {
                    PartKind::Reasoning => (
                        json!({"id": self.item_id("rs", index), "type": "reasoning", "summary": [], "content": []}),
                        json!({"type": "reasoning_text", "text": ""}),
                    ),
                    PartKind::Text => (
                        json!({"id": self.item_id("msg", index), "type": "message", "status": "in_progress",
                               "role": "assistant", "content": []}),
                        json!({"type": "output_text", "text": "", "annotations": []}),
                    ),
                };
                let item_id = item["id"].clone();
                self.items.push(item.clone());
                self.items[index]["content"] = json!([part.clone()]);
                let mut out = vec![
                    json!({"type": "response.output_item.added", "output_index": index, "item": item}),
                    json!({"type": "response.content_part.added", "item_id": item_id, "output_index": index,
                           "content_index": 0, "part": part}),
                ];
                out.extend(self.events_of(PartEvent::Text(index, kind, text)));
                out
            }
            PartEvent::Text(index, kind, text) => {
                let part = &mut self.items[index]["content"][0];
                part["text"] = json!(format!("{}{text}", part["text"].as_str().unwrap_or_default()));
                let kind = match kind {
                    PartKind::Reasoning => "response.reasoning_text.delta",
                    PartKind::Text => "response.output_text.delta",
                };
                let mut event = json!({"type": kind, "item_id": self.items[index]["id"], "output_index": index,
                                       "content_index": 0, "delta": text});
                if kind == "response.output_text.delta" {
                    event["logprobs"] = json!([]);
                }
                vec![event]
            }
            PartEvent::Close(index, kind) => {
                if kind == PartKind::Text {
                    self.items[index]["status"] = json!("completed");
                }
                let item = self.items[index].clone();
                let part = item["content"][0].clone();
                let done = match kind {
                    PartKind::Reasoning => "response.reasoning_text.done",
                    PartKind::Text => "response.output_text.done",
                };
                let mut text_done = json!({"type": done, "item_id": item["id"], "output_index": index,
                                           "content_index": 0, "text": part["text"]});
                if kind == PartKind::Text {
                    text_done["logprobs"] = json!([]);
                }
                vec![
                    text_done,
                    json!({"type": "response.content_part.done", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "part": part}),
                    json!({"type": "response.output_item.done", "output_index": index, "item": item}),
                ]
            }
            PartEvent::Call(index, call) => {
                let id = self.item_id("fc", index);
                let mut added = json!({"id": id, "type": "function_call", "status": "in_progress",
                                       "call_id": call.id, "name": call.function.name, "arguments": ""});
                if let Some((_, namespace)) = self.namespaces.iter().find(|(name, _)| *name == call.function.name) {
                    added["namespace"] = json!(namespace);
                }
                let mut done = added.clone();
                done["status"] = json!("completed");
                done["arguments"] = json!(call.function.arguments);
                self.items.push(done.clone());
                vec![
                    json!({"type": "response.output_item.added", "output_index": index, "item": added}),
                    json!({"type": "response.function_call_arguments.delta", "item_id": id, "output_index": index,
                           "delta": call.function.arguments}),
                    json!({"type": "response.function_call_arguments.done", "item_id": id, "output_index": index,
                           "name": call.function.name, "arguments": call.function.arguments}),
                    json!({"type": "response.output_item.done", "output_index": index, "item": done}),
                ]
            }
        }
    }
}

/// The request's settings as a response echoes them.
struct Echo {
    instructions: Value,
    tools: Value,
    tool_choice: Value,
    temperature: Value,
    top_p: Value,
    max_output_tokens: Value,
    reasoning: Value,
    text: Value,
}

/// A response object: `status` `in_progress`, `completed`, `incomplete` (the token limit or
/// the context ended it) or `failed`.
fn response_object(app: &AppState, id: &str, created_at: u64, echo: &Echo, status: &str, output: &[Value]) -> Value {
    json!({
        "id": id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": false,
        "error": null,
        "incomplete_details": null,
        "instructions": echo.instructions,
        "max_output_tokens": echo.max_output_tokens,
        "model": app.model_name,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "reasoning": echo.reasoning,
        "store": false,
        "temperature": echo.temperature,
        "text": echo.text,
        "tool_choice": echo.tool_choice,
        "tools": echo.tools,
        "top_p": echo.top_p,
        "truncation": "disabled",
        "usage": null,
        "metadata": {},
    })
}

/// The finished response: its status from how the reply ended, and `usage` (the reasoning
/// tokens counted by tokenizing the reasoning text).
fn finished(app: &AppState, mut response: Value, writer: &ItemWriter, summary: &JobSummary) -> Value {
    let incomplete = summary.finish_reason == "length";
    response["status"] = json!(if incomplete { "incomplete" } else { "completed" });
    if incomplete {
        response["incomplete_details"] = json!({"reason": "max_output_tokens"});
    }
    response["output"] = json!(writer.items);
    let reasoning = writer.reasoning();
    let reasoning_tokens =
        if reasoning.is_empty() { 0 } else { app.tokenizer.encode_with(&reasoning, false).map_or(0, |ids| ids.len()) };
    response["usage"] = json!({
        "input_tokens": summary.prompt_tokens,
        "input_tokens_details": {"cached_tokens": summary.cached_tokens},
        "output_tokens": summary.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens.min(summary.completion_tokens)},
        "total_tokens": summary.prompt_tokens + summary.completion_tokens,
    });
    response
}

async fn responses(State(app): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    match responses_inner(Arc::clone(&app), headers, body).await {
        Ok(r) => r,
        Err(e) => app.public(e).into_response(),
    }
}

async fn responses_inner(app: Arc<AppState>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let bytes = read_body(&app, &headers, body).await?;
    let req: ResponsesRequest = parse_body(&bytes)?;
    app.check_model(req.model.as_deref())?;
    for (field, value) in [("previous_response_id", &req.previous_response_id), ("conversation", &req.conversation)] {
        if value.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid_param(
                field,
                format!("{field}: this server stores no responses; send the whole conversation in `input`"),
            ));
        }
    }
    if req.background == Some(true) {
        return Err(ApiError::invalid_param("background", "background responses are not supported by this server"));
    }
    if req.top_logprobs.is_some_and(|k| k > 0) {
        return Err(ApiError::invalid_param(
            "top_logprobs",
            "top_logprobs is not supported on /v1/responses by this server; /v1/chat/completions reports logprobs",
        ));
    }
    let input = req
        .input
        .as_ref()
        .filter(|v| !v.is_null())
        .ok_or_else(|| ApiError::invalid_param("input", "input is required: a string or a list of input items"))?;
    let messages = to_messages(req.instructions.as_ref(), input)?;
    let tools = to_tools(req.tools.as_deref().unwrap_or_default(), req.tool_choice.as_ref())?;
    let mut kwargs = Map::new();
    if let Some(on) = thinking(req.reasoning.as_ref())? {
        kwargs.insert("enable_thinking".into(), Value::Bool(on));
    }
    let response_format = response_format(req.text.as_ref())?;
    let echo = Echo {
        instructions: req.instructions.clone().unwrap_or(Value::Null),
        tools: json!(req.tools.clone().unwrap_or_default()),
        tool_choice: req.tool_choice.clone().unwrap_or(json!("auto")),
        temperature: json!(req.temperature),
        top_p: json!(req.top_p),
        max_output_tokens: json!(req.max_output_tokens),
        reasoning: req.reasoning.clone().unwrap_or(json!({"effort": null, "summary": null})),
        text: req.text.clone().unwrap_or(json!({"format": {"type": "text"}})),
    };
    let started = start_chat(
        &app,
        ChatInput {
            messages: &messages,
            tools: tools.chat,
            choice: tools.choice,
            sampling: SamplingFields { temperature: req.temperature, top_p: req.top_p, ..SamplingFields::default() },
            max_tokens: req.max_output_tokens,
            stops: Vec::new(),
            template_kwargs: Some(&kwargs),
            response_format,
            logprobs: None,
        },
    )
    .await
    .map_err(|e| match e.overflow {
        // A prompt longer than the context: OpenAI's sentence, with the code Codex reads as a
        // context window it ran out of (its next turn then compacts the conversation first).
        Some(overflow) => ApiError { message: overflow.responses_message(), param: Some("input".into()), ..e },
        None => {
            // A schema the grammar refuses is named where the request put it.
            let rename =
                |s: &str| request_place(&s.replace("response_format.json_schema", "text.format"), &tools.origin);
            ApiError { param: e.param.as_deref().map(rename), message: rename(&e.message), ..e }
        }
    })?;
    let id = app.response_id("resp").replacen("resp-", "resp_", 1);
    let created_at = unix_now();
    let injected = started.tool_prompt_injected;
    let writer = ItemWriter::new(&id, tools.namespaces);
    let mut response = if req.stream.unwrap_or(false) {
        stream_response(app, id, created_at, echo, writer, started.events)
    } else {
        let (out, summary) = collect(started.events).await?;
        let mut writer = writer;
        writer.push(&out);
        writer.finish();
        let response = response_object(&app, &id, created_at, &echo, "in_progress", &[]);
        Json(finished(&app, response, &writer, &summary)).into_response()
    };
    if !tools.not_offered.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&tools.not_offered.join(", ")) {
            response.headers_mut().insert("x-frognano-tools-not-offered", v);
        }
    }
    Ok(crate::routes::with_tool_prompt_header(response, injected))
}

fn stream_response(
    app: Arc<AppState>,
    id: String,
    created_at: u64,
    echo: Echo,
    mut writer: ItemWriter,
    mut rx: mpsc::UnboundedReceiver<JobEvent>,
) -> Response {
    let (tx, body_rx) = mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let mut sequence = 0u64;
        // Every event is named as its data's `type` and numbered in order.
        let mut send = |mut data: Value| {
            data["sequence_number"] = json!(sequence);
            sequence += 1;
            let name = data["type"].as_str().unwrap_or("error").to_string();
            Event::default().event(name).data(data.to_string())
        };
        let response = response_object(&app, &id, created_at, &echo, "in_progress", &[]);
        for kind in ["response.created", "response.in_progress"] {
            if tx.send(send(json!({"type": kind, "response": response}))).await.is_err() {
                return;
            }
        }
        let keep_alive = || Event::default().comment("keep-alive");
        while let Some(job_event) = next_event_keeping_alive(&mut rx, &tx, KEEP_ALIVE_EVERY, keep_alive).await {
            match job_event {
                JobEvent::Delta(d) => {
                    for e in writer.push(&d) {
                        if tx.send(send(e)).await.is_err() {
                            return; // client gone: dropping `rx` stops the generation
                        }
                    }
                }
                JobEvent::Done(summary) => {
                    for e in writer.finish() {
                        let _ = tx.send(send(e)).await;
                    }
                    let done = finished(&app, response.clone(), &writer, &summary);
                    let kind =
                        if done["status"] == "incomplete" { "response.incomplete" } else { "response.completed" };
                    let _ = tx.send(send(json!({"type": kind, "response": done}))).await;
                    return;
                }
                JobEvent::Failed(err) => {
                    let err = app.public(err);
                    let mut failed = response.clone();
                    failed["status"] = json!("failed");
                    failed["output"] = json!(writer.items);
                    failed["error"] = json!({"code": "server_error", "message": err.message});
                    let _ = tx.send(send(json!({"type": "response.failed", "response": failed}))).await;
                    return;
                }
            }
        }
        let mut failed = response.clone();
        failed["status"] = json!("failed");
        failed["error"] = json!({"code": "server_error", "message": "The generation scheduler stopped."});
        let _ = tx.send(send(json!({"type": "response.failed", "response": failed}))).await;
    });
    sse_response(body_rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_built_by_their_events_in_order() {
        let mut w = ItemWriter::new("resp_ab01", vec![]);
        let mut events = w.push(&Delta::of("Let me", "", vec![]));
        events.extend(w.push(&Delta::of(" look.\n", "\n\n", vec![])));
        let call = ToolCall { id: "call_7".into(), ..ToolCall::new("Bash", r#"{"command":"ls"}"#) };
        events.extend(w.push(&Delta::of("", "", vec![call])));
        events.extend(w.push(&Delta::of("", "Done", vec![])));
        events.extend(w.finish());
        let kinds: Vec<String> =
            events.iter().map(|e| format!("{} {}", e["type"].as_str().unwrap(), e["output_index"])).collect();
        assert_eq!(
            kinds,
            [
                "response.output_item.added 0",
                "response.content_part.added 0",
                "response.reasoning_text.delta 0",
                "response.reasoning_text.delta 0",
                "response.reasoning_text.done 0",
                "response.content_part.done 0",
                "response.output_item.done 0",
                "response.output_item.added 1",
                "response.function_call_arguments.delta 1",
                "response.function_call_arguments.done 1",
                "response.output_item.done 1",
                "response.output_item.added 2",
                "response.content_part.added 2",
                "response.output_text.delta 2",
                "response.output_text.done 2",
                "response.content_part.done 2",
                "response.output_item.done 2",
            ]
        );
        assert_eq!(w.items[0]["content"][0], json!({"type": "reasoning_text", "text": "Let me look.\n"}));
        assert_eq!(
            w.items[1],
            json!({"id": "fc_ab0101", "type": "function_call", "status": "completed", "call_id": "call_7",
                   "name": "Bash", "arguments": r#"{"command":"ls"}"#})
        );
        assert_eq!(w.items[2]["content"][0]["text"], "Done");
        assert_eq!(w.items[2]["status"], "completed");
        // Each `output_item.done` carries the item as the whole reply has it.
        let done: Vec<&Value> =
            events.iter().filter(|e| e["type"] == "response.output_item.done").map(|e| &e["item"]).collect();
        assert_eq!(done, w.items.iter().collect::<Vec<_>>());
        assert_eq!(w.reasoning(), "Let me look.\n");
    }

    #[test]
    fn input_items_become_the_chat_form() {
        let input = json!([
            {"role": "developer", "content": "Use the tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List files."}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "ls it"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Listing."}]},
            {"type": "function_call", "call_id": "call_1", "name": "Bash", "arguments": "{\"command\":\"ls\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.py"},
            {"role": "user", "content": "Now?"},
        ]);
        let m = to_messages(Some(&json!("Be brief.")), &input).unwrap();
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(m[0].text(), "Be brief.\n\nUse the tools.");
        assert_eq!(m[2].text(), "Listing.");
        assert_eq!(m[2].reasoning_content.as_deref(), Some("ls it"));
        assert_eq!(m[2].calls()[0].id, "call_1");
        assert_eq!(m[2].calls()[0].function.arguments, r#"{"command":"ls"}"#);
        assert_eq!((m[3].tool_call_id.as_deref(), m[3].name.as_deref()), (Some("call_1"), Some("Bash")));
        assert_eq!(m[3].text(), "a.py");
        let late = to_messages(
            None,
            &json!([{"role": "user", "content": "Hi"},
            {"role": "developer", "content": "Sandbox: read-only."},
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": "x"},
                {"type": "input_text", "text": "a diagram"}]}]),
        )
        .unwrap();
        let roles: Vec<&str> = late.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "user", "tool"], "a late developer message is a user turn");
        assert_eq!(late[2].text(), format!("{NOT_READ}\n\na diagram"), "a tool's image does not end the session");
        let plain = to_messages(None, &json!("Hi")).unwrap();
        assert_eq!((plain.len(), plain[0].role.as_str(), plain[0].text().as_ref()), (1, "user", "Hi"));
    }

    #[test]
    fn bad_items_name_their_place() {
        let e = to_messages(None, &json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]))
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[0].content[0]"));
        assert!(e.message.contains("\"input_image\""), "{}", e.message);
        let e = to_messages(None, &json!([{"type": "function_call_output", "output": "x"}])).unwrap_err();
        assert_eq!(e.message, "input[0].call_id is required");
        let e = to_messages(None, &json!([{"type": "item_reference", "id": "msg_1"}])).unwrap_err();
        assert!(e.message.contains("stores none"), "{}", e.message);
        let e = to_messages(None, &json!([{"type": "local_shell_call"}])).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[0].type"));
        let e = to_messages(None, &json!([{"role": "tool", "content": "x"}])).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[0].role"));
        let e = to_messages(Some(&json!("Be brief.")), &json!([])).unwrap_err();
        assert_eq!(e.message, "input has no user message");
        let e = to_messages(None, &json!(5)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input"));
    }

    #[test]
    fn tools_choices_reasoning_and_formats_are_read_in_the_responses_names() {
        let bash = json!({"type": "function", "name": "Bash", "description": "Run.", "strict": false,
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}});
        let tools = to_tools(std::slice::from_ref(&bash), Some(&json!("required"))).unwrap();
        assert_eq!(tools.chat[0]["function"]["name"], "Bash");
        assert_eq!(tools.chat[0]["function"]["parameters"]["required"], json!(["command"]));
        assert_eq!(tools.choice, ToolChoice::Required(None));
        let named = to_tools(std::slice::from_ref(&bash), Some(&json!({"type": "function", "name": "Bash"})));
        assert_eq!(named.unwrap().choice, ToolChoice::Required(Some("Bash".into())));
        let e = to_tools(&[json!({"type": "function", "name": "two words"})], None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].name"));
        let e = to_tools(std::slice::from_ref(&bash), Some(&json!({"type": "allowed_tools"}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));

        // What Codex sends: a namespace of functions, a hosted web search, a free-form tool.
        let spawn = json!({"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}});
        let sent = [
            bash.clone(),
            json!({"type": "web_search", "external_web_access": false}),
            json!({"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
                   "tools": [spawn, {"type": "custom", "name": "apply_patch"}]}),
            json!({"type": "web_search"}),
        ];
        let tools = to_tools(&sent, None).unwrap();
        let names: Vec<&str> = tools.chat.iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["Bash", "spawn_agent"]);
        assert_eq!(tools.namespaces, [("spawn_agent".to_string(), "multi_agent_v1".to_string())]);
        assert_eq!(tools.not_offered, ["web_search", "custom"]);
        let clash = [bash.clone(), json!({"type": "namespace", "name": "ns", "tools": [bash]})];
        let e = to_tools(&clash, None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[1].tools[0].name"), "{}", e.message);
        assert!(e.message.starts_with("tools[1].tools[0].name \"Bash\""), "{}", e.message);

        assert_eq!(thinking(None).unwrap(), None);
        assert_eq!(thinking(Some(&json!({"effort": "minimal"}))).unwrap(), Some(false));
        assert_eq!(thinking(Some(&json!({"effort": "high", "summary": "auto"}))).unwrap(), Some(true));
        assert_eq!(thinking(Some(&json!({"effort": "max"}))).unwrap_err().param.as_deref(), Some("reasoning.effort"));

        assert_eq!(response_format(None).unwrap(), ResponseFormat::Text);
        assert_eq!(
            response_format(Some(&json!({"format": {"type": "json_object"}}))).unwrap(),
            ResponseFormat::JsonObject
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let f = response_format(Some(&json!({"format": {"type": "json_schema", "name": "A", "schema": schema}})));
        assert_eq!(f.unwrap(), ResponseFormat::JsonSchema { name: "A".into(), schema });
        let e = response_format(Some(&json!({"format": {"type": "json_schema", "schema": {}}}))).unwrap_err();
        assert!(e.param.as_deref().is_some_and(|p| p.starts_with("text.format")), "{e:?}");
    }
}
