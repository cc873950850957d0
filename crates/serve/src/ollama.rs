//! Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`,
//! `/api/version`, and `/`, the heartbeat), so Ollama clients (the `ollama` CLI, the Python and
//! JS libraries, Open WebUI, editors' Ollama back ends) can point at `frognano serve`.
//! Requests run on the same path as `/v1/chat/completions` ([`crate::routes::start_chat`]):
//! the model's chat template, the tool-call codec, the same limits (body size, context,
//! queue). Replies are Ollama's: a stream of JSON lines
//! (`application/x-ndjson`) by default, one JSON object with `"stream": false`, errors as
//! `{"error": "…"}` with Ollama's status codes. Field by field: docs/serve.md §7.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use frognano_protocol::{Message, MessageContent, ToolCall};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::api::{parse_body, validate_tools, SamplingFields, ToolChoice};
use crate::error::ApiError;
use crate::output::{Delta, OutputMode};
use crate::pool::{Job, JobEvent, JobSummary};
use crate::routes::{
    check_stop_list, check_text_fits, collect, compile_grammar, generate_request, next_event, read_body, start_chat,
    submit, AppState, ChatInput,
};
use crate::structured::ResponseFormat;

/// The Ollama endpoints.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/api/chat", post(chat))
        .route("/api/generate", post(generate))
        .route("/api/tags", get(tags))
        .route("/api/show", post(show))
        .route("/api/ps", get(ps))
        .route("/api/version", get(version))
        // `GET` and `HEAD /`: the `ollama` CLI's heartbeat before every command.
        .route("/", get(|| async { "Ollama is running" }))
}

/// The Ollama release whose API these endpoints follow (fields, errors, streaming), as
/// `/api/version` reports it: clients that gate features on the server's version (tools,
/// `think`) see one that has them.
pub const OLLAMA_API_VERSION: &str = "0.12.6";

/// `expires_at` of `/api/ps`: the served model is never unloaded (Ollama's `keep_alive: -1`).
const NEVER_EXPIRES: &str = "2318-01-01T00:00:00Z";

// ---- what /api/tags and /api/show say about the model ------------------------------------------

/// What Ollama's model listings report about the served model, read once at startup from
/// its file (or folder) and its GGUF header.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFacts {
    /// `gguf`, or `safetensors` for a checkpoint folder.
    pub format: String,
    /// The architecture (`llama`, `qwen35`, …): Ollama's `family`.
    pub family: String,
    /// Weights in the file (the elements of every tensor), when known.
    pub parameter_count: Option<u64>,
    /// The GGUF file type (`Q4_K_M`, …), else the storage type most weights have.
    pub quantization: String,
    /// Bytes on disk (the `.safetensors` files of a folder).
    pub size: u64,
    /// The file's modification time.
    pub modified: SystemTime,
    /// 64 hex digits identifying the served file: a hash of its resolved path, size and
    /// modification time (not of its contents, which would mean reading gigabytes at startup).
    pub digest: String,
    /// Bytes the model takes in memory with one full context: its weights and one sequence's
    /// cache at the served context length (`/api/ps`'s `size`); set by the server.
    pub memory: u64,
    /// Whether the weights are on an accelerator (`/api/ps`'s `size_vram` is then `memory`).
    pub on_device: bool,
}

impl ModelFacts {
    /// Reads the facts of the model at `path` (a `.gguf` file or a checkpoint folder);
    /// `architecture` as the loader named it. What cannot be read is left unknown.
    pub fn read(path: &Path, architecture: &str) -> Self {
        let meta = std::fs::metadata(path).ok();
        let modified = meta.as_ref().and_then(|m| m.modified().ok()).unwrap_or(UNIX_EPOCH);
        let (format, size, parameter_count, quantization) = if path.is_dir() {
            let size = std::fs::read_dir(path)
                .map(|dir| {
                    dir.flatten()
                        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
                        .filter_map(|e| e.metadata().ok())
                        .map(|m| m.len())
                        .sum()
                })
                .unwrap_or(0);
            ("safetensors".to_string(), size, None, String::new())
        } else {
            let size = meta.as_ref().map_or(0, |m| m.len());
            match frognano_model::gguf::GgufFile::open(path) {
                Ok(gguf) => {
                    let count = gguf.tensors().iter().map(|t| t.elements() as u64).sum();
                    let quant = gguf
                        .get("general.file_type")
                        .and_then(|v| v.as_u64())
                        .and_then(file_type_name)
                        .map(str::to_string)
                        .unwrap_or_else(|| majority_dtype(&gguf));
                    ("gguf".to_string(), size, Some(count), quant)
                }
                Err(_) => ("gguf".to_string(), size, None, String::new()),
            }
        };
        let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let stamp = modified.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let digest = (0u64..4)
            .map(|seed| {
                use std::hash::{Hash, Hasher};
                // SipHash with fixed keys: the same file gives the same digest in every run.
                let mut h = std::collections::hash_map::DefaultHasher::new();
                (seed, &resolved, size, stamp).hash(&mut h);
                format!("{:016x}", h.finish())
            })
            .collect();
        ModelFacts {
            format,
            family: architecture.to_string(),
            parameter_count,
            quantization,
            size,
            modified,
            digest,
            memory: 0,
            on_device: false,
        }
    }

