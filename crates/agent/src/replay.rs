//! Replay: re-executes the tool calls of a recorded trajectory instead of asking a model.
//! [`ReplayLlm`] answers each request with the next recorded assistant message (tool-call
//! ids, reasoning and content kept), so the ordinary loop runs the recorded calls against
//! a fresh workspace and the patch comes out of the workspace as always.

use crate::trajectory::Trajectory;
use frognano_protocol::{ChatRequest, Completion, FinishReason, Llm, LlmError, Message};
use std::collections::VecDeque;

/// An [`Llm`] that plays back recorded assistant messages in order.
#[derive(Debug, Clone)]
pub struct ReplayLlm {
    source: String,
    replies: VecDeque<Message>,
}

impl ReplayLlm {
    /// Plays back the assistant messages of `trajectory`; `source` names it in messages.
    pub fn new(trajectory: &Trajectory, source: impl Into<String>) -> Self {
        ReplayLlm {
            source: source.into(),
            replies: trajectory.messages.iter().filter(|m| m.role == "assistant").cloned().collect(),
        }
    }

    /// Recorded replies not yet played.
    pub fn remaining(&self) -> usize {
        self.replies.len()
    }
}

impl Llm for ReplayLlm {
    fn complete(&mut self, _request: &ChatRequest<'_>) -> Result<Completion, LlmError> {
        let message = self.replies.pop_front().ok_or_else(|| {
            LlmError::Other(format!(
                "replay of {}: the recorded trajectory has no more assistant messages",
                self.source
            ))
        })?;
        let finish_reason = if message.calls().is_empty() { FinishReason::Stop } else { FinishReason::ToolCalls };
        Ok(Completion { message, finish_reason, usage: None })
    }

    fn describe(&self) -> String {
        format!("replay of {}", self.source)
    }
}
