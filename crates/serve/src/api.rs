//! Request bodies of the OpenAI API as this server reads them, and their validation.
//!
//! Bodies are parsed in two steps so each mistake gets its own message: the bytes must be a
//! JSON object (else "malformed JSON"), then the object is read into the typed request with
//! the path of a wrongly typed field in the message (`temperature: invalid type: string …`).

use frognano_protocol::Message;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Parses a request body into `T`; every failure is a 400 naming what is wrong.
pub fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid(format!("The request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid("The request body must be a JSON object."));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            ApiError::invalid(format!("Invalid request: {}", e.inner()))
        } else {
            ApiError::invalid_param(path.clone(), format!("Invalid value for `{path}`: {}", e.inner()))
        }
    })
}

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    /// A single stop string.
    One(String),
    /// Several stop strings.
    Many(Vec<String>),
}

impl StopField {
    /// The stop strings as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and no choices) before `[DONE]`.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// Sampling fields shared by both generation endpoints (all optional; the model's
/// `generation_config.json` fills what the request leaves out).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingFields {
    /// Softmax temperature; 0 is greedy.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Most likely tokens kept; 0 or -1 keeps all.
    pub top_k: Option<i64>,
    /// Minimum probability relative to the best token.
    pub min_p: Option<f32>,
    /// CTRL-style repetition penalty (1 disables).
    pub repetition_penalty: Option<f32>,
    /// Seed of the draw.
    pub seed: Option<i64>,
    /// OpenAI's presence penalty (-2..2): once per token already in this reply.
    pub presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty (-2..2): per occurrence of a token in this reply.
    pub frequency_penalty: Option<f32>,
    /// OpenAI's `logit_bias`: token id (as a string key) → bias in -100..100.
    pub logit_bias: Option<Map<String, Value>>,
}

/// Reads `logit_bias`: every key a token id below `vocab_size` written as a decimal string,
/// every value a number in -100..100. The message names the bad key.
pub fn parse_logit_bias(bias: &Map<String, Value>, vocab_size: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |msg: String| ApiError::invalid_param("logit_bias", msg);
    let mut out = Vec::with_capacity(bias.len());
    for (key, value) in bias {
        let id: u32 = key.parse().map_err(|_| {
            bad(format!("logit_bias key {key:?} is not a token id (a non-negative integer written as a string)"))
        })?;
        if id as usize >= vocab_size {
            return Err(bad(format!(
                "logit_bias key {key:?} is outside the vocabulary: token ids go from 0 to {}",
                vocab_size.saturating_sub(1)
            )));
        }
        let b = value
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| bad(format!("logit_bias[{key:?}] must be a number from -100 to 100, found {value}")))?;
        out.push((id, b as f32));
    }
    Ok(out)
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    /// The model name; must be the served one when given.
    #[serde(default)]
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<Message>,
    /// OpenAI tool definitions.
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// `"auto"`, `"none"`, `"required"` or `{"type": "function", "function": {"name"}}`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Stream the answer as server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub temperature: Option<f32>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub top_p: Option<f32>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub top_k: Option<i64>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub min_p: Option<f32>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub seed: Option<i64>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub logit_bias: Option<Map<String, Value>>,
    /// Most tokens to generate (legacy name).
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Most tokens to generate (current name; wins over `max_tokens`).
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    /// Stop strings (not included in the output).
    #[serde(default)]
    pub stop: Option<StopField>,
    /// Return log-probabilities of the generated tokens.
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// Alternatives per token (0–20); needs `logprobs`.
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    /// Extra chat-template variables, e.g. `{"enable_thinking": true}`.
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Number of choices; only 1 is supported.
    #[serde(default)]
    pub n: Option<u32>,
    /// `{"type": "text" | "json_object" | "json_schema", …}`: the shape the reply must have,
    /// enforced by a grammar (read by [`crate::structured`]).
    #[serde(default)]
    pub response_format: Option<Value>,
}

