//! The Hermes JSON tool-call format (Hermes 2/3 Pro, Qwen2.5, Qwen3 and most fine-tunes):
//!
//! ```text
//! {optional text}
//! <tool_call>
//! {"name": "Read", "arguments": {"file_path": "hello.txt"}}
//! </tool_call>
//! <tool_call>
//! …
//! </tool_call>
//! ```
//!
//! The chat template renders each call as `\n<tool_call>\n{"name": "NAME", "arguments": ` +
//! the arguments as `tojson` + `}\n</tool_call>` after the content; [`HermesJson`] renders
//! the same. Parsing shares the `<tool_call>` tag reading with [`QwenXml`](super::QwenXml):
//! a body is read as JSON, or as Qwen XML when it starts with `<function=` (a model that
//! mixes the two still gets its call), also inside a markdown fence; a block the model did
//! not close is ended by the next `<tool_call>`, or by the end of the reply when what was
//! written already parses.
//!
//! This module also describes tools in the Hermes form for chat templates that ignore them
//! ([`inline_tools`]).

use serde_json::Value;

use super::json::{self, Item};
use super::scan::{Body, CallSyntax, Scanner};
use super::{parse_arguments_object, python_json, qwen_xml, shorten, CodecError, ReplyParser, ToolCallFormat};
use crate::message::{Message, MessageContent, ToolCall};

/// The Hermes format (`<tool_call>{"name": …, "arguments": {…}}</tool_call>`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HermesJson;

impl ToolCallFormat for HermesJson {
    fn name(&self) -> &'static str {
        "hermes"
    }

    fn stream_parser(&self, thinking_prompted: bool, tools: &[Value]) -> Box<dyn ReplyParser> {
        Box::new(Scanner::new(ToolCallTags { xml: false }, thinking_prompted, tools))
    }

    fn render_tool_calls(&self, calls: &[ToolCall]) -> Result<String, CodecError> {
        let mut out = Vec::with_capacity(calls.len());
        for call in calls {
            let args = parse_arguments_object(&call.function.name, &call.function.arguments)?;
            out.push(format!(
                "{CALL_OPEN}\n{{\"name\": \"{}\", \"arguments\": {}}}\n{CALL_CLOSE}",
                call.function.name,
                python_json(&Value::Object(args))
            ));
        }
        Ok(out.join("\n"))
    }

    fn content_separator(&self) -> &'static str {
        "\n"
    }

    fn call_syntax(&self) -> &'static str {
        "<tool_call>\n{\"name\": \"NAME\", \"arguments\": {\"KEY\": \"VALUE\"}}\n</tool_call>"
    }
}

pub(crate) const CALL_OPEN: &str = "<tool_call>";
pub(crate) const CALL_CLOSE: &str = "</tool_call>";

/// Calls in `<tool_call>` … `</tool_call>` blocks, as Hermes and Qwen XML write them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ToolCallTags {
    /// The format is Qwen XML: a body that is neither XML nor JSON is reported as a missing
    /// `<function=NAME>` (else as bad JSON).
    pub(crate) xml: bool,
}

impl CallSyntax for ToolCallTags {
    fn openers(&self) -> &'static [&'static str] {
        &[CALL_OPEN]
    }

    fn body(&self, _which: usize, body: &str, end: bool, tools: &[Value]) -> Body {
        let (close, reopen) = call_tags(body);
        match (close, reopen.filter(|r| close.is_none_or(|c| *r < c))) {
            (Some(c), None) => {
                let len = c + CALL_CLOSE.len();
                let raw = format!("{CALL_OPEN}{}", &body[..len]);
                Body::Done { len, calls: self.parse(&body[..c], &raw, tools) }
            }
            // A block left open and followed by the next one, or the reply's end: the call
            // counts if what was written of it parses.
            (_, Some(r)) => Body::Done { len: r, calls: self.unclosed(&body[..r], tools) },
            (None, None) if end => Body::Done { len: body.len(), calls: self.unclosed(body, tools) },
            (None, None) => Body::More,
        }
    }
}

