//! Where an architecture's weights come from, in one vocabulary: Hugging Face tensor names.
//!
//! Each architecture writes its weight map once (`qwen35::Qwen35Map`, `llama::LlamaMap`): every
//! tensor's HF name, shape and [`Role`]. Its one `load` reads that map from any
//! [`TensorSource`] — a safetensors folder ([`crate::safetensors_dir::SafetensorsDir`]), a
//! GGUF file through its name adapter ([`crate::gguf_weights::GgufWeights`]), the trainer's
//! weight store — and the trainer and a later GPU upload walk the same map instead of
//! restating it. What differs between sources is said here once:
//!
//! * the conversions a role implies ([`Role::to_model`]: `1 + w` for zero-centred norms,
//!   `A = −exp(A_log)`), which a source may already have applied
//!   ([`TensorSource::stores_model_form`]: GGUF does);
//! * the row order of heads ([`Layout`]): DeltaNet value heads grouped (HF) or tiled (GGUF),
//!   RoPE pairs as halves (HF) or adjacent (GGUF `llama` files permute the q/k rows).

use std::convert::Infallible;
use std::path::Path;

use crate::error::{ModelError, Result};
use crate::tensor::Matrix;

/// What a weight is for; decides how its stored values become what the model multiplies by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `[vocab, d]` token embedding (rows looked up; the output head too when tied).
    Embedding,
    /// `[out, in]` weight of a projection `x · Wᵀ`.
    Linear,
    /// A query or key projection `[heads·dh, in]` whose output RoPE rotates in pairs (GGUF
    /// `llama` files store its rows permuted for adjacent pairs, see [`RopeStyle`]).
    RotaryLinear {
        /// Heads in the output rows.
        heads: usize,
    },
    /// A norm scale multiplied as stored.
    Norm,
    /// A zero-centred norm scale: stored `w`, multiplied as `1 + w`.
    ZeroCentredNorm,
    /// DeltaNet decay rate: stored `A_log`, used as `A = −exp(A_log)`.
    LogDecay,
    /// Any other vector used as stored (biases, conv kernels, `dt_bias`, RoPE frequency factors).
    Vector,
}

impl Role {
    /// True for the 2-D weights read as [`Matrix`].
    pub fn is_matrix(self) -> bool {
        matches!(self, Role::Embedding | Role::Linear | Role::RotaryLinear { .. })
    }

    /// True for the weights of projections `x · Wᵀ` inside a layer (what LoRA adapts).
    pub fn is_projection(self) -> bool {
        matches!(self, Role::Linear | Role::RotaryLinear { .. })
    }

    /// Stored values (Hugging Face form) turned into what the model uses: `1 + w` for
    /// [`Role::ZeroCentredNorm`], `−exp(A_log)` for [`Role::LogDecay`], unchanged otherwise.
    /// Generic over the backend's element-wise operations, so the CPU model and the trainer's
    /// autograd tensors apply the very same conversions.
    pub fn to_model<T: Elementwise>(self, stored: T) -> std::result::Result<T, T::Error> {
        match self {
            Role::ZeroCentredNorm => stored.plus_one(),
            Role::LogDecay => stored.neg_exp(),
            _ => Ok(stored),
        }
    }
}

/// The element-wise operations [`Role::to_model`] needs from a backend.
pub trait Elementwise: Sized {
    /// What the backend's operations fail with.
    type Error;
    /// `1 + x`, element-wise.
    fn plus_one(self) -> std::result::Result<Self, Self::Error>;
    /// `−exp(x)`, element-wise.
    fn neg_exp(self) -> std::result::Result<Self, Self::Error>;
}

impl Elementwise for Vec<f32> {
    type Error = Infallible;
    fn plus_one(self) -> std::result::Result<Self, Infallible> {
        Ok(self.into_iter().map(|w| 1.0 + w).collect())
    }
    fn neg_exp(self) -> std::result::Result<Self, Infallible> {
        Ok(self.into_iter().map(|a| -a.exp()).collect())
    }
}

/// One weight of an architecture's map: its Hugging Face name (canonical `model.` prefix),
/// shape as Hugging Face stores it, and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightSpec {
    /// Canonical Hugging Face name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// Shape as Hugging Face stores it (`[out, in]` for matrices).
    pub shape: Vec<usize>,
    /// What it is for.
    pub role: Role,
}

impl WeightSpec {
    /// A spec.
    pub fn new(name: impl Into<String>, shape: impl Into<Vec<usize>>, role: Role) -> Self {
        WeightSpec { name: name.into(), shape: shape.into(), role }
    }

