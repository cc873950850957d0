//! The Llama 3.x JSON tool-call format (Llama 3.1, 3.2, 3.3 Instruct).
//!
//! With custom tools the model answers with the call as a bare JSON object, which the chat
//! template renders back as `{"name": "NAME", "parameters": ` + the arguments as `tojson` +
//! `}` (one call per turn in Meta's templates; several are written `; `-separated):
//!
//! ```text
//! {"name": "Read", "parameters": {"file_path": "hello.txt"}}
//! ```
//!
//! The model may put `<|python_tag|>` in front, and uses it for the built-in tools:
//! `<|python_tag|>brave_search.call(query="frogs")` (Python keyword arguments) or plain
//! code for the code interpreter, which is read as a call of `python` with `{"code": …}`.
//!
//! A bare JSON call counts for any tool name here (that is this format's own syntax), but
//! as everywhere only when tools were offered: without tools, JSON is just JSON.

use serde_json::{Map, Value};

use super::json;
use super::scan::{Body, CallSyntax, Scanner};
use super::{parse_arguments_object, python_json, shorten, CodecError, ReplyParser, ToolCallFormat};
use crate::message::ToolCall;

/// The Llama 3 format (`{"name": …, "parameters": {…}}`, `<|python_tag|>`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Llama3Json;

const PYTHON_TAG: &str = "<|python_tag|>";

impl ToolCallFormat for Llama3Json {
    fn name(&self) -> &'static str {
        "llama3_json"
    }

    fn stream_parser(&self, thinking_prompted: bool, tools: &[Value]) -> Box<dyn ReplyParser> {
        Box::new(Scanner::new(Llama3Syntax, thinking_prompted, tools))
    }

    fn render_tool_calls(&self, calls: &[ToolCall]) -> Result<String, CodecError> {
        let mut out = Vec::with_capacity(calls.len());
        for call in calls {
            let args = parse_arguments_object(&call.function.name, &call.function.arguments)?;
            out.push(format!(
                "{{\"name\": \"{}\", \"parameters\": {}}}",
                call.function.name,
                python_json(&Value::Object(args))
            ));
        }
        Ok(out.join("; "))
    }

    fn call_syntax(&self) -> &'static str {
        "{\"name\": \"NAME\", \"parameters\": {\"KEY\": \"VALUE\"}}"
    }
}

#[derive(Debug, Clone, Copy)]
struct Llama3Syntax;

impl CallSyntax for Llama3Syntax {
    fn openers(&self) -> &'static [&'static str] {
        &[PYTHON_TAG]
    }

    fn body(&self, _which: usize, body: &str, end: bool, _tools: &[Value]) -> Body {
        let lead = body.len() - body.trim_start().len();
        let b = &body[lead..];
        let raw = |len: usize| format!("{PYTHON_TAG}{}", &body[..len]);
        if b.is_empty() {
            return if end {
                Body::Done {
                    len: body.len(),
                    calls: vec![json::bad(&raw(body.len()), CodecError::NotACall(String::new()))],
                }
            } else {
                Body::More
            };
        }
        if b.starts_with(['{', '[']) {
            return match json::json_value_end(b) {
                Some(n) => Body::Done { len: lead + n, calls: json::native_calls(&b[..n], &raw(lead + n)) },
                None if end => Body::Done {
                    len: body.len(),
                    calls: vec![json::bad(&raw(body.len()), CodecError::Unterminated(PYTHON_TAG.into()))],
                },
                None => Body::More,
            };
        }
        // A builtin call, `name.call(k=v, …)`, or code up to the end of the reply.
        let ident = b.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.')).unwrap_or(b.len());
        if ident == b.len() && !end {
            return Body::More;
        }
        if let Some(name) = b[..ident].strip_suffix(".call").filter(|n| !n.is_empty() && b[ident..].starts_with('(')) {
            return match closing_paren(&b[ident..]) {
                Some(close) => {
                    let len = lead + ident + close + 1;
                    let call = builtin_call(name, &b[ident + 1..ident + close]);
                    Body::Done { len, calls: vec![call.map_err(|e| super::MalformedCall { text: raw(len), error: e })] }
                }
                None if end => Body::Done {
                    len: body.len(),
                    calls: vec![json::bad(&raw(body.len()), CodecError::Unterminated(format!("{name}.call(")))],
                },
                None => Body::More,
            };
        }
        if !end {
            return Body::More;
        }
        let mut args = Map::new();
        args.insert("code".into(), Value::String(b.trim_end().to_string()));
        Body::Done { len: body.len(), calls: vec![Ok(ToolCall::new("python", Value::Object(args).to_string()))] }
    }

    fn bare_json_any_name(&self) -> bool {
        true
    }
}

