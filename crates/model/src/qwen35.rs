//! Qwen3.5 text model (FrogNano-4B-2609): a hybrid decoder of Gated DeltaNet layers and gated
//! full-attention layers, 3:1, every layer pre-norm with a SwiGLU MLP. Section numbers refer
//! to `docs/model.md`.
//!
//! The weights are named once, in [`Qwen35Map`] (Hugging Face names, shapes, roles), and read
//! by the one [`Qwen35::load`] from any [`TensorSource`]. The structs hold norm scales as the
//! factor actually multiplied (`1 + w` for the zero-centred norms), `A` as `−exp(A_log)`, and
//! the key head of every DeltaNet value head in the source's order.

use std::path::Path;

use rayon::prelude::*;

use crate::cache::{Cache, KvRows, KvType, LayerCache};
use crate::config::{LayerType, Qwen35Config};
use crate::decoder::{self, LayerStack, Rows};
use crate::error::{ModelError, Result};
use crate::kernels::attention::AttnShape;
use crate::kernels::conv::causal_conv1d;
use crate::kernels::delta_rule::{self, DeltaInputs, DeltaShape};
use crate::kernels::{l2_normalize, rms_norm, sigmoid, silu, softmax, softplus, Act, Rope};
use crate::quant::ggml;
use crate::quant::QuantType;
use crate::qwen35_mtp::Qwen35Mtp;
use crate::safetensors_dir::SafetensorsDir;
use crate::tensor::{DType, Matrix};
use crate::weights::{has_output_head, layer_name, Role, TensorSource, WeightSpec, EMBED_TOKENS, FINAL_NORM, LM_HEAD};
use crate::CausalLm;

/// Every weight of a Qwen3.5 model: Hugging Face name, shape and role, per layer, in
/// checkpoint order. [`Qwen35::load`] reads it from any [`TensorSource`]; the trainer and a
/// GPU upload walk the same map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qwen35Map {
    /// `[vocab, d]`.
    pub embed_tokens: WeightSpec,
    /// `[vocab, d]`; `None` when tied to the embedding.
    pub lm_head: Option<WeightSpec>,
    /// Decoder layers.
    pub layers: Vec<LayerMap>,
    /// Final norm (zero-centred).
    pub norm: WeightSpec,
}

/// The weights of one decoder layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerMap {
    /// Pre-mixer norm (zero-centred).
    pub input_norm: WeightSpec,
    /// The mixer's weights.
    pub mixer: MixerMap,
    /// Pre-MLP norm (zero-centred).
    pub post_attention_norm: WeightSpec,
    /// SwiGLU MLP.
    pub mlp: MlpMap,
}

/// The weights of a layer's mixer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MixerMap {
    /// Gated full attention.
    Attention(AttentionMap),
    /// Gated DeltaNet.
    DeltaNet(DeltaNetMap),
}

/// Gated full attention (§3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionMap {
    /// `[Hq·2·dh, d]`, per head `[query | gate]`.
    pub q_proj: WeightSpec,
    /// `[Hkv·dh, d]`.
    pub k_proj: WeightSpec,
    /// `[Hkv·dh, d]`.
    pub v_proj: WeightSpec,
    /// `[d, Hq·dh]`.
    pub o_proj: WeightSpec,
    /// `[dh]`, zero-centred.
    pub q_norm: WeightSpec,
    /// `[dh]`, zero-centred.
    pub k_norm: WeightSpec,
}

/// Gated DeltaNet (§3.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaNetMap {
    /// `[2·Hk·dk + Hv·dv, d]`.
    pub in_proj_qkv: WeightSpec,
    /// `[Hv·dv, d]`.
    pub in_proj_z: WeightSpec,
    /// `[Hv, d]`.
    pub in_proj_b: WeightSpec,
    /// `[Hv, d]`.
    pub in_proj_a: WeightSpec,
    /// `[conv_dim, 1, K]`.
    pub conv1d: WeightSpec,
    /// `[Hv]`.
    pub dt_bias: WeightSpec,
    /// `[Hv]`, used as `−exp(A_log)`.
    pub a_log: WeightSpec,
    /// `[dv]`, plain scale.
    pub norm: WeightSpec,
    /// `[d, Hv·dv]`.
    pub out_proj: WeightSpec,
}

/// SwiGLU MLP (§3.6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlpMap {
    /// `[intermediate, d]`.
    pub gate: WeightSpec,
    /// `[intermediate, d]`.
    pub up: WeightSpec,
    /// `[d, intermediate]`.
    pub down: WeightSpec,
}

impl Qwen35Map {
    /// The map for `cfg`, with an `lm_head.weight` when `has_lm_head`.
    pub fn new(cfg: &Qwen35Config, has_lm_head: bool) -> Self {
        let d = cfg.hidden_size;
        let layers = cfg
            .layer_types
            .iter()
            .enumerate()
            .map(|(i, ty)| LayerMap::new(cfg, *ty, |suffix| layer_name(i, suffix)))
            .collect();
        Qwen35Map {
            embed_tokens: WeightSpec::new(EMBED_TOKENS, [cfg.vocab_size, d], Role::Embedding),
            lm_head: has_lm_head.then(|| WeightSpec::new(LM_HEAD, [cfg.vocab_size, d], Role::Linear)),
            layers,
            norm: WeightSpec::new(FINAL_NORM, [d], Role::ZeroCentredNorm),
        }
    }

