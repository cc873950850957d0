//! # frognano-model
//!
//! Weights in, logits out. One file per architecture ([`qwen35`], [`llama`]), reading like the
//! math in `docs/model.md`, each with its one weight map and one `load` over any
//! [`weights::TensorSource`] (safetensors folder, GGUF file through [`gguf_weights`]); the
//! tensor type ([`tensor`]) above one matmul dispatch point ([`kernels::matmul`]) above the
//! kernels ([`kernels`], plain reference versions kept for tests) and block formats
//! ([`quant`]); caches in [`cache`]; tokenizer and chat template beside them.
//!
//! ```no_run
//! let m = frognano_model::load("fixtures/qwen35-tiny").unwrap();
//! let mut cache = m.model.new_cache();
//! let logits = m.model.forward(&[1, 2, 3], &mut cache, false).unwrap();
//! assert_eq!(logits.len(), m.model.vocab_size());
//! ```

pub mod cache;
pub mod chat;
pub mod config;
mod decoder;
pub mod dtype;
pub mod error;
pub mod gguf;
pub mod gguf_load;
pub mod gguf_weights;
pub mod hub;
pub mod kernels;
pub mod llama;
pub mod load;
pub mod memory;
pub mod ollama_store;
pub mod quant;
pub mod qwen35;
pub mod qwen35_gguf;
pub mod qwen35_mtp;
pub mod safetensors_dir;
pub mod tensor;
pub mod test_support;
pub mod tokenizer;
pub mod weights;

pub use cache::{Cache, CacheSnapshot, DeviceSlot, DeviceState, KvRows, KvType, LayerCache, LayerLayout};
pub use decoder::PROMPT_PIECE;
pub use error::{ModelError, Result};
pub use load::{load, LoadedModel};

/// A causal language model: runs new tokens after whatever its cache holds.
pub trait CausalLm: Send + Sync {
    /// Rows of the output head (logit width).
    fn vocab_size(&self) -> usize;
    /// Longest context the model supports.
    fn max_context(&self) -> usize;
    /// An empty cache for one sequence.
    fn new_cache(&self) -> Cache;
    /// How [`CausalLm::new_cache`] stores attention keys and values.
    fn kv_type(&self) -> KvType {
        KvType::F32
    }
    /// Makes later caches store keys and values as `ty` (`--kv-cache`). Fails, naming the
    /// reason, for a type this model cannot store.
    fn set_kv_type(&mut self, ty: KvType) -> Result<()> {
        Err(ModelError::Input(format!(
            "this model keeps its own KV cache type ({}); it cannot be set to {ty}",
            self.kv_type()
        )))
    }
    /// Bytes one sequence's cache holds after `tokens` positions (attention keys and values
    /// plus any recurrent state): what a context of that size costs.
    fn cache_bytes(&self, tokens: usize) -> usize {
        let _ = tokens;
        0
    }
    /// Runs `ids` at positions `cache.len()..`, updating `cache`. Returns logits for every
    /// new position (`[ids.len(), vocab]`, row-major) when `all_logits`, else for the last
    /// one only (`[1, vocab]`). An id outside the vocabulary is an error; the cache is then
    /// left unchanged. The CPU architectures run a long prompt in pieces of
    /// [`PROMPT_PIECE`] tokens, so what a prefill holds besides the cache does not grow with
    /// the prompt.
    fn forward(&self, ids: &[u32], cache: &mut Cache, all_logits: bool) -> Result<Vec<f32>>;

    /// One decode step for several sequences at once: runs token `id` after whatever each
    /// `(id, cache)` pair's cache holds (each at its own position) and returns each
    /// sequence's logits (`[vocab]` per entry, in order). Models implement it so that the
    /// weights are read once per step for the whole batch instead of once per sequence; the
    /// default runs [`CausalLm::forward`] per sequence. If any id is outside the vocabulary
    /// it is an error and no cache is changed.
    fn forward_batch(&self, batch: &mut [(u32, &mut Cache)]) -> Result<Vec<Vec<f32>>> {
        check_batch_ids(batch, self.vocab_size())?;
        batch.iter_mut().map(|(id, cache)| self.forward(&[*id], cache, false)).collect()
    }

