//! Tool-call codec: the text a model writes for its tool calls ⇄ OpenAI `tool_calls` (what
//! clients speak). Shared by the in-process engine backend, the agent and `frognano-serve`.
//!
//! Each way of writing tool calls in model text is one [`ToolCallFormat`], one file each:
//!
//! | format | name | the model writes | models |
//! |---|---|---|---|
//! | [`QwenXml`] | `qwen_xml` | `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>` | Qwen3.5, Qwen3-Coder, FrogNano |
//! | [`HermesJson`] | `hermes` | `<tool_call>\n{"name": NAME, "arguments": {…}}\n</tool_call>` | Qwen2.5, Qwen3, Hermes, most fine-tunes |
//! | [`Llama3Json`] | `llama3_json` | `{"name": NAME, "parameters": {…}}`, or after `<|python_tag|>` | Llama 3.1 – 3.3 |
//! | [`MistralJson`] | `mistral` | `[TOOL_CALLS][{"name": NAME, "arguments": {…}}]` or `[TOOL_CALLS]NAME[ARGS]{…}` | Mistral, Mixtral, Devstral |
//!
//! [`ToolParser`] names them (`--tool-parser NAME`) and picks one from a chat template's text
//! ([`ToolParser::detect`], the rules llama.cpp uses).
//!
//! A format splits a reply into reasoning, visible content and [`ToolCall`]s — incrementally,
//! through the [`ReplyParser`] it hands out, so that streaming and whole-reply parsing
//! ([`ToolCallFormat::parse_reply`] is the same parser fed everything) always agree — and
//! renders calls back to text exactly as the model's chat template does. Every parser shares
//! one scanner (`scan.rs`) and so the same tolerance for what models really write: text
//! before a call, several calls, a call inside the thinking block, and — when tools were
//! offered — a JSON call object for an offered tool in a markdown fence or on its own. Text
//! that may be the start of a marker is held back until it is known not to be one.
//!
//! A malformed call is reported as a [`MalformedCall`] (its text and a [`CodecError`]) next
//! to the calls that did parse, never a panic, and never a reason to drop the other calls.
//!
//! Models whose chat template ignores `tools` get the tools described in the Hermes form
//! ([`inline_tools`]) and answer in it.

mod detect;
mod granite;
mod hermes;
mod json;
mod llama3_json;
mod mistral;
mod qwen_xml;
mod scan;

pub use detect::{detect_format, ToolParser, UnknownToolParser};
pub use granite::GraniteJson;
pub use hermes::{inline_tools, tools_system_prompt, HermesJson};
pub use llama3_json::Llama3Json;
pub use mistral::{MistralJson, MistralStyle};
pub use qwen_xml::QwenXml;

use serde_json::{Map, Value};

use crate::message::ToolCall;

/// A way of writing tool calls (and reasoning) in model text.
pub trait ToolCallFormat: std::fmt::Debug + Send + Sync {
    /// The format's name, as `--tool-parser` takes it (`qwen_xml`, `hermes`, …).
    fn name(&self) -> &'static str;

    /// A parser for one reply. `thinking_prompted`: the prompt ended inside an open
    /// thinking block, so the reply starts with reasoning. `tools`: the OpenAI tool list,
    /// used to type argument values and to tell a JSON call object for an offered tool from
    /// other JSON (no tools: only the format's own call markers count).
    fn stream_parser(&self, thinking_prompted: bool, tools: &[Value]) -> Box<dyn ReplyParser>;

    /// Renders tool calls as the chat template writes them in an assistant turn. Arguments
    /// must be a JSON object string.
    fn render_tool_calls(&self, calls: &[ToolCall]) -> Result<String, CodecError>;

    /// What the chat template writes between an assistant turn's content and its first call.
    fn content_separator(&self) -> &'static str {
        "\n\n"
    }

    /// One call written correctly, with placeholders, for telling a model how to retry.
    fn call_syntax(&self) -> &'static str;

    /// Parses one complete reply (see [`stream_parser`](Self::stream_parser) for the
    /// arguments): the parser fed the whole text at once.
    fn parse_reply(&self, text: &str, thinking_prompted: bool, tools: &[Value]) -> ParsedReply {
        let mut parser = self.stream_parser(thinking_prompted, tools);
        let mut events = parser.push(text);
        events.extend(parser.finish());
        ParsedReply::from_events(events)
    }

    /// Renders an assistant turn's visible part: content, then (after
    /// [`content_separator`](Self::content_separator) if content is non-empty) its calls.
    fn render_assistant_content(&self, content: &str, calls: &[ToolCall]) -> Result<String, CodecError> {
        let content = content.trim();
        let calls_text = self.render_tool_calls(calls)?;
        Ok(match (content.is_empty(), calls.is_empty()) {
            (_, true) => content.to_string(),
            (true, false) => calls_text,
            (false, false) => format!("{content}{}{calls_text}", self.content_separator()),
        })
    }
}

