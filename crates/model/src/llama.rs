//! The llama architecture and its close relatives (docs/model.md §8): Llama 2/3.x (with
//! Llama 3 RoPE scaling), SmolLM/SmolLM2, Mistral, Ministral 3 (YaRN, attention temperature),
//! Qwen2 (q/k/v biases) and Qwen3 (per-head q/k RMSNorms): pre-norm decoder layers of
//! grouped-query attention with RoPE and a SwiGLU MLP.
//!
//! ```text
//! h = embed[ids]
//! per layer:  x = rms_norm(h)·attn_norm
//!             q, k, v = x·Wqᵀ (+bq), x·Wkᵀ (+bk), x·Wvᵀ (+bv)
//!             q, k = rms_norm_per_head(q)·q_norm, rms_norm_per_head(k)·k_norm   (Qwen3)
//!             RoPE on q and k (pair i turns by pos·θ^(−2i/dr) / freq_factor_i · freq_scale)
//!             h += softmax(q·kᵀ/√dh, causal)·v · Woᵀ
//!             x = rms_norm(h)·ffn_norm
//!             h += (silu(x·Wgᵀ) ⊙ x·Wuᵀ)·Wdᵀ
//! logits = rms_norm(h)·output_norm · Woutᵀ   (Wout = embed when tied)
//! ```
//!
//! Numerics follow llama.cpp's CPU path with its default f16 KV cache: keys and values are
//! stored rounded to f16, and the query and the attention weights are rounded to f16 before
//! their dot products with them, as ggml converts the f32 operand of an f16 matmul.

use rayon::prelude::*;

use crate::cache::{Cache, KvRows, KvType, LayerCache};
use crate::decoder::{self, LayerStack, Rows};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::gguf_weights::{GgufArch, GgufWeights};
use crate::kernels::attention::{self, AttnShape};
use crate::quant::ggml::{self, F16Dot};
use crate::quant::QuantType;
use crate::tensor::{round_f16, LowRank, Matrix};
pub use crate::weights::RopeStyle;
use crate::weights::{has_output_head, layer_name, Role, TensorSource, WeightSpec, EMBED_TOKENS, FINAL_NORM, LM_HEAD};
use crate::CausalLm;

/// Shapes and hyper-parameters.
#[derive(Debug, Clone)]
pub struct LlamaConfig {
    /// Architecture name in the file (`llama`, `qwen2`, …).
    pub arch: String,
    /// Model width.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Dimension per head.
    pub head_dim: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f32,
    /// Dimensions rotated per head.
    pub rope_dim: usize,
    /// Pairing of rotated dimensions.
    pub rope_style: RopeStyle,
    /// Training context length.
    pub max_context: usize,
    /// Whether the q/k/v projections have biases (Qwen2-style).
    pub qkv_bias: bool,
    /// Whether the file carries Llama 3.1 RoPE frequency factors (`rope_freqs.weight`).
    pub rope_freqs: bool,
    /// Whether q and k are RMS-normed per head before RoPE (Qwen3's `q_norm`/`k_norm`).
    pub qk_norm: bool,
    /// Llama 3 RoPE scaling from a `config.json` (GGUF files carry the factors it gives as
    /// `rope_freqs.weight` instead).
    pub llama3_scaling: Option<Llama3RopeScaling>,
    /// Linear RoPE scaling: every angle times this (`1 / factor`; 1 for none). With YaRN,
    /// the interpolated angle.
    pub rope_freq_scale: f32,
    /// YaRN RoPE scaling (Qwen2.5 long-context, Ministral 3).
    pub yarn: Option<YarnRope>,
    /// Llama 4 attention temperature (Ministral 3): queries at position `p` are scaled by
    /// `1 + beta · ln(1 + ⌊p / floor⌋)`, as `(beta, floor)`.
    pub attn_temperature: Option<(f32, f32)>,
    /// Layers whose queries and keys get no RoPE at all (SmolLM3's "NoPE" layers: every
    /// fourth); empty for the other architectures.
    pub nope_layers: Vec<usize>,
    /// Phi-3's layout: q/k/v stored as one `qkv_proj` (`attn_qkv`) and gate/up as one
    /// `gate_up_proj` (`ffn_up`), split by rows as they are loaded.
    pub fused_projections: bool,
    /// Phi-3's order: queries scaled by `1/√dh` before attention (before their f16 rounding,
    /// as llama.cpp's graph does), not the scores after it.
    pub prescale_queries: bool,
    /// Phi-3's LongRoPE: the per-pair divisors of the angle in use (`long_factor` when the
    /// context is longer than the original one, else `short_factor`).
    pub longrope_factors: Option<Vec<f32>>,
    /// Multiplies RoPE's cos and sin (LongRoPE's `√(1 + ln(scale) / ln(original))`; 1 for
    /// none; YaRN has its own).
    pub rope_attn_factor: f32,
    /// Granite's multipliers ([`GraniteScales`]); `None` for every other architecture.
    pub granite: Option<GraniteScales>,
}

/// IBM Granite's four multipliers on the llama graph (GGUF `granite.*_scale`, `config.json`
/// `*_multiplier` / `logits_scaling`), applied where llama.cpp's granite graph applies them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GraniteScales {
    /// The token embeddings times this (`embedding_scale`).
    pub embedding: f32,
    /// Each attention and MLP output times this before it is added to the residual stream
    /// (`residual_scale`).
    pub residual: f32,
    /// The attention's score scale, instead of `1/√dh` (`attention.scale`).
    pub attention: f32,
    /// The logits divided by this (times its reciprocal, as ggml does; `logit_scale`).
    pub logits: f32,
}

/// YaRN RoPE scaling as ggml computes it (`rope_yarn` in ggml-cpu's ops.cpp): pair `i` turns
/// by a blend of the interpolated angle (`freq_scale ·` the plain one) and the plain one, the
/// plain share ramping from 1 below pair `corr_dims[0]` to 0 above `corr_dims[1]`, and cos/sin
/// are scaled by `attn_factor · (1 + 0.1 · ln(1 / freq_scale))`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnRope {
    /// How much of the ramp applies (llama.cpp's `yarn_ext_factor`; 1 for YaRN).
    pub ext_factor: f32,
    /// The pairs where the ramp starts and ends (`ggml_rope_yarn_corr_dims`).
    pub corr_dims: [f32; 2],
    /// llama.cpp's `yarn_attn_factor` (the magnitude correction before ggml's own
    /// `1 + 0.1 · ln(factor)`).
    pub attn_factor: f32,
}

