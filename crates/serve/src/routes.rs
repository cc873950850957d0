//! The HTTP endpoints: request checks, prompt building, and the JSON / server-sent-event
//! shapes of OpenAI's responses.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use frognano_engine::{GenerateRequest, SamplingParams};
use frognano_model::chat::ChatTemplate;
use frognano_model::config::GenerationConfig;
use frognano_model::tokenizer::Tokenizer;
use frognano_protocol::codec::ToolParser;
use frognano_protocol::Message;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::api::{
    parse_body, parse_logit_bias, parse_prompts, validate_tools, ChatCompletionRequest, CompletionRequest,
    DetokenizeRequest, PromptInput, SamplingFields, TokenizeRequest, ToolChoice,
};
use crate::error::{ApiError, PathScrubber};
use crate::output::{Delta, OutputMode, TokenLogprob};
use crate::pool::{EnginePool, Job, JobEvent, JobSummary};

/// Most stop strings per request.
const MAX_STOP_STRINGS: usize = 16;
/// Most alternatives per token (OpenAI's limit).
const MAX_TOP_LOGPROBS: u32 = 20;
/// `max_tokens` of `/v1/completions` when the request has none (OpenAI's default).
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

/// Everything the handlers share.
pub struct AppState {
    /// The name clients use in `model`.
    pub model_name: String,
    /// Context length in tokens (prompt + completion).
    pub ctx: usize,
    /// The KV cache element type in use (`--kv-cache`), as `/health` reports it.
    pub kv_cache: String,
    /// Rows of the model's output head (valid token ids are below this).
    pub vocab_size: usize,
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template, if the model has one.
    pub template: Option<ChatTemplate>,
    /// The tool-call format the model's replies are read in.
    pub tool_parser: ToolParser,
    /// Ids that end generation.
    pub eos_ids: Vec<u32>,
    /// Sampling defaults from the model's generation config.
    pub defaults: GenerationConfig,
    /// The scheduler.
    pub pool: EnginePool,
    /// Unix time the server started (the model's `created`).
    pub created: u64,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Longest a request body may take to arrive (then a 408).
    pub body_timeout: std::time::Duration,
    /// Most prompts in one request.
    pub max_prompts_per_request: usize,
    /// The most bytes of text one token stands for ([`longest_token_bytes`]): a text of `n`
    /// bytes has at least `n / max_token_bytes` tokens, so one that cannot fit the context is
    /// refused before it is tokenized.
    pub max_token_bytes: usize,
    /// Source of response ids.
    pub next_id: AtomicU64,
    /// Takes the server's folders out of error messages.
    pub scrubber: PathScrubber,
    /// Grammar compilation for structured outputs and forced tool calls (built on first use).
    pub constraints: frognano_engine::LazyConstraints,
    /// `tool_choice: "auto"` replies are sampled under the tools' grammar (free text or
    /// well-formed calls), `ServeConfig::constrain_tools`.
    pub constrain_tools: bool,
    /// What Ollama's `/api/tags` and `/api/show` report about the model file.
    pub facts: crate::ollama::ModelFacts,
}

impl AppState {
    pub(crate) fn response_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:08x}", self.created)
    }

    /// `error` as the client may see it: without the server's paths.
    pub(crate) fn public(&self, error: ApiError) -> ApiError {
        self.scrubber.error(error)
    }

    pub(crate) fn check_model(&self, requested: Option<&str>) -> Result<(), ApiError> {
        match requested {
            None => Ok(()),
            Some(m) if m == self.model_name => Ok(()),
            Some(m) => Err(ApiError::model_not_found(m, &self.model_name)),
        }
    }
}

/// The router with every endpoint. The OpenAI ones are also served without the `/v1`
/// prefix, as llama.cpp's server does, for clients whose base URL is the bare host.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/models", get(list_models))
        .route("/models", get(list_models))
        .route("/v1/models/{id}", get(get_model))
        .route("/models/{id}", get(get_model))
        .route("/health", get(health))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .merge(crate::ollama::routes())
        .merge(crate::anthropic::routes())
        .merge(crate::responses::routes())
        .fallback(|| async { ApiError::not_found("No such endpoint.") })
        .method_not_allowed_fallback(|| async {
            ApiError { status: axum::http::StatusCode::METHOD_NOT_ALLOWED, ..ApiError::invalid("Method not allowed.") }
        })
        .with_state(state)
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Largest oversized body read to its end (and dropped) before the 413 is sent.
const OVERSIZED_BODY_DRAIN_BYTES: u64 = 64 * 1024 * 1024;

/// The request body, within `--max-body-bytes` (413) and `--body-timeout` (408).
pub(crate) async fn read_body(app: &AppState, headers: &HeaderMap, body: Body) -> Result<axum::body::Bytes, ApiError> {
    match tokio::time::timeout(app.body_timeout, read_body_untimed(app, headers, body)).await {
        Ok(result) => result,
        Err(_) => Err(ApiError::body_timeout(app.body_timeout.as_secs())),
    }
}