    /// Ollama's `details` object.
    fn details(&self) -> Value {
        json!({
            "parent_model": "",
            "format": self.format,
            "family": self.family,
            "families": [self.family],
            "parameter_size": self.parameter_count.map(parameter_size).unwrap_or_default(),
            "quantization_level": self.quantization,
        })
    }
}

/// llama.cpp's `general.file_type` numbers (`LLAMA_FTYPE_*`) as Ollama names them.
fn file_type_name(id: u64) -> Option<&'static str> {
    Some(match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        _ => return None,
    })
}

/// The storage type that holds the most weights of `gguf`.
fn majority_dtype(gguf: &frognano_model::gguf::GgufFile) -> String {
    let mut by_type: Vec<(&'static str, u64)> = Vec::new();
    for t in gguf.tensors() {
        let name = t.dtype.name();
        match by_type.iter_mut().find(|(n, _)| *n == name) {
            Some((_, count)) => *count += t.elements() as u64,
            None => by_type.push((name, t.elements() as u64)),
        }
    }
    by_type.into_iter().max_by_key(|&(_, n)| n).map(|(n, _)| n.to_string()).unwrap_or_default()
}

/// `134515008` → `134.52M`, `4022468096` → `4.02B` (Ollama's `parameter_size`).
fn parameter_size(n: u64) -> String {
    let (value, unit) = match n {
        n if n >= 1_000_000_000 => (n as f64 / 1e9, "B"),
        n if n >= 1_000_000 => (n as f64 / 1e6, "M"),
        n if n >= 1_000 => (n as f64 / 1e3, "K"),
        n => return n.to_string(),
    };
    let text = format!("{value:.2}");
    format!("{}{unit}", text.trim_end_matches('0').trim_end_matches('.'))
}

/// `t` as RFC 3339 in UTC with nanoseconds (`2024-07-22T20:33:28.123648000Z`), the form of
/// Ollama's `created_at` and `modified_at`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z", s / 3600, s % 3600 / 60, s % 60, d.subsec_nanos())
}

/// The proleptic Gregorian date of the `days`-th day after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`: eras of 400 years, years starting in March so the leap day is last).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

// ---- errors -------------------------------------------------------------------------------------

/// An error as Ollama sends it: the status, `{"error": "…"}` (and `Retry-After` on a 429).
fn error_response(app: &AppState, e: ApiError) -> Response {
    let e = app.public(e);
    let mut response = (e.status, Json(json!({"error": e.message}))).into_response();
    if let Some(secs) = e.retry_after {
        response.headers_mut().insert(header::RETRY_AFTER, secs.into());
    }
    response
}

/// Names an error about a sampling field by its Ollama name (`options.repeat_penalty`
/// rather than `repetition_penalty`), in `param` and at the start of the message.
fn options_error(e: ApiError) -> ApiError {
    let Some(param) = e.param.clone() else { return e };
    let ollama = match param.as_str() {
        "temperature" | "top_p" | "top_k" | "min_p" | "presence_penalty" | "frequency_penalty" | "seed" => {
            format!("options.{param}")
        }
        "repetition_penalty" => "options.repeat_penalty".into(),
        "max_tokens" => "options.num_predict".into(),
        "response_format.json_schema.schema" | "response_format" => "format".into(),
        _ => return e,
    };
    let message = match e.message.strip_prefix(param.as_str()) {
        Some(rest) => format!("{ollama}{rest}"),
        None => e.message.clone(),
    };
    ApiError { param: Some(ollama), message, ..e }
}

// ---- request bodies -----------------------------------------------------------------------------