impl YarnRope {
    /// YaRN for `factor` over `original_context` positions, as llama.cpp sets it up: the ramp
    /// ends from `beta_fast`/`beta_slow` rotations (`ggml_rope_yarn_corr_dims`), and the
    /// attention factor from `mscale_all_dim` (`rope.scaling.yarn_log_multiplier`, 0 when
    /// absent) cancelling ggml's own correction (llama-context.cpp), times `attn_factor`
    /// (`rope.scaling.attn_factor`, 1 when absent).
    pub fn new(
        factor: f32,
        original_context: f32,
        beta: [f32; 2],
        mscale_all_dim: f32,
        attn_factor: f32,
        rope_dim: usize,
        theta: f32,
    ) -> Self {
        let corr_dim = |rot: f32| {
            rope_dim as f32 * (original_context / (rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * theta.ln())
        };
        let start = corr_dim(beta[0]).floor();
        let end = corr_dim(beta[1]).ceil();
        let get_mscale = |scale: f32, m: f32| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
        let mut a = if mscale_all_dim != 0.0 {
            get_mscale(factor, 1.0) / get_mscale(factor, mscale_all_dim)
        } else {
            get_mscale(factor, 1.0)
        };
        a *= 1.0 / (1.0 + 0.1 * factor.ln());
        YarnRope {
            ext_factor: 1.0,
            corr_dims: [start.max(0.0), end.min(rope_dim as f32 - 1.0)],
            attn_factor: a * attn_factor,
        }
    }
}

/// Llama 3.x RoPE scaling (`rope_scaling` with `rope_type: "llama3"`): long wavelengths are
/// slowed down by `factor`, short ones kept, the band between blended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    /// How much the long wavelengths are stretched.
    pub factor: f32,
    /// Wavelengths above `original_max_position_embeddings / low_freq_factor` get `factor`.
    pub low_freq_factor: f32,
    /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
    pub high_freq_factor: f32,
    /// The context the model was first trained on.
    pub original_max_position_embeddings: f32,
}

impl Llama3RopeScaling {
    /// The per-pair divisors of the RoPE angle, as llama.cpp's converter writes them into
    /// `rope_freqs.weight` (in f32, pair `i` of `dim` rotated dimensions at base `theta`), so
    /// that a checkpoint folder and the GGUF converted from it turn by the same angles.
    pub fn freq_factors(&self, theta: f32, dim: usize) -> Vec<f32> {
        let low_wavelen = self.original_max_position_embeddings / self.low_freq_factor;
        let high_wavelen = self.original_max_position_embeddings / self.high_freq_factor;
        (0..dim / 2)
            .map(|i| {
                let freq = 1.0 / theta.powf((2 * i) as f32 / dim as f32);
                let wavelen = 2.0 * std::f32::consts::PI / freq;
                if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    self.factor
                } else {
                    let smooth = (self.original_max_position_embeddings / wavelen - self.low_freq_factor)
                        / (self.high_freq_factor - self.low_freq_factor);
                    1.0 / ((1.0 - smooth) / self.factor + smooth)
                }
            })
            .collect()
    }
}

/// Every weight of a llama model: Hugging Face name, shape and role, per layer, in
/// checkpoint order. [`Llama::load`] reads it from any [`TensorSource`]; the trainer walks the
/// same map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlamaMap {
    /// `[vocab, d]`.
    pub embed: WeightSpec,
    /// Decoder layers.
    pub layers: Vec<LlamaLayerMap>,
    /// Final norm.
    pub norm: WeightSpec,
    /// `[vocab, d]`; `None` when tied to the embedding.
    pub lm_head: Option<WeightSpec>,
    /// Llama 3.1 RoPE frequency factors `[rope_dim / 2]` (GGUF only).
    pub rope_freqs: Option<WeightSpec>,
}

/// The weights of one llama decoder layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlamaLayerMap {
    /// Pre-attention norm.
    pub attn_norm: WeightSpec,
    /// `[heads·dh, d]`.
    pub q_proj: WeightSpec,
    /// `[kv_heads·dh, d]`.
    pub k_proj: WeightSpec,
    /// `[kv_heads·dh, d]`.
    pub v_proj: WeightSpec,
    /// `[d, heads·dh]`.
    pub o_proj: WeightSpec,
    /// q/k/v biases (Qwen2-style).
    pub qkv_bias: Option<[WeightSpec; 3]>,
    /// Per-head q and k norms `[dh]` (Qwen3).
    pub qk_norm: Option<[WeightSpec; 2]>,
    /// Pre-MLP norm.
    pub ffn_norm: WeightSpec,
    /// `[ffn, d]`.
    pub gate: WeightSpec,
    /// `[ffn, d]`.
    pub up: WeightSpec,
    /// `[d, ffn]`.
    pub down: WeightSpec,
}

impl LlamaMap {
    /// The map for `cfg`, with an `lm_head.weight` when `has_lm_head`.
    pub fn new(cfg: &LlamaConfig, has_lm_head: bool) -> Self {
        let (d, ffn, vocab) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let (q, kv) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
        let layers = (0..cfg.num_layers)
            .map(|i| {
                let w = |suffix: &str, shape: &[usize], role| WeightSpec::new(layer_name(i, suffix), shape, role);
                LlamaLayerMap {
                    attn_norm: w("input_layernorm.weight", &[d], Role::Norm),
                    q_proj: w("self_attn.q_proj.weight", &[q, d], Role::RotaryLinear { heads: cfg.num_heads }),
                    k_proj: w("self_attn.k_proj.weight", &[kv, d], Role::RotaryLinear { heads: cfg.num_kv_heads }),
                    v_proj: w("self_attn.v_proj.weight", &[kv, d], Role::Linear),
                    o_proj: w("self_attn.o_proj.weight", &[d, q], Role::Linear),
                    qkv_bias: cfg.qkv_bias.then(|| {
                        [
                            w("self_attn.q_proj.bias", &[q], Role::Vector),
                            w("self_attn.k_proj.bias", &[kv], Role::Vector),
                            w("self_attn.v_proj.bias", &[kv], Role::Vector),
                        ]
                    }),
                    qk_norm: cfg.qk_norm.then(|| {
                        [
                            w("self_attn.q_norm.weight", &[cfg.head_dim], Role::Norm),
                            w("self_attn.k_norm.weight", &[cfg.head_dim], Role::Norm),
                        ]
                    }),
                    ffn_norm: w("post_attention_layernorm.weight", &[d], Role::Norm),
                    gate: w("mlp.gate_proj.weight", &[ffn, d], Role::Linear),
                    up: w("mlp.up_proj.weight", &[ffn, d], Role::Linear),
                    down: w("mlp.down_proj.weight", &[d, ffn], Role::Linear),
                }
            })
            .collect();
        LlamaMap {
            embed: WeightSpec::new(EMBED_TOKENS, [vocab, d], Role::Embedding),
            layers,
            norm: WeightSpec::new(FINAL_NORM, [d], Role::Norm),
            lm_head: has_lm_head.then(|| WeightSpec::new(LM_HEAD, [vocab, d], Role::Linear)),
            rope_freqs: cfg.rope_freqs.then(|| WeightSpec::new("rope_freqs.weight", [cfg.rope_dim / 2], Role::Vector)),
        }
    }

    /// Every weight in checkpoint order: the embedding, each layer's, the final norm, the
    /// head, the RoPE factors.
    pub fn specs(&self) -> Vec<&WeightSpec> {
        let mut v = vec![&self.embed];
        v.extend(self.layers.iter().flat_map(LlamaLayerMap::specs));
        v.push(&self.norm);
        v.extend(&self.lm_head);
        v.extend(&self.rope_freqs);
        v
    }
}

impl LlamaLayerMap {
    /// This layer's weights in checkpoint order.
    pub fn specs(&self) -> Vec<&WeightSpec> {
        let mut v = vec![&self.attn_norm, &self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj];
        v.extend(self.qkv_bias.iter().flatten());
        v.extend(self.qk_norm.iter().flatten());
        v.extend([&self.ffn_norm, &self.gate, &self.up, &self.down]);
        v
    }
}

