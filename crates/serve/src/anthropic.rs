//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), so the
//! `anthropic` SDKs and Claude-Code-style agents can point at `frognano serve`
//! (`ANTHROPIC_BASE_URL=http://HOST:PORT`). A request is read into the server's chat form and
//! runs on the same path as `/v1/chat/completions` ([`crate::routes::start_chat`]): the model's
//! chat template, its tool-call codec, the same limits. Content comes back as Anthropic's
//! blocks (`thinking`, `text`, `tool_use`), streamed as its server-sent events
//! (`message_start`, `content_block_start` / `_delta` / `_stop`, `message_delta`,
//! `message_stop`, `ping`); errors are `{"type": "error", "error": {"type", "message"}}`.
//! The `x-api-key`, `anthropic-version` and `anthropic-beta` headers are accepted and not
//! checked. Field by field: docs/serve.md §8.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use frognano_protocol::{Message, MessageContent, ToolCall};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::api::{parse_body, validate_tools, SamplingFields};
use crate::error::ApiError;
use crate::output::{Delta, PartEvent, PartKind, PartWriter};
use crate::pool::{JobEvent, JobSummary};
use crate::routes::{
    check_stop_list, collect, next_event_keeping_alive, read_body, render_chat, sse_response, start_chat, AppState,
    ChatInput,
};
use crate::structured::ResponseFormat;

/// A `ping` is sent when nothing else was for this long (a long prompt being prefilled), so
/// clients and proxies with read timeouts keep the stream.
const PING_EVERY: Duration = Duration::from_secs(10);

/// What text blocks of one `system` or message are joined with.
const BLOCK_SEPARATOR: &str = "\n\n";

/// The Anthropic endpoints.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/messages", post(messages)).route("/v1/messages/count_tokens", post(count_tokens))
}

// ---- errors -------------------------------------------------------------------------------------

/// Anthropic's error type for an HTTP status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 408 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

/// `{"type": "error", "error": {"type", "message"}}`. A prompt longer than the context is
/// worded as Anthropic words it, which is what Claude Code looks for before it compacts the
/// conversation.
fn error_body(e: &ApiError) -> Value {
    let message = e.overflow.map_or_else(|| e.message.clone(), |o| o.anthropic_message());
    json!({"type": "error", "error": {"type": error_type(e.status), "message": message}})
}

fn error_response(app: &AppState, e: ApiError) -> Response {
    let e = app.public(e);
    let mut response = (e.status, Json(error_body(&e))).into_response();
    if let Some(secs) = e.retry_after {
        response.headers_mut().insert(header::RETRY_AFTER, secs.into());
    }
    response
}

/// Anthropic names a missing field `field: Field required`.
fn required(field: &str) -> ApiError {
    ApiError::invalid_param(field, format!("{field}: Field required"))
}

/// An error about the OpenAI form of the tools ([`validate_tools`]) in Anthropic's names:
/// `tools[0].name` for `tools[0].function.name`, `input_schema` for `parameters`.
fn tool_error(e: ApiError) -> ApiError {
    let rename = |s: &str| s.replace(".function.parameters", ".input_schema").replace(".function.", ".");
    ApiError { param: e.param.as_deref().map(rename), message: rename(&e.message), ..e }
}

// ---- requests -----------------------------------------------------------------------------------

/// `POST /v1/messages` (and, without `max_tokens`, `count_tokens`). Fields the server has no
/// use for (`metadata`, `service_tier`, `cache_control` on blocks, …) are ignored.
#[derive(Debug, Clone, Deserialize)]
struct MessagesRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    messages: Option<Vec<InputMessage>>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<i64>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    thinking: Option<Value>,
    #[serde(default)]
    output_config: Option<Value>,
    #[serde(default)]
    output_format: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
struct InputMessage {
    role: String,
    content: Value,
}

/// The request in the server's chat form.
struct Conversation {
    messages: Vec<Message>,
    tools: Vec<Value>,
    choice: crate::api::ToolChoice,
    kwargs: Map<String, Value>,
}

fn check_model(app: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        None => Err(required("model")),
        Some(m) if m == app.model_name => Ok(()),
        Some(m) => Err(ApiError {
            message: format!("model: {m} not found; this server serves {}", app.model_name),
            ..ApiError::model_not_found(m, &app.model_name)
        }),
    }
}

