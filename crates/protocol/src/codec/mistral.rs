//! The Mistral tool-call format, in its two generations:
//!
//! * [`MistralStyle::JsonList`] (Mistral 7B v0.3, Nemo, Mixtral; tokenizer v3):
//!   `[TOOL_CALLS][{"name": "Read", "arguments": {"file_path": "a"}, "id": "abcdefghi"}]` —
//!   the template writes each call's `function` as `tojson` with the call's 9-character id;
//! * [`MistralStyle::ArgsTag`] (Mistral Small 3.2, Magistral, Devstral; tokenizer v11+):
//!   `[TOOL_CALLS]Read[ARGS]{"file_path": "a"}`, one `[TOOL_CALLS]` per call
//!   (`[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{…}` is read too).
//!
//! Both are parsed whichever style the template uses; the style only decides rendering.
//! Reasoning is `[THINK]…[/THINK]` (Magistral) or `<think>…</think>`. The model's call ids
//! are kept.

use serde_json::Value;

use super::json::{self, Item};
use super::scan::{Body, CallSyntax, Scanner};
use super::{
    name_arguments_json, parse_arguments_object, python_json, shorten, CodecError, ReplyParser, ToolCallFormat,
};
use crate::message::ToolCall;

/// How a Mistral template writes calls (parsing reads both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MistralStyle {
    /// `[TOOL_CALLS][{"name": …, "arguments": {…}, "id": …}]`.
    #[default]
    JsonList,
    /// `[TOOL_CALLS]NAME[ARGS]{…}` per call.
    ArgsTag,
}

/// The Mistral format (`[TOOL_CALLS]…`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MistralJson {
    /// How calls are rendered.
    pub style: MistralStyle,
}

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

impl ToolCallFormat for MistralJson {
    fn name(&self) -> &'static str {
        "mistral"
    }

    fn stream_parser(&self, thinking_prompted: bool, tools: &[Value]) -> Box<dyn ReplyParser> {
        Box::new(Scanner::new(MistralSyntax, thinking_prompted, tools))
    }

    /// Renders as the style's template does. A [`MistralStyle::JsonList`] call carries its id
    /// when it is Mistral's kind (9 letters and digits); templates refuse others.
    fn render_tool_calls(&self, calls: &[ToolCall]) -> Result<String, CodecError> {
        if calls.is_empty() {
            return Ok(String::new());
        }
        let mut items = Vec::with_capacity(calls.len());
        for call in calls {
            items.push(match self.style {
                MistralStyle::ArgsTag => {
                    let args = Value::Object(parse_arguments_object(&call.function.name, &call.function.arguments)?);
                    format!("{TOOL_CALLS}{}{ARGS}{}", call.function.name, python_json(&args))
                }
                MistralStyle::JsonList => {
                    name_arguments_json(call, Some(call.id.as_str()).filter(|id| is_mistral_id(id)))?
                }
            });
        }
        Ok(match self.style {
            MistralStyle::ArgsTag => items.concat(),
            MistralStyle::JsonList => format!("{TOOL_CALLS}[{}]", items.join(", ")),
        })
    }

    fn content_separator(&self) -> &'static str {
        ""
    }

    fn call_syntax(&self) -> &'static str {
        match self.style {
            MistralStyle::JsonList => "[TOOL_CALLS][{\"name\": \"NAME\", \"arguments\": {\"KEY\": \"VALUE\"}}]",
            MistralStyle::ArgsTag => "[TOOL_CALLS]NAME[ARGS]{\"KEY\": \"VALUE\"}",
        }
    }
}

/// Whether `id` is a Mistral call id (9 ASCII letters and digits).
fn is_mistral_id(id: &str) -> bool {
    id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

#[derive(Debug, Clone, Copy)]
struct MistralSyntax;

impl CallSyntax for MistralSyntax {
    fn openers(&self) -> &'static [&'static str] {
        &[TOOL_CALLS]
    }

    fn think_markers(&self) -> &'static [(&'static str, &'static str)] {
        &[("[THINK]", "[/THINK]"), ("<think>", "</think>")]
    }

    fn body(&self, _which: usize, body: &str, end: bool, _tools: &[Value]) -> Body {
        let lead = body.len() - body.trim_start().len();
        let b = &body[lead..];
        let raw = |len: usize| format!("{TOOL_CALLS}{}", &body[..len]);
        let unterminated = || Body::Done {
            len: body.len(),
            calls: vec![json::bad(&raw(body.len()), CodecError::Unterminated(TOOL_CALLS.into()))],
        };
        if b.is_empty() {
            return if end { unterminated() } else { Body::More };
        }
        if b.starts_with(['[', '{']) {
            return match json::json_value_end(b) {
                Some(n) => Body::Done { len: lead + n, calls: json::native_calls(&b[..n], &raw(lead + n)) },
                None if end => unterminated(),
                None => Body::More,
            };
        }
        // NAME[ARGS]{…} or NAME[CALL_ID]ID[ARGS]{…}
        let name_end = b.find(|c: char| c == '[' || c == '{' || c.is_whitespace()).unwrap_or(b.len());
        let name = &b[..name_end];
        let mut rest = &b[name_end..];
        let mut id = None;
        if let Some(r) = rest.strip_prefix(CALL_ID) {
            let id_end = r.find(['[', '{']).unwrap_or(r.len());
            id = Some(r[..id_end].trim());
            rest = &r[id_end..];
        }
        let Some(args) = rest.strip_prefix(ARGS) else {
            let waiting = rest.len() < ARGS.len().max(CALL_ID.len())
                && (ARGS.starts_with(rest) || (id.is_none() && CALL_ID.starts_with(rest)));
            return match (waiting || rest.is_empty() && id.is_none(), end) {
                (true, false) => Body::More,
                (true, true) => unterminated(),
                (false, _) => {
                    let len = lead + name_end;
                    let why =
                        format!("expected NAME[ARGS]{{…}} after {TOOL_CALLS}, found {:?}", shorten(&b[..len - lead]));
                    Body::Done { len, calls: vec![json::bad(&raw(len), CodecError::BadSyntax(why))] }
                }
            };
        };
        let args_at = b.len() - args.len();
        let a = args.trim_start();
        let a_at = b.len() - a.len();
        let not_json = |len: usize| {
            let why = format!("{name}[ARGS] is not followed by a JSON object");
            Body::Done { len, calls: vec![json::bad(&raw(len), CodecError::BadSyntax(why))] }
        };
        if !a.is_empty() && !a.starts_with('{') {
            return not_json(lead + args_at);
        }
        match json::json_value_end(a) {
            Some(n) => {
                let len = lead + a_at + n;
                Body::Done { len, calls: vec![args_call(name, id, &a[..n], &raw(len))] }
            }
            None if end => Body::Done {
                len: body.len(),
                calls: vec![json::bad(&raw(body.len()), CodecError::Unterminated(format!("{name}{ARGS}")))],
            },
            None => Body::More,
        }
    }
}