/// One decoder layer.
#[derive(Debug, Clone)]
pub struct LlamaLayer {
    /// Pre-attention norm scale.
    pub attn_norm: Vec<f32>,
    /// `[heads·dh, d]`.
    pub wq: Matrix,
    /// `[kv_heads·dh, d]`.
    pub wk: Matrix,
    /// `[kv_heads·dh, d]`.
    pub wv: Matrix,
    /// `[d, heads·dh]`.
    pub wo: Matrix,
    /// Optional q/k/v biases (Qwen2-style).
    pub bias_qkv: Option<[Vec<f32>; 3]>,
    /// Optional per-head q and k norm scales (Qwen3).
    pub qk_norm: Option<[Vec<f32>; 2]>,
    /// Pre-MLP norm scale.
    pub ffn_norm: Vec<f32>,
    /// `[ffn, d]`.
    pub gate: Matrix,
    /// `[ffn, d]`.
    pub up: Matrix,
    /// `[d, ffn]`.
    pub down: Matrix,
}

/// A llama-architecture model.
#[derive(Debug, Clone)]
pub struct Llama {
    /// Shapes.
    pub cfg: LlamaConfig,
    /// `[vocab, d]`.
    pub embed: Matrix,
    /// `[vocab, d]`; `None` when tied to the embedding.
    pub output: Option<Matrix>,
    /// Layers.
    pub layers: Vec<LlamaLayer>,
    /// Final norm scale.
    pub norm: Vec<f32>,
    /// `theta^(−2/rope_dim)`: pair `i` turns by `pos·theta_scale^i` (ggml iterates the product).
    theta_scale: f32,
    /// Llama 3.1 `rope_freqs`: per-pair divisors of the angle.
    freq_factors: Option<Vec<f32>>,
    /// How new caches store keys and values (f16 unless set).
    kv_type: KvType,
}

impl Llama {
    /// Assembles a model from its parts. `freq_factors` (Llama 3.1 `rope_freqs`) divide the
    /// per-pair frequencies when given.
    pub fn new(
        cfg: LlamaConfig,
        embed: Matrix,
        output: Option<Matrix>,
        layers: Vec<LlamaLayer>,
        norm: Vec<f32>,
        freq_factors: Option<Vec<f32>>,
    ) -> Self {
        let theta_scale = cfg.rope_theta.powf(-2.0 / cfg.rope_dim as f32);
        Llama { cfg, embed, output, layers, norm, theta_scale, freq_factors, kv_type: KvType::F16 }
    }