/// Ollama's `options` that change the reply; the others (`num_keep`, `typical_p`,
/// `repeat_last_n`, `mirostat*`, `num_batch`, `num_gpu`, `num_thread`, …) are accepted and
/// have no effect here.
#[derive(Debug, Clone, Default, Deserialize)]
struct Options {
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<i64>,
    #[serde(default)]
    min_p: Option<f32>,
    #[serde(default)]
    repeat_penalty: Option<f32>,
    #[serde(default)]
    presence_penalty: Option<f32>,
    #[serde(default)]
    frequency_penalty: Option<f32>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    num_predict: Option<i64>,
    #[serde(default)]
    stop: Option<Vec<String>>,
    /// Read (it must be a count) but the server's `--ctx-size` is the context: a model's
    /// context is allocated once, not per request.
    #[serde(default)]
    #[allow(dead_code)]
    num_ctx: Option<u64>,
}

impl Options {
    fn sampling(&self) -> SamplingFields {
        SamplingFields {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            // Ollama's default seed, -1 (any negative one), draws a fresh one.
            seed: self.seed.filter(|&s| s >= 0),
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: None,
        }
    }

    /// `num_predict`: a positive count, or -1 (no limit) / -2 (fill the context), both of
    /// which mean "what the context leaves".
    fn max_tokens(&self) -> Result<Option<u64>, ApiError> {
        match self.num_predict {
            None | Some(-1) | Some(-2) => Ok(None),
            Some(n) if n > 0 => Ok(Some(n as u64)),
            Some(n) => Err(ApiError::invalid_param(
                "options.num_predict",
                format!("options.num_predict must be at least 1, or -1 for no limit; found {n}"),
            )),
        }
    }

    fn stops(&self) -> Result<Vec<String>, ApiError> {
        check_stop_list(self.stop.clone().unwrap_or_default(), "options.stop")
    }
}

/// A message of `/api/chat`.
#[derive(Debug, Clone, Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    thinking: Option<String>,
    #[serde(default)]
    images: Option<Vec<Value>>,
    #[serde(default)]
    tool_calls: Option<Vec<ChatToolCall>>,
    #[serde(default)]
    tool_name: Option<String>,
    #[serde(default)]
    tool_call_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct ChatToolCall {
    #[serde(default)]
    id: Option<String>,
    function: ChatFunction,
}

#[derive(Debug, Clone, Deserialize)]
struct ChatFunction {
    name: String,
    #[serde(default)]
    arguments: Value,
}

/// `POST /api/chat`.
#[derive(Debug, Clone, Deserialize)]
struct ChatRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    format: Option<Value>,
    #[serde(default)]
    options: Option<Options>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    think: Option<Value>,
    /// Whether a conversation longer than the context loses its oldest messages (Ollama's
    /// default) or is refused (`false`).
    #[serde(default)]
    truncate: Option<bool>,
}

/// `POST /api/generate`.
#[derive(Debug, Clone, Deserialize)]
struct GenerateRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    suffix: Option<String>,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    template: Option<String>,
    #[serde(default)]
    context: Option<Vec<i64>>,
    #[serde(default)]
    images: Option<Vec<Value>>,
    #[serde(default)]
    raw: Option<bool>,
    #[serde(default)]
    format: Option<Value>,
    #[serde(default)]
    options: Option<Options>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    think: Option<Value>,
}

/// `POST /api/show` (`name` is the older spelling of `model`).
#[derive(Debug, Clone, Deserialize)]
struct ShowRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

/// The served model's name in Ollama's `name:tag` form (`:latest` when it has no tag).
fn tagged_name(app: &AppState) -> String {
    if app.model_name.contains(':') {
        app.model_name.clone()
    } else {
        format!("{}:latest", app.model_name)
    }
}

/// `model` must name the served model, with or without its `:latest` tag (Ollama's 400
/// "model is required" and 404 "model '…' not found" otherwise).
fn check_model(app: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        None | Some("") => Err(ApiError::invalid_param("model", "model is required")),
        Some(m) if m == app.model_name || m == tagged_name(app) => Ok(()),
        Some(m) => Err(ApiError {
            message: format!("model '{m}' not found; this server serves '{}'", tagged_name(app)),
            ..ApiError::model_not_found(m, &app.model_name)
        }),
    }
}

/// `think`: true / false, or a level (`"low"`, `"medium"`, `"high"`, `"max"`: thinking on;
/// the chat templates have no levels). Unset leaves the template's default.
fn think_kwargs(think: Option<&Value>) -> Result<Option<Map<String, Value>>, ApiError> {
    let on = match think {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) if ["low", "medium", "high", "max"].contains(&s.as_str()) => true,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "think",
                format!("think must be true, false, \"low\", \"medium\", \"high\" or \"max\"; found {other}"),
            ))
        }
    };
    let mut kwargs = Map::new();
    kwargs.insert("enable_thinking".into(), Value::Bool(on));
    Ok(Some(kwargs))
}

