//! The Qwen XML tool-call format, what FrogNano's (and Qwen3.5's) models write.
//!
//! The model, after a thinking prompt (`<|im_start|>assistant\n<think>\n`), writes
//!
//! ```text
//! {reasoning}
//! </think>
//!
//! {optional text}
//!
//! <tool_call>
//! <function=NAME>
//! <parameter=KEY>
//! VALUE (raw, may span lines)
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! with zero or more calls separated by `\n`. Parsing splits such text into reasoning,
//! content and [`ToolCall`]s whose `arguments` is a JSON object string, each value typed by
//! the tool's JSON schema (strings stay raw; integer/number/boolean/object/array are parsed,
//! Python's `True`/`False` accepted; a value that does not parse as its declared type, or a
//! parameter the schema does not know, is kept as a string). Rendering goes the other way,
//! exactly as the Qwen3.5 chat template renders calls.
//!
//! The `<tool_call>` tags are read as for [`HermesJson`](super::HermesJson): a JSON body
//! inside them is read too, and a last call whose `</tool_call>` is missing counts if its
//! `</function>` is there (some servers treat `</tool_call>` as a stop string).

use serde_json::{Map, Value};

use super::hermes::ToolCallTags;
use super::scan::Scanner;
use super::{parse_arguments_object, python_json, shorten, CodecError, ReplyParser, ToolCallFormat};
use crate::message::ToolCall;

/// The Qwen XML format (`<tool_call><function=NAME><parameter=K>V</parameter>…`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QwenXml;

impl ToolCallFormat for QwenXml {
    fn name(&self) -> &'static str {
        "qwen_xml"
    }

    fn stream_parser(&self, thinking_prompted: bool, tools: &[Value]) -> Box<dyn ReplyParser> {
        Box::new(Scanner::new(ToolCallTags { xml: true }, thinking_prompted, tools))
    }

    fn render_tool_calls(&self, calls: &[ToolCall]) -> Result<String, CodecError> {
        render_tool_calls(calls)
    }

    fn call_syntax(&self) -> &'static str {
        "<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>"
    }
}

/// Parses what is between `<tool_call>` and `</tool_call>` (starting, after whitespace,
/// with `<function=`).
pub(crate) fn parse_call_body(body: &str, tools: &[Value]) -> Result<ToolCall, CodecError> {
    let rest = body.trim_start();
    let Some(after) = rest.strip_prefix("<function=") else {
        return Err(CodecError::MissingFunction(shorten(body)));
    };
    let Some(gt) = after.find('>') else {
        return Err(CodecError::BadFunctionName(shorten(after)));
    };
    let name = &after[..gt];
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(CodecError::BadFunctionName(name.to_string()));
    }
    let mut inner = &after[gt + 1..];
    let Some(end) = inner.rfind("</function>") else {
        return Err(CodecError::UnterminatedFunction(name.to_string()));
    };
    if !inner[end + "</function>".len()..].trim().is_empty() {
        return Err(CodecError::StrayText { function: name.to_string(), text: shorten(&inner[end..]) });
    }
    inner = &inner[..end];
    let schema = tool_properties(tools, name);
    let mut args = Map::new();
    loop {
        let trimmed = inner.trim_start();
        if trimmed.is_empty() {
            break;
        }
        let Some(p) = trimmed.strip_prefix("<parameter=") else {
            return Err(CodecError::StrayText { function: name.to_string(), text: shorten(trimmed) });
        };
        let Some(gt) = p.find('>') else {
            return Err(CodecError::BadParameter(name.to_string()));
        };
        let key = &p[..gt];
        if key.is_empty() || key.contains('\n') {
            return Err(CodecError::BadParameter(name.to_string()));
        }
        let after_tag = &p[gt + 1..];
        // A value ends at </parameter>; a missing one is tolerated up to the next parameter.
        let (raw, next) = match after_tag.find("</parameter>") {
            Some(e) => (&after_tag[..e], &after_tag[e + "</parameter>".len()..]),
            None => match after_tag.find("<parameter=") {
                Some(e) => (&after_tag[..e], &after_tag[e..]),
                None => (after_tag, ""),
            },
        };
        let value = raw.strip_prefix('\n').unwrap_or(raw);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let declared = schema.and_then(|s| s.get(key)).map(declared_type);
        args.insert(key.to_string(), typed_value(value, declared.as_deref()));
        inner = next;
    }
    Ok(ToolCall::new(name, Value::Object(args).to_string()))
}

