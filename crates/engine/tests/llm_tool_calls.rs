//! `EngineLlm` reads replies in the model's own tool-call format: detected from the chat
//! template (Qwen2.5-Coder's: Hermes JSON), or the one `with_tool_parser` names. A reply whose
//! calls all fail is `LlmError::Malformed` with the format's call syntax (the agent retries
//! it); one where some parse keeps those.
//!
//! The network is a scripted model that always writes a given reply, over the tiny
//! fixture's tokenizer.

use std::sync::Arc;

use frognano_engine::{ChatParts, EngineLlm};
use frognano_model::chat::ChatTemplate;
use frognano_model::tokenizer::Tokenizer;
use frognano_protocol::codec::ToolParser;
use frognano_protocol::{ChatRequest, Completion, FinishReason, Llm, LlmError, Message, Sampling};
use frognano_testkit::ScriptedLm;
use serde_json::{json, Value};

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const EOS: u32 = 2;

/// An engine over the Qwen2.5-Coder template whose model writes `reply`.
fn engine(reply: &str) -> EngineLlm {
    let tokenizer = Tokenizer::from_file(root().join("fixtures/qwen35-tiny/tokenizer.json")).unwrap();
    let template = ChatTemplate::from_file(root().join("fixtures/tokenizer/qwen25-coder/chat_template.jinja")).unwrap();
    let mut script = tokenizer.encode_with(reply, false).unwrap();
    script.push(EOS);
    let model = ScriptedLm { vocab: 1024, script };
    let tool_parser = template.tool_parser();
    let chat =
        ChatParts { tokenizer: Arc::new(tokenizer), template: Arc::new(template), eos_ids: vec![EOS], tool_parser };
    EngineLlm::from_parts("scripted", Arc::new(model), chat)
}

fn ask(llm: &mut EngineLlm) -> Result<Completion, LlmError> {
    let tools = vec![json!({"type": "function", "function": {"name": "Read",
        "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}}}}})];
    let sampling = Sampling { temperature: 0.0, max_tokens: 200, enable_thinking: false, ..Sampling::default() };
    let messages = [Message::user("Read hello.txt.")];
    llm.complete(&ChatRequest::new(&messages, &tools, &sampling))
}

fn args(c: &Completion, i: usize) -> Value {
    serde_json::from_str(&c.message.calls()[i].function.arguments).unwrap()
}

const GOOD: &str = "<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"file_path\": \"hello.txt\"}}\n</tool_call>";
const BAD: &str = "<tool_call>\n{\"name\": \"Read\", \"arguments\": {\"file_path\": }\n</tool_call>";

#[test]
fn hermes_replies_of_a_qwen25_template_are_tool_calls() {
    let mut llm = engine(&format!("Reading it.\n{GOOD}"));
    assert_eq!(llm.tool_parser(), ToolParser::Hermes);
    let c = ask(&mut llm).unwrap();
    assert_eq!(c.finish_reason, FinishReason::ToolCalls);
    assert_eq!(c.message.text(), "Reading it.");
    assert_eq!(args(&c, 0), json!({"file_path": "hello.txt"}));
}

#[test]
fn all_calls_malformed_is_an_error_some_malformed_keeps_the_rest() {
    match ask(&mut engine(BAD)) {
        Err(LlmError::Malformed { text, call_syntax, .. }) => {
            assert_eq!(text, BAD);
            assert!(call_syntax.starts_with("<tool_call>\n{\"name\": \"NAME\""), "{call_syntax}");
        }
        other => panic!("expected a malformed reply, got {other:?}"),
    }
    let c = ask(&mut engine(&format!("{BAD}\n{GOOD}"))).unwrap();
    assert_eq!(c.message.calls().len(), 1);
    assert_eq!(args(&c, 0), json!({"file_path": "hello.txt"}));
}

#[test]
fn a_named_tool_parser_replaces_the_templates() {
    let mistral = "[TOOL_CALLS]Read[ARGS]{\"file_path\": \"hello.txt\"}";
    let c = ask(&mut engine(mistral)).unwrap();
    assert!(c.message.calls().is_empty(), "Hermes does not read Mistral's syntax");
    let mut llm = engine(mistral).with_tool_parser(Some(ToolParser::from_name("mistral").unwrap()));
    let c = ask(&mut llm).unwrap();
    assert_eq!(args(&c, 0), json!({"file_path": "hello.txt"}));
}
