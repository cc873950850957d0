//! Tool-call codec: the text a model writes for its tool calls ⇄ OpenAI `tool_calls` (what
//! clients speak). Shared by the in-process engine backend, the agent and `frognano-serve`.
//!
//! Each way of writing tool calls in model text is one [`ToolCallFormat`]. A format splits a
//! reply into reasoning, visible content and [`ToolCall`]s — incrementally, through the
//! [`ReplyParser`] it hands out, so that streaming and whole-reply parsing
//! ([`ToolCallFormat::parse_reply`], built on the same parser) always agree — and renders
//! calls back to text exactly as the model's chat template does. The format FrogNano's models
//! write is [`QwenXml`]; others plug in as further implementations of the trait.
//!
//! Malformed text is a [`CodecError`], never a panic.

mod qwen_xml;

pub use qwen_xml::{QwenXml, StreamParser};

use serde_json::{Map, Value};

use crate::message::ToolCall;

/// A way of writing tool calls (and reasoning) in model text.
pub trait ToolCallFormat: std::fmt::Debug + Send + Sync {
    /// A short name for logs and errors (`qwen_xml`).
    fn name(&self) -> &'static str;

    /// A parser for one reply. `thinking_prompted`: the prompt ended inside an open
    /// `<think>` block, so the reply starts with reasoning. `tools`: the OpenAI tool list,
    /// used where the format needs schemas to type argument values.
    fn stream_parser(&self, thinking_prompted: bool, tools: &[Value]) -> Box<dyn ReplyParser>;

    /// Renders tool calls as the chat template writes them in an assistant turn. Arguments
    /// must be a JSON object string.
    fn render_tool_calls(&self, calls: &[ToolCall]) -> Result<String, CodecError>;

    /// Parses one complete reply (see [`stream_parser`](Self::stream_parser) for the
    /// arguments): the parser fed the whole text at once.
    fn parse_reply(&self, text: &str, thinking_prompted: bool, tools: &[Value]) -> Result<ParsedReply, CodecError> {
        let mut parser = self.stream_parser(thinking_prompted, tools);
        let mut events = parser.push(text)?;
        events.extend(parser.finish()?);
        Ok(ParsedReply::from_events(events))
    }

    /// Renders an assistant turn's visible part: content, then (after `\n\n` if content is
    /// non-empty) its tool calls.
    fn render_assistant_content(&self, content: &str, calls: &[ToolCall]) -> Result<String, CodecError> {
        let content = content.trim();
        let calls_text = self.render_tool_calls(calls)?;
        Ok(match (content.is_empty(), calls.is_empty()) {
            (_, true) => content.to_string(),
            (true, false) => calls_text,
            (false, false) => format!("{content}\n\n{calls_text}"),
        })
    }
}

/// An incremental reply parser: feed text deltas with [`push`](Self::push), get reasoning and
/// content deltas as soon as they cannot be the start of a tag, and each tool call once it is
/// complete; [`finish`](Self::finish) flushes the rest.
pub trait ReplyParser: std::fmt::Debug + Send {
    /// Feeds a delta; returns the events it completes.
    fn push(&mut self, delta: &str) -> Result<Vec<StreamEvent>, CodecError>;
    /// Ends the reply; returns the remaining events, or an error if a tool call is left open.
    fn finish(&mut self) -> Result<Vec<StreamEvent>, CodecError>;
}

/// A piece of a reply, as produced by a [`ReplyParser`].
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// More reasoning text.
    Reasoning(String),
    /// More visible text.
    Content(String),
    /// A complete tool call.
    ToolCall(ToolCall),
}

/// A model reply split into its parts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedReply {
    /// The thinking text, trimmed; `None` if there was none.
    pub reasoning: Option<String>,
    /// Visible text outside the tool calls, trimmed.
    pub content: String,
    /// The tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
}

impl ParsedReply {
    /// Joins a reply's events (reasoning and content concatenated and trimmed, calls in order).
    pub fn from_events(events: impl IntoIterator<Item = StreamEvent>) -> Self {
        let mut reasoning: Option<String> = None;
        let mut content = String::new();
        let mut tool_calls = Vec::new();
        for event in events {
            match event {
                StreamEvent::Reasoning(r) => reasoning.get_or_insert_with(String::new).push_str(&r),
                StreamEvent::Content(c) => content.push_str(&c),
                StreamEvent::ToolCall(call) => tool_calls.push(call),
            }
        }
        ParsedReply {
            reasoning: reasoning.map(|r| r.trim().to_string()),
            content: content.trim().to_string(),
            tool_calls,
        }
    }
}

