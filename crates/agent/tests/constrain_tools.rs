//! `--constrain-tools`: the in-process model's replies are sampled under a grammar of the
//! offered tools' calls, so a malformed call cannot be produced. A model that wants to write
//! a malformed call (a scripted network over the real Qwen3.5 tokenizer and chat template)
//! makes the agent's turn fail without the grammar and never with it, over many seeds at
//! temperature 1; a well-formed call goes through the grammar unchanged.

use std::sync::Arc;

use frognano_engine::{ChatParts, EngineLlm};
use frognano_model::chat::ChatTemplate;
use frognano_protocol::{ChatRequest, Completion, FinishReason, Llm, LlmError, Message, Sampling, ToolChoice};
use frognano_testkit::ScriptedLm;

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The tiny Qwen3.5 checkpoint's tokenizer and ids with the Qwen3.5 chat template (tools,
/// thinking), over a network that writes `reply`.
fn scripted_llm(reply: &str) -> EngineLlm {
    let loaded = frognano_model::load(root().join("fixtures/qwen35-tiny").to_str().unwrap()).unwrap();
    let vocab = loaded.model.vocab_size();
    let (_, mut chat) = ChatParts::split(loaded).unwrap();
    chat.template =
        Arc::new(ChatTemplate::from_file(root().join("fixtures/tokenizer/qwen35/chat_template.jinja")).unwrap());
    // Replies are read (and the grammar written) in the new template's format, Qwen XML.
    chat.tool_parser = chat.template.tool_parser();
    let mut script = chat.tokenizer.encode_with(reply, false).unwrap();
    script.push(chat.eos_ids[0]);
    EngineLlm::from_parts("scripted", Arc::new(ScriptedLm { vocab, script }), chat)
}

fn turns(llm: &mut EngineLlm, seeds: u64) -> Vec<Result<Completion, LlmError>> {
    turns_with(llm, seeds, ToolChoice::Auto)
}

fn turns_with(llm: &mut EngineLlm, seeds: u64, tool_choice: ToolChoice) -> Vec<Result<Completion, LlmError>> {
    let tools = frognano_agent::tools::tool_schemas();
    let messages = [
        Message::system(frognano_agent::tools::SYSTEM_PROMPT),
        Message::user("The test in tests/test_stats.py fails. Fix the median function in stats.py."),
    ];
    (0..seeds)
        .map(|seed| {
            let sampling = Sampling {
                temperature: 1.0,
                top_p: 1.0,
                top_k: 0,
                max_tokens: 200,
                seed: Some(seed),
                ..Sampling::default()
            };
            llm.complete(&ChatRequest { tool_choice, ..ChatRequest::new(&messages, &tools, &sampling) })
        })
        .collect()
}

/// The command written straight inside `<tool_call>`, with no `<function=…>`: a call the
/// codec cannot read.
const MALFORMED: &str = "Let me look at the file.\n</think>\n\n<tool_call>\ncat stats.py\n</tool_call>";

#[test]
fn a_malformed_call_fails_the_turn_without_the_grammar_and_never_with_it() {
    let seeds = 8;
    let mut free = scripted_llm(MALFORMED);
    for (seed, r) in turns(&mut free, seeds).into_iter().enumerate() {
        assert!(matches!(r, Err(LlmError::Malformed { .. })), "seed {seed}: without the grammar: {r:?}");
    }
    let mut constrained = scripted_llm(MALFORMED).constrain_tools();
    assert!(constrained.describe().contains("constrained"), "{}", constrained.describe());
    let names = ["Read", "Write", "Edit", "Glob", "Bash"];
    for (seed, r) in turns(&mut constrained, seeds).into_iter().enumerate() {
        let c = r.unwrap_or_else(|e| panic!("seed {seed}: the constrained turn failed: {e}"));
        for call in c.message.tool_calls.iter().flatten() {
            assert!(names.contains(&call.function.name.as_str()), "seed {seed}: {call:?}");
            let args: serde_json::Value = serde_json::from_str(&call.function.arguments).unwrap();
            assert!(args.is_object(), "seed {seed}: {args}");
        }
        // The text the model was steered to instead: reasoning, then either a call the
        // grammar completed, or a call still open when the token limit cut the reply.
        assert!(matches!(c.finish_reason, FinishReason::ToolCalls | FinishReason::Length | FinishReason::Stop));
    }
}