/// `format`: `"json"` (any JSON object) or a JSON schema; unset or `""` is free text.
fn response_format(format: Option<&Value>) -> Result<ResponseFormat, ApiError> {
    match format {
        None | Some(Value::Null) => Ok(ResponseFormat::Text),
        Some(Value::String(s)) if s.is_empty() => Ok(ResponseFormat::Text),
        Some(Value::String(s)) if s == "json" => Ok(ResponseFormat::JsonObject),
        Some(schema @ Value::Object(_)) => {
            Ok(ResponseFormat::JsonSchema { name: "format".into(), schema: schema.clone() })
        }
        Some(other) => Err(ApiError::invalid_param(
            "format",
            format!("format must be \"json\" or a JSON schema object, found {other}"),
        )),
    }
}

/// Ollama's messages in OpenAI form: `thinking` becomes `reasoning_content`, a tool call's
/// object `arguments` its JSON text, `tool_name` the tool message's `name`.
fn to_messages(messages: &[ChatMessage]) -> Result<Vec<Message>, ApiError> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if m.images.as_ref().is_some_and(|images| !images.is_empty()) {
            return Err(ApiError::invalid_param(
                format!("messages[{i}].images"),
                format!("messages[{i}].images: this model reads text only"),
            ));
        }
        let mut calls = Vec::new();
        for (j, call) in m.tool_calls.iter().flatten().enumerate() {
            let at = format!("messages[{i}].tool_calls[{j}].function.arguments");
            let arguments = match &call.function.arguments {
                Value::Null => "{}".to_string(),
                Value::Object(o) => Value::Object(o.clone()).to_string(),
                Value::String(s) if serde_json::from_str::<Value>(s).is_ok_and(|v| v.is_object()) => s.clone(),
                other => {
                    return Err(ApiError::invalid_param(
                        at.clone(),
                        format!("{at} must be an object of the tool's arguments, found {other}"),
                    ))
                }
            };
            let mut tool_call = ToolCall::new(call.function.name.clone(), arguments);
            tool_call.id = call.id.clone().unwrap_or_default();
            calls.push(tool_call);
        }
        out.push(Message {
            role: m.role.clone(),
            content: Some(MessageContent::Text(m.content.clone().unwrap_or_default())),
            reasoning_content: m.thinking.clone().filter(|t| !t.is_empty()),
            tool_calls: (!calls.is_empty()).then_some(calls),
            tool_call_id: m.tool_call_id.clone(),
            name: m.tool_name.clone(),
        });
    }
    Ok(out)
}

/// A reply's tool calls as Ollama writes them: arguments as an object, with the call's
/// position in `function.index`.
fn tool_calls_json(calls: &[ToolCall], first_index: usize) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let arguments: Value = serde_json::from_str(&c.function.arguments).unwrap_or_else(|_| json!({}));
                json!({"id": c.id, "function": {"index": first_index + k, "name": c.function.name,
                       "arguments": arguments}})
            })
            .collect(),
    )
}

// ---- replies ------------------------------------------------------------------------------------

/// Which endpoint a reply is for: `/api/chat` puts the text in `message`, `/api/generate`
/// in `response`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Endpoint {
    Chat,
    Generate,
}

/// What a reply's lines share.
struct ReplyShape {
    endpoint: Endpoint,
    model: String,
    /// When the request arrived (`total_duration` counts from here).
    arrived: Instant,
    /// From arrival to the job's queuing (`load_duration`: the model itself is loaded once,
    /// at startup, so this is the request's own preparation: body, template, tokenizer).
    prepared: Duration,
    prompt_tokens: usize,
}

impl ReplyShape {
    /// One line or object: the text of `delta`, `done: false`.
    fn part(&self, delta: &Delta, call_index: usize) -> Value {
        let mut line = Map::new();
        line.insert("model".into(), json!(self.model));
        line.insert("created_at".into(), json!(rfc3339(SystemTime::now())));
        match self.endpoint {
            Endpoint::Chat => {
                let mut message = Map::new();
                message.insert("role".into(), json!("assistant"));
                message.insert("content".into(), json!(delta.content));
                if !delta.reasoning.is_empty() {
                    message.insert("thinking".into(), json!(delta.reasoning));
                }
                if !delta.tool_calls.is_empty() {
                    message.insert("tool_calls".into(), tool_calls_json(&delta.tool_calls, call_index));
                }
                line.insert("message".into(), Value::Object(message));
            }
            Endpoint::Generate => {
                line.insert("response".into(), json!(delta.content));
                if !delta.reasoning.is_empty() {
                    line.insert("thinking".into(), json!(delta.reasoning));
                }
            }
        }
        line.insert("done".into(), json!(false));
        Value::Object(line)
    }