/// An incremental reply parser: feed text deltas with [`push`](Self::push), get reasoning and
/// content deltas as soon as they cannot be the start of a marker, and each tool call once it
/// is complete; [`finish`](Self::finish) flushes the rest.
pub trait ReplyParser: std::fmt::Debug + Send {
    /// Feeds a delta; returns the events it completes.
    fn push(&mut self, delta: &str) -> Vec<StreamEvent>;
    /// Ends the reply; returns the remaining events (a call left open is reported as
    /// malformed unless what was written of it already parses).
    fn finish(&mut self) -> Vec<StreamEvent>;
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
    /// Text that was meant as a tool call but does not parse; the reply goes on after it.
    Malformed(MalformedCall),
}

/// A tool call that could not be read: its text as the model wrote it, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct MalformedCall {
    /// The call's text, markers included.
    pub text: String,
    /// What is wrong with it.
    pub error: CodecError,
}

/// A model reply split into its parts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedReply {
    /// The thinking text, trimmed; `None` if there was none.
    pub reasoning: Option<String>,
    /// Visible text outside the tool calls, trimmed.
    pub content: String,
    /// The tool calls that parsed, in order.
    pub tool_calls: Vec<ToolCall>,
    /// The calls that did not, in order.
    pub malformed: Vec<MalformedCall>,
}

impl ParsedReply {
    /// Joins a reply's events (reasoning and content concatenated and trimmed, calls in order).
    pub fn from_events(events: impl IntoIterator<Item = StreamEvent>) -> Self {
        let mut reasoning: Option<String> = None;
        let mut content = String::new();
        let mut tool_calls = Vec::new();
        let mut malformed = Vec::new();
        for event in events {
            match event {
                StreamEvent::Reasoning(r) => reasoning.get_or_insert_with(String::new).push_str(&r),
                StreamEvent::Content(c) => content.push_str(&c),
                StreamEvent::ToolCall(call) => tool_calls.push(call),
                StreamEvent::Malformed(m) => malformed.push(m),
            }
        }
        ParsedReply {
            reasoning: reasoning.map(|r| r.trim().to_string()),
            content: content.trim().to_string(),
            tool_calls,
            malformed,
        }
    }

    /// The error of the first malformed call when not a single call parsed: a reply that
    /// meant to call tools and failed at all of them (callers retry such replies).
    pub fn failed_call(&self) -> Option<&MalformedCall> {
        if self.tool_calls.is_empty() {
            self.malformed.first()
        } else {
            None
        }
    }
}

/// Malformed tool-call text or arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// `<tool_call>` opened but never closed (often: the reply was cut).
    #[error("unterminated <tool_call> (no </tool_call> or </function>)")]
    UnterminatedToolCall,
    /// A call opened by another marker (`[TOOL_CALLS]`, `<|python_tag|>`, a JSON object)
    /// that the reply ended inside.
    #[error("unterminated tool call after {0}")]
    Unterminated(String),
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
    /// A call written as JSON that is not valid JSON.
    #[error("tool call is not valid JSON ({error}): {text:?}")]
    BadJson {
        /// The JSON parser's message.
        error: String,
        /// The text (shortened).
        text: String,
    },
    /// JSON that is not a call object (one with a string `"name"`).
    #[error("expected a tool call object with a string \"name\", found {0:?}")]
    NotACall(String),
    /// A call in a format's own syntax that does not follow it (`[TOOL_CALLS]` without a
    /// name and `[ARGS]`, a builtin `name.call(…)` with bad arguments, …).
    #[error("malformed tool call: {0}")]
    BadSyntax(String),
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

/// A call as the JSON object `{"name": NAME, "arguments": {…}}` (Python separators), with
/// `"id": ID` last when given: what the Mistral and Granite templates write inside their call
/// lists. Its arguments must be an object.
fn name_arguments_json(call: &ToolCall, id: Option<&str>) -> Result<String, CodecError> {
    let args = Value::Object(parse_arguments_object(&call.function.name, &call.function.arguments)?);
    let name = Value::String(call.function.name.clone());
    Ok(match id {
        Some(id) => format!("{{\"name\": {name}, \"arguments\": {}, \"id\": \"{id}\"}}", python_json(&args)),
        None => format!("{{\"name\": {name}, \"arguments\": {}}}", python_json(&args)),
    })
}

