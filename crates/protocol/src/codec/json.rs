//! JSON call objects, shared by the JSON formats (Hermes, Llama 3, Mistral) and by the
//! recovery of JSON calls a model wrote outside its format's markers.
//!
//! A call object is `{"name": NAME, "arguments": {…}}`; `"parameters"` (Llama 3) is read as
//! `"arguments"`, arguments given as a JSON string are read as the object it encodes, an
//! OpenAI-shaped `{"type": "function", "function": {…}}` is read through its `function`, and
//! an `"id"` (Mistral writes one) is kept as the call id.
//!
//! Models get JSON slightly wrong in a few ways that cost users their calls; the lenient
//! reading repairs exactly those: raw newlines and tabs inside strings (multi-line file
//! contents), trailing commas, and Python's `True`/`False`/`None`.

use serde_json::{Map, Value};

use super::{shorten, CodecError, MalformedCall};
use crate::message::ToolCall;

/// One call a body held: parsed, or why not.
pub(crate) type Item = Result<ToolCall, MalformedCall>;

/// A malformed item.
pub(crate) fn bad(text: &str, error: CodecError) -> Item {
    Err(MalformedCall { text: text.to_string(), error })
}

/// Byte length of the JSON object or array `s` starts with, or `None` while it is not closed
/// yet. Strings (with their escapes) are skipped, so brackets inside them do not count; a
/// mismatched closing bracket still closes a level, so the end is found even in broken JSON.
pub(crate) fn json_value_end(s: &str) -> Option<usize> {
    if !s.starts_with(['{', '[']) {
        return None;
    }
    let mut walk = JsonWalk::default();
    s.bytes().position(|b| walk.step(b) == JsonByte::Closed).map(|i| i + 1)
}

/// A walk over JSON text a byte at a time that knows whether each byte is inside a string
/// (escapes included) and when the outermost object or array closes.
#[derive(Debug, Default)]
pub(crate) struct JsonWalk {
    depth: usize,
    in_string: bool,
    escaped: bool,
}

/// Where one byte of a [`JsonWalk`] falls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JsonByte {
    /// Inside a string (its closing quote included).
    InString,
    /// Between tokens, or a token outside strings.
    Outside,
    /// The bracket that closed the outermost value.
    Closed,
}

impl JsonWalk {
    /// Takes the next byte.
    pub(crate) fn step(&mut self, b: u8) -> JsonByte {
        if self.in_string {
            match (self.escaped, b) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => self.in_string = false,
                _ => {}
            }
            return JsonByte::InString;
        }
        match b {
            b'"' => self.in_string = true,
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    return JsonByte::Closed;
                }
            }
            _ => {}
        }
        JsonByte::Outside
    }
}

/// Parses JSON, repairing what models commonly get wrong (see the module docs) when the
/// strict parse fails; the error is the strict parser's.
pub(crate) fn parse_lenient(text: &str) -> Result<Value, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(v) => Ok(v),
        Err(e) => serde_json::from_str::<Value>(&repair(text)).map_err(|_| e.to_string()),
    }
}

/// `text` with control characters inside strings escaped, trailing commas dropped and
/// Python literals outside strings made JSON.
fn repair(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len() + 16);
    let mut in_string = false;
    let mut escaped = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if in_string {
            match c {
                _ if escaped => {
                    escaped = false;
                    out.push(c);
                }
                '\\' => {
                    escaped = true;
                    out.push(c);
                }
                '"' => {
                    in_string = false;
                    out.push(c);
                }
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
            i += 1;
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            ',' if chars[i + 1..].iter().find(|c| !c.is_whitespace()).is_some_and(|n| matches!(n, '}' | ']')) => {}
            c if c.is_ascii_alphabetic() && (i == 0 || !is_word(chars[i - 1])) => {
                let end = (i..chars.len()).find(|&j| !is_word(chars[j])).unwrap_or(chars.len());
                let word: String = chars[i..end].iter().collect();
                out.push_str(match word.as_str() {
                    "True" => "true",
                    "False" => "false",
                    "None" => "null",
                    other => other,
                });
                i = end;
                continue;
            }
            c => out.push(c),
        }
        i += 1;
    }
    out
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The JSON values of `text`: objects and arrays one after another, separated by
/// whitespace, `,` or `;` (models write several calls so).
pub(crate) fn parse_values(text: &str) -> Result<Vec<Value>, CodecError> {
    let mut values = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ',' || c == ';');
        if rest.is_empty() {
            return Ok(values);
        }
        let Some(end) = json_value_end(rest) else {
            return Err(CodecError::BadJson {
                error: if rest.starts_with(['{', '[']) { "not closed".into() } else { "expected an object".into() },
                text: shorten(rest),
            });
        };
        let value =
            parse_lenient(&rest[..end]).map_err(|error| CodecError::BadJson { error, text: shorten(&rest[..end]) })?;
        values.push(value);
        rest = &rest[end..];
    }
}