    /// The last line (or the whole reply): `delta` (empty when streamed), `done: true`, why
    /// it ended and the counts and durations (nanoseconds).
    fn done(&self, delta: &Delta, summary: &JobSummary) -> Value {
        let mut line = self.part(delta, 0);
        let nanos = |d: Duration| d.as_nanos() as u64;
        let done_reason = if summary.finish_reason == "length" { "length" } else { "stop" };
        let fields = [
            ("done", json!(true)),
            ("done_reason", json!(done_reason)),
            ("total_duration", json!(nanos(self.arrived.elapsed()))),
            ("load_duration", json!(nanos(self.prepared))),
            ("prompt_eval_count", json!(self.prompt_tokens)),
            ("prompt_eval_duration", json!(nanos(summary.prompt_eval))),
            ("eval_count", json!(summary.completion_tokens)),
            ("eval_duration", json!(nanos(summary.eval))),
        ];
        for (key, value) in fields {
            line[key] = value;
        }
        line
    }

    /// The reply to a request without messages (or prompt): Ollama loads the model and says
    /// so (`done_reason: "load"`); here it is always loaded.
    fn loaded(&self) -> Value {
        let mut line = self.part(&Delta::default(), 0);
        line["done"] = json!(true);
        line["done_reason"] = json!("load");
        line
    }
}

/// The reply: streamed as JSON lines, or collected into one object.
async fn reply(
    app: Arc<AppState>,
    shape: ReplyShape,
    rx: mpsc::UnboundedReceiver<JobEvent>,
    stream: bool,
) -> Result<Response, ApiError> {
    if stream {
        return Ok(stream_reply(app, shape, rx));
    }
    let (out, summary) = collect(rx).await?;
    Ok(Json(shape.done(&out, &summary)).into_response())
}

fn stream_reply(app: Arc<AppState>, shape: ReplyShape, mut rx: mpsc::UnboundedReceiver<JobEvent>) -> Response {
    let (tx, body_rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let line = |v: &Value| {
            let mut bytes = serde_json::to_vec(v).unwrap_or_default();
            bytes.push(b'\n');
            Bytes::from(bytes)
        };
        let mut call_index = 0;
        while let Some(event) = next_event(&mut rx, &tx).await {
            match event {
                JobEvent::Delta(d) => {
                    let part = shape.part(&d, call_index);
                    call_index += d.tool_calls.len();
                    if tx.send(line(&part)).await.is_err() {
                        return; // client gone: dropping `rx` stops the generation
                    }
                }
                JobEvent::Done(summary) => {
                    let _ = tx.send(line(&shape.done(&Delta::default(), &summary))).await;
                    return;
                }
                JobEvent::Failed(err) => {
                    // As Ollama reports an error once the reply has started: a last line.
                    let _ = tx.send(line(&json!({"error": app.public(err).message}))).await;
                    return;
                }
            }
        }
        let _ = tx.send(line(&json!({"error": "The generation scheduler stopped."}))).await;
    });
    ndjson_response(body_rx)
}

fn ndjson_response(rx: mpsc::Receiver<Bytes>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|line| (Ok::<_, Infallible>(line), rx))
    });
    let mut response = Body::from_stream(stream).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    response
}

// ---- /api/chat ----------------------------------------------------------------------------------

async fn chat(State(app): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let arrived = Instant::now();
    match chat_inner(Arc::clone(&app), headers, body, arrived).await {
        Ok(r) => r,
        Err(e) => error_response(&app, e),
    }
}

