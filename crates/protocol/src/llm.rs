//! The model side of a conversation: the [`Llm`] trait, what is asked of it
//! ([`ChatRequest`], [`Sampling`]) and what comes back ([`Completion`], [`LlmError`]), and
//! the OpenAI-compatible HTTP backend ([`HttpLlm`]).
//!
//! The in-process backend (`frognano_engine::EngineLlm`, reusing its session so each turn
//! only prefills the new tokens) implements the same trait: it renders the messages with the
//! chat template, generates, and turns the raw text into a [`Completion`] with the model's
//! [`ToolCallFormat`].

use crate::codec::{CodecError, ToolCallFormat, ToolParser};
use crate::message::{Message, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// Sampling and length settings sent with every request. Defaults are the model card's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// Temperature (0.6).
    pub temperature: f32,
    /// Nucleus mass (0.95).
    pub top_p: f32,
    /// Top-k (20).
    pub top_k: u32,
    /// Min-p (0).
    pub min_p: f32,
    /// Repetition penalty (1.0).
    pub repetition_penalty: f32,
    /// Tokens generated per turn at most (8192).
    pub max_tokens: u32,
    /// Ask for a thinking block (chat_template_kwargs.enable_thinking; on).
    pub enable_thinking: bool,
    /// Sampling seed, if any.
    pub seed: Option<u64>,
    /// OpenAI's presence penalty (0; -2..2): subtracted once from the logit of every token
    /// already generated in this reply.
    #[serde(default)]
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty (0; -2..2): subtracted from a token's logit once for every
    /// time it was generated in this reply.
    #[serde(default)]
    pub frequency_penalty: f32,
    /// OpenAI's `logit_bias`: added to the logits of these token ids (-100..100) before
    /// sampling; empty for none. Serialised with the ids as string keys, as OpenAI has it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub logit_bias: BTreeMap<u32, f32>,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.6,
            top_p: 0.95,
            top_k: 20,
            min_p: 0.0,
            repetition_penalty: 1.0,
            max_tokens: 8192,
            enable_thinking: true,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: BTreeMap::new(),
        }
    }
}

/// Why generation stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A natural stop (end of turn or a stop string).
    Stop,
    /// The reply ends in tool calls.
    ToolCalls,
    /// Cut by the token limit (`length`).
    Length,
    /// Anything else the server said.
    Other(String),
}

impl FinishReason {
    /// Reads an OpenAI `finish_reason`.
    pub fn parse(s: &str) -> Self {
        match s.to_ascii_lowercase().as_str() {
            "stop" | "eos" | "end_turn" => FinishReason::Stop,
            "tool_calls" | "function_call" => FinishReason::ToolCalls,
            "length" | "max_tokens" | "max_new_tokens" => FinishReason::Length,
            other => FinishReason::Other(other.to_string()),
        }
    }
}

/// Token counts of one request, as reported by the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Generated tokens.
    pub completion_tokens: u64,
    /// Prompt tokens whose state was reused (kept in memory, or restored from disk) instead
    /// of being computed again (OpenAI's `prompt_tokens_details.cached_tokens`; 0 when not
    /// reported).
    pub cached_tokens: u64,
}

/// One model reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The assistant message (tool calls already in OpenAI form).
    pub message: Message,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// Token counts, if the backend reports them.
    pub usage: Option<Usage>,
}

/// What the loop asks the model.
#[derive(Debug, Clone, Copy)]
pub struct ChatRequest<'a> {
    /// The whole conversation so far.
    pub messages: &'a [Message],
    /// The OpenAI tool list.
    pub tools: &'a [Value],
    /// Sampling settings.
    pub sampling: &'a Sampling,
    /// Whether the reply may be text only or must call a tool.
    pub tool_choice: ToolChoice,
}

impl<'a> ChatRequest<'a> {
    /// A request that lets the model choose between text and tool calls.
    pub fn new(messages: &'a [Message], tools: &'a [Value], sampling: &'a Sampling) -> Self {
        ChatRequest { messages, tools, sampling, tool_choice: ToolChoice::Auto }
    }
}

