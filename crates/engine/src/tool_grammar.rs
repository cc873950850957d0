//! Tool calls enforced by a grammar, written in the model's own tool-call format (the text
//! its chat template renders calls as, which the protocol's codec of the same name parses).
//! A reply made under one of these grammars always parses into calls of the offered tools,
//! with arguments typed by each tool's JSON schema.
//!
//! Formats, by their codec name (docs/structured.md §3):
//!
//! - `qwen_xml` (Qwen3.5, FrogNano): `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n
//!   </parameter>\n…</function>\n</tool_call>`. Parameters in the schema's order, each
//!   required one present, optional ones skippable, none other; string values are raw text
//!   (up to `maxLength` when the schema sets one) holding no `<tool_call>` or `</tool_call>`
//!   (the codec ends a call's body there), `enum` strings one of theirs, integers, numbers
//!   and booleans as JSON literals of bounded length, anything else JSON under its schema.
//! - `hermes` (Qwen2.5, Qwen3, Hermes and most fine-tunes): `<tool_call>\n{"name": NAME,
//!   "arguments": {…}}\n</tool_call>`, the object under a schema whose `name` is one tool's
//!   and whose `arguments` follow that tool's `parameters`.
//! - `llama3_json` (Llama 3.x): the reply is one `{"name": NAME, "parameters": {…}}` object.
//!
//! Which calls: [`CallRule::Optional`] — free text, or free text then one or more calls (the
//! text can never contain a call's opening tag, so whatever looks like a call is one, and a
//! malformed call cannot be written); [`CallRule::Required`] — one or more calls, no text
//! (`tool_choice: "required"`); [`CallRule::Named`] — exactly one call of that tool
//! (`tool_choice: {"type": "function", "function": {"name": …}}`). When the prompt ends
//! inside an open `<think>` block, the reasoning comes first, up to `</think>`.

use serde_json::{json, Map, Value};

use crate::constraint::{with_json_options, ConstraintError, Grammar};

/// The formats [`tool_call_grammar`] can write, by codec name.
pub const GRAMMAR_FORMATS: &[&str] = &["qwen_xml", "hermes", "llama3_json"];

/// Whether replies in the format `parser` can be sampled under a tool-call grammar (Mistral's
/// and Granite's cannot yet: their calls are sampled freely).
pub fn has_grammar(parser: frognano_protocol::codec::ToolParser) -> bool {
    use frognano_protocol::codec::ToolCallFormat;
    GRAMMAR_FORMATS.contains(&parser.name())
}

/// Whether tool calls are constrained when the user does not say (`solve`, `eval run`,
/// `serve`): yes, unless the model is a Qwen3.5/FrogNano one (by its `architecture`; it writes
/// its own Qwen XML as trained) or its format `parser` has no grammar.
pub fn constrain_tools_by_default(architecture: Option<&str>, parser: frognano_protocol::codec::ToolParser) -> bool {
    !architecture.is_some_and(frognano_model::load::is_qwen35_architecture) && has_grammar(parser)
}

/// Which tool calls a reply must or may make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallRule {
    /// Free text, or free text followed by one or more calls.
    Optional,
    /// One or more calls of any of the tools, and nothing else.
    Required,
    /// Exactly one call of any of the tools, and nothing else (`tool_choice: "required"` with
    /// `parallel_tool_calls: false`): a small model made to act writes one step and sees its
    /// result, instead of a whole plan of calls made blind.
    One,
    /// Exactly one call, of the tool with this name.
    Named(String),
}

/// One offered tool, as the grammar needs it.
struct Tool<'a> {
    name: &'a str,
    /// The `parameters` schema (`{"type": "object"}` when the tool has none).
    parameters: Value,
}