    /// The module a weight belongs to: its name without the `.weight` suffix
    /// (`model.layers.0.self_attn.q_proj`).
    pub fn module(&self) -> &str {
        self.name.strip_suffix(".weight").unwrap_or(&self.name)
    }

    /// Elements.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// `(rows, cols)` of a 2-D weight; a vector is one row.
    pub fn dims2(&self) -> (usize, usize) {
        match self.shape.as_slice() {
            [rows, cols] => (*rows, *cols),
            _ => (1, self.elements()),
        }
    }
}

/// Which key head each DeltaNet value head reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadOrder {
    /// Hugging Face: value head `v` reads key head `v / (Hv/Hk)`.
    Grouped,
    /// llama.cpp's converter reorders value heads so that `v` reads key head `v mod Hk`.
    Tiled,
}

impl HeadOrder {
    /// The key head of every value head.
    pub fn key_heads(self, value_heads: usize, key_heads: usize) -> Vec<usize> {
        match self {
            HeadOrder::Grouped => {
                let r = value_heads / key_heads;
                (0..value_heads).map(|v| v / r).collect()
            }
            HeadOrder::Tiled => (0..value_heads).map(|v| v % key_heads).collect(),
        }
    }
}

/// Which dimensions RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`: ggml's "normal" mode, used by GGUF `llama` files (the
    /// converter permutes the q/k rows to match).
    Interleaved,
    /// Halves `(i, i + d/2)`: NeoX / Hugging Face `rotate_half`, used by `qwen2` GGUF files and
    /// by Hugging Face checkpoints.
    Halves,
}

/// How a source orders the rows of head-structured weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// DeltaNet value-head order.
    pub value_heads: HeadOrder,
    /// RoPE pairing the q/k rows are laid out for.
    pub rope: RopeStyle,
}

impl Layout {
    /// Hugging Face order.
    pub const HUGGING_FACE: Layout = Layout { value_heads: HeadOrder::Grouped, rope: RopeStyle::Halves };
}

/// Named tensors an architecture's `load` reads, by Hugging Face name.
pub trait TensorSource {
    /// The file or folder the tensors come from (named in errors).
    fn origin(&self) -> &Path;

    /// How head-structured rows are ordered; Hugging Face order unless said otherwise.
    fn layout(&self) -> Layout {
        Layout::HUGGING_FACE
    }

    /// True when the source has the weight `name`.
    fn contains(&self, name: &str) -> bool;

    /// The 2-D weight `w` (`[rows, cols]`), in its stored dtype where it can stay so.
    fn matrix(&self, w: &WeightSpec) -> Result<Matrix>;

    /// The weight `w` widened to f32, values as the source stores them.
    fn stored_f32(&self, w: &WeightSpec) -> Result<Vec<f32>>;

    /// True when the source stores weights of `role` already converted by
    /// [`Role::to_model`] (GGUF stores `1 + w` and `−exp(A_log)`).
    fn stores_model_form(&self, role: Role) -> bool {
        let _ = role;
        false
    }

    /// The vector `w` as the model uses it: [`Role::to_model`] of the stored values, unless
    /// the source already stores that form.
    fn vector(&self, w: &WeightSpec) -> Result<Vec<f32>> {
        let stored = self.stored_f32(w)?;
        if self.stores_model_form(w.role) {
            return Ok(stored);
        }
        let Ok(v) = w.role.to_model(stored);
        Ok(v)
    }
}

/// Whether the model has its own output head (`lm_head.weight`): yes when the source holds
/// one, no when the head is tied to the embedding, an error naming the missing tensor when
/// the config says the head is untied but the source has none.
pub fn has_output_head(src: &dyn TensorSource, tied: bool) -> Result<bool> {
    if src.contains(LM_HEAD) {
        Ok(true)
    } else if tied {
        Ok(false)
    } else {
        Err(ModelError::MissingTensor {
            path: src.origin().to_path_buf(),
            name: format!("{LM_HEAD} (config.json says tie_word_embeddings is false)"),
        })
    }
}

/// Hugging Face name of the token embedding.
pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
/// Hugging Face name of the untied output head.
pub const LM_HEAD: &str = "lm_head.weight";
/// Hugging Face name of the final norm.
pub const FINAL_NORM: &str = "model.norm.weight";

/// Name of weight `suffix` of decoder layer `i` (`model.layers.{i}.{suffix}`).
pub fn layer_name(i: usize, suffix: &str) -> String {
    format!("model.layers.{i}.{suffix}")
}
