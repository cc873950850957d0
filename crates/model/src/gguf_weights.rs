//! A GGUF file as a [`TensorSource`] of Hugging Face names: the one place that knows
//! llama.cpp's tensor names and what its converter changed.
//!
//! * names: `model.layers.N.self_attn.q_proj.weight` is `blk.N.attn_q.weight`, and so on
//!   ([`gguf_name`]);
//! * `qwen35` (docs/model.md §2.2): the zero-centred norms are stored as `1 + w` (but
//!   `ssm_norm` as plain `w`), `A` as `ssm_a = −exp(A_log)`, and the value heads of every
//!   DeltaNet tensor in tiled order, so value head `v` reads key head `v mod Hk`. The conv
//!   kernel `ssm_conv1d` is `[K, channels]` in ggml order, i.e. channel-major in memory, which
//!   is the Hugging Face `[channels, 1, K]` layout;
//! * `llama` / `mistral` / `granite`: the q/k rows of each head are permuted for ggml's
//!   adjacent-pair RoPE. Inference reads them as stored ([`RopeStyle::Interleaved`]);
//!   [`GgufWeights::in_hf_layout`] puts them back into Hugging Face order (the trainer does,
//!   so its checkpoints are Hugging Face ones). `qwen2` and `qwen3` files keep Hugging Face
//!   order (llama.cpp rotates them in halves, its NEOX RoPE);
//! * a `qwen35` file converted with its MTP head (`qwen35.nextn_predict_layers` > 0) holds it
//!   as the blocks after the main layers ([`mtp_gguf_name`]).

use std::path::Path;

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::tensor::Matrix;
use crate::weights::{HeadOrder, Layout, Role, RopeStyle, TensorSource, WeightSpec};

/// The architectures whose tensor names the adapter knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufArch {
    /// `qwen35`.
    Qwen35,
    /// `llama`, `mistral`, `mistral3` (Ministral 3: llama with YaRN and an attention
    /// temperature), `granite` (q/k rows permuted for adjacent-pair RoPE).
    Llama,
    /// `qwen2` (llama layout with q/k/v biases, q/k rows in Hugging Face order).
    Qwen2,
    /// `qwen3` (llama layout with per-head q/k RMSNorms `attn_q_norm`/`attn_k_norm`, no
    /// biases, q/k rows in Hugging Face order).
    Qwen3,
    /// `phi3` (Phi-3, Phi-3.5, Phi-4-mini: llama with fused `attn_qkv` and `ffn_up` = gate and
    /// up, rows in Hugging Face order, LongRoPE factors).
    Phi3,
}

impl GgufArch {
    /// The architecture named by `general.architecture`, if the adapter knows it.
    pub fn from_name(arch: &str) -> Option<Self> {
        match arch {
            "qwen35" => Some(GgufArch::Qwen35),
            "llama" | "mistral" | "mistral3" | "granite" | "smollm3" => Some(GgufArch::Llama),
            "qwen2" => Some(GgufArch::Qwen2),
            "qwen3" => Some(GgufArch::Qwen3),
            "phi3" => Some(GgufArch::Phi3),
            _ => None,
        }
    }

    /// How the file orders head-structured rows.
    pub fn layout(self) -> Layout {
        match self {
            GgufArch::Qwen35 => Layout { value_heads: HeadOrder::Tiled, rope: RopeStyle::Halves },
            GgufArch::Llama => Layout { value_heads: HeadOrder::Grouped, rope: RopeStyle::Interleaved },
            GgufArch::Qwen2 | GgufArch::Qwen3 | GgufArch::Phi3 => Layout::HUGGING_FACE,
        }
    }
}