/// The values, with arrays flattened one level (`[{call}, {call}]`).
fn flatten(values: Vec<Value>) -> Vec<Value> {
    values
        .into_iter()
        .flat_map(|v| match v {
            Value::Array(items) => items,
            other => vec![other],
        })
        .collect()
}

/// The object holding a call's `name` and arguments: `v` itself, or its `function` object.
fn call_object(v: &Value) -> Option<&Map<String, Value>> {
    let obj = v.as_object()?;
    match obj.get("function") {
        Some(Value::Object(f)) if f.get("name").is_some_and(Value::is_string) => Some(f),
        _ => Some(obj),
    }
}

/// A call from a call-shaped value.
pub(crate) fn call_from_value(v: &Value) -> Result<ToolCall, CodecError> {
    let Some(obj) = call_object(v) else { return Err(CodecError::NotACall(shorten(&v.to_string()))) };
    let Some(name) = obj.get("name").and_then(Value::as_str) else {
        return Err(CodecError::NotACall(shorten(&v.to_string())));
    };
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(CodecError::BadFunctionName(name.to_string()));
    }
    let args = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(Value::String(s)) if s.trim().is_empty() => Map::new(),
        Some(Value::String(s)) => match parse_lenient(s) {
            Ok(Value::Object(m)) => m,
            _ => return Err(CodecError::ArgumentsNotObject { name: name.to_string(), arguments: shorten(s) }),
        },
        Some(other) => {
            return Err(CodecError::ArgumentsNotObject {
                name: name.to_string(),
                arguments: shorten(&other.to_string()),
            })
        }
    };
    let mut call = ToolCall::new(name, Value::Object(args).to_string());
    let id = v.get("id").or_else(|| obj.get("id")).and_then(Value::as_str).filter(|id| !id.trim().is_empty());
    if let Some(id) = id {
        call.id = id.to_string();
    }
    Ok(call)
}

/// The calls of JSON text inside a format's own call markers (any tool name counts).
/// `raw` is the whole call text, for the report of a body that is not JSON at all.
pub(crate) fn native_calls(text: &str, raw: &str) -> Vec<Item> {
    let values = match parse_values(text) {
        Ok(v) => flatten(v),
        Err(e) => return vec![bad(raw, e)],
    };
    if values.is_empty() {
        return vec![bad(raw, CodecError::NotACall(String::new()))];
    }
    let single = values.len() == 1;
    values
        .iter()
        .map(|v| call_from_value(v).map_err(|error| MalformedCall { text: item_text(single, raw, v), error }))
        .collect()
}

fn item_text(single: bool, raw: &str, v: &Value) -> String {
    if single {
        raw.to_string()
    } else {
        v.to_string()
    }
}

/// Whether `name` is one of the offered `tools`.
pub(crate) fn offered(tools: &[Value], name: &str) -> bool {
    tools.iter().any(|t| t.get("function").unwrap_or(t).get("name").and_then(Value::as_str) == Some(name))
}

/// What JSON found outside a format's markers turned out to be.
pub(crate) enum Recovered {
    /// Calls (some possibly malformed): the text is replaced by them.
    Calls(Vec<Item>),
    /// Not a call: the text stays content.
    NotACall,
}

/// Reads JSON a model wrote outside its call markers (in a markdown fence, or on its own)
/// as calls: every value must be a call object naming an offered tool (any tool with
/// `any_name`), with `arguments` or `parameters`, and not a tool description (no
/// `description`). Broken JSON naming an offered tool is a malformed call; anything else is
/// not a call.
pub(crate) fn recover(text: &str, tools: &[Value], any_name: bool) -> Recovered {
    let names_tool = |name: &str| any_name || offered(tools, name);
    let values = match parse_values(text) {
        Ok(v) => flatten(v),
        Err(e) => {
            return match peek_name(text) {
                Some(name) if names_tool(&name) => Recovered::Calls(vec![bad(text, e)]),
                _ => Recovered::NotACall,
            }
        }
    };
    let is_call = |v: &Value| {
        let Some(obj) = call_object(v) else { return false };
        let name = obj.get("name").and_then(Value::as_str);
        name.is_some_and(names_tool)
            && (obj.contains_key("arguments") || obj.contains_key("parameters"))
            && !obj.contains_key("description")
    };
    if values.is_empty() || !values.iter().all(is_call) {
        return Recovered::NotACall;
    }
    let single = values.len() == 1;
    Recovered::Calls(
        values
            .iter()
            .map(|v| call_from_value(v).map_err(|error| MalformedCall { text: item_text(single, text, v), error }))
            .collect(),
    )
}