impl ToolCallTags {
    /// The calls of the text between the tags.
    fn parse(&self, inner: &str, raw: &str, tools: &[Value]) -> Vec<Item> {
        let text = strip_fence(inner.trim());
        if text.starts_with("<function=") {
            vec![qwen_xml::parse_call_body(text, tools).map_err(|e| super::MalformedCall { text: raw.into(), error: e })]
        } else if text.starts_with(['{', '[']) {
            json::native_calls(text, raw)
        } else if self.xml {
            vec![json::bad(raw, CodecError::MissingFunction(shorten(inner)))]
        } else {
            vec![json::bad(raw, CodecError::BadJson { error: "expected a JSON object".into(), text: shorten(inner) })]
        }
    }

    /// A block without its closing tag.
    fn unclosed(&self, inner: &str, tools: &[Value]) -> Vec<Item> {
        let raw = format!("{CALL_OPEN}{inner}");
        let calls = self.parse(inner, &raw, tools);
        if calls.iter().any(Result::is_err) {
            vec![json::bad(&raw, CodecError::UnterminatedToolCall)]
        } else {
            calls
        }
    }
}

/// Where the first `</tool_call>` and the first `<tool_call>` of a call body are, leaving out
/// those inside a string of a JSON body (one that starts, after whitespace, with `{` or `[`):
/// a Hermes call whose argument mentions the tags (a file's text, a grep for them) is read
/// whole, as the grammar that made it allowed. Only the first tag found outside strings is
/// returned (the other `None`), which is all [`ToolCallTags::body`] needs. After the JSON
/// value closes, or once a raw newline shows that a string was not JSON (its strings cannot
/// hold one), the tags count wherever they are, as in any other body. Each answer depends
/// only on the text before the tag, so a streamed body decides as the whole one does.
fn call_tags(body: &str) -> (Option<usize>, Option<usize>) {
    let plain = |from: usize| {
        let at = |tag: &str| body.get(from..).and_then(|b| b.find(tag)).map(|i| from + i);
        (at(CALL_CLOSE), at(CALL_OPEN))
    };
    let start = body.len() - body.trim_start().len();
    if !body[start..].starts_with(['{', '[']) {
        return plain(0);
    }
    let bytes = body.as_bytes();
    let mut walk = json::JsonWalk::default();
    for (i, &b) in bytes.iter().enumerate().skip(start) {
        match walk.step(b) {
            json::JsonByte::InString if b == b'\n' => return plain(0),
            json::JsonByte::Closed => return plain(i + 1),
            json::JsonByte::Outside if b == b'<' => {
                if bytes[i..].starts_with(CALL_CLOSE.as_bytes()) {
                    return (Some(i), None);
                }
                if bytes[i..].starts_with(CALL_OPEN.as_bytes()) {
                    return (None, Some(i));
                }
            }
            _ => {}
        }
    }
    (None, None)
}

/// `text` without a markdown fence around it (```` ```json … ``` ````), if it has one.
fn strip_fence(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else { return text };
    let body = rest.split_once('\n').map_or("", |(_, b)| b);
    body.trim_end().strip_suffix("```").unwrap_or(body).trim()
}

/// The system-prompt block that describes `tools` in the Hermes form (the one Hermes and
/// Qwen2.5 templates write): the function schemas inside `<tools></tools>`, one JSON object
/// a line, and how to answer with `<tool_call>` JSON.
pub fn tools_system_prompt(tools: &[Value]) -> String {
    let mut out = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        out.push('\n');
        out.push_str(&python_json(tool));
    }
    out.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": \
         <args-json-object>}\n</tool_call>",
    );
    out
}

