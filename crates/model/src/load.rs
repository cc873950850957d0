//! One entry point from what the user typed (`MODEL`) to a runnable model: a checkpoint
//! folder, or a hub id already in the local cache.

use std::path::{Path, PathBuf};

use crate::config::GenerationConfig;
use crate::error::{ModelError, Result};
use crate::qwen35::Qwen35;
use crate::CausalLm;

/// A model with what is needed to talk to it.
pub struct LoadedModel {
    /// The network.
    pub model: Box<dyn CausalLm>,
    /// Where it was loaded from.
    pub path: PathBuf,
    /// Sampling defaults and stop ids from `generation_config.json`, if shipped.
    pub generation: GenerationConfig,
    /// Every id that ends generation (config + generation config, deduplicated).
    pub eos_ids: Vec<u32>,
    /// Bytes of weights the model uses.
    pub weight_bytes: usize,
}

/// Resolves `spec` (folder or hub id) to a folder on disk.
pub fn resolve_path(spec: &str) -> Result<PathBuf> {
    let p = Path::new(spec);
    if p.exists() {
        return Ok(p.to_path_buf());
    }
    if crate::hub::looks_like_repo_id(spec) {
        return crate::hub::resolve(spec, "main");
    }
    Err(ModelError::io(p, std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder")))
}

/// Loads the model named by `spec`.
pub fn load(spec: impl AsRef<str>) -> Result<LoadedModel> {
    let path = resolve_path(spec.as_ref())?;
    if !path.is_dir() {
        return Err(ModelError::format(&path, "expected a checkpoint folder with config.json and *.safetensors"));
    }
    let cfg_path = path.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::io(&cfg_path, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::format(&cfg_path, format!("invalid JSON: {e}")))?;
    let model_type = v.get("model_type").and_then(|m| m.as_str()).unwrap_or("");
    let generation = GenerationConfig::from_file(&path.join("generation_config.json"))?.unwrap_or_default();
    let (model, mut eos_ids, weight_bytes): (Box<dyn CausalLm>, Vec<u32>, usize) = match model_type {
        "qwen3_5" | "qwen3_5_text" => {
            let st = crate::safetensors_dir::SafetensorsDir::open(&path)?;
            let cfg = crate::config::Qwen35Config::from_file(&cfg_path)?;
            let eos = cfg.eos_token_ids.clone();
            let bytes = st.byte_len();
            (Box::new(Qwen35::from_safetensors_parts(cfg, &st)?), eos, bytes)
        }
        other => {
            return Err(ModelError::format(
                &cfg_path,
                format!("unknown model_type {other:?}; supported: \"qwen3_5\", \"qwen3_5_text\""),
            ))
        }
    };
    eos_ids.extend(&generation.eos_token_ids);
    eos_ids.sort_unstable();
    eos_ids.dedup();
    Ok(LoadedModel { model, path, generation, eos_ids, weight_bytes })
}
