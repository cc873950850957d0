//! One entry point from what the user typed (`MODEL`) to a runnable model: a checkpoint
//! folder, a `.gguf` file, or a hub id already in the local cache. The top of the crate: it
//! picks the architecture, hands its `load` the right [`crate::weights::TensorSource`], and
//! gathers the tokenizer, chat template and stop ids.

use std::path::{Path, PathBuf};

use crate::chat::ChatTemplate;
use crate::config::{GenerationConfig, Qwen35Config};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::gguf_load::{chat_template_from_gguf, stop_ids_from_gguf, tokenizer_from_gguf};
use crate::gguf_weights::{GgufArch, GgufWeights};
use crate::kernels::Act;
use crate::llama::Llama;
use crate::quant::QuantType;
use crate::qwen35::Qwen35;
use crate::safetensors_dir::SafetensorsDir;
use crate::tokenizer::Tokenizer;
use crate::CausalLm;

/// Where `scripts/fetch-demo-model.sh` puts the built-in demo model (relative to the
/// repository root): SmolLM2-135M-Instruct, Q4_1.
pub const DEMO_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

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
    /// The tokenizer (`tokenizer.json`, or GGUF metadata); `None` if the checkpoint has none.
    pub tokenizer: Option<Tokenizer>,
    /// The chat template, if the checkpoint ships one.
    pub chat_template: Option<ChatTemplate>,
    /// The architecture as the checkpoint names it: GGUF `general.architecture` (`qwen35`,
    /// `llama`, `qwen2`, …) or `config.json`'s `model_type` (`qwen3_5`, `llama`).
    pub architecture: String,
}

impl LoadedModel {
    /// Whether this is a Qwen3.5-family model (FrogNano's own): it writes the Qwen XML tool
    /// calls it was trained on, so callers need not force them with a grammar.
    pub fn is_qwen35(&self) -> bool {
        is_qwen35_architecture(&self.architecture)
    }

    /// The tokenizer, or an error saying the checkpoint lacks one.
    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| {
            ModelError::format(
                &self.path,
                "this checkpoint has no tokenizer (tokenizer.json); only token ids can be used",
            )
        })
    }

    /// The chat template, or an error saying the checkpoint lacks one.
    pub fn chat_template(&self) -> Result<&ChatTemplate> {
        self.chat_template
            .as_ref()
            .ok_or_else(|| ModelError::format(&self.path, "this checkpoint has no chat template"))
    }
}

/// Whether an architecture name ([`LoadedModel::architecture`]) is Qwen3.5's: GGUF `qwen35`
/// or `config.json`'s `qwen3_5` / `qwen3_5_text`.
pub fn is_qwen35_architecture(name: &str) -> bool {
    matches!(name, "qwen35" | "qwen3_5" | "qwen3_5_text")
}