/// The grammar for replies of `format` (a codec name, [`GRAMMAR_FORMATS`]) that call `tools`
/// (OpenAI function tools) as `rule` says. `thinking_prompted`: the prompt ends inside an
/// open `<think>` block. A tool without a name, an unknown format, or a named tool that is
/// not offered is a [`ConstraintError::Grammar`] saying so; schemas llguidance cannot enforce
/// are refused when the grammar is compiled.
pub fn tool_call_grammar(
    format: &str,
    tools: &[Value],
    rule: &CallRule,
    thinking_prompted: bool,
) -> Result<Grammar, ConstraintError> {
    let bad = ConstraintError::Grammar;
    let mut parsed = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let function = tool.get("function").unwrap_or(tool);
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad(format!("tools[{i}] has no function name")))?;
        let parameters = function.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"}));
        if !parameters.is_object() {
            return Err(bad(format!("tools[{i}] ({name}): parameters must be a JSON schema object")));
        }
        parsed.push(Tool { name, parameters });
    }
    if parsed.is_empty() {
        return Err(bad("a tool-call grammar needs at least one tool".into()));
    }
    let chosen: Vec<&Tool> = match rule {
        CallRule::Named(name) => {
            let t = parsed
                .iter()
                .find(|t| t.name == name)
                .ok_or_else(|| bad(format!("the tool {name:?} is not among the offered tools")))?;
            vec![t]
        }
        _ => parsed.iter().collect(),
    };
    let body = match format {
        "qwen_xml" => qwen_xml(&chosen, rule),
        "hermes" => hermes(&chosen, rule),
        "llama3_json" => llama3_json(&chosen, rule),
        other => {
            return Err(bad(format!(
                "no tool-call grammar for the format {other:?}; formats with one: {}",
                GRAMMAR_FORMATS.join(", ")
            )))
        }
    };
    let start = if thinking_prompted {
        // The reasoning runs up to the first `</think>`, then the reply proper.
        format!("start: think reply\nthink[lazy]: /(?s:.*)<\\/think>/\n{body}")
    } else {
        format!("start: reply\n{body}")
    };
    Ok(Grammar::Lark(start))
}

/// A tool's parameter schema with only its listed properties allowed (unless it says
/// otherwise), as the Qwen XML grammar allows only them: a call's arguments are the tool's
/// parameters, and an open object lets a sampled reply add keys without end.
fn closed(parameters: &Value) -> Value {
    let mut p = parameters.clone();
    if let Some(obj) = p.as_object_mut() {
        if obj.get("properties").and_then(Value::as_object).is_some_and(|m| !m.is_empty()) {
            obj.entry("additionalProperties").or_insert(Value::Bool(false));
        }
    }
    p
}

/// A Lark string literal holding `s` exactly.
fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// A `%json` rule body for `schema`, with FrogNano's JSON options.
fn json_rule(schema: Value) -> String {
    format!("%json {}", with_json_options(schema))
}

/// The rules shared by the formats whose calls start with `<tool_call>`: `reply` by `rule`,
/// given `call_body` (what follows `<tool_call>` up to and including `</tool_call>`).
fn tagged_calls(rule: &CallRule, call_body: &str) -> String {
    let reply = match rule {
        // Text that never contains `<tool_call>`, or such text and then calls: the lazy
        // lexeme ends at the first `<tool_call>`, where the plain-text one dies.
        CallRule::Optional => "reply: PLAIN_TEXT | text_then_open call_body more_calls\n\
             PLAIN_TEXT: /(?s:.*)/ & ~/(?s:.*)<tool_call>(?s:.*)/\n\
             text_then_open[lazy]: /(?s:.*)<tool_call>/\n"
            .to_string(),
        CallRule::Required => "reply: BLANK? \"<tool_call>\" call_body more_calls\n".to_string(),
        CallRule::One | CallRule::Named(_) => "reply: BLANK? \"<tool_call>\" call_body\n".to_string(),
    };
    format!("{reply}more_calls: (\"\\n<tool_call>\" call_body)*\nBLANK: /[ \\n]{{1,4}}/\ncall_body: {call_body}\n")
}

fn hermes(tools: &[&Tool], rule: &CallRule) -> String {
    let calls: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({"type": "object", "properties": {"name": {"const": t.name}, "arguments": closed(&t.parameters)},
                   "required": ["name", "arguments"], "additionalProperties": false})
        })
        .collect();
    let body = "\"\\n\" call_json \"\\n</tool_call>\"";
    format!("{}call_json: {}\n", tagged_calls(rule, body), json_rule(json!({"anyOf": calls})))
}

fn llama3_json(tools: &[&Tool], rule: &CallRule) -> String {
    let calls: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({"type": "object", "properties": {"name": {"const": t.name}, "parameters": closed(&t.parameters)},
                   "required": ["name", "parameters"], "additionalProperties": false})
        })
        .collect();
    let reply = match rule {
        // Text that does not start with `{` (blank text included), or the call.
        CallRule::Optional => "reply: PLAIN_TEXT | call_json\nPLAIN_TEXT: /([^{](?s:.*))?/\n",
        _ => "reply: call_json\n",
    };
    format!("{reply}call_json: {}\n", json_rule(json!({"anyOf": calls})))
}