    /// Runs `ids` at positions `cache.len()..` and returns logits for every new position
    /// (`[ids.len(), vocab]`), each with the same bits that feeding the tokens one at a time
    /// through [`CausalLm::forward_batch`] gives: speculative decoding checks drafted tokens
    /// with it, and its greedy output must be plain decoding's. (A multi-token
    /// [`CausalLm::forward`] sums attention and the recurrent rule in a prompt's order, whose
    /// rounding differs.) Models implement it so the weights are read once for all the rows;
    /// the default runs one decode step per token. When the cache was asked to keep row
    /// states ([`Cache::keep_row_states`]) it keeps them (an implementation calls
    /// [`Cache::keep_state_after_row`] after each row). An id outside the vocabulary is an
    /// error; the cache is then left unchanged.
    fn forward_stepwise(&self, ids: &[u32], cache: &mut Cache) -> Result<Vec<f32>> {
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size()) {
            return Err(ModelError::Input(format!(
                "token id {bad} is out of vocabulary (vocab_size {})",
                self.vocab_size()
            )));
        }
        let mut out = Vec::with_capacity(ids.len() * self.vocab_size());
        for (row, &id) in ids.iter().enumerate() {
            out.extend(self.forward_batch(&mut [(id, &mut *cache)])?.concat());
            if row + 1 < ids.len() {
                cache.keep_state_after_row(row);
            }
        }
        Ok(out)
    }

    /// [`CausalLm::forward_stepwise`] for several sequences in one forward: each `(ids,
    /// cache)` entry runs its ids at its cache's positions, and gets back the logits of every
    /// one of them (`[ids.len(), vocab]`), with the bits a decode step of each token alone
    /// gives. Speculative decoding in a batch checks every sequence's drafts with it (a
    /// sequence without drafts is an entry of one id). Models implement it so the weights are
    /// read once for all the rows; the default runs [`CausalLm::forward_stepwise`] per entry.
    /// An empty entry or an id outside the vocabulary is an error; no cache is then changed.
    fn forward_batch_stepwise(&self, batch: &mut [(&[u32], &mut Cache)]) -> Result<Vec<Vec<f32>>> {
        check_segment_ids(batch, self.vocab_size())?;
        batch.iter_mut().map(|(ids, cache)| self.forward_stepwise(ids, cache)).collect()
    }

    /// A decode step (with drafts) and a piece of a prompt in one pass: every `(ids, cache)`
    /// entry of `batch` runs as [`CausalLm::forward_batch_stepwise`] runs it, and `prompt`'s
    /// ids run after its cache's positions as [`CausalLm::forward`] runs a prompt; returns
    /// each entry's logits (`[ids.len(), vocab]`) and the prompt's last position's (`[vocab]`).
    /// Each has the bits of those two calls made apart (an entry of one id: the bits of
    /// [`CausalLm::forward_batch`]). Models implement it so the weights are read once for
    /// all the rows: while the decode step is bound by memory (a few sequences of a model
    /// larger than the caches), the prompt's rows then cost little more than their
    /// arithmetic, so a server prefills a new prompt beside its running replies without
    /// stalling them. The default makes the two calls. An empty entry or prompt piece, or an
    /// id outside the vocabulary, is an error; no cache is then changed.
    fn forward_batch_stepwise_and_prompt(
        &self,
        batch: &mut [(&[u32], &mut Cache)],
        prompt: (&[u32], &mut Cache),
    ) -> Result<(Vec<Vec<f32>>, Vec<f32>)> {
        check_segment_ids(batch, self.vocab_size())?;
        check_ids(prompt.0, self.vocab_size())?;
        let rows = if batch.iter().all(|(ids, _)| ids.len() == 1) {
            // A plain decode step: one batched forward.
            let mut step: Vec<(u32, &mut Cache)> = batch.iter_mut().map(|(ids, c)| (ids[0], &mut **c)).collect();
            self.forward_batch(&mut step)?.into_iter().collect()
        } else {
            self.forward_batch_stepwise(batch)?
        };
        Ok((rows, self.forward(prompt.0, prompt.1, false)?))
    }

    /// The model's multi-token-prediction head, when it has one (Qwen3.5 checkpoints with
    /// `mtp.*` weights): what `--speculative mtp` drafts with.
    fn mtp(&self) -> Option<&dyn MtpHead> {
        None
    }

    /// Bytes free on the device this model's caches live in, for a model on an accelerator
    /// (what [`memory::check_context`] checks a context against); `None` on the CPU.
    fn device_memory_free(&self) -> Option<u64> {
        None
    }

    /// The model as its concrete type, for code that builds on it (frognano-gpu uploads a
    /// loaded [`qwen35::Qwen35`] or [`llama::Llama`]); `None` for models that do not say.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