    /// Every weight in checkpoint order: the embedding, each layer's, the final norm, the head.
    pub fn specs(&self) -> Vec<&WeightSpec> {
        let mut v = vec![&self.embed_tokens];
        v.extend(self.layers.iter().flat_map(LayerMap::specs));
        v.push(&self.norm);
        v.extend(&self.lm_head);
        v
    }
}

impl LayerMap {
    /// The weights of one decoder layer of type `ty`, each named `name(suffix)`
    /// (`model.layers.{i}.…` for the stack, `mtp.layers.{i}.…` for the MTP head).
    pub fn new(cfg: &Qwen35Config, ty: LayerType, name: impl Fn(&str) -> String) -> Self {
        let d = cfg.hidden_size;
        let ffn = cfg.intermediate_size;
        let w = |suffix: &str, shape: &[usize], role| WeightSpec::new(name(suffix), shape, role);
        let mixer = match ty {
            LayerType::Full => {
                let (hq, hkv, dh) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
                MixerMap::Attention(AttentionMap {
                    q_proj: w("self_attn.q_proj.weight", &[hq * 2 * dh, d], Role::Linear),
                    k_proj: w("self_attn.k_proj.weight", &[hkv * dh, d], Role::Linear),
                    v_proj: w("self_attn.v_proj.weight", &[hkv * dh, d], Role::Linear),
                    o_proj: w("self_attn.o_proj.weight", &[d, hq * dh], Role::Linear),
                    q_norm: w("self_attn.q_norm.weight", &[dh], Role::ZeroCentredNorm),
                    k_norm: w("self_attn.k_norm.weight", &[dh], Role::ZeroCentredNorm),
                })
            }
            LayerType::Linear => {
                let (hv, dv, k) = (cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim);
                let conv_dim = cfg.conv_dim();
                MixerMap::DeltaNet(DeltaNetMap {
                    in_proj_qkv: w("linear_attn.in_proj_qkv.weight", &[conv_dim, d], Role::Linear),
                    in_proj_z: w("linear_attn.in_proj_z.weight", &[hv * dv, d], Role::Linear),
                    in_proj_b: w("linear_attn.in_proj_b.weight", &[hv, d], Role::Linear),
                    in_proj_a: w("linear_attn.in_proj_a.weight", &[hv, d], Role::Linear),
                    conv1d: w("linear_attn.conv1d.weight", &[conv_dim, 1, k], Role::Vector),
                    dt_bias: w("linear_attn.dt_bias", &[hv], Role::Vector),
                    a_log: w("linear_attn.A_log", &[hv], Role::LogDecay),
                    norm: w("linear_attn.norm.weight", &[dv], Role::Norm),
                    out_proj: w("linear_attn.out_proj.weight", &[d, hv * dv], Role::Linear),
                })
            }
        };
        LayerMap {
            input_norm: w("input_layernorm.weight", &[d], Role::ZeroCentredNorm),
            mixer,
            post_attention_norm: w("post_attention_layernorm.weight", &[d], Role::ZeroCentredNorm),
            mlp: MlpMap {
                gate: w("mlp.gate_proj.weight", &[ffn, d], Role::Linear),
                up: w("mlp.up_proj.weight", &[ffn, d], Role::Linear),
                down: w("mlp.down_proj.weight", &[d, ffn], Role::Linear),
            },
        }
    }

    /// This layer's weights in checkpoint order: input norm, mixer, post-attention norm, MLP.
    pub fn specs(&self) -> Vec<&WeightSpec> {
        let mut v = vec![&self.input_norm];
        match &self.mixer {
            MixerMap::Attention(a) => v.extend([&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj, &a.q_norm, &a.k_norm]),
            MixerMap::DeltaNet(n) => v.extend([
                &n.in_proj_qkv,
                &n.in_proj_z,
                &n.in_proj_b,
                &n.in_proj_a,
                &n.conv1d,
                &n.dt_bias,
                &n.a_log,
                &n.norm,
                &n.out_proj,
            ]),
        }
        v.extend([&self.post_attention_norm, &self.mlp.gate, &self.mlp.up, &self.mlp.down]);
        v
    }
}

/// SwiGLU MLP (§3.6).
#[derive(Debug, Clone)]
pub struct Mlp {
    /// `[intermediate, d]`.
    pub gate: Matrix,
    /// `[intermediate, d]`.
    pub up: Matrix,
    /// `[d, intermediate]`.
    pub down: Matrix,
}