    /// Loads a `llama`, `qwen2` or `qwen3` GGUF file: [`Llama::config_from_gguf`], then the weights
    /// through [`GgufWeights`] (memory-mapped; the head is tied when the file has none).
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        Self::load(Self::config_from_gguf(f)?, &GgufWeights::new(f)?, true)
    }

    /// Reads the hyper-parameters of a `llama`, `mistral`, `granite`, `qwen2` or `qwen3` GGUF
    /// file. Llama 3 RoPE scaling comes as the `rope_freqs.weight` tensor; linear scaling
    /// (`rope.scaling.type` `linear`) as `rope.scaling.factor`; other scalings are refused.
    pub fn config_from_gguf(f: &GgufFile) -> Result<LlamaConfig> {
        let arch = f.get_str("general.architecture")?.unwrap_or("").to_string();
        let gguf_arch = match GgufArch::from_name(&arch) {
            Some(a @ (GgufArch::Llama | GgufArch::Qwen2 | GgufArch::Qwen3 | GgufArch::Phi3)) => a,
            _ => {
                return Err(ModelError::format(
                    f.path(),
                    format!("general.architecture {arch:?} is not a llama-family architecture"),
                ))
            }
        };
        let key = |k: &str| format!("{arch}.{k}");
        let d = f.req_usize(&key("embedding_length"))?;
        let heads = f.req_usize(&key("attention.head_count"))?;
        let kv_heads = f.get_u64(&key("attention.head_count_kv"))?.map_or(heads, |v| v as usize);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(ModelError::format(
                f.path(),
                format!("attention.head_count {heads} is not a multiple of attention.head_count_kv {kv_heads}"),
            ));
        }
        let head_dim = f.get_u64(&key("attention.key_length"))?.map_or(d / heads, |v| v as usize);
        let embed_info = f.tensor("token_embd.weight").ok_or_else(|| ModelError::MissingTensor {
            path: f.path().to_path_buf(),
            name: "token_embd.weight".into(),
        })?;
        let vocab = embed_info.dims.get(1).copied().unwrap_or(0);
        let rope_dim = f.get_u64(&key("rope.dimension_count"))?.map_or(head_dim, |v| v as usize);
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(ModelError::format(
                f.path(),
                format!("rope.dimension_count {rope_dim} vs head size {head_dim}"),
            ));
        }
        let rope_theta = f.get_f64(&key("rope.freq_base"))?.unwrap_or(10000.0) as f32;
        let max_context = f.get_u64(&key("context_length"))?.map_or(4096, |v| v as usize);
        let (mut rope_freq_scale, mut yarn) = (1.0, None);
        // As llama.cpp: no type means linear, no factor means none.
        let kind = f.get_str(&key("rope.scaling.type"))?.unwrap_or("linear");
        let factor = f.get_f64(&key("rope.scaling.factor"))?.filter(|&x| x != 0.0);
        if let Some(x) = factor.filter(|_| kind != "none") {
            if x < 0.0 {
                return Err(ModelError::format(f.path(), format!("rope.scaling.factor {x} must be positive")));
            }
            rope_freq_scale = (1.0 / x) as f32;
        }
        let original_context =
            f.get_u64(&key("rope.scaling.original_context_length"))?.map_or(max_context, |v| v as usize);
        match kind {
            "none" | "linear" => {}
            "yarn" => {
                let num = |k: &str, default: f64| -> Result<f32> { Ok(f.get_f64(&key(k))?.unwrap_or(default) as f32) };
                let mut y = YarnRope::new(
                    1.0 / rope_freq_scale,
                    original_context as f32,
                    [num("rope.scaling.yarn_beta_fast", 32.0)?, num("rope.scaling.yarn_beta_slow", 1.0)?],
                    num("rope.scaling.yarn_log_multiplier", 0.0)?,
                    num("rope.scaling.attn_factor", 1.0)?,
                    rope_dim,
                    rope_theta,
                );
                if let Some(e) = f.get_f64(&key("rope.scaling.yarn_ext_factor"))?.filter(|&e| e >= 0.0) {
                    y.ext_factor = e as f32;
                }
                yarn = Some(y);
            }
            _ => {
                return Err(ModelError::format(
                    f.path(),
                    format!(
                        "rope.scaling.type {kind:?} is not supported (only none, linear, yarn and Llama 3's rope_freqs)"
                    ),
                ))
            }
        }
        // llama.cpp reads the attention temperature for mistral3 (and llama4) only; its floor
        // is the original context.
        let attn_temperature = match f.get_f64(&key("attention.temperature_scale"))? {
            Some(beta) if beta != 0.0 && arch == "mistral3" => Some((beta as f32, original_context as f32)),
            _ => None,
        };
        let num_layers = f.req_usize(&key("block_count"))?;
        // llama.cpp's smollm3: no RoPE in every fourth layer (a fixed step, not a GGUF key).
        let nope_layers = if arch == "smollm3" { nope_every(num_layers, 4) } else { Vec::new() };
        // Phi-3's LongRoPE: per-pair factors for contexts up to the original length and beyond
        // it; as llama.cpp, the long ones when the context is longer than the original (the
        // model's whole context is what FrogNano allocates by default).
        let phi3 = gguf_arch == GgufArch::Phi3;
        let longrope_factors = if f.contains("rope_factors_long.weight") {
            let name =
                if max_context > original_context { "rope_factors_long.weight" } else { "rope_factors_short.weight" };
            Some(f.f32(name, rope_dim / 2)?)
        } else {
            None
        };
        let rope_attn_factor = f.get_f64(&key("rope.scaling.attn_factor"))?.unwrap_or(1.0) as f32;
        // llama.cpp's granite: a scale of 0 (or none) is no scale; the logit scale is required.
        let granite = if arch == "granite" {
            let scale =
                |k: &str| -> Result<Option<f32>> { Ok(f.get_f64(&key(k))?.filter(|&x| x != 0.0).map(|x| x as f32)) };
            let logits = scale("logit_scale")?.ok_or_else(|| {
                ModelError::format(f.path(), format!("metadata `{}` is missing (Granite needs it)", key("logit_scale")))
            })?;
            if f.get_bool(&key("rope.scaling.finetuned"))? == Some(false) {
                return Err(ModelError::format(
                    f.path(),
                    format!("{} = false (Granite without RoPE) is not supported", key("rope.scaling.finetuned")),
                ));
            }
            Some(GraniteScales {
                embedding: scale("embedding_scale")?.unwrap_or(1.0),
                residual: scale("residual_scale")?.unwrap_or(1.0),
                attention: scale("attention.scale")?.unwrap_or(1.0 / (head_dim as f32).sqrt()),
                logits,
            })
        } else {
            None
        };
        Ok(LlamaConfig {
            arch: arch.clone(),
            hidden_size: d,
            num_layers,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            intermediate_size: f.req_usize(&key("feed_forward_length"))?,
            vocab_size: vocab,
            rms_norm_eps: f.get_f64(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5) as f32,
            rope_theta,
            rope_dim,
            rope_style: gguf_arch.layout().rope,
            max_context,
            qkv_bias: f.contains("blk.0.attn_q.bias"),
            rope_freqs: f.contains("rope_freqs.weight"),
            // Qwen3 always has them (a file without is an error naming the tensor).
            qk_norm: gguf_arch == GgufArch::Qwen3 || f.contains("blk.0.attn_q_norm.weight"),
            llama3_scaling: None,
            rope_freq_scale,
            yarn,
            attn_temperature,
            nope_layers,
            fused_projections: phi3,
            prescale_queries: phi3,
            longrope_factors,
            rope_attn_factor,
            granite,
        })
    }

    /// Reads a Hugging Face `config.json` of model_type `"llama"` (`LlamaForCausalLM`),
    /// `"mistral"`, `"qwen2"` or `"qwen3"`; the error names the field. RoPE pairs are
    /// [`RopeStyle::Halves`] (HF `rotate_half`). Qwen2 has q/k/v biases, Qwen3 per-head q/k
    /// norms; Llama 3 (`rope_type: "llama3"`) and linear RoPE scaling are read; a Mistral
    /// `sliding_window` caps the context at the window (within it, windowed attention is
    /// full attention). Returns the config and whether the output head is tied to the
    /// embedding.
    pub fn config_from_json(v: &serde_json::Value) -> std::result::Result<(LlamaConfig, bool), String> {
        use serde_json::Value;
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        if !matches!(
            model_type,
            "llama" | "mistral" | "ministral3" | "qwen2" | "qwen3" | "smollm3" | "phi3" | "granite"
        ) {
            return Err(format!(
                "unknown model_type {model_type:?}; expected \"llama\", \"mistral\", \"ministral3\", \"qwen2\", \
                 \"qwen3\", \"smollm3\", \"phi3\" or \"granite\""
            ));
        }
        let int = |key: &str, default: Option<usize>| -> std::result::Result<usize, String> {
            match v.get(key) {
                None | Some(Value::Null) => default.ok_or_else(|| format!("missing field `{key}`")),
                Some(x) => x
                    .as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| format!("field `{key}`: expected a non-negative integer, found {x}")),
            }
        };
        let float = |obj: &Value, key: &str, default: f64| -> std::result::Result<f64, String> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(x) => x.as_f64().ok_or_else(|| format!("field `{key}`: expected a number, found {x}")),
            }
        };
        let flag = |key: &str| v.get(key).and_then(Value::as_bool) == Some(true);
        let d = int("hidden_size", None)?;
        let heads = int("num_attention_heads", None)?;
        let kv_heads = int("num_key_value_heads", Some(heads))?;
        if d == 0 || heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(format!(
                "num_attention_heads {heads} must be a positive multiple of num_key_value_heads {kv_heads} \
                 (hidden_size {d})"
            ));
        }
        let head_dim = int("head_dim", Some(d / heads))?;
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(format!("field `head_dim`: {head_dim} must be positive and even"));
        }
        if let Some(act) = v.get("hidden_act").and_then(Value::as_str) {
            if act != "silu" {
                return Err(format!("field `hidden_act`: {act:?} is not supported (only \"silu\")"));
            }
        }
        // Qwen2's q/k/v biases are not a config field: the architecture always has them.
        // Llama's and Qwen3's `attention_bias` would bias the output projection too.
        for key in ["attention_bias", "mlp_bias"] {
            if flag(key) {
                return Err(format!("field `{key}`: biases are not supported"));
            }
        }
        // (Phi-3's `sliding_window` is ignored, as llama.cpp ignores it: attention is full.)
        if flag("use_sliding_window") {
            return Err("field `use_sliding_window`: sliding-window attention is not supported".into());
        }
        let mut max_context = int("max_position_embeddings", Some(2048))?;
        if model_type == "mistral" {
            if let Some(window) = v.get("sliding_window").filter(|w| !w.is_null()) {
                let window = window
                    .as_u64()
                    .filter(|&w| w > 0)
                    .ok_or_else(|| format!("field `sliding_window`: expected a positive integer, found {window}"))?;
                max_context = max_context.min(window as usize);
            }
        }
        // transformers 5 moved RoPE settings into `rope_parameters`; older files use
        // `rope_theta` and `rope_scaling` at top level.
        let rope = v.get("rope_parameters").filter(|r| r.is_object());
        let rope_theta = match rope {
            Some(r) if r.get("rope_theta").is_some() => float(r, "rope_theta", 10000.0)?,
            _ => float(v, "rope_theta", 10000.0)?,
        };
        let (mut llama3_scaling, mut rope_freq_scale) = (None, 1.0f32);
        let (mut yarn, mut attn_temperature) = (None, None);
        let mut longrope: Option<(Vec<f32>, f32)> = None;
        // Phi-3 rotates the first `partial_rotary_factor` of each head (Phi-4-mini: 3/4).
        let rope_dim = match v.get("partial_rotary_factor").filter(|x| !x.is_null()) {
            Some(x) if model_type == "phi3" => {
                let f = x
                    .as_f64()
                    .filter(|f| *f > 0.0 && *f <= 1.0)
                    .ok_or_else(|| format!("field `partial_rotary_factor`: expected a number in (0, 1], found {x}"))?;
                let n = (head_dim as f64 * f) as usize;
                if n == 0 || !n.is_multiple_of(2) {
                    return Err(format!("field `partial_rotary_factor`: {f} of head_dim {head_dim} is {n} dimensions, not a positive even number"));
                }
                n
            }
            _ => head_dim,
        };
        for scaling in [v.get("rope_scaling"), rope] {
            let Some(s) = scaling.filter(|s| s.is_object()) else { continue };
            let kind = s.get("rope_type").or_else(|| s.get("type")).and_then(Value::as_str).unwrap_or("default");
            let positive = |key: &str, default: f64| -> std::result::Result<f32, String> {
                let x = float(s, key, default)?;
                if x > 0.0 {
                    Ok(x as f32)
                } else {
                    Err(format!("field `rope_scaling.{key}`: {x} must be positive"))
                }
            };
            match kind {
                "default" => {}
                "linear" => rope_freq_scale = 1.0 / positive("factor", 1.0)?,
                "llama3" => {
                    let sc = Llama3RopeScaling {
                        factor: positive("factor", 8.0)?,
                        low_freq_factor: positive("low_freq_factor", 1.0)?,
                        high_freq_factor: positive("high_freq_factor", 4.0)?,
                        original_max_position_embeddings: positive("original_max_position_embeddings", 8192.0)?,
                    };
                    if sc.high_freq_factor <= sc.low_freq_factor {
                        return Err(format!(
                            "field `rope_scaling.high_freq_factor`: {} must be above low_freq_factor {}",
                            sc.high_freq_factor, sc.low_freq_factor
                        ));
                    }
                    llama3_scaling = Some(sc);
                }
                "yarn" => {
                    if s.get("factor").is_none_or(Value::is_null) {
                        return Err("field `rope_scaling.factor`: missing (YaRN needs it)".into());
                    }
                    let factor = positive("factor", 1.0)?;
                    rope_freq_scale = 1.0 / factor;
                    for (key, ok) in [("mscale", 1.0), ("truncate", 1.0)] {
                        let found = s.get(key).filter(|x| !x.is_null());
                        if let Some(x) = found.filter(|x| x.as_f64().or(x.as_bool().map(f64::from)) != Some(ok)) {
                            return Err(format!("field `rope_scaling.{key}`: {x} is not supported (only {ok})"));
                        }
                    }
                    if let Some(x) = s.get("attention_factor").filter(|x| !x.is_null()) {
                        return Err(format!("field `rope_scaling.attention_factor`: {x} is not supported"));
                    }
                    let original = positive("original_max_position_embeddings", max_context as f64)?;
                    let beta = [positive("beta_fast", 32.0)?, positive("beta_slow", 1.0)?];
                    let mscale_all_dim = float(s, "mscale_all_dim", 0.0)? as f32;
                    yarn = Some((factor, original, beta, mscale_all_dim));
                    // Ministral 3's Llama 4 attention temperature.
                    if let Some(b) = s.get("llama_4_scaling_beta").filter(|x| !x.is_null()) {
                        let b = b.as_f64().ok_or_else(|| {
                            format!("field `rope_scaling.llama_4_scaling_beta`: expected a number, found {b}")
                        })?;
                        attn_temperature = Some((b as f32, original));
                    }
                }
                "longrope" | "su" => {
                    let original = match s.get("original_max_position_embeddings") {
                        Some(x) if !x.is_null() => positive("original_max_position_embeddings", 0.0)? as usize,
                        _ => int("original_max_position_embeddings", None)?,
                    };
                    let pick = if max_context > original { "long_factor" } else { "short_factor" };
                    let factors = s
                        .get(pick)
                        .and_then(Value::as_array)
                        .filter(|a| a.len() == rope_dim / 2)
                        .and_then(|a| a.iter().map(|x| x.as_f64().map(|f| f as f32)).collect::<Option<Vec<f32>>>())
                        .ok_or_else(|| {
                            format!(
                                "field `rope_scaling.{pick}`: expected {} numbers (one per rotated pair)",
                                rope_dim / 2
                            )
                        })?;
                    // transformers' LongRoPE: √(1 + ln(scale) / ln(original)) unless given.
                    let scale = max_context as f64 / original as f64;
                    let computed = if scale > 1.0 { (1.0 + scale.ln() / (original as f64).ln()).sqrt() } else { 1.0 };
                    longrope = Some((factors, float(s, "attention_factor", computed)? as f32));
                }
                other => {
                    return Err(format!(
                        "RoPE scaling {other:?} is not supported (only \"default\", \"linear\", \"llama3\", \"yarn\" \
                         and \"longrope\")"
                    ))
                }
            }
        }
        let yarn = yarn.map(|(factor, original, beta, mscale_all_dim)| {
            YarnRope::new(factor, original, beta, mscale_all_dim, 1.0, head_dim, rope_theta as f32)
        });
        let num_layers = int("num_hidden_layers", None)?;
        let nope_layers = if model_type == "smollm3" { smollm3_nope_layers(v, num_layers)? } else { Vec::new() };
        let phi3 = model_type == "phi3";
        let granite = if model_type == "granite" {
            let m = |key: &str, default: f64| -> std::result::Result<f32, String> {
                match float(v, key, default)? {
                    x if x > 0.0 => Ok(x as f32),
                    x => Err(format!("field `{key}`: {x} must be positive")),
                }
            };
            Some(GraniteScales {
                embedding: m("embedding_multiplier", 1.0)?,
                residual: m("residual_multiplier", 1.0)?,
                attention: m("attention_multiplier", 1.0 / (head_dim as f64).sqrt())?,
                logits: m("logits_scaling", 1.0)?,
            })
        } else {
            None
        };
        let (longrope_factors, rope_attn_factor) = match longrope {
            Some((f, a)) => (Some(f), a),
            None => (None, 1.0),
        };
        let cfg = LlamaConfig {
            arch: model_type.into(),
            hidden_size: d,
            num_layers,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            intermediate_size: int("intermediate_size", None)?,
            vocab_size: int("vocab_size", None)?,
            rms_norm_eps: float(v, "rms_norm_eps", 1e-6)? as f32,
            rope_theta: rope_theta as f32,
            rope_dim,
            rope_style: RopeStyle::Halves,
            max_context,
            qkv_bias: model_type == "qwen2",
            rope_freqs: false,
            qk_norm: model_type == "qwen3",
            llama3_scaling,
            rope_freq_scale,
            yarn,
            attn_temperature,
            nope_layers,
            fused_projections: phi3,
            prescale_queries: phi3,
            longrope_factors,
            rope_attn_factor,
            granite,
        };
        let tied = v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false);
        Ok((cfg, tied))
    }

    /// Loads a Hugging Face checkpoint folder of the llama family (`config.json` with
    /// model_type `"llama"`, `"mistral"`, `"qwen2"` or `"qwen3"` + safetensors, HF tensor
    /// names and q/k row layout).
    pub fn from_safetensors(dir: &std::path::Path) -> Result<Self> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::io(&cfg_path, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| ModelError::format(&cfg_path, format!("invalid JSON: {e}")))?;
        let (cfg, tied) = Self::config_from_json(&v).map_err(|msg| ModelError::format(&cfg_path, msg))?;
        let st = crate::safetensors_dir::SafetensorsDir::open(dir)?;
        Self::load(cfg, &st, tied)
    }

    /// Loads the weights of [`LlamaMap`] from any source: a safetensors folder, a GGUF file
    /// through [`GgufWeights`], the trainer's weights. `lm_head.weight` is used when present;
    /// without it the head is the embedding, which is an error unless `tied`. RoPE pairs the
    /// q/k rows as the source lays them out.
    pub fn load(mut cfg: LlamaConfig, src: &dyn TensorSource, tied: bool) -> Result<Self> {
        cfg.rope_style = src.layout().rope;
        let map = LlamaMap::new(&cfg, has_output_head(src, tied)?);
        let embed = src.matrix(&map.embed)?;
        let output = map.lm_head.as_ref().map(|w| src.matrix(w)).transpose()?;
        let layers = map
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let bias_qkv = match &l.qkv_bias {
                    Some([q, k, v]) => Some([src.vector(q)?, src.vector(k)?, src.vector(v)?]),
                    None => None,
                };
                let qk_norm = match &l.qk_norm {
                    Some([q, k]) => Some([src.vector(q)?, src.vector(k)?]),
                    None => None,
                };
                let ([wq, wk, wv], [gate, up]) = if cfg.fused_projections {
                    fused_projections(src, i, l)?
                } else {
                    (
                        [src.matrix(&l.q_proj)?, src.matrix(&l.k_proj)?, src.matrix(&l.v_proj)?],
                        [src.matrix(&l.gate)?, src.matrix(&l.up)?],
                    )
                };
                Ok(LlamaLayer {
                    attn_norm: src.vector(&l.attn_norm)?,
                    wq,
                    wk,
                    wv,
                    wo: src.matrix(&l.o_proj)?,
                    bias_qkv,
                    qk_norm,
                    ffn_norm: src.vector(&l.ffn_norm)?,
                    gate,
                    up,
                    down: src.matrix(&l.down)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = src.vector(&map.norm)?;
        let freq_factors = match (&map.rope_freqs, &cfg.llama3_scaling) {
            (Some(w), _) => Some(src.vector(w)?),
            (None, Some(s)) => Some(s.freq_factors(cfg.rope_theta, cfg.rope_dim)),
            (None, None) => cfg.longrope_factors.clone(),
        };
        Ok(Llama::new(cfg, embed, output, layers, norm, freq_factors))
    }

    /// Re-quantizes every weight matrix to `q` (`--quant`); matrices too narrow for its
    /// blocks fall back as [`Matrix::quantized`] describes.
    pub fn quantize_weights(&mut self, q: QuantType) {
        let tied = self.output.is_none();
        self.embed = self.embed.quantized(q);
        if !tied {
            self.output = self.output.as_ref().map(|m| m.quantized(q));
        }
        for l in &mut self.layers {
            for m in [&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo, &mut l.gate, &mut l.up, &mut l.down] {
                *m = m.quantized(q);
            }
        }
    }

    /// Adds the low-rank update `update` (Hugging Face row order, e.g. a LoRA adapter's
    /// `scale·B·A`) to the projection named by its Hugging Face module name
    /// (`model.layers.3.self_attn.q_proj`, `….mlp.down_proj`), or removes it with `None`.
    /// q/k updates are permuted as llama.cpp's converter permuted the rows of a
    /// llama-architecture GGUF file. Errors name the module or the shapes.
    pub fn set_low_rank(&mut self, module: &str, update: Option<LowRank>) -> std::result::Result<(), String> {
        let unknown = || format!("`{module}` is not a projection of this model");
        let rest = module.strip_prefix("model.layers.").ok_or_else(unknown)?;
        let (index, proj) = rest.split_once('.').ok_or_else(unknown)?;
        let i: usize = index.parse().map_err(|_| unknown())?;
        let (heads, dh, interleaved) =
            (self.cfg.num_heads, self.cfg.head_dim, self.cfg.rope_style == RopeStyle::Interleaved);
        let kv_heads = self.cfg.num_kv_heads;
        let layer = self.layers.get_mut(i).ok_or_else(unknown)?;
        let (m, rotary_heads) = match proj {
            "self_attn.q_proj" => (&mut layer.wq, Some(heads)),
            "self_attn.k_proj" => (&mut layer.wk, Some(kv_heads)),
            "self_attn.v_proj" => (&mut layer.wv, None),
            "self_attn.o_proj" => (&mut layer.wo, None),
            "mlp.gate_proj" => (&mut layer.gate, None),
            "mlp.up_proj" => (&mut layer.up, None),
            "mlp.down_proj" => (&mut layer.down, None),
            _ => return Err(unknown()),
        };
        let update = match (update, rotary_heads) {
            (Some(mut u), Some(h)) if interleaved && u.b.len() == h * dh * u.rank => {
                u.b = crate::gguf_weights::permute_rows(&u.b, h, dh, u.rank);
                Some(u)
            }
            (u, _) => u,
        };
        m.set_low_rank(update).map_err(|e| format!("`{module}`: {e}"))
    }

    /// Repacks the matmul weights for this CPU's fastest kernels ([`Matrix::pack_for_matmul`]):
    /// the projections and the output head (the tied embedding when there is none; its row
    /// lookups still answer, from the file or unpacked from the packed copy).
    pub fn pack_for_matmul(&mut self) {
        match self.output.as_mut() {
            Some(m) => m.pack_for_matmul(),
            None => self.embed.pack_for_matmul(),
        }
        for l in &mut self.layers {
            for m in [&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo, &mut l.gate, &mut l.up, &mut l.down] {
                m.pack_for_matmul();
            }
        }
    }

    /// Bytes of weights.
    pub fn weight_bytes(&self) -> usize {
        let mut n = self.embed.byte_len() + self.output.as_ref().map_or(0, |m| m.byte_len());
        for l in &self.layers {
            n += [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down].iter().map(|m| m.byte_len()).sum::<usize>();
        }
        n
    }

    /// `(cos, sin)` of every rotated pair at position `pos` ([`rope_angles`]).
    pub fn rope_angles(&self, pos: usize) -> Vec<(f32, f32)> {
        rope_angles(&self.cfg, self.theta_scale, self.freq_factors.as_deref(), pos)
    }

    /// The RoPE inputs beside the config: `theta^(−2/rope_dim)` and the Llama 3.1 frequency
    /// factors, for [`rope_angles`] elsewhere (a device model builds its tables with them).
    pub fn rope_parts(&self) -> (f32, Option<Vec<f32>>) {
        (self.theta_scale, self.freq_factors.clone())
    }

    /// Rotates one head. The products are fused the way ggml's (GCC-contracted) C code
    /// evaluates them: `x0·c − x1·s` as `fma(x0, c, −(x1·s))` and `x0·s + x1·c` as
    /// `fma(x0, s, x1·c)`; the next matmul's 8-bit quantization turns an ulp into a flip.
    fn rope(&self, x: &mut [f32], angles: &[(f32, f32)]) {
        let half = self.cfg.rope_dim / 2;
        for (i, &(c, s)) in angles.iter().enumerate() {
            let (a, b) = match self.cfg.rope_style {
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                RopeStyle::Halves => (i, i + half),
            };
            let (x0, x1) = (x[a], x[b]);
            x[a] = x0.mul_add(c, -(x1 * s));
            x[b] = x0.mul_add(s, x1 * c);
        }
    }

    /// `x·Wqᵀ (+bq)`, `x·Wkᵀ (+bk)`, `x·Wvᵀ (+bv)` over `t` rows.
    fn project_qkv(l: &LlamaLayer, x: &[f32], t: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let [mut q, mut k, mut v]: [Vec<f32>; 3] =
            Matrix::matmul_many(&[&l.wq, &l.wk, &l.wv], x, t).try_into().expect("three products for three matrices");
        if let Some([bq, bk, bv]) = &l.bias_qkv {
            for (m, b) in [(&mut q, bq), (&mut k, bk), (&mut v, bv)] {
                for row in m.chunks_exact_mut(b.len()) {
                    row.iter_mut().zip(b).for_each(|(e, b)| *e += b);
                }
            }
        }
        (q, k, v)
    }

    /// One sequence's attention core: RoPE on its `t` new queries and keys at positions
    /// `pos0..`, keys and values appended to its f16 cache, causal attention. Returns
    /// `[t, heads·dh]` (the input of `Wo`).
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        mut q: Vec<f32>,
        mut k: Vec<f32>,
        v: &[f32],
        t: usize,
        pos0: usize,
        kc: &mut KvRows,
        vc: &mut KvRows,
        rope: bool,
    ) -> Vec<f32> {
        let c = &self.cfg;
        let (hq, hkv, dh) = (c.num_heads, c.num_kv_heads, c.head_dim);
        let angles: Vec<Vec<(f32, f32)>> =
            if rope { (0..t).map(|i| self.rope_angles(pos0 + i)).collect() } else { vec![Vec::new(); t] };
        // The scores' scale: Granite's own, else 1/√dh; Phi-3 applies it to the queries.
        let score_scale = c.granite.map_or(1.0 / (dh as f32).sqrt(), |g| g.attention);
        crate::kernels::for_each_row(&mut q, hq * dh, |i, row| {
            let temp = attn_temperature(c.attn_temperature, pos0 + i);
            for head in row.chunks_exact_mut(dh) {
                self.rope(head, &angles[i]);
                if temp != 1.0 {
                    head.iter_mut().for_each(|e| *e *= temp);
                }
                if c.prescale_queries {
                    head.iter_mut().for_each(|e| *e *= score_scale);
                }
                head.iter_mut().for_each(|e| *e = round_f16(*e));
            }
        });
        crate::kernels::for_each_row(&mut k, hkv * dh, |i, row| {
            for head in row.chunks_exact_mut(dh) {
                self.rope(head, &angles[i]);
            }
        });
        kc.push(&k);
        vc.push(v);
        let scale = if c.prescale_queries { 1.0 } else { score_scale };
        // llama.cpp's K·Q and softmax·V are f16 matmuls whose summation order depends on the
        // batch size (module docs of `quant::ggml`); its KV cache has 256-cell granularity.
        let shape = AttnShape { t, pos0, heads: hq, kv_heads: hkv, head_dim: dh, scale };
        attention::causal(&q, kc, vc, shape, F16Dot::for_batch(t))
    }
}

