//! Reading checkpoints into policy weights and writing them back: any frognano-model
//! [`TensorSource`] (Hugging Face safetensors folders, llama-family GGUF files — llama,
//! mistral, qwen2, qwen3 — dequantized with q/k rows put back into Hugging Face order) read
//! along the architecture's weight map, the policy's own weights handed back as one, merged
//! checkpoints and PEFT adapters.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use candle_core::{DType, Device, Tensor};
use frognano_model::gguf::GgufFile;
use frognano_model::gguf_weights::GgufWeights;
use frognano_model::tensor::{Bytes, DType as MDType, Matrix};
use frognano_model::weights::{TensorSource, WeightSpec};
use frognano_model::ModelError;

use super::store::Store;

/// The weight `name` (LoRA merged) as a frognano-model matrix: bf16 storage stays bf16,
/// everything else becomes f32.
pub(crate) fn matrix(st: &Store, name: &str) -> anyhow::Result<Matrix> {
    let w = st.merged(name)?;
    let (rows, cols) = w.dims2().with_context(|| format!("weight `{name}` is not a matrix"))?;
    if st.storage == DType::BF16 {
        let v: Vec<half::bf16> = w.to_dtype(DType::BF16)?.flatten_all()?.to_vec1()?;
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
        Ok(Matrix::new(rows, cols, MDType::BF16, Bytes::from_vec(bytes)))
    } else {
        Ok(Matrix::from_f32(rows, cols, w.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?))
    }
}

/// The weight `name` (LoRA merged) flattened to f32.
pub(crate) fn vector(st: &Store, name: &str) -> anyhow::Result<Vec<f32>> {
    Ok(st.merged(name)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
}

/// The policy's current weights (LoRA merged) as a [`TensorSource`] in Hugging Face layout,
/// for frognano-model's one `load` per architecture.
pub(crate) struct MergedWeights<'s>(pub &'s Store);

impl MergedWeights<'_> {
    fn err(&self, w: &WeightSpec, e: anyhow::Error) -> ModelError {
        ModelError::format(self.origin(), format!("weight `{}`: {e:#}", w.name))
    }
}

impl TensorSource for MergedWeights<'_> {
    fn origin(&self) -> &Path {
        Path::new("<policy weights>")
    }
    fn contains(&self, name: &str) -> bool {
        self.0.contains(name)
    }
    fn matrix(&self, w: &WeightSpec) -> frognano_model::Result<Matrix> {
        let m = matrix(self.0, &w.name).map_err(|e| self.err(w, e))?;
        if (m.rows, m.cols) != w.dims2() {
            return Err(ModelError::Shape {
                path: self.origin().to_path_buf(),
                name: w.name.clone(),
                expected: w.shape.clone(),
                found: vec![m.rows, m.cols],
            });
        }
        Ok(m)
    }
    fn stored_f32(&self, w: &WeightSpec) -> frognano_model::Result<Vec<f32>> {
        vector(self.0, &w.name).map_err(|e| self.err(w, e))
    }
}

/// Reads every weight of `specs` from `src` in Hugging Face form (stored values, Hugging Face
/// row order) as tensors of exactly those shapes, each converted to `dtype` as it is read (so
/// a bf16 policy never holds the whole model in f32). Errors name the file or folder and the
/// tensor.
pub(crate) fn read_weights(
    src: &dyn TensorSource,
    specs: &[&WeightSpec],
    dtype: DType,
) -> anyhow::Result<Vec<(String, Tensor)>> {
    specs
        .iter()
        .map(|w| {
            if src.stores_model_form(w.role) {
                bail!("{}: tensor `{}` is stored converted and cannot be trained from", src.origin().display(), w.name);
            }
            let v = src.stored_f32(w)?;
            Ok((w.name.clone(), Tensor::from_vec(v, w.shape.as_slice(), &Device::Cpu)?.to_dtype(dtype)?))
        })
        .collect()
}

/// Canonical names of the linear modules LoRA can adapt: the projections of every layer,
/// in map order.
pub(crate) fn linear_modules(specs: &[&WeightSpec]) -> Vec<String> {
    specs
        .iter()
        .filter(|w| w.role.is_projection() && w.name.starts_with("model.layers."))
        .map(|w| w.module().to_string())
        .collect()
}

