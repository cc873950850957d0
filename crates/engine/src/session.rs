//! A conversation with the model that keeps its state between calls: each call runs only
//! the tokens the model has not seen. For the hybrid model, whose recurrent state cannot be
//! cut back, the session keeps snapshots at prompt boundaries and returns to the longest one
//! that the new prompt extends.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use frognano_model::{Cache, CacheSnapshot, CausalLm, ModelError};

use crate::constraint::{Commit, Constraint, ConstraintStats};
use crate::sampler::{Sampler, SamplingParams, TokenChoice};
use crate::speculative::{LookupDrafter, MtpDrafter, SpeculationStats, SpeculativeMode, MAX_DRAFT};

/// Snapshots kept per session (each holds the recurrent state, ~50 MB for the 4B model, and
/// the logits at that point).
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
    /// A prompt position to keep the state at besides the prompt's end: for a chat turn, where
    /// its generation prompt begins (`frognano-serve` finds it from the template). The next
    /// turn renders this turn's ending differently, so it shares this prompt only up to there;
    /// with a state kept there a hybrid model resumes from it instead of from the start.
    pub checkpoint: Option<usize>,
}

impl GenerateRequest {
    /// Greedy decoding of at most `max_tokens` tokens, no stop ids, no alternatives, no
    /// checkpoint.
    pub fn greedy(max_tokens: usize) -> Self {
        GenerateRequest {
            sampling: SamplingParams::greedy(),
            max_tokens,
            stop_ids: Vec::new(),
            top_logprobs: 0,
            checkpoint: None,
        }
    }
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
    /// How the grammar constraint went, when the reply had one.
    pub constraint: Option<ConstraintStats>,
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
    /// The model failed while running this sequence together with others (a batched step
    /// fails every sequence in it); the message is the model's.
    #[error("{0}")]
    Failed(String),
}

impl EngineError {
    /// The same error for another sequence of a failed batch: request errors stay request
    /// errors (the caller's input was at fault), everything else becomes [`EngineError::Failed`].
    pub fn for_batch_member(&self) -> EngineError {
        match self {
            EngineError::Request(m) | EngineError::Model(ModelError::Input(m)) => EngineError::Request(m.clone()),
            other => EngineError::Failed(other.to_string()),
        }
    }
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
    /// Drafts for [`Session::generate`]'s speculative steps.
    drafter: Box<LookupDrafter>,
    /// The MTP head's drafter, in `mtp` mode and in `auto` when the model has the head.
    mtp: Option<Box<MtpDrafter>>,
    /// What speculation did so far.
    spec_stats: SpeculationStats,
    /// Most bytes of recurrent state kept row by row in one verification.
    row_state_budget: usize,
}

impl Session {
    /// An empty session.
    pub fn new(model: Arc<dyn CausalLm>) -> Self {
        let cache = model.new_cache();
        Session {
            model,
            cache,
            tokens: Vec::new(),
            last_logits: None,
            snapshots: Vec::new(),
            drafter: Box::new(LookupDrafter::new(SpeculativeMode::default())),
            mtp: None,
            spec_stats: SpeculationStats::default(),
            row_state_budget: ROW_STATE_BUDGET,
        }
        .with_speculative(SpeculativeMode::default())
    }

    fn with_speculative(mut self, mode: SpeculativeMode) -> Self {
        self.set_speculative(mode);
        self
    }

    /// Sets how [`generate`](Self::generate) and [`speculative_decode_step`] draft tokens
    /// (`auto` by default; see [`crate::speculative`]).
    pub fn set_speculative(&mut self, mode: SpeculativeMode) {
        *self.drafter = LookupDrafter::new(mode);
        self.mtp = match (mode, self.model.mtp()) {
            (SpeculativeMode::Mtp | SpeculativeMode::Auto, Some(head)) => Some(Box::new(MtpDrafter::new(head, mode))),
            _ => None,
        };
    }

    /// Sets how many bytes of recurrent state a verification may keep row by row to return
    /// from a rejected draft by a swap (default [`ROW_STATE_BUDGET`]); drafts whose rows need
    /// more take a snapshot and rerun the kept rows instead (0: always). For benchmarks and
    /// tests of both ways; no effect on attention-only models, which cut back for free.
    pub fn set_row_state_budget(&mut self, bytes: usize) {
        self.row_state_budget = bytes;
    }

    /// Fixes the MTP head's draft length (1..=4) until the next verification adapts it;
    /// for benchmarks. No effect without an MTP drafter.
    pub fn set_mtp_draft_len(&mut self, k: usize) {
        if let Some(m) = self.mtp.as_mut() {
            m.set_draft_len(k);
        }
    }

    /// True when [`generate`](Self::generate) drafts with the model's MTP head (`mtp`, or
    /// `auto` on a model that has one); otherwise `lookup` and `auto` draft by prompt lookup.
    pub fn drafts_with_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// How [`generate`](Self::generate) drafts tokens.
    pub fn speculative(&self) -> SpeculativeMode {
        self.drafter.mode()
    }

    /// What speculation did over this session's generations so far.
    pub fn speculation_stats(&self) -> SpeculationStats {
        self.spec_stats
    }

    /// Tokens whose state the session holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The model.
    pub fn model(&self) -> &Arc<dyn CausalLm> {
        &self.model
    }

    /// A session holding a given state: `cache` after `tokens`, and the logits after the last
    /// of them when known (otherwise the next prompt reruns its last token). The caller
    /// vouches that the cache is the model's state after those tokens; [`crate::persist`]
    /// restores saved states this way (and bench/ builds long synthetic ones).
    pub fn from_state(model: Arc<dyn CausalLm>, cache: Cache, tokens: Vec<u32>, logits: Option<Vec<f32>>) -> Session {
        let known = logits.is_some();
        let mut s = Session {
            model,
            cache,
            tokens,
            last_logits: logits,
            snapshots: Vec::new(),
            drafter: Box::new(LookupDrafter::new(SpeculativeMode::default())),
            mtp: None,
            spec_stats: SpeculationStats::default(),
            row_state_budget: ROW_STATE_BUDGET,
        }
        .with_speculative(SpeculativeMode::default());
        if known {
            s.remember();
        }
        s
    }

