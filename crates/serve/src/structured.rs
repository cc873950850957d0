//! Structured outputs: what a chat request's `response_format` and `tool_choice` require of
//! the reply, as a grammar the engine enforces token by token (`frognano_engine::constraint`).
//!
//! - `response_format: {"type": "text"}` (or none): free text.
//! - `{"type": "json_object"}`: the reply is one JSON object.
//! - `{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}`
//!   (OpenAI structured outputs, what `client.chat.completions.parse` sends): the reply is JSON
//!   valid under `schema`. The schema is enforced whether or not `strict` is set; a schema
//!   that cannot be enforced is a 400 naming `response_format.json_schema.schema`.
//! - `tool_choice: "required"`: one or more calls of the offered tools, and `{"type":
//!   "function", "function": {"name"}}`: one call of that tool — in the model's own tool-call
//!   format, arguments under each tool's `parameters` schema
//!   (`frognano_engine::tool_grammar`).
//!
//! `tool_choice: "auto"` and `"none"` constrain nothing (docs/structured.md §1, §5). A request asking for both a JSON
//! `response_format` and a forced tool call is refused: one reply cannot be both.

use frognano_engine::tool_grammar::{tool_call_grammar, CallRule};
use frognano_engine::{ConstraintError, Grammar, LazyConstraints};
use serde_json::Value;

use crate::api::ToolChoice;
use crate::error::ApiError;

/// What a request's `response_format` asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    /// Free text (`{"type": "text"}`, or no `response_format`).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON under a schema.
    JsonSchema {
        /// `json_schema.name`.
        name: String,
        /// `json_schema.schema`.
        schema: Value,
    },
}

/// Reads `response_format`; every mistake is a 400 naming the field.
pub fn parse_response_format(value: Option<&Value>) -> Result<ResponseFormat, ApiError> {
    let value = match value {
        None | Some(Value::Null) => return Ok(ResponseFormat::Text),
        Some(v) => v,
    };
    let Some(obj) = value.as_object() else {
        return Err(ApiError::invalid_param(
            "response_format",
            format!("response_format must be an object like {{\"type\": \"json_object\"}}, found {value}"),
        ));
    };
    match obj.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => parse_json_schema(obj.get("json_schema")),
        Some(other) => Err(ApiError::invalid_param(
            "response_format.type",
            format!("response_format.type must be \"text\", \"json_object\" or \"json_schema\", found {other:?}"),
        )),
        None => Err(ApiError::invalid_param(
            "response_format.type",
            "response_format.type is missing (\"text\", \"json_object\" or \"json_schema\")",
        )),
    }
}

fn parse_json_schema(value: Option<&Value>) -> Result<ResponseFormat, ApiError> {
    let param = "response_format.json_schema";
    let Some(obj) = value.and_then(Value::as_object) else {
        return Err(ApiError::invalid_param(
            param,
            "response_format.json_schema must be an object with `name` and `schema` when type is \"json_schema\"",
        ));
    };
    let name = match obj.get("name") {
        Some(Value::String(n)) => n.clone(),
        Some(other) => {
            return Err(ApiError::invalid_param(
                "response_format.json_schema.name",
                format!("response_format.json_schema.name must be a string, found {other}"),
            ))
        }
        None => {
            return Err(ApiError::invalid_param(
                "response_format.json_schema.name",
                "response_format.json_schema.name is missing",
            ))
        }
    };
    let name_ok =
        !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !name_ok {
        return Err(ApiError::invalid_param(
            "response_format.json_schema.name",
            format!(
                "response_format.json_schema.name {name:?} is invalid: use 1-64 letters, digits, underscores or dashes"
            ),
        ));
    }
    if let Some(strict) = obj.get("strict") {
        if !strict.is_boolean() && !strict.is_null() {
            return Err(ApiError::invalid_param(
                "response_format.json_schema.strict",
                format!("response_format.json_schema.strict must be true or false, found {strict}"),
            ));
        }
    }
    // OpenAI accepts a missing schema as "any JSON"; an object schema is what a client sends.
    let schema = match obj.get("schema") {
        None | Some(Value::Null) => serde_json::json!({}),
        Some(s @ Value::Object(_)) => s.clone(),
        Some(other) => {
            return Err(ApiError::invalid_param(
                "response_format.json_schema.schema",
                format!("response_format.json_schema.schema must be a JSON schema object, found {other}"),
            ))
        }
    };
    Ok(ResponseFormat::JsonSchema { name, schema })
}

