//! The llama architecture in candle, differentiable: pre-norm RMSNorm, grouped-query
//! attention with rotate-half RoPE (Hugging Face layout), SwiGLU MLP, tied or untied head;
//! with q/k/v biases it is Qwen2, with per-head q/k RMSNorms Qwen3. Weights use
//! `LlamaForCausalLM` / `Qwen2ForCausalLM` / `Qwen3ForCausalLM` names, taken with their shapes
//! from frognano-model's [`LlamaMap`].
//!
//! ```text
//! h = embed[ids]
//! per layer:  h += o_proj(attn(rope(q_proj(x)), rope(k_proj(x)), v_proj(x)))   x = rms(h)·w_in
//!             h += down_proj(silu(gate_proj(x)) ⊙ up_proj(x))                  x = rms(h)·w_post
//! logits = rms(h)·w_norm · (lm_head | embed)ᵀ
//! ```
//!
//! The network is written as three stages ([`embed`], [`layer`], [`head`]) so the policy can
//! back-propagate one layer at a time (`Policy::backward`).

use candle_core::{Result, Tensor};
use frognano_model::llama::{Llama, LlamaConfig, LlamaMap, RopeStyle};
use frognano_model::weights::WeightSpec;
use rand::{Rng, SeedableRng};

use super::ops;
use super::store::Store;

/// Shapes and hyper-parameters of a llama policy (what `config.json` of a
/// `LlamaForCausalLM` holds).
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaSpec {
    /// Model width.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (divides `num_heads`).
    pub num_kv_heads: usize,
    /// Dimension per head (even).
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Longest context.
    pub max_context: usize,
    /// Output head shares the embedding.
    pub tie_word_embeddings: bool,
    /// `bos_token_id` written to `config.json` on save.
    pub bos_token_id: Option<u32>,
    /// `eos_token_id`s written to `config.json` on save.
    pub eos_token_ids: Vec<u32>,
    /// The q/k/v projections carry biases (Qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorms of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
}

impl LlamaSpec {
    /// A tiny model (2 layers, width 32, 4 query / 2 KV heads of 8) over `vocab_size` tokens,
    /// for tests and toy runs.
    pub fn tiny(vocab_size: usize) -> Self {
        LlamaSpec {
            hidden_size: 32,
            intermediate_size: 64,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            vocab_size,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            max_context: 2048,
            tie_word_embeddings: true,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            qkv_bias: false,
            qk_norm: false,
        }
    }