/// What an image or document block of a `tool_result` becomes: the model reads text, and an
/// agent's session must go on after a tool (Claude Code's Read of a picture) returns one.
const NOT_READ: &str = frognano_protocol::NOT_READ_PART;

/// A string, or a list of text blocks joined by [`BLOCK_SEPARATOR`] (`system`, the content
/// of a `tool_result`). `at` names the field in errors.
fn text_of(value: &Value, at: &str) -> Result<String, ApiError> {
    text_of_or(value, at, None)
}

/// [`text_of`], with `stand_in` (if given) as the text of a block that is not text instead
/// of a 400.
fn text_of_or(value: &Value, at: &str, stand_in: Option<&str>) -> Result<String, ApiError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (j, block) in blocks.iter().enumerate() {
                match block_type(block, &format!("{at}[{j}]"))? {
                    "text" => texts.push(block_text(block, &format!("{at}[{j}]"))?),
                    _ if stand_in.is_some() => texts.push(stand_in.unwrap_or_default().to_string()),
                    other => return Err(not_text(&format!("{at}[{j}]"), other)),
                }
            }
            Ok(texts.join(BLOCK_SEPARATOR))
        }
        other => {
            Err(ApiError::invalid_param(at, format!("{at} must be a string or a list of text blocks, found {other}")))
        }
    }
}

fn block_type<'a>(block: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    match block.get("type") {
        Some(Value::String(t)) => Ok(t),
        Some(other) => {
            Err(ApiError::invalid_param(format!("{at}.type"), format!("{at}.type must be a string, found {other}")))
        }
        None if block.is_object() => Err(required(&format!("{at}.type"))),
        None => Err(ApiError::invalid_param(at, format!("{at} must be a content block object, found {block}"))),
    }
}

fn block_text(block: &Value, at: &str) -> Result<String, ApiError> {
    match block.get("text") {
        Some(Value::String(t)) => Ok(t.clone()),
        Some(other) => {
            Err(ApiError::invalid_param(format!("{at}.text"), format!("{at}.text must be a string, found {other}")))
        }
        None => Err(required(&format!("{at}.text"))),
    }
}

fn string_field(block: &Value, at: &str, field: &str) -> Result<String, ApiError> {
    match block.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(ApiError::invalid_param(
            format!("{at}.{field}"),
            format!("{at}.{field} must be a string, found {other}"),
        )),
        None => Err(required(&format!("{at}.{field}"))),
    }
}

fn not_text(at: &str, kind: &str) -> ApiError {
    ApiError::invalid_param(at, format!("{at} is a block of type {kind:?}; this model reads text only"))
}