/// A conversation rewritten for a chat template that ignores tools: the tools described in
/// the Hermes form ([`tools_system_prompt`]) at the end of the first system message (or in a
/// new one), each assistant turn's calls written into its content as [`HermesJson`] renders
/// them, and each run of tool results made one user turn of
/// `<tool_response>\n…\n</tool_response>` blocks, as Hermes templates write them. A call
/// whose arguments are not a JSON object is an error.
pub fn inline_tools(messages: &[Message], tools: &[Value]) -> Result<Vec<Message>, CodecError> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    let mut rest = messages;
    if !tools.is_empty() {
        let block = tools_system_prompt(tools);
        match messages.first() {
            Some(first) if first.role == "system" => {
                let text = first.text();
                let merged = if text.trim().is_empty() { block } else { format!("{}\n\n{block}", text.trim_end()) };
                out.push(Message { content: Some(MessageContent::Text(merged)), ..first.clone() });
                rest = &messages[1..];
            }
            _ => out.push(Message::system(block)),
        }
    }
    // Index in `out` of the user turn holding the current run of tool results.
    let mut results_turn: Option<usize> = None;
    for m in rest {
        if m.role == "tool" {
            let block = format!("<tool_response>\n{}\n</tool_response>", m.text());
            match results_turn {
                Some(i) => {
                    let joined = format!("{}\n{block}", out[i].text());
                    out[i].content = Some(MessageContent::Text(joined));
                }
                None => {
                    results_turn = Some(out.len());
                    out.push(Message::user(block));
                }
            }
            continue;
        }
        results_turn = None;
        if m.role == "assistant" && !m.calls().is_empty() {
            let content = HermesJson.render_assistant_content(&m.text(), m.calls())?;
            out.push(Message { content: Some(MessageContent::Text(content)), tool_calls: None, ..m.clone() });
        } else {
            out.push(m.clone());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::test_tools::{assert_split_invariant, tool_schemas};
    use crate::codec::{MalformedCall, ParsedReply};
    use serde_json::json;

    fn args(call: &ToolCall) -> Value {
        serde_json::from_str(&call.function.arguments).unwrap()
    }

    fn calls(p: &ParsedReply) -> Vec<(String, Value)> {
        p.tool_calls.iter().map(|c| (c.function.name.clone(), args(c))).collect()
    }

    /// What Qwen2.5-Coder writes: text, then two calls, the second after a newline.
    const GOLDEN: &str = "I will read the file first.\n<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"hello.txt\", \"limit\": 20}}\n</tool_call>\n<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls -la\\n\", \"timeout\": 30}}\n</tool_call>";

    #[test]
    fn golden_reply_batch_equals_every_split() {
        let p = assert_split_invariant(&HermesJson, GOLDEN, false, &tool_schemas());
        assert_eq!(p.content, "I will read the file first.");
        assert_eq!(
            calls(&p),
            vec![
                ("Read".into(), json!({"file_path": "hello.txt", "limit": 20})),
                ("Bash".into(), json!({"command": "ls -la\n", "timeout": 30}))
            ]
        );
        assert!(p.malformed.is_empty() && p.reasoning.is_none());
        // Without tools only the markers count, and the reply parses the same.
        assert_eq!(assert_split_invariant(&HermesJson, GOLDEN, false, &[]), p);
    }

    #[test]
    fn renders_what_the_template_writes_and_parses_it_back() {
        let p = HermesJson.parse_reply(GOLDEN, false, &tool_schemas());
        let text = HermesJson.render_assistant_content(&p.content, &p.tool_calls).unwrap();
        assert_eq!(text, GOLDEN);
        let back = HermesJson.parse_reply(&text, false, &tool_schemas());
        assert_eq!(calls(&back), calls(&p));
    }

    #[test]
    fn thinking_and_a_call_inside_the_thinking_block() {
        let text = "<think>\nI need the file.\n<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"a\"}}\n</tool_call>\nthen done\n</think>\n\nReading it.";
        let p = assert_split_invariant(&HermesJson, text, false, &tool_schemas());
        assert_eq!(p.reasoning.as_deref(), Some("I need the file.\n\nthen done"));
        assert_eq!(p.content, "Reading it.");
        assert_eq!(calls(&p), vec![("Read".into(), json!({"file_path": "a"}))]);
        // The prompt opened the block (Qwen3 with enable_thinking).
        let p = assert_split_invariant(&HermesJson, &text["<think>\n".len()..], true, &tool_schemas());
        assert_eq!(p.reasoning.as_deref(), Some("I need the file.\n\nthen done"));
        assert_eq!(calls(&p).len(), 1);
    }

    /// A JSON string may mention the call tags (a file written, a grep for them): the call is
    /// read whole, whatever pieces it streams in. A tag outside the JSON still ends it.
    #[test]
    fn call_tags_inside_json_strings_are_text() {
        let content = "<tool_call>\n{\"name\": \"x\"}\n</tool_call>\n";
        let call = json!({"name": "Write", "arguments": {"file_path": "t.txt", "content": content}});
        let text = format!("Saving.\n<tool_call>\n{call}\n</tool_call>\nDone.");
        let p = assert_split_invariant(&HermesJson, &text, false, &tool_schemas());
        assert_eq!(calls(&p), vec![("Write".into(), call["arguments"].clone())]);
        assert_eq!((p.content.as_str(), p.malformed.len()), ("Saving.\nDone.", 0));
        // A string broken by a raw newline is not JSON: the first tag ends the body, as before.
        let broken = "<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"a\n</tool_call>\nafter";
        let p = assert_split_invariant(&HermesJson, broken, false, &tool_schemas());
        assert_eq!((p.tool_calls.len(), p.malformed.len(), p.content.as_str()), (0, 1, "after"));
        // A body left open before the next call's tag, and a tag after the JSON's end.
        let reopened = "<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"a\"}}\n<tool_call>\n{\"name\": \"Glob\", \"arguments\": {\"pattern\": \"*\"}}\n</tool_call>";
        let p = assert_split_invariant(&HermesJson, reopened, false, &tool_schemas());
        assert_eq!(p.tool_calls.len(), 2, "{p:?}");
    }

    #[test]
    fn one_malformed_call_does_not_discard_the_others() {
        let text = "<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"a\",, }\n</tool_call>\n<tool_call>\n{\"name\": \"Glob\", \"arguments\": {\"pattern\": \"*.py\"}}\n</tool_call>";
        let p = assert_split_invariant(&HermesJson, text, false, &tool_schemas());
        assert_eq!(calls(&p), vec![("Glob".into(), json!({"pattern": "*.py"}))]);
        assert_eq!(p.malformed.len(), 1);
        let MalformedCall { text: bad, error } = &p.malformed[0];
        assert!(bad.starts_with("<tool_call>\n{\"name\": \"Read\"") && bad.ends_with("</tool_call>"), "{bad}");
        assert!(matches!(error, CodecError::BadJson { .. }), "{error}");
        assert!(p.failed_call().is_none());
    }

    #[test]
    fn json_in_a_markdown_fence_is_a_call_only_for_offered_tools() {
        let text =
            "Let me look.\n```json\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"hello.txt\"}}\n```\nDone?";
        let p = assert_split_invariant(&HermesJson, text, false, &tool_schemas());
        assert_eq!(calls(&p), vec![("Read".into(), json!({"file_path": "hello.txt"}))]);
        assert_eq!(p.content, "Let me look.\nDone?");
        // No tools offered, or a tool that was not: the fence stays text.
        for tools in [vec![], vec![json!({"type": "function", "function": {"name": "Other"}})]] {
            let p = assert_split_invariant(&HermesJson, text, false, &tools);
            assert!(p.tool_calls.is_empty());
            assert_eq!(p.content, text);
        }
        // A fence of code is content, and so is JSON inside it.
        let code = "```python\nx = {\"name\": \"Read\", \"arguments\": {}}\n```\nok";
        let p = assert_split_invariant(&HermesJson, code, false, &tool_schemas());
        assert!(p.tool_calls.is_empty());
        assert_eq!(p.content, code);
    }

    #[test]
    fn bare_json_for_an_offered_tool_is_a_call() {
        let text = "{\"name\": \"Read\", \"arguments\": {\"file_path\": \"hello.txt\"}}";
        let p = assert_split_invariant(&HermesJson, text, false, &tool_schemas());
        assert_eq!(calls(&p), vec![("Read".into(), json!({"file_path": "hello.txt"}))]);
        assert_eq!(p.content, "");
        // Other JSON stays text, released whole.
        let other = "The config is {\"name\": \"frog\", \"size\": 3} and [1, 2].";
        let p = assert_split_invariant(&HermesJson, other, false, &tool_schemas());
        assert_eq!((p.content.as_str(), p.tool_calls.len()), (other, 0));
    }

    #[test]
    fn unclosed_blocks() {
        // The reply ended after the JSON: the call counts.
        let text = "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n";
        assert_eq!(calls(&assert_split_invariant(&HermesJson, text, false, &tool_schemas())).len(), 1);
        // An open block followed by the next one.
        let text = "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"command\": \"ls\"}}\n<tool_call>\n{\"name\": \"Glob\", \"arguments\": {\"pattern\": \"x\"}}\n</tool_call>";
        assert_eq!(calls(&assert_split_invariant(&HermesJson, text, false, &tool_schemas())).len(), 2);
        // Cut inside the JSON: malformed, nothing else lost.
        let text = "ok\n<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"comm";
        let p = assert_split_invariant(&HermesJson, text, false, &tool_schemas());
        assert_eq!(p.content, "ok");
        assert_eq!(p.malformed[0].error, CodecError::UnterminatedToolCall);
        assert_eq!(p.failed_call().unwrap().text, &text[3..]);
    }

    #[test]
    fn bodies_in_other_shapes() {
        // Qwen XML inside the tags, a fenced body, a JSON list, arguments as a string and
        // raw newlines in a string (a file's content).
        let text = "<tool_call>\n<function=Read>\n<parameter=limit>\n5\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n```json\n{\"name\": \"Glob\", \"arguments\": {\"pattern\": \"*\"}}\n```\n</tool_call>\n<tool_call>\n[{\"name\": \"Bash\", \"arguments\": \"{\\\"command\\\": \\\"ls\\\"}\"}, {\"name\": \"Write\", \"arguments\": {\"file_path\": \"a\", \"content\": \"x\ny\"}}]\n</tool_call>";
        let p = assert_split_invariant(&HermesJson, text, false, &tool_schemas());
        assert_eq!(
            calls(&p),
            vec![
                ("Read".into(), json!({"limit": 5})),
                ("Glob".into(), json!({"pattern": "*"})),
                ("Bash".into(), json!({"command": "ls"})),
                ("Write".into(), json!({"file_path": "a", "content": "x\ny"})),
            ]
        );
    }

    #[test]
    fn held_back_text_that_is_not_a_marker_comes_out() {
        let text = "a <tool_cal b ``not a fence`` {\"na c [ d";
        let p = assert_split_invariant(&HermesJson, text, false, &tool_schemas());
        assert_eq!(p.content, text);
        // While streaming, the possible marker waits; once it is not one, it is released.
        let mut parser = HermesJson.stream_parser(false, &tool_schemas());
        assert_eq!(parser.push("a <tool_c"), vec![crate::codec::StreamEvent::Content("a ".into())]);
        assert_eq!(parser.push("x"), vec![crate::codec::StreamEvent::Content("<tool_cx".into())]);
        assert!(parser.finish().is_empty());
    }

    #[test]
    fn tools_are_inlined_for_templates_without_tool_support() {
        let tools = tool_schemas();
        let call = ToolCall { id: "call_1".into(), ..ToolCall::new("Read", r#"{"file_path":"a"}"#) };
        let messages = vec![
            Message::system("Be brief."),
            Message::user("read a"),
            Message::assistant_reply(None, None, vec![call]),
            Message::tool("call_1", "1. hi"),
            Message::tool("call_2", "2. there"),
            Message::user("thanks"),
        ];
        let out = inline_tools(&messages, &tools).unwrap();
        assert_eq!(out.len(), 5);
        let system = out[0].text();
        assert!(system.starts_with("Be brief.\n\n# Tools\n"), "{system}");
        assert!(system.contains("\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"Read\""), "{system}");
        assert!(system
            .ends_with("<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"));
        assert_eq!(
            out[2].text(),
            "<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"a\"}}\n</tool_call>"
        );
        assert!(out[2].tool_calls.is_none());
        assert_eq!(
            (out[3].role.as_str(), out[3].text().as_ref()),
            ("user", "<tool_response>\n1. hi\n</tool_response>\n<tool_response>\n2. there\n</tool_response>")
        );
        assert_eq!(out[4], Message::user("thanks"));
        // No system message: one is added; no tools: only the turns are rewritten.
        assert_eq!(inline_tools(&messages[1..2], &tools).unwrap()[0].role, "system");
        assert_eq!(inline_tools(&messages[1..], &[]).unwrap().len(), 4);
        let bad = Message::assistant_reply(None, None, vec![ToolCall::new("Read", "[1]")]);
        assert!(matches!(inline_tools(&[bad], &[]), Err(CodecError::ArgumentsNotObject { .. })));
    }
}