/// The grammar a chat reply must follow, if any: from `response_format`, or from a forced
/// `tool_choice` written in `format` (the tool-call format the reply is parsed with).
/// `thinking_prompted`: the prompt ends inside an open `<think>` block. `constrain_auto`
/// (`frognano serve --constrain-tools`): a `tool_choice: "auto"` reply to a request with tools
/// is free text or well-formed calls of those tools (`CallRule::Optional`).
pub fn reply_grammar(
    response_format: &ResponseFormat,
    choice: &ToolChoice,
    format: &str,
    tools: &[Value],
    thinking_prompted: bool,
    constrain_auto: bool,
) -> Result<Option<(Grammar, &'static str)>, ApiError> {
    let forced = match choice {
        ToolChoice::Required(None) => Some(CallRule::Required),
        ToolChoice::Required(Some(name)) => Some(CallRule::Named(name.clone())),
        ToolChoice::Auto if constrain_auto && !tools.is_empty() && *response_format == ResponseFormat::Text => {
            let g = tool_call_grammar(format, tools, &CallRule::Optional, thinking_prompted)
                .map_err(|e| ApiError::invalid_param("tools", format!("tool calls cannot be constrained: {e}")))?;
            return Ok(Some((g, "tools")));
        }
        ToolChoice::Auto | ToolChoice::None => None,
    };
    match (response_format, forced) {
        (ResponseFormat::Text, None) => Ok(None),
        (ResponseFormat::Text, Some(rule)) => {
            let g = tool_call_grammar(format, tools, &rule, thinking_prompted)
                .map_err(|e| ApiError::invalid_param("tool_choice", format!("tool_choice cannot be enforced: {e}")))?;
            Ok(Some((g, "tool_choice")))
        }
        (_, Some(_)) => Err(ApiError::invalid_param(
            "response_format",
            "response_format asks for JSON and tool_choice for a tool call; one reply cannot be both",
        )),
        (ResponseFormat::JsonObject, None) => Ok(Some((Grammar::JsonObject, "response_format"))),
        (ResponseFormat::JsonSchema { schema, .. }, None) => {
            Ok(Some((Grammar::JsonSchema(schema.clone()), "response_format.json_schema.schema")))
        }
    }
}

/// The 400 for a grammar (from [`reply_grammar`]; `param` is the request field it came from)
/// that the served model's vocabulary could not take: a grammar llguidance refuses names
/// `param` with llguidance's reason; a model whose tokenizer cannot be constrained says so.
pub fn refusal(param: &str, e: ConstraintError) -> ApiError {
    match e {
        ConstraintError::Grammar(msg) => {
            ApiError::invalid_param(param, format!("{param} cannot be enforced: {}", reason(&msg)))
        }
        other => ApiError::invalid_param(param, format!("{param}: {other}")),
    }
}

/// Whether a grammar from `param` is a tool-call grammar, so that when llguidance refuses it
/// [`refused_tool`] can name the tool whose schema it refuses: the grammar is ours, the schema
/// is what the client can fix.
pub fn is_tool_call(param: &str) -> bool {
    matches!(param, "tool_choice" | "tools")
}

/// The first tool whose `parameters` schema llguidance refuses alone, as a 400 naming it
/// (`tools[i].function.parameters`).
pub fn refused_tool(constraints: &LazyConstraints, tools: &[Value]) -> Option<ApiError> {
    tools.iter().enumerate().find_map(|(i, tool)| {
        let function = tool.get("function").unwrap_or(tool);
        let schema = function.get("parameters").filter(|p| p.is_object())?;
        let Err(ConstraintError::Grammar(msg)) = constraints.compile(&Grammar::JsonSchema(schema.clone())) else {
            return None;
        };
        let name = function.get("name").and_then(Value::as_str).unwrap_or_default();
        let field = format!("tools[{i}].function.parameters");
        Some(ApiError::invalid_param(
            field.clone(),
            format!("{field} (tool {name:?}) cannot be enforced: {}", reason(&msg)),
        ))
    })
}

/// The tools with every `parameters` schema that llguidance refuses alone replaced by any
/// JSON object, and the names of those tools: what constrains an `auto` reply's calls
/// (`--constrain-tools`, the server's own choice) when a schema cannot be enforced, so that one
/// tool (Claude Code's `TaskCreate` uses `propertyNames`) does not fail the whole request.
/// The schemas are tried on the factory, not through [`LazyConstraints::compile`]'s few
/// recent grammars: an agent's many tools would push out the loosened grammar its every turn
/// reuses.
pub fn loosen_refused_tools(constraints: &LazyConstraints, tools: &[Value]) -> (Vec<Value>, Vec<String>) {
    let Ok(factory) = constraints.get() else { return (tools.to_vec(), Vec::new()) };
    let mut loosened = Vec::new();
    let tools = tools
        .iter()
        .map(|tool| {
            let Some(schema) = tool.pointer("/function/parameters").filter(|p| p.is_object()) else {
                return tool.clone();
            };
            if factory.compile(&Grammar::JsonSchema(schema.clone())).is_ok() {
                return tool.clone();
            }
            let mut loose = tool.clone();
            loose["function"]["parameters"] = serde_json::json!({"type": "object"});
            loosened.push(tool.pointer("/function/name").and_then(Value::as_str).unwrap_or_default().to_string());
            loose
        })
        .collect();
    (tools, loosened)
}

