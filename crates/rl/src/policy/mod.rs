//! The trainable policy: our own model code written with candle autograd, so the trainer can
//! compute token log-probabilities and their gradients.
//!
//! * [`Policy::load`] reads a Hugging Face safetensors folder (`llama`, `qwen2`, `qwen3`,
//!   `qwen3_5`, `qwen3_5_text`) or a llama-family GGUF file (`llama`, `mistral`, `qwen2`,
//!   `qwen3`; dequantized to f32, q/k rows put back into Hugging Face order);
//!   [`Policy::random_llama`] makes a small random model.
//! * [`Policy::token_logprobs`] gives `log π(targets[i] | input[..=i])`, differentiable with
//!   respect to [`Policy::params`]: every weight (full fine-tuning, Hugging Face names) or the
//!   LoRA matrices only (PEFT names).
//! * [`Policy::inference_model`] hands the current weights (LoRA merged) to frognano-model's
//!   fast inference engine for the next rollouts.
//! * [`Policy::save`] writes a merged checkpoint (`frognano run DIR` and transformers load it)
//!   or a PEFT adapter; [`Policy::set_params`] / [`Policy::load_params`] restore saved
//!   parameters exactly.
//!
//! The networks ([`llama`], [`qwen35`]) compute in f32 (f64 when the policy's dtype is F64,
//! for gradient checks) whatever the storage dtype, and follow frognano-model's `llama.rs` and
//! `qwen35.rs` formulas.

mod io;
pub mod llama;
pub mod ops;
mod qwen35;
mod store;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use candle_core::{DType, Device, Tensor, Var};
use frognano_model::config::Qwen35Config;
use frognano_model::safetensors_dir::SafetensorsDir;
use frognano_model::weights::{has_output_head, WeightSpec, LM_HEAD};

pub use llama::LlamaSpec;
use store::Store;

/// LoRA settings (PEFT semantics: `W + (alpha/rank)·B·A`, `B` starts at zero).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// Rank `r` of the adapters.
    pub rank: usize,
    /// Scale numerator: the update is multiplied by `alpha / rank`.
    pub alpha: f32,
    /// Linear modules to adapt, matched against the end of each module's name (PEFT
    /// `target_modules`): `q_proj` adapts every `…self_attn.q_proj`.
    pub targets: Vec<String>,
}

impl LoraConfig {
    /// The default targets: every attention and MLP projection.
    pub fn default_targets() -> Vec<String> {
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"].map(String::from).to_vec()
    }
}

impl Default for LoraConfig {
    /// Rank 16, alpha 32, [`LoraConfig::default_targets`].
    fn default() -> Self {
        LoraConfig { rank: 16, alpha: 32.0, targets: Self::default_targets() }
    }
}

/// How a policy is built.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyOptions {
    /// `Some`: train LoRA adapters on a frozen base; `None`: full fine-tuning.
    pub lora: Option<LoraConfig>,
    /// Storage dtype of the base weights: F32 (default), BF16 or F16 (computation is still
    /// f32; in full fine-tuning the optimizer then updates bf16/f16 tensors), or F64
    /// (computation in f64; for gradient checks). LoRA adapters are always kept in the compute
    /// dtype (f32, or f64 for F64).
    pub dtype: DType,
    /// Seed of every random initialisation (LoRA `A`, random models).
    pub seed: u64,
}

impl Default for PolicyOptions {
    /// Full fine-tuning in f32, seed 0.
    fn default() -> Self {
        PolicyOptions { lora: None, dtype: DType::F32, seed: 0 }
    }
}

/// What [`Policy::save`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveFormat {
    /// A complete checkpoint with LoRA merged into the weights: `config.json`,
    /// `model.safetensors` (Hugging Face names and layout) and the tokenizer, chat template and
    /// generation config of the source.
    Merged,
    /// A PEFT adapter: `adapter_config.json` + `adapter_model.safetensors` (LoRA policies only).
    Adapter,
}

/// The architecture and its shapes.
enum Net {
    Llama(LlamaSpec),
    Qwen35(Box<Qwen35Config>),
}

