//! A scripted model for tests: replies are raw model text (Qwen XML, as an in-process
//! engine would produce), parsed with the real codec, so malformed text is a real
//! `LlmError::Malformed`. Every request's messages are kept for inspection.
#![allow(dead_code)]

use frognano_protocol::codec::{QwenXml, ToolCallFormat};
use frognano_protocol::{ChatRequest, Completion, FinishReason, Llm, LlmError, Message, ToolChoice, Usage};

/// One scripted reply.
#[derive(Clone)]
pub enum Reply {
    /// Raw model text after the thinking prompt (reasoning, `</think>`, content, calls).
    Text(&'static str),
    /// Raw text cut by the token limit.
    Cut(&'static str),
    /// A transport failure.
    Fail(&'static str),
}

pub struct ScriptedLlm {
    pub replies: std::collections::VecDeque<Reply>,
    pub requests: Vec<Vec<Message>>,
    /// Each request's `tool_choice`.
    pub tool_choices: Vec<ToolChoice>,
}

impl ScriptedLlm {
    pub fn new(replies: Vec<Reply>) -> Self {
        ScriptedLlm { replies: replies.into(), requests: Vec::new(), tool_choices: Vec::new() }
    }
}

impl Llm for ScriptedLlm {
    fn complete(&mut self, request: &ChatRequest<'_>) -> Result<Completion, LlmError> {
        self.requests.push(request.messages.to_vec());
        self.tool_choices.push(request.tool_choice);
        let (text, finish_reason) = match self.replies.pop_front() {
            Some(Reply::Text(t)) => (t, FinishReason::Stop),
            Some(Reply::Cut(t)) => (t, FinishReason::Length),
            Some(Reply::Fail(e)) => return Err(LlmError::Other(e.to_string())),
            None => return Err(LlmError::Other("script exhausted".into())),
        };
        // A cut reply keeps whatever parses (an open call is simply dropped).
        let parsed = QwenXml.parse_reply(text, true, request.tools);
        if let (Some(bad), false) = (parsed.failed_call(), finish_reason == FinishReason::Length) {
            return Err(LlmError::Malformed {
                text: text.to_string(),
                error: bad.error.clone(),
                call_syntax: QwenXml.call_syntax().to_string(),
            });
        }
        let usage = (finish_reason == FinishReason::Length).then_some(Usage {
            prompt_tokens: 100,
            completion_tokens: u64::from(request.sampling.max_tokens),
            cached_tokens: 0,
        });
        Ok(Completion {
            message: Message::assistant_reply(
                Some(parsed.content).filter(|c| !c.is_empty()),
                parsed.reasoning,
                parsed.tool_calls,
            ),
            finish_reason,
            usage,
        })
    }

    fn describe(&self) -> String {
        "scripted".into()
    }
}