/// OpenAI's `tool_choice` for a request with tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// Text, tool calls, or both (`"auto"`).
    #[default]
    Auto,
    /// At least one tool call (`"required"`): enforced where the reply is sampled under a
    /// grammar of the tool calls (`frognano serve`, an in-process model with
    /// `--constrain-tools`); elsewhere a request the model may not honour.
    Required,
    /// Exactly one tool call (`"required"` with `parallel_tool_calls: false`), enforced as
    /// `Required` is.
    One,
}

impl ToolChoice {
    /// The OpenAI wire value of `tool_choice`.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolChoice::Auto => "auto",
            ToolChoice::Required | ToolChoice::One => "required",
        }
    }

    /// The OpenAI `parallel_tool_calls` that goes with it.
    pub fn parallel_calls(self) -> bool {
        self != ToolChoice::One
    }
}

/// Why a model request failed.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The prompt does not fit the model's context.
    #[error("context length exceeded: {0}")]
    ContextOverflow(String),
    /// The reply meant to call tools and not one call parsed. The loop retries these.
    #[error("malformed tool call in the model's reply: {error}")]
    Malformed {
        /// The raw reply text.
        text: String,
        /// What was wrong with (the first of) its calls.
        error: CodecError,
        /// A correct call in the format the reply was read in
        /// ([`ToolCallFormat::call_syntax`]), to show the model how to retry.
        call_syntax: String,
    },
    /// The endpoint could not be reached.
    #[error("cannot reach the model endpoint {url}: {reason}")]
    Unreachable {
        /// URL tried.
        url: String,
        /// Transport error.
        reason: String,
    },
    /// The endpoint answered with an error.
    #[error("the model endpoint answered HTTP {status}: {body}")]
    Api {
        /// HTTP status.
        status: u16,
        /// Response body (shortened).
        body: String,
    },
    /// Every reply of a step, retries included, held malformed tool calls (the agent loop's
    /// retries ran out).
    #[error("the model replied with malformed tool calls {attempts} times in a row; last: {error}")]
    MalformedRepeatedly {
        /// Replies tried.
        attempts: u32,
        /// The last reply's raw text.
        text: String,
        /// What was wrong with (the first of) its calls.
        error: CodecError,
    },
    /// The endpoint given is not a plain `http://` URL.
    #[error("{0}")]
    InvalidEndpoint(String),
    /// Anything else (bad response shape, replay exhausted, engine error).
    #[error("{0}")]
    Other(String),
}

/// A chat model with tool calling.
pub trait Llm {
    /// Generates the next assistant turn for `request`.
    fn complete(&mut self, request: &ChatRequest<'_>) -> Result<Completion, LlmError>;
    /// Short description for logs and summaries (model name and where it runs).
    fn describe(&self) -> String;
}

/// An OpenAI-compatible `/v1/chat/completions` endpoint (Ollama, llama.cpp's server, vLLM,
/// `frognano serve`). Plain HTTP only.
#[derive(Debug, Clone)]
pub struct HttpLlm {
    url: String,
    model: String,
    api_key: Option<String>,
    agent: ureq::Agent,
    tool_parser: Option<ToolParser>,
}

impl HttpLlm {
    /// `endpoint`: base URL (`http://host:port`, `.../v1`, or the full
    /// `.../v1/chat/completions`); `model`: the model name the server knows.
    /// An endpoint that is not `http://` is [`LlmError::InvalidEndpoint`].
    pub fn new(endpoint: &str, model: &str, timeout: Duration) -> Result<Self, LlmError> {
        let base = endpoint.trim_end_matches('/');
        if base.starts_with("https://") {
            return Err(LlmError::InvalidEndpoint(format!(
                "endpoint {endpoint}: https is not supported by this build; use a local http \
                 endpoint (e.g. http://127.0.0.1:8080)"
            )));
        }
        if !base.starts_with("http://") {
            return Err(LlmError::InvalidEndpoint(format!("endpoint {endpoint:?} is not an http:// URL")));
        }
        let url = if base.ends_with("/chat/completions") {
            base.to_string()
        } else if base.ends_with("/v1") {
            format!("{base}/chat/completions")
        } else {
            format!("{base}/v1/chat/completions")
        };
        Ok(HttpLlm {
            url,
            model: model.to_string(),
            api_key: std::env::var("OPENAI_API_KEY").ok().filter(|k| !k.is_empty()),
            agent: ureq::AgentBuilder::new().timeout(timeout).build(),
            tool_parser: None,
        })
    }