impl Mlp {
    /// `(silu(x·Wgᵀ) ⊙ x·Wuᵀ)·Wdᵀ`, rounded like a `dt` run.
    pub fn forward(&self, x: &[f32], t: usize, act: Act) -> Vec<f32> {
        let [mut g, mut u]: [Vec<f32>; 2] =
            Matrix::matmul_many(&[&self.gate, &self.up], x, t).try_into().expect("two products for two matrices");
        act.round(&mut g);
        act.round(&mut u);
        let width = g.len() / t.max(1);
        crate::kernels::for_each_row(&mut g, width, |i, row| {
            let u = &u[i * width..(i + 1) * width];
            if act == Act::F32 {
                // ggml's SwiGLU, as llama.cpp runs this model's GGUF: sixteen lanes at a time
                // with its vector exp, where libm's `expf` per element took ~3 % of a 4B
                // prefill (results within an ulp or two of it).
                ggml::swiglu(row, u, width);
                return;
            }
            for (a, b) in row.iter_mut().zip(u) {
                *a = act.r(act.r(silu(*a)) * b);
            }
        });
        let mut y = self.down.matmul(&g, t);
        act.round(&mut y);
        y
    }
}

/// Gated full attention (§3.3).
#[derive(Debug, Clone)]
pub struct GatedAttention {
    /// `[Hq·2·dh, d]`, per head `[query | gate]`.
    pub q_proj: Matrix,
    /// `[Hkv·dh, d]`.
    pub k_proj: Matrix,
    /// `[Hkv·dh, d]`.
    pub v_proj: Matrix,
    /// `[d, Hq·dh]`.
    pub o_proj: Matrix,
    /// Per-head q norm scale (`1 + w`), `[dh]`.
    pub q_norm: Vec<f32>,
    /// Per-head k norm scale (`1 + w`), `[dh]`.
    pub k_norm: Vec<f32>,
}

/// Gated DeltaNet (§3.4).
#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    /// `[2·Hk·dk + Hv·dv, d]`, rows `[q ; k ; v]`.
    pub in_proj_qkv: Matrix,
    /// `[Hv·dv, d]`.
    pub in_proj_z: Matrix,
    /// `[Hv, d]` → beta.
    pub in_proj_b: Matrix,
    /// `[Hv, d]` → decay.
    pub in_proj_a: Matrix,
    /// Depthwise conv kernel `[conv_dim, K]`.
    pub conv1d: Vec<f32>,
    /// `[Hv]`.
    pub dt_bias: Vec<f32>,
    /// `−exp(A_log)`, `[Hv]`.
    pub neg_a: Vec<f32>,
    /// Gated-norm scale (plain `w`), `[dv]`.
    pub norm: Vec<f32>,
    /// `[d, Hv·dv]`.
    pub out_proj: Matrix,
    /// Key head read by each value head: grouped (`v / r`) for HF, tiled (`v % Hk`) for GGUF.
    pub key_head: Vec<usize>,
}

/// The mixer of one layer.
#[derive(Debug, Clone)]
pub enum Mixer {
    /// Linear attention.
    DeltaNet(GatedDeltaNet),
    /// Full attention.
    Attention(GatedAttention),
}

/// One decoder layer.
#[derive(Debug, Clone)]
pub struct Layer {
    /// Pre-mixer norm scale (`1 + w`).
    pub input_norm: Vec<f32>,
    /// Pre-MLP norm scale (`1 + w`).
    pub post_attention_norm: Vec<f32>,
    /// Attention or DeltaNet.
    pub mixer: Mixer,
    /// SwiGLU MLP.
    pub mlp: Mlp,
}

impl Layer {
    /// The projection matrices of this layer (mixer, then MLP), to re-quantize or repack.
    pub(crate) fn matrices_mut(&mut self) -> Vec<&mut Matrix> {
        let mut v: Vec<&mut Matrix> = match &mut self.mixer {
            Mixer::Attention(a) => vec![&mut a.q_proj, &mut a.k_proj, &mut a.v_proj, &mut a.o_proj],
            Mixer::DeltaNet(n) => {
                vec![&mut n.in_proj_qkv, &mut n.in_proj_z, &mut n.in_proj_b, &mut n.in_proj_a, &mut n.out_proj]
            }
        };
        v.extend([&mut self.mlp.gate, &mut self.mlp.up, &mut self.mlp.down]);
        v
    }

    /// The projection matrices of this layer (mixer, then MLP).
    pub(crate) fn matrices(&self) -> Vec<&Matrix> {
        let mut v: Vec<&Matrix> = match &self.mixer {
            Mixer::Attention(a) => vec![&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj],
            Mixer::DeltaNet(n) => vec![&n.in_proj_qkv, &n.in_proj_z, &n.in_proj_b, &n.in_proj_a, &n.out_proj],
        };
        v.extend([&self.mlp.gate, &self.mlp.up, &self.mlp.down]);
        v
    }
}

/// The whole text model.
#[derive(Debug, Clone)]
pub struct Qwen35 {
    /// Shapes and hyper-parameters.
    pub cfg: Qwen35Config,
    /// `[vocab, d]`.
    pub embed_tokens: Matrix,
    /// `[vocab, d]`; `None` when tied to the embedding.
    pub lm_head: Option<Matrix>,
    /// Decoder layers.
    pub layers: Vec<Layer>,
    /// Final norm scale (`1 + w`).
    pub norm: Vec<f32>,
    /// Activation dtype (what transformers would compute in).
    pub act: Act,
    rope: Rope,
    /// How new caches store attention keys and values: f32 in the activation dtype's values
    /// (transformers' numerics) unless set (GGUF models: f16, as llama.cpp).
    kv_type: KvType,
    /// The multi-token-prediction head (`mtp.*`), when the checkpoint has one.
    pub mtp: Option<Qwen35Mtp>,
}

