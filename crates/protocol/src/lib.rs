//! # frognano-protocol
//!
//! The chat protocol every other crate speaks, at the bottom of the workspace (it depends on
//! no other FrogNano crate):
//!
//! * one [`Message`] and one [`ToolCall`] in OpenAI form — what the chat
//!   template renders (`frognano-model`), what the HTTP API reads and writes
//!   (`frognano-serve`), and what the agent loop and its `leaf-function-calling`
//!   trajectories store (`frognano-agent`);
//! * [`codec`]: tool-call text formats, model text ⇄ OpenAI `tool_calls`, one
//!   [`codec::ToolCallFormat`] per format ([`codec::QwenXml`] is the one FrogNano's models
//!   write), streaming and whole-reply parsing that always agree;
//! * the [`Llm`] trait a conversation is run through, its request and reply types,
//!   and [`HttpLlm`], the client for any OpenAI-compatible `/v1/chat/completions` endpoint.
//!   The in-process implementation is `frognano_engine::EngineLlm`.

pub mod codec;
mod llm;
mod message;

pub use llm::{
    completion_from_openai, ChatRequest, Completion, FinishReason, HttpLlm, Llm, LlmError, Sampling, ToolChoice, Usage,
};
pub use message::{
    new_call_id, text_only_messages, ContentError, ContentPart, FunctionCall, Message, MessageContent, ToolCall,
    NOT_READ_PART,
};
