//! The llama architecture in candle, differentiable: pre-norm RMSNorm, grouped-query
//! attention with rotate-half RoPE (Hugging Face layout), SwiGLU MLP, tied or untied head.
//! Weights use `LlamaForCausalLM` names, taken with their shapes from frognano-model's
//! [`LlamaMap`].
//!
//! ```text
//! h = embed[ids]
//! per layer:  h += o_proj(attn(rope(q_proj(x)), rope(k_proj(x)), v_proj(x)))   x = rms(h)·w_in
//!             h += down_proj(silu(gate_proj(x)) ⊙ up_proj(x))                  x = rms(h)·w_post
//! logits = rms(h)·w_norm · (lm_head | embed)ᵀ
//! ```

use candle_core::{Result, Tensor};
use frognano_model::llama::{Llama, LlamaConfig, LlamaMap, RopeStyle};
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
        Ok(())
    }

    /// frognano-model's config for the same shapes (Hugging Face RoPE pairing).
    pub fn to_config(&self) -> LlamaConfig {
        LlamaConfig {
            arch: "llama".into(),
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
            qkv_bias: false,
            rope_freqs: false,
            qk_norm: false,
            llama3_scaling: None,
            rope_freq_scale: 1.0,
            yarn: None,
            attn_temperature: None,
        }
    }

    /// A Hugging Face `config.json` for a `LlamaForCausalLM` of this shape.
    pub fn hf_config(&self, dtype: &str) -> serde_json::Value {
        let eos = match self.eos_token_ids.as_slice() {
            [] => serde_json::Value::Null,
            [one] => serde_json::json!(one),
            many => serde_json::json!(many),
        };
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
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

/// Logits `[n, vocab]` (compute dtype) of the llama network over `ids`.
pub(crate) fn logits(spec: &LlamaSpec, st: &Store, ids: &Tensor) -> Result<Tensor> {
    let map = spec.weight_map();
    let n = ids.dim(0)?;
    let (hq, hkv, dh) = (spec.num_heads, spec.num_kv_heads, spec.head_dim);
    let eps = spec.rms_norm_eps;
    let mut h = st.get(&map.embed.name)?.index_select(ids, 0)?;
    let (cos, sin) = ops::rope_tables(n, dh, spec.rope_theta, st.compute, ids.device())?;
    for l in &map.layers {
        let x = ops::rms_norm(&h, &st.model_form(&l.attn_norm)?, eps)?;
        let heads = |t: Tensor, count: usize| -> Result<Tensor> { t.reshape((n, count, dh))?.transpose(0, 1) };
        let q = ops::rope(&heads(st.linear(&x, l.q_proj.module())?, hq)?, &cos, &sin)?;
        let k = ops::rope(&heads(st.linear(&x, l.k_proj.module())?, hkv)?, &cos, &sin)?;
        let v = heads(st.linear(&x, l.v_proj.module())?, hkv)?;
        let o = ops::causal_attention(&q, &k, &v)?;
        h = (h + st.linear(&o, l.o_proj.module())?)?;
        let x = ops::rms_norm(&h, &st.model_form(&l.ffn_norm)?, eps)?;
        let g = st.linear(&x, l.gate.module())?.silu()?;
        let u = st.linear(&x, l.up.module())?;
        h = (h + st.linear(&(g * u)?, l.down.module())?)?;
    }
    let x = ops::rms_norm(&h, &st.model_form(&map.norm)?, eps)?;
    match &map.lm_head {
        Some(head) => st.linear(&x, head.module()),
        None => st.matmul_weight(&x, &map.embed.name),
    }
}

/// frognano-model's inference llama over the current (LoRA-merged) weights.
pub(crate) fn inference_model(spec: &LlamaSpec, st: &Store) -> anyhow::Result<Llama> {
    Ok(Llama::load(spec.to_config(), &super::io::MergedWeights(st), spec.tie_word_embeddings)?)
}