/// One forward pass of either network, as stages (see [`Policy::backward`]).
enum Pass {
    Llama(llama::Pass),
    Qwen35(qwen35::Pass),
}

/// Rows of the output head computed at once by [`Policy::backward`]: bounds the `[rows, vocab]`
/// logits held (256 × 151,936 f32 is 156 MB).
const HEAD_ROWS: usize = 256;

/// Where the policy's base weights came from (for what `save` copies or writes).
enum Source {
    /// A Hugging Face folder: its parsed `config.json`, and whether tensor names carry the
    /// multimodal wrapper prefix `model.language_model.`.
    Dir { path: PathBuf, config: serde_json::Value, wrapper: bool },
    /// A GGUF file.
    Gguf(PathBuf),
    /// [`Policy::random_llama`].
    Random,
}

/// A trainable language model (see the module docs).
pub struct Policy {
    net: Net,
    store: Store,
    source: Source,
    lora: Option<LoraConfig>,
    /// The GGUF file's own quantized model, loaded on first use, that LoRA policies of a GGUF
    /// source sample from with their adapters added unmerged ([`Policy::inference_model`]).
    sampler_base: std::sync::OnceLock<frognano_model::llama::Llama>,
}

/// A candle error with a message.
fn msg(s: String) -> candle_core::Error {
    candle_core::Error::Msg(s)
}