/// Anthropic's messages in OpenAI form: a user turn's `tool_result` blocks become `tool`
/// messages (in their order, around the turn's text), an assistant turn's `thinking` blocks
/// its `reasoning_content` and its `tool_use` blocks its tool calls.
fn to_messages(system: Option<&Value>, input: &[InputMessage]) -> Result<Vec<Message>, ApiError> {
    let mut out = Vec::new();
    if let Some(system) = system.filter(|s| !s.is_null()) {
        let text = text_of(system, "system")?;
        if !text.is_empty() {
            out.push(Message::system(text));
        }
    }
    // Tool names by call id, for the tool messages that answer them.
    let mut names: Vec<(String, String)> = Vec::new();
    for (i, m) in input.iter().enumerate() {
        let at = format!("messages[{i}]");
        let blocks: Vec<Value> = match &m.content {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(blocks) => blocks.clone(),
            other => {
                return Err(ApiError::invalid_param(
                    format!("{at}.content"),
                    format!("{at}.content must be a string or a list of content blocks, found {other}"),
                ))
            }
        };
        match m.role.as_str() {
            "user" => {
                let mut texts: Vec<String> = Vec::new();
                for (j, block) in blocks.iter().enumerate() {
                    let at = format!("{at}.content[{j}]");
                    match block_type(block, &at)? {
                        "text" => texts.push(block_text(block, &at)?),
                        "tool_result" => {
                            if !texts.is_empty() {
                                out.push(Message::user(std::mem::take(&mut texts).join(BLOCK_SEPARATOR)));
                            }
                            let id = string_field(block, &at, "tool_use_id")?;
                            let mut text = match block.get("content") {
                                None | Some(Value::Null) => String::new(),
                                Some(c) => text_of_or(c, &format!("{at}.content"), Some(NOT_READ))?,
                            };
                            if block.get("is_error").and_then(Value::as_bool) == Some(true) {
                                // The template has no field for it; the model reads it.
                                text = format!("Error: {text}");
                            }
                            let mut tool = Message::tool(id.clone(), text);
                            tool.name = names.iter().find(|(call, _)| *call == id).map(|(_, n)| n.clone());
                            out.push(tool);
                        }
                        other => return Err(not_text(&at, other)),
                    }
                }
                if !texts.is_empty() || blocks.is_empty() {
                    out.push(Message::user(texts.join(BLOCK_SEPARATOR)));
                }
            }
            "assistant" => {
                let (mut texts, mut thinking, mut calls) = (Vec::new(), Vec::new(), Vec::new());
                for (j, block) in blocks.iter().enumerate() {
                    let at = format!("{at}.content[{j}]");
                    match block_type(block, &at)? {
                        "text" => texts.push(block_text(block, &at)?),
                        "thinking" => thinking.push(string_field(block, &at, "thinking")?),
                        // Encrypted thinking of Anthropic's models: nothing a local model can read.
                        "redacted_thinking" => {}
                        "tool_use" => {
                            let id = string_field(block, &at, "id")?;
                            let name = string_field(block, &at, "name")?;
                            let input = match block.get("input") {
                                Some(Value::Object(o)) => Value::Object(o.clone()),
                                None | Some(Value::Null) => json!({}),
                                Some(other) => {
                                    return Err(ApiError::invalid_param(
                                        format!("{at}.input"),
                                        format!("{at}.input must be an object, found {other}"),
                                    ))
                                }
                            };
                            names.push((id.clone(), name.clone()));
                            calls.push(ToolCall { id, ..ToolCall::new(name, input.to_string()) });
                        }
                        other => return Err(not_text(&at, other)),
                    }
                }
                let content = texts.join(BLOCK_SEPARATOR);
                out.push(Message {
                    role: "assistant".into(),
                    content: Some(MessageContent::Text(content)),
                    reasoning_content: (!thinking.is_empty()).then(|| thinking.join(BLOCK_SEPARATOR)),
                    tool_calls: (!calls.is_empty()).then_some(calls),
                    tool_call_id: None,
                    name: None,
                });
            }
            // A system message among the messages (Anthropic's mid-conversation system
            // messages; Claude Code sends them). Before the first turn its text joins the
            // system prompt; later it comes as a user turn in its place, since chat templates
            // take one system message, at the start (Qwen3.5's refuses any other).
            "system" => {
                let text = text_of(&m.content, &format!("{at}.content"))?;
                if out.iter().any(|m| m.role != "system") {
                    out.push(Message::user(text));
                } else if let Some(system) = out.first_mut() {
                    *system = Message::system(format!("{}{BLOCK_SEPARATOR}{text}", system.text()));
                } else {
                    out.push(Message::system(text));
                }
            }
            other => {
                return Err(ApiError::invalid_param(
                    format!("{at}.role"),
                    format!("{at}.role must be \"user\", \"assistant\" or \"system\"; found {other:?}"),
                ));
            }
        }
    }
    Ok(out)
}