    /// Reads tool calls a server leaves in the reply's content with `parser` (default: the
    /// format the text's markers show, see [`completion_from_openai`]).
    pub fn with_tool_parser(mut self, parser: Option<ToolParser>) -> Self {
        self.tool_parser = parser;
        self
    }

    /// The request body for `request` (public for tests and `--dry-run` style tooling).
    pub fn body(&self, request: &ChatRequest<'_>) -> Value {
        let s = request.sampling;
        let mut body = json!({
            "model": self.model,
            "messages": request.messages,
            "tools": request.tools,
            "tool_choice": request.tool_choice.as_str(),
            "parallel_tool_calls": request.tool_choice.parallel_calls(),
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "min_p": s.min_p,
            "repetition_penalty": s.repetition_penalty,
            "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty,
            "max_tokens": s.max_tokens,
            "chat_template_kwargs": {"enable_thinking": s.enable_thinking},
        });
        if let Some(seed) = s.seed {
            body["seed"] = json!(seed);
        }
        if !s.logit_bias.is_empty() {
            body["logit_bias"] = json!(s.logit_bias);
        }
        body
    }
}

const CONTEXT_MARKERS: [&str; 4] =
    ["context_length_exceeded", "reduce the length", "maximum context length", "exceeds the context"];

fn is_context_overflow(body: &str) -> bool {
    let b = body.to_ascii_lowercase();
    CONTEXT_MARKERS.iter().any(|m| b.contains(m)) || (b.contains("context length") && b.contains("exceed"))
}

impl Llm for HttpLlm {
    fn complete(&mut self, request: &ChatRequest<'_>) -> Result<Completion, LlmError> {
        let mut req = self.agent.post(&self.url).set("Content-Type", "application/json");
        if let Some(key) = &self.api_key {
            req = req.set("Authorization", &format!("Bearer {key}"));
        }
        let resp = match req.send_string(&self.body(request).to_string()) {
            Ok(r) => r,
            Err(ureq::Error::Status(status, r)) => {
                let body: String = r.into_string().unwrap_or_default().chars().take(2000).collect();
                return Err(if is_context_overflow(&body) {
                    LlmError::ContextOverflow(body)
                } else {
                    LlmError::Api { status, body }
                });
            }
            Err(ureq::Error::Transport(t)) => {
                return Err(LlmError::Unreachable { url: self.url.clone(), reason: t.to_string() })
            }
        };
        let text = resp.into_string().map_err(|e| LlmError::Other(format!("reading the response: {e}")))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| LlmError::Other(format!("the endpoint's answer is not JSON ({e}): {text:.300}")))?;
        completion_from_openai(&value, request.tools, self.tool_parser)
    }

    fn describe(&self) -> String {
        format!("{} at {}", self.model, self.url)
    }
}