impl ChatCompletionRequest {
    /// The sampling fields.
    pub fn sampling(&self) -> SamplingFields {
        SamplingFields {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: self.logit_bias.clone(),
        }
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The model name; must be the served one when given.
    #[serde(default)]
    pub model: Option<String>,
    /// A string, a list of strings, a list of token ids, or a list of lists of token ids.
    pub prompt: Value,
    /// Stream the answer as server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub temperature: Option<f32>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub top_p: Option<f32>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub top_k: Option<i64>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub min_p: Option<f32>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub seed: Option<i64>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    /// See [`SamplingFields`].
    #[serde(default)]
    pub logit_bias: Option<Map<String, Value>>,
    /// Most tokens to generate (OpenAI's default for this endpoint is 16).
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Option<StopField>,
    /// Alternatives per token (0–20); `null` for no log-probabilities.
    #[serde(default)]
    pub logprobs: Option<u32>,
    /// Echo the prompt; not supported.
    #[serde(default)]
    pub echo: Option<bool>,
    /// Text after the completion; not supported.
    #[serde(default)]
    pub suffix: Option<String>,
    /// Number of choices per prompt; only 1 is supported.
    #[serde(default)]
    pub n: Option<u32>,
    /// Candidates to pick from; only 1 is supported.
    #[serde(default)]
    pub best_of: Option<u32>,
}

impl CompletionRequest {
    /// The sampling fields.
    pub fn sampling(&self) -> SamplingFields {
        SamplingFields {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: self.logit_bias.clone(),
        }
    }
}

/// One prompt of a completions request.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// Text, to be tokenized.
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

/// Reads `prompt` of a completions request: a string, a list of strings, a list of token ids,
/// or a list of lists of token ids.
pub fn parse_prompts(prompt: &Value) -> Result<Vec<PromptInput>, ApiError> {
    let bad = |msg: String| ApiError::invalid_param("prompt", msg);
    let ids = |items: &[Value], at: &str| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| {
                    bad(format!("`prompt{at}[{i}]` must be a token id (a non-negative integer), found {v}"))
                })
            })
            .collect()
    };
    let prompts = match prompt {
        Value::String(s) => vec![PromptInput::Text(s.clone())],
        Value::Array(items) if items.is_empty() => return Err(bad("`prompt` must not be empty".into())),
        Value::Array(items) => match &items[0] {
            Value::String(_) => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(PromptInput::Text(s.clone())),
                    other => Err(bad(format!("`prompt[{i}]` must be a string like the others, found {other}"))),
                })
                .collect::<Result<_, _>>()?,
            Value::Number(_) => vec![PromptInput::Tokens(ids(items, "")?)],
            Value::Array(_) => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::Array(inner) => Ok(PromptInput::Tokens(ids(inner, &format!("[{i}]"))?)),
                    other => Err(bad(format!("`prompt[{i}]` must be a list of token ids, found {other}"))),
                })
                .collect::<Result<_, _>>()?,
            other => return Err(bad(format!("`prompt` items must be strings or token ids, found {other}"))),
        },
        other => {
            return Err(bad(format!(
                "`prompt` must be a string, a list of strings or a list of token ids, found {other}"
            )))
        }
    };
    for (i, p) in prompts.iter().enumerate() {
        let empty = match p {
            PromptInput::Text(s) => s.is_empty(),
            PromptInput::Tokens(t) => t.is_empty(),
        };
        if empty {
            return Err(bad(format!("prompt {i} is empty")));
        }
    }
    Ok(prompts)
}

/// How tool calls in the reply are handled (`tool_choice`).
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// The model may call tools (the default when tools are given).
    Auto,
    /// Tool calls are not parsed; the reply is plain text.
    None,
    /// The client wants a call (`"required"`: one or more; a named function: one call of
    /// it), enforced by a grammar in the model's tool-call format ([`crate::structured`]).
    Required(Option<String>),
}