impl Qwen35 {
    /// Assembles a model from loaded parts (the safetensors and GGUF loaders both end here).
    pub fn new(
        cfg: Qwen35Config,
        embed_tokens: Matrix,
        lm_head: Option<Matrix>,
        layers: Vec<Layer>,
        norm: Vec<f32>,
        act: Act,
    ) -> Self {
        let rope = Rope::new(cfg.rotary_dim(), cfg.rope_theta);
        Qwen35 { cfg, embed_tokens, lm_head, layers, norm, act, rope, kv_type: KvType::F32, mtp: None }
    }

    /// Loads `config.json` + safetensors from a Hugging Face checkpoint folder.
    pub fn from_safetensors(dir: &Path) -> Result<Self> {
        let cfg = Qwen35Config::from_file(&dir.join("config.json"))?;
        let st = SafetensorsDir::open(dir)?;
        Self::load(cfg, &st, None)
    }

    /// Loads the weights of [`Qwen35Map`] from any source: a safetensors folder, a GGUF file
    /// through [`crate::gguf_weights::GgufWeights`], the trainer's weights. Activations are
    /// held in `act`, or — when `None` — in the embedding's dtype (what transformers computes
    /// in; quantized weights compute in f32, like llama.cpp).
    pub fn load(cfg: Qwen35Config, src: &dyn TensorSource, act: Option<Act>) -> Result<Self> {
        let map = Qwen35Map::new(&cfg, has_output_head(src, cfg.tie_word_embeddings)?);
        let embed_tokens = src.matrix(&map.embed_tokens)?;
        let act = act.unwrap_or(match embed_tokens.dtype {
            DType::F32 | DType::Quant(_) => Act::F32,
            DType::BF16 => Act::BF16,
            DType::F16 => Act::F16,
        });
        let lm_head = map.lm_head.as_ref().map(|w| src.matrix(w)).transpose()?;
        let key_head = src.layout().value_heads.key_heads(cfg.linear_num_value_heads, cfg.linear_num_key_heads);
        let layers = map.layers.iter().map(|l| load_layer(src, l, &key_head)).collect::<Result<Vec<_>>>()?;
        let norm = src.vector(&map.norm)?;
        let mtp = Qwen35Mtp::load(&cfg, src, &key_head)?;
        let mut m = Qwen35::new(cfg, embed_tokens, lm_head, layers, norm, act);
        m.mtp = mtp;
        Ok(m)
    }

    /// Re-quantizes every weight matrix to `q` (`--quant`); matrices too narrow for its
    /// blocks fall back as [`Matrix::quantized`] describes. The model then computes in f32, as
    /// llama.cpp does with quantized weights.
    pub fn quantize_weights(&mut self, q: QuantType) {
        self.embed_tokens = self.embed_tokens.quantized(q);
        if let Some(h) = self.lm_head.as_mut() {
            *h = h.quantized(q);
        }
        for m in self.layer_matrices_mut() {
            *m = m.quantized(q);
        }
        if let Some(mtp) = self.mtp.as_mut() {
            for m in mtp.matrices_mut() {
                *m = m.quantized(q);
            }
        }
        self.act = Act::F32;
    }

    /// Repacks the matmul weights for this CPU's fastest kernels ([`Matrix::pack_for_matmul`]):
    /// every projection and the output head (the tied embedding when there is none; its row
    /// lookups still answer, from the file or unpacked from the packed copy).
    pub fn pack_for_matmul(&mut self) {
        match self.lm_head.as_mut() {
            Some(h) => h.pack_for_matmul(),
            None => self.embed_tokens.pack_for_matmul(),
        }
        for m in self.layer_matrices_mut() {
            m.pack_for_matmul();
        }
        if let Some(mtp) = self.mtp.as_mut() {
            for m in mtp.matrices_mut() {
                m.pack_for_matmul();
            }
        }
    }

    /// Bytes of the weight matrices (after any re-quantization).
    pub fn weight_bytes(&self) -> usize {
        let head = self.lm_head.as_ref().map_or(0, Matrix::byte_len);
        let layers: usize = self.layers.iter().flat_map(Layer::matrices).map(Matrix::byte_len).sum();
        let mtp: usize = self.mtp.iter().flat_map(Qwen35Mtp::matrices).map(Matrix::byte_len).sum();
        self.embed_tokens.byte_len() + head + layers + mtp
    }

    /// Every projection matrix of every layer (mixer, then MLP).
    fn layer_matrices_mut(&mut self) -> impl Iterator<Item = &mut Matrix> {
        self.layers.iter_mut().flat_map(Layer::matrices_mut)
    }

    pub(crate) fn eps(&self) -> f32 {
        self.cfg.rms_norm_eps as f32
    }

    /// The rotary embedding of the attention layers.
    pub fn rope(&self) -> &Rope {
        &self.rope
    }