/// Per-layer Hugging Face name suffixes and their llama.cpp names.
const LAYER_NAMES: &[(&str, &str)] = &[
    ("input_layernorm.weight", "attn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("self_attn.q_proj.bias", "attn_q.bias"),
    ("self_attn.k_proj.bias", "attn_k.bias"),
    ("self_attn.v_proj.bias", "attn_v.bias"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
    ("linear_attn.in_proj_qkv.weight", "attn_qkv.weight"),
    ("linear_attn.in_proj_z.weight", "attn_gate.weight"),
    ("linear_attn.in_proj_b.weight", "ssm_beta.weight"),
    ("linear_attn.in_proj_a.weight", "ssm_alpha.weight"),
    ("linear_attn.conv1d.weight", "ssm_conv1d.weight"),
    ("linear_attn.dt_bias", "ssm_dt.bias"),
    ("linear_attn.A_log", "ssm_a"),
    ("linear_attn.norm.weight", "ssm_norm.weight"),
    ("linear_attn.out_proj.weight", "ssm_out.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
    ("self_attn.qkv_proj.weight", "attn_qkv.weight"),
    ("mlp.gate_up_proj.weight", "ffn_up.weight"),
];

/// The llama.cpp name of the Hugging Face tensor `hf` in a file of architecture `arch`, or
/// `None` when llama.cpp has no such tensor.
pub fn gguf_name(arch: GgufArch, hf: &str) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "rope_freqs.weight" => return Some("rope_freqs.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let gguf = match (arch, suffix) {
        // Qwen3.5 keeps the Hugging Face name; the llama family calls it the FFN norm.
        (GgufArch::Qwen35, "post_attention_layernorm.weight") => "post_attention_norm.weight",
        (_, "post_attention_layernorm.weight") => "ffn_norm.weight",
        _ => LAYER_NAMES.iter().find(|(h, _)| *h == suffix)?.1,
    };
    Some(format!("blk.{layer}.{gguf}"))
}

/// The llama.cpp name of a Qwen3.5 multi-token-prediction tensor (`mtp.*`) in a file whose
/// MTP block is `blk.{block}`: llama.cpp's converter appends the MTP layers after the main
/// ones (`block_count` counts them, `qwen35.nextn_predict_layers` says how many) and names the
/// head's own tensors `nextn.*`; the MTP decoder layer keeps the per-layer names. `None` for
/// any other name.
pub fn mtp_gguf_name(block: usize, hf: &str) -> Option<String> {
    let rest = hf.strip_prefix("mtp.")?;
    let nextn = match rest {
        "fc.weight" => "eh_proj.weight",
        "pre_fc_norm_embedding.weight" => "enorm.weight",
        "pre_fc_norm_hidden.weight" => "hnorm.weight",
        "norm.weight" => "shared_head_norm.weight",
        "embed_tokens.weight" => "embed_tokens.weight",
        _ => {
            let (layer, suffix) = rest.strip_prefix("layers.")?.split_once('.')?;
            let layer: usize = layer.parse().ok()?;
            return gguf_name(GgufArch::Qwen35, &format!("model.layers.{}.{suffix}", block + layer));
        }
    };
    Some(format!("blk.{block}.nextn.{nextn}"))
}

/// A GGUF file read by Hugging Face names (see the module docs).
pub struct GgufWeights<'f> {
    file: &'f GgufFile,
    arch: GgufArch,
    hf_layout: bool,
    /// The first MTP block of a `qwen35` file that has one (`block_count − nextn_predict_layers`).
    mtp_block: Option<usize>,
}

impl<'f> GgufWeights<'f> {
    /// The adapter for `file`; an error names `general.architecture` when it is not one the
    /// adapter knows.
    pub fn new(file: &'f GgufFile) -> Result<Self> {
        let name = file.get_str("general.architecture")?.unwrap_or("");
        let arch = GgufArch::from_name(name).ok_or_else(|| {
            ModelError::format(
                file.path(),
                format!(
                    "general.architecture {name:?} is not supported; supported: llama, mistral, mistral3, granite, smollm3, phi3, qwen2, qwen3, qwen35"
                ),
            )
        })?;
        let mtp_block = match arch {
            GgufArch::Qwen35 => {
                let nextn = file.get_u64("qwen35.nextn_predict_layers")?.unwrap_or(0) as usize;
                let blocks = file.get_u64("qwen35.block_count")?.unwrap_or(0) as usize;
                (nextn > 0 && nextn < blocks).then(|| blocks - nextn)
            }
            _ => None,
        };
        Ok(GgufWeights { file, arch, hf_layout: false, mtp_block })
    }

    /// The llama.cpp name of `hf` in this file (main model, or the MTP head when it has one).
    fn file_name(&self, hf: &str) -> Option<String> {
        gguf_name(self.arch, hf).or_else(|| self.mtp_block.and_then(|b| mtp_gguf_name(b, hf)))
    }

    /// The same file with permuted q/k rows put back into Hugging Face order (what the
    /// trainer reads; the values are then f32).
    pub fn in_hf_layout(self) -> Self {
        GgufWeights { hf_layout: true, ..self }
    }

    /// The file's architecture.
    pub fn arch(&self) -> GgufArch {
        self.arch
    }

    /// The file.
    pub fn file(&self) -> &'f GgufFile {
        self.file
    }

    fn name(&self, w: &WeightSpec) -> Result<String> {
        self.file_name(&w.name).ok_or_else(|| ModelError::MissingTensor {
            path: self.file.path().to_path_buf(),
            name: format!("{} (no llama.cpp name for this tensor)", w.name),
        })
    }

    /// Heads whose rows must be un-permuted for `w`, when reading in Hugging Face layout.
    fn permuted_heads(&self, w: &WeightSpec) -> Option<usize> {
        match w.role {
            Role::RotaryLinear { heads } if self.hf_layout && self.arch.layout().rope == RopeStyle::Interleaved => {
                Some(heads)
            }
            _ => None,
        }
    }
}