/// Whether any stored tensor of the checkpoint uses the multimodal wrapper prefix
/// `model.language_model.` (read from the safetensors headers).
pub(crate) fn uses_wrapper_prefix(dir: &Path) -> anyhow::Result<bool> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("{}: cannot list the folder", dir.display()))? {
        let p = entry?.path();
        if p.extension().is_some_and(|e| e == "safetensors") {
            let names = safetensors_names(&p)?;
            if names.iter().any(|n| n.starts_with("model.language_model.")) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Tensor names in a safetensors file's header.
fn safetensors_names(path: &Path) -> anyhow::Result<Vec<String>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).with_context(|| format!("{}: not a safetensors file", path.display()))?;
    let n = u64::from_le_bytes(len);
    if n > 100 << 20 {
        bail!("{}: safetensors header of {n} bytes is implausible", path.display());
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).with_context(|| format!("{}: truncated safetensors header", path.display()))?;
    let v: serde_json::Value = serde_json::from_slice(&header)
        .with_context(|| format!("{}: safetensors header is not JSON", path.display()))?;
    Ok(v.as_object().map(|o| o.keys().filter(|k| *k != "__metadata__").cloned().collect()).unwrap_or_default())
}

/// A llama-family GGUF file (`llama`, `mistral`, `qwen2`, `qwen3`) as Hugging Face-named f32
/// tensors (q/k rows put back into Hugging Face order by [`GgufWeights::in_hf_layout`]) and
/// its spec.
pub(crate) fn read_llama_gguf(path: &Path) -> anyhow::Result<(super::LlamaSpec, Vec<(String, Tensor)>)> {
    let f = GgufFile::open(path)?;
    let arch = f.get_str("general.architecture")?.unwrap_or("").to_string();
    if !matches!(arch.as_str(), "llama" | "mistral" | "qwen2" | "qwen3") {
        bail!(
            "{}: general.architecture {arch:?} cannot be trained; supported GGUF: llama, mistral, qwen2, qwen3",
            path.display()
        );
    }
    if f.contains("rope_freqs.weight") {
        bail!("{}: tensor `rope_freqs.weight` (Llama 3.1 RoPE scaling) is not supported for training", path.display());
    }
    if arch != "qwen2" && f.contains("blk.0.attn_q.bias") {
        bail!("{}: tensor `blk.0.attn_q.bias`: attention biases are only supported for qwen2", path.display());
    }
    let c = frognano_model::llama::Llama::config_from_gguf(&f)?;
    if c.rope_freq_scale != 1.0 || c.yarn.is_some() || c.attn_temperature.is_some() {
        bail!("{}: RoPE scaling (rope.scaling.type) is not supported for training", path.display());
    }
    if c.rope_dim != c.head_dim {
        bail!("{}: rope.dimension_count {} differs from the head size {}", path.display(), c.rope_dim, c.head_dim);
    }
    let src = GgufWeights::new(&f)?.in_hf_layout();
    let mut spec = super::LlamaSpec::from_config(&c, !src.contains(frognano_model::weights::LM_HEAD));
    spec.bos_token_id = f.get_u64("tokenizer.ggml.bos_token_id")?.map(|v| v as u32);
    spec.eos_token_ids = f.get_u64("tokenizer.ggml.eos_token_id")?.map(|v| vec![v as u32]).unwrap_or_default();
    let tensors = read_weights(&src, &spec.weight_map().specs(), DType::F32)?;
    Ok((spec, tensors))
}

/// Writes `tensors` to a safetensors file.
pub(crate) fn write_safetensors(tensors: &HashMap<String, Tensor>, path: &Path) -> anyhow::Result<()> {
    candle_core::safetensors::save(tensors, path).with_context(|| format!("{}: cannot write", path.display()))?;
    // The writer creates the file owner-only; checkpoints are meant to be shared like the
    // other files of the folder.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
            .with_context(|| format!("{}: cannot set permissions", path.display()))?;
    }
    Ok(())
}