/// Offset of the `)` closing the `(` that `s` starts with, skipping quoted strings.
fn closing_paren(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if let Some(q) = quote {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                c if c == q => quote = None,
                _ => {}
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 && c == ')' {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// A builtin call's keyword arguments (`query="frogs", n=3`) as a call.
fn builtin_call(name: &str, args: &str) -> Result<ToolCall, CodecError> {
    let bad = |why: &str| CodecError::BadSyntax(format!("{name}.call({}): {why}", shorten(args)));
    let mut out = Map::new();
    let mut rest = args.trim();
    while !rest.is_empty() {
        let eq = rest.find('=').ok_or_else(|| bad("expected key=value"))?;
        let key = rest[..eq].trim();
        if key.is_empty() || !key.chars().all(|c| c.is_alphanumeric() || c == '_') {
            return Err(bad("bad keyword"));
        }
        let (value, used) = python_literal(rest[eq + 1..].trim_start()).ok_or_else(|| bad("bad value"))?;
        out.insert(key.to_string(), value);
        let after = rest[eq + 1..].trim_start();
        rest = after[used..].trim_start();
        rest = match rest.strip_prefix(',') {
            Some(r) => r.trim_start(),
            None if rest.is_empty() => rest,
            None => return Err(bad("expected , between arguments")),
        };
    }
    Ok(ToolCall::new(name, Value::Object(out).to_string()))
}

/// A Python literal at the start of `s` (string, number, `True`/`False`/`None`, or a JSON
/// list/dict) and the bytes it takes.
fn python_literal(s: &str) -> Option<(Value, usize)> {
    let first = s.chars().next()?;
    if first == '"' || first == '\'' {
        let mut out = String::new();
        let mut escaped = false;
        for (i, c) in s.char_indices().skip(1) {
            match c {
                _ if escaped => {
                    escaped = false;
                    out.push(match c {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        other => other,
                    });
                }
                '\\' => escaped = true,
                c if c == first => return Some((Value::String(out), i + 1)),
                c => out.push(c),
            }
        }
        return None;
    }
    if first == '[' || first == '{' {
        let end = json::json_value_end(s)?;
        return json::parse_lenient(&s[..end]).ok().map(|v| (v, end));
    }
    let end = s.find(|c: char| c == ',' || c.is_whitespace()).unwrap_or(s.len());
    let word = &s[..end];
    let value = match word {
        "True" | "true" => Value::Bool(true),
        "False" | "false" => Value::Bool(false),
        "None" | "null" => Value::Null,
        w => match serde_json::from_str::<Value>(w) {
            Ok(v @ Value::Number(_)) => v,
            _ => return None,
        },
    };
    Some((value, end))
}

/// Items of a `<|python_tag|>` body (for the tests of the module).
#[cfg(test)]
fn python_tag_items(text: &str) -> Vec<json::Item> {
    match Llama3Syntax.body(0, text, true, &[]) {
        Body::Done { calls, .. } => calls,
        Body::More => unreachable!("the end of the reply decides"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::test_tools::{assert_split_invariant, calls, tool_schemas};
    use serde_json::json;

    const GOLDEN: &str = "{\"name\": \"Read\", \"parameters\": {\"file_path\": \"hello.txt\"}}; {\"name\": \"Bash\", \"parameters\": {\"command\": \"ls\"}}";

    #[test]
    fn golden_reply_batch_equals_every_split_and_round_trips() {
        let p = assert_split_invariant(&Llama3Json, GOLDEN, false, &tool_schemas());
        assert_eq!(
            calls(&p),
            vec![("Read".into(), json!({"file_path": "hello.txt"})), ("Bash".into(), json!({"command": "ls"}))]
        );
        assert_eq!(p.content, "");
        assert_eq!(Llama3Json.render_tool_calls(&p.tool_calls).unwrap(), GOLDEN);
        // Without tools the JSON is an answer, not a call.
        let p = assert_split_invariant(&Llama3Json, GOLDEN, false, &[]);
        assert_eq!((p.tool_calls.len(), p.content.as_str()), (0, GOLDEN));
    }

    #[test]
    fn python_tag_text_before_and_any_tool_name() {
        let text = "Let me check that.\n<|python_tag|>{\"name\": \"lookup\", \"parameters\": {\"q\": 1}}";
        let p = assert_split_invariant(&Llama3Json, text, false, &tool_schemas());
        assert_eq!(p.content, "Let me check that.");
        assert_eq!(calls(&p), vec![("lookup".into(), json!({"q": 1}))]);
        // A JSON call on its own names any tool in this format.
        let p =
            assert_split_invariant(&Llama3Json, "{\"name\": \"lookup\", \"parameters\": {}}", false, &tool_schemas());
        assert_eq!(calls(&p), vec![("lookup".into(), json!({}))]);
    }

    #[test]
    fn builtin_calls_and_code() {
        let text = "<|python_tag|>brave_search.call(query=\"frogs (green)\", n=3, safe=True)";
        let p = assert_split_invariant(&Llama3Json, text, false, &tool_schemas());
        assert_eq!(calls(&p), vec![("brave_search".into(), json!({"query": "frogs (green)", "n": 3, "safe": true}))]);
        let p = assert_split_invariant(&Llama3Json, "<|python_tag|>print(1 + 1)\n", false, &tool_schemas());
        assert_eq!(calls(&p), vec![("python".into(), json!({"code": "print(1 + 1)"}))]);
        let items = python_tag_items("wolfram_alpha.call(query=)");
        assert!(matches!(&items[0], Err(m) if matches!(m.error, CodecError::BadSyntax(_))), "{items:?}");
    }

    #[test]
    fn malformed_and_cut_calls() {
        let text = "<|python_tag|>{\"name\": \"Read\", \"parameters\": [1]}; {\"name\": \"Glob\", \"parameters\": {\"pattern\": \"*\"}}";
        let p = assert_split_invariant(&Llama3Json, text, false, &tool_schemas());
        assert_eq!(calls(&p), vec![("Glob".into(), json!({"pattern": "*"}))]);
        assert!(matches!(p.malformed[0].error, CodecError::ArgumentsNotObject { .. }));
        let p =
            assert_split_invariant(&Llama3Json, "{\"name\": \"Read\", \"parameters\": {\"file", false, &tool_schemas());
        assert_eq!(p.failed_call().unwrap().error, CodecError::Unterminated("a JSON tool call".into()));
    }

    #[test]
    fn fenced_json_with_the_llama_keys() {
        let text = "```json\n{\"name\": \"Read\", \"parameters\": {\"file_path\": \"a\"}}\n```";
        let p = assert_split_invariant(&Llama3Json, text, false, &tool_schemas());
        assert_eq!(calls(&p), vec![("Read".into(), json!({"file_path": "a"}))]);
    }
}
