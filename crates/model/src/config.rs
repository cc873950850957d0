//! `config.json` → typed configuration. Accepts the multimodal wrapper (`model_type:
//! "qwen3_5"` with the text model under `text_config`) and the flat text-only form
//! (`qwen3_5_text`). Defaults are transformers 5.23's, not the real models' (docs/model.md §1.1).

use std::path::Path;

use serde_json::Value;

use crate::error::{ModelError, Result};

/// Which kind of mixer a layer has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerType {
    /// Gated DeltaNet (linear attention).
    Linear,
    /// Gated full attention.
    Full,
}

/// Qwen3.5 text-model configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen35Config {
    /// Padded vocabulary (rows of the embedding).
    pub vocab_size: usize,
    /// Model width d.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Full-attention query heads.
    pub num_attention_heads: usize,
    /// Full-attention KV heads.
    pub num_key_value_heads: usize,
    /// Full-attention head dim.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Output head shares the embedding.
    pub tie_word_embeddings: bool,
    /// Depthwise conv kernel K.
    pub linear_conv_kernel_dim: usize,
    /// DeltaNet key head dim dk.
    pub linear_key_head_dim: usize,
    /// DeltaNet value head dim dv.
    pub linear_value_head_dim: usize,
    /// DeltaNet key heads Hk.
    pub linear_num_key_heads: usize,
    /// DeltaNet value heads Hv (a multiple of Hk).
    pub linear_num_value_heads: usize,
    /// Mixer of each layer.
    pub layer_types: Vec<LayerType>,
    /// RoPE base.
    pub rope_theta: f64,
    /// Fraction of each head's dims that RoPE rotates.
    pub partial_rotary_factor: f64,
    /// Longest supported context.
    pub max_position_embeddings: usize,
    /// End-of-sequence ids named in the config.
    pub eos_token_ids: Vec<u32>,
}