impl TensorSource for GgufWeights<'_> {
    fn origin(&self) -> &Path {
        self.file.path()
    }

    fn layout(&self) -> Layout {
        let native = self.arch.layout();
        if self.hf_layout {
            Layout { rope: RopeStyle::Halves, ..native }
        } else {
            native
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.file_name(name).is_some_and(|g| self.file.contains(&g))
    }

    fn matrix(&self, w: &WeightSpec) -> Result<Matrix> {
        let (rows, cols) = w.dims2();
        let m = self.file.matrix(&self.name(w)?, rows, cols)?;
        Ok(match self.permuted_heads(w) {
            Some(heads) => Matrix::from_f32(rows, cols, unpermute_rows(&m.to_f32(), heads, rows / heads, cols)),
            None => m,
        })
    }

    fn stored_f32(&self, w: &WeightSpec) -> Result<Vec<f32>> {
        if w.role.is_matrix() {
            // Through the matrix reader: it checks both dimensions, and un-permutes.
            return Ok(self.matrix(w)?.to_f32());
        }
        self.file.f32(&self.name(w)?, w.elements())
    }

    fn stores_model_form(&self, role: Role) -> bool {
        self.arch == GgufArch::Qwen35 && matches!(role, Role::ZeroCentredNorm | Role::LogDecay)
    }
}

/// Rows of a llama.cpp-permuted q or k weight put back into Hugging Face order. The
/// converter stores row `2j + s` of each head at what was row `s·dh/2 + j`.
pub fn unpermute_rows(w: &[f32], heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    reorder_rows(w, heads, head_dim, cols, true)
}

/// Rows in Hugging Face order put into llama.cpp's permuted order (the converter's
/// direction; the inverse of [`unpermute_rows`]): what a q or k update must go through to be
/// added to a llama-architecture GGUF's weights as stored.
pub fn permute_rows(w: &[f32], heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    reorder_rows(w, heads, head_dim, cols, false)
}

/// Moves each head's rows between the stored order (row `2j + s`) and Hugging Face order (row
/// `s·dh/2 + j`): towards Hugging Face order when `to_hf`.
fn reorder_rows(w: &[f32], heads: usize, head_dim: usize, cols: usize, to_hf: bool) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0.0f32; w.len()];
    for h in 0..heads {
        for j in 0..half {
            for s in 0..2 {
                let stored = (h * head_dim + 2 * j + s) * cols;
                let hf = (h * head_dim + s * half + j) * cols;
                let (src, dst) = if to_hf { (stored, hf) } else { (hf, stored) };
                out[dst..dst + cols].copy_from_slice(&w[src..src + cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_llama_cpp_per_architecture() {
        let n = |a, h| gguf_name(a, h);
        assert_eq!(
            n(GgufArch::Llama, "model.layers.3.self_attn.q_proj.weight").as_deref(),
            Some("blk.3.attn_q.weight")
        );
        assert_eq!(
            n(GgufArch::Llama, "model.layers.0.post_attention_layernorm.weight").as_deref(),
            Some("blk.0.ffn_norm.weight")
        );
        assert_eq!(
            n(GgufArch::Qwen35, "model.layers.0.post_attention_layernorm.weight").as_deref(),
            Some("blk.0.post_attention_norm.weight")
        );
        assert_eq!(n(GgufArch::Qwen35, "model.layers.2.linear_attn.A_log").as_deref(), Some("blk.2.ssm_a"));
        assert_eq!(n(GgufArch::Qwen35, "lm_head.weight").as_deref(), Some("output.weight"));
        assert_eq!(n(GgufArch::Llama, "model.layers.x.mlp.up_proj.weight"), None);
        assert_eq!(n(GgufArch::Llama, "model.visual.patch_embed.weight"), None);
        // The MTP head after 32 main layers: its own tensors are `nextn.*`, its decoder layer
        // has the per-layer names.
        assert_eq!(mtp_gguf_name(32, "mtp.fc.weight").as_deref(), Some("blk.32.nextn.eh_proj.weight"));
        assert_eq!(mtp_gguf_name(32, "mtp.norm.weight").as_deref(), Some("blk.32.nextn.shared_head_norm.weight"));
        assert_eq!(mtp_gguf_name(32, "mtp.layers.0.self_attn.q_proj.weight").as_deref(), Some("blk.32.attn_q.weight"));
        assert_eq!(
            mtp_gguf_name(32, "mtp.layers.0.post_attention_layernorm.weight").as_deref(),
            Some("blk.32.post_attention_norm.weight")
        );
        assert_eq!(mtp_gguf_name(32, "model.norm.weight"), None);
    }

    #[test]
    fn unpermute_inverts_the_converters_permutation() {
        // One head of dim 4, one column: HF rows [a0 a1 b0 b1] are stored as [a0 b0 a1 b1].
        let stored = [0.0, 2.0, 1.0, 3.0];
        assert_eq!(unpermute_rows(&stored, 1, 4, 1), vec![0.0, 1.0, 2.0, 3.0]);
        assert_eq!(permute_rows(&[0.0, 1.0, 2.0, 3.0], 1, 4, 1), stored.to_vec());
        // Two heads of dim 6, three columns: a round trip.
        let w: Vec<f32> = (0..36).map(|i| i as f32).collect();
        assert_eq!(unpermute_rows(&permute_rows(&w, 2, 6, 3), 2, 6, 3), w);
        assert_ne!(permute_rows(&w, 2, 6, 3), w);
    }
}