fn tool_properties<'a>(tools: &'a [Value], name: &str) -> Option<&'a Map<String, Value>> {
    tools.iter().find_map(|t| {
        let f = t.get("function").unwrap_or(t);
        if f.get("name")?.as_str()? == name {
            f.get("parameters")?.get("properties")?.as_object()
        } else {
            None
        }
    })
}

/// The first non-null JSON-schema type of a property (`"string"` if none is declared).
fn declared_type(prop: &Value) -> String {
    match prop.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => {
            ts.iter().filter_map(Value::as_str).find(|t| *t != "null").unwrap_or("string").to_string()
        }
        _ => "string".to_string(),
    }
}

fn typed_value(raw: &str, declared: Option<&str>) -> Value {
    let as_string = || Value::String(raw.to_string());
    let t = raw.trim();
    match declared {
        Some("integer") => t.parse::<i64>().map(Value::from).unwrap_or_else(|_| as_string()),
        Some("number") => match serde_json::from_str::<Value>(t) {
            Ok(v @ Value::Number(_)) => v,
            _ => as_string(),
        },
        Some("boolean") => match t {
            "true" | "True" => Value::Bool(true),
            "false" | "False" => Value::Bool(false),
            _ => as_string(),
        },
        Some("object") | Some("array") => match serde_json::from_str::<Value>(t) {
            Ok(v @ (Value::Object(_) | Value::Array(_))) => v,
            _ => as_string(),
        },
        Some("null") if t == "null" || t == "None" => Value::Null,
        _ => as_string(),
    }
}

/// Renders tool calls as the chat template does: each as `<tool_call>\n<function=NAME>\n`,
/// one `<parameter=K>\nV\n</parameter>\n` per argument, `</function>\n</tool_call>`,
/// joined by `\n`. Arguments must be a JSON object string.
fn render_tool_calls(calls: &[ToolCall]) -> Result<String, CodecError> {
    let mut out = String::new();
    for (i, call) in calls.iter().enumerate() {
        let args = parse_arguments_object(&call.function.name, &call.function.arguments)?;
        if i > 0 {
            out.push('\n');
        }
        out.push_str("<tool_call>\n<function=");
        out.push_str(&call.function.name);
        out.push_str(">\n");
        for (k, v) in &args {
            out.push_str("<parameter=");
            out.push_str(k);
            out.push_str(">\n");
            out.push_str(&template_value(v));
            out.push_str("\n</parameter>\n");
        }
        out.push_str("</function>\n</tool_call>");
    }
    Ok(out)
}