/// Malformed tool-call text or arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// `<tool_call>` opened but never closed (often: the reply was cut).
    #[error("unterminated <tool_call> (no </tool_call> or </function>)")]
    UnterminatedToolCall,
    /// A `<tool_call>` block without a `<function=NAME>` line.
    #[error("<tool_call> without <function=NAME>: {0:?}")]
    MissingFunction(String),
    /// `<function=` with an empty name or one containing spaces/newlines.
    #[error("bad function name {0:?}")]
    BadFunctionName(String),
    /// `<function=NAME>` not closed by `</function>`.
    #[error("<function={0}> is not closed by </function>")]
    UnterminatedFunction(String),
    /// A `<parameter=` tag that is not closed by `>` or has an empty name.
    #[error("malformed <parameter=...> tag in function {0}")]
    BadParameter(String),
    /// Text inside `<function>` that is not a parameter.
    #[error("unexpected text inside <function={function}>: {text:?}")]
    StrayText {
        /// The function the text was found in.
        function: String,
        /// The text itself (shortened).
        text: String,
    },
    /// OpenAI `arguments` that are not a JSON object.
    #[error("arguments of {name} are not a JSON object: {arguments:?}")]
    ArgumentsNotObject {
        /// Tool name.
        name: String,
        /// The offending arguments string.
        arguments: String,
    },
}

/// Parses an OpenAI `arguments` string into an object (blank reads as `{}`); anything else
/// is an error.
pub fn parse_arguments_object(name: &str, arguments: &str) -> Result<Map<String, Value>, CodecError> {
    if arguments.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(CodecError::ArgumentsNotObject { name: name.to_string(), arguments: shorten(arguments) }),
    }
}

/// JSON with Python's default separators (`", "` and `": "`), non-ASCII kept.
pub fn python_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let items: Vec<String> =
                m.iter().map(|(k, v)| format!("{}: {}", Value::String(k.clone()), python_json(v))).collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(python_json).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// `s` trimmed and cut to 80 characters, for error messages.
fn shorten(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
pub(crate) mod test_tools {
    use serde_json::{json, Value};

    /// The five Leaf tools' names and parameter types (the agent crate owns the full
    /// schemas; the codec only reads `properties.*.type`).
    pub fn tool_schemas() -> Vec<Value> {
        let tool = |name: &str, props: &[(&str, &str)]| {
            let properties: serde_json::Map<String, Value> =
                props.iter().map(|(k, t)| (k.to_string(), json!({ "type": t }))).collect();
            json!({"type": "function", "function": {"name": name,
                "parameters": {"type": "object", "properties": properties}}})
        };
        vec![
            tool("Read", &[("file_path", "string"), ("offset", "integer"), ("limit", "integer")]),
            tool("Write", &[("file_path", "string"), ("content", "string")]),
            tool(
                "Edit",
                &[
                    ("file_path", "string"),
                    ("old_string", "string"),
                    ("new_string", "string"),
                    ("replace_all", "boolean"),
                ],
            ),
            tool("Glob", &[("pattern", "string"), ("path", "string")]),
            tool("Bash", &[("command", "string"), ("description", "string"), ("timeout", "number")]),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn python_json_uses_python_separators() {
        assert_eq!(python_json(&json!({"a": [1, "é"], "b": {"c": null}})), r#"{"a": [1, "é"], "b": {"c": null}}"#);
    }

    #[test]
    fn arguments_must_be_an_object() {
        assert_eq!(parse_arguments_object("Bash", " ").unwrap(), Map::new());
        assert_eq!(parse_arguments_object("Bash", r#"{"a": 1}"#).unwrap()["a"], json!(1));
        assert_eq!(
            parse_arguments_object("Bash", "[1]").unwrap_err().to_string(),
            "arguments of Bash are not a JSON object: \"[1]\""
        );
    }
}