async fn chat_inner(
    app: Arc<AppState>,
    headers: HeaderMap,
    body: Body,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let bytes = read_body(&app, &headers, body).await?;
    let req: ChatRequest = parse_body(&bytes)?;
    check_model(&app, req.model.as_deref())?;
    let mut shape = ReplyShape {
        endpoint: Endpoint::Chat,
        model: tagged_name(&app),
        arrived,
        prepared: Duration::ZERO,
        prompt_tokens: 0,
    };
    let messages = to_messages(req.messages.as_deref().unwrap_or_default())?;
    let options = req.options.clone().unwrap_or_default();
    let tools = req.tools.clone().unwrap_or_default();
    let choice = validate_tools(&tools, None)?;
    let kwargs = think_kwargs(req.think.as_ref())?;
    let format = response_format(req.format.as_ref())?;
    let max_tokens = options.max_tokens()?;
    let stops = options.stops()?;
    if messages.is_empty() {
        return Ok(Json(shape.loaded()).into_response());
    }
    let base = ChatInput {
        messages: &[],
        tools,
        choice,
        sampling: options.sampling(),
        max_tokens,
        stops,
        template_kwargs: kwargs.as_ref(),
        response_format: format,
        logprobs: None,
    };
    let mut dropped = 0;
    let mut started = start_chat(&app, ChatInput { messages: &messages, ..base.clone() }).await;
    if matches!(&started, Err(e) if e.overflow.is_some()) && req.truncate.unwrap_or(true) {
        // Too long for the context: Ollama's cut, then the request again.
        let (state, all, tools, kwargs) = (Arc::clone(&app), messages.clone(), base.tools.clone(), kwargs.clone());
        let kept;
        (dropped, kept) = tokio::task::spawn_blocking(move || {
            let start = fitting_start(&state, &all, &tools, kwargs.as_ref());
            (start, kept_messages(&all, start))
        })
        .await
        .map_err(|e| ApiError::internal(format!("fitting the conversation to the context failed: {e}")))?;
        if dropped > 0 {
            tracing::warn!(
                dropped,
                kept = kept.len(),
                "/api/chat: the oldest {dropped} messages were dropped to fit the context of {} tokens",
                app.ctx
            );
            started = start_chat(&app, ChatInput { messages: &kept, ..base }).await;
        }
    }
    let started = started.map_err(options_error)?;
    shape.prepared = arrived.elapsed();
    shape.prompt_tokens = started.prompt_tokens;
    let mut response = reply(app, shape, started.events, req.stream.unwrap_or(true)).await?;
    if dropped > 0 {
        response.headers_mut().insert("x-frognano-messages-dropped", dropped.into());
    }
    Ok(crate::routes::with_tool_prompt_header(response, started.tool_prompt_injected))
}

/// Where a conversation longer than the context starts once Ollama's cut is made: the oldest
/// messages dropped whole, the fewest that make the prompt fit (at least one token of room).
/// The cut falls before a user message, so what is kept begins a turn, or at the last message,
/// which is always kept; the system messages before the cut are kept too ([`kept_messages`]).
/// 0 when even the last message with the system messages does not fit (the request is then
/// refused, naming the sizes, as with `"truncate": false`). Each try renders and tokenizes
/// the kept messages; the tries are a binary search over the cut points, as Ollama's.
fn fitting_start(app: &AppState, messages: &[Message], tools: &[Value], kwargs: Option<&Map<String, Value>>) -> usize {
    let fits = |start: usize| {
        crate::routes::render_chat(app, &kept_messages(messages, start), tools, true, kwargs)
            .is_ok_and(|(_, ids)| ids.len() < app.ctx)
    };
    let last = messages.len() - 1;
    let cuts: Vec<usize> = (1..last).filter(|&i| messages[i].role == "user").chain(std::iter::once(last)).collect();
    // The first cut point that fits, assuming (as Ollama does) that dropping more never makes
    // the prompt longer.
    cuts.get(cuts.partition_point(|&cut| !fits(cut))).copied().unwrap_or(0)
}

/// `messages` from `start` on, after the system messages of the dropped part.
fn kept_messages(messages: &[Message], start: usize) -> Vec<Message> {
    let system = messages[..start].iter().filter(|m| m.role == "system");
    system.chain(&messages[start..]).cloned().collect()
}

// ---- /api/generate ------------------------------------------------------------------------------

async fn generate(State(app): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let arrived = Instant::now();
    match generate_inner(Arc::clone(&app), headers, body, arrived).await {
        Ok(r) => r,
        Err(e) => error_response(&app, e),
    }
}

