//! # frognano-model
//!
//! Weights in, logits out. One file per architecture ([`qwen35`]), reading like the math in
//! `shared/docs/qwen35.md`; hot kernels in [`kernels`] with plain reference versions kept
//! for tests; caches in [`cache`]; tokenizer and chat template beside them.
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
pub mod error;
pub mod gguf;
pub mod gguf_load;
pub mod hub;
pub mod kernels;
pub mod llama;
pub mod load;
pub mod quant;
pub mod qwen35;
pub mod qwen35_gguf;
pub mod safetensors_dir;
pub mod tensor;
pub mod tokenizer;

pub use cache::{Cache, CacheSnapshot, LayerCache};
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
    /// Runs `ids` at positions `cache.len()..`, updating `cache`. Returns logits for every
    /// new position (`[ids.len(), vocab]`, row-major) when `all_logits`, else for the last
    /// one only (`[1, vocab]`). An id outside the vocabulary is an error; the cache is then
    /// left unchanged.
    fn forward(&self, ids: &[u32], cache: &mut Cache, all_logits: bool) -> Result<Vec<f32>>;
}
