//! End to end with a real coding model: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, qwen2
//! architecture, Hermes tool calls) in this process, given the agent's five tools and a
//! simple request, answers with a tool call that the format detected from its chat template
//! parses. Greedy, at most 64 tokens.
//!
//! The model (1.1 GB, `scripts/fetch-coder-model.sh`) is not part of CI's fixtures, and a
//! debug build needs minutes for its prompt, so the test is opt-in:
//!
//! ```sh
//! cargo test --release -p frognano-agent --test integration coder_tool_call:: -- --ignored
//! ```

use std::path::Path;

use frognano_agent::tools::{tool_schemas, SYSTEM_PROMPT};
use frognano_engine::EngineLlm;
use frognano_protocol::codec::ToolParser;
use frognano_protocol::{ChatRequest, FinishReason, Llm, Message, Sampling};
use serde_json::Value;

const CODER: &str = "models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf";

#[test]
#[ignore = "needs models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf and a release build"]
fn qwen25_coder_calls_read_for_a_simple_request() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(CODER);
    assert!(path.exists(), "{} is missing: run scripts/fetch-coder-model.sh", path.display());
    let mut llm = EngineLlm::load(path.to_str().unwrap()).unwrap();
    assert_eq!(llm.tool_parser(), ToolParser::Hermes, "detected from the chat template");
    let messages = [Message::system(SYSTEM_PROMPT), Message::user("Read the file hello.txt.")];
    let tools = tool_schemas();
    let sampling =
        Sampling { temperature: 0.0, max_tokens: 64, enable_thinking: false, seed: Some(0), ..Sampling::default() };
    let started = std::time::Instant::now();
    let reply = llm.complete(&ChatRequest::new(&messages, &tools, &sampling)).unwrap();
    eprintln!("reply in {:.1}s: {:?}", started.elapsed().as_secs_f64(), reply.message);
    assert_eq!(reply.finish_reason, FinishReason::ToolCalls, "{:?}", reply.message);
    let call = &reply.message.calls()[0];
    assert_eq!(call.function.name, "Read");
    let args: Value = serde_json::from_str(&call.function.arguments).unwrap();
    assert_eq!(args["file_path"].as_str().map(|p| p.trim_start_matches("./")), Some("hello.txt"), "{args}");
}