async fn read_body_untimed(app: &AppState, headers: &HeaderMap, body: Body) -> Result<axum::body::Bytes, ApiError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > app.max_body_bytes as u64) {
        // Take in (and drop) what the client is still sending before answering: closing the
        // connection under an unfinished upload resets it, and the client sees "broken pipe"
        // instead of the 413. Past a bound, answer at once.
        if n <= OVERSIZED_BODY_DRAIN_BYTES {
            let mut chunks = body.into_data_stream();
            while let Some(Ok(_)) = futures_util::StreamExt::next(&mut chunks).await {}
        }
        return Err(ApiError::too_large(app.max_body_bytes));
    }
    axum::body::to_bytes(body, app.max_body_bytes).await.map_err(|e| {
        let too_long = std::error::Error::source(&e).is_some_and(|s| s.to_string().contains("length limit"))
            || e.to_string().contains("length limit");
        if too_long {
            ApiError::too_large(app.max_body_bytes)
        } else {
            ApiError::invalid(format!("The request body could not be read: {e}"))
        }
    })
}

// ---- shared request handling ------------------------------------------------------------

/// Slack on the bytes-per-token bound of [`check_text_fits`]: a tokenizer's normalizer may
/// shorten text before it is split (NFC composes `e` + U+0301, three bytes, into `é`, two), so
/// the bound is taken at twice the longest token.
const NORMALIZER_SLACK: usize = 2;

/// The most bytes of text one token of `tokenizer` can stand for: its longest token's bytes
/// (an added token's literal text, or a vocabulary token's decoded bytes), at least 1. When the
/// exact bytes are unknown (a decoder that is neither byte-level nor byte-fallback), the
/// vocabulary forms' UTF-8 length, which is never shorter than what they decode to.
pub fn longest_token_bytes(tokenizer: &Tokenizer) -> usize {
    use frognano_model::tokenizer::TokenBytes;
    let n = tokenizer.vocab_size();
    let exact = tokenizer.token_bytes(n).ok().map(|all| {
        all.iter()
            .map(|t| match t {
                TokenBytes::Text(b) | TokenBytes::Control(b) => b.len(),
                TokenBytes::Missing => 0,
            })
            .max()
            .unwrap_or(0)
    });
    let longest = exact.unwrap_or_else(|| {
        (0..n as u32).filter_map(|id| tokenizer.id_to_token(id)).map(|form| form.len()).max().unwrap_or(0)
    });
    longest.max(1)
}

/// Refuses a text that cannot fit the context before it is tokenized (tokenizing megabytes
/// takes seconds and gigabytes): `bytes` of text are at least `bytes / (max_token_bytes ×
/// NORMALIZER_SLACK)` tokens. Texts under the bound are tokenized and checked exactly.
pub(crate) fn check_text_fits(app: &AppState, bytes: usize, param: &str) -> Result<(), ApiError> {
    let at_least = bytes / (app.max_token_bytes * NORMALIZER_SLACK);
    if at_least >= app.ctx {
        return Err(ApiError {
            message: format!(
                "This model's maximum context length is {} tokens. However, your {param} is {bytes} bytes of text, \
                 which is at least {at_least} tokens (no token of this model is longer than {} bytes). Please \
                 reduce the length of the {param}.",
                app.ctx, app.max_token_bytes
            ),
            overflow: Some(crate::error::ContextOverflow::new(at_least, true, app.ctx)),
            ..ApiError::context_length(app.ctx, at_least, param)
        });
    }
    Ok(())
}

/// Turns sampling fields and a length limit into an engine request.
pub(crate) fn generate_request(
    app: &AppState,
    fields: &SamplingFields,
    max_tokens: Option<u64>,
    default_max_tokens: Option<usize>,
    prompt_tokens: usize,
    prompt_param: &str,
    top_logprobs: usize,
) -> Result<GenerateRequest, ApiError> {
    let d = &app.defaults;
    let top_k = match fields.top_k.or(d.top_k.map(|k| k as i64)) {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(k) => {
            return Err(ApiError::invalid_param("top_k", format!("top_k must be ≥ 1, or 0/-1 to disable; found {k}")))
        }
    };
    let sampling = SamplingParams {
        temperature: fields.temperature.or(d.temperature).unwrap_or(1.0),
        top_p: fields.top_p.or(d.top_p).unwrap_or(1.0),
        top_k,
        min_p: fields.min_p.unwrap_or(0.0),
        repetition_penalty: fields.repetition_penalty.or(d.repetition_penalty).unwrap_or(1.0),
        seed: fields.seed.map(|s| s as u64),
        presence_penalty: fields.presence_penalty.unwrap_or(0.0),
        frequency_penalty: fields.frequency_penalty.unwrap_or(0.0),
        logit_bias: match &fields.logit_bias {
            Some(bias) => parse_logit_bias(bias, app.vocab_size)?,
            None => Vec::new(),
        },
    };
    sampling.validate().map_err(|msg| {
        let param = msg.split_whitespace().next().unwrap_or("").to_string();
        ApiError::invalid_param(param, msg)
    })?;
    if prompt_tokens >= app.ctx {
        return Err(ApiError::context_length(app.ctx, prompt_tokens, prompt_param));
    }
    let room = app.ctx - prompt_tokens;
    // `max_tokens` is a cap: past what the context leaves, the reply stops where the context
    // ends (`finish_reason: "length"`), as llama.cpp's and Ollama's servers do. Agents ask for
    // their own models' budgets whatever the model (opencode and Claude Code 32,000, Qwen Code
    // 8,000), which a 400 here would turn into a failure on every turn of a 32K model.
    let max_tokens = match max_tokens {
        Some(0) => return Err(ApiError::invalid_param("max_tokens", "max_tokens must be at least 1")),
        Some(m) => usize::try_from(m).unwrap_or(usize::MAX).min(room),
        None => default_max_tokens.unwrap_or(room).min(room),
    };
    Ok(GenerateRequest { sampling, max_tokens, stop_ids: app.eos_ids.clone(), top_logprobs, checkpoint: None })
}