/// Checks `tools` (OpenAI function tools) and `tool_choice`; the message names the bad field.
pub fn validate_tools(tools: &[Value], choice: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let mut names: Vec<&str> = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let at = |field: &str| format!("tools[{i}]{field}");
        let Some(obj) = tool.as_object() else {
            return Err(ApiError::invalid_param(at(""), format!("tools[{i}] must be an object, found {tool}")));
        };
        match obj.get("type") {
            Some(Value::String(t)) if t == "function" => {}
            Some(other) => {
                return Err(ApiError::invalid_param(
                    at(".type"),
                    format!("tools[{i}].type must be \"function\", found {other}"),
                ))
            }
            None => return Err(ApiError::invalid_param(at(".type"), format!("tools[{i}].type is missing"))),
        }
        let Some(function) = obj.get("function").and_then(Value::as_object) else {
            return Err(ApiError::invalid_param(
                at(".function"),
                format!("tools[{i}].function must be an object with a name"),
            ));
        };
        let name = match function.get("name") {
            Some(Value::String(n)) => n.as_str(),
            Some(other) => {
                return Err(ApiError::invalid_param(
                    at(".function.name"),
                    format!("tools[{i}].function.name must be a string, found {other}"),
                ))
            }
            None => {
                return Err(ApiError::invalid_param(
                    at(".function.name"),
                    format!("tools[{i}].function.name is missing"),
                ))
            }
        };
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
        if !name_ok {
            return Err(ApiError::invalid_param(
                at(".function.name"),
                format!(
                    "tools[{i}].function.name {name:?} is invalid: use 1-64 letters, digits, underscores, dots or \
                     dashes"
                ),
            ));
        }
        if names.contains(&name) {
            return Err(ApiError::invalid_param(
                at(".function.name"),
                format!("tools[{i}].function.name {name:?} is used by two tools"),
            ));
        }
        names.push(name);
        if let Some(d) = function.get("description") {
            if !d.is_string() && !d.is_null() {
                return Err(ApiError::invalid_param(
                    at(".function.description"),
                    format!("tools[{i}].function.description must be a string, found {d}"),
                ));
            }
        }
        if let Some(params) = function.get("parameters") {
            validate_parameters_schema(params).map_err(|msg| {
                ApiError::invalid_param(at(".function.parameters"), format!("tools[{i}].function.parameters: {msg}"))
            })?;
        }
    }
    let choice = match choice {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required(None),
            other => {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    format!("tool_choice must be \"auto\", \"none\", \"required\" or a function, found {other:?}"),
                ))
            }
        },
        Some(v @ Value::Object(o)) => {
            let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            match (o.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(name)) => {
                    if !names.contains(&name) {
                        return Err(ApiError::invalid_param(
                            "tool_choice",
                            format!("tool_choice names the function {name:?}, which is not among the tools"),
                        ));
                    }
                    ToolChoice::Required(Some(name.to_string()))
                }
                _ => {
                    return Err(ApiError::invalid_param(
                        "tool_choice",
                        format!(
                            "tool_choice must be {{\"type\": \"function\", \"function\": {{\"name\": …}}}}, found {v}"
                        ),
                    ))
                }
            }
        }
        Some(other) => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                format!("tool_choice must be a string or an object, found {other}"),
            ))
        }
    };
    if tools.is_empty() && matches!(choice, ToolChoice::Required(_)) {
        return Err(ApiError::invalid_param("tool_choice", "tool_choice asks for a tool call, but no tools are given"));
    }
    Ok(choice)
}

/// A function's `parameters` must be a JSON-schema object: `{"type": "object", "properties":
/// {name: schema, …}, "required": [names…]}` (every part optional except the object itself).
fn validate_parameters_schema(params: &Value) -> Result<(), String> {
    let Some(obj) = params.as_object() else {
        return Err(format!("must be a JSON schema object, found {params}"));
    };
    if let Some(t) = obj.get("type") {
        if t.as_str() != Some("object") {
            return Err(format!("the top-level type must be \"object\", found {t}"));
        }
    }
    let properties = match obj.get("properties") {
        None => None,
        Some(Value::Object(p)) => Some(p),
        Some(other) => return Err(format!("`properties` must be an object, found {other}")),
    };
    if let Some(props) = properties {
        for (name, schema) in props {
            let Some(s) = schema.as_object() else {
                return Err(format!("property {name:?} must be a schema object, found {schema}"));
            };
            match s.get("type") {
                None | Some(Value::String(_)) => {}
                Some(Value::Array(ts)) if ts.iter().all(Value::is_string) => {}
                Some(other) => return Err(format!("property {name:?} has an invalid type {other}")),
            }
        }
    }
    match obj.get("required") {
        None => {}
        Some(Value::Array(req)) => {
            for r in req {
                let Some(r) = r.as_str() else {
                    return Err(format!("`required` must list property names, found {r}"));
                };
                if properties.is_some_and(|p| !p.contains_key(r)) {
                    return Err(format!("`required` names {r:?}, which is not among the properties"));
                }
            }
        }
        Some(other) => return Err(format!("`required` must be a list of names, found {other}")),
    }
    Ok(())
}