async fn generate_inner(
    app: Arc<AppState>,
    headers: HeaderMap,
    body: Body,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let bytes = read_body(&app, &headers, body).await?;
    let req: GenerateRequest = parse_body(&bytes)?;
    check_model(&app, req.model.as_deref())?;
    let unsupported = [
        ("suffix", req.suffix.as_ref().is_some_and(|s| !s.is_empty()), "fill-in-the-middle is not supported"),
        ("template", req.template.as_ref().is_some_and(|s| !s.is_empty()), "the model's own chat template is used"),
        ("context", req.context.as_ref().is_some_and(|c| !c.is_empty()), "send the conversation to /api/chat instead"),
        ("images", req.images.as_ref().is_some_and(|i| !i.is_empty()), "this model reads text only"),
    ];
    if let Some((field, _, why)) = unsupported.iter().find(|(_, given, _)| *given) {
        return Err(ApiError::invalid_param(*field, format!("{field} is not supported by this server: {why}")));
    }
    let options = req.options.clone().unwrap_or_default();
    let kwargs = think_kwargs(req.think.as_ref())?;
    let format = response_format(req.format.as_ref())?;
    let max_tokens = options.max_tokens()?;
    let stops = options.stops()?;
    let mut shape = ReplyShape {
        endpoint: Endpoint::Generate,
        model: tagged_name(&app),
        arrived,
        prepared: Duration::ZERO,
        prompt_tokens: 0,
    };
    let prompt = req.prompt.clone().unwrap_or_default();
    if prompt.is_empty() {
        return Ok(Json(shape.loaded()).into_response());
    }
    let stream = req.stream.unwrap_or(true);
    if req.raw.unwrap_or(false) {
        // The prompt as it is, without the chat template (as `/v1/completions` reads it).
        check_text_fits(&app, prompt.len(), "prompt")?;
        let ids = app
            .tokenizer
            .encode(&prompt)
            .map_err(|e| ApiError::invalid_param("prompt", format!("The prompt cannot be tokenized: {e}")))?;
        let gen = generate_request(&app, &options.sampling(), max_tokens, None, ids.len(), "prompt", 0)
            .map_err(options_error)?;
        let constraint = match crate::structured::reply_grammar(&format, &ToolChoice::None, "", &[], false, false)? {
            Some((grammar, param)) => Some(compile_grammar(&app, grammar, param, &[]).await.map_err(options_error)?),
            None => None,
        };
        shape.prompt_tokens = ids.len();
        let (tx, rx) = mpsc::unbounded_channel();
        submit(
            &app,
            Job {
                prompt: ids,
                request: gen,
                mode: OutputMode::Text,
                stop_strings: stops,
                logprobs: None,
                events: tx,
                constraint,
            },
        )?;
        shape.prepared = arrived.elapsed();
        return reply(app, shape, rx, stream).await;
    }
    let mut messages = Vec::new();
    if let Some(system) = req.system.as_ref().filter(|s| !s.is_empty()) {
        messages.push(Message::system(system.clone()));
    }
    messages.push(Message::user(prompt));
    let started = start_chat(
        &app,
        ChatInput {
            messages: &messages,
            tools: Vec::new(),
            choice: ToolChoice::None,
            sampling: options.sampling(),
            max_tokens,
            stops,
            template_kwargs: kwargs.as_ref(),
            response_format: format,
            logprobs: None,
        },
    )
    .await
    .map_err(|e| options_error(rename_param(e, "messages", "prompt")))?;
    shape.prepared = arrived.elapsed();
    shape.prompt_tokens = started.prompt_tokens;
    reply(app, shape, started.events, stream).await
}

/// `e` about `from` (a field of the request as the chat path names it) named `to`.
fn rename_param(e: ApiError, from: &str, to: &str) -> ApiError {
    if e.param.as_deref() != Some(from) {
        return e;
    }
    ApiError { param: Some(to.to_string()), message: e.message.replace(from, to), ..e }
}

// ---- /api/tags, /api/show -----------------------------------------------------------------------

async fn tags(State(app): State<Arc<AppState>>) -> Response {
    let f = &app.facts;
    Json(json!({"models": [{
        "name": tagged_name(&app),
        "model": tagged_name(&app),
        "modified_at": rfc3339(f.modified),
        "size": f.size,
        "digest": f.digest,
        "details": f.details(),
    }]}))
    .into_response()
}

/// `/api/ps`: the one model, loaded for the life of the server.
async fn ps(State(app): State<Arc<AppState>>) -> Response {
    let f = &app.facts;
    Json(json!({"models": [{
        "name": tagged_name(&app),
        "model": tagged_name(&app),
        "size": f.memory,
        "digest": f.digest,
        "details": f.details(),
        "expires_at": NEVER_EXPIRES,
        "size_vram": if f.on_device { f.memory } else { 0 },
        "context_length": app.ctx,
    }]}))
    .into_response()
}

/// `/api/version`: [`OLLAMA_API_VERSION`].
async fn version() -> Response {
    Json(json!({"version": OLLAMA_API_VERSION})).into_response()
}

async fn show(State(app): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let bytes = read_body(&app, &headers, body).await?;
        let req: ShowRequest = parse_body(&bytes)?;
        check_model(&app, req.model.as_deref().or(req.name.as_deref()))?;
        Ok::<_, ApiError>(Json(show_body(&app)).into_response())
    }
    .await;
    result.unwrap_or_else(|e| error_response(&app, e))
}