/// `(cos, sin)` of every rotated pair at position `pos`, computed as ggml's rope cache does:
/// the angle starts at `pos` and is multiplied by `theta_scale` once per pair, in f32; it
/// is divided by the pair's frequency factor, then scaled by the linear `freq_scale`.
pub fn rope_angles(cfg: &LlamaConfig, theta_scale: f32, freq_factors: Option<&[f32]>, pos: usize) -> Vec<(f32, f32)> {
    let mut theta = pos as f32;
    let scale = cfg.rope_freq_scale;
    (0..cfg.rope_dim / 2)
        .map(|i| {
            let ff = freq_factors.and_then(|v| v.get(i)).copied().unwrap_or(1.0);
            let extrap = theta / ff;
            theta *= theta_scale;
            let interp = scale * extrap;
            match &cfg.yarn {
                None => (interp.cos() * cfg.rope_attn_factor, interp.sin() * cfg.rope_attn_factor),
                Some(y) => {
                    let [low, high] = y.corr_dims;
                    let ramp = 1.0 - ((i as f32 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
                    let mix = ramp * y.ext_factor;
                    let a = interp * (1.0 - mix) + extrap * mix;
                    let mscale = y.attn_factor * (1.0 + 0.1 * (1.0 / scale).ln());
                    (a.cos() * mscale, a.sin() * mscale)
                }
            }
        })
        .collect()
}

/// A Phi-3 layer's fused projections, split by rows: `qkv_proj` (`[q + 2·kv, d]`) into q, k
/// and v, `gate_up_proj` (`[2·ffn, d]`) into gate and up, each named in errors by the fused
/// tensor.
fn fused_projections(src: &dyn TensorSource, layer: usize, l: &LlamaLayerMap) -> Result<([Matrix; 3], [Matrix; 2])> {
    let (q, d) = l.q_proj.dims2();
    let (kv, ffn) = (l.k_proj.dims2().0, l.gate.dims2().0);
    let fused = |suffix: &str, rows: usize| WeightSpec::new(layer_name(layer, suffix), [rows, d], Role::Linear);
    let qkv = src.matrix(&fused("self_attn.qkv_proj.weight", q + 2 * kv))?;
    let gate_up = src.matrix(&fused("mlp.gate_up_proj.weight", 2 * ffn))?;
    let [wq, wk, wv]: [Matrix; 3] = qkv.split_rows(&[q, kv, kv]).try_into().expect("three parts");
    let [gate, up]: [Matrix; 2] = gate_up.split_rows(&[ffn, ffn]).try_into().expect("two parts");
    Ok(([wq, wk, wv], [gate, up]))
}

/// The layers of `num_layers` without RoPE when every `step`-th one has none (layer
/// `step − 1`, `2·step − 1`, …).
pub fn nope_every(num_layers: usize, step: usize) -> Vec<usize> {
    (0..num_layers).filter(|il| (il + 1) % step == 0).collect()
}

/// SmolLM3's NoPE layers from its `config.json`: `no_rope_layers` (one 0/1 per layer, 1 where
/// RoPE applies), else every `no_rope_layer_interval`-th layer (default 4), as transformers
/// reads them.
fn smollm3_nope_layers(v: &serde_json::Value, num_layers: usize) -> std::result::Result<Vec<usize>, String> {
    if let Some(list) = v.get("no_rope_layers").filter(|l| !l.is_null()) {
        let flags = list.as_array().filter(|a| a.len() == num_layers).ok_or_else(|| {
            format!("field `no_rope_layers`: expected {num_layers} entries of 0 or 1 (one per layer), found {list}")
        })?;
        return flags
            .iter()
            .enumerate()
            .filter_map(|(il, f)| match f.as_u64() {
                Some(0) => Some(Ok(il)),
                Some(1) => None,
                _ => Some(Err(format!("field `no_rope_layers`: entry {il} is {f}, expected 0 or 1"))),
            })
            .collect();
    }
    let step = match v.get("no_rope_layer_interval") {
        None | Some(serde_json::Value::Null) => 4,
        Some(x) => x
            .as_u64()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("field `no_rope_layer_interval`: expected a positive integer, found {x}"))?
            as usize,
    };
    Ok(nope_every(num_layers, step))
}

/// Llama 4's attention temperature (Ministral 3, `LlamaConfig::attn_temperature` as
/// `(beta, floor)`): the factor a query at `pos` is scaled by, computed in f64 as llama.cpp
/// does; 1 without one.
pub fn attn_temperature(temperature: Option<(f32, f32)>, pos: usize) -> f32 {
    match temperature {
        Some((beta, floor)) => (((pos as f64 / floor as f64).floor() + 1.0).ln() * beta as f64 + 1.0) as f32,
        None => 1.0,
    }
}

/// RMSNorm with ggml's numerics: the sum of squares (each square rounded to f32) accumulated in
/// f64, the mean rounded to f32, then `x · (1/√(mean + eps)) · w` in f32. Matching it to the bit
/// matters: the next matmul quantizes its input to 8 bits, and a one-ulp change can move a value
/// across a rounding boundary of a block with a large scale.
fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let n = w.len();
    let mut y = vec![0.0; x.len()];
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let sum: f64 = xr.iter().map(|v| (v * v) as f64).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, v), s) in yr.iter_mut().zip(xr).zip(w) {
            *o = v * scale * s;
        }
    }
    y
}