/// Resolves `spec` to a path on disk: a file or folder as given, an Ollama reference
/// (`qwen2.5-coder:1.5b`: the GGUF blob in Ollama's store, [`crate::ollama_store`]), a
/// Hugging Face hub id (`owner/name`: its snapshot in the local hub cache), or a bare name
/// with a `latest` tag in Ollama's store (`llama3.2`).
pub fn resolve_path(spec: &str) -> Result<PathBuf> {
    let p = Path::new(spec);
    if p.exists() {
        return Ok(p.to_path_buf());
    }
    if crate::ollama_store::looks_like_reference(spec) {
        return crate::ollama_store::resolve(spec);
    }
    if crate::hub::looks_like_repo_id(spec) {
        return crate::hub::resolve(spec, "main");
    }
    if let Some(blob) = crate::ollama_store::resolve_untagged(spec)? {
        return Ok(blob);
    }
    Err(ModelError::io(p, std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder")))
}

/// Moves a model loaded on the CPU onto an accelerator. frognano-gpu implements it for
/// `--device cuda|sim`; the binary installs one with [`set_accelerator`] before it loads
/// anything, so that every command's load — `run`, `serve`, the agent's, the trainer's
/// rollouts — ends on that device through the same [`load`].
pub trait Accelerator: Send + Sync {
    /// The device, for messages (`cuda:0`).
    fn name(&self) -> String;
    /// A network on the device, from the CPU one (weights as stored, not repacked for the
    /// CPU's kernels): what the trainer's rollouts sample from after each update.
    fn place_model(&self, model: &dyn CausalLm) -> Result<(Box<dyn CausalLm>, usize)>;

    /// The model on the device: `model` is the CPU model as loaded (weights as stored, not
    /// repacked for the CPU's kernels), tokenizer and template included.
    fn place(&self, mut model: LoadedModel) -> Result<LoadedModel> {
        let (net, bytes) = self
            .place_model(&*model.model)
            .map_err(|e| ModelError::Device(format!("{}: --device {}: {e}", model.path.display(), self.name())))?;
        model.model = net;
        model.weight_bytes = bytes;
        Ok(model)
    }
}

static ACCELERATOR: std::sync::RwLock<Option<std::sync::Arc<dyn Accelerator>>> = std::sync::RwLock::new(None);

/// Makes every later [`load`] place its model on `acc` (`None`: the CPU again).
pub fn set_accelerator(acc: Option<std::sync::Arc<dyn Accelerator>>) {
    *ACCELERATOR.write().unwrap_or_else(|e| e.into_inner()) = acc;
}

/// `model` on the accelerator when one is set (its weight bytes there), else `model` as it is.
/// Code that builds a network itself (the trainer's policy after an update) ends it here, as
/// [`load`] does.
pub fn on_accelerator(model: Box<dyn CausalLm>) -> Result<Box<dyn CausalLm>> {
    match accelerator() {
        Some(acc) => Ok(acc.place_model(&*model)?.0),
        None => Ok(model),
    }
}

/// The accelerator [`load`] places models on, if one was set.
pub fn accelerator() -> Option<std::sync::Arc<dyn Accelerator>> {
    ACCELERATOR.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Loads the model named by `spec`: a checkpoint folder, a `.gguf` file, or a hub id.
pub fn load(spec: impl AsRef<str>) -> Result<LoadedModel> {
    load_quantized(spec, None)
}

/// [`load`], re-quantizing the weight matrices to `quant` (`--quant q8_0|q4_k`) when given.
/// With an [`Accelerator`] set, the model is placed on it.
pub fn load_quantized(spec: impl AsRef<str>, quant: Option<QuantType>) -> Result<LoadedModel> {
    match accelerator() {
        Some(acc) => {
            // The host copies of the weights are dropped once they are on the device.
            let placed = acc.place(load_on_cpu(spec, quant, false)?);
            release_freed_heap();
            placed
        }
        None => load_on_cpu(spec, quant, true),
    }
}

/// [`load_quantized`] on the CPU whatever the accelerator; `pack`: repack the weights for this
/// CPU's kernels (an accelerator wants them as stored).
pub fn load_on_cpu(spec: impl AsRef<str>, quant: Option<QuantType>, pack: bool) -> Result<LoadedModel> {
    let loaded = read_model(spec, quant, pack);
    release_freed_heap();
    loaded
}

/// Hands back to the system the heap pages that loading freed. Repacking and re-quantizing
/// build each matrix anew and drop the old one, and glibc keeps freed blocks below its mmap
/// threshold (which rises to 32 MiB as large blocks are freed) in its heap, resident, until
/// asked: 85 MB on the Qwen3.5-4B shapes' Q4_K_M (3 % of its weights), 9 MB on SmolLM2's
/// 97 MB, held for the life of the process without this.
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of glibc's heaps to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Whether the file starts with GGUF's magic (`GGUF`): a GGUF file without the extension, such
/// as the blobs of Ollama's store.
fn has_gguf_magic(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"GGUF"
}

/// [`load_on_cpu`] without the heap handed back.
fn read_model(spec: impl AsRef<str>, quant: Option<QuantType>, pack: bool) -> Result<LoadedModel> {
    let path = resolve_path(spec.as_ref())?;
    if path.is_file() && (path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) || has_gguf_magic(&path)) {
        return load_gguf(&path, quant, pack);
    }
    if !path.is_dir() {
        return Err(ModelError::format(
            &path,
            "expected a checkpoint folder with config.json and *.safetensors, or a .gguf file",
        ));
    }
    let cfg_path = path.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::io(&cfg_path, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::format(&cfg_path, format!("invalid JSON: {e}")))?;
    let model_type = v.get("model_type").and_then(|m| m.as_str()).unwrap_or("");
    let generation = GenerationConfig::from_file(&path.join("generation_config.json"))?.unwrap_or_default();
    let (model, mut eos_ids, weight_bytes): (Box<dyn CausalLm>, Vec<u32>, usize) = match model_type {
        "qwen3_5" | "qwen3_5_text" => {
            let st = SafetensorsDir::open(&path)?;
            // config.json was parsed above; build the typed config from that value.
            let cfg = Qwen35Config::from_json(&v).map_err(|msg| ModelError::format(&cfg_path, msg))?;
            let eos = cfg.eos_token_ids.clone();
            let mut bytes = st.byte_len();
            let mut m = Qwen35::load(cfg, &st, None)?;
            if let Some(q) = quant {
                m.quantize_weights(q);
                if pack {
                    m.pack_for_matmul();
                }
                bytes = m.weight_bytes();
            }
            (Box::new(m), eos, bytes)
        }
        "llama" | "mistral" | "ministral3" | "qwen2" | "qwen3" | "smollm3" | "phi3" | "granite" => {
            let st = SafetensorsDir::open(&path)?;
            let (cfg, tied) = Llama::config_from_json(&v).map_err(|msg| ModelError::format(&cfg_path, msg))?;
            let mut bytes = st.byte_len();
            let mut m = Llama::load(cfg, &st, tied)?;
            if let Some(q) = quant {
                m.quantize_weights(q);
                if pack {
                    m.pack_for_matmul();
                }
                bytes = m.weight_bytes();
            }
            (Box::new(m), eos_from_config(&v), bytes)
        }
        other => {
            return Err(ModelError::format(
                &cfg_path,
                format!(
                    "unknown model_type {other:?}; supported: \"qwen3_5\", \"qwen3_5_text\", \"llama\", \"mistral\", \
                     \"ministral3\", \"qwen2\", \"qwen3\", \"smollm3\", \"phi3\", \"granite\""
                ),
            ))
        }
    };
    let tok_path = path.join("tokenizer.json");
    let tokenizer = if tok_path.exists() { Some(Tokenizer::from_file(&tok_path)?) } else { None };
    let has_template =
        ["chat_template.jinja", "chat_template.json", "tokenizer_config.json"].iter().any(|f| path.join(f).exists());
    let chat_template = if has_template {
        match ChatTemplate::from_model_dir(&path) {
            Ok(t) => Some(t),
            // tokenizer_config.json without a template is common; anything else is an error.
            Err(e) if !path.join("chat_template.jinja").exists() && e.to_string().contains("no chat template") => None,
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    eos_ids.extend(&generation.eos_token_ids);
    eos_ids.sort_unstable();
    eos_ids.dedup();
    let architecture = model_type.to_string();
    Ok(LoadedModel { model, path, generation, eos_ids, weight_bytes, tokenizer, chat_template, architecture })
}

/// `eos_token_id` of a `config.json` (a number or a list), as ids.
fn eos_from_config(v: &serde_json::Value) -> Vec<u32> {
    match v.get("eos_token_id") {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(serde_json::Value::as_u64).map(|x| x as u32).collect(),
        _ => vec![],
    }
}

/// Loads a `.gguf` file: the network (memory-mapped; re-quantized to `quant` if given), its
/// tokenizer, chat template and stop ids.
fn load_gguf(path: &Path, quant: Option<QuantType>, pack: bool) -> Result<LoadedModel> {
    let f = GgufFile::open(path)?;
    let weights = GgufWeights::new(&f)?;
    // Re-quantized weights are no longer the file's tensors: their size is the model's.
    let mut quantized_bytes = None;
    let model: Box<dyn CausalLm> = match weights.arch() {
        GgufArch::Qwen35 => {
            let cfg = crate::qwen35_gguf::config_from_gguf(&f)?;
            let mut m = Qwen35::load(cfg, &weights, Some(Act::F32))?;
            // An f16 KV cache, as llama.cpp and every other GGUF model here (it was f32:
            // twice the memory per token of context).
            m.set_kv_type(crate::KvType::F16)?;
            if let Some(q) = quant {
                m.quantize_weights(q);
                quantized_bytes = Some(m.weight_bytes());
            }
            if pack {
                m.pack_for_matmul();
            }
            Box::new(m)
        }
        GgufArch::Llama | GgufArch::Qwen2 | GgufArch::Qwen3 | GgufArch::Phi3 => {
            let mut m = Llama::load(Llama::config_from_gguf(&f)?, &weights, true)?;
            if let Some(q) = quant {
                m.quantize_weights(q);
                quantized_bytes = Some(m.weight_bytes());
            }
            if pack {
                m.pack_for_matmul();
            }
            Box::new(m)
        }
    };
    let tokenizer = if f.get("tokenizer.ggml.model").is_some() { Some(tokenizer_from_gguf(&f)?) } else { None };
    let chat_template = chat_template_from_gguf(&f)?;
    let eos_ids = stop_ids_from_gguf(&f)?;
    let weight_bytes = quantized_bytes.unwrap_or_else(|| f.tensors().iter().map(|t| t.len).sum());
    let architecture = f.get_str("general.architecture")?.unwrap_or("").to_string();
    Ok(LoadedModel {
        model,
        path: path.to_path_buf(),
        generation: GenerationConfig { eos_token_ids: eos_ids.clone(), ..Default::default() },
        eos_ids,
        weight_bytes,
        tokenizer,
        chat_template,
        architecture,
    })
}