    /// The Hugging Face `model_type` of this shape: `"qwen2"` with q/k/v biases, `"qwen3"` with
    /// q/k norms, else `"llama"`.
    pub fn model_type(&self) -> &'static str {
        if self.qkv_bias {
            "qwen2"
        } else if self.qk_norm {
            "qwen3"
        } else {
            "llama"
        }
    }

    /// The spec of a frognano-model llama config (`tied` from whether the file has an
    /// output head).
    pub fn from_config(c: &LlamaConfig, tied: bool) -> Self {
        LlamaSpec {
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_layers: c.num_layers,
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            vocab_size: c.vocab_size,
            rms_norm_eps: c.rms_norm_eps as f64,
            rope_theta: c.rope_theta as f64,
            max_context: c.max_context,
            tie_word_embeddings: tied,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            qkv_bias: c.qkv_bias,
            qk_norm: c.qk_norm,
        }
    }

    /// Checks the shapes fit together; the message names the field.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let fields = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
        ];
        if let Some((k, _)) = fields.iter().find(|(_, v)| *v == 0) {
            return Err(format!("llama spec: `{k}` must be positive"));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(format!(
                "llama spec: num_heads {} is not a multiple of num_kv_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!("llama spec: head_dim {} must be even", self.head_dim));
        }
        if self.qkv_bias && self.qk_norm {
            return Err("llama spec: q/k/v biases (Qwen2) and q/k norms (Qwen3) do not go together".into());
        }
        Ok(())
    }

    /// frognano-model's config for the same shapes (Hugging Face RoPE pairing).
    pub fn to_config(&self) -> LlamaConfig {
        LlamaConfig {
            arch: self.model_type().into(),
            hidden_size: self.hidden_size,
            num_layers: self.num_layers,
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            intermediate_size: self.intermediate_size,
            vocab_size: self.vocab_size,
            rms_norm_eps: self.rms_norm_eps as f32,
            rope_theta: self.rope_theta as f32,
            rope_dim: self.head_dim,
            rope_style: RopeStyle::Halves,
            max_context: self.max_context,
            qkv_bias: self.qkv_bias,
            rope_freqs: false,
            qk_norm: self.qk_norm,
            llama3_scaling: None,
            rope_freq_scale: 1.0,
            yarn: None,
            attn_temperature: None,
            nope_layers: Vec::new(),
            fused_projections: false,
            prescale_queries: false,
            longrope_factors: None,
            rope_attn_factor: 1.0,
            granite: None,
        }
    }

    /// A Hugging Face `config.json` for a `LlamaForCausalLM` (`Qwen2ForCausalLM`,
    /// `Qwen3ForCausalLM`) of this shape.
    pub fn hf_config(&self, dtype: &str) -> serde_json::Value {
        let architecture = match self.model_type() {
            "qwen2" => "Qwen2ForCausalLM",
            "qwen3" => "Qwen3ForCausalLM",
            _ => "LlamaForCausalLM",
        };
        let eos = match self.eos_token_ids.as_slice() {
            [] => serde_json::Value::Null,
            [one] => serde_json::json!(one),
            many => serde_json::json!(many),
        };
        serde_json::json!({
            "architectures": [architecture],
            "model_type": self.model_type(),
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": null,
            "max_position_embeddings": self.max_context,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_bias": false,
            "attention_dropout": 0.0,
            "mlp_bias": false,
            "initializer_range": 0.02,
            "pretraining_tp": 1,
            "use_cache": true,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "torch_dtype": dtype,
        })
    }

    /// The weight map of a model of this shape (frognano-model's [`LlamaMap`]: Hugging Face
    /// names, shapes and roles; an `lm_head.weight` unless the head is tied).
    pub fn weight_map(&self) -> LlamaMap {
        LlamaMap::new(&self.to_config(), !self.tie_word_embeddings)
    }

    /// Every weight name with its shape, in `LlamaForCausalLM` order.
    pub fn weight_shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.weight_map().specs().into_iter().map(|w| (w.name.clone(), w.shape.clone())).collect()
    }

    /// Canonical names of the linear modules LoRA can adapt.
    pub fn linear_modules(&self) -> Vec<String> {
        super::io::linear_modules(&self.weight_map().specs())
    }

    /// Random weights, deterministic in `seed`: matrices uniform with standard deviation 0.02
    /// (the Hugging Face `initializer_range`), norm scales 1.
    pub fn random_weights(&self, seed: u64) -> Result<Vec<(String, Tensor)>> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let bound = 0.02f32 * 3f32.sqrt();
        let dev = candle_core::Device::Cpu;
        self.weight_shapes()
            .into_iter()
            .map(|(name, shape)| {
                let n: usize = shape.iter().product();
                let data: Vec<f32> = if shape.len() == 1 {
                    vec![1.0; n]
                } else {
                    (0..n).map(|_| rng.random_range(-bound..bound)).collect()
                };
                Ok((name, Tensor::from_vec(data, shape, &dev)?))
            })
            .collect()
    }
}

/// What the stages of one forward pass share: the weight map and the RoPE tables for `n`
/// tokens.
pub(crate) struct Pass {
    map: LlamaMap,
    rope: (Tensor, Tensor),
}

impl Pass {
    /// The pass over `n` tokens.
    pub fn new(spec: &LlamaSpec, st: &Store, n: usize) -> Result<Pass> {
        let rope = ops::rope_tables(n, spec.head_dim, spec.rope_theta, st.compute, &candle_core::Device::Cpu)?;
        Ok(Pass { map: spec.weight_map(), rope })
    }