    /// One decoder layer over `h` (`[t, d]`, updated in place): pre-norm mixer and MLP with
    /// their residuals, the mixer advancing each segment's state of this layer.
    pub(crate) fn run_layer(&self, layer: &Layer, h: &mut [f32], t: usize, parts: &mut [Segment<'_>]) {
        let act = self.act;
        let mut u = rms_norm(h, &layer.input_norm, self.eps());
        act.round(&mut u);
        let u = match &layer.mixer {
            Mixer::Attention(a) => a.forward(&u, parts, self),
            Mixer::DeltaNet(n) => n.forward(&u, parts, self),
        };
        for (a, b) in h.iter_mut().zip(&u) {
            *a = act.r(*a + b);
        }
        let mut u = rms_norm(h, &layer.post_attention_norm, self.eps());
        act.round(&mut u);
        let u = layer.mlp.forward(&u, t, act);
        for (a, b) in h.iter_mut().zip(&u) {
            *a = act.r(*a + b);
        }
    }

    /// The final norm over `n` hidden rows of the stack: the hidden states the output head
    /// reads, and the ones the MTP head takes (`[n, d]`).
    pub(crate) fn final_norm(&self, rows: &[f32]) -> Vec<f32> {
        let mut x = rms_norm(rows, &self.norm, self.eps());
        self.act.round(&mut x);
        x
    }

    /// The output head over `n` normed rows: `[n, vocab]`.
    pub(crate) fn head(&self, normed: &[f32], n: usize) -> Vec<f32> {
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        let mut logits = head.matmul(normed, n);
        self.act.round(&mut logits);
        logits
    }
}

/// Reads one decoder layer's weights.
pub(crate) fn load_layer(src: &dyn TensorSource, l: &LayerMap, key_head: &[usize]) -> Result<Layer> {
    let mixer = match &l.mixer {
        MixerMap::Attention(a) => Mixer::Attention(GatedAttention {
            q_proj: src.matrix(&a.q_proj)?,
            k_proj: src.matrix(&a.k_proj)?,
            v_proj: src.matrix(&a.v_proj)?,
            o_proj: src.matrix(&a.o_proj)?,
            q_norm: src.vector(&a.q_norm)?,
            k_norm: src.vector(&a.k_norm)?,
        }),
        MixerMap::DeltaNet(n) => Mixer::DeltaNet(GatedDeltaNet {
            in_proj_qkv: src.matrix(&n.in_proj_qkv)?,
            in_proj_z: src.matrix(&n.in_proj_z)?,
            in_proj_b: src.matrix(&n.in_proj_b)?,
            in_proj_a: src.matrix(&n.in_proj_a)?,
            conv1d: src.vector(&n.conv1d)?,
            dt_bias: src.vector(&n.dt_bias)?,
            neg_a: src.vector(&n.a_log)?,
            norm: src.vector(&n.norm)?,
            out_proj: src.matrix(&n.out_proj)?,
            key_head: key_head.to_vec(),
        }),
    };
    Ok(Layer {
        input_norm: src.vector(&l.input_norm)?,
        post_attention_norm: src.vector(&l.post_attention_norm)?,
        mixer,
        mlp: Mlp { gate: src.matrix(&l.mlp.gate)?, up: src.matrix(&l.mlp.up)?, down: src.matrix(&l.mlp.down)? },
    })
}

/// One sequence's rows in a (possibly batched) pass: `rows` new tokens at positions
/// `pos0..` and that sequence's state for the current layer. Projections and the MLP run over
/// the rows of all segments together; only attention and the recurrent step run per segment.
pub(crate) struct Segment<'a> {
    pub(crate) rows: usize,
    pub(crate) pos0: usize,
    pub(crate) state: &'a mut LayerCache,
    /// Take the rows one at a time through the one-token path (`decode_layers`' `stepwise`).
    pub(crate) stepwise: bool,
    /// A linear layer's buffers for its state after each of the first rows, when the cache
    /// keeps them ([`Cache::keep_row_states`]; stepwise passes only).
    pub(crate) kept: &'a mut [(Vec<f32>, Vec<f32>)],
}

/// `x[r0·w .. (r0+rows)·w]`, copied.
fn rows_of(x: &[f32], r0: usize, rows: usize, w: usize) -> Vec<f32> {
    x[r0 * w..(r0 + rows) * w].to_vec()
}