fn show_body(app: &AppState) -> Value {
    let f = &app.facts;
    let d = &app.defaults;
    let mut parameters = Vec::new();
    let mut add = |name: &str, value: Option<String>| {
        if let Some(v) = value {
            parameters.push(format!("{name:<30} {v}"));
        }
    };
    add("num_ctx", Some(app.ctx.to_string()));
    add("temperature", d.temperature.map(|v| v.to_string()));
    add("top_p", d.top_p.map(|v| v.to_string()));
    add("top_k", d.top_k.map(|v| v.to_string()));
    add("repeat_penalty", d.repetition_penalty.map(|v| v.to_string()));
    let parameters = parameters.join("\n");
    let template = app.template.as_ref().map(|t| t.tool_source().to_string()).unwrap_or_default();
    let mut capabilities = vec!["completion"];
    if app.template.as_ref().is_some_and(|t| t.supports_tools()) {
        capabilities.push("tools");
    }
    if template.contains("<think>") || template.contains("enable_thinking") {
        capabilities.push("thinking");
    }
    let mut info = Map::new();
    info.insert("general.architecture".into(), json!(f.family));
    if let Some(n) = f.parameter_count {
        info.insert("general.parameter_count".into(), json!(n));
    }
    info.insert(format!("{}.context_length", f.family), json!(app.ctx));
    info.insert(format!("{}.vocab_size", f.family), json!(app.vocab_size));
    let modelfile = format!(
        "# Modelfile of the model served by frognano serve\nFROM {}\n{}",
        app.model_name,
        parameters.lines().map(|l| format!("PARAMETER {l}\n")).collect::<String>()
    );
    json!({
        "modelfile": modelfile,
        "parameters": parameters,
        "template": template,
        "details": f.details(),
        "model_info": info,
        "capabilities": capabilities,
        "modified_at": rfc3339(f.modified),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_rfc3339_utc_with_nanoseconds() {
        let at = |secs: u64, nanos: u32| rfc3339(UNIX_EPOCH + Duration::new(secs, nanos));
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.000000005Z");
        assert_eq!(at(1_700_000_000, 123_456_789), "2023-11-14T22:13:20.123456789Z");
        assert_eq!(at(4_107_542_399, 0), "2100-02-28T23:59:59.000000000Z");
    }

    #[test]
    fn parameter_sizes_read_as_ollama_writes_them() {
        assert_eq!(parameter_size(134_515_008), "134.52M");
        assert_eq!(parameter_size(4_022_468_096), "4.02B");
        assert_eq!(parameter_size(1_500_000_000), "1.5B");
        assert_eq!(parameter_size(999), "999");
    }

    #[test]
    fn options_errors_use_ollamas_names() {
        let e = options_error(ApiError::invalid_param("repetition_penalty", "repetition_penalty must be > 0, found 0"));
        assert_eq!(e.param.as_deref(), Some("options.repeat_penalty"));
        assert_eq!(e.message, "options.repeat_penalty must be > 0, found 0");
        let e = options_error(ApiError::invalid_param("messages", "x"));
        assert_eq!(e.param.as_deref(), Some("messages"));
        let o = Options { num_predict: Some(0), ..Options::default() };
        assert!(o.max_tokens().unwrap_err().message.contains("options.num_predict"));
        assert_eq!(Options { num_predict: Some(-1), ..Options::default() }.max_tokens().unwrap(), None);
        assert_eq!(Options { seed: Some(-1), ..Options::default() }.sampling().seed, None);
    }

    #[test]
    fn think_and_format_are_read() {
        assert_eq!(think_kwargs(None).unwrap(), None);
        assert_eq!(think_kwargs(Some(&json!("high"))).unwrap().unwrap()["enable_thinking"], json!(true));
        assert_eq!(think_kwargs(Some(&json!(false))).unwrap().unwrap()["enable_thinking"], json!(false));
        assert_eq!(think_kwargs(Some(&json!("hard"))).unwrap_err().param.as_deref(), Some("think"));
        assert_eq!(response_format(Some(&json!("json"))).unwrap(), ResponseFormat::JsonObject);
        assert!(matches!(
            response_format(Some(&json!({"type": "object"}))).unwrap(),
            ResponseFormat::JsonSchema { .. }
        ));
        assert_eq!(response_format(Some(&json!(3))).unwrap_err().param.as_deref(), Some("format"));
    }

    #[test]
    fn tool_call_arguments_must_be_objects() {
        let m: ChatMessage = serde_json::from_value(json!({"role": "assistant", "content": "",
            "tool_calls": [{"function": {"name": "Bash", "arguments": {"command": "ls"}}}]}))
        .unwrap();
        let out = to_messages(&[m]).unwrap();
        assert_eq!(out[0].calls()[0].function.arguments, r#"{"command":"ls"}"#);
        let bad: ChatMessage = serde_json::from_value(json!({"role": "assistant",
            "tool_calls": [{"function": {"name": "Bash", "arguments": [1]}}]}))
        .unwrap();
        let e = to_messages(&[bad]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].tool_calls[0].function.arguments"));
    }
}