impl Policy {
    /// Loads a policy from a Hugging Face safetensors folder (`config.json` model_type
    /// `"llama"` / `"qwen2"` / `"qwen3"` with `*ForCausalLM` names, or `"qwen3_5"` /
    /// `"qwen3_5_text"` as frognano-model reads them) or a llama-family `.gguf` file (every tensor
    /// dequantized to f32; llama.cpp's q/k row permutation undone so saved checkpoints are in
    /// Hugging Face layout). Errors name the file and the tensor or field.
    pub fn load(path: &Path, opts: &PolicyOptions) -> anyhow::Result<Policy> {
        check_dtype(opts.dtype)?;
        if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            let (spec, tensors) = io::read_llama_gguf(path)?;
            return Self::assemble(Net::Llama(spec), tensors, Source::Gguf(path.to_path_buf()), opts);
        }
        if !path.is_dir() {
            bail!("{}: expected a checkpoint folder (config.json + *.safetensors) or a .gguf file", path.display());
        }
        let cfg_path = path.join("config.json");
        let text =
            std::fs::read_to_string(&cfg_path).with_context(|| format!("{}: cannot read", cfg_path.display()))?;
        let config: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{}: invalid JSON", cfg_path.display()))?;
        let model_type = config.get("model_type").and_then(|m| m.as_str()).unwrap_or("").to_string();
        let st = SafetensorsDir::open(path)?;
        let wrapper = io::uses_wrapper_prefix(path)?;
        let tensors_of = |specs: &[&WeightSpec]| io::read_weights(&st, specs, opts.dtype);
        let (net, tensors) = match model_type.as_str() {
            "llama" | "qwen2" | "qwen3" => {
                let (c, tied) = frognano_model::llama::Llama::config_from_json(&config)
                    .map_err(|m| anyhow!("{}: {m}", cfg_path.display()))?;
                if c.llama3_scaling.is_some() || c.rope_freq_scale != 1.0 {
                    bail!("{}: field `rope_scaling`: RoPE scaling is not supported for training", cfg_path.display());
                }
                let mut spec = LlamaSpec::from_config(&c, tied && !st.contains(LM_HEAD));
                spec.bos_token_id = config.get("bos_token_id").and_then(|v| v.as_u64()).map(|v| v as u32);
                spec.eos_token_ids = eos_ids(&config);
                let tensors = tensors_of(&spec.weight_map().specs())?;
                (Net::Llama(spec), tensors)
            }
            "qwen3_5" | "qwen3_5_text" => {
                let c = Qwen35Config::from_json(&config).map_err(|m| anyhow!("{}: {m}", cfg_path.display()))?;
                let map = qwen35::weight_map(&c, has_output_head(&st, c.tie_word_embeddings)?);
                let tensors = tensors_of(&map.specs())?;
                (Net::Qwen35(Box::new(c)), tensors)
            }
            other => bail!(
                "{}: model_type {other:?} cannot be trained; supported: \"llama\", \"qwen2\", \"qwen3\", \"qwen3_5\", \"qwen3_5_text\"",
                cfg_path.display()
            ),
        };
        Self::assemble(net, tensors, Source::Dir { path: path.to_path_buf(), config, wrapper }, opts)
    }

    /// A random-weight llama of shape `spec`, deterministic in `opts.seed` (matrices uniform
    /// with standard deviation 0.02, norm scales 1). For tests and toy runs.
    pub fn random_llama(spec: &LlamaSpec, opts: &PolicyOptions) -> anyhow::Result<Policy> {
        check_dtype(opts.dtype)?;
        spec.validate().map_err(|m| anyhow!(m))?;
        let tensors = spec.random_weights(opts.seed)?;
        Self::assemble(Net::Llama(spec.clone()), tensors, Source::Random, opts)
    }

    fn assemble(
        net: Net,
        tensors: Vec<(String, Tensor)>,
        source: Source,
        opts: &PolicyOptions,
    ) -> anyhow::Result<Policy> {
        let mut store = Store::new(tensors, opts.dtype, opts.lora.is_some())?;
        if let Some(l) = &opts.lora {
            if l.rank == 0 {
                bail!("LoRA rank must be positive");
            }
            let all = match &net {
                Net::Llama(s) => s.linear_modules(),
                Net::Qwen35(c) => io::linear_modules(&qwen35::weight_map(c, store.contains(LM_HEAD)).specs()),
            };
            let mut chosen = Vec::new();
            for t in &l.targets {
                let hits: Vec<&String> = all.iter().filter(|m| *m == t || m.ends_with(&format!(".{t}"))).collect();
                if hits.is_empty() {
                    bail!("LoRA target {t:?} matches no linear module of this model (e.g. {:?})", all.first());
                }
                chosen.extend(hits.into_iter().cloned());
            }
            // Model order, each module once.
            let chosen: Vec<String> = all.into_iter().filter(|m| chosen.contains(m)).collect();
            store.add_lora(&chosen, l.rank, l.alpha, opts.seed)?;
        }
        Ok(Policy { net, store, source, lora: opts.lora.clone(), sampler_base: std::sync::OnceLock::new() })
    }

    /// `"llama"`, `"qwen2"`, `"qwen3"` or `"qwen3_5"`.
    pub fn arch(&self) -> &'static str {
        match &self.net {
            Net::Llama(s) => s.model_type(),
            Net::Qwen35(_) => "qwen3_5",
        }
    }

    /// Vocabulary size (logit width).
    pub fn vocab_size(&self) -> usize {
        match &self.net {
            Net::Llama(s) => s.vocab_size,
            Net::Qwen35(c) => c.vocab_size,
        }
    }

    /// Storage dtype of the weights.
    pub fn dtype(&self) -> DType {
        self.store.storage
    }

    /// The LoRA settings, if this policy trains adapters.
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.lora.as_ref()
    }

    /// Logits `[input.len(), vocab]` for every position (f32, or f64 for an F64 policy),
    /// differentiable. Errors on an empty input or an id outside the vocabulary.
    pub fn logits(&self, input: &[u32]) -> candle_core::Result<Tensor> {
        self.check_input(input)?;
        let ids = Tensor::from_slice(input, input.len(), &Device::Cpu)?;
        match &self.net {
            Net::Llama(s) => llama::logits(s, &self.store, &ids),
            Net::Qwen35(c) => qwen35::logits(c, &self.store, &ids),
        }
    }

    /// `log π(targets[i] | input[..=i])` for each `i`: shape `[n]`, f32 (f64 for an F64
    /// policy), differentiable with respect to [`Policy::params`]. For a sequence `S`,
    /// `input = S[..n]` and `targets = S[1..=n]`. Errors when the lengths differ, the input is
    /// empty, or an id is outside the vocabulary.
    pub fn token_logprobs(&self, input: &[u32], targets: &[u32]) -> candle_core::Result<Tensor> {
        self.check_targets(input, targets)?;
        ops::gather_logprobs(&self.logits(input)?, targets)
    }

    /// The input [`Policy::logits`] accepts: not empty, every id in the vocabulary.
    fn check_input(&self, input: &[u32]) -> candle_core::Result<()> {
        if input.is_empty() {
            return Err(msg("no input tokens".into()));
        }
        let vocab = self.vocab_size();
        if let Some(bad) = input.iter().find(|&&id| id as usize >= vocab) {
            return Err(msg(format!("token id {bad} is out of vocabulary (vocab_size {vocab})")));
        }
        Ok(())
    }

    /// The targets [`Policy::token_logprobs`] accepts: one per input token, every id in the
    /// vocabulary.
    fn check_targets(&self, input: &[u32], targets: &[u32]) -> candle_core::Result<()> {
        if input.len() != targets.len() {
            return Err(msg(format!("{} input tokens but {} targets", input.len(), targets.len())));
        }
        let vocab = self.vocab_size();
        if let Some(bad) = targets.iter().find(|&&id| id as usize >= vocab) {
            return Err(msg(format!("target id {bad} is out of vocabulary (vocab_size {vocab})")));
        }
        Ok(())
    }

    fn pass(&self, n: usize) -> candle_core::Result<Pass> {
        Ok(match &self.net {
            Net::Llama(s) => Pass::Llama(llama::Pass::new(s, &self.store, n)?),
            Net::Qwen35(c) => Pass::Qwen35(qwen35::Pass::new(c, &self.store, n)?),
        })
    }

    fn embed_stage(&self, pass: &Pass, ids: &Tensor) -> candle_core::Result<Tensor> {
        match pass {
            Pass::Llama(p) => llama::embed(p, &self.store, ids),
            Pass::Qwen35(p) => qwen35::embed(p, &self.store, ids),
        }
    }

    fn layer_count(pass: &Pass) -> usize {
        match pass {
            Pass::Llama(p) => p.layers(),
            Pass::Qwen35(p) => p.layers(),
        }
    }

    fn layer_stage(&self, pass: &Pass, i: usize, h: &Tensor) -> candle_core::Result<Tensor> {
        match (&self.net, pass) {
            (Net::Llama(s), Pass::Llama(p)) => llama::layer(s, p, &self.store, i, h),
            (Net::Qwen35(c), Pass::Qwen35(p)) => qwen35::layer(c, p, &self.store, i, h),
            _ => unreachable!("a pass belongs to its policy's network"),
        }
    }

    /// `log π(targets[rows])` from the final residual rows `h` `[k, d]`.
    fn head_logprobs(&self, pass: &Pass, h: &Tensor, targets: &[u32]) -> candle_core::Result<Tensor> {
        let logits = match (&self.net, pass) {
            (Net::Llama(s), Pass::Llama(p)) => llama::head(s, p, &self.store, h)?,
            (Net::Qwen35(c), Pass::Qwen35(p)) => qwen35::head(c, p, &self.store, h)?,
            _ => unreachable!("a pass belongs to its policy's network"),
        };
        ops::gather_logprobs(&logits, targets)
    }

    /// Back-propagates `loss(lp)`, where `lp = token_logprobs(input, targets)`, holding one
    /// layer's activations at a time (activation checkpointing): a forward pass without the
    /// autograd graph keeps each layer's input; the loss's gradient with respect to `lp` is
    /// then carried back through the output head in blocks of rows, and through the layers one
    /// at a time, each layer's forward recomputed with its graph. Memory is one layer deep
    /// instead of the whole network's activations (a 1.5B model's `[heads, n, n]` attention
    /// scores over 28 layers do not fit in RAM at a few thousand tokens), for one more
    /// forward pass of compute.
    ///
    /// `needed[i] == false` marks targets the loss ignores (prompt, tool output: loss weight
    /// 0): their logprob is passed to `loss` as 0 and the `[rows, vocab]` head product is
    /// neither computed nor differentiated there. Every backward pass's gradients go to
    /// `grads` (sum them, e.g. with [`crate::optim::GradSum`]); the sum is the gradient of
    /// `loss` with respect to [`Policy::params`]. Returns the loss's value and what `loss`
    /// returned beside it.
    pub fn backward<T>(
        &self,
        input: &[u32],
        targets: &[u32],
        needed: Option<&[bool]>,
        loss: impl FnOnce(&Tensor) -> candle_core::Result<(Tensor, T)>,
        grads: &mut dyn FnMut(&candle_core::backprop::GradStore) -> candle_core::Result<()>,
    ) -> candle_core::Result<(f64, T)> {
        self.check_targets(input, targets)?;
        self.check_input(input)?;
        let n = input.len();
        if let Some(m) = needed.filter(|m| m.len() != n) {
            return Err(msg(format!("{} targets but {} entries in `needed`", n, m.len())));
        }
        let compute = self.store.compute;
        let ids = Tensor::from_slice(input, n, &Device::Cpu)?;
        let pass = self.pass(n)?;
        // Forward without the graph, keeping each layer's input.
        let mut inputs = Vec::with_capacity(Self::layer_count(&pass));
        let mut h = self.embed_stage(&pass, &ids)?.detach();
        for i in 0..Self::layer_count(&pass) {
            let next = self.layer_stage(&pass, i, &h)?.detach();
            inputs.push(std::mem::replace(&mut h, next));
        }
        // The head over the needed rows, in blocks.
        let rows: Vec<u32> = (0..n as u32).filter(|&i| needed.is_none_or(|m| m[i as usize])).collect();
        let blocks: Vec<&[u32]> = rows.chunks(HEAD_ROWS).collect();
        let block_targets = |b: &[u32]| -> Vec<u32> { b.iter().map(|&i| targets[i as usize]).collect() };
        let mut lp = vec![0f64; n];
        for b in &blocks {
            let idx = Tensor::from_slice(b, b.len(), &Device::Cpu)?;
            let got = self.head_logprobs(&pass, &h.index_select(&idx, 0)?, &block_targets(b))?.detach();
            for (&i, v) in b.iter().zip(got.to_dtype(DType::F64)?.to_vec1::<f64>()?) {
                lp[i as usize] = v;
            }
        }
        let lp = Var::from_tensor(&Tensor::from_vec(lp, n, &Device::Cpu)?.to_dtype(compute)?)?;
        let (value, extra) = loss(lp.as_tensor())?;
        let total = value.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        let g_lp: Vec<f64> = match value.backward()?.get(lp.as_tensor()) {
            Some(g) => g.to_dtype(DType::F64)?.to_vec1()?,
            None => return Ok((total, extra)),
        };
        // Back through the head: the gradient of Σ g_lp·lp with respect to the weights and `h`.
        let mut g_h = Tensor::zeros(h.dims(), compute, &Device::Cpu)?;
        for b in &blocks {
            let g: Vec<f64> = b.iter().map(|&i| g_lp[i as usize]).collect();
            if g.iter().all(|&v| v == 0.0) {
                continue;
            }
            let idx = Tensor::from_slice(b, b.len(), &Device::Cpu)?;
            let rows_h = Var::from_tensor(&h.index_select(&idx, 0)?)?;
            let got = self.head_logprobs(&pass, rows_h.as_tensor(), &block_targets(b))?;
            let g = Tensor::from_vec(g, b.len(), &Device::Cpu)?.to_dtype(compute)?;
            let store = (got * g)?.sum_all()?.backward()?;
            grads(&store)?;
            if let Some(gr) = store.get(rows_h.as_tensor()) {
                g_h = g_h.index_add(&idx, gr, 0)?;
            }
        }
        // Back through the layers, last first, each recomputed with its graph.
        for i in (0..inputs.len()).rev() {
            let x = Var::from_tensor(&inputs.pop().expect("one input per layer"))?;
            let out = self.layer_stage(&pass, i, x.as_tensor())?;
            let store = (out * &g_h)?.sum_all()?.backward()?;
            grads(&store)?;
            g_h = match store.get(x.as_tensor()) {
                Some(g) => g.clone(),
                None => g_h.zeros_like()?,
            };
        }
        // The embedding, when it is trained.
        if self.lora.is_none() {
            let e = self.embed_stage(&pass, &ids)?;
            grads(&(e * &g_h)?.sum_all()?.backward()?)?;
        }
        Ok((total, extra))
    }

    /// The trainable parameters, in a stable order with stable names. Full fine-tuning: every
    /// weight under its Hugging Face name as saved (`model.layers.0.self_attn.q_proj.weight`;
    /// `model.language_model.…` for wrapper checkpoints). LoRA: `lora_A` then `lora_B` of each
    /// adapted module under PEFT names
    /// (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`).
    pub fn params(&self) -> Vec<(String, Var)> {
        if self.lora.is_some() {
            let mut v = Vec::with_capacity(2 * self.store.adapters.len());
            for ad in &self.store.adapters {
                let base = format!("base_model.model.{}", self.saved_name(&ad.module));
                v.push((format!("{base}.lora_A.weight"), ad.a.clone()));
                v.push((format!("{base}.lora_B.weight"), ad.b.clone()));
            }
            v
        } else {
            self.store.trainable().into_iter().map(|(n, var)| (self.saved_name(&n), var)).collect()
        }
    }

    /// The name a canonical weight name has on disk (adds the wrapper prefix back).
    fn saved_name(&self, canonical: &str) -> String {
        match &self.source {
            Source::Dir { wrapper: true, .. } => match canonical.strip_prefix("model.") {
                Some(rest) => format!("model.language_model.{rest}"),
                None => canonical.to_string(),
            },
            _ => canonical.to_string(),
        }
    }

    /// The current weights as a frognano-model network for sampling.
    ///
    /// * LoRA on a GGUF file (on the CPU): the file's own quantized model, its projections
    ///   carrying the adapters as unmerged low-rank updates ([`frognano_model::tensor::LowRank`]).
    ///   Sampling runs at the quantized model's speed, and the sampled distribution is the one
    ///   trained (the trainer's base is the same file dequantized); a 1.5B model's merged f32
    ///   weights would be 6 GB read per decoded token.
    /// * Otherwise the weights with LoRA merged, computing in f32 (BF16 policies hand over bf16
    ///   matrices).
    pub fn inference_model(&self) -> anyhow::Result<Box<dyn frognano_model::CausalLm>> {
        if let (Source::Gguf(path), Net::Llama(_), Some(_), None) =
            (&self.source, &self.net, &self.lora, frognano_model::load::accelerator())
        {
            return Ok(Box::new(self.gguf_sampler(path)?));
        }
        self.inference_model_quantized(None)
    }

    /// The GGUF file's quantized model with the current adapters added unmerged.
    fn gguf_sampler(&self, path: &Path) -> anyhow::Result<frognano_model::llama::Llama> {
        let base = match self.sampler_base.get() {
            Some(b) => b,
            None => {
                let f = frognano_model::gguf::GgufFile::open(path)?;
                let mut m = frognano_model::llama::Llama::from_gguf(&f)?;
                m.pack_for_matmul();
                self.sampler_base.get_or_init(|| m)
            }
        };
        let mut m = base.clone();
        let f32s = |t: &Tensor| -> anyhow::Result<Vec<f32>> { Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?) };
        for ad in &self.store.adapters {
            let update = frognano_model::tensor::LowRank {
                rank: ad.a.dim(0)?,
                a: f32s(ad.a.as_tensor())?,
                b: f32s(ad.b.as_tensor())?,
                scale: self.store.lora_scale as f32,
            };
            m.set_low_rank(&ad.module, Some(update)).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        }
        Ok(m)
    }

    /// [`Policy::inference_model`] with the weight matrices re-quantized to `quant` and packed
    /// for this CPU's kernels (what `--quant q8_0|q4_k` does on load) when given: faster
    /// rollouts, sampled from a slightly different distribution than the one trained.
    pub fn inference_model_quantized(
        &self,
        quant: Option<frognano_model::quant::QuantType>,
    ) -> anyhow::Result<Box<dyn frognano_model::CausalLm>> {
        // With `--device cuda` the network goes to the GPU, its weights as stored.
        let pack = frognano_model::load::accelerator().is_none();
        let net: Box<dyn frognano_model::CausalLm> = match &self.net {
            Net::Llama(s) => {
                let mut m = llama::inference_model(s, &self.store)?;
                if let Some(q) = quant {
                    m.quantize_weights(q);
                    if pack {
                        m.pack_for_matmul();
                    }
                }
                Box::new(m)
            }
            Net::Qwen35(c) => {
                let mut m = qwen35::inference_model(c, &self.store)?;
                if let Some(q) = quant {
                    m.quantize_weights(q);
                    if pack {
                        m.pack_for_matmul();
                    }
                }
                Box::new(m)
            }
        };
        Ok(frognano_model::load::on_accelerator(net)?)
    }

    /// Every base weight with LoRA merged, under its on-disk name, in the storage dtype (F64
    /// policies save f32).
    pub fn merged_tensors(&self) -> anyhow::Result<Vec<(String, Tensor)>> {
        let out = if self.store.storage == DType::F64 { DType::F32 } else { self.store.storage };
        self.store.names.iter().map(|n| Ok((self.saved_name(n), self.store.merged(n)?.to_dtype(out)?))).collect()
    }

    /// Writes the policy to the folder `dir` (created if missing).
    ///
    /// * [`SaveFormat::Merged`]: `config.json` (the source's, with its dtype field updated; a
    ///   `LlamaForCausalLM` config for GGUF and random sources), `model.safetensors` (Hugging
    ///   Face names and layout, LoRA merged), and the source's `tokenizer.json`,
    ///   `tokenizer_config.json`, chat template and `generation_config.json` (written from the
    ///   metadata for a GGUF source). `frognano run DIR` and transformers'
    ///   `AutoModelForCausalLM` load it.
    /// * [`SaveFormat::Adapter`]: PEFT `adapter_config.json` + `adapter_model.safetensors`
    ///   (f32).
    pub fn save(&self, dir: &Path, format: SaveFormat) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create the folder", dir.display()))?;
        match format {
            SaveFormat::Merged => self.save_merged(dir),
            SaveFormat::Adapter => self.save_adapter(dir),
        }
    }

    fn save_merged(&self, dir: &Path) -> anyhow::Result<()> {
        let tensors: HashMap<String, Tensor> = self.merged_tensors()?.into_iter().collect();
        let dtype = io::dtype_name(if self.store.storage == DType::F64 { DType::F32 } else { self.store.storage });
        // An older sharded checkpoint in the folder would be read alongside (or instead of) the
        // new file: remove its index and shards first.
        io::remove_stale_shards(dir)?;
        io::write_safetensors(&tensors, &dir.join("model.safetensors"))?;
        match &self.source {
            Source::Dir { path, config, .. } => {
                let mut config = config.clone();
                // The saved head decides tying (a checkpoint that ships lm_head.weight although
                // its config says tied is saved untied, as frognano-model read it).
                let tied = serde_json::Value::Bool(!self.store.contains("lm_head.weight"));
                set_dtype_fields(&mut config, dtype);
                config["tie_word_embeddings"] = tied.clone();
                if let Some(tc) = config.get_mut("text_config").filter(|t| t.is_object()) {
                    set_dtype_fields(tc, dtype);
                    if tc.get("tie_word_embeddings").is_some() {
                        tc["tie_word_embeddings"] = tied;
                    }
                }
                io::write_json(&dir.join("config.json"), &config)?;
                io::copy_side_files(path, dir)?;
            }
            Source::Gguf(path) => {
                let Net::Llama(spec) = &self.net else { unreachable!("GGUF sources are llama") };
                io::write_json(&dir.join("config.json"), &spec.hf_config(dtype))?;
                io::write_gguf_side_files(path, dir)?;
            }
            Source::Random => {
                let Net::Llama(spec) = &self.net else { unreachable!("random sources are llama") };
                io::write_json(&dir.join("config.json"), &spec.hf_config(dtype))?;
            }
        }
        Ok(())
    }

    fn save_adapter(&self, dir: &Path) -> anyhow::Result<()> {
        let Some(l) = &self.lora else {
            bail!("this policy trains every weight (no LoRA adapter); save it with SaveFormat::Merged");
        };
        let tensors: HashMap<String, Tensor> = self
            .params()
            .into_iter()
            .map(|(n, v)| Ok((n, v.as_tensor().to_dtype(DType::F32)?)))
            .collect::<candle_core::Result<_>>()?;
        io::write_safetensors(&tensors, &dir.join("adapter_model.safetensors"))?;
        let base = match &self.source {
            Source::Dir { path, .. } | Source::Gguf(path) => {
                serde_json::Value::String(io::absolute(path).to_string_lossy().into_owned())
            }
            Source::Random => serde_json::Value::Null,
        };
        let cfg = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": l.rank,
            "lora_alpha": l.alpha,
            "lora_dropout": 0.0,
            "target_modules": l.targets,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "use_rslora": false,
            "use_dora": false,
            "modules_to_save": null,
            "layers_to_transform": null,
            "layers_pattern": null,
            "rank_pattern": {},
            "alpha_pattern": {},
            "revision": null,
        });
        io::write_json(&dir.join("adapter_config.json"), &cfg)
    }

    /// Overwrites every trainable parameter with the tensor of the same name in `tensors`
    /// (names as [`Policy::params`] gives them; other entries are ignored), converted to the
    /// storage dtype. Nothing is changed unless every parameter is present with its shape; the
    /// error names the tensor and the expected and found shapes.
    pub fn set_params(&mut self, tensors: &HashMap<String, Tensor>) -> anyhow::Result<()> {
        let params = self.params();
        for (name, var) in &params {
            let t = tensors.get(name).ok_or_else(|| anyhow!("tensor `{name}` not found"))?;
            if t.dims() != var.dims() {
                bail!("tensor `{name}` has shape {:?}, expected {:?}", t.dims(), var.dims());
            }
        }
        for (name, var) in &params {
            var.set(&tensors[name].to_dtype(var.dtype())?).with_context(|| format!("tensor `{name}`"))?;
        }
        Ok(())
    }

    /// [`Policy::set_params`] from a safetensors file (a saved adapter, a merged checkpoint's
    /// `model.safetensors`, or a trainer checkpoint); errors name the file and the tensor.
    pub fn load_params(&mut self, path: &Path) -> anyhow::Result<()> {
        let tensors = io::load_tensor_file(path)?;
        self.set_params(&tensors).map_err(|e| anyhow!("{}: {e}", path.display()))
    }

    /// Writes [`Policy::params`] to a safetensors file (what [`Policy::load_params`] reads).
    pub fn save_params(&self, path: &Path) -> anyhow::Result<()> {
        let tensors: HashMap<String, Tensor> =
            self.params().into_iter().map(|(n, v)| (n, v.as_tensor().clone())).collect();
        io::write_safetensors(&tensors, path)
    }
}

/// Sets `torch_dtype` / `dtype` of a config object to `dtype` where present.
fn set_dtype_fields(v: &mut serde_json::Value, dtype: &str) {
    for key in ["torch_dtype", "dtype"] {
        if v.get(key).is_some() {
            v[key] = serde_json::Value::String(dtype.into());
        }
    }
}

fn check_dtype(d: DType) -> anyhow::Result<()> {
    match d {
        DType::F32 | DType::BF16 | DType::F16 | DType::F64 => Ok(()),
        other => bail!("policy dtype {other:?} is not supported; use F32, BF16, F16 or F64"),
    }
}

/// `eos_token_id` of a config (a number or a list).
fn eos_ids(v: &serde_json::Value) -> Vec<u32> {
    match v.get("eos_token_id") {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
        _ => vec![],
    }
}