/// Anthropic's tools (`{name, description, input_schema}`) as OpenAI function tools, and
/// `tool_choice` (`auto`, `any`, `tool`, `none`) as the OpenAI value [`validate_tools`] reads.
fn to_tools(tools: &[Value], choice: Option<&Value>) -> Result<(Vec<Value>, crate::api::ToolChoice), ApiError> {
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        let Some(obj) = tool.as_object() else {
            return Err(ApiError::invalid_param(&at, format!("{at} must be an object, found {tool}")));
        };
        if let Some(kind) = obj.get("type").filter(|t| !t.is_null()) {
            if kind.as_str() != Some("custom") {
                return Err(ApiError::invalid_param(
                    format!("{at}.type"),
                    format!(
                        "{at}.type {kind} is a tool that Anthropic's servers define; this server runs custom \
                         tools only (name, description, input_schema)"
                    ),
                ));
            }
        }
        let schema = match obj.get("input_schema") {
            Some(s @ Value::Object(_)) => s.clone(),
            Some(other) => {
                return Err(ApiError::invalid_param(
                    format!("{at}.input_schema"),
                    format!("{at}.input_schema must be a JSON schema object, found {other}"),
                ))
            }
            None => return Err(required(&format!("{at}.input_schema"))),
        };
        let mut function = Map::new();
        function.insert("name".into(), obj.get("name").cloned().unwrap_or(Value::Null));
        if let Some(d) = obj.get("description") {
            function.insert("description".into(), d.clone());
        }
        function.insert("parameters".into(), schema);
        out.push(json!({"type": "function", "function": function}));
    }
    let openai_choice = match choice.filter(|c| !c.is_null()) {
        None => None,
        Some(c) => match c.get("type").and_then(Value::as_str) {
            Some("auto") => Some(json!("auto")),
            Some("any") => Some(json!("required")),
            Some("none") => Some(json!("none")),
            Some("tool") => {
                let name = string_field(c, "tool_choice", "name")?;
                Some(json!({"type": "function", "function": {"name": name}}))
            }
            _ => {
                return Err(ApiError::invalid_param(
                    "tool_choice.type",
                    format!("tool_choice must be {{\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}}, found {c}"),
                ))
            }
        },
    };
    let choice = validate_tools(&out, openai_choice.as_ref()).map_err(tool_error)?;
    Ok((out, choice))
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}`, `{"type": "adaptive"}` or
/// `{"type": "between_tools"}` turn the
/// model's thinking on (`enable_thinking` of the chat template; the budget is not enforced,
/// `max_tokens` bounds the whole reply), `{"type": "disabled"}` or none leave it off.
fn thinking_on(thinking: Option<&Value>) -> Result<bool, ApiError> {
    let Some(t) = thinking.filter(|t| !t.is_null()) else { return Ok(false) };
    match t.get("type").and_then(Value::as_str) {
        Some("enabled") => {
            if let Some(b) = t.get("budget_tokens") {
                if !b.is_u64() {
                    return Err(ApiError::invalid_param(
                        "thinking.budget_tokens",
                        format!("thinking.budget_tokens must be a positive integer, found {b}"),
                    ));
                }
            }
            Ok(true)
        }
        Some("adaptive" | "between_tools") => Ok(true),
        Some("disabled") => Ok(false),
        _ => Err(ApiError::invalid_param(
            "thinking.type",
            format!(
                "thinking must be {{\"type\": \"enabled\" | \"adaptive\" | \"between_tools\" | \"disabled\"}}; \
                 found {t}"
            ),
        )),
    }
}

/// Structured outputs: `output_config.format` (or the earlier beta's `output_format`),
/// `{"type": "json_schema", "schema": …}`, shapes the reply's text as `response_format` does
/// on the chat endpoint (a grammar, docs/structured.md). `output_config.effort` is ignored.
fn output_format(req: &MessagesRequest) -> Result<ResponseFormat, ApiError> {
    let Some((at, format)) = format_field(req) else { return Ok(ResponseFormat::Text) };
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            let schema = format.get("schema").ok_or_else(|| required(&format!("{at}.schema")))?;
            let chat = json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}});
            crate::structured::parse_response_format(Some(&chat)).map_err(|e| in_format_field(e, at))
        }
        _ => Err(ApiError::invalid_param(
            format!("{at}.type"),
            format!("{at}.type must be \"json_schema\", found {}", format.get("type").unwrap_or(&Value::Null)),
        )),
    }
}

/// Where the request asks for structured output, and what it asks: `output_config.format`,
/// else `output_format`.
fn format_field(req: &MessagesRequest) -> Option<(&'static str, &Value)> {
    let config = req.output_config.as_ref().and_then(|c| c.get("format")).filter(|f| !f.is_null());
    match (config, req.output_format.as_ref().filter(|f| !f.is_null())) {
        (Some(f), _) => Some(("output_config.format", f)),
        (None, Some(f)) => Some(("output_format", f)),
        (None, None) => None,
    }
}

/// An error about the chat form's `response_format.json_schema` named at `at`, the field
/// the request put its format in.
fn in_format_field(e: ApiError, at: &str) -> ApiError {
    let rename = |s: &str| s.replace("response_format.json_schema", at);
    ApiError { param: e.param.as_deref().map(rename), message: rename(&e.message), ..e }
}

/// Reads what both endpoints share: model, messages, system, tools, thinking.
fn conversation(app: &AppState, req: &MessagesRequest) -> Result<Conversation, ApiError> {
    check_model(app, req.model.as_deref())?;
    let input = req.messages.as_deref().ok_or_else(|| required("messages"))?;
    if input.is_empty() {
        return Err(ApiError::invalid_param("messages", "messages: at least one message is required"));
    }
    let messages = to_messages(req.system.as_ref(), input)?;
    if input.last().is_some_and(|m| m.role == "assistant") {
        return Err(ApiError::invalid_param(
            format!("messages[{}]", input.len() - 1),
            "the last message is the assistant's: continuing a prefilled reply is not supported by this server; \
             end with a user message",
        ));
    }
    let (tools, choice) = to_tools(req.tools.as_deref().unwrap_or_default(), req.tool_choice.as_ref())?;
    let mut kwargs = Map::new();
    kwargs.insert("enable_thinking".into(), Value::Bool(thinking_on(req.thinking.as_ref())?));
    Ok(Conversation { messages, tools, choice, kwargs })
}

// ---- replies ------------------------------------------------------------------------------------

/// One step of a reply's content, as the stream sends it.
#[derive(Debug, Clone, PartialEq)]
enum BlockEvent {
    /// `content_block_start`: a block at `index`, empty.
    Start(usize, Value),
    /// `content_block_delta`.
    Delta(usize, Value),
    /// `content_block_stop`.
    Stop(usize),
}

fn block_start(kind: PartKind) -> Value {
    match kind {
        PartKind::Reasoning => json!({"type": "thinking", "thinking": "", "signature": ""}),
        PartKind::Text => json!({"type": "text", "text": ""}),
    }
}

fn block_delta(kind: PartKind, text: &str) -> Value {
    match kind {
        PartKind::Reasoning => json!({"type": "thinking_delta", "thinking": text}),
        PartKind::Text => json!({"type": "text_delta", "text": text}),
    }
}

/// A reply's parts ([`PartWriter`]) as content blocks: reasoning in `thinking` blocks, text
/// in `text` blocks, each tool call a `tool_use` block. The whole and the streamed reply are
/// both built from these events.
#[derive(Debug, Default)]
struct BlockWriter {
    parts: PartWriter,
}

impl BlockWriter {
    fn push(&mut self, delta: &Delta) -> Vec<BlockEvent> {
        self.parts.push(delta).into_iter().flat_map(blocks_of).collect()
    }

    fn finish(&mut self) -> Vec<BlockEvent> {
        self.parts.finish().into_iter().flat_map(blocks_of).collect()
    }
}

fn blocks_of(event: PartEvent) -> Vec<BlockEvent> {
    match event {
        PartEvent::Open(index, kind, text) => {
            vec![BlockEvent::Start(index, block_start(kind)), BlockEvent::Delta(index, block_delta(kind, &text))]
        }
        PartEvent::Text(index, kind, text) => vec![BlockEvent::Delta(index, block_delta(kind, &text))],
        PartEvent::Close(index, _) => vec![BlockEvent::Stop(index)],
        PartEvent::Call(index, call) => {
            let id = match call.id.strip_prefix("call_") {
                Some(rest) => format!("toolu_{rest}"),
                None => call.id.clone(),
            };
            vec![
                BlockEvent::Start(
                    index,
                    json!({"type": "tool_use", "id": id, "name": call.function.name, "input": {}}),
                ),
                BlockEvent::Delta(index, json!({"type": "input_json_delta", "partial_json": call.function.arguments})),
                BlockEvent::Stop(index),
            ]
        }
    }
}

/// The content blocks that `events` build, as the whole reply carries them (a `tool_use`
/// block's `input` is its JSON parsed).
fn fold_blocks(events: &[BlockEvent]) -> Vec<Value> {
    let mut blocks: Vec<Value> = Vec::new();
    let mut json_text: Vec<String> = Vec::new();
    for event in events {
        match event {
            BlockEvent::Start(_, block) => {
                blocks.push(block.clone());
                json_text.push(String::new());
            }
            BlockEvent::Delta(index, delta) => {
                let block = &mut blocks[*index];
                let append = |field: &str, block: &mut Value| {
                    let piece = delta[field].as_str().unwrap_or_default();
                    let text = format!("{}{piece}", block[field].as_str().unwrap_or_default());
                    block[field] = json!(text);
                };
                match delta["type"].as_str() {
                    Some("text_delta") => append("text", block),
                    Some("thinking_delta") => append("thinking", block),
                    Some("input_json_delta") => {
                        json_text[*index].push_str(delta["partial_json"].as_str().unwrap_or(""))
                    }
                    _ => {}
                }
            }
            BlockEvent::Stop(index) => {
                if blocks[*index]["type"] == "tool_use" {
                    blocks[*index]["input"] = serde_json::from_str(&json_text[*index]).unwrap_or_else(|_| json!({}));
                }
            }
        }
    }
    blocks
}

/// Anthropic's `stop_reason` for how the reply ended.
fn stop_reason(summary: &JobSummary) -> &'static str {
    match summary.finish_reason {
        "length" => "max_tokens",
        "tool_calls" => "tool_use",
        _ if summary.stop_sequence.is_some() => "stop_sequence",
        _ => "end_turn",
    }
}

/// `usage`: `input_tokens` are the prompt tokens run for this request, those whose state was
/// reused are `cache_read_input_tokens` (Anthropic's split: the two add up to the prompt).
fn usage(summary: &JobSummary) -> Value {
    json!({
        "input_tokens": summary.prompt_tokens - summary.cached_tokens.min(summary.prompt_tokens),
        "output_tokens": summary.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": summary.cached_tokens,
    })
}

fn message_id(app: &AppState) -> String {
    app.response_id("msg").replacen("msg-", "msg_", 1)
}

async fn messages(State(app): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    match messages_inner(Arc::clone(&app), headers, body).await {
        Ok(r) => r,
        Err(e) => error_response(&app, e),
    }
}

async fn messages_inner(app: Arc<AppState>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let bytes = read_body(&app, &headers, body).await?;
    let req: MessagesRequest = parse_body(&bytes)?;
    let conv = conversation(&app, &req)?;
    let max_tokens = req.max_tokens.ok_or_else(|| required("max_tokens"))?;
    let stops = check_stop_list(req.stop_sequences.clone().unwrap_or_default(), "stop_sequences")?;
    let sampling = SamplingFields {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        ..SamplingFields::default()
    };
    let started = start_chat(
        &app,
        ChatInput {
            messages: &conv.messages,
            tools: conv.tools,
            choice: conv.choice,
            sampling,
            max_tokens: Some(max_tokens),
            stops,
            template_kwargs: Some(&conv.kwargs),
            response_format: output_format(&req)?,
            logprobs: None,
        },
    )
    .await
    .map_err(|e| {
        // A schema the grammar refuses is named where the request put it.
        let e = match format_field(&req) {
            Some((at, _)) => in_format_field(e, at),
            None => e,
        };
        tool_error(e)
    })?;
    let id = message_id(&app);
    let injected = started.tool_prompt_injected;
    let response = if req.stream.unwrap_or(false) {
        stream_message(app, id, started.prompt_tokens, started.events)
    } else {
        let (out, summary) = collect(started.events).await?;
        let mut writer = BlockWriter::default();
        let mut events = writer.push(&out);
        events.extend(writer.finish());
        Json(json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": app.model_name,
            "content": fold_blocks(&events),
            "stop_reason": stop_reason(&summary),
            "stop_sequence": summary.stop_sequence,
            "usage": usage(&summary),
        }))
        .into_response()
    };
    Ok(crate::routes::with_tool_prompt_header(response, injected))
}

fn event(name: &str, data: &Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

fn block_event(e: &BlockEvent) -> Event {
    match e {
        BlockEvent::Start(index, block) => event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        ),
        BlockEvent::Delta(index, delta) => {
            event("content_block_delta", &json!({"type": "content_block_delta", "index": index, "delta": delta}))
        }
        BlockEvent::Stop(index) => event("content_block_stop", &json!({"type": "content_block_stop", "index": index})),
    }
}

fn stream_message(
    app: Arc<AppState>,
    id: String,
    prompt_tokens: usize,
    mut rx: mpsc::UnboundedReceiver<JobEvent>,
) -> Response {
    let (tx, body_rx) = mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        // The prompt's split into run and reused tokens is known at the end; message_delta
        // carries it (its usage is cumulative, as Anthropic's is).
        let start = json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": app.model_name, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0}}});
        if tx.send(event("message_start", &start)).await.is_err() {
            return;
        }
        if tx.send(event("ping", &json!({"type": "ping"}))).await.is_err() {
            return;
        }
        let mut writer = BlockWriter::default();
        let ping = || event("ping", &json!({"type": "ping"}));
        while let Some(job_event) = next_event_keeping_alive(&mut rx, &tx, PING_EVERY, ping).await {
            match job_event {
                JobEvent::Delta(d) => {
                    for e in writer.push(&d) {
                        if tx.send(block_event(&e)).await.is_err() {
                            return; // client gone: dropping `rx` stops the generation
                        }
                    }
                }
                JobEvent::Done(summary) => {
                    for e in writer.finish() {
                        let _ = tx.send(block_event(&e)).await;
                    }
                    let delta = json!({"type": "message_delta",
                        "delta": {"stop_reason": stop_reason(&summary), "stop_sequence": summary.stop_sequence},
                        "usage": usage(&summary)});
                    let _ = tx.send(event("message_delta", &delta)).await;
                    let _ = tx.send(event("message_stop", &json!({"type": "message_stop"}))).await;
                    return;
                }
                JobEvent::Failed(err) => {
                    let _ = tx.send(event("error", &error_body(&app.public(err)))).await;
                    return;
                }
            }
        }
        let _ = tx.send(event("error", &error_body(&ApiError::internal("The generation scheduler stopped.")))).await;
    });
    sse_response(body_rx)
}

// ---- /v1/messages/count_tokens ----------------------------------------------------------------

async fn count_tokens(State(app): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let bytes = read_body(&app, &headers, body).await?;
        let req: MessagesRequest = parse_body(&bytes)?;
        let conv = conversation(&app, &req)?;
        let (_, ids) = render_chat(&app, &conv.messages, &conv.tools, true, Some(&conv.kwargs))?;
        Ok::<_, ApiError>(Json(json!({"input_tokens": ids.len()})).into_response())
    }
    .await;
    result.unwrap_or_else(|e| error_response(&app, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_have_consecutive_indices_and_blank_text_makes_no_block() {
        let mut w = BlockWriter::default();
        let mut events = w.push(&Delta::of("\nLet me", "", vec![]));
        events.extend(w.push(&Delta::of(" look.\n", "\n\n", vec![])));
        let call = ToolCall { id: "call_ab".into(), ..ToolCall::new("Bash", r#"{"command":"ls"}"#) };
        events.extend(w.push(&Delta::of("", "", vec![call])));
        events.extend(w.push(&Delta::of("", "\nDone", vec![])));
        events.extend(w.finish());
        let kinds: Vec<String> = events
            .iter()
            .map(|e| match e {
                BlockEvent::Start(i, b) => format!("start {i} {}", b["type"].as_str().unwrap()),
                BlockEvent::Delta(i, d) => format!("delta {i} {}", d["type"].as_str().unwrap()),
                BlockEvent::Stop(i) => format!("stop {i}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "start 0 thinking",
                "delta 0 thinking_delta",
                "delta 0 thinking_delta",
                "stop 0",
                "start 1 tool_use",
                "delta 1 input_json_delta",
                "stop 1",
                "start 2 text",
                "delta 2 text_delta",
                "stop 2",
            ]
        );
        let blocks = fold_blocks(&events);
        assert_eq!(blocks[0]["thinking"], "\nLet me look.\n");
        assert_eq!(
            blocks[1],
            json!({"type": "tool_use", "id": "toolu_ab", "name": "Bash", "input": {"command": "ls"}})
        );
        assert_eq!(blocks[2]["text"], "\nDone", "the blank start of a block is kept in it");
    }

    #[test]
    fn messages_become_the_chat_form() {
        let input: Vec<InputMessage> = serde_json::from_value(json!([
            {"role": "user", "content": "List files."},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "ls it", "signature": "x"},
                {"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "a.py"}]}, {"type": "text", "text": "Now?"}]},
        ]))
        .unwrap();
        let system = json!([{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}]);
        let m = to_messages(Some(&system), &input).unwrap();
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(m[0].text(), "Be brief.\n\nBe kind.");
        assert_eq!(m[2].reasoning_content.as_deref(), Some("ls it"));
        assert_eq!(m[2].calls()[0].function.arguments, r#"{"command":"ls"}"#);
        assert_eq!(m[3].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(m[3].name.as_deref(), Some("Bash"));
        assert_eq!(m[3].text(), "a.py");
    }

    #[test]
    fn system_messages_join_the_system_prompt_before_the_first_turn_and_are_user_turns_after() {
        let input: Vec<InputMessage> = serde_json::from_value(json!([
            {"role": "system", "content": [{"type": "text", "text": "Use tools."}]},
            {"role": "user", "content": "Say hello."},
            {"role": "system", "content": "Agent types: claude, Explore."},
        ]))
        .unwrap();
        let m = to_messages(Some(&json!("Be brief.")), &input).unwrap();
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "user"]);
        assert_eq!(m[0].text(), "Be brief.\n\nUse tools.");
        assert_eq!(m[2].text(), "Agent types: claude, Explore.");
        let alone = to_messages(None, &input[..1]).unwrap();
        assert_eq!((alone[0].role.as_str(), alone[0].text().as_ref()), ("system", "Use tools."));
    }

    #[test]
    fn output_formats_are_read_in_anthropics_names() {
        let req = |v: Value| -> MessagesRequest { serde_json::from_value(v).unwrap() };
        let schema = json!({"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]});
        let f = output_format(&req(json!({"output_config": {"effort": "high", "format": {"type": "json_schema",
            "schema": schema}}})));
        assert_eq!(f.unwrap(), ResponseFormat::JsonSchema { name: "output".into(), schema: schema.clone() });
        let f = output_format(&req(json!({"output_format": {"type": "json_schema", "schema": schema}})));
        assert!(matches!(f.unwrap(), ResponseFormat::JsonSchema { .. }));
        assert_eq!(output_format(&req(json!({"output_config": {"effort": "low"}}))).unwrap(), ResponseFormat::Text);
        let e = output_format(&req(json!({"output_config": {"format": {"type": "yaml"}}}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("output_config.format.type"));
        let e = output_format(&req(json!({"output_config": {"format": {"type": "json_schema"}}}))).unwrap_err();
        assert_eq!(e.message, "output_config.format.schema: Field required");
    }

    #[test]
    fn bad_blocks_name_their_place() {
        let read = |v: Value| to_messages(None, &serde_json::from_value::<Vec<InputMessage>>(v).unwrap()).unwrap_err();
        let read_ok = |v: Value| to_messages(None, &serde_json::from_value::<Vec<InputMessage>>(v).unwrap()).unwrap();
        let e = read(json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]));
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0]"));
        assert!(e.message.contains("\"image\""), "{}", e.message);
        let e = read(json!([{"role": "tool", "content": "x"}]));
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let picture = read_ok(json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
            "content": [{"type": "image", "source": {}}, {"type": "text", "text": "a.png"}]}]}]));
        assert_eq!(picture[0].text(), format!("{NOT_READ}\n\na.png"), "a tool's picture does not end the session");
        let e = read(json!([{"role": "user", "content": [{"type": "tool_result"}]}]));
        assert_eq!(e.message, "messages[0].content[0].tool_use_id: Field required");
        let e = read(json!([{"role": "user", "content": 5}]));
        assert_eq!(e.param.as_deref(), Some("messages[0].content"));
    }

    #[test]
    fn tools_and_choices_are_read_in_anthropics_names() {
        let bash = json!({"name": "Bash", "description": "Run.", "input_schema": {"type": "object",
            "properties": {"command": {"type": "string"}}, "required": ["command"]}});
        let (tools, choice) = to_tools(std::slice::from_ref(&bash), Some(&json!({"type": "any"}))).unwrap();
        assert_eq!(tools[0]["function"]["parameters"]["required"], json!(["command"]));
        assert_eq!(choice, crate::api::ToolChoice::Required(None));
        let (_, choice) =
            to_tools(std::slice::from_ref(&bash), Some(&json!({"type": "tool", "name": "Bash"}))).unwrap();
        assert_eq!(choice, crate::api::ToolChoice::Required(Some("Bash".into())));
        let e = to_tools(&[json!({"name": "two words", "input_schema": {"type": "object"}})], None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].name"));
        let e = to_tools(&[json!({"name": "f"})], None).unwrap_err();
        assert_eq!(e.message, "tools[0].input_schema: Field required");
        let e = to_tools(&[json!({"type": "bash_20250124", "name": "bash"})], None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].type"));
        let e = to_tools(&[bash], Some(&json!({"type": "sometimes"}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice.type"));
    }

    #[test]
    fn errors_have_anthropics_types() {
        assert_eq!(error_body(&ApiError::invalid("x"))["error"]["type"], "invalid_request_error");
        assert_eq!(error_body(&ApiError::model_not_found("a", "b"))["error"]["type"], "not_found_error");
        assert_eq!(error_body(&ApiError::overloaded(9, 4))["error"]["type"], "rate_limit_error");
        assert_eq!(error_body(&ApiError::too_large(1))["error"]["type"], "request_too_large");
        assert_eq!(error_body(&ApiError::internal("x"))["type"], "error");
        assert_eq!(error_body(&ApiError::internal("x"))["error"]["type"], "api_error");
    }
}