impl Qwen35Config {
    /// Dims rotated by RoPE in each full-attention head.
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim as f64 * self.partial_rotary_factor) as usize
    }
    /// Hk · dk.
    pub fn key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }
    /// Hv · dv.
    pub fn value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }
    /// Channels of the causal conv: q, k and v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Reads `config.json` at `path`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let v: Value =
            serde_json::from_str(&text).map_err(|e| ModelError::format(path, format!("invalid JSON: {e}")))?;
        Self::from_json(&v).map_err(|msg| ModelError::format(path, msg))
    }

    /// Builds the config from parsed `config.json`; the error names the field.
    pub fn from_json(root: &Value) -> std::result::Result<Self, String> {
        let model_type = root.get("model_type").and_then(Value::as_str).unwrap_or("");
        if !matches!(model_type, "qwen3_5" | "qwen3_5_text") {
            return Err(format!("unknown model_type {model_type:?}; expected \"qwen3_5\" or \"qwen3_5_text\""));
        }
        let c = root.get("text_config").filter(|v| v.is_object()).unwrap_or(root);
        let int = |key: &str, default: usize| -> std::result::Result<usize, String> {
            match c.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v
                    .as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| format!("field `{key}`: expected a non-negative integer, found {v}")),
            }
        };
        let float = |obj: &Value, key: &str, default: f64| -> std::result::Result<f64, String> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v.as_f64().ok_or_else(|| format!("field `{key}`: expected a number, found {v}")),
            }
        };
        let num_hidden_layers = int("num_hidden_layers", 32)?;
        let layer_types = match c.get("layer_types") {
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, t)| match t.as_str() {
                    Some("linear_attention") => Ok(LayerType::Linear),
                    Some("full_attention") => Ok(LayerType::Full),
                    _ => Err(format!(
                        "field `layer_types[{i}]`: expected \"linear_attention\" or \"full_attention\", found {t}"
                    )),
                })
                .collect::<std::result::Result<Vec<_>, _>>()?,
            None | Some(Value::Null) => {
                let interval = int("full_attention_interval", 4)?.max(1);
                (0..num_hidden_layers)
                    .map(|i| if (i + 1) % interval == 0 { LayerType::Full } else { LayerType::Linear })
                    .collect()
            }
            Some(v) => return Err(format!("field `layer_types`: expected a list, found {v}")),
        };
        if layer_types.len() != num_hidden_layers {
            return Err(format!(
                "field `layer_types` has {} entries, expected num_hidden_layers = {num_hidden_layers}",
                layer_types.len()
            ));
        }
        // RoPE settings moved into `rope_parameters` in transformers 5; older files keep them
        // at top level.
        let rope = c.get("rope_parameters").filter(|v| v.is_object());
        let rope_theta = match rope {
            Some(r) if r.get("rope_theta").is_some() => float(r, "rope_theta", 10000.0)?,
            _ => float(c, "rope_theta", 10000.0)?,
        };
        let partial_rotary_factor = match rope {
            Some(r) if r.get("partial_rotary_factor").is_some() => float(r, "partial_rotary_factor", 0.25)?,
            _ => float(c, "partial_rotary_factor", 0.25)?,
        };
        // The wrapper carries tie_word_embeddings at top level; the text config may too.
        let tie = c
            .get("tie_word_embeddings")
            .or_else(|| root.get("tie_word_embeddings"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let eos_token_ids = match c.get("eos_token_id").or_else(|| root.get("eos_token_id")) {
            Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
            _ => vec![],
        };
        let cfg = Qwen35Config {
            vocab_size: int("vocab_size", 248320)?,
            hidden_size: int("hidden_size", 4096)?,
            intermediate_size: int("intermediate_size", 12288)?,
            num_hidden_layers,
            num_attention_heads: int("num_attention_heads", 16)?,
            num_key_value_heads: int("num_key_value_heads", 4)?,
            head_dim: int("head_dim", 256)?,
            rms_norm_eps: float(c, "rms_norm_eps", 1e-6)?,
            tie_word_embeddings: tie,
            linear_conv_kernel_dim: int("linear_conv_kernel_dim", 4)?,
            linear_key_head_dim: int("linear_key_head_dim", 128)?,
            linear_value_head_dim: int("linear_value_head_dim", 128)?,
            linear_num_key_heads: int("linear_num_key_heads", 16)?,
            linear_num_value_heads: int("linear_num_value_heads", 32)?,
            layer_types,
            rope_theta,
            partial_rotary_factor,
            max_position_embeddings: int("max_position_embeddings", 32768)?,
            eos_token_ids,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let nonzero = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_num_value_heads", self.linear_num_value_heads),
            ("linear_key_head_dim", self.linear_key_head_dim),
            ("linear_value_head_dim", self.linear_value_head_dim),
            ("linear_conv_kernel_dim", self.linear_conv_kernel_dim),
        ];
        for (k, v) in nonzero {
            if v == 0 {
                return Err(format!("field `{k}` must be positive"));
            }
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.linear_num_value_heads.is_multiple_of(self.linear_num_key_heads) {
            return Err(format!(
                "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
                self.linear_num_value_heads, self.linear_num_key_heads
            ));
        }
        let r = self.rotary_dim();
        if !r.is_multiple_of(2) || r > self.head_dim {
            return Err(format!("rotary dim {r} (head_dim × partial_rotary_factor) must be even and ≤ head_dim"));
        }
        Ok(())
    }
}

/// `generation_config.json`: sampling defaults and stop ids shipped with a checkpoint.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    /// All end-of-sequence ids (the file's `eos_token_id`, scalar or list).
    pub eos_token_ids: Vec<u32>,
    /// Suggested temperature.
    pub temperature: Option<f32>,
    /// Suggested nucleus mass.
    pub top_p: Option<f32>,
    /// Suggested top-k.
    pub top_k: Option<usize>,
    /// Suggested repetition penalty.
    pub repetition_penalty: Option<f32>,
}

impl GenerationConfig {
    /// Reads the file; a missing file is `Ok(None)`.
    pub fn from_file(path: &Path) -> Result<Option<Self>> {
        if !path.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let v: Value =
            serde_json::from_str(&text).map_err(|e| ModelError::format(path, format!("invalid JSON: {e}")))?;
        let eos_token_ids = match v.get("eos_token_id") {
            Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
            _ => vec![],
        };
        let f = |k: &str| v.get(k).and_then(Value::as_f64).map(|x| x as f32);
        Ok(Some(GenerationConfig {
            eos_token_ids,
            temperature: f("temperature"),
            top_p: f("top_p"),
            top_k: v.get("top_k").and_then(Value::as_u64).map(|x| x as usize),
            repetition_penalty: f("repetition_penalty"),
        }))
    }
}