/// Reads an OpenAI chat-completion response. Tool calls a server left unparsed in the
/// content (servers without a tool parser for the model do) are read with `parser`, or when
/// it is `None` with the format the text's markers show ([`ToolParser::for_reply`]); only
/// when the reply offered tools and was not cut. A reply whose calls are all malformed is
/// [`LlmError::Malformed`].
pub fn completion_from_openai(
    value: &Value,
    tools: &[Value],
    parser: Option<ToolParser>,
) -> Result<Completion, LlmError> {
    let choice = value
        .get("choices")
        .and_then(|c| c.get(0))
        .ok_or_else(|| LlmError::Other(format!("response has no choices: {:.300}", value.to_string())))?;
    let msg = choice.get("message").ok_or_else(|| LlmError::Other("response choice has no message".into()))?;
    let mut content = msg.get("content").and_then(Value::as_str).map(str::to_string);
    let mut reasoning =
        msg.get("reasoning_content").or_else(|| msg.get("reasoning")).and_then(Value::as_str).map(str::to_string);
    let mut calls: Vec<ToolCall> = match msg.get("tool_calls") {
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|c| {
                let name = c["function"]["name"].as_str().unwrap_or_default().to_string();
                let arguments = match &c["function"]["arguments"] {
                    Value::String(s) => s.clone(),
                    Value::Null => "{}".to_string(),
                    other => other.to_string(),
                };
                let mut call = ToolCall::new(name, arguments);
                if let Some(id) = c.get("id").and_then(Value::as_str).filter(|i| !i.is_empty()) {
                    call.id = id.to_string();
                }
                call
            })
            .collect(),
        _ => Vec::new(),
    };
    let finish_reason = FinishReason::parse(choice["finish_reason"].as_str().unwrap_or("stop"));
    let raw = content.clone().unwrap_or_default();
    if calls.is_empty() && !tools.is_empty() && finish_reason != FinishReason::Length {
        let parser = parser.unwrap_or_else(|| ToolParser::for_reply(&raw));
        let parsed = parser.parse_reply(&raw, false, tools);
        if let Some(bad) = parsed.failed_call() {
            return Err(LlmError::Malformed {
                text: raw.clone(),
                error: bad.error.clone(),
                call_syntax: parser.call_syntax().to_string(),
            });
        }
        if !parsed.tool_calls.is_empty() {
            calls = parsed.tool_calls;
            content = Some(parsed.content).filter(|c| !c.is_empty());
            if reasoning.is_none() {
                reasoning = parsed.reasoning;
            }
        }
    }
    let usage = value.get("usage").and_then(|u| {
        Some(Usage {
            prompt_tokens: u.get("prompt_tokens")?.as_u64()?,
            completion_tokens: u.get("completion_tokens")?.as_u64()?,
            cached_tokens: u.pointer("/prompt_tokens_details/cached_tokens").and_then(|c| c.as_u64()).unwrap_or(0),
        })
    });
    Ok(Completion { message: Message::assistant_reply(content, reasoning, calls), finish_reason, usage })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::test_tools::tool_schemas;

    #[test]
    fn reads_openai_tool_calls() {
        let v = json!({"choices": [{"message": {"role": "assistant", "content": null,
            "reasoning_content": "think", "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "Bash", "arguments": "{\"command\": \"ls\"}"}}]},
            "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 10, "completion_tokens": 5}});
        let c = completion_from_openai(&v, &tool_schemas(), None).unwrap();
        assert_eq!(c.message.calls()[0].id, "call_1");
        assert_eq!(c.message.reasoning_content.as_deref(), Some("think"));
        assert_eq!(c.finish_reason, FinishReason::ToolCalls);
        assert_eq!(c.usage.unwrap().prompt_tokens, 10);
    }

    #[test]
    fn parses_calls_a_server_left_in_the_content() {
        let reply = |content: &str| json!({"choices": [{"message": {"content": content}, "finish_reason": "stop"}]});
        let xml =
            reply("<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>");
        let c = completion_from_openai(&xml, &tool_schemas(), None).unwrap();
        assert_eq!(c.message.calls()[0].function.arguments, r#"{"command":"ls"}"#);
        assert_eq!(c.message.content, None);
        assert_eq!(c.finish_reason, FinishReason::Stop);
        // Hermes JSON, Mistral and a fenced JSON call are found by their markers.
        for text in [
            "Listing.\n<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>",
            "Listing.[TOOL_CALLS][{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}]",
            "Listing.\n```json\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n```",
        ] {
            let c = completion_from_openai(&reply(text), &tool_schemas(), None).unwrap();
            assert_eq!(c.message.calls()[0].function.arguments, r#"{"command":"ls"}"#, "{text}");
            assert_eq!(c.message.text(), "Listing.");
        }
        // Without tools in the request, the content is left alone.
        let c = completion_from_openai(&xml, &[], None).unwrap();
        assert!(c.message.calls().is_empty());
        let bad = reply("<tool_call>\n<function=Bash>\n");
        match completion_from_openai(&bad, &tool_schemas(), None) {
            Err(LlmError::Malformed { call_syntax, .. }) => assert!(call_syntax.contains("<function=NAME>")),
            other => panic!("{other:?}"),
        }
        // A parser given by name is used.
        match completion_from_openai(&bad, &tool_schemas(), Some(ToolParser::Hermes)) {
            Err(LlmError::Malformed { call_syntax, .. }) => assert!(call_syntax.starts_with("<tool_call>\n{\"name\"")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unreachable_endpoint_is_a_clear_error() {
        let mut llm = HttpLlm::new("http://127.0.0.1:9", "m", Duration::from_secs(5)).unwrap();
        let sampling = Sampling::default();
        let err = llm.complete(&ChatRequest::new(&[], &[], &sampling)).unwrap_err();
        assert!(matches!(err, LlmError::Unreachable { .. }), "{err}");
        assert!(err.to_string().starts_with("cannot reach the model endpoint http://127.0.0.1:9/v1/chat/completions"));
        let err = HttpLlm::new("ftp://x", "m", Duration::from_secs(1)).unwrap_err();
        assert_eq!(err.to_string(), "endpoint \"ftp://x\" is not an http:// URL");
        assert!(HttpLlm::new("https://x", "m", Duration::from_secs(1)).unwrap_err().to_string().contains("https"));
    }

    #[test]
    fn request_body_carries_the_card_defaults() {
        let llm = HttpLlm::new("http://h:1/v1", "frog", Duration::from_secs(1)).unwrap();
        let sampling = Sampling::default();
        let body = llm.body(&ChatRequest::new(&[Message::user("hi")], &[], &sampling));
        assert_eq!(body["tool_choice"], json!("auto"));
        let required = ChatRequest { tool_choice: ToolChoice::Required, ..ChatRequest::new(&[], &[], &sampling) };
        assert_eq!(llm.body(&required)["tool_choice"], json!("required"));
        let one = ChatRequest { tool_choice: ToolChoice::One, ..ChatRequest::new(&[], &[], &sampling) };
        assert_eq!(
            (llm.body(&one)["tool_choice"].clone(), llm.body(&one)["parallel_tool_calls"].clone()),
            (json!("required"), json!(false))
        );
        assert_eq!(body["parallel_tool_calls"], json!(true));
        assert_eq!(body["temperature"], json!(0.6f32));
        assert_eq!(body["top_k"], json!(20));
        assert_eq!(body["max_tokens"], json!(8192));
        assert_eq!(body["chat_template_kwargs"]["enable_thinking"], json!(true));
        assert_eq!(body["tool_choice"], json!("auto"));
        assert_eq!(body["presence_penalty"], json!(0.0));
        assert!(body.get("logit_bias").is_none(), "no bias, no field");
        assert_eq!(llm.describe(), "frog at http://h:1/v1/chat/completions");

        // The OpenAI parameters go out in OpenAI's form: token ids as string keys.
        let sampling = Sampling {
            presence_penalty: 0.5,
            frequency_penalty: -0.25,
            logit_bias: BTreeMap::from([(7, 100.0), (42, -5.5)]),
            ..Sampling::default()
        };
        let body = llm.body(&ChatRequest::new(&[Message::user("hi")], &[], &sampling));
        assert_eq!(body["presence_penalty"], json!(0.5));
        assert_eq!(body["frequency_penalty"], json!(-0.25));
        assert_eq!(body["logit_bias"], json!({"7": 100.0, "42": -5.5}));
        // And read back (settings files, trajectories) to the same value; old ones without
        // the fields read as the defaults.
        let back: Sampling = serde_json::from_value(serde_json::to_value(&sampling).unwrap()).unwrap();
        assert_eq!(back, sampling);
        let mut old = serde_json::to_value(Sampling::default()).unwrap();
        for k in ["presence_penalty", "frequency_penalty"] {
            old.as_object_mut().unwrap().remove(k);
        }
        assert_eq!(serde_json::from_value::<Sampling>(old).unwrap(), Sampling::default());
    }
}