fn qwen_xml(tools: &[&Tool], rule: &CallRule) -> String {
    let mut rules = String::new();
    let mut functions = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let empty = Map::new();
        let props = tool.parameters.get("properties").and_then(Value::as_object).unwrap_or(&empty);
        let required: Vec<&str> = tool
            .parameters
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut params = Vec::new();
        for (j, (key, schema)) in props.iter().enumerate() {
            let value = format!("v_{i}_{j}");
            let (body, lazy) = xml_value(schema);
            // A raw string value is lazy: it ends at the first `</parameter>`.
            rules.push_str(&format!("{value}{}: {body}\n", if lazy { "[lazy]" } else { "" }));
            let p = format!("p_{i}_{j}");
            // `value` ends with the closing `\n</parameter>` (see `xml_value`).
            rules.push_str(&format!("{p}: {} {value} \"\\n\"\n", lit(&format!("<parameter={key}>\n"))));
            params.push(if required.contains(&key.as_str()) { p } else { format!("{p}?") });
        }
        if props.is_empty() && tool.parameters.get("additionalProperties") != Some(&Value::Bool(false)) {
            // A schema without properties: any parameter names, raw values.
            params.push("any_param*".into());
        }
        let f = format!("f_{i}");
        rules.push_str(&format!(
            "{f}: {} {} \"</function>\\n\"\n",
            lit(&format!("<function={}>\n", tool.name)),
            params.join(" ")
        ));
        functions.push(f);
    }
    rules.push_str(&format!(
        "any_param: \"<parameter=\" PARAM_NAME \">\\n\" raw_value \"\\n\"\nPARAM_NAME: /[A-Za-z0-9_.-]{{1,64}}/\n\
         raw_value[lazy]: /(?s:.*)<\\/parameter>/ & {NO_CALL_TAGS}\n",
    ));
    let body = format!("\"\\n\" ({}) \"</tool_call>\"", functions.join(" | "));
    format!("{}{rules}", tagged_calls(rule, &body))
}

/// A raw value holds no `<tool_call>` or `</tool_call>`: the codec ends a call's body at the
/// first of them (as every Qwen XML parser does), so such a value would close the call early
/// and lose the parameters after it. `</function>`, `<function=` and `<parameter=` inside a
/// value are read back whole (the body ends at its last `</function>`, a value at its
/// `</parameter>`), so code that mentions them can still be written.
const NO_CALL_TAGS: &str = "~/(?s:.*)<\\/?tool_call>(?s:.*)/";