/// `POST /tokenize`: either `prompt` text or chat `messages` (rendered with the template).
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    /// The model name; must be the served one when given.
    #[serde(default)]
    pub model: Option<String>,
    /// Text to tokenize.
    #[serde(default)]
    pub prompt: Option<String>,
    /// Add the tokenizer's special tokens (BOS) to `prompt`; default true.
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    /// A conversation to render with the chat template and tokenize.
    #[serde(default)]
    pub messages: Option<Vec<Message>>,
    /// Tools for the template.
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// End the rendering with the assistant prompt; default true.
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// Extra chat-template variables.
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    /// The model name; must be the served one when given.
    #[serde(default)]
    pub model: Option<String>,
    /// Token ids.
    pub tokens: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wrong_type_names_the_field() {
        let err = parse_body::<ChatCompletionRequest>(br#"{"messages": [], "temperature": "hot"}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("temperature"));
        assert!(err.message.contains("invalid type"), "{}", err.message);
    }

    #[test]
    fn malformed_json_is_reported() {
        let err = parse_body::<ChatCompletionRequest>(b"{\"messages\": [").unwrap_err();
        assert!(err.message.contains("not valid JSON"), "{}", err.message);
    }

    #[test]
    fn prompts_of_every_shape() {
        assert_eq!(parse_prompts(&json!("hi")).unwrap(), vec![PromptInput::Text("hi".into())]);
        assert_eq!(parse_prompts(&json!([1, 2])).unwrap(), vec![PromptInput::Tokens(vec![1, 2])]);
        assert_eq!(parse_prompts(&json!([[1], [2, 3]])).unwrap().len(), 2);
        assert!(parse_prompts(&json!([1, -2])).unwrap_err().message.contains("prompt[1]"));
        assert!(parse_prompts(&json!(5)).is_err());
        assert!(parse_prompts(&json!([])).is_err());
    }

    #[test]
    fn logit_bias_keys_and_values_are_checked() {
        let read = |v: Value| parse_logit_bias(v.as_object().unwrap(), 100);
        let mut ok = read(json!({"5": 100, "0": -100, "99": 0.5})).unwrap();
        ok.sort_by_key(|&(id, _)| id);
        assert_eq!(ok, vec![(0, -100.0), (5, 100.0), (99, 0.5)]);
        let e = read(json!({"frog": 1})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logit_bias"));
        assert!(e.message.contains("key \"frog\" is not a token id"), "{}", e.message);
        assert!(read(json!({"-3": 1})).unwrap_err().message.contains("\"-3\""));
        let e = read(json!({"100": 1})).unwrap_err();
        assert!(
            e.message.contains("key \"100\" is outside the vocabulary: token ids go from 0 to 99"),
            "{}",
            e.message
        );
        let e = read(json!({"7": 101})).unwrap_err();
        assert!(e.message.contains("logit_bias[\"7\"] must be a number from -100 to 100, found 101"), "{}", e.message);
        assert!(read(json!({"7": "high"})).unwrap_err().message.contains("\"high\""));
    }

    #[test]
    fn tool_schemas_are_checked() {
        let ok = json!({"type": "function", "function": {"name": "Bash", "parameters": {"type": "object",
            "properties": {"command": {"type": "string"}}, "required": ["command"]}}});
        assert_eq!(validate_tools(std::slice::from_ref(&ok), None).unwrap(), ToolChoice::Auto);
        let bad_name = json!({"type": "function", "function": {"name": "two words"}});
        assert!(validate_tools(&[bad_name], None).unwrap_err().message.contains("invalid"));
        let bad_required = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object",
            "properties": {}, "required": ["x"]}}});
        assert!(validate_tools(&[bad_required], None).unwrap_err().message.contains("\"x\""));
        let choice = json!({"type": "function", "function": {"name": "Nope"}});
        assert!(validate_tools(&[ok], Some(&choice)).is_err());
    }
}