    /// The model's state after [`tokens`](Self::tokens).
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The points of this history worth saving, latest first: the end (when its logits are
    /// known), then the latest earlier prompt end (where the next turn of a conversation
    /// whose template re-renders the reply differently starts). Each is the position, the
    /// snapshot holding its recurrent state (`None`: the cache's current one) and its logits.
    pub(crate) fn save_points(&self) -> Vec<(usize, Option<&CacheSnapshot>, &[f32])> {
        let end = self.tokens.len();
        let mut points = Vec::new();
        if let Some(logits) = &self.last_logits {
            if end > 0 {
                points.push((end, None, logits.as_slice()));
            }
        }
        let earlier = self.snapshots.iter().rev().find(|(s, l)| s.pos > 0 && s.pos < end && !l.is_empty());
        if let Some((snap, logits)) = earlier {
            points.push((snap.pos, Some(snap), logits.as_slice()));
        }
        points
    }

    /// Forgets everything.
    pub fn reset(&mut self) {
        self.cache = self.model.new_cache();
        self.tokens.clear();
        self.last_logits = None;
        self.snapshots.clear();
        if let Some(m) = self.mtp.as_mut() {
            m.rewind(0);
        }
    }

    /// A new session that starts where this one stood after its first `upto` tokens (or the
    /// longest earlier point it can reach), so a second conversation sharing that prefix does
    /// not recompute it. The state is copied; this session is untouched. `None` when no
    /// point after the first token is reachable (nothing worth copying).
    pub fn fork(&self, upto: usize) -> Option<Session> {
        let upto = upto.min(self.tokens.len());
        let copy = |cache: Cache, len: usize, logits: Option<Vec<f32>>| {
            let s = Session {
                model: Arc::clone(&self.model),
                cache,
                tokens: self.tokens[..len].to_vec(),
                last_logits: logits,
                snapshots: Vec::new(),
                drafter: Box::new(LookupDrafter::new(self.drafter.mode())),
                mtp: None,
                spec_stats: SpeculationStats::default(),
                row_state_budget: self.row_state_budget,
            };
            let mut s = s.with_speculative(self.drafter.mode());
            // The step timings belong to the model and the machine: the fork starts with them.
            *s.drafter = LookupDrafter::with_timings_of(self.drafter.mode(), &self.drafter);
            s
        };
        if upto == self.tokens.len() && upto > 0 {
            let mut s = copy(self.cache.clone(), upto, self.last_logits.clone());
            s.remember();
            return Some(s);
        }
        if self.cache.is_rewindable() && upto > 0 {
            // Any prefix is reachable; the logits after it are known only at a prompt end.
            let mut cache = self.cache.clone();
            cache.truncate(upto).ok()?;
            let mut s = copy(cache, upto, self.logits_at(upto));
            s.remember();
            return Some(s);
        }
        let (snap, logits) = self.snapshots.iter().rev().find(|(s, _)| s.pos <= upto && s.pos > 0)?;
        // The snapshot holds the recurrent state; the attention layers' keys and values come
        // from this cache, cut back to the snapshot.
        let mut cache = self.cache.clone();
        cache.restore(snap).ok()?;
        let mut s = copy(cache, snap.pos, Some(logits.clone()));
        s.remember();
        Some(s)
    }

    /// Brings the state to exactly `prompt` and returns the logits after its last token and
    /// how many of its tokens were reused.
    pub fn prefill(&mut self, prompt: &[u32]) -> Result<(Vec<f32>, usize), EngineError> {
        self.prefill_keeping(prompt, None)
    }

    /// [`prefill`](Self::prefill), also keeping the state at `checkpoint`
    /// ([`GenerateRequest::checkpoint`]).
    pub fn prefill_keeping(
        &mut self,
        prompt: &[u32],
        checkpoint: Option<usize>,
    ) -> Result<(Vec<f32>, usize), EngineError> {
        let reused = self.begin_prefill(prompt)?;
        loop {
            if let Some(logits) = self.prefill_chunk(prompt, usize::MAX, checkpoint)? {
                return Ok((logits, reused));
            }
        }
    }

    /// The first half of a prefill in pieces (the scheduler's chunked prefill): checks
    /// `prompt` and goes back to the longest point of the history it extends. Returns how many
    /// of its tokens are reused; [`prefill_chunk`](Self::prefill_chunk) runs the rest.
    pub fn begin_prefill(&mut self, prompt: &[u32]) -> Result<usize, EngineError> {
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
        if self.tokens.len() == prompt.len() && self.last_logits.is_none() {
            // A cut-back cache without the logits of its last position (a fork): run the last
            // token again.
            self.rewind(prompt.len() - 1, prompt.len());
        }
        Ok(self.tokens.len())
    }

    /// Runs the next at most `max_tokens` tokens of `prompt` (after a
    /// [`begin_prefill`](Self::begin_prefill) with the same prompt). Returns the logits after
    /// the prompt's last token once it is all in, `None` while some is left. No piece is a
    /// lone token (`max_tokens` below [`MIN_PREFILL_CHUNK`](crate::scheduler::MIN_PREFILL_CHUNK)
    /// runs as that, and a piece never leaves one token behind), so every piece goes through
    /// the model's multi-token path as a one-shot prefill does and both give the same logits;
    /// a lone token would take the one-token kernels, whose rounding differs.
    ///
    /// A `checkpoint` inside the part still to run (with at least two tokens on each side)
    /// ends a piece there and keeps the state at it, as at a prompt's end, for a later prompt
    /// that shares this one only that far ([`GenerateRequest::checkpoint`]). Only a cache that
    /// cannot be cut back needs it; others reach any prefix by truncation.
    pub fn prefill_chunk(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        checkpoint: Option<usize>,
    ) -> Result<Option<Vec<f32>>, EngineError> {
        match self.plan_chunk(prompt, max_tokens, checkpoint)? {
            ChunkPlan::In(logits) => {
                self.remember();
                Ok(Some(logits))
            }
            ChunkPlan::Run { from, n, keep } => {
                let logits = self.run(&prompt[from..from + n])?;
                Ok(self.after_chunk(prompt.len(), keep, logits))
            }
        }
    }

    /// What [`prefill_chunk`](Self::prefill_chunk) runs next.
    fn plan_chunk(
        &self,
        prompt: &[u32],
        max_tokens: usize,
        checkpoint: Option<usize>,
    ) -> Result<ChunkPlan, EngineError> {
        let done = self.tokens.len();
        if done > prompt.len() || self.tokens[..] != prompt[..done] {
            return Err(EngineError::Request(
                "prefill_chunk: the session does not hold a prefix of this prompt".into(),
            ));
        }
        let left = prompt.len() - done;
        if left == 0 {
            return match &self.last_logits {
                Some(logits) => Ok(ChunkPlan::In(logits.clone())),
                None => Err(EngineError::Request("prefill_chunk: the prompt was not begun".into())),
            };
        }
        let max = max_tokens.max(crate::scheduler::MIN_PREFILL_CHUNK);
        let mut n = if left <= max.saturating_add(1) { left } else { max };
        let keep = checkpoint
            .filter(|&c| !self.cache.is_rewindable() && c >= done + 2 && c <= done + n && c + 2 <= prompt.len());
        if let Some(c) = keep {
            n = c - done;
        }
        Ok(ChunkPlan::Run { from: done, n, keep: keep.is_some() })
    }

    /// After a chunk ran (its tokens and logits taken in): keeps the checkpoint or the prompt's
    /// end, and returns the logits when the prompt is all in.
    fn after_chunk(&mut self, prompt_len: usize, keep: bool, logits: Vec<f32>) -> Option<Vec<f32>> {
        if keep {
            self.remember();
        }
        if self.tokens.len() < prompt_len {
            return None;
        }
        self.remember();
        Some(logits)
    }

    /// Brings the cache back to exactly the state after [`tokens`](Self::tokens), after a
    /// forward that panicked partway (a decode step with a prompt chunk in it,
    /// [`speculative_decode_step_with_prompt`]): its layers may hold part of that step's rows.
    /// A cache that can be cut back is cut to the tokens. A hybrid one returns to its latest
    /// snapshot within them (or to empty) and runs the rest again as each part first ran: the
    /// first `prompt_len` tokens in a prompt's order, the generated ones after them stepwise,
    /// as decode steps took them, so the state has the same bits. The logits after the last
    /// token are kept as they were.
    pub fn recover(&mut self, prompt_len: usize) -> Result<(), EngineError> {
        let n = self.tokens.len();
        self.cache.drop_row_states();
        if self.cache.is_rewindable() {
            return self.cache.truncate(n).map_err(EngineError::Failed);
        }
        let from = match self.snapshots.iter().rposition(|(s, _)| s.pos <= n) {
            Some(i) => {
                self.cache.restore(&self.snapshots[i].0).map_err(EngineError::Failed)?;
                self.snapshots[i].0.pos
            }
            None => {
                self.cache = self.model.new_cache();
                0
            }
        };
        let split = prompt_len.clamp(from, n);
        if split > from {
            self.model.forward(&self.tokens[from..split], &mut self.cache, false)?;
        }
        if n > split {
            self.model.forward_stepwise(&self.tokens[split..n], &mut self.cache)?;
        }
        Ok(())
    }

    /// Goes back to the longest point at or before `lcp` (the common prefix with a prompt of
    /// `prompt_len` tokens) that it can reach.
    fn rewind(&mut self, lcp: usize, prompt_len: usize) {
        self.rewind_state(lcp, prompt_len);
        if let Some(m) = self.mtp.as_mut() {
            m.rewind(self.tokens.len());
        }
    }

    fn rewind_state(&mut self, lcp: usize, prompt_len: usize) {
        if self.cache.is_rewindable() && lcp > 0 {
            // The whole prompt is kept when its logits were remembered (it was a prompt
            // before); otherwise its last token runs again.
            let target = match self.logits_at(prompt_len) {
                Some(_) if lcp >= prompt_len => prompt_len,
                _ if lcp >= prompt_len => prompt_len - 1,
                _ => lcp,
            };
            if target > 0 && self.cache.truncate(target).is_ok() {
                self.last_logits = self.logits_at(target);
                self.tokens.truncate(target);
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
        let logits = match (self.mtp.as_mut(), self.model.mtp()) {
            (Some(drafter), Some(head)) => {
                // The same logits, with the hidden states the MTP head drafts from.
                let (logits, hidden) = head.forward_with_hidden(ids, &mut self.cache, false)?;
                drafter.observe(self.tokens.len(), &hidden);
                logits
            }
            _ => self.model.forward(ids, &mut self.cache, false)?,
        };
        self.take_in(ids, &logits);
        Ok(logits)
    }

    /// Takes `ids` in as run, with the logits after the last of them.
    fn take_in(&mut self, ids: &[u32], logits: &[f32]) {
        self.tokens.extend_from_slice(ids);
        self.last_logits = Some(logits.to_vec());
    }

    /// The logits after the first `pos` tokens, when known (the current end, or a snapshot).
    fn logits_at(&self, pos: usize) -> Option<Vec<f32>> {
        if pos == self.tokens.len() {
            return self.last_logits.clone();
        }
        self.snapshots.iter().find(|(s, _)| s.pos == pos).map(|(_, l)| l.clone())
    }

    /// Keeps a snapshot of the current point (a prompt end). For a rewindable cache it holds
    /// no state, only the position and the logits there: any prefix is reachable by
    /// truncation, but the logits of a cut-back point are known only where they were kept,
    /// and a rerun of the last token would go through the one-token kernels, whose rounding
    /// differs from the prompt's (quantized models).
    fn remember(&mut self) {
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
        on_token: impl FnMut(&TokenChoice) -> ControlFlow<()>,
    ) -> Result<Generation, EngineError> {
        self.generate_constrained(prompt, req, None, on_token)
    }

    /// [`generate`](Self::generate) with every token sampled under `constraint`'s grammar
    /// (see [`crate::constraint`]).
    pub fn generate_constrained(
        &mut self,
        prompt: &[u32],
        req: &GenerateRequest,
        constraint: Option<Constraint>,
        on_token: impl FnMut(&TokenChoice) -> ControlFlow<()>,
    ) -> Result<Generation, EngineError> {
        self.generate_with_progress(prompt, req, constraint, None, on_token)
    }

    /// [`generate_constrained`](Self::generate_constrained) that can report a long prefill's
    /// progress: with `on_prefill`, a prompt whose new part is longer than two
    /// [`PROGRESS_PIECE`]s runs in pieces of that many tokens (the same logits as in one piece,
    /// see [`prefill_chunk`](Self::prefill_chunk)), and `on_prefill(done, total)` hears the
    /// prompt tokens in the state before the first piece and after each one. A 4B model on
    /// two laptop cores prefills ~25 tokens a second, so a long file in the prompt is minutes
    /// of silence without it.
    pub fn generate_with_progress(
        &mut self,
        prompt: &[u32],
        req: &GenerateRequest,
        constraint: Option<Constraint>,
        on_prefill: Option<&mut dyn FnMut(usize, usize)>,
        mut on_token: impl FnMut(&TokenChoice) -> ControlFlow<()>,
    ) -> Result<Generation, EngineError> {
        let (mut decoding, first) = match on_prefill {
            None => self.start_constrained(prompt, req, constraint)?,
            Some(report) => {
                req.sampling.validate().map_err(EngineError::Request)?;
                let cached = self.begin_prefill(prompt)?;
                let piece = if runs_in_pieces(prompt.len() - cached) { PROGRESS_PIECE } else { usize::MAX };
                report(self.tokens.len(), prompt.len());
                let logits = loop {
                    let all_in = self.prefill_chunk(prompt, piece, req.checkpoint)?;
                    report(self.tokens.len(), prompt.len());
                    if let Some(logits) = all_in {
                        break logits;
                    }
                };
                self.start_decoding(prompt.len(), cached, &logits, req, constraint)
            }
        };
        let mut new: Vec<TokenChoice> = first.into_iter().collect();
        loop {
            for (i, choice) in new.iter().enumerate() {
                if on_token(choice).is_break() {
                    decoding.cancel_unseen(new.len() - i - 1);
                    break;
                }
            }
            if decoding.is_finished() {
                break;
            }
            new = speculative_decode_step(&mut [(&mut *self, &mut decoding)])?.pop().unwrap_or_default();
        }
        if let Some(failure) = decoding.take_failure() {
            return Err(EngineError::Failed(failure));
        }
        Ok(decoding.into_generation())
    }

    /// The drafts to check after `decoding`'s last token (docs/speculative.md), and whether the
    /// MTP head made them: none when the session's mode does not draft for this reply (`none`;
    /// `auto` for a sampled one), when there is no room for them (`max_tokens`, the context),
    /// or when neither the context has a match nor the head is ready (its hidden state comes
    /// with the step's forward, so after a prompt or a recompute the next step drafts).
    /// `auto` with a head takes a lookup draft where the context has one (an edit's copied
    /// lines hold far more often than the head's guesses, and cost no head pass), the
    /// head's otherwise, unless its pause rule holds it back.
    fn drafts_for(&mut self, decoding: &Decoding) -> Result<(Vec<u32>, bool), EngineError> {
        let Some(last) = decoding.tokens.last().map(|t| t.id) else { return Ok((Vec::new(), false)) };
        // Room for the drafts: all of them plus the token after them within max_tokens, and
        // in the context.
        let room_len = decoding.req.max_tokens.saturating_sub(decoding.tokens.len() + 1);
        let room_ctx = self.model.max_context().saturating_sub(self.tokens.len() + 2);
        let limit = room_len.min(room_ctx).min(MAX_DRAFT);
        // `auto` leaves sampled replies plain: drafting keeps their distribution but draws
        // another random stream, so a seeded reply is the same text with `none` as with
        // `auto`. `lookup` and `mtp` draft for them too.
        let sampled = decoding.req.sampling.temperature > 0.0;
        let mode = self.drafter.mode();
        if limit == 0 || mode == SpeculativeMode::None || (mode == SpeculativeMode::Auto && sampled) {
            return Ok((Vec::new(), false));
        }
        let mut context = Vec::with_capacity(self.tokens.len() + 1);
        context.extend_from_slice(&self.tokens);
        context.push(last);
        let model = Arc::clone(&self.model);
        match (self.mtp.as_mut(), model.mtp()) {
            (Some(drafter), Some(head)) => {
                let copied =
                    if mode == SpeculativeMode::Auto { self.drafter.draft(&context, limit) } else { Vec::new() };
                if !copied.is_empty() {
                    return Ok((copied, false));
                }
                if drafter.paused() {
                    return Ok((Vec::new(), false));
                }
                Ok((drafter.draft(head, &context, limit)?, true))
            }
            _ => Ok((self.drafter.draft(&context, limit), false)),
        }
    }

    /// Takes the logits of a verification of `ids` (the last token, then its drafts) that has
    /// just advanced the cache past all of them: samples position by position while the
    /// model agrees with the drafts, and returns the tokens chosen and how many of `ids` are
    /// kept (the caller brings the cache back to them). Records the logits after the last
    /// one kept; the drafter's record is the caller's ([`Self::record_verification`]).
    fn choose_along(&mut self, decoding: &mut Decoding, ids: &[u32], logits: &[f32]) -> (Vec<TokenChoice>, usize) {
        let vocab = self.model.vocab_size();
        let drafts = &ids[1..];
        let mut out = Vec::new();
        let mut kept = 0;
        for (j, &id) in ids.iter().enumerate() {
            self.tokens.push(id);
            kept = j + 1;
            let draft = drafts.get(j).copied();
            let Some(choice) = choose_guarded(decoding, &logits[j * vocab..(j + 1) * vocab], self, draft) else {
                break;
            };
            let agreed = Some(choice.id) == draft;
            out.push(choice);
            if !agreed || decoding.is_finished() {
                break;
            }
        }
        self.last_logits = Some(logits[(kept - 1) * vocab..kept * vocab].to_vec());
        (out, kept)
    }

    /// Counts a verification of `drafted` drafts of which the first `accepted` held, and tells
    /// the drafter that made them (the MTP head's when `by_mtp`), which sizes its next drafts.
    fn record_verification(&mut self, drafted: usize, accepted: usize, by_mtp: bool) {
        match self.mtp.as_mut() {
            Some(drafter) if by_mtp => drafter.record(drafted, accepted),
            _ => self.drafter.record(drafted, accepted),
        }
        self.spec_stats.verifications += 1;
        self.spec_stats.drafted += drafted as u64;
        self.spec_stats.accepted += accepted as u64;
    }

    /// Starts a generation: runs `prompt` (reusing what it can) and samples the first token,
    /// which is returned (`None` only when `max_tokens` is 0). Further tokens come from
    /// [`decode_step`], which advances many sessions' generations in one batched forward.
    pub fn start(
        &mut self,
        prompt: &[u32],
        req: &GenerateRequest,
    ) -> Result<(Decoding, Option<TokenChoice>), EngineError> {
        self.start_constrained(prompt, req, None)
    }

    /// [`start`](Self::start) with every token sampled under `constraint`'s grammar; its
    /// first mask is computed while the prompt is prefilled. The first token is `None` also
    /// when the grammar allows none (the generation has then ended).
    pub fn start_constrained(
        &mut self,
        prompt: &[u32],
        req: &GenerateRequest,
        constraint: Option<Constraint>,
    ) -> Result<(Decoding, Option<TokenChoice>), EngineError> {
        req.sampling.validate().map_err(EngineError::Request)?;
        let (logits, cached_tokens) = self.prefill_keeping(prompt, req.checkpoint)?;
        Ok(self.start_decoding(prompt.len(), cached_tokens, &logits, req, constraint))
    }

    /// Starts a generation on a session whose prompt is all in (a [`prefill`](Self::prefill),
    /// or the last [`prefill_chunk`](Self::prefill_chunk)): `logits` are the ones after its
    /// last token, `cached_tokens` how many were reused. Samples the first token, as
    /// [`start_constrained`](Self::start_constrained) does; the caller has checked
    /// `req.sampling`.
    pub fn start_decoding(
        &mut self,
        prompt_tokens: usize,
        cached_tokens: usize,
        logits: &[f32],
        req: &GenerateRequest,
        constraint: Option<Constraint>,
    ) -> (Decoding, Option<TokenChoice>) {
        let mut decoding = Decoding {
            sampler: Sampler::new(req.sampling.clone()),
            req: req.clone(),
            tokens: Vec::new(),
            finish: None,
            prompt_tokens,
            cached_tokens,
            constraint,
            failure: None,
        };
        if req.max_tokens == 0 {
            decoding.finish = Some(FinishReason::Length);
            return (decoding, None);
        }
        let choice = decoding.choose(logits, self, None);
        (decoding, choice)
    }
}

/// A generation in progress on a [`Session`] (from [`Session::start`]): the sampler, the
/// tokens so far and, once it has ended, why. Its last token, when it has not ended, is fed
/// to the model by the next [`decode_step`].
pub struct Decoding {
    sampler: Sampler,
    req: GenerateRequest,
    tokens: Vec<TokenChoice>,
    finish: Option<FinishReason>,
    prompt_tokens: usize,
    cached_tokens: usize,
    /// The grammar every token is sampled under, if any.
    constraint: Option<Constraint>,
    /// Why the generation broke off, when its sampling panicked inside a [`decode_step`].
    failure: Option<String>,
}

impl Decoding {
    /// Tokens of the prompt this generation follows.
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// Stops the generation ([`Self::cancel`]) after a token that its caller saw, leaving out
    /// the `unseen` tokens a verification chose after it: they are not part of the reply.
    pub(crate) fn cancel_unseen(&mut self, unseen: usize) {
        if unseen > 0 {
            self.tokens.truncate(self.tokens.len().saturating_sub(unseen));
        }
        self.cancel();
    }

    /// Ends the generation with an engine failure (its state could not be brought back after
    /// a verification): its tokens are not a reply, and [`Self::take_failure`] tells why.
    fn fail(&mut self, message: String) {
        self.failure = Some(message);
        self.finish = Some(FinishReason::Cancelled);
    }

    /// The message of a panic that broke the generation off inside a [`decode_step`] (its
    /// sampling or grammar), taken once. The generation is then finished; its tokens are not
    /// a reply.
    pub fn take_failure(&mut self) -> Option<String> {
        self.failure.take()
    }

    /// True once the generation has ended (stop id, length, full context or cancel).
    pub fn is_finished(&self) -> bool {
        self.finish.is_some()
    }

    /// Why it ended, once it has.
    pub fn finish(&self) -> Option<FinishReason> {
        self.finish
    }

    /// Tokens generated so far (a stop token included).
    pub fn tokens(&self) -> &[TokenChoice] {
        &self.tokens
    }

    /// Stops the generation (a stop string matched, the client left). A generation whose last
    /// token was a stop id keeps [`FinishReason::Stop`].
    pub fn cancel(&mut self) {
        if self.finish != Some(FinishReason::Stop) {
            self.finish = Some(FinishReason::Cancelled);
        }
    }

    /// The result; a generation not yet finished counts as cancelled.
    pub fn into_generation(self) -> Generation {
        Generation {
            tokens: self.tokens,
            finish: self.finish.unwrap_or(FinishReason::Cancelled),
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            constraint: self.constraint.map(|c| c.stats().clone()),
        }
    }

    /// Samples the next token from `logits` (the state after `session`'s tokens), records it
    /// and decides whether generation ends with it. Under a grammar the token is drawn from
    /// the allowed ones, and committing it starts the next mask on the constraint's thread,
    /// so it is computed while the next forward pass runs. `None` (and the generation ended)
    /// when the grammar allows no token.
    /// With `draft`, the position was drafted and the sampler keeps the draft by the
    /// speculative rule ([`Sampler::sample_after_draft`]).
    fn choose(&mut self, logits: &[f32], session: &Session, draft: Option<u32>) -> Option<TokenChoice> {
        let history: &[u32] = if self.req.sampling.repetition_penalty != 1.0 { &session.tokens } else { &[] };
        let mask = match self.constraint.as_mut().map(Constraint::mask) {
            None => None,
            Some(Ok(mask)) => Some(mask),
            Some(Err(_)) => {
                // The grammar cannot go on (its message is in the stats): the reply ends.
                self.finish = Some(FinishReason::Stop);
                return None;
            }
        };
        let choice = match draft {
            Some(draft) => {
                self.sampler.sample_after_draft(logits, history, self.req.top_logprobs, mask.as_ref(), draft)
            }
            None => self.sampler.sample_masked(logits, history, self.req.top_logprobs, mask.as_ref()),
        };
        self.tokens.push(choice.clone());
        let stop_id = self.req.stop_ids.contains(&choice.id);
        // An end-of-turn token ends the reply; any other goes into the grammar, which may be
        // complete with it.
        let grammar_done = match (&mut self.constraint, stop_id) {
            (Some(c), false) => !matches!(c.commit(choice.id), Ok(Commit::Continue)),
            _ => false,
        };
        self.finish = if stop_id || grammar_done {
            Some(FinishReason::Stop)
        } else if self.tokens.len() >= self.req.max_tokens {
            Some(FinishReason::Length)
        } else if session.tokens.len() >= session.model.max_context() {
            Some(FinishReason::ContextFull)
        } else {
            None
        };
        Some(choice)
    }
}

/// Tokens per piece of a prefill whose progress is reported
/// ([`Session::generate_with_progress`]): a few seconds of a 4B model's prefill on a laptop,
/// and long enough that the pieces' matmuls run as fast as one whole prompt's.
pub const PROGRESS_PIECE: usize = 512;

/// Whether [`Session::generate_with_progress`] runs a prompt's `new` tokens (those not
/// reused) in pieces of [`PROGRESS_PIECE`]: more than two pieces' worth.
pub fn runs_in_pieces(new: usize) -> bool {
    new > 2 * PROGRESS_PIECE
}

/// The next step of a prompt's prefill ([`Session::prefill_chunk`]).
enum ChunkPlan {
    /// The prompt is all in: the logits after its last token.
    In(Vec<f32>),
    /// Run `n` tokens from `from`; `keep`: keep the state after them (a checkpoint).
    Run { from: usize, n: usize, keep: bool },
}

/// The next chunk of a prompt being prefilled, to run inside a decode step
/// ([`speculative_decode_step_with_prompt`]): what [`Session::prefill_chunk`] takes.
pub struct PromptChunk<'a> {
    /// The session the prompt goes into (after its [`Session::begin_prefill`]).
    pub session: &'a mut Session,
    /// The whole prompt.
    pub prompt: &'a [u32],
    /// The most tokens to run.
    pub max_tokens: usize,
    /// [`GenerateRequest::checkpoint`].
    pub checkpoint: Option<usize>,
}

/// How a [`PromptChunk`] of a decode step ended: `None` while some of the prompt is left, the
/// logits after its last token once it is all in, or why it failed (the step went on).
pub type ChunkOutcome = Result<Option<Vec<f32>>, EngineError>;

/// One decode step for many generations at once: every unfinished one's last token goes
/// through the model in a single [`CausalLm::forward_batch`] (the weights are read once for
/// the whole batch), then each samples its next token. Returns, per entry, the new token, or
/// `None` for an entry that had already finished. All sessions must share one model. On an
/// error no session has advanced.
pub fn decode_step(batch: &mut [(&mut Session, &mut Decoding)]) -> Result<Vec<Option<TokenChoice>>, EngineError> {
    let mut out = vec![None; batch.len()];
    let live: Vec<usize> = (0..batch.len()).filter(|&i| !batch[i].1.is_finished()).collect();
    let Some(&first) = live.first() else { return Ok(out) };
    let model = Arc::clone(&batch[first].0.model);
    if live.iter().any(|&i| !std::ptr::addr_eq(Arc::as_ptr(&batch[i].0.model), Arc::as_ptr(&model))) {
        return Err(EngineError::Request("a decode step's sessions must share one model".into()));
    }
    let ids: Vec<u32> = live
        .iter()
        .map(|&i| batch[i].1.tokens.last().expect("an unfinished generation has sampled a token").id)
        .collect();
    let logits = {
        let mut rows: Vec<(u32, &mut Cache)> = Vec::with_capacity(live.len());
        let mut k = 0;
        for (i, (session, _)) in batch.iter_mut().enumerate() {
            if live.get(k) == Some(&i) {
                rows.push((ids[k], &mut session.cache));
                k += 1;
            }
        }
        model.forward_batch(&mut rows)?
    };
    for ((&i, id), logits) in live.iter().zip(ids).zip(logits) {
        let (session, decoding) = &mut batch[i];
        session.tokens.push(id);
        out[i] = choose_guarded(decoding, &logits, session, None);
        session.last_logits = Some(logits);
    }
    Ok(out)
}

/// [`speculative_decode_step`] with the next chunk of a prompt being prefilled in the same
/// forward when it can be ([`CausalLm::forward_batch_stepwise_and_prompt`]): the weights are
/// then read once for the sequences' rows (their drafts included) and the chunk's, so a step
/// bound by memory (a few sequences of a model larger than the caches) prefills the chunk at
/// little more than its own arithmetic; with an MTP drafter in the step or on the prompt's
/// session, through [`frognano_model::MtpHead::forward_batch_with_hidden_and_prompt`], which
/// also gives the hidden states the head drafts from. Not when the chunk is longer than
/// [`frognano_model::PROMPT_PIECE`]. Returns the step's tokens and, when the chunk
/// ran, how it ended ([`ChunkOutcome`], with [`Session::prefill_chunk`]'s meaning: a bad prompt
/// fails only the chunk); `None` when it did not run (the caller runs it apart). On an error
/// of the step itself no session has advanced, the chunk's included.
pub fn speculative_decode_step_with_prompt(
    batch: &mut [(&mut Session, &mut Decoding)],
    chunk: Option<PromptChunk<'_>>,
) -> Result<(Vec<Vec<TokenChoice>>, Option<ChunkOutcome>), EngineError> {
    // The chunk as it runs in the forward (its session, its whole prompt, the ids to run, and
    // whether to keep the state after them), or how it ended without a forward.
    let (mut run, mut outcome) = (None, None);
    if let Some(PromptChunk { session, prompt, max_tokens, checkpoint }) = chunk {
        if batch.iter().any(|(_, d)| !d.is_finished()) {
            match session.plan_chunk(prompt, max_tokens, checkpoint) {
                Err(e) => outcome = Some(Err(e)),
                Ok(ChunkPlan::In(logits)) => {
                    session.remember();
                    outcome = Some(Ok(Some(logits)));
                }
                Ok(ChunkPlan::Run { n, .. }) if n > frognano_model::PROMPT_PIECE => {}
                Ok(ChunkPlan::Run { from, n, keep }) => run = Some((session, prompt, from..from + n, keep)),
            }
        }
    }
    // A sequence alone in its step times it, for `auto`'s judgement of what lookup drafts
    // cost.
    let started = Instant::now();
    let mut drafts = Vec::with_capacity(batch.len());
    let mut by_mtp = Vec::with_capacity(batch.len());
    for (session, decoding) in batch.iter_mut() {
        let (d, mtp) = if decoding.is_finished() { (Vec::new(), false) } else { session.drafts_for(decoding)? };
        drafts.push(d);
        by_mtp.push(mtp);
    }
    let Some((session, prompt, ids, keep)) = run else {
        return Ok((step_with_drafts(batch, drafts, by_mtp, started, None)?.0, outcome));
    };
    let (tokens, logits) = step_with_drafts(batch, drafts, by_mtp, started, Some((&mut *session, &prompt[ids])))?;
    Ok((tokens, logits.map(|logits| Ok(session.after_chunk(prompt.len(), keep, logits)))))
}

/// [`decode_step`] with speculation (docs/speculative.md): every unfinished generation whose
/// session drafts ([`Session::set_speculative`]; prompt lookup or the model's MTP head) puts
/// its last token and its drafts through one [`CausalLm::forward_batch_stepwise`] together
/// with the others' last tokens, so the weights are read once for all of them (with an MTP
/// drafter in the batch, [`frognano_model::MtpHead::forward_batch_with_hidden`], whose
/// hidden states the head drafts the next step from); each then keeps the drafts its model
/// agrees with (greedy: the argmax, sampled: the rejection rule of
/// [`crate::speculative::pick_after_draft`]) and its cache is brought back to the last token
/// kept: an attention-only cache is cut back; a hybrid one swaps in the recurrent state it
/// kept for that row during the verification (drafts within [`ROW_STATE_BUDGET`]), or
/// returns to a snapshot taken before and runs the kept tokens again (longer drafts; all
/// such sequences in one more forward). Each entry's
/// tokens are those plain decoding would give (greedy: the same; sampled: the same
/// distribution). Returns, per entry, its new tokens (at least one for an unfinished
/// generation that goes on; none for one that had finished). When no session drafts and
/// none has an MTP drafter it is [`decode_step`]. On an error no session has advanced.
pub fn speculative_decode_step(
    batch: &mut [(&mut Session, &mut Decoding)],
) -> Result<Vec<Vec<TokenChoice>>, EngineError> {
    Ok(speculative_decode_step_with_prompt(batch, None)?.0)
}

/// A verification step's tokens (per entry) and the logits after a prompt chunk run in it.
type DraftedStep = (Vec<Vec<TokenChoice>>, Option<Vec<f32>>);

/// The rest of [`speculative_decode_step`] once every sequence's drafts are known (`by_mtp`:
/// drafted by the MTP head); `started`: when the step began, for `auto`'s timing. `prompt`: a
/// session and its prompt's next chunk to run in the same forward (never with an MTP head in
/// the step); the chunk's session takes its ids and logits in, and the logits are returned.
fn step_with_drafts(
    batch: &mut [(&mut Session, &mut Decoding)],
    drafts: Vec<Vec<u32>>,
    by_mtp: Vec<bool>,
    started: Instant,
    prompt: Option<(&mut Session, &[u32])>,
) -> Result<DraftedStep, EngineError> {
    // A sequence alone in its step times it, for `auto`'s judgement of what lookup drafts
    // cost.
    let timed =
        |session: &mut Session, rows: usize| session.drafter.record_step_time(rows, started.elapsed().as_secs_f64());
    // Sessions drafting with an MTP head need the hidden states of every forward they take
    // part in (the head drafts from the last one), drafting or not this step.
    let heads = batch.iter().any(|(s, d)| s.mtp.is_some() && !d.is_finished());
    // So does a prompt chunk's session that drafts with one (its prefill feeds the head).
    let prompt_head = prompt.as_ref().is_some_and(|(s, _)| s.mtp.is_some());
    // A step with a prompt chunk takes the path below even without drafts: its undrafted
    // entries are one id each, which a stepwise pass gives `forward_batch`'s bits.
    if drafts.iter().all(Vec::is_empty) && !heads && prompt.is_none() {
        let out: Vec<Vec<TokenChoice>> = decode_step(batch)?.into_iter().map(|t| t.into_iter().collect()).collect();
        if let [(session, _)] = batch {
            timed(session, 1);
        }
        return Ok((out, None));
    }
    let live: Vec<usize> = (0..batch.len()).filter(|&i| !batch[i].1.is_finished()).collect();
    let Some(&first) = live.first() else { return Ok((vec![Vec::new(); batch.len()], None)) };
    let model = Arc::clone(&batch[first].0.model);
    let same = |s: &Session| std::ptr::addr_eq(Arc::as_ptr(&s.model), Arc::as_ptr(&model));
    if live.iter().any(|&i| !same(batch[i].0)) || prompt.as_ref().is_some_and(|(s, _)| !same(s)) {
        return Err(EngineError::Request("a decode step's sessions must share one model".into()));
    }
    let head = model.mtp().filter(|_| heads || prompt_head);
    let chunk_ran = prompt.is_some();
    let mut prompt_logits = None;
    // Per live entry: the last token and its drafts.
    let ids: Vec<Vec<u32>> = live
        .iter()
        .map(|&i| {
            let last = batch[i].1.tokens.last().expect("an unfinished generation has sampled a token").id;
            std::iter::once(last).chain(drafts[i].iter().copied()).collect()
        })
        .collect();
    // How each drafting hybrid sequence will come back from a rejected draft: short drafts
    // keep the recurrent states row by row in the verification itself (a swap afterwards),
    // long ones take a snapshot now and rerun the kept rows after (keeping 15 rows of a 4B
    // model's states would hold 720 MB).
    let rollbacks: Vec<Rollback> = live
        .iter()
        .map(|&i| {
            let n = drafts[i].len();
            let budget = batch[i].0.row_state_budget;
            let cache = &mut batch[i].0.cache;
            if n == 0 || cache.is_rewindable() {
                Rollback::Truncate
            } else if n * cache.row_state_bytes() <= budget {
                cache.keep_row_states(n);
                Rollback::RowStates
            } else {
                Rollback::Snapshot(cache.snapshot())
            }
        })
        .collect();
    let (logits, hidden): (Vec<Vec<f32>>, Vec<Vec<f32>>) = {
        let mut rows: Vec<(&[u32], &mut Cache)> = Vec::with_capacity(live.len());
        let mut k = 0;
        for (i, (session, _)) in batch.iter_mut().enumerate() {
            if live.get(k) == Some(&i) {
                rows.push((&ids[k], &mut session.cache));
                k += 1;
            }
        }
        match (head, prompt) {
            (head, Some((session, chunk))) => {
                let (rows, last) = match head {
                    Some(head) => {
                        let (rows, (last, hidden)) =
                            head.forward_batch_with_hidden_and_prompt(&mut rows, (chunk, &mut session.cache))?;
                        if let Some(drafter) = session.mtp.as_mut() {
                            drafter.observe(session.tokens.len(), &hidden);
                        }
                        (rows.into_iter().unzip(), last)
                    }
                    None => {
                        let (rows, last) =
                            model.forward_batch_stepwise_and_prompt(&mut rows, (chunk, &mut session.cache))?;
                        ((rows, Vec::new()), last)
                    }
                };
                session.take_in(chunk, &last);
                prompt_logits = Some(last);
                rows
            }
            (Some(head), None) => head.forward_batch_with_hidden(&mut rows)?.into_iter().unzip(),
            (None, None) => (model.forward_batch_stepwise(&mut rows)?, Vec::new()),
        }
    };
    let mut out = vec![Vec::new(); batch.len()];
    // Hybrid sequences that kept fewer tokens than they ran: (entry, kept).
    let mut recompute = Vec::new();
    for (k, &i) in live.iter().enumerate() {
        let (session, decoding) = &mut batch[i];
        let base = session.tokens.len();
        let (tokens, kept) = if drafts[i].is_empty() {
            session.tokens.push(ids[k][0]);
            let choice = choose_guarded(decoding, &logits[k], session, None);
            session.last_logits = Some(logits[k].clone());
            (choice.into_iter().collect(), 1)
        } else {
            let (tokens, kept) = session.choose_along(decoding, &ids[k], &logits[k]);
            session.record_verification(drafts[i].len(), kept - 1, by_mtp[i]);
            (tokens, kept)
        };
        if let (Some(drafter), Some(head)) = (session.mtp.as_mut(), head) {
            // The kept positions' hidden states (a recomputation below gives the same bits).
            drafter.observe(base, &hidden[k][..kept * head.hidden_size()]);
        }
        out[i] = tokens;
        match &rollbacks[k] {
            // Also when every row was kept: that ends the keeping of row states.
            Rollback::RowStates => match session.cache.return_to_row(kept) {
                Ok(()) if kept < ids[k].len() => session.spec_stats.returned_to_row += 1,
                Ok(()) => {}
                Err(e) => decoding.fail(format!("speculative decoding could not return to a kept row: {e}")),
            },
            _ if kept == ids[k].len() => {}
            Rollback::Truncate => {
                if let Err(e) = session.cache.truncate(base + kept) {
                    decoding.fail(format!("speculative decoding could not cut the cache back: {e}"));
                }
            }
            Rollback::Snapshot(snap) => match session.cache.restore(snap) {
                Ok(()) => recompute.push((k, i, kept)),
                Err(e) => decoding.fail(format!("speculative decoding could not restore a snapshot: {e}")),
            },
        }
        if decoding.is_finished() {
            session.cache.drop_row_states();
        }
    }
    if !recompute.is_empty() {
        let mut rows: Vec<(&[u32], &mut Cache)> = Vec::with_capacity(recompute.len());
        let mut r = 0;
        for (i, (session, _)) in batch.iter_mut().enumerate() {
            if let Some(&(k, _, kept)) = recompute.get(r).filter(|(_, entry, _)| *entry == i) {
                rows.push((&ids[k][..kept], &mut session.cache));
                r += 1;
            }
        }
        let rerun = model.forward_batch_stepwise(&mut rows);
        drop(rows);
        for &(_, i, _) in &recompute {
            let (session, decoding) = &mut batch[i];
            match &rerun {
                Ok(_) => session.spec_stats.recomputed += 1,
                Err(e) => decoding.fail(format!("speculative decoding could not run the kept tokens again: {e}")),
            }
        }
    }
    if let ([(session, _)], [false], false) = (&mut *batch, by_mtp.as_slice(), chunk_ran) {
        timed(session, 1 + drafts[0].len());
    }
    Ok((out, prompt_logits))
}

/// Most bytes of recurrent state a sequence keeps row by row during one verification
/// ([`Cache::keep_row_states`]) unless set otherwise ([`Session::set_row_state_budget`]);
/// longer drafts roll back from a snapshot instead. 256 MiB: five rows of the 4B model's
/// 48 MiB of DeltaNet state, more than the MTP head's four drafts need.
pub const ROW_STATE_BUDGET: usize = 256 << 20;

/// How a sequence of a speculative step comes back to its last kept token.
enum Rollback {
    /// An attention-only cache (or no drafts): cut the keys and values back.
    Truncate,
    /// The verification kept the recurrent state after each row: swap the kept one in.
    RowStates,
    /// Restore this snapshot and run the kept rows again.
    Snapshot(CacheSnapshot),
}

/// [`Decoding::choose`] with a panic in one sequence's sampling (its grammar, its penalties)
/// ending that sequence only: the others of a batched step go on.
fn choose_guarded(
    decoding: &mut Decoding,
    logits: &[f32],
    session: &Session,
    draft: Option<u32>,
) -> Option<TokenChoice> {
    let chosen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decoding.choose(logits, session, draft)));
    chosen.unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        decoding.failure = Some(format!("the engine panicked while sampling a token: {message}"));
        decoding.finish = Some(FinishReason::Cancelled);
        None
    })
}