fn check_stops(stop: Option<crate::api::StopField>) -> Result<Vec<String>, ApiError> {
    check_stop_list(stop.map(|s| s.into_vec()).unwrap_or_default(), "stop")
}

/// Checks a request's stop strings (`param`: the field they came in): at most 16, none empty.
pub(crate) fn check_stop_list(stops: Vec<String>, param: &str) -> Result<Vec<String>, ApiError> {
    if stops.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid_param(
            param,
            format!("{param}: at most {MAX_STOP_STRINGS} stop strings are allowed"),
        ));
    }
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::invalid_param(param, format!("{param}: stop strings must not be empty")));
    }
    Ok(stops)
}

pub(crate) fn submit(app: &AppState, job: Job) -> Result<(), ApiError> {
    submit_all(app, vec![job])
}

/// Queues a request's jobs, all or none (429 with `Retry-After` when the queue has no room).
fn submit_all(app: &AppState, jobs: Vec<Job>) -> Result<(), ApiError> {
    app.pool.submit_all(jobs).map_err(|full| ApiError::overloaded(full.waiting, app.pool.config().max_batch))
}

/// Collects a job's events up to its end.
pub(crate) async fn collect(mut rx: mpsc::UnboundedReceiver<JobEvent>) -> Result<(Delta, JobSummary), ApiError> {
    let mut acc = Delta::default();
    while let Some(event) = rx.recv().await {
        match event {
            JobEvent::Delta(d) => acc.extend(d),
            JobEvent::Done(summary) => return Ok((acc, summary)),
            JobEvent::Failed(err) => return Err(err),
        }
    }
    Err(ApiError::internal("The generation scheduler stopped without finishing the request."))
}

fn usage_json(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

fn logprob_entry(lp: &TokenLogprob) -> Value {
    json!({
        "token": lp.token,
        "logprob": lp.logprob,
        "bytes": lp.bytes,
        "top_logprobs": lp.top.iter().map(|(t, b, l)| json!({"token": t, "logprob": l, "bytes": b})).collect::<Vec<_>>(),
    })
}

fn chat_logprobs(lps: &[TokenLogprob]) -> Value {
    json!({"content": lps.iter().map(logprob_entry).collect::<Vec<_>>()})
}

/// `/v1/completions` log-probabilities: `tokens`, `token_logprobs`, `top_logprobs` (a map per
/// token), `text_offset` (characters before each token, counted from `offset`).
fn text_logprobs(lps: &[TokenLogprob], offset: &mut usize) -> Value {
    let mut offsets = Vec::with_capacity(lps.len());
    for lp in lps {
        offsets.push(*offset);
        *offset += lp.token.chars().count();
    }
    json!({
        "tokens": lps.iter().map(|l| l.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|l| {
            let mut m = Map::new();
            for (t, _, p) in &l.top {
                m.entry(t.clone()).or_insert(json!(p));
            }
            Value::Object(m)
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

/// The job's next event, or `None` once the client has gone (its stream was dropped) even
/// while the job sends nothing (a long prompt being prefilled): the caller then returns and
/// drops `rx`, which cancels the job at its next chunk or token.
pub(crate) async fn next_event<T>(
    rx: &mut mpsc::UnboundedReceiver<JobEvent>,
    tx: &mpsc::Sender<T>,
) -> Option<JobEvent> {
    tokio::select! {
        event = rx.recv() => event,
        () = tx.closed() => None,
    }
}

/// [`next_event`] for a stream of server-sent events that must show it is alive: while the
/// job sends nothing for `every` (a long prompt being prefilled), `keep_alive()` is sent
/// (Anthropic's `ping`, an SSE comment), so that clients and proxies with read timeouts keep
/// the stream. `None` once the job's channel closes or the client has gone.
pub(crate) async fn next_event_keeping_alive(
    rx: &mut mpsc::UnboundedReceiver<JobEvent>,
    tx: &mpsc::Sender<Event>,
    every: std::time::Duration,
    keep_alive: impl Fn() -> Event,
) -> Option<JobEvent> {
    loop {
        tokio::select! {
            event = next_event(rx, tx) => return event,
            () = tokio::time::sleep(every) => {
                if tx.send(keep_alive()).await.is_err() {
                    return None;
                }
            }
        }
    }
}

pub(crate) fn sse_response(rx: mpsc::Receiver<Event>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|event| (Ok::<_, Infallible>(event), rx))
    });
    Sse::new(stream).into_response()
}

fn data_event(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

// ---- /v1/chat/completions -----------------------------------------------------------------

/// Renders a chat request to prompt ids (also used by `/tokenize`).
pub(crate) fn render_chat(
    app: &AppState,
    messages: &[Message],
    tools: &[Value],
    add_generation_prompt: bool,
    kwargs: Option<&Map<String, Value>>,
) -> Result<(String, Vec<u32>), ApiError> {
    let text = render_chat_text(app, messages, tools, add_generation_prompt, kwargs)?;
    let ids = app
        .tokenizer
        .encode_with(&text, false)
        .map_err(|e| ApiError::invalid_param("messages", format!("The conversation cannot be tokenized: {e}")))?;
    Ok((text, ids))
}

/// Where the generation prompt of a rendered chat prompt (`text`, tokenized as `ids`) begins:
/// the prompt position after the conversation's last message. The next turn renders this
/// turn's ending its own way (Qwen3.5's template drops the empty `<think></think>` of an
/// assistant reply once a newer user message follows; the reply itself replaces the
/// generation prompt), so its prompt shares this one up to that position and not to its end.
/// The engine keeps a state there ([`GenerateRequest::checkpoint`]), which a hybrid model
/// (whose recurrent state cannot be cut back) needs to resume the next turn from it instead of
/// from the start. `None` when the template's ending is not a plain suffix of the prompt.
pub(crate) fn generation_checkpoint(
    app: &AppState,
    messages: &[Message],
    tools: &[Value],
    kwargs: Option<&Map<String, Value>>,
    text: &str,
    ids: &[u32],
) -> Option<usize> {
    let base = render_chat_text(app, messages, tools, false, kwargs).ok()?;
    frognano_engine::llm::generation_checkpoint(text, &base, ids, &app.tokenizer)
}

/// Renders a chat request to the prompt text, checked against the context by its length.
fn render_chat_text(
    app: &AppState,
    messages: &[Message],
    tools: &[Value],
    add_generation_prompt: bool,
    kwargs: Option<&Map<String, Value>>,
) -> Result<String, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_param("messages", "messages must contain at least one message"));
    }
    // Content as plain text: the form every template renders (a tool-only assistant turn
    // sent back with `content: null`, list-of-parts content), the same the in-process model
    // gives its template (`frognano_protocol::text_only_messages`).
    let mut messages = frognano_protocol::text_only_messages(messages)
        .map_err(|(i, e)| ApiError::invalid_param(format!("messages[{i}].content"), format!("messages[{i}].{e}")))?;
    for (i, m) in messages.iter_mut().enumerate() {
        match m.role.as_str() {
            "system" | "user" | "assistant" | "tool" => {}
            "developer" => m.role = "system".into(),
            other => {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].role"),
                    format!("messages[{i}].role must be system, developer, user, assistant or tool; found {other:?}"),
                ))
            }
        }
    }
    if let Some(kwargs) = kwargs {
        if let Some(v) = kwargs.get("enable_thinking") {
            if !v.is_boolean() && !v.is_null() {
                return Err(ApiError::invalid_param(
                    "chat_template_kwargs.enable_thinking",
                    format!("chat_template_kwargs.enable_thinking must be true or false, found {v}"),
                ));
            }
        }
    }
    let template = app.template.as_ref().ok_or_else(|| {
        ApiError::invalid("This model has no chat template; use /v1/completions with a plain prompt.")
    })?;
    let tools_arg = (!tools.is_empty()).then_some(tools);
    let text = template
        .render(&messages, tools_arg, add_generation_prompt, kwargs)
        .map_err(|e| ApiError::invalid_param("messages", format!("The conversation cannot be rendered: {e}")))?;
    check_text_fits(app, text.len(), "messages")?;
    Ok(text)
}