/// Rejects an empty run of ids or one with a token id outside the vocabulary (before any cache
/// is touched).
pub(crate) fn check_ids(ids: &[u32], vocab_size: usize) -> Result<()> {
    if ids.is_empty() {
        return Err(ModelError::Input("no input tokens".into()));
    }
    match ids.iter().find(|&&id| id as usize >= vocab_size) {
        Some(bad) => Err(ModelError::Input(format!("token id {bad} is out of vocabulary (vocab_size {vocab_size})"))),
        None => Ok(()),
    }
}

/// Rejects a batch of segments with an empty one or a token id outside the vocabulary
/// (before any cache is touched).
pub(crate) fn check_segment_ids(batch: &[(&[u32], &mut Cache)], vocab_size: usize) -> Result<()> {
    batch.iter().try_for_each(|(ids, _)| check_ids(ids, vocab_size))
}

/// What [`MtpHead::forward_batch_with_hidden_and_prompt`] returns: per segment (logits,
/// hidden), and the prompt's (last row's logits, every row's hidden state).
pub type WithHiddenAndPrompt = (Vec<(Vec<f32>, Vec<f32>)>, (Vec<f32>, Vec<f32>));

/// A multi-token-prediction head (docs/speculative.md, "MTP drafting"): a small module that
/// reads the main model's last hidden state at position i and the embedding of token i + 1
/// and predicts token i + 2, with an attention layer of its own whose keys and values live in
/// a cache of their own. The main model's forwards that also return those hidden states are
/// here, so a drafter gets them from the same pass that gives the logits.
pub trait MtpHead: Send + Sync {
    /// An empty cache for the head's own attention layer(s).
    fn new_mtp_cache(&self) -> Cache;

    /// Width of a hidden row.
    fn hidden_size(&self) -> usize;

    /// The main model over `ids` at positions `cache.len()..`, as [`CausalLm::forward_stepwise`]
    /// (when `stepwise`: every row's logits, each a decode step's bits) or as
    /// [`CausalLm::forward`] without `all_logits` (the prompt path: the last row's logits),
    /// with the same bits; also returns every row's hidden state after the final norm
    /// (`[ids.len(), d]`), the input of [`MtpHead::mtp_forward`].
    fn forward_with_hidden(&self, ids: &[u32], cache: &mut Cache, stepwise: bool) -> Result<(Vec<f32>, Vec<f32>)>;

    /// The main model over several sequences' segments in one pass, as
    /// [`CausalLm::forward_batch_stepwise`] (every row's logits the bits of a decode step of
    /// that token alone); also returns each segment's hidden states after the final norm
    /// (`[ids.len(), d]`), so MTP drafters inside a batched decode step get them from the
    /// pass that verifies their drafts. Per segment: (logits, hidden).
    fn forward_batch_with_hidden(&self, batch: &mut [(&[u32], &mut Cache)]) -> Result<Vec<(Vec<f32>, Vec<f32>)>>;

    /// [`MtpHead::forward_batch_with_hidden`] with a prompt's piece in the same pass, as
    /// [`CausalLm::forward_batch_stepwise_and_prompt`] runs it: per segment (logits, hidden),
    /// and for the prompt its last row's logits and every row's hidden state (what
    /// [`MtpHead::forward_with_hidden`] gives it apart), each with the bits of the calls apart.
    /// The default makes the two calls.
    fn forward_batch_with_hidden_and_prompt(
        &self,
        batch: &mut [(&[u32], &mut Cache)],
        prompt: (&[u32], &mut Cache),
    ) -> Result<WithHiddenAndPrompt> {
        let rows = self.forward_batch_with_hidden(batch)?;
        Ok((rows, self.forward_with_hidden(prompt.0, prompt.1, false)?))
    }

    /// The head over `t` rows at positions `cache.len()..` of its own cache: row r pairs
    /// `next_ids[r]` (the token after the hidden state's position) with `hidden[r]` (a main
    /// model hidden state after the final norm, or this head's own output for a second
    /// draft). Returns the logits of the last row (of every row when `all_logits`) and every
    /// row's output hidden state (after the head's norm, `[t, d]`).
    fn mtp_forward(
        &self,
        next_ids: &[u32],
        hidden: &[f32],
        cache: &mut Cache,
        all_logits: bool,
    ) -> Result<(Vec<f32>, Vec<f32>)>;
}

/// Rejects a batch with a token id outside the vocabulary (before any cache is touched).
pub(crate) fn check_batch_ids(batch: &[(u32, &mut Cache)], vocab_size: usize) -> Result<()> {
    match batch.iter().find(|(id, _)| *id as usize >= vocab_size) {
        Some((bad, _)) => {
            Err(ModelError::Input(format!("token id {bad} is out of vocabulary (vocab_size {vocab_size})")))
        }
        None => Ok(()),
    }
}