    /// Decoder layers.
    pub fn layers(&self) -> usize {
        self.map.layers.len()
    }
}

/// The token embeddings `[n, d]` of `ids`.
pub(crate) fn embed(pass: &Pass, st: &Store, ids: &Tensor) -> Result<Tensor> {
    st.get(&pass.map.embed.name)?.index_select(ids, 0)
}

/// Decoder layer `i` over the residual stream `h` `[n, d]`.
pub(crate) fn layer(spec: &LlamaSpec, pass: &Pass, st: &Store, i: usize, h: &Tensor) -> Result<Tensor> {
    let l = &pass.map.layers[i];
    let n = h.dim(0)?;
    let (hq, hkv, dh) = (spec.num_heads, spec.num_kv_heads, spec.head_dim);
    let eps = spec.rms_norm_eps;
    let (cos, sin) = (&pass.rope.0, &pass.rope.1);
    let x = ops::rms_norm(h, &st.model_form(&l.attn_norm)?, eps)?;
    let bias = |t: Tensor, which: usize| -> Result<Tensor> {
        match &l.qkv_bias {
            Some(b) => t.broadcast_add(&st.get(&b[which].name)?),
            None => Ok(t),
        }
    };
    // [n, count·dh] → [count, n, dh], with Qwen3's per-head RMSNorm before RoPE.
    let heads = |t: Tensor, count: usize, norm: Option<&WeightSpec>| -> Result<Tensor> {
        let t = t.reshape((n, count, dh))?;
        let t = match norm {
            Some(w) => ops::rms_norm(&t, &st.model_form(w)?, eps)?,
            None => t,
        };
        t.transpose(0, 1)
    };
    let (qn, kn) = match &l.qk_norm {
        Some([q, k]) => (Some(q), Some(k)),
        None => (None, None),
    };
    let q = ops::rope(&heads(bias(st.linear(&x, l.q_proj.module())?, 0)?, hq, qn)?, cos, sin)?;
    let k = ops::rope(&heads(bias(st.linear(&x, l.k_proj.module())?, 1)?, hkv, kn)?, cos, sin)?;
    let v = heads(bias(st.linear(&x, l.v_proj.module())?, 2)?, hkv, None)?;
    let o = ops::causal_attention(&q, &k, &v)?;
    let h = (h + st.linear(&o, l.o_proj.module())?)?;
    let x = ops::rms_norm(&h, &st.model_form(&l.ffn_norm)?, eps)?;
    let g = st.linear(&x, l.gate.module())?.silu()?;
    let u = st.linear(&x, l.up.module())?;
    h + st.linear(&(g * u)?, l.down.module())?
}

/// Logits `[n, vocab]` of the final residual stream `h` `[n, d]`.
pub(crate) fn head(spec: &LlamaSpec, pass: &Pass, st: &Store, h: &Tensor) -> Result<Tensor> {
    let x = ops::rms_norm(h, &st.model_form(&pass.map.norm)?, spec.rms_norm_eps)?;
    match &pass.map.lm_head {
        Some(head) => st.linear(&x, head.module()),
        None => st.matmul_weight(&x, &pass.map.embed.name),
    }
}

/// Logits `[n, vocab]` (compute dtype) of the llama network over `ids`.
pub(crate) fn logits(spec: &LlamaSpec, st: &Store, ids: &Tensor) -> Result<Tensor> {
    let pass = Pass::new(spec, st, ids.dim(0)?)?;
    let mut h = embed(&pass, st, ids)?;
    for i in 0..pass.layers() {
        h = layer(spec, &pass, st, i, &h)?;
    }
    head(spec, &pass, st, &h)
}

/// frognano-model's inference llama over the current (LoRA-merged) weights.
pub(crate) fn inference_model(spec: &LlamaSpec, st: &Store) -> anyhow::Result<Llama> {
    Ok(Llama::load(spec.to_config(), &super::io::MergedWeights(st), spec.tie_word_embeddings)?)
}