#[test]
fn a_well_formed_call_passes_the_grammar_unchanged() {
    let reply = "I will read it.\n</think>\n\n<tool_call>\n<function=Read>\n<parameter=file_path>\nstats.py\n</parameter>\n</function>\n</tool_call>";
    let mut llm = scripted_llm(reply).constrain_tools();
    for (seed, r) in turns(&mut llm, 3).into_iter().enumerate() {
        let c = r.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(c.finish_reason, FinishReason::ToolCalls, "seed {seed}: {c:?}");
        let calls = c.message.tool_calls.unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].function.name, "Read");
        assert_eq!(calls[0].function.arguments, r#"{"file_path":"stats.py"}"#);
        assert_eq!(c.message.reasoning_content.as_deref(), Some("I will read it."));
    }
}

/// The default of `frognano solve`: constrained unless the model is Qwen3.5/FrogNano.
#[test]
fn qwen35_models_are_told_apart() {
    let tiny = EngineLlm::load(root().join("fixtures/qwen35-tiny").to_str().unwrap()).unwrap();
    assert!(tiny.is_qwen35(), "{:?}", tiny.architecture());
    if let Some(demo) = frognano_testkit::demo_model() {
        let demo = EngineLlm::load(demo.to_str().unwrap()).unwrap();
        assert_eq!(demo.architecture(), Some("llama"));
        assert!(!demo.is_qwen35());
    }
}

/// `tool_choice: required` (what the agent asks after its act notice): a model that wants to
/// answer in prose is steered into a call of one of the tools.
#[test]
fn a_required_call_turns_a_prose_answer_into_a_call() {
    let prose = "The fix is simple.\n</think>\n\nChange median to average the two middle values.";
    let mut llm = scripted_llm(prose).constrain_tools();
    for (seed, r) in turns(&mut llm, 2).into_iter().enumerate() {
        let c = r.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(c.message.tool_calls.is_none(), "seed {seed}: auto keeps the prose answer: {c:?}");
    }
    let names = ["Read", "Write", "Edit", "Glob", "Bash"];
    for (seed, r) in turns_with(&mut llm, 6, ToolChoice::Required).into_iter().enumerate() {
        let c = r.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        match &c.finish_reason {
            FinishReason::ToolCalls => {
                let calls = c.message.tool_calls.clone().unwrap();
                assert!(
                    calls.iter().all(|call| names.contains(&call.function.name.as_str())),
                    "seed {seed}: {calls:?}"
                );
            }
            // Still inside a call's raw value when the token limit came.
            FinishReason::Length => {
                assert!(c.message.text().contains("<tool_call>"), "seed {seed}: {c:?}")
            }
            _ => panic!("seed {seed}: a required call ended with {:?}: {c:?}", c.finish_reason),
        }
    }
}

/// `ToolChoice::One` (the agent's reply to its act notice): a model that wants to write a
/// whole plan of calls gets exactly one, and the reply ends there.
#[test]
fn one_required_call_is_exactly_one_call() {
    let plan = "Plan.\n</think>\n\n<tool_call>\n<function=Read>\n<parameter=file_path>\nstats.py\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>";
    let mut llm = scripted_llm(plan).constrain_tools();
    let free = turns(&mut llm, 1).remove(0).unwrap();
    assert_eq!(free.message.tool_calls.as_ref().map(|c| c.len()), Some(2), "auto keeps both calls: {free:?}");
    for (seed, r) in turns_with(&mut llm, 3, ToolChoice::One).into_iter().enumerate() {
        let c = r.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(c.finish_reason, FinishReason::ToolCalls, "seed {seed}: {c:?}");
        let calls = c.message.tool_calls.unwrap();
        assert_eq!(calls.len(), 1, "seed {seed}: {calls:?}");
        assert_eq!(calls[0].function.name, "Read");
    }
}