/// A value as the jinja template prints it: strings raw, containers as Python `json.dumps`,
/// scalars as Python `str` (`True`, `False`, `None`).
fn template_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Null => "None".into(),
        Value::Number(n) => n.to_string(),
        Value::Object(_) | Value::Array(_) => python_json(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::test_tools::{assert_split_invariant, normalized, tool_schemas};
    use crate::codec::StreamEvent;
    use serde_json::json;

    fn args(call: &ToolCall) -> Value {
        serde_json::from_str(&call.function.arguments).unwrap()
    }

    const REPLY: &str = "I should look at the file.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=Read>\n<parameter=file_path>\nsrc/lib.rs\n</parameter>\n<parameter=offset>\n10\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=Bash>\n<parameter=command>\ncargo test\necho done\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>";

    #[test]
    fn parses_reasoning_content_and_typed_parallel_calls() {
        let p = QwenXml.parse_reply(REPLY, true, &tool_schemas());
        assert_eq!(p.reasoning.as_deref(), Some("I should look at the file."));
        assert_eq!(p.content, "Let me check.");
        assert_eq!(p.tool_calls.len(), 2);
        assert_eq!(p.tool_calls[0].function.name, "Read");
        assert_eq!(args(&p.tool_calls[0]), json!({"file_path": "src/lib.rs", "offset": 10}));
        assert_eq!(p.tool_calls[1].function.arguments, r#"{"command":"cargo test\necho done","timeout":30}"#);
        assert!(p.tool_calls[0].id.starts_with("call_"));
        assert_ne!(p.tool_calls[0].id, p.tool_calls[1].id);
    }

    #[test]
    fn renders_back_to_the_template_text() {
        let p = QwenXml.parse_reply(REPLY, true, &tool_schemas());
        let text = QwenXml.render_assistant_content(&p.content, &p.tool_calls).unwrap();
        assert_eq!(text, REPLY.split_once("</think>\n\n").unwrap().1);
    }

    #[test]
    fn booleans_objects_and_unknown_parameters() {
        let text = "<tool_call>\n<function=Edit>\n<parameter=file_path>\na.py\n</parameter>\n<parameter=old_string>\n  x = 1\n\n</parameter>\n<parameter=new_string>\n</parameter>\n<parameter=replace_all>\nTrue\n</parameter>\n<parameter=extra>\n[1, 2]\n</parameter>\n</function>\n</tool_call>";
        let p = QwenXml.parse_reply(text, false, &tool_schemas());
        assert_eq!(p.reasoning, None);
        assert_eq!(p.content, "");
        assert_eq!(
            args(&p.tool_calls[0]),
            json!({"file_path": "a.py", "old_string": "  x = 1\n", "new_string": "", "replace_all": true, "extra": "[1, 2]"})
        );
        // Rendering prints Python's True, like the template.
        assert!(QwenXml
            .render_tool_calls(&p.tool_calls)
            .unwrap()
            .contains("<parameter=replace_all>\nTrue\n</parameter>"));
    }

    #[test]
    fn a_value_that_does_not_fit_its_type_stays_a_string() {
        let text = "<tool_call>\n<function=Read>\n<parameter=file_path>\na\n</parameter>\n<parameter=limit>\nten\n</parameter>\n</function>\n</tool_call>";
        let p = QwenXml.parse_reply(text, false, &tool_schemas());
        assert_eq!(args(&p.tool_calls[0]), json!({"file_path": "a", "limit": "ten"}));
    }

    #[test]
    fn no_tool_call_is_a_plain_answer() {
        let p = QwenXml.parse_reply("Done.\n</think>\n\nThe bug is fixed.", true, &[]);
        assert_eq!(p.reasoning.as_deref(), Some("Done."));
        assert_eq!(p.content, "The bug is fixed.");
        assert!(p.tool_calls.is_empty());
        let p = QwenXml.parse_reply("<think>\nhm\n</think>\n\nok", false, &[]);
        assert_eq!((p.reasoning.as_deref(), p.content.as_str()), (Some("hm"), "ok"));
    }

    #[test]
    fn missing_close_tool_call_at_the_end_is_accepted() {
        let text = "<tool_call>\n<function=Glob>\n<parameter=pattern>\n**/*.rs\n</parameter>\n</function>\n";
        let p = QwenXml.parse_reply(text, false, &tool_schemas());
        assert_eq!(args(&p.tool_calls[0]), json!({"pattern": "**/*.rs"}));
    }

    #[test]
    fn malformed_text_is_a_typed_error_and_the_rest_goes_on() {
        let cases = [
            ("<tool_call>\n<function=Read>\n<parameter=file_path>\na", CodecError::UnterminatedToolCall),
            ("<tool_call>\nread the file\n</tool_call>", CodecError::MissingFunction("read the file".into())),
            ("<tool_call>\n<function=>\n</function>\n</tool_call>", CodecError::BadFunctionName("".into())),
            (
                "<tool_call>\n<function=Read>\n<parameter=a>\nb\n</parameter>\n</tool_call>",
                CodecError::UnterminatedFunction("Read".into()),
            ),
            (
                "<tool_call>\n<function=Read>\nhello\n</function>\n</tool_call>",
                CodecError::StrayText { function: "Read".into(), text: "hello".into() },
            ),
            (
                "<tool_call>\n<function=Read>\n<parameter=a\n</function>\n</tool_call>",
                CodecError::BadParameter("Read".into()),
            ),
        ];
        let good = "\n<tool_call>\n<function=Glob>\n<parameter=pattern>\n*\n</parameter>\n</function>\n</tool_call>";
        for (text, want) in cases {
            let p = assert_split_invariant(&QwenXml, text, false, &tool_schemas());
            assert_eq!(p.failed_call().map(|m| (&m.text[..], &m.error)), Some((text, &want)), "{text}");
            // A good call after the broken one still counts (unless the broken one is
            // left open: then the good one is inside it).
            if want != CodecError::UnterminatedToolCall {
                let p = assert_split_invariant(&QwenXml, &format!("{text}{good}"), false, &tool_schemas());
                assert_eq!((p.tool_calls.len(), p.malformed.len()), (1, 1), "{text}");
                assert_eq!(p.tool_calls[0].function.name, "Glob");
            }
        }
        // A JSON body inside the tags is read as Hermes writes it.
        let p = QwenXml.parse_reply("<tool_call>\n{\"name\": \"Read\"}\n</tool_call>", false, &tool_schemas());
        assert_eq!(
            (p.tool_calls[0].function.name.as_str(), p.tool_calls[0].function.arguments.as_str()),
            ("Read", "{}")
        );
    }

    #[test]
    fn non_object_arguments_cannot_be_rendered() {
        let call = ToolCall::new("Bash", "[1]");
        assert_eq!(
            QwenXml.render_tool_calls(&[call]).unwrap_err().to_string(),
            "arguments of Bash are not a JSON object: \"[1]\""
        );
    }

    #[test]
    fn streaming_at_every_split_gives_the_same_result() {
        let p = assert_split_invariant(&QwenXml, REPLY, true, &tool_schemas());
        assert_eq!(p, normalized(QwenXml.parse_reply(REPLY, true, &tool_schemas())));
        assert_eq!(p.reasoning.as_deref(), Some("I should look at the file."));
        assert_eq!(p.tool_calls.len(), 2);
        for chunk in [1, 2, 3, 7] {
            let chars: Vec<char> = REPLY.chars().collect();
            let mut parser = QwenXml.stream_parser(true, &tool_schemas());
            let mut events = Vec::new();
            for piece in chars.chunks(chunk) {
                events.extend(parser.push(&piece.iter().collect::<String>()));
            }
            events.extend(parser.finish());
            // No event may leak part of a tag.
            assert!(events.iter().all(|e| match e {
                StreamEvent::Reasoning(t) | StreamEvent::Content(t) => !t.contains('<') && !t.contains('>'),
                StreamEvent::ToolCall(_) | StreamEvent::Malformed(_) => true,
            }));
        }
    }

    #[test]
    fn a_call_inside_the_thinking_block_counts() {
        let text = "Let me read it first.\n<tool_call>\n<function=Read>\n<parameter=file_path>\na.py\n</parameter>\n</function>\n</tool_call>\nNow I know.\n</think>\n\nDone.";
        let p = assert_split_invariant(&QwenXml, text, true, &tool_schemas());
        assert_eq!(p.reasoning.as_deref(), Some("Let me read it first.\n\nNow I know."));
        assert_eq!(p.content, "Done.");
        assert_eq!(args(&p.tool_calls[0]), json!({"file_path": "a.py"}));
    }
}
