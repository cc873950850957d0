//! The `<|tool_call|>` format of IBM Granite 3.x and Microsoft Phi-4-mini: the marker, then a
//! JSON list of calls, `<|tool_call|>[{"name": "Read", "arguments": {"file_path": "a"}}]`
//! (Phi-4-mini closes it with `<|/tool_call|>`, which is read and dropped). Granite's template
//! tells the model to "respond only with <|tool_call|> followed by a JSON list of tools used";
//! it does not write calls into the history, so they are rendered in that same form.

use serde_json::Value;

use super::json;
use super::scan::{Body, CallSyntax, Scanner};
use super::{name_arguments_json, CodecError, ReplyParser, ToolCallFormat};
use crate::message::ToolCall;

/// The `<|tool_call|>[…]` format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraniteJson;

const TOOL_CALL: &str = "<|tool_call|>";
const CLOSE: &str = "<|/tool_call|>";

impl ToolCallFormat for GraniteJson {
    fn name(&self) -> &'static str {
        "granite"
    }

    fn stream_parser(&self, thinking_prompted: bool, tools: &[Value]) -> Box<dyn ReplyParser> {
        Box::new(Scanner::new(GraniteSyntax, thinking_prompted, tools))
    }

    fn render_tool_calls(&self, calls: &[ToolCall]) -> Result<String, CodecError> {
        if calls.is_empty() {
            return Ok(String::new());
        }
        let items = calls.iter().map(|c| name_arguments_json(c, None)).collect::<Result<Vec<_>, _>>()?;
        Ok(format!("{TOOL_CALL}[{}]", items.join(", ")))
    }

    fn content_separator(&self) -> &'static str {
        ""
    }

    fn call_syntax(&self) -> &'static str {
        "<|tool_call|>[{\"name\": \"NAME\", \"arguments\": {\"KEY\": \"VALUE\"}}]"
    }
}

#[derive(Debug, Clone, Copy)]
struct GraniteSyntax;

impl CallSyntax for GraniteSyntax {
    fn openers(&self) -> &'static [&'static str] {
        &[TOOL_CALL]
    }

    fn body(&self, _which: usize, body: &str, end: bool, _tools: &[Value]) -> Body {
        let lead = body.len() - body.trim_start().len();
        let b = &body[lead..];
        let raw = |len: usize| format!("{TOOL_CALL}{}", &body[..len]);
        let unterminated = || Body::Done {
            len: body.len(),
            calls: vec![json::bad(&raw(body.len()), CodecError::Unterminated(TOOL_CALL.into()))],
        };
        if b.is_empty() {
            return if end { unterminated() } else { Body::More };
        }
        if !b.starts_with(['[', '{']) {
            let len = lead;
            let why = format!("expected a JSON list of calls after {TOOL_CALL}");
            return Body::Done { len, calls: vec![json::bad(&raw(len), CodecError::BadSyntax(why))] };
        }
        let Some(n) = json::json_value_end(b) else { return if end { unterminated() } else { Body::More } };
        // Phi-4-mini's closing marker belongs to the call; wait while the text could still be it.
        let after = &b[n..];
        let gap = after.len() - after.trim_start().len();
        let rest = &after[gap..];
        let close = if rest.starts_with(CLOSE) {
            gap + CLOSE.len()
        } else if !end && CLOSE.starts_with(rest) {
            return Body::More;
        } else {
            0
        };
        let len = lead + n + close;
        Body::Done { len, calls: json::native_calls(&b[..n], &raw(len)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::test_tools::{assert_split_invariant, calls, tool_schemas};
    use serde_json::json;

    #[test]
    fn granite_and_phi4_calls_parse_at_every_split_and_round_trip() {
        let want = vec![("Read".into(), json!({"file_path": "hello.txt"})), ("Bash".into(), json!({"command": "ls"}))];
        let granite = "<|tool_call|>[{\"name\": \"Read\", \"arguments\": {\"file_path\": \"hello.txt\"}}, {\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}]";
        let phi4 = format!("Reading it.{}<|/tool_call|>", granite.replace("}}, {", "}},{"));
        for text in [granite, phi4.as_str()] {
            let p = assert_split_invariant(&GraniteJson, text, false, &tool_schemas());
            assert_eq!(calls(&p), want, "{text}");
            assert!(p.malformed.is_empty(), "{:?}", p.malformed);
            assert!(!p.content.contains("<|/tool_call|>"), "{:?}", p.content);
        }
        assert_eq!(
            GraniteJson.render_tool_calls(&GraniteJson.parse_reply(granite, false, &[]).tool_calls).unwrap(),
            granite
        );
    }

    #[test]
    fn a_broken_list_is_malformed_and_says_why() {
        let p = assert_split_invariant(&GraniteJson, "<|tool_call|>[{\"name\": \"Read\"", false, &[]);
        assert_eq!(p.failed_call().unwrap().error, CodecError::Unterminated(TOOL_CALL.into()));
        let p = assert_split_invariant(&GraniteJson, "<|tool_call|> Read the file", false, &tool_schemas());
        assert!(matches!(p.failed_call().unwrap().error, CodecError::BadSyntax(_)));
    }
}
