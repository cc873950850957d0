//! A conversation with the model that keeps its state between calls: each call runs only
//! the tokens the model has not seen. For the hybrid model, whose recurrent state cannot be
//! cut back, the session keeps snapshots at prompt boundaries and returns to the longest one
//! that the new prompt extends.

use std::ops::ControlFlow;
use std::sync::Arc;

use frognano_model::{Cache, CacheSnapshot, CausalLm, ModelError};

use crate::sampler::{Sampler, SamplingParams, TokenChoice};

/// Snapshots kept per session (each holds the recurrent state: ~50 MB for the 4B model).
const MAX_SNAPSHOTS: usize = 4;

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token was drawn.
    Stop,
    /// `max_tokens` were generated.
    Length,
    /// The model's context is full.
    ContextFull,
    /// The caller's callback asked to stop (stop string, client gone).
    Cancelled,
}

impl FinishReason {
    /// OpenAI's name for it.
    pub fn as_openai(self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::Cancelled => "stop",
            FinishReason::Length | FinishReason::ContextFull => "length",
        }
    }
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// How to pick tokens.
    pub sampling: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Tokens that end generation (not fed back to the model; reported in the output).
    pub stop_ids: Vec<u32>,
    /// Alternatives to report per token (0 for none).
    pub top_logprobs: usize,
}

/// The result of one call.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Tokens generated, with log-probabilities (the stop token included, if any).
    pub tokens: Vec<TokenChoice>,
    /// Why it ended.
    pub finish: FinishReason,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens whose state was reused instead of recomputed.
    pub cached_tokens: usize,
}

/// Engine errors.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model refused the input.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The request is invalid; the message names the field.
    #[error("{0}")]
    Request(String),
}

/// One sequence's state across calls.
pub struct Session {
    model: Arc<dyn CausalLm>,
    cache: Cache,
    /// Tokens whose state is in `cache`.
    tokens: Vec<u32>,
    /// Logits after the last of `tokens`.
    last_logits: Option<Vec<f32>>,
    /// Earlier points of this history: (snapshot, logits after it), oldest first.
    snapshots: Vec<(CacheSnapshot, Vec<f32>)>,
}

impl Session {
    /// An empty session.
    pub fn new(model: Arc<dyn CausalLm>) -> Self {
        let cache = model.new_cache();
        Session { model, cache, tokens: Vec::new(), last_logits: None, snapshots: Vec::new() }
    }

    /// Tokens whose state the session holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The model.
    pub fn model(&self) -> &Arc<dyn CausalLm> {
        &self.model
    }

    /// Forgets everything.
    pub fn reset(&mut self) {
        self.cache = self.model.new_cache();
        self.tokens.clear();
        self.last_logits = None;
        self.snapshots.clear();
    }

    /// Brings the state to exactly `prompt` and returns the logits after its last token and
    /// how many of its tokens were reused.
    pub fn prefill(&mut self, prompt: &[u32]) -> Result<(Vec<f32>, usize), EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::Request("the prompt is empty".into()));
        }
        if prompt.len() > self.model.max_context() {
            return Err(EngineError::Request(format!(
                "This model's maximum context length is {} tokens, but the prompt has {} tokens",
                self.model.max_context(),
                prompt.len()
            )));
        }
        let lcp = self.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        if lcp < self.tokens.len() || lcp == 0 {
            self.rewind(lcp, prompt.len());
        }
        let reused = self.tokens.len();
        let logits = if reused == prompt.len() {
            self.last_logits.clone().expect("a non-empty history has logits")
        } else {
            self.run(&prompt[reused..])?
        };
        self.remember();
        Ok((logits, reused))
    }

    /// Goes back to the longest point at or before `lcp` (the common prefix with a prompt of
    /// `prompt_len` tokens) that it can reach.
    fn rewind(&mut self, lcp: usize, prompt_len: usize) {
        if self.cache.is_rewindable() && lcp > 0 {
            let target = if lcp >= prompt_len { prompt_len - 1 } else { lcp };
            if target > 0 && self.cache.truncate(target).is_ok() {
                self.tokens.truncate(target);
                self.last_logits = None;
                self.snapshots.retain(|(s, _)| s.pos <= target);
                return;
            }
        }
        while let Some((snap, logits)) = self.snapshots.last() {
            if snap.pos <= lcp && snap.pos > 0 && self.cache.restore(snap).is_ok() {
                self.tokens.truncate(snap.pos);
                self.last_logits = Some(logits.clone());
                return;
            }
            self.snapshots.pop();
        }
        self.reset();
    }

    fn run(&mut self, ids: &[u32]) -> Result<Vec<f32>, EngineError> {
        let logits = self.model.forward(ids, &mut self.cache, false)?;
        self.tokens.extend_from_slice(ids);
        self.last_logits = Some(logits.clone());
        Ok(logits)
    }

    fn remember(&mut self) {
        if self.cache.is_rewindable() {
            return; // any prefix is reachable by truncation
        }
        if self.snapshots.last().is_some_and(|(s, _)| s.pos == self.cache.pos) {
            return;
        }
        if self.snapshots.len() == MAX_SNAPSHOTS {
            self.snapshots.remove(0);
        }
        let logits = self.last_logits.clone().unwrap_or_default();
        self.snapshots.push((self.cache.snapshot(), logits));
    }

    /// Runs `prompt` (reusing what it can), then generates. `on_token` sees every token as it
    /// is chosen and may stop generation early with `ControlFlow::Break`.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        req: &GenerateRequest,
        mut on_token: impl FnMut(&TokenChoice) -> ControlFlow<()>,
    ) -> Result<Generation, EngineError> {
        req.sampling.validate().map_err(EngineError::Request)?;
        let (mut logits, cached_tokens) = self.prefill(prompt)?;
        let mut sampler = Sampler::new(req.sampling.clone());
        let mut out: Vec<TokenChoice> = Vec::new();
        let finish = loop {
            if out.len() >= req.max_tokens {
                break FinishReason::Length;
            }
            let history_needed = req.sampling.repetition_penalty != 1.0;
            let choice = if history_needed {
                sampler.sample(&logits, &self.tokens, req.top_logprobs)
            } else {
                sampler.sample(&logits, &[], req.top_logprobs)
            };
            let id = choice.id;
            let flow = on_token(&choice);
            out.push(choice);
            if req.stop_ids.contains(&id) {
                break FinishReason::Stop;
            }
            if flow.is_break() {
                break FinishReason::Cancelled;
            }
            if out.len() >= req.max_tokens {
                break FinishReason::Length;
            }
            if self.tokens.len() >= self.model.max_context() {
                break FinishReason::ContextFull;
            }
            logits = self.run(&[id])?;
        };
        Ok(Generation { tokens: out, finish, prompt_tokens: prompt.len(), cached_tokens })
    }
}