/// The rule body for one Qwen XML parameter value, including the closing `\n</parameter>`,
/// and whether it is a lazy lexeme (a raw string).
fn xml_value(schema: &Value) -> (String, bool) {
    let close = "\"\\n</parameter>\"";
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        if !options.is_empty() && options.iter().all(Value::is_string) {
            let alts: Vec<String> = options.iter().filter_map(Value::as_str).map(lit).collect();
            return (format!("({}) {close}", alts.join(" | ")), false);
        }
    }
    let typed = match schema.get("type").and_then(Value::as_str) {
        // Bounded lengths: a small model sampled hot can otherwise write digits forever.
        Some("integer") => Some("/-?(0|[1-9][0-9]{0,17})/".to_string()),
        Some("number") => Some("/-?(0|[1-9][0-9]{0,17})(\\.[0-9]{1,17})?([eE][+-]?[0-9]{1,3})?/".to_string()),
        Some("boolean") => Some("(\"true\" | \"false\")".to_string()),
        Some("object") | Some("array") | Some("null") => Some(json_rule(schema.clone())),
        _ => None,
    };
    match typed {
        Some(value) => (format!("{value} {close}"), false),
        // Strings, and anything the codec keeps as a string: raw text up to the first
        // `</parameter>` (the parser closes a value there, newline before it or not, so the
        // value may not contain the tag), at most `maxLength` characters when set.
        None => match schema.get("maxLength").and_then(Value::as_u64) {
            // The newline before the closing tag is not part of the value.
            Some(n) => (format!("/(?s:.{{0,{n}}})\\n?<\\/parameter>/ & {NO_CALL_TAGS}"), true),
            None => (format!("/(?s:.*)<\\/parameter>/ & {NO_CALL_TAGS}"), true),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constraint::test_vocab::{factory, feed, Fed};
    use crate::constraint::CompiledGrammar;
    use frognano_protocol::codec::{HermesJson, QwenXml, ToolCallFormat};

    fn compiled(format: &str, rule: CallRule, thinking: bool) -> (CompiledGrammar, u32) {
        let (f, _, end) = factory();
        let g = tool_call_grammar(format, &tools(), &rule, thinking).unwrap();
        (f.compile(&g).unwrap_or_else(|e| panic!("{format}: {e}")), end)
    }

    const XML_BASH: &str = "<tool_call>\n<function=Bash>\n<parameter=command>\nls -la\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>";
    const XML_WEATHER: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>";

    /// Qwen XML with calls optional: free text, text then calls, and several calls pass;
    /// text holding a broken call, an unknown tool or parameter, a missing required
    /// parameter, a mistyped integer or an enum value not offered are refused.
    #[test]
    fn qwen_xml_optional_calls() {
        let (g, end) = compiled("qwen_xml", CallRule::Optional, false);
        assert_eq!(feed(&g, end, "Just some text, no call.\nDone."), Fed::MayEnd);
        assert_eq!(feed(&g, end, &format!("Let me look.\n\n{XML_BASH}")), Fed::MayEnd);
        assert_eq!(feed(&g, end, &format!("{XML_BASH}\n{XML_WEATHER}")), Fed::MayEnd);
        // A value may span lines; the Bash command's optional timeout may be left out.
        let multi =
            "<tool_call>\n<function=Bash>\n<parameter=command>\ncd x\nls\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(feed(&g, end, multi), Fed::MayEnd);
        for (bad, why) in [
            ("text <tool_call>\n<function=Nope>", "unknown tool"),
            ("<tool_call>\n<function=Bash>\n<parameter=cmd>", "unknown parameter"),
            ("<tool_call>\n<function=Bash>\n</function>", "missing required command"),
            (
                "<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n<parameter=timeout>\nthirty",
                "integer",
            ),
            (
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nkelvin",
                "enum",
            ),
            ("<tool_call>\nplain", "no function"),
        ] {
            assert!(matches!(feed(&g, end, bad), Fed::Refused { .. }), "{why}: {bad:?} was accepted");
        }
        // A call left open cannot end the turn.
        assert_eq!(feed(&g, end, "<tool_call>\n<function=Bash>\n<parameter=command>\nls"), Fed::Open);
    }

    /// A raw value cannot hold a call tag: the codec would close the call there and lose the
    /// parameters after it (a demo-model reply under `Named("get_weather")` once wrote
    /// `php\n}</function>\n</tool_call>\n` as the city, and parsed without its `unit`).
    /// The function and parameter tags, which the codec reads back whole, are allowed.
    #[test]
    fn qwen_xml_values_hold_no_call_tags() {
        let (g, end) = compiled("qwen_xml", CallRule::Named("get_weather".into()), false);
        let seen = "<tool_call>\n<function=get_weather>\n<parameter=city>\nphp\n}</function>\n</tool_call>\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>";
        let cut = seen.find("}</function>\n</tool_call>").unwrap() + "}</function>\n</tool_call".len();
        assert!(matches!(feed(&g, end, seen), Fed::Refused { at, .. } if at == cut), "{:?}", feed(&g, end, seen));
        let (g, end) = compiled("qwen_xml", CallRule::Required, false);
        for value in ["a <tool_call> b", "x</tool_call>"] {
            let text = format!(
                "<tool_call>\n<function=Bash>\n<parameter=command>\n{value}\n</parameter>\n</function>\n</tool_call>"
            );
            assert!(matches!(feed(&g, end, &text), Fed::Refused { .. }), "{value:?} was accepted");
        }
        let code = "grep -n '</function>\\|<parameter=' src/*.rs";
        let text = format!(
            "<tool_call>\n<function=Bash>\n<parameter=command>\n{code}\n</parameter>\n</function>\n</tool_call>"
        );
        assert_eq!(feed(&g, end, &text), Fed::MayEnd);
        let parsed = QwenXml.parse_reply(&text, false, &tools());
        assert_eq!(parsed.tool_calls[0].function.arguments, serde_json::json!({"command": code}).to_string());
    }

    /// `maxLength` bounds a raw string value.
    #[test]
    fn qwen_xml_string_bounds() {
        let (g, end) = compiled("qwen_xml", CallRule::Required, false);
        let long = format!("<tool_call>\n<function=get_weather>\n<parameter=city>\n{}", "x".repeat(31));
        assert!(matches!(feed(&g, end, &long), Fed::Refused { .. }), "31 characters over maxLength 30");
        let ok = format!("<tool_call>\n<function=get_weather>\n<parameter=city>\n{}", "x".repeat(30));
        assert_eq!(feed(&g, end, &ok), Fed::Open);
    }

    /// Required calls: no text, one or more calls; named: exactly one call of that tool, and
    /// the reply is complete when it closes.
    #[test]
    fn required_and_named_calls() {
        let (g, end) = compiled("qwen_xml", CallRule::Required, false);
        assert!(matches!(feed(&g, end, "Sure"), Fed::Refused { at: 0, .. }));
        assert_eq!(feed(&g, end, &format!("{XML_WEATHER}\n{XML_BASH}")), Fed::MayEnd);
        let (g, end) = compiled("qwen_xml", CallRule::Named("get_weather".into()), false);
        assert!(matches!(feed(&g, end, XML_BASH), Fed::Refused { .. }), "another tool than the named one");
        assert_eq!(feed(&g, end, XML_WEATHER), Fed::Complete);
    }

    /// Hermes JSON: the object's name is one of the tools', its arguments follow that tool's
    /// schema.
    #[test]
    fn hermes_calls() {
        let (g, end) = compiled("hermes", CallRule::Optional, false);
        let bash = r#"<tool_call>
{"name": "Bash", "arguments": {"command": "ls -la", "timeout": 30}}
</tool_call>"#;
        assert_eq!(feed(&g, end, "No tools needed."), Fed::MayEnd);
        assert_eq!(feed(&g, end, &format!("I will list files.\n{bash}")), Fed::MayEnd);
        for bad in [
            "<tool_call>\n{\"name\": \"Nope\"",
            "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {\"timeout\": \"x\"",
            "<tool_call>\n{\"name\": \"Bash\", \"arguments\": {}}",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"kelvin\"",
        ] {
            assert!(matches!(feed(&g, end, bad), Fed::Refused { .. }), "{bad:?} was accepted");
        }
        let (g, end) = compiled("hermes", CallRule::Named("Bash".into()), false);
        assert_eq!(feed(&g, end, bash), Fed::Complete);
        // A JSON string may hold the call tags; the codec reads such a call whole.
        let grep = r#"<tool_call>
{"name": "Bash", "arguments": {"command": "grep -c '</tool_call>' log.txt"}}
</tool_call>"#;
        assert_eq!(feed(&g, end, grep), Fed::Complete);
        let parsed = HermesJson.parse_reply(grep, false, &tools());
        assert_eq!(
            parsed.tool_calls[0].function.arguments,
            json!({"command": "grep -c '</tool_call>' log.txt"}).to_string()
        );
    }

    #[test]
    fn llama3_json_calls() {
        let (g, end) = compiled("llama3_json", CallRule::Optional, false);
        assert_eq!(feed(&g, end, "Hello there"), Fed::MayEnd);
        assert_eq!(feed(&g, end, r#"{"name": "Bash", "parameters": {"command": "ls"}}"#), Fed::Complete);
        assert!(matches!(feed(&g, end, r#"{"name": "Bash", "parameters": {}}"#), Fed::Refused { .. }));
    }

    /// After a thinking prompt the reasoning comes first, up to `</think>`.
    #[test]
    fn reasoning_comes_first() {
        let (g, end) = compiled("qwen_xml", CallRule::Required, true);
        assert_eq!(feed(&g, end, &format!("I should list.\n</think>\n\n{XML_BASH}")), Fed::MayEnd);
        assert_eq!(feed(&g, end, "still thinking <tool_call> is not a call here"), Fed::Open);
    }

    fn tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "Bash", "parameters": {"type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
                "required": ["command"]}}}),
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string", "maxLength": 30},
                               "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"]}}}),
        ]
    }

    #[test]
    fn unknown_formats_and_tools_are_named() {
        let e = tool_call_grammar("mistral", &tools(), &CallRule::Required, false).unwrap_err();
        assert!(e.to_string().contains("\"mistral\"") && e.to_string().contains("qwen_xml"), "{e}");
        let e = tool_call_grammar("hermes", &tools(), &CallRule::Named("Nope".into()), false).unwrap_err();
        assert!(e.to_string().contains("Nope"), "{e}");
        let e = tool_call_grammar("hermes", &[json!({"type": "function", "function": {}})], &CallRule::Required, false)
            .unwrap_err();
        assert!(e.to_string().contains("tools[0]"), "{e}");
    }

    #[test]
    fn named_grammars_mention_only_that_tool() {
        for format in GRAMMAR_FORMATS {
            let Grammar::Lark(g) =
                tool_call_grammar(format, &tools(), &CallRule::Named("get_weather".into()), false).unwrap()
            else {
                panic!("a Lark grammar")
            };
            assert!(g.contains("get_weather") && !g.contains("Bash"), "{format}: {g}");
        }
    }
}