/// Whether a rendered prompt ends inside an open `<think>` block.
pub(crate) fn ends_in_open_think(prompt: &str) -> bool {
    match (prompt.rfind("<think>"), prompt.rfind("</think>")) {
        (Some(open), Some(close)) => open > close,
        (Some(_), None) => true,
        _ => false,
    }
}

/// A chat request in the server's own terms, whichever API it came in through (OpenAI's
/// `/v1/chat/completions`, Ollama's `/api/chat`, Anthropic's `/v1/messages`): each front end
/// reads its own body into this, and [`start_chat`] renders, checks and queues it the same way.
#[derive(Clone)]
pub(crate) struct ChatInput<'a> {
    /// The conversation in OpenAI form.
    pub messages: &'a [Message],
    /// OpenAI function tools (already checked by [`validate_tools`]).
    pub tools: Vec<Value>,
    /// What the reply may or must do with the tools.
    pub choice: ToolChoice,
    /// Sampling fields (unset ones fall back to the model's generation config).
    pub sampling: SamplingFields,
    /// Most tokens to generate (`None`: what the context leaves).
    pub max_tokens: Option<u64>,
    /// Stop strings (checked by [`check_stop_list`]).
    pub stops: Vec<String>,
    /// Extra chat-template variables (`enable_thinking`).
    pub template_kwargs: Option<&'a Map<String, Value>>,
    /// The shape the reply must have.
    pub response_format: crate::structured::ResponseFormat,
    /// `Some(k)`: report log-probabilities with `k` alternatives.
    pub logprobs: Option<usize>,
}

/// A chat job queued by [`start_chat`].
pub(crate) struct StartedChat {
    /// The job's deltas and its end.
    pub events: mpsc::UnboundedReceiver<JobEvent>,
    /// Tokens of the rendered prompt.
    pub prompt_tokens: usize,
    /// The chat template shows the model no tools, so FrogNano described them in the system
    /// prompt (`x-frognano-tool-prompt: injected`).
    pub tool_prompt_injected: bool,
}