/// llguidance's reason without what only describes the grammar we built around the client's
/// schema: its position in that grammar (`at 6(12): `) and the lines it quotes from it
/// (`   4 | BLANK: …`), at most six lines.
fn reason(msg: &str) -> String {
    let lines: Vec<&str> = msg
        .lines()
        .filter(|l| !is_quoted_grammar(l))
        .map(|l| strip_position(l.trim_end()))
        .filter(|l| !l.trim().is_empty())
        .take(6)
        .collect();
    lines.join("\n")
}

/// `   4 | BLANK: …` or `     |   ^`: a line llguidance quotes from the grammar.
fn is_quoted_grammar(line: &str) -> bool {
    let t = line.trim_start();
    let digits = t.chars().take_while(char::is_ascii_digit).count();
    t[digits..].trim_start().starts_with('|')
}

/// `at 6(12): failed …` → `failed …`.
fn strip_position(line: &str) -> &str {
    let Some(rest) = line.strip_prefix("at ") else { return line };
    let Some((pos, tail)) = rest.split_once(": ") else { return line };
    let (row, col) = pos.split_once('(').unwrap_or((pos, ""));
    let numeric = |x: &str| !x.is_empty() && x.chars().all(|c| c.is_ascii_digit());
    if numeric(row) && col.strip_suffix(')').is_some_and(numeric) {
        tail
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn llguidance_reasons_lose_what_describes_our_grammar() {
        let msg = "at 6(12): failed to compile JSON schema: Invalid type: frog\n   4 | BLANK: /[ \\n]{1,4}/\n     |   ^\n   5 | call_body: x";
        assert_eq!(reason(msg), "failed to compile JSON schema: Invalid type: frog");
        assert_eq!(reason("Invalid type: bogus"), "Invalid type: bogus");
        // Only a position is taken off: other text that starts with "at " stays.
        assert_eq!(reason("at least one item: 3 found"), "at least one item: 3 found");
        assert_eq!(reason("a\nb\nc\nd\ne\nf\ng\nh"), "a\nb\nc\nd\ne\nf");
    }

    #[test]
    fn response_formats_are_read() {
        assert_eq!(parse_response_format(None).unwrap(), ResponseFormat::Text);
        assert_eq!(parse_response_format(Some(&json!({"type": "text"}))).unwrap(), ResponseFormat::Text);
        assert_eq!(parse_response_format(Some(&json!({"type": "json_object"}))).unwrap(), ResponseFormat::JsonObject);
        let f = parse_response_format(Some(&json!({"type": "json_schema", "json_schema": {"name": "Person",
            "schema": {"type": "object"}, "strict": true}})))
        .unwrap();
        assert_eq!(f, ResponseFormat::JsonSchema { name: "Person".into(), schema: json!({"type": "object"}) });
    }

    #[test]
    fn bad_response_formats_name_the_field() {
        let cases = [
            (json!("json"), "response_format"),
            (json!({"type": "xml"}), "response_format.type"),
            (json!({}), "response_format.type"),
            (json!({"type": "json_schema"}), "response_format.json_schema"),
            (json!({"type": "json_schema", "json_schema": {"schema": {}}}), "response_format.json_schema.name"),
            (json!({"type": "json_schema", "json_schema": {"name": "a b"}}), "response_format.json_schema.name"),
            (
                json!({"type": "json_schema", "json_schema": {"name": "a", "schema": 3}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "a", "strict": "yes"}}),
                "response_format.json_schema.strict",
            ),
        ];
        for (value, param) in cases {
            let e = parse_response_format(Some(&value)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{value}: {}", e.message);
        }
    }

    #[test]
    fn json_and_a_forced_call_cannot_be_combined() {
        let tools = [json!({"type": "function", "function": {"name": "f"}})];
        let e = reply_grammar(&ResponseFormat::JsonObject, &ToolChoice::Required(None), "hermes", &tools, false, false)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("response_format"));
        assert!(reply_grammar(&ResponseFormat::Text, &ToolChoice::Auto, "hermes", &tools, false, false)
            .unwrap()
            .is_none());
        // --constrain-tools: auto replies follow the optional-call grammar; none and JSON do not.
        let (_, param) =
            reply_grammar(&ResponseFormat::Text, &ToolChoice::Auto, "hermes", &tools, false, true).unwrap().unwrap();
        assert_eq!(param, "tools");
        assert!(reply_grammar(&ResponseFormat::Text, &ToolChoice::None, "hermes", &tools, false, true)
            .unwrap()
            .is_none());
        assert!(reply_grammar(&ResponseFormat::Text, &ToolChoice::Auto, "hermes", &[], false, true).unwrap().is_none());
        let (_, param) = reply_grammar(&ResponseFormat::JsonObject, &ToolChoice::Auto, "hermes", &tools, false, true)
            .unwrap()
            .unwrap();
        assert_eq!(param, "response_format");
        let (_, param) =
            reply_grammar(&ResponseFormat::Text, &ToolChoice::Required(None), "hermes", &tools, false, false)
                .unwrap()
                .unwrap();
        assert_eq!(param, "tool_choice");
    }
}