impl CausalLm for Llama {
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn max_context(&self) -> usize {
        self.cfg.max_context
    }

    fn new_cache(&self) -> Cache {
        Cache::new(
            (0..self.cfg.num_layers)
                .map(|_| LayerCache::attention(self.kv_type, self.cfg.num_kv_heads, self.cfg.head_dim))
                .collect(),
        )
    }

    fn kv_type(&self) -> KvType {
        self.kv_type
    }

    fn set_kv_type(&mut self, ty: KvType) -> Result<()> {
        ty.check_head_dim(self.cfg.head_dim).map_err(ModelError::Input)?;
        self.kv_type = ty;
        Ok(())
    }

    fn cache_bytes(&self, tokens: usize) -> usize {
        let c = &self.cfg;
        2 * c.num_layers * tokens * self.kv_type.row_bytes(c.num_kv_heads * c.head_dim)
    }

    fn forward(&self, ids: &[u32], cache: &mut Cache, all_logits: bool) -> Result<Vec<f32>> {
        crate::kernels::on_pool(|| decoder::forward(self, ids, cache, all_logits))
    }

    fn forward_batch(&self, batch: &mut [(u32, &mut Cache)]) -> Result<Vec<Vec<f32>>> {
        crate::kernels::on_pool(|| decoder::forward_batch(self, batch))
    }

