//! Qwen3.5 from a GGUF file (llama.cpp architecture `qwen35`, docs/model.md §2.2): the
//! `qwen35.*` metadata as a [`Qwen35Config`]. The tensors are read by Hugging Face name through
//! [`GgufWeights`], which knows llama.cpp's names and what its converter stored converted.
//! Activations are f32 whatever the weight type, as in llama.cpp.

use crate::config::{LayerType, Qwen35Config};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::gguf_weights::GgufWeights;
use crate::kernels::Act;
use crate::qwen35::Qwen35;
use crate::{CausalLm, KvType};

/// Reads the `qwen35.*` hyper-parameters of a GGUF file.
pub fn config_from_gguf(f: &GgufFile) -> Result<Qwen35Config> {
    let arch = f.get_str("general.architecture")?.unwrap_or("");
    if arch != "qwen35" {
        return Err(ModelError::format(f.path(), format!("general.architecture is {arch:?}, expected \"qwen35\"")));
    }
    let k = |s: &str| format!("qwen35.{s}");
    // A file converted with its MTP head counts the head's layers in `block_count` (they come
    // after the main layers); `nextn_predict_layers` says how many.
    let blocks = f.req_usize(&k("block_count"))?;
    let nextn = f.get_u64(&k("nextn_predict_layers"))?.unwrap_or(0) as usize;
    if nextn >= blocks {
        return Err(ModelError::format(
            f.path(),
            format!("qwen35.nextn_predict_layers {nextn} leaves no main layer of block_count {blocks}"),
        ));
    }
    let n_layers = blocks - nextn;
    let layer_types: Vec<LayerType> = if let Some(v) = f.get(&k("attention.recurrent_layers")) {
        let arr = v.as_array().ok_or_else(|| {
            ModelError::format(f.path(), "metadata `qwen35.attention.recurrent_layers` is not an array")
        })?;
        // One entry per block, the MTP blocks' too: the main layers are the first ones.
        let arr = if arr.len() == blocks { &arr[..n_layers] } else { arr };
        arr.iter()
            .map(|e| match e.as_bool() {
                Some(true) => Ok(LayerType::Linear),
                Some(false) => Ok(LayerType::Full),
                None => Err(ModelError::format(f.path(), "`qwen35.attention.recurrent_layers` holds a non-bool")),
            })
            .collect::<Result<_>>()?
    } else {
        let every = f.req_usize(&k("full_attention_interval"))?;
        if every == 0 {
            return Err(ModelError::format(f.path(), "`qwen35.full_attention_interval` is 0"));
        }
        (0..n_layers).map(|i| if (i + 1).is_multiple_of(every) { LayerType::Full } else { LayerType::Linear }).collect()
    };
    if layer_types.len() != n_layers {
        return Err(ModelError::format(
            f.path(),
            format!("{} layer types for block_count {n_layers}", layer_types.len()),
        ));
    }
    let head_dim = f.req_usize(&k("attention.key_length"))?;
    let rope_dim = f.get_u64(&k("rope.dimension_count"))?.map_or(head_dim, |v| v as usize);
    let state = f.req_usize(&k("ssm.state_size"))?;
    let hv = f.req_usize(&k("ssm.time_step_rank"))?;
    let hk = f.req_usize(&k("ssm.group_count"))?;
    if hk == 0 || !hv.is_multiple_of(hk) || head_dim == 0 {
        return Err(ModelError::format(
            f.path(),
            format!("ssm.time_step_rank {hv} is not a multiple of ssm.group_count {hk}"),
        ));
    }
    let inner = f.req_usize(&k("ssm.inner_size"))?;
    if inner != hv * state {
        return Err(ModelError::format(
            f.path(),
            format!("ssm.inner_size {inner} ≠ ssm.time_step_rank {hv} × ssm.state_size {state}"),
        ));
    }
    let vocab = f
        .tensor("token_embd.weight")
        .and_then(|t| t.dims.get(1).copied())
        .ok_or_else(|| ModelError::MissingTensor { path: f.path().to_path_buf(), name: "token_embd.weight".into() })?;
    let eos: Vec<u32> = f.get_u64("tokenizer.ggml.eos_token_id")?.map(|v| v as u32).into_iter().collect();
    Ok(Qwen35Config {
        vocab_size: vocab,
        hidden_size: f.req_usize(&k("embedding_length"))?,
        intermediate_size: f.req_usize(&k("feed_forward_length"))?,
        num_hidden_layers: n_layers,
        num_attention_heads: f.req_usize(&k("attention.head_count"))?,
        num_key_value_heads: f.req_usize(&k("attention.head_count_kv"))?,
        head_dim,
        rms_norm_eps: f.get_f64(&k("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6),
        tie_word_embeddings: !f.contains("output.weight"),
        linear_conv_kernel_dim: f.req_usize(&k("ssm.conv_kernel"))?,
        linear_key_head_dim: state,
        linear_value_head_dim: state,
        linear_num_key_heads: hk,
        linear_num_value_heads: hv,
        layer_types,
        rope_theta: f.get_f64(&k("rope.freq_base"))?.unwrap_or(1e7),
        partial_rotary_factor: rope_dim as f64 / head_dim as f64,
        max_position_embeddings: f.get_u64(&k("context_length"))?.map_or(262_144, |v| v as usize),
        eos_token_ids: eos,
    })
}

/// Builds a [`Qwen35`] from a `qwen35` GGUF file (tensors stay memory-mapped): the config
/// from its metadata, the weights through [`GgufWeights`], in f32 activations and with an f16
/// KV cache, as llama.cpp.
pub fn qwen35_from_gguf(f: &GgufFile) -> Result<Qwen35> {
    let cfg = config_from_gguf(f)?;
    let mut m = Qwen35::load(cfg, &GgufWeights::new(f)?, Some(Act::F32))?;
    m.set_kv_type(KvType::F16)?;
    Ok(m)
}