impl GatedAttention {
    /// Attention over the rows of every segment (each at its own positions, appending to its
    /// own KV cache). `x` is `[Σ rows, d]`.
    fn forward(&self, x: &[f32], segs: &mut [Segment<'_>], m: &Qwen35) -> Vec<f32> {
        let act = m.act;
        let c = &m.cfg;
        let (hq, hkv, dh) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let t: usize = segs.iter().map(|s| s.rows).sum();
        let eps = m.eps();
        let [mut qg, mut k, mut v]: [Vec<f32>; 3] =
            Matrix::matmul_many(&[&self.q_proj, &self.k_proj, &self.v_proj], x, t)
                .try_into()
                .expect("three products for three matrices");
        act.round(&mut qg);
        // Split the per-head [query | gate] interleave.
        let mut q = vec![0.0f32; t * hq * dh];
        let mut gate = vec![0.0f32; t * hq * dh];
        for (i, row) in qg.chunks_exact(2 * dh).enumerate() {
            q[i * dh..(i + 1) * dh].copy_from_slice(&row[..dh]);
            gate[i * dh..(i + 1) * dh].copy_from_slice(&row[dh..]);
        }
        let mut q = rms_norm(&q, &self.q_norm, eps);
        act.round(&mut q);
        act.round(&mut k);
        let mut k = rms_norm(&k, &self.k_norm, eps);
        act.round(&mut k);
        act.round(&mut v);
        let mut r0 = 0;
        let mut work = Vec::with_capacity(segs.len());
        for seg in segs.iter_mut() {
            let LayerCache::Attention { k: kc, v: vc } = &mut *seg.state else {
                unreachable!("cache layout checked by the caller")
            };
            let (qs, ks, vs) = (
                rows_of(&q, r0, seg.rows, hq * dh),
                rows_of(&k, r0, seg.rows, hkv * dh),
                rows_of(&v, r0, seg.rows, hkv * dh),
            );
            work.push((qs, ks, vs, seg.rows, seg.pos0, kc, vc, seg.stepwise));
            r0 += seg.rows;
        }
        let outs: Vec<Vec<f32>> = work
            .into_par_iter()
            .map(|(q, k, v, rows, pos0, kc, vc, stepwise)| {
                if !stepwise {
                    return attend(q, k, &v, rows, pos0, kc, vc, m);
                }
                let (qw, kw) = (hq * dh, hkv * dh);
                let mut out = Vec::with_capacity(rows * qw);
                for i in 0..rows {
                    let (qi, ki) = (q[i * qw..(i + 1) * qw].to_vec(), k[i * kw..(i + 1) * kw].to_vec());
                    out.extend(attend(qi, ki, &v[i * kw..(i + 1) * kw], 1, pos0 + i, kc, vc, m));
                }
                out
            })
            .collect();
        let mut o = outs.concat();
        let width = o.len() / t.max(1);
        crate::kernels::for_each_row(&mut o, width, |i, row| {
            for (e, gt) in row.iter_mut().zip(&gate[i * width..(i + 1) * width]) {
                *e = act.r(*e * act.r(sigmoid(*gt)));
            }
        });
        let mut y = self.o_proj.matmul(&o, t);
        act.round(&mut y);
        y
    }
}

/// One sequence's attention: RoPE on its `t` new queries and keys at positions `pos0..`, keys
/// and values appended to its cache, causal softmax attention over the cache. Returns
/// `[t, Hq·dh]` before the output gate.
#[allow(clippy::too_many_arguments)]
fn attend(
    mut q: Vec<f32>,
    mut k: Vec<f32>,
    v: &[f32],
    t: usize,
    pos0: usize,
    k_cache: &mut KvRows,
    v_cache: &mut KvRows,
    m: &Qwen35,
) -> Vec<f32> {
    let act = m.act;
    let c = &m.cfg;
    let (hq, hkv, dh) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    for (i, head) in q.chunks_exact_mut(dh).enumerate() {
        m.rope.apply(head, pos0 + i / hq, act);
    }
    for (i, head) in k.chunks_exact_mut(dh).enumerate() {
        m.rope.apply(head, pos0 + i / hkv, act);
    }
    k_cache.push(&k);
    v_cache.push(v);
    let total = pos0 + t;
    let scale = 1.0 / (dh as f32).sqrt();
    let (Some(kc), Some(vc)) = (k_cache.f32_values(), v_cache.f32_values()) else {
        // An f16 or quantized cache (`--kv-cache`): the tiled kernel, then the activation
        // rounding of the output. One token (decode) takes a one-token kernel instead, which
        // reads each key row where it lies, where the tiled kernel would transpose every key of
        // the context for the one row of each head: on an f16 cache with llama.cpp's scores
        // (the query rounded to f16, as its f16 K·Q converts it, then an online softmax), on
        // a Q8_0/Q4_0 cache `kernels::attention_q` (the query quantized to Q8_0, integer
        // block dots, as llama.cpp's flash attention does with a quantized K).
        let shape = AttnShape { t, pos0, heads: hq, kv_heads: hkv, head_dim: dh, scale };
        let mut o = if t == 1 && k_cache.kv_type() == KvType::F16 {
            q.iter_mut().for_each(|x| *x = crate::kernels::round_f16(*x));
            crate::kernels::attention::causal(&q, k_cache, v_cache, shape, crate::quant::ggml::F16Dot::Vec)
        } else if t == 1 && crate::kernels::attention_q::supports(k_cache, v_cache) {
            crate::kernels::attention::causal(&q, k_cache, v_cache, shape, crate::quant::ggml::F16Dot::Vec)
        } else {
            crate::kernels::flash::causal_tiled(&q, k_cache, v_cache, shape)
        };
        act.round(&mut o);
        return o;
    };
    let group = hq / hkv;
    // o[i, h, :] for every (token, head), in parallel.
    let mut o = vec![0.0f32; t * hq * dh];
    o.par_chunks_mut(dh).enumerate().for_each(|(idx, oh)| {
        let (i, h) = (idx / hq, idx % hq);
        let kvh = h / group;
        let qh = &q[idx * dh..(idx + 1) * dh];
        let n = pos0 + i + 1; // causal: keys 0..=pos
        let mut s: Vec<f32> = (0..n)
            .map(|j| act.r(crate::kernels::gemm::dot(qh, &kc[(j * hkv + kvh) * dh..(j * hkv + kvh + 1) * dh]) * scale))
            .collect();
        softmax(&mut s);
        for (j, p) in s.iter().enumerate() {
            let p = act.r(*p);
            let vr = &vc[(j * hkv + kvh) * dh..(j * hkv + kvh + 1) * dh];
            for (e, vv) in oh.iter_mut().zip(vr) {
                *e += p * vv;
            }
        }
        act.round(oh);
    });
    debug_assert_eq!(kc.len(), total * hkv * dh);
    o
}

/// One segment's projected DeltaNet inputs (rows of `[q;k;v]`, `z`, `b`, `a`).
struct DeltaRows {
    mix: Vec<f32>,
    z: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
}

impl GatedDeltaNet {
    /// DeltaNet over the rows of every segment, advancing each one's conv and recurrent state.
    /// `x` is `[Σ rows, d]`.
    fn forward(&self, x: &[f32], segs: &mut [Segment<'_>], m: &Qwen35) -> Vec<f32> {
        let act = m.act;
        let c = &m.cfg;
        let (hv, dv) = (c.linear_num_value_heads, c.linear_value_head_dim);
        let t: usize = segs.iter().map(|s| s.rows).sum();
        let [mut mix, mut z, mut b, mut a]: [Vec<f32>; 4] =
            Matrix::matmul_many(&[&self.in_proj_qkv, &self.in_proj_z, &self.in_proj_b, &self.in_proj_a], x, t)
                .try_into()
                .expect("four products for four matrices");
        for p in [&mut mix, &mut z, &mut b, &mut a] {
            act.round(p);
        }
        let mut r0 = 0;
        let mut work = Vec::with_capacity(segs.len());
        for seg in segs.iter_mut() {
            let LayerCache::Linear { conv, state } = &mut *seg.state else {
                unreachable!("cache layout checked by the caller")
            };
            let rows = DeltaRows {
                mix: rows_of(&mix, r0, seg.rows, c.conv_dim()),
                z: rows_of(&z, r0, seg.rows, hv * dv),
                b: rows_of(&b, r0, seg.rows, hv),
                a: rows_of(&a, r0, seg.rows, hv),
            };
            // The recurrent form for one token after a prefix, the chunked one otherwise.
            let decode = seg.rows == 1 && seg.pos0 > 0;
            let kept = std::mem::take(&mut seg.kept);
            work.push((rows, seg.rows, conv, state, decode, seg.pos0, seg.stepwise, kept));
            r0 += seg.rows;
        }
        let outs: Vec<Vec<f32>> = work
            .into_par_iter()
            .map(|(rows, t, conv, state, decode, pos0, stepwise, kept)| {
                if !stepwise {
                    return self.step(rows, t, conv, state, m, decode);
                }
                // Each row as a decode step of its own advances the state.
                let mut out = Vec::with_capacity(t * hv * dv);
                for i in 0..t {
                    let one = DeltaRows {
                        mix: rows_of(&rows.mix, i, 1, c.conv_dim()),
                        z: rows_of(&rows.z, i, 1, hv * dv),
                        b: rows_of(&rows.b, i, 1, hv),
                        a: rows_of(&rows.a, i, 1, hv),
                    };
                    out.extend(self.step(one, 1, conv, state, m, pos0 + i > 0));
                    // The state after this row, for a verification that keeps only this far.
                    if let Some((c, s)) = kept.get_mut(i).filter(|_| i + 1 < t) {
                        c.clone_from(conv);
                        s.clone_from(state);
                    }
                }
                out
            })
            .collect();
        let o = outs.concat();
        let mut y = self.out_proj.matmul(&o, t);
        act.round(&mut y);
        y
    }

    /// One sequence's conv, delta rule and gated norm over its `t` projected rows; returns
    /// `[t, Hv·dv]`, the input of `out_proj`.
    fn step(
        &self,
        rows: DeltaRows,
        t: usize,
        conv_state: &mut [f32],
        state: &mut [f32],
        m: &Qwen35,
        decode: bool,
    ) -> Vec<f32> {
        let act = m.act;
        let c = &m.cfg;
        let (hk, hv, dk, dv) =
            (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim);
        let (key_dim, conv_dim) = (c.key_dim(), c.conv_dim());
        let DeltaRows { mix, z, b, a } = rows;
        // Causal conv + SiLU, computed in dt.
        let mut conv = causal_conv1d(&mix, conv_state, &self.conv1d, conv_dim, c.linear_conv_kernel_dim);
        act.round(conv_state);
        crate::kernels::for_each_row(&mut conv, conv_dim, |_, row| {
            act.round(row);
            for e in row.iter_mut() {
                *e = act.r(silu(*e));
            }
        });
        // Split channels into q, k, v; l2-normalise q and k (eps 1e-6 on the sum), scale q.
        let mut q = Vec::with_capacity(t * key_dim);
        let mut k = Vec::with_capacity(t * key_dim);
        let mut v = Vec::with_capacity(t * hv * dv);
        for row in conv.chunks_exact(conv_dim) {
            q.extend_from_slice(&row[..key_dim]);
            k.extend_from_slice(&row[key_dim..2 * key_dim]);
            v.extend_from_slice(&row[2 * key_dim..]);
        }
        let qscale = 1.0 / (dk as f32).sqrt();
        crate::kernels::for_each_row(&mut q, dk, |_, r| {
            l2_normalize(r, 1e-6);
            r.iter_mut().for_each(|e| *e *= qscale);
        });
        crate::kernels::for_each_row(&mut k, dk, |_, r| l2_normalize(r, 1e-6));
        // beta = sigmoid(b) in dt; g = −exp(A_log)·softplus(a + dt_bias) in f32.
        let beta: Vec<f32> = b.iter().map(|e| act.r(sigmoid(*e))).collect();
        let g: Vec<f32> =
            a.iter().enumerate().map(|(i, e)| self.neg_a[i % hv] * softplus(e + self.dt_bias[i % hv])).collect();
        let shape = DeltaShape { t, hk, hv, dk, dv, key_head: self.key_head.clone() };
        let inputs = DeltaInputs { q: &q, k: &k, v: &v, g: &g, beta: &beta };
        let mut o = if decode {
            delta_rule::recurrent(&inputs, state, &shape)
        } else {
            delta_rule::chunked(&inputs, state, &shape)
        };
        act.round(&mut o);
        // Gated RMSNorm per value head: norm, cast, scale by w (dt), times silu(z) (f32), cast.
        let eps = m.eps();
        crate::kernels::for_each_row(&mut o, dv, |h, oh| {
            let zh = &z[h * dv..(h + 1) * dv];
            let ms = oh.iter().map(|e| e * e).sum::<f32>() / dv as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            for ((e, w), zz) in oh.iter_mut().zip(&self.norm).zip(zh) {
                let n = act.r(act.r(*e * inv) * w);
                *e = act.r(n * silu(*zz));
            }
        });
        o
    }
}

impl LayerStack for Qwen35 {
    fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    fn fits(&self, cache: &Cache) -> bool {
        cache.layers.len() == self.layers.len()
            && self.layers.iter().zip(&cache.layers).all(|(l, lc)| {
                matches!(
                    (&l.mixer, lc),
                    (Mixer::Attention(_), LayerCache::Attention { .. })
                        | (Mixer::DeltaNet(_), LayerCache::Linear { .. })
                )
            })
    }