/// Renders a chat request with the model's template, compiles its grammar (structured
/// outputs, forced or constrained tool calls), checks its length against the context and
/// queues it (429 when the queue is full). Every chat front end goes through here.
pub(crate) async fn start_chat(app: &Arc<AppState>, input: ChatInput<'_>) -> Result<StartedChat, ApiError> {
    let ChatInput { messages, tools, choice, sampling, max_tokens, stops, template_kwargs, response_format, logprobs } =
        input;
    let (text, prompt) = render_chat(app, messages, &tools, true, template_kwargs)?;
    let checkpoint = generation_checkpoint(app, messages, &tools, template_kwargs, &text, &prompt);
    let injected = app.template.as_ref().is_some_and(|t| t.injects_tool_prompt(messages, Some(&tools)));
    // Structured outputs (crate::structured): the grammar is compiled before the job is
    // queued, so a schema it cannot enforce is a 400 now. A forced call is written in the
    // tool-call format the reply is parsed with (output.rs).
    let format = app.tool_parser.format().name();
    let grammar = crate::structured::reply_grammar(
        &response_format,
        &choice,
        format,
        &tools,
        ends_in_open_think(&text),
        app.constrain_tools,
    )?;
    let constraint = match grammar {
        None => None,
        // The server's own constraint of an `auto` reply (`--constrain-tools`), which the
        // client did not ask for: a tool whose schema the grammar cannot take gets calls with
        // any JSON object as arguments, rather than the request failing.
        Some((grammar, "tools")) => match compile_off_thread(app, grammar).await? {
            Ok(c) => Some(c),
            Err(_) => constrain_loosened(app, &tools, &response_format, &choice, format, &text).await,
        },
        Some((grammar, param)) => Some(compile_grammar(app, grammar, param, &tools).await?),
    };
    let mode = OutputMode::Chat {
        format: app.tool_parser,
        thinking_prompted: ends_in_open_think(&text),
        parse_tool_calls: !tools.is_empty() && choice != ToolChoice::None,
        tools,
    };
    let mut gen = generate_request(app, &sampling, max_tokens, None, prompt.len(), "messages", logprobs.unwrap_or(0))?;
    gen.checkpoint = checkpoint;
    let prompt_tokens = prompt.len();
    let (tx, rx) = mpsc::unbounded_channel();
    submit(app, Job { prompt, request: gen, mode, stop_strings: stops, logprobs, events: tx, constraint })?;
    Ok(StartedChat { events: rx, prompt_tokens, tool_prompt_injected: injected })
}

/// The `auto` constraint over the tools with the schemas llguidance refuses loosened to any
/// JSON object ([`crate::structured::loosen_refused_tools`]), each loosened tool named in the
/// log; `None` (the reply unconstrained) if even that grammar is refused.
async fn constrain_loosened(
    app: &Arc<AppState>,
    tools: &[Value],
    response_format: &crate::structured::ResponseFormat,
    choice: &ToolChoice,
    format: &str,
    text: &str,
) -> Option<frognano_engine::Constraint> {
    let (state, owned) = (Arc::clone(app), tools.to_vec());
    let (loose, names) =
        tokio::task::spawn_blocking(move || crate::structured::loosen_refused_tools(&state.constraints, &owned))
            .await
            .ok()?;
    for name in &names {
        tracing::warn!(
            "tool {name:?}: its schema cannot be enforced by the grammar; its calls' arguments are any JSON object"
        );
    }
    let grammar =
        crate::structured::reply_grammar(response_format, choice, format, &loose, ends_in_open_think(text), true)
            .ok()??;
    match compile_off_thread(app, grammar.0).await.ok()? {
        Ok(c) => Some(c),
        Err(e) => {
            let why = crate::structured::refusal("tools", e).message;
            tracing::warn!("the tool calls of this reply are not constrained: {why}");
            None
        }
    }
}

/// Compiles a reply grammar off the async threads (llguidance can take a while on a large
/// schema): the constraint, or why the grammar was refused; `Err` only if the task failed.
async fn compile_off_thread(
    app: &Arc<AppState>,
    grammar: frognano_engine::Grammar,
) -> Result<Result<frognano_engine::Constraint, frognano_engine::ConstraintError>, ApiError> {
    let state = Arc::clone(app);
    tokio::task::spawn_blocking(move || state.constraints.compile(&grammar).map(|compiled| compiled.start()))
        .await
        .map_err(|e| ApiError::internal(format!("compiling the grammar failed: {e}")))
}

/// Compiles a reply grammar ([`compile_off_thread`]); `param` is the request field it came
/// from, and `tools` the request's tools, for the error ([`crate::structured::refusal`]). A refused tool-call grammar names the first tool
/// whose schema llguidance refuses alone; the tools are copied into a blocking task only then,
/// not on every constrained request.
pub(crate) async fn compile_grammar(
    app: &Arc<AppState>,
    grammar: frognano_engine::Grammar,
    param: &'static str,
    tools: &[Value],
) -> Result<frognano_engine::Constraint, ApiError> {
    use crate::structured::{is_tool_call, refusal, refused_tool};
    use frognano_engine::ConstraintError;
    let failed = |e: tokio::task::JoinError| ApiError::internal(format!("compiling the grammar failed: {e}"));
    match compile_off_thread(app, grammar).await? {
        Ok(constraint) => Ok(constraint),
        Err(ConstraintError::Grammar(msg)) if is_tool_call(param) && !tools.is_empty() => {
            let (state, tools) = (Arc::clone(app), tools.to_vec());
            let named =
                tokio::task::spawn_blocking(move || refused_tool(&state.constraints, &tools)).await.map_err(failed)?;
            Err(named.unwrap_or_else(|| refusal(param, ConstraintError::Grammar(msg))))
        }
        Err(e) => Err(refusal(param, e)),
    }
}

async fn chat_completions(State(app): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    match chat_inner(Arc::clone(&app), headers, body).await {
        Ok(r) => r,
        Err(e) => app.public(e).into_response(),
    }
}