/// JSON with Python's default separators (`", "` and `": "`), non-ASCII kept: what a chat
/// template's `tojson` writes.
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

    use super::{ParsedReply, ReplyParser, StreamEvent, ToolCallFormat};

    /// A reply's calls as (name, parsed arguments), for comparing with expected calls.
    pub fn calls(p: &ParsedReply) -> Vec<(String, Value)> {
        p.tool_calls
            .iter()
            .map(|c| (c.function.name.clone(), serde_json::from_str(&c.function.arguments).unwrap()))
            .collect()
    }

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

    /// The parts of a reply that do not depend on how it was split: the call ids are
    /// random, so they are blanked, and adjacent text events are merged.
    pub fn normalized(mut reply: ParsedReply) -> ParsedReply {
        for call in &mut reply.tool_calls {
            call.id.clear();
        }
        reply
    }

    /// The event sequence with adjacent text of one kind merged and call ids blanked.
    pub fn merged(events: Vec<StreamEvent>) -> Vec<StreamEvent> {
        let mut out: Vec<StreamEvent> = Vec::new();
        for e in events {
            match (out.last_mut(), e) {
                (Some(StreamEvent::Reasoning(a)), StreamEvent::Reasoning(b)) => a.push_str(&b),
                (Some(StreamEvent::Content(a)), StreamEvent::Content(b)) => a.push_str(&b),
                (_, StreamEvent::ToolCall(mut c)) => {
                    c.id.clear();
                    out.push(StreamEvent::ToolCall(c));
                }
                (_, e) => out.push(e),
            }
        }
        out
    }

    /// Events of `text` fed to a fresh parser in the pieces `cuts` (byte offsets) make.
    pub fn events_split(
        format: &dyn ToolCallFormat,
        text: &str,
        cuts: &[usize],
        thinking: bool,
        tools: &[Value],
    ) -> Vec<StreamEvent> {
        let mut parser: Box<dyn ReplyParser> = format.stream_parser(thinking, tools);
        let mut events = Vec::new();
        let mut at = 0;
        for &cut in cuts {
            events.extend(parser.push(&text[at..cut]));
            at = cut;
        }
        events.extend(parser.push(&text[at..]));
        events.extend(parser.finish());
        events
    }

    /// Checks that every way of splitting `text` in two (and one character at a time) gives
    /// the events of the whole text at once, and that no text event leaks a marker the
    /// whole-text parse treated as one. Returns the whole-text reply.
    pub fn assert_split_invariant(
        format: &dyn ToolCallFormat,
        text: &str,
        thinking: bool,
        tools: &[Value],
    ) -> ParsedReply {
        let whole = merged(events_split(format, text, &[], thinking, tools));
        for cut in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
            let split = merged(events_split(format, text, &[cut], thinking, tools));
            assert_eq!(split, whole, "{}: split at byte {cut} of {text:?}", format.name());
        }
        let every: Vec<usize> = (1..text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        let chars = merged(events_split(format, text, &every, thinking, tools));
        assert_eq!(chars, whole, "{}: fed one character at a time: {text:?}", format.name());
        normalized(ParsedReply::from_events(whole))
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

    #[test]
    fn random_marker_soup_never_panics_and_streams_as_it_parses_in_every_format() {
        use rand::{Rng, SeedableRng};
        use test_tools::{events_split, merged, tool_schemas};
        let pieces = [
            "<tool_call>",
            "</tool_call>",
            "<function=",
            "</function>",
            "<parameter=",
            "</parameter>",
            "<think>",
            "</think>",
            "[THINK]",
            "[/THINK]",
            "[TOOL_CALLS]",
            "[ARGS]",
            "[CALL_ID]",
            "<|python_tag|>",
            ".call(",
            ")",
            ">",
            "<",
            "\n",
            "Read",
            "file_path",
            "x",
            "é",
            " ",
            "1",
            "True",
            "{\"name\": \"Read\", \"arguments\": {",
            "{\"name\": \"Bash\", \"parameters\": {\"command\": \"ls\"}}",
            "\"",
            "}",
            "]",
            "```json\n",
            "```",
            "[",
            ";",
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for parser in [
            ToolParser::QwenXml,
            ToolParser::Hermes,
            ToolParser::Llama3Json,
            ToolParser::Mistral(MistralStyle::JsonList),
        ] {
            for _ in 0..1500 {
                let n = rng.random_range(0..24);
                let text: String = (0..n).map(|_| pieces[rng.random_range(0..pieces.len())]).collect();
                let thinking = rng.random_bool(0.5);
                let tools = if rng.random_bool(0.5) { tool_schemas() } else { vec![] };
                let whole = merged(events_split(&parser, &text, &[], thinking, &tools));
                let every: Vec<usize> = (1..text.len()).filter(|&i| text.is_char_boundary(i)).collect();
                let streamed = merged(events_split(&parser, &text, &every, thinking, &tools));
                assert_eq!(streamed, whole, "{parser}: {text:?}");
                let cut = every.get(rng.random_range(0..every.len().max(1))).copied().unwrap_or(0);
                let halves = merged(events_split(&parser, &text, &[cut], thinking, &tools));
                assert_eq!(halves, whole, "{parser}: split at {cut}: {text:?}");
            }
        }
    }

    #[test]
    fn a_reply_fails_only_when_no_call_parsed() {
        let bad = MalformedCall { text: "<tool_call>x".into(), error: CodecError::UnterminatedToolCall };
        let mut reply = ParsedReply { malformed: vec![bad.clone()], ..ParsedReply::default() };
        assert_eq!(reply.failed_call(), Some(&bad));
        reply.tool_calls.push(ToolCall::new("Bash", "{}"));
        assert_eq!(reply.failed_call(), None);
    }
}