/// Removes `model.safetensors.index.json` and `model-NNNNN-of-NNNNN.safetensors` shards from
/// `dir` (before a single-file merged save).
pub(crate) fn remove_stale_shards(dir: &Path) -> anyhow::Result<()> {
    let is_shard = |name: &str| {
        name.strip_prefix("model-").and_then(|r| r.strip_suffix(".safetensors")).is_some_and(|mid| {
            let parts: Vec<&str> = mid.split("-of-").collect();
            parts.len() == 2 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
    };
    for entry in std::fs::read_dir(dir).with_context(|| format!("{}: cannot list the folder", dir.display()))? {
        let p = entry?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "model.safetensors.index.json" || is_shard(name) {
            std::fs::remove_file(&p).with_context(|| format!("{}: cannot remove the old shard", p.display()))?;
        }
    }
    Ok(())
}

/// Writes pretty JSON.
pub(crate) fn write_json(path: &Path, v: &serde_json::Value) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(v)?;
    std::fs::write(path, text + "\n").with_context(|| format!("{}: cannot write", path.display()))
}

/// The tokenizer, chat template and generation files a checkpoint folder carries.
const SIDE_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
];

/// Copies the tokenizer / chat-template / generation files of `src` that exist into `dst`.
pub(crate) fn copy_side_files(src: &Path, dst: &Path) -> anyhow::Result<()> {
    for f in SIDE_FILES {
        let from = src.join(f);
        if from.is_file() {
            let to = dst.join(f);
            if same_file(&from, &to) {
                continue;
            }
            std::fs::copy(&from, &to).with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
        }
    }
    Ok(())
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Writes `tokenizer.json`, `tokenizer_config.json` (with the chat template and special
/// tokens) and `generation_config.json` for a checkpoint trained from the GGUF file `path`,
/// from the file's metadata.
pub(crate) fn write_gguf_side_files(path: &Path, dst: &Path) -> anyhow::Result<()> {
    let f = GgufFile::open(path)?;
    if f.get("tokenizer.ggml.model").is_some() {
        let tok = frognano_model::gguf_load::tokenizer_from_gguf(&f)?;
        let out = dst.join("tokenizer.json");
        tok.inner().save(&out, false).map_err(|e| anyhow!("{}: cannot write the tokenizer: {e}", out.display()))?;
    }
    let tokens = f.get_str_array("tokenizer.ggml.tokens")?.unwrap_or_default();
    let text = |key: &str| -> anyhow::Result<Option<String>> {
        Ok(f.get_u64(key)?.and_then(|id| tokens.get(id as usize)).map(|s| s.to_string()))
    };
    let mut cfg = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": false,
        // SentencePiece vocabularies add a BOS unless the file says otherwise (as llama.cpp
        // and `tokenizer_from_gguf` read them); byte-level BPE ones only when it says so.
        "add_bos_token": f
            .get_bool("tokenizer.ggml.add_bos_token")?
            .unwrap_or(f.get_str("tokenizer.ggml.model")? == Some("llama")),
    });
    for (field, key) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
    ] {
        if let Some(t) = text(key)? {
            cfg[field] = serde_json::Value::String(t);
        }
    }
    if let Some(t) = f.get_str("tokenizer.chat_template")? {
        cfg["chat_template"] = serde_json::Value::String(t.to_string());
    }
    write_json(&dst.join("tokenizer_config.json"), &cfg)?;
    let stop = frognano_model::gguf_load::stop_ids_from_gguf(&f)?;
    let mut gen = serde_json::json!({ "eos_token_id": stop });
    if let Some(bos) = f.get_u64("tokenizer.ggml.bos_token_id")? {
        gen["bos_token_id"] = serde_json::json!(bos);
    }
    write_json(&dst.join("generation_config.json"), &gen)
}

/// Hugging Face name of a dtype for `config.json`.
pub(crate) fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    }
}

/// Loads a safetensors file of parameters (for [`super::Policy::load_params`]).
pub(crate) fn load_tensor_file(path: &Path) -> anyhow::Result<HashMap<String, Tensor>> {
    candle_core::safetensors::load(path, &Device::Cpu)
        .with_context(|| format!("{}: cannot read as safetensors", path.display()))
}

/// `path` made absolute if possible (for `base_model_name_or_path`).
pub(crate) fn absolute(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}