async fn chat_inner(app: Arc<AppState>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let bytes = read_body(&app, &headers, body).await?;
    let req: ChatCompletionRequest = parse_body(&bytes)?;
    app.check_model(req.model.as_deref())?;
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_param("n", "only n = 1 is supported"));
    }
    let tools = req.tools.clone().unwrap_or_default();
    let choice = validate_tools(&tools, req.tool_choice.as_ref())?;
    let want_logprobs = req.logprobs.unwrap_or(false);
    let top = req.top_logprobs.unwrap_or(0);
    if top > MAX_TOP_LOGPROBS {
        return Err(ApiError::invalid_param(
            "top_logprobs",
            format!("top_logprobs must be at most {MAX_TOP_LOGPROBS}"),
        ));
    }
    if req.top_logprobs.is_some() && !want_logprobs && top > 0 {
        return Err(ApiError::invalid_param("top_logprobs", "top_logprobs needs logprobs: true"));
    }
    let stops = check_stops(req.stop.clone())?;
    let response_format = crate::structured::parse_response_format(req.response_format.as_ref())?;
    let started = start_chat(
        &app,
        ChatInput {
            messages: &req.messages,
            tools,
            choice,
            sampling: req.sampling(),
            max_tokens: req.max_completion_tokens.or(req.max_tokens),
            stops,
            template_kwargs: req.chat_template_kwargs.as_ref(),
            response_format,
            logprobs: want_logprobs.then_some(top as usize),
        },
    )
    .await?;
    let (rx, injected) = (started.events, started.tool_prompt_injected);
    let id = app.response_id("chatcmpl");
    if req.stream.unwrap_or(false) {
        let include_usage = req.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
        return Ok(with_tool_prompt_header(stream_chat(app, id, rx, include_usage, want_logprobs), injected));
    }
    let (out, summary) = collect(rx).await?;
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    // The text exactly as the stream sends it, untrimmed, so both forms of a reply agree.
    let content = out.content;
    message.insert(
        "content".into(),
        if content.is_empty() && !out.tool_calls.is_empty() { Value::Null } else { json!(content) },
    );
    let reasoning = out.reasoning;
    if !reasoning.is_empty() {
        message.insert("reasoning_content".into(), json!(reasoning));
    }
    if !out.tool_calls.is_empty() {
        message.insert("tool_calls".into(), json!(out.tool_calls));
    }
    let body = json!({
        "id": id,
        "object": "chat.completion",
        "created": unix_now(),
        "model": app.model_name,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": if want_logprobs { chat_logprobs(&out.logprobs) } else { Value::Null },
            "finish_reason": summary.finish_reason,
        }],
        "usage": usage_json(summary.prompt_tokens, summary.completion_tokens, summary.cached_tokens),
    });
    Ok(with_tool_prompt_header(Json(body).into_response(), injected))
}

/// Marks a reply whose prompt got its tools described by FrogNano because the chat template
/// shows the model none (`x-frognano-tool-prompt: injected`; docs/agent.md §7).
pub(crate) fn with_tool_prompt_header(mut response: Response, injected: bool) -> Response {
    if injected {
        response.headers_mut().insert("x-frognano-tool-prompt", header::HeaderValue::from_static("injected"));
    }
    response
}

fn stream_chat(
    app: Arc<AppState>,
    id: String,
    mut rx: mpsc::UnboundedReceiver<JobEvent>,
    include_usage: bool,
    want_logprobs: bool,
) -> Response {
    let (tx, body_rx) = mpsc::channel::<Event>(64);
    let created = unix_now();
    let model = app.model_name.clone();
    tokio::spawn(async move {
        let chunk = |delta: Value, logprobs: Value, finish: Value| {
            data_event(&json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
            }))
        };
        if tx.send(chunk(json!({"role": "assistant", "content": ""}), Value::Null, Value::Null)).await.is_err() {
            return;
        }
        let mut call_index = 0usize;
        let mut pending_logprobs: Vec<TokenLogprob> = Vec::new();
        while let Some(event) = next_event(&mut rx, &tx).await {
            match event {
                JobEvent::Delta(d) => {
                    pending_logprobs.extend(d.logprobs);
                    let mut pieces: Vec<Value> = Vec::new();
                    if !d.reasoning.is_empty() {
                        pieces.push(json!({"reasoning_content": d.reasoning}));
                    }
                    if !d.content.is_empty() {
                        pieces.push(json!({"content": d.content}));
                    }
                    for call in d.tool_calls {
                        pieces.push(json!({"tool_calls": [{
                            "index": call_index, "id": call.id, "type": "function",
                            "function": {"name": call.function.name, "arguments": ""},
                        }]}));
                        pieces.push(json!({"tool_calls": [{
                            "index": call_index, "function": {"arguments": call.function.arguments},
                        }]}));
                        call_index += 1;
                    }
                    for piece in pieces {
                        let lp = if want_logprobs && !pending_logprobs.is_empty() {
                            chat_logprobs(&std::mem::take(&mut pending_logprobs))
                        } else {
                            Value::Null
                        };
                        if tx.send(chunk(piece, lp, Value::Null)).await.is_err() {
                            return; // client gone: dropping `rx` stops the generation
                        }
                    }
                }
                JobEvent::Done(summary) => {
                    let lp = if want_logprobs && !pending_logprobs.is_empty() {
                        chat_logprobs(&pending_logprobs)
                    } else {
                        Value::Null
                    };
                    let _ = tx.send(chunk(json!({}), lp, json!(summary.finish_reason))).await;
                    if include_usage {
                        let usage = usage_json(summary.prompt_tokens, summary.completion_tokens, summary.cached_tokens);
                        let _ = tx
                            .send(data_event(&json!({
                                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                                "choices": [], "usage": usage,
                            })))
                            .await;
                    }
                    let _ = tx.send(Event::default().data("[DONE]")).await;
                    return;
                }
                JobEvent::Failed(err) => {
                    let _ = tx.send(data_event(&app.public(err).body())).await;
                    let _ = tx.send(Event::default().data("[DONE]")).await;
                    return;
                }
            }
        }
        let _ = tx.send(data_event(&ApiError::internal("The generation scheduler stopped.").body())).await;
    });
    sse_response(body_rx)
}

