//! The in-process backend: the model runs inside this process through `frognano-engine`.
//! One [`Session`] lives across the whole run, so each agent step only prefills what was
//! added since the last one (the tool results), not the whole conversation.

use std::ops::ControlFlow;
use std::sync::Arc;

use frognano_engine::{FinishReason as EngineFinish, GenerateRequest, SamplingParams, Session};
use frognano_model::chat::{ChatMessage, ChatTemplate};
use frognano_model::tokenizer::Tokenizer;
use serde_json::Value;

use crate::codec;
use crate::llm::{ChatRequest, Completion, FinishReason, Llm, LlmError, Message, Usage};

/// A model loaded in this process.
pub struct EngineLlm {
    name: String,
    session: Session,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    eos_ids: Vec<u32>,
    max_context: usize,
}

impl EngineLlm {
    /// Loads `spec` (checkpoint folder, `.gguf` file or cached hub id). The model must have a
    /// tokenizer and a chat template.
    pub fn load(spec: &str) -> anyhow::Result<Self> {
        let lm = frognano_model::load(spec)?;
        lm.tokenizer()?;
        lm.chat_template()?;
        let frognano_model::LoadedModel { model, tokenizer, chat_template, eos_ids, .. } = lm;
        let max_context = model.max_context();
        Ok(EngineLlm {
            name: spec.to_string(),
            session: Session::new(Arc::from(model)),
            tokenizer: tokenizer.expect("checked above"),
            template: chat_template.expect("checked above"),
            eos_ids,
            max_context,
        })
    }

    fn render(&self, request: &ChatRequest<'_>) -> Result<String, LlmError> {
        let messages = request
            .messages
            .iter()
            .map(to_chat_message)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| LlmError::Other(format!("message not representable for the chat template: {e}")))?;
        let mut kwargs = serde_json::Map::new();
        kwargs.insert("enable_thinking".into(), Value::Bool(request.sampling.enable_thinking));
        let tools = (!request.tools.is_empty()).then_some(request.tools);
        self.template
            .render(&messages, tools, true, Some(&kwargs))
            .map_err(|e| LlmError::Other(format!("chat template: {e}")))
    }
}

/// Our message → the template's typed message (arguments parsed into objects).
fn to_chat_message(m: &Message) -> Result<ChatMessage, serde_json::Error> {
    serde_json::from_value(serde_json::to_value(m)?)
}

impl Llm for EngineLlm {
    fn complete(&mut self, request: &ChatRequest<'_>) -> Result<Completion, LlmError> {
        let prompt_text = self.render(request)?;
        let prompt =
            self.tokenizer.encode_with(&prompt_text, false).map_err(|e| LlmError::Other(format!("tokenizer: {e}")))?;
        if prompt.len() >= self.max_context {
            return Err(LlmError::ContextOverflow(format!(
                "maximum context length is {} tokens, the conversation has {}",
                self.max_context,
                prompt.len()
            )));
        }
        let s = request.sampling;
        let req = GenerateRequest {
            sampling: SamplingParams {
                temperature: s.temperature,
                top_p: s.top_p,
                top_k: s.top_k as usize,
                min_p: s.min_p,
                repetition_penalty: s.repetition_penalty,
                seed: s.seed,
            },
            max_tokens: (s.max_tokens as usize).min(self.max_context - prompt.len()),
            stop_ids: self.eos_ids.clone(),
            top_logprobs: 0,
        };
        let g = self
            .session
            .generate(&prompt, &req, |_| ControlFlow::Continue(()))
            .map_err(|e| LlmError::Other(format!("generation: {e}")))?;
        let ids: Vec<u32> = g.tokens.iter().map(|t| t.id).filter(|id| !self.eos_ids.contains(id)).collect();
        let raw = self.tokenizer.decode(&ids, true).map_err(|e| LlmError::Other(format!("detokenize: {e}")))?;
        let usage = Some(Usage { prompt_tokens: g.prompt_tokens as u64, completion_tokens: g.tokens.len() as u64 });
        let thinking_prompted = prompt_text.trim_end_matches('\n').ends_with("<think>");
        if matches!(g.finish, EngineFinish::Length | EngineFinish::ContextFull) {
            // A cut reply is not parsed: the loop tells the model and asks for less.
            return Ok(Completion {
                message: Message::assistant(Some(raw), None, Vec::new()),
                finish_reason: FinishReason::Length,
                usage,
            });
        }
        let parsed = codec::parse_reply(&raw, thinking_prompted, request.tools)
            .map_err(|error| LlmError::Malformed { text: raw.clone(), error })?;
        let finish_reason = if parsed.tool_calls.is_empty() { FinishReason::Stop } else { FinishReason::ToolCalls };
        let content = Some(parsed.content).filter(|c| !c.is_empty());
        Ok(Completion {
            message: Message::assistant(content, parsed.reasoning, parsed.tool_calls),
            finish_reason,
            usage,
        })
    }

    fn describe(&self) -> String {
        format!("{} (in process)", self.name)
    }
}