    fn decode_layers(&self, ids: &[u32], segs: &mut [(usize, &mut Cache)], rows: Rows) -> Vec<f32> {
        let d = self.cfg.hidden_size;
        let t = ids.len();
        let mut h = Vec::with_capacity(t * d);
        for &id in ids {
            h.extend(self.embed_tokens.row(id as usize));
        }
        for (li, layer) in self.layers.iter().enumerate() {
            let n = segs.len();
            let mut parts: Vec<Segment<'_>> = segs
                .iter_mut()
                .enumerate()
                .map(|(i, (seg_rows, cache))| {
                    let stepwise = rows.stepwise(i, n);
                    let keep = if stepwise { cache.row_states.keep } else { 0 };
                    let kept = match cache.row_states.layers.get_mut(li) {
                        Some(kept) if keep > 0 => {
                            let n = keep.min(kept.len());
                            &mut kept[..n]
                        }
                        _ => &mut [],
                    };
                    Segment { rows: *seg_rows, pos0: cache.pos, state: &mut cache.layers[li], stepwise, kept }
                })
                .collect();
            self.run_layer(layer, &mut h, t, &mut parts);
        }
        for (rows, cache) in segs.iter_mut() {
            cache.pos += *rows;
        }
        h
    }

    fn logits(&self, rows: &[f32], n: usize) -> Vec<f32> {
        self.head(&self.final_norm(rows), n)
    }
}

impl CausalLm for Qwen35 {
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn max_context(&self) -> usize {
        self.cfg.max_position_embeddings
    }

    fn new_cache(&self) -> Cache {
        let c = &self.cfg;
        let layers = c
            .layer_types
            .iter()
            .map(|ty| match ty {
                LayerType::Full => LayerCache::attention(self.kv_type, c.num_key_value_heads, c.head_dim),
                LayerType::Linear => LayerCache::Linear {
                    conv: vec![0.0; (c.linear_conv_kernel_dim - 1) * c.conv_dim()],
                    state: vec![0.0; c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim],
                },
            })
            .collect();
        Cache::new(layers)
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
        let full = c.layer_types.iter().filter(|t| matches!(t, LayerType::Full)).count();
        let linear = c.layer_types.len() - full;
        let kv = 2 * full * tokens * self.kv_type.row_bytes(c.num_key_value_heads * c.head_dim);
        let state = (c.linear_conv_kernel_dim - 1) * c.conv_dim()
            + c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
        kv + linear * state * 4
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

    fn mtp(&self) -> Option<&dyn crate::MtpHead> {
        self.mtp.as_ref().map(|_| self as &dyn crate::MtpHead)
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}