// ---- /v1/completions ----------------------------------------------------------------------

async fn completions(State(app): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    match completions_inner(Arc::clone(&app), headers, body).await {
        Ok(r) => r,
        Err(e) => app.public(e).into_response(),
    }
}

async fn completions_inner(app: Arc<AppState>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let bytes = read_body(&app, &headers, body).await?;
    let req: CompletionRequest = parse_body(&bytes)?;
    app.check_model(req.model.as_deref())?;
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_param("n", "only n = 1 is supported"));
    }
    if req.best_of.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_param("best_of", "only best_of = 1 is supported"));
    }
    if req.echo.unwrap_or(false) {
        return Err(ApiError::invalid_param("echo", "echo is not supported by this server"));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param("suffix", "suffix is not supported by this server"));
    }
    let top = req.logprobs;
    if top.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
        return Err(ApiError::invalid_param("logprobs", format!("logprobs must be at most {MAX_TOP_LOGPROBS}")));
    }
    let stops = check_stops(req.stop.clone())?;
    let prompts = parse_prompts(&req.prompt)?;
    if prompts.len() > app.max_prompts_per_request {
        return Err(ApiError::invalid_param(
            "prompt",
            format!(
                "this request has {} prompts; the server takes at most {} per request (--max-prompts-per-request)",
                prompts.len(),
                app.max_prompts_per_request
            ),
        ));
    }
    for (i, p) in prompts.iter().enumerate() {
        if let PromptInput::Text(t) = p {
            check_text_fits(&app, t.len(), "prompt")
                .map_err(|e| ApiError { message: e.message.replacen("your prompt", &format!("prompt {i}"), 1), ..e })?;
        }
    }
    let mut jobs = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.into_iter().enumerate() {
        let ids = match p {
            PromptInput::Text(t) => app
                .tokenizer
                .encode(&t)
                .map_err(|e| ApiError::invalid_param("prompt", format!("prompt {i} cannot be tokenized: {e}")))?,
            PromptInput::Tokens(ids) => {
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= app.vocab_size) {
                    return Err(ApiError::invalid_param(
                        "prompt",
                        format!("token id {bad} in prompt {i} is outside the vocabulary (size {})", app.vocab_size),
                    ));
                }
                ids
            }
        };
        let gen = generate_request(
            &app,
            &req.sampling(),
            req.max_tokens,
            Some(COMPLETIONS_DEFAULT_MAX_TOKENS),
            ids.len(),
            "prompt",
            top.unwrap_or(0) as usize,
        )?;
        jobs.push((ids, gen));
    }
    let mut receivers = Vec::with_capacity(jobs.len());
    let mut pool_jobs = Vec::with_capacity(jobs.len());
    for (ids, gen) in jobs {
        let (tx, rx) = mpsc::unbounded_channel();
        pool_jobs.push(Job {
            prompt: ids,
            request: gen,
            mode: OutputMode::Text,
            stop_strings: stops.clone(),
            logprobs: top.map(|k| k as usize),
            events: tx,
            constraint: None,
        });
        receivers.push(rx);
    }
    submit_all(&app, pool_jobs)?;
    let id = app.response_id("cmpl");
    if req.stream.unwrap_or(false) {
        let include_usage = req.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
        return Ok(stream_completions(app, id, receivers, include_usage, top.is_some()));
    }
    let mut choices = Vec::new();
    let (mut prompt_tokens, mut completion_tokens, mut cached) = (0, 0, 0);
    for (index, rx) in receivers.into_iter().enumerate() {
        let (out, s) = collect(rx).await?;
        prompt_tokens += s.prompt_tokens;
        completion_tokens += s.completion_tokens;
        cached += s.cached_tokens;
        let logprobs = if top.is_some() { text_logprobs(&out.logprobs, &mut 0) } else { Value::Null };
        choices
            .push(json!({"index": index, "text": out.content, "logprobs": logprobs, "finish_reason": s.finish_reason}));
    }
    Ok(Json(json!({
        "id": id,
        "object": "text_completion",
        "created": unix_now(),
        "model": app.model_name,
        "choices": choices,
        "usage": usage_json(prompt_tokens, completion_tokens, cached),
    }))
    .into_response())
}