/// The string after the first `"name":` in `text`, read without parsing the rest (for
/// broken JSON).
pub(crate) fn peek_name(text: &str) -> Option<String> {
    let at = text.find("\"name\"")?;
    let rest = text[at + 6..].trim_start().strip_prefix(':')?.trim_start().strip_prefix('"')?;
    let end = rest.find('"')?;
    Some(rest[..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn value_end_skips_strings_and_waits_for_the_close() {
        assert_eq!(json_value_end(r#"{"a": "}{", "b": [1, {"c": "\"}"}]} tail"#), Some(35));
        assert_eq!(json_value_end(r#"{"a": [1, 2"#), None);
        assert_eq!(json_value_end("[1]]"), Some(3));
        assert_eq!(json_value_end("x{}"), None);
    }

    #[test]
    fn lenient_json_repairs_what_models_get_wrong() {
        let text = "{\"content\": \"line 1\n\tline 2\", \"ok\": True, \"z\": None, \"l\": [1, 2,],}";
        assert_eq!(
            parse_lenient(text).unwrap(),
            json!({"content": "line 1\n\tline 2", "ok": true, "z": null, "l": [1, 2]})
        );
        // Words inside strings are left alone.
        assert_eq!(parse_lenient("{\"a\": \"True\nNone\",}").unwrap(), json!({"a": "True\nNone"}));
        assert!(parse_lenient("{\"a\": nope}").unwrap_err().contains("expected"));
    }

    #[test]
    fn call_objects_in_their_usual_shapes() {
        let read = |v: Value| {
            let c = call_from_value(&v).unwrap();
            (c.function.name, serde_json::from_str::<Value>(&c.function.arguments).unwrap())
        };
        assert_eq!(
            read(json!({"name": "Read", "arguments": {"file_path": "a"}})),
            ("Read".into(), json!({"file_path": "a"}))
        );
        assert_eq!(read(json!({"name": "Read", "parameters": {"limit": 2}})), ("Read".into(), json!({"limit": 2})));
        assert_eq!(read(json!({"name": "Read", "arguments": "{\"limit\": 2}"})), ("Read".into(), json!({"limit": 2})));
        assert_eq!(read(json!({"type": "function", "function": {"name": "Glob"}})), ("Glob".into(), json!({})));
        let c = call_from_value(&json!({"name": "Bash", "arguments": {}, "id": "abcDEF123"})).unwrap();
        assert_eq!(c.id, "abcDEF123");
        assert_eq!(
            call_from_value(&json!({"name": "Bash", "arguments": [1]})).unwrap_err(),
            CodecError::ArgumentsNotObject { name: "Bash".into(), arguments: "[1]".into() }
        );
        assert!(matches!(call_from_value(&json!({"tool": "Bash"})), Err(CodecError::NotACall(_))));
    }

    #[test]
    fn recovery_takes_only_calls_of_offered_tools() {
        let tools = vec![json!({"type": "function", "function": {"name": "Read"}})];
        let calls = |r: Recovered| match r {
            Recovered::Calls(items) => items.len(),
            Recovered::NotACall => 0,
        };
        assert_eq!(calls(recover(r#"{"name": "Read", "arguments": {"file_path": "a"}}"#, &tools, false)), 1);
        assert_eq!(calls(recover(r#"{"name": "Other", "arguments": {}}"#, &tools, false)), 0);
        assert_eq!(calls(recover(r#"{"name": "Other", "arguments": {}}"#, &tools, true)), 1);
        assert_eq!(calls(recover(r#"{"name": "Read", "description": "x", "parameters": {}}"#, &tools, false)), 0);
        assert_eq!(calls(recover(r#"{"name": "Read"}"#, &tools, false)), 0);
        assert_eq!(calls(recover(r#"{"name": "Bob", "age": 3}"#, &tools, false)), 0);
        // Broken JSON that names an offered tool is a malformed call, not text.
        match recover(r#"{"name": "Read", "arguments": {"file_path": "a" "x"}}"#, &tools, false) {
            Recovered::Calls(items) => {
                assert!(matches!(&items[0], Err(m) if matches!(m.error, CodecError::BadJson { .. })))
            }
            Recovered::NotACall => panic!("expected a malformed call"),
        }
    }
}