/// The call `NAME[ARGS]{args}`.
fn args_call(name: &str, id: Option<&str>, args: &str, raw: &str) -> Item {
    if name.is_empty() {
        return json::bad(raw, CodecError::BadFunctionName(String::new()));
    }
    let args = match json::parse_lenient(args) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return json::bad(raw, CodecError::ArgumentsNotObject { name: name.into(), arguments: shorten(args) }),
        Err(error) => return json::bad(raw, CodecError::BadJson { error, text: shorten(args) }),
    };
    let mut call = ToolCall::new(name, Value::Object(args).to_string());
    if let Some(id) = id.filter(|i| !i.is_empty()) {
        call.id = id.to_string();
    }
    Ok(call)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::test_tools::{assert_split_invariant, calls, tool_schemas};
    use serde_json::json;

    const LIST: &str = "Checking.[TOOL_CALLS][{\"name\": \"Read\", \"arguments\": {\"file_path\": \"hello.txt\"}, \"id\": \"abcDEF123\"}, {\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}, \"id\": \"xyz987ABC\"}]";
    const ARGS_TAG: &str = "Checking.[TOOL_CALLS]Read[ARGS]{\"file_path\": \"hello.txt\"}[TOOL_CALLS]Bash[CALL_ID]xyz987ABC[ARGS]{\"command\": \"ls\"}";

    #[test]
    fn both_styles_parse_at_every_split_and_round_trip() {
        let want = vec![("Read".into(), json!({"file_path": "hello.txt"})), ("Bash".into(), json!({"command": "ls"}))];
        for (text, style) in [(LIST, MistralStyle::JsonList), (ARGS_TAG, MistralStyle::ArgsTag)] {
            let format = MistralJson { style };
            let p = assert_split_invariant(&format, text, false, &tool_schemas());
            assert_eq!(calls(&p), want, "{text}");
            assert_eq!(p.content, "Checking.");
            let full = format.parse_reply(text, false, &tool_schemas());
            assert_eq!(full.tool_calls[1].id, "xyz987ABC");
            let rendered = format.render_assistant_content(&full.content, &full.tool_calls).unwrap();
            if style == MistralStyle::JsonList {
                assert_eq!(rendered, text);
            } else {
                // This style does not write call ids.
                assert_eq!(rendered, text.replace("[CALL_ID]xyz987ABC", ""));
            }
            assert_eq!(calls(&format.parse_reply(&rendered, false, &tool_schemas())), want);
        }
    }

    #[test]
    fn thinking_markers_and_a_call_inside_them() {
        let text = "[THINK]I should read it.[TOOL_CALLS]Read[ARGS]{\"file_path\": \"a\"}[/THINK]Reading.";
        let p = assert_split_invariant(&MistralJson::default(), text, false, &tool_schemas());
        assert_eq!(p.reasoning.as_deref(), Some("I should read it."));
        assert_eq!(p.content, "Reading.");
        assert_eq!(calls(&p), vec![("Read".into(), json!({"file_path": "a"}))]);
    }

    #[test]
    fn a_malformed_call_keeps_the_others() {
        let text = "[TOOL_CALLS]Read now please[TOOL_CALLS]Glob[ARGS]{\"pattern\": \"*\"}[TOOL_CALLS]Bash[ARGS]{\"command\": }";
        let p = assert_split_invariant(&MistralJson::default(), text, false, &tool_schemas());
        assert_eq!(calls(&p), vec![("Glob".into(), json!({"pattern": "*"}))]);
        assert_eq!(p.malformed.len(), 2, "{:?}", p.malformed);
        assert!(matches!(p.malformed[0].error, CodecError::BadSyntax(_)));
        assert!(matches!(p.malformed[1].error, CodecError::BadJson { .. }));
        // The rest of the first bad call is text.
        assert_eq!(p.content, "now please");
        let p = assert_split_invariant(&MistralJson::default(), "[TOOL_CALLS][{\"name\": \"Read\"", false, &[]);
        assert_eq!(p.failed_call().unwrap().error, CodecError::Unterminated(TOOL_CALLS.into()));
    }

    #[test]
    fn fenced_json_is_recovered_here_too() {
        let text = "```json\n[{\"name\": \"Read\", \"arguments\": {\"file_path\": \"a\"}}]\n```";
        let p = assert_split_invariant(&MistralJson::default(), text, false, &tool_schemas());
        assert_eq!(calls(&p), vec![("Read".into(), json!({"file_path": "a"}))]);
    }
}
