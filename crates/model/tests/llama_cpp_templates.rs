//! The chat templates of the architectures people run as agents — Qwen2.5, Qwen3,
//! Qwen3-Coder, Llama 3.1 / 3.2, Mistral Nemo, Mistral Small 3.2, Devstral and Ministral 3 — as
//! the models ship them (fixtures/tokenizer/llama-cpp-templates/, llama.cpp's copies): each
//! renders a tool round through minijinja, is detected as the tool-call format it writes, and
//! that format's renderer writes the calls exactly as the template does (so our parser reads
//! what the model was trained to write). And every template of llama.cpp's whole collection
//! (fetched by scripts/setup-llama-vocabs.sh) renders.

use std::path::PathBuf;

use frognano_model::chat::ChatTemplate;
use frognano_protocol::codec::{MistralStyle, ToolCallFormat, ToolParser};
use frognano_protocol::{Message, ToolCall};
use serde_json::{json, Value};

fn template(name: &str) -> ChatTemplate {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tokenizer/llama-cpp-templates")
        .join(format!("{name}.jinja"));
    ChatTemplate::from_file(&path)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .with_special_token("bos_token", "<s>")
        .with_special_token("eos_token", "</s>")
}

fn tools() -> Vec<Value> {
    vec![json!({"type": "function", "function": {"name": "Read", "description": "Read a text file.",
        "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["file_path"]}}})]
}

/// A call with a 9-character id (Mistral's templates refuse others).
fn call(id: &str, args: Value) -> ToolCall {
    ToolCall { id: id.into(), ..ToolCall::new("Read", args.to_string()) }
}

/// System, user, the assistant's calls, their results, the assistant's answer, the next user
/// turn (Mistral's templates insist on user/assistant alternation around the tool turns).
fn tool_round(content: Option<&str>, calls: &[ToolCall]) -> Vec<Message> {
    let mut out = vec![Message::system("You are a coding agent."), Message::user("Read hello.txt.")];
    out.push(Message::assistant_reply(content.map(str::to_string), None, calls.to_vec()));
    for (i, c) in calls.iter().enumerate() {
        out.push(Message::tool(c.id.clone(), format!("1. line {i}")));
    }
    out.push(Message::assistant("It says: line 0."));
    out.push(Message::user("Thanks."));
    out
}

/// How a template's assistant turn of calls is compared with ours.
#[derive(Clone, Copy)]
enum Turn {
    /// The template writes exactly what `want`'s renderer writes.
    Exact,
    /// The template writes more than the model does (call ids, `[CALL_ID]…`): what it writes
    /// from the first `[TOOL_CALLS]` to the end of the turn parses to the same calls.
    ParsesFrom(&'static str),
}

/// `name` is detected as `want`, renders the round with the tools shown, and writes the
/// assistant turn so that `want` reads the same calls back (see [`Turn`]).
fn check(name: &str, want: ToolParser, turn_is: Turn, content: Option<&str>, calls: &[ToolCall]) {
    let t = template(name);
    assert!(t.supports_tools(), "{name}: the template shows tools");
    assert_eq!(t.tool_parser(), want, "{name}: detected format");
    let text = t
        .render(&tool_round(content, calls), Some(&tools()), true, None)
        .unwrap_or_else(|e| panic!("{name}: rendering a tool round: {e}"));
    // As JSON, or as Qwen3-Coder's XML (`<name>Read</name>`).
    let named = text.contains("\"Read\"") || text.contains("<name>Read</name>");
    assert!(named && text.contains("Read a text file."), "{name}: tools not shown:\n{text}");
    assert!(text.contains("1. line 0"), "{name}: tool result not written:\n{text}");
    let turn = match turn_is {
        Turn::Exact => {
            let turn = want.render_assistant_content(content.unwrap_or(""), calls).unwrap();
            assert!(text.contains(&turn), "{name}: the template does not write\n{turn}\nin\n{text}");
            turn
        }
        Turn::ParsesFrom(end) => {
            let at = text.find("[TOOL_CALLS]").unwrap_or_else(|| panic!("{name}: no [TOOL_CALLS] in\n{text}"));
            let len = text[at..].find(end).unwrap_or_else(|| panic!("{name}: no {end} after the calls in\n{text}"));
            text[at..at + len].to_string()
        }
    };
    let parsed = want.parse_reply(&turn, false, &tools());
    assert_eq!(parsed.tool_calls.len(), calls.len(), "{name}: {turn}");
    for (got, sent) in parsed.tool_calls.iter().zip(calls) {
        assert_eq!(got.function.name, sent.function.name, "{name}");
        let (a, b): (Value, Value) = (
            serde_json::from_str(&got.function.arguments).unwrap(),
            serde_json::from_str(&sent.function.arguments).unwrap(),
        );
        assert_eq!(a, b, "{name}: arguments");
    }
}

#[test]
fn qwen_templates_write_hermes_calls() {
    let calls =
        [call("call_a", json!({"file_path": "hello.txt", "limit": 2})), call("call_b", json!({"file_path": "a"}))];
    for name in ["Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B"] {
        check(name, ToolParser::Hermes, Turn::Exact, None, &calls);
        check(name, ToolParser::Hermes, Turn::Exact, Some("Reading both."), &calls);
    }
}

#[test]
fn qwen3_template_thinks_unless_told_not_to() {
    let t = template("Qwen-Qwen3-0.6B");
    let msgs = [Message::user("Hi")];
    let on = t.render(&msgs, None, true, None).unwrap();
    assert!(on.ends_with("<|im_start|>assistant\n"), "{on}");
    let mut kw = serde_json::Map::new();
    kw.insert("enable_thinking".into(), false.into());
    let off = t.render(&msgs, None, true, Some(&kw)).unwrap();
    assert!(off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "{off}");
}

#[test]
fn llama3_templates_write_llama3_json_calls() {
    // Meta's templates take one call per turn.
    let calls = [call("call_a", json!({"file_path": "hello.txt", "limit": 2}))];
    for name in ["meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct"] {
        check(name, ToolParser::Llama3Json, Turn::Exact, None, &calls);
    }
}

#[test]
fn mistral_templates_write_mistral_calls_in_their_own_style() {
    let calls = [call("abcDEF123", json!({"file_path": "hello.txt"})), call("xyz987ABC", json!({"file_path": "a"}))];
    let nemo = "mistralai-Mistral-Nemo-Instruct-2407";
    check(nemo, ToolParser::Mistral(MistralStyle::JsonList), Turn::Exact, None, &calls);
    // These write each call's id as `[CALL_ID]ID` in the history; the parser reads it.
    for name in [
        "Mistral-Small-3.2-24B-Instruct-2506",
        "unsloth-mistral-Devstral-Small-2507",
        "mistralai-Ministral-3-14B-Reasoning-2512",
    ] {
        check(name, ToolParser::Mistral(MistralStyle::ArgsTag), Turn::ParsesFrom("</s>"), None, &calls);
    }
}

/// Qwen3-Coder's template writes Qwen's XML calls, and renders a conversation without tools:
/// it asks `tools is iterable and tools | length > 0` of `tools=None`, which Python answers
/// false (a `none is iterable` that said true failed every request without tools).
#[test]
fn qwen3_coder_template_writes_xml_calls_and_takes_no_tools() {
    let name = "Qwen3-Coder";
    let calls = [call("call_a", json!({"file_path": "hello.txt", "limit": 2}))];
    check(name, ToolParser::QwenXml, Turn::Exact, None, &calls);
    let t = template(name);
    let text = t.render(&[Message::user("Hi")], None, true, None).unwrap();
    assert_eq!(text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

/// Templates of llama.cpp's collection (models/llama-templates/, scripts/setup-llama-vocabs.sh)
/// that cannot render a tool round through minijinja, and why; each still fails, so that a
/// fix shows here.
const TOOL_ROUND_FAILS: &[(&str, &str)] = &[
    ("Kimi-K2-Instruct", "list.append: minijinja's lists are immutable"),
    ("Kimi-K2-Thinking", "list.append: minijinja's lists are immutable"),
    ("google-gemma-2-2b-it", "the template raises: no system role"),
    ("meetkai-functionary-medium-v3.2", "adds a call's arguments to a string: it wants them as text"),
    ("fireworks-ai-llama-3-firefunction-v2", "needs `functions` and `datetime` from its caller"),
];

/// The tool-call format of templates of llama.cpp's collection whose models answer in a
/// format of their own (not covered by the committed copies above).
const DETECTED: &[(&str, ToolParser)] = &[
    ("ibm-granite-granite-3.3-2B-Instruct", ToolParser::Granite),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", ToolParser::Hermes),
    ("meta-llama-Llama-3.3-70B-Instruct", ToolParser::Llama3Json),
    ("Qwen3.5-4B", ToolParser::QwenXml),
];

/// Every real chat template in llama.cpp's collection (about 70 models: Qwen, Llama, Mistral,
/// DeepSeek, Gemma, Granite, GLM, Kimi, MiniMax, Nemotron, gpt-oss, …) renders a one-message
/// conversation, and a tool round (the tool shown by the template or by FrogNano's Hermes
/// prompt) unless listed in [`TOOL_ROUND_FAILS`] — Python-isms such as `None is iterable` or
/// `str.startswith` must behave as in transformers.
#[test]
fn every_llama_cpp_template_renders() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/llama-templates");
    if !dir.join(".complete").is_file() {
        if std::env::var_os("FROGNANO_REQUIRE_FIXTURES").is_some() {
            panic!("{} is missing: run scripts/setup-llama-vocabs.sh", dir.display());
        }
        frognano_model::test_support::report_skip(&dir.display().to_string(), "llama.cpp's chat templates");
        return;
    }
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 60, "{} templates in {}", paths.len(), dir.display());
    let tools = [json!({"type": "function", "function": {"name": "Read", "description": "Read a text file.",
        "parameters": {"type": "object", "properties": {"file_path": {"type": "string", "description": "The file."}},
        "required": ["file_path"]}}})];
    let round = tool_round(None, &[call("abcDEF123", json!({"file_path": "hello.txt"}))]);
    let mut wrong = Vec::new();
    for path in &paths {
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let t = match ChatTemplate::from_file(path) {
            Ok(t) => t.with_special_token("bos_token", "<s>").with_special_token("eos_token", "</s>"),
            Err(e) => {
                wrong.push(format!("{name}: does not compile: {e}"));
                continue;
            }
        };
        if name != "fireworks-ai-llama-3-firefunction-v2" {
            if let Err(e) = t.render(&[Message::user("Hi")], None, true, None) {
                wrong.push(format!("{name}: one message: {e}"));
            }
        }
        if let Some((_, want)) = DETECTED.iter().find(|(n, _)| *n == name) {
            if t.tool_parser() != *want {
                wrong.push(format!("{name}: detected as {:?}, not {want:?}", t.tool_parser()));
            }
        }
        let expected_fail = TOOL_ROUND_FAILS.iter().find(|(n, _)| *n == name);
        match (t.render(&round, Some(&tools), true, None), expected_fail) {
            (Ok(text), None) if text.contains("Read") && text.contains("1. line 0") => {}
            (Ok(text), None) => wrong.push(format!("{name}: the tool or its result is missing:\n{text}")),
            (Err(e), None) => wrong.push(format!("{name}: tool round: {e}")),
            (Ok(_), Some((_, why))) => wrong.push(format!("{name}: renders a tool round now ({why}): update the list")),
            (Err(_), Some(_)) => {}
        }
    }
    assert!(wrong.is_empty(), "{} of {} templates:\n{}", wrong.len(), paths.len(), wrong.join("\n"));
}