    fn forward_stepwise(&self, ids: &[u32], cache: &mut Cache) -> Result<Vec<f32>> {
        crate::kernels::on_pool(|| decoder::forward_stepwise(self, ids, cache))
    }

    fn forward_batch_stepwise(&self, batch: &mut [(&[u32], &mut Cache)]) -> Result<Vec<Vec<f32>>> {
        crate::kernels::on_pool(|| decoder::forward_batch_stepwise(self, batch))
    }

    fn forward_batch_stepwise_and_prompt(
        &self,
        batch: &mut [(&[u32], &mut Cache)],
        prompt: (&[u32], &mut Cache),
    ) -> Result<(Vec<Vec<f32>>, Vec<f32>)> {
        crate::kernels::on_pool(|| decoder::forward_batch_stepwise_and_prompt(self, batch, prompt))
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

impl LayerStack for Llama {
    fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    fn fits(&self, cache: &Cache) -> bool {
        cache.layers.len() == self.layers.len()
            && cache.layers.iter().all(|l| matches!(l, LayerCache::Attention { .. }))
    }

    fn decode_layers(&self, ids: &[u32], segs: &mut [(usize, &mut Cache)], how: Rows) -> Vec<f32> {
        let c = &self.cfg;
        let (d, t) = (c.hidden_size, ids.len());
        let (q_w, kv_w, ffn) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size);
        let mut h = vec![0.0f32; t * d];
        for (row, &id) in h.chunks_exact_mut(d).zip(ids) {
            self.embed.row_into(id as usize, row);
            if let Some(g) = &c.granite {
                row.iter_mut().for_each(|e| *e *= g.embedding);
            }
        }
        for (li, l) in self.layers.iter().enumerate() {
            let x = rms_norm(&h, &l.attn_norm, c.rms_norm_eps);
            let (mut q, mut k, v) = Self::project_qkv(l, &x, t);
            if let Some([qn, kn]) = &l.qk_norm {
                // Each head's dh values normed on their own (the scales are dh wide).
                q = rms_norm(&q, qn, c.rms_norm_eps);
                k = rms_norm(&k, kn, c.rms_norm_eps);
            }
            let rope = !c.nope_layers.contains(&li);
            let mut r0 = 0;
            let mut work = Vec::with_capacity(segs.len());
            let n = segs.len();
            for (i, (rows, cache)) in segs.iter_mut().enumerate() {
                let pos0 = cache.pos;
                let LayerCache::Attention { k: kc, v: vc } = &mut cache.layers[li] else {
                    unreachable!("cache layout checked by the caller")
                };
                work.push((r0, *rows, pos0, kc, vc, how.stepwise(i, n)));
                r0 += *rows;
            }
            let outs: Vec<Vec<f32>> = work
                .into_par_iter()
                .map(|(r0, rows, pos0, kc, vc, stepwise)| {
                    // Stepwise: each row alone, as a decode step attends (the batch-size
                    // dependent summation order of one token).
                    let (step, pieces) = if stepwise { (1, rows) } else { (rows, 1) };
                    let mut out = Vec::with_capacity(rows * q_w);
                    for p in 0..pieces {
                        let a = r0 + p * step;
                        let (qs, ks) = (q[a * q_w..(a + step) * q_w].to_vec(), k[a * kv_w..(a + step) * kv_w].to_vec());
                        out.extend(self.attend(
                            qs,
                            ks,
                            &v[a * kv_w..(a + step) * kv_w],
                            step,
                            pos0 + p * step,
                            kc,
                            vc,
                            rope,
                        ));
                    }
                    out
                })
                .collect();
            let a = l.wo.matmul(&outs.concat(), t);
            let residual = c.granite.map_or(1.0, |g| g.residual);
            h.iter_mut().zip(&a).for_each(|(h, a)| *h += a * residual);
            let x = rms_norm(&h, &l.ffn_norm, c.rms_norm_eps);
            let [mut g, u]: [Vec<f32>; 2] =
                Matrix::matmul_many(&[&l.gate, &l.up], &x, t).try_into().expect("two products for two matrices");
            crate::kernels::for_each_row(&mut g, ffn, |i, row| ggml::swiglu(row, &u[i * ffn..(i + 1) * ffn], ffn));
            let y = l.down.matmul(&g, t);
            h.iter_mut().zip(&y).for_each(|(h, y)| *h += y * residual);
        }
        for (rows, cache) in segs.iter_mut() {
            cache.pos += *rows;
        }
        h
    }

    fn logits(&self, rows: &[f32], n: usize) -> Vec<f32> {
        let x = rms_norm(rows, &self.norm, self.cfg.rms_norm_eps);
        let head = self.output.as_ref().unwrap_or(&self.embed);
        let mut logits = head.matmul(&x, n);
        if let Some(g) = &self.cfg.granite {
            let inv = 1.0 / g.logits;
            logits.iter_mut().for_each(|e| *e *= inv);
        }
        logits
    }
}