fn stream_completions(
    app: Arc<AppState>,
    id: String,
    receivers: Vec<mpsc::UnboundedReceiver<JobEvent>>,
    include_usage: bool,
    want_logprobs: bool,
) -> Response {
    let (tx, body_rx) = mpsc::channel::<Event>(64);
    let created = unix_now();
    let model = app.model_name.clone();
    tokio::spawn(async move {
        let chunk = |index: usize, text: &str, logprobs: Value, finish: Value| {
            data_event(&json!({
                "id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
            }))
        };
        let (mut prompt_tokens, mut completion_tokens, mut cached) = (0, 0, 0);
        for (index, mut rx) in receivers.into_iter().enumerate() {
            let mut offset = 0usize;
            let mut finished = false;
            while let Some(event) = next_event(&mut rx, &tx).await {
                match event {
                    JobEvent::Delta(d) => {
                        let lp = if want_logprobs { text_logprobs(&d.logprobs, &mut offset) } else { Value::Null };
                        if tx.send(chunk(index, &d.content, lp, Value::Null)).await.is_err() {
                            return;
                        }
                    }
                    JobEvent::Done(s) => {
                        prompt_tokens += s.prompt_tokens;
                        completion_tokens += s.completion_tokens;
                        cached += s.cached_tokens;
                        if tx.send(chunk(index, "", Value::Null, json!(s.finish_reason))).await.is_err() {
                            return;
                        }
                        finished = true;
                        break;
                    }
                    JobEvent::Failed(err) => {
                        let _ = tx.send(data_event(&app.public(err).body())).await;
                        let _ = tx.send(Event::default().data("[DONE]")).await;
                        return;
                    }
                }
            }
            if !finished {
                let _ = tx.send(data_event(&ApiError::internal("The generation scheduler stopped.").body())).await;
                return;
            }
        }
        if include_usage {
            let usage = usage_json(prompt_tokens, completion_tokens, cached);
            let _ = tx
                .send(data_event(&json!({
                    "id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [], "usage": usage,
                })))
                .await;
        }
        let _ = tx.send(Event::default().data("[DONE]")).await;
    });
    sse_response(body_rx)
}

// ---- models, health, tokenize ----------------------------------------------------------------

fn model_card(app: &AppState) -> Value {
    json!({"id": app.model_name, "object": "model", "created": app.created, "owned_by": "frognano",
           "max_model_len": app.ctx})
}

async fn list_models(State(app): State<Arc<AppState>>) -> Response {
    Json(json!({"object": "list", "data": [model_card(&app)]})).into_response()
}

async fn get_model(State(app): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if id == app.model_name {
        Json(model_card(&app)).into_response()
    } else {
        ApiError::model_not_found(&id, &app.model_name).into_response()
    }
}

async fn health(State(app): State<Arc<AppState>>) -> Response {
    let s = app.pool.stats();
    let c = app.pool.config();
    let r = Ordering::Relaxed;
    Json(json!({
        "status": "ok",
        "model": app.model_name,
        "max_model_len": app.ctx,
        "kv_cache": app.kv_cache,
        "max_concurrent": c.max_batch,
        "prefix_reuse": c.prefix_reuse,
        "running": s.running.load(r),
        "prefilling": s.prefilling.load(r),
        "prefill_chunks": s.prefill_chunks.load(r),
        "prefill_chunk": c.prefill_chunk,
        "prefill_stall": c.prefill_stall,
        "prefill_inside_step": c.prefill_inside_step,
        "fused_prefill_chunks": s.fused_prefill_chunks.load(r),
        "last_prefill_chunk": s.last_prefill_chunk.load(r),
        "panics": s.panics.load(r),
        "waiting": s.waiting.load(r),
        "completed": s.completed.load(r),
        "cancelled": s.cancelled.load(r),
        "failed": s.failed.load(r),
        "generated_tokens": s.generated_tokens.load(r),
        "prompt_tokens": s.prompt_tokens.load(r),
        "cached_tokens": s.cached_tokens.load(r),
        "forked_sessions": s.forks.load(r),
        "restored_sessions": s.restored.load(r),
        "session_store": c.store.as_ref().map(|st| st.stats()),
        "decode_steps": s.decode_steps.load(r),
        "decoded_rows": s.decoded_rows.load(r),
        "speculative": c.speculative.to_string(),
        "drafted_tokens": s.drafted_tokens.load(r),
        "accepted_tokens": s.accepted_tokens.load(r),
    }))
    .into_response()
}

async fn tokenize(State(app): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let bytes = read_body(&app, &headers, body).await?;
        let req: TokenizeRequest = parse_body(&bytes)?;
        app.check_model(req.model.as_deref())?;
        let (rendered, tokens) = match (&req.messages, &req.prompt) {
            (Some(messages), None) => {
                let tools = req.tools.clone().unwrap_or_default();
                validate_tools(&tools, None)?;
                let add = req.add_generation_prompt.unwrap_or(true);
                let (text, ids) = render_chat(&app, messages, &tools, add, req.chat_template_kwargs.as_ref())?;
                (Some(text), ids)
            }
            (None, Some(prompt)) => {
                let ids = app
                    .tokenizer
                    .encode_with(prompt, req.add_special_tokens.unwrap_or(true))
                    .map_err(|e| ApiError::invalid_param("prompt", e.to_string()))?;
                (None, ids)
            }
            _ => return Err(ApiError::invalid("Give exactly one of `prompt` (text) or `messages` (a conversation).")),
        };
        let mut body = json!({"count": tokens.len(), "max_model_len": app.ctx, "tokens": tokens});
        if let Some(text) = rendered {
            body["prompt"] = json!(text);
        }
        Ok::<_, ApiError>(Json(body).into_response())
    }
    .await;
    result.unwrap_or_else(|e| app.public(e).into_response())
}

async fn detokenize(State(app): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let bytes = read_body(&app, &headers, body).await?;
        let req: DetokenizeRequest = parse_body(&bytes)?;
        app.check_model(req.model.as_deref())?;
        let text =
            app.tokenizer.decode(&req.tokens, false).map_err(|e| ApiError::invalid_param("tokens", e.to_string()))?;
        Ok::<_, ApiError>(Json(json!({"prompt": text})).into_response())
    }
    .await;
    result.unwrap_or_else(|e| app.public(e).into_response())
}
