//! [`GpuModel`]: a Qwen3.5 or llama-family model on a [`Device`], behind the same
//! [`CausalLm`] as the CPU path (docs/gpu.md §5). It is built from the CPU model as loaded —
//! the one weight map per architecture read by frognano-model's one `load` — by uploading each
//! matrix in its stored format and each vector as the factor the CPU multiplies by, so the
//! structure below is the CPU forward's, step for step:
//!
//! ```text
//! h = embed[ids]
//! per layer:  u = rms_norm(h)·attn_norm
//!             Qwen3.5 attention:  [q|gate] = u·Wq, k, v;  q, k = rms_norm per head;  RoPE (partial, halves)
//!                                 o = causal attention over the KV cache;  o ·= sigmoid(gate);  y = o·Wo
//!             Qwen3.5 DeltaNet:   mix = u·Wqkv;  conv + SiLU;  q, k = l2norm;  beta, g;  delta rule;
//!                                 o = rms_norm(o)·w·silu(u·Wz);  y = o·Wout
//!             llama attention:    q, k, v (+ biases);  (q/k norms);  RoPE;  attention;  y = o·Wo
//!             h += y;  u = rms_norm(h)·ffn_norm;  h += (silu(u·Wg) ⊙ u·Wu)·Wd
//! logits = rms_norm(h)·norm · Wheadᵀ
//! ```
//!
//! Activations are f32 on the device; a sequence's keys, values and recurrent states live in
//! its [`Cache`] as device memory ([`SeqState`]). The RoPE tables (cos, sin per row) are made
//! on the host by the CPU model's own functions, so every RoPE variant (partial, Llama 3,
//! YaRN, attention temperature) is computed once, in one place.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use frognano_model::cache::{DeviceState, KvRows, KvType, LayerCache, LayerLayout};
use frognano_model::llama::{Llama, LlamaConfig, RopeStyle};
use frognano_model::qwen35::{Mixer, Qwen35};
use frognano_model::{Cache, CausalLm, ModelError};

use crate::attention::{self, AttnScratch, DeviceKv, KvDtype};
use crate::backend::{Buffer, Gpu, GpuError, Result};
use crate::deltanet;
use crate::kernels;
use crate::quant::{DeviceMatrix, MatmulScratch};

/// Rows a GEMV takes at once: a stepwise pass runs its matmuls in pieces of at most this many
/// rows, so every row gets the bits a decode step of it alone gets.
const GEMV_ROWS: usize = crate::quant::GEMV_MAX_N;

/// First capacity of a sequence's KV cache, in positions (doubled as it fills).
const KV_START: usize = 256;

/// Every model and its caches get an id, so a cache is never run through another model.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The attention projections of one layer.
struct AttnWeights {
    q: DeviceMatrix,
    k: DeviceMatrix,
    v: DeviceMatrix,
    o: DeviceMatrix,
    /// Qwen2's q/k/v biases.
    bias: Option<[Buffer; 3]>,
    /// Per-head q and k norm scales (Qwen3.5, Qwen3).
    qk_norm: Option<[Buffer; 2]>,
    /// Qwen3.5: q_proj gives `[query | gate]` per head, and the output is gated.
    gated: bool,
    /// Whether RoPE turns q and k (not in SmolLM3's NoPE layers).
    rope: bool,
}

/// A Gated DeltaNet mixer's weights.
struct DeltaWeights {
    qkv: DeviceMatrix,
    z: DeviceMatrix,
    b: DeviceMatrix,
    a: DeviceMatrix,
    out: DeviceMatrix,
    conv: Buffer,
    dt_bias: Buffer,
    neg_a: Buffer,
    norm: Buffer,
    key_head: Buffer,
}

enum MixerWeights {
    Attention(AttnWeights),
    DeltaNet(DeltaWeights),
}

struct LayerWeights {
    attn_norm: Buffer,
    ffn_norm: Buffer,
    mixer: MixerWeights,
    gate: DeviceMatrix,
    up: DeviceMatrix,
    down: DeviceMatrix,
}

/// How the model turns positions into RoPE tables.
enum RopeTable {
    /// Qwen3.5: `cos/sin(pos·inv_freq)` over the first `rotary_dim` dims, pairs as halves.
    Qwen35(frognano_model::kernels::Rope),
    /// The llama family: ggml's angles (frognano_model::llama::rope_angles) and the
    /// attention temperature of Llama 4 / Ministral 3.
    Llama { cfg: Box<LlamaConfig>, theta_scale: f32, freq_factors: Option<Vec<f32>>, temperature: Option<(f32, f32)> },
}

impl RopeTable {
    fn pairs(&self, pos: usize) -> Vec<(f32, f32)> {
        match self {
            RopeTable::Qwen35(r) => r.cos_sin(pos),
            RopeTable::Llama { cfg, theta_scale, freq_factors, .. } => {
                frognano_model::llama::rope_angles(cfg, *theta_scale, freq_factors.as_deref(), pos)
            }
        }
    }
    /// The attention temperature, when queries are scaled by one (folded into their table).
    fn temperature(&self) -> Option<(f32, f32)> {
        match self {
            RopeTable::Llama { temperature, .. } => *temperature,
            RopeTable::Qwen35(_) => None,
        }
    }
}

/// Shapes the forward needs, whatever the architecture.
#[derive(Debug, Clone)]
struct Shape {
    d: usize,
    vocab: usize,
    ffn: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rot_dim: usize,
    halves: bool,
    eps: f32,
    max_context: usize,
    /// DeltaNet sizes (0 for the llama family).
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
    conv_k: usize,
}

/// A model on a device.
pub struct GpuModel {
    dev: Gpu,
    id: u64,
    shape: Shape,
    embed: DeviceMatrix,
    head: Option<DeviceMatrix>,
    norm: Buffer,
    layers: Vec<LayerWeights>,
    rope: RopeTable,
    kv_type: KvType,
    work: Mutex<Work>,
    weight_bytes: usize,
}

/// The cache type a model placed on a device keeps: the CPU model's, except a block type its
/// head_dim cannot take in whole blocks of 32 (then f16, as before).
fn device_kv_type(ty: KvType, head_dim: usize) -> KvType {
    match ty {
        KvType::Q8_0 | KvType::Q4_0 if ty.check_head_dim(head_dim).is_err() => KvType::F16,
        other => other,
    }
}

/// Reusable device buffers of one forward, by name, grown to the largest pass seen.
#[derive(Default)]
struct Work {
    bufs: std::collections::HashMap<&'static str, Buffer>,
    mm: MatmulScratch,
    attn: AttnScratch,
}

impl Work {
    /// A buffer of at least `bytes`; the same one for the same name while it is big enough.
    fn get(&mut self, dev: &Gpu, name: &'static str, bytes: usize) -> Result<u64> {
        if self.bufs.get(name).is_none_or(|b| b.len() < bytes) {
            // Round up so that a pass one row longer does not reallocate.
            let size = bytes.next_power_of_two().max(256);
            self.bufs.remove(name);
            self.bufs.insert(name, Buffer::zeroed(dev, size)?);
        }
        Ok(self.bufs[name].ptr())
    }
}

fn dev_err(e: GpuError) -> ModelError {
    ModelError::Device(e.to_string())
}

fn upload_vec(dev: &Gpu, v: &[f32]) -> Result<Buffer> {
    Buffer::from_f32(dev, v)
}

impl GpuModel {
    /// Uploads a Qwen3.5 model (its weights as stored).
    pub fn from_qwen35(dev: &Gpu, m: &Qwen35) -> Result<GpuModel> {
        let c = &m.cfg;
        let mut layers = Vec::with_capacity(m.layers.len());
        for l in &m.layers {
            let mixer = match &l.mixer {
                Mixer::Attention(a) => MixerWeights::Attention(AttnWeights {
                    q: DeviceMatrix::upload(dev, &a.q_proj)?,
                    k: DeviceMatrix::upload(dev, &a.k_proj)?,
                    v: DeviceMatrix::upload(dev, &a.v_proj)?,
                    o: DeviceMatrix::upload(dev, &a.o_proj)?,
                    bias: None,
                    qk_norm: Some([upload_vec(dev, &a.q_norm)?, upload_vec(dev, &a.k_norm)?]),
                    gated: true,
                    rope: true,
                }),
                Mixer::DeltaNet(n) => {
                    let key_head: Vec<i32> = n.key_head.iter().map(|&h| h as i32).collect();
                    MixerWeights::DeltaNet(DeltaWeights {
                        qkv: DeviceMatrix::upload(dev, &n.in_proj_qkv)?,
                        z: DeviceMatrix::upload(dev, &n.in_proj_z)?,
                        b: DeviceMatrix::upload(dev, &n.in_proj_b)?,
                        a: DeviceMatrix::upload(dev, &n.in_proj_a)?,
                        out: DeviceMatrix::upload(dev, &n.out_proj)?,
                        conv: upload_vec(dev, &n.conv1d)?,
                        dt_bias: upload_vec(dev, &n.dt_bias)?,
                        neg_a: upload_vec(dev, &n.neg_a)?,
                        norm: upload_vec(dev, &n.norm)?,
                        key_head: Buffer::from_i32(dev, &key_head)?,
                    })
                }
            };
            layers.push(LayerWeights {
                attn_norm: upload_vec(dev, &l.input_norm)?,
                ffn_norm: upload_vec(dev, &l.post_attention_norm)?,
                mixer,
                gate: DeviceMatrix::upload(dev, &l.mlp.gate)?,
                up: DeviceMatrix::upload(dev, &l.mlp.up)?,
                down: DeviceMatrix::upload(dev, &l.mlp.down)?,
            });
        }
        let shape = Shape {
            d: c.hidden_size,
            vocab: c.vocab_size,
            ffn: c.intermediate_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            rot_dim: c.rotary_dim(),
            halves: true,
            eps: c.rms_norm_eps as f32,
            max_context: c.max_position_embeddings,
            hk: c.linear_num_key_heads,
            hv: c.linear_num_value_heads,
            dk: c.linear_key_head_dim,
            dv: c.linear_value_head_dim,
            conv_k: c.linear_conv_kernel_dim,
        };
        let head = m.lm_head.as_ref().map(|h| DeviceMatrix::upload(dev, h)).transpose()?;
        let kv_type = device_kv_type(m.kv_type(), shape.head_dim);
        GpuModel::assemble(
            dev,
            shape,
            DeviceMatrix::upload(dev, &m.embed_tokens)?,
            head,
            upload_vec(dev, &m.norm)?,
            layers,
            RopeTable::Qwen35(m.rope().clone()),
            kv_type,
        )
    }

    /// Uploads a llama-family model (Llama 2/3, SmolLM2/3, Phi-3, Mistral, Qwen2, Qwen3; its
    /// weights as stored).
    pub fn from_llama(dev: &Gpu, m: &Llama) -> Result<GpuModel> {
        let c = &m.cfg;
        if c.granite.is_some() {
            // The device graph has no place for Granite's four multipliers yet.
            return Err(GpuError::Unsupported(
                "Granite's multipliers do not run on a GPU yet; run it on the CPU".into(),
            ));
        }
        let mut layers = Vec::with_capacity(m.layers.len());
        for (li, l) in m.layers.iter().enumerate() {
            let bias = match &l.bias_qkv {
                Some([q, k, v]) => Some([upload_vec(dev, q)?, upload_vec(dev, k)?, upload_vec(dev, v)?]),
                None => None,
            };
            let qk_norm = match &l.qk_norm {
                Some([q, k]) => Some([upload_vec(dev, q)?, upload_vec(dev, k)?]),
                None => None,
            };
            layers.push(LayerWeights {
                attn_norm: upload_vec(dev, &l.attn_norm)?,
                ffn_norm: upload_vec(dev, &l.ffn_norm)?,
                mixer: MixerWeights::Attention(AttnWeights {
                    q: DeviceMatrix::upload(dev, &l.wq)?,
                    k: DeviceMatrix::upload(dev, &l.wk)?,
                    v: DeviceMatrix::upload(dev, &l.wv)?,
                    o: DeviceMatrix::upload(dev, &l.wo)?,
                    bias,
                    qk_norm,
                    gated: false,
                    rope: !c.nope_layers.contains(&li),
                }),
                gate: DeviceMatrix::upload(dev, &l.gate)?,
                up: DeviceMatrix::upload(dev, &l.up)?,
                down: DeviceMatrix::upload(dev, &l.down)?,
            });
        }
        let shape = Shape {
            d: c.hidden_size,
            vocab: c.vocab_size,
            ffn: c.intermediate_size,
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            rot_dim: c.rope_dim,
            halves: c.rope_style == RopeStyle::Halves,
            eps: c.rms_norm_eps,
            max_context: c.max_context,
            hk: 0,
            hv: 0,
            dk: 0,
            dv: 0,
            conv_k: 0,
        };
        let (theta_scale, freq_factors) = m.rope_parts();
        let rope =
            RopeTable::Llama { cfg: Box::new(c.clone()), theta_scale, freq_factors, temperature: c.attn_temperature };
        let head = m.output.as_ref().map(|h| DeviceMatrix::upload(dev, h)).transpose()?;
        let kv_type = device_kv_type(m.kv_type(), shape.head_dim);
        GpuModel::assemble(
            dev,
            shape,
            DeviceMatrix::upload(dev, &m.embed)?,
            head,
            upload_vec(dev, &m.norm)?,
            layers,
            rope,
            kv_type,
        )
    }

    /// Uploads whichever supported CPU model `m` is.
    pub fn from_cpu(dev: &Gpu, m: &dyn CausalLm) -> Result<GpuModel> {
        let any = m.as_any().ok_or_else(|| GpuError::Unsupported("this model cannot be moved to a GPU".into()))?;
        if let Some(q) = any.downcast_ref::<Qwen35>() {
            return GpuModel::from_qwen35(dev, q);
        }
        if let Some(l) = any.downcast_ref::<Llama>() {
            return GpuModel::from_llama(dev, l);
        }
        Err(GpuError::Unsupported("only Qwen3.5 and llama-family models run on a GPU".into()))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        dev: &Gpu,
        shape: Shape,
        embed: DeviceMatrix,
        head: Option<DeviceMatrix>,
        norm: Buffer,
        layers: Vec<LayerWeights>,
        rope: RopeTable,
        kv_type: KvType,
    ) -> Result<GpuModel> {
        let mut weight_bytes = embed.byte_len() + head.as_ref().map_or(0, DeviceMatrix::byte_len);
        for l in &layers {
            weight_bytes += l.gate.byte_len() + l.up.byte_len() + l.down.byte_len();
            weight_bytes += match &l.mixer {
                MixerWeights::Attention(a) => a.q.byte_len() + a.k.byte_len() + a.v.byte_len() + a.o.byte_len(),
                MixerWeights::DeltaNet(n) => {
                    n.qkv.byte_len() + n.z.byte_len() + n.b.byte_len() + n.a.byte_len() + n.out.byte_len()
                }
            };
        }
        Ok(GpuModel {
            dev: dev.clone(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            shape,
            embed,
            head,
            norm,
            layers,
            rope,
            kv_type,
            work: Mutex::new(Work::default()),
            weight_bytes,
        })
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// The device.
    pub fn device(&self) -> &Gpu {
        &self.dev
    }

    fn kv_dtype(&self) -> KvDtype {
        self.kv_type.into()
    }

    /// Whether the model has a full-attention layer (whose head_dim the block types need in
    /// whole blocks of 32).
    fn has_attention(&self) -> bool {
        self.layers.iter().any(|l| matches!(l.mixer, MixerWeights::Attention(_)))
    }

    fn new_state(&self) -> Result<SeqState> {
        let s = &self.shape;
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(match &l.mixer {
                MixerWeights::Attention(_) => LayerState::Attention {
                    kv: DeviceKv::new(&self.dev, self.kv_dtype(), s.kv_heads * s.head_dim, KV_START)?,
                    rows: 0,
                },
                MixerWeights::DeltaNet(_) => {
                    let conv_dim = 2 * s.hk * s.dk + s.hv * s.dv;
                    LayerState::Linear {
                        conv: Buffer::zeroed(&self.dev, (s.conv_k - 1) * conv_dim * 4)?,
                        state: Buffer::zeroed(&self.dev, s.hv * s.dk * s.dv * 4)?,
                    }
                }
            });
        }
        Ok(SeqState { dev: self.dev.clone(), model: self.id, head_dim: s.head_dim, layers })
    }

    /// `y[n, rows] = x[n, cols]·Wᵀ`; in pieces of at most [`GEMV_ROWS`] rows when `stepwise`.
    fn mm(&self, w: &DeviceMatrix, x: u64, y: u64, n: usize, stepwise: bool, mm: &mut MatmulScratch) -> Result<()> {
        if !stepwise || n <= GEMV_ROWS {
            return w.matmul(&self.dev, x, y, n, mm);
        }
        let mut r = 0;
        while r < n {
            let k = GEMV_ROWS.min(n - r);
            w.matmul(&self.dev, x + (r * w.cols * 4) as u64, y + (r * w.rows * 4) as u64, k, mm)?;
            r += k;
        }
        Ok(())
    }

    /// The forward over per-sequence segments: `segs[i]` runs its ids after its cache. Returns
    /// each segment's logits, every row's (`all`) or the last row's.
    fn run(
        &self,
        segs: &mut [(&[u32], &mut Cache)],
        stepwise: bool,
        all: bool,
    ) -> frognano_model::Result<Vec<Vec<f32>>> {
        let s = self.shape.clone();
        for (ids, cache) in segs.iter() {
            if ids.is_empty() {
                return Err(ModelError::Input("no input tokens".into()));
            }
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= s.vocab) {
                return Err(ModelError::Input(format!("token id {bad} is out of vocabulary (vocab_size {})", s.vocab)));
            }
            match cache.device.as_ref().and_then(|d| d.0.as_any().downcast_ref::<SeqState>()) {
                Some(st) if st.model == self.id => {}
                _ => return Err(ModelError::Input("cache belongs to a different model".into())),
            }
            if cache.pos + ids.len() > s.max_context {
                return Err(ModelError::Input(format!(
                    "{} tokens after {} would pass the model's context of {}",
                    ids.len(),
                    cache.pos,
                    s.max_context
                )));
            }
        }
        let mut work = self.work.lock().unwrap_or_else(|e| e.into_inner());
        self.run_on_device(segs, stepwise, all, &mut work).map_err(dev_err)
    }

    fn run_on_device(
        &self,
        segs: &mut [(&[u32], &mut Cache)],
        stepwise: bool,
        all: bool,
        w: &mut Work,
    ) -> Result<Vec<Vec<f32>>> {
        let dev = &self.dev;
        let s = &self.shape;
        let t: usize = segs.iter().map(|(ids, _)| ids.len()).sum();
        let (d, hq, hkv, dh) = (s.d, s.heads, s.kv_heads, s.head_dim);
        // Row r of the pass: its segment, and its position.
        let mut pos = Vec::with_capacity(t);
        let mut ids = Vec::with_capacity(t);
        for (seg_ids, cache) in segs.iter() {
            ids.extend(seg_ids.iter().map(|&i| i as i32));
            pos.extend((0..seg_ids.len()).map(|i| cache.pos + i));
        }
        let ids_buf = w.get(dev, "ids", t * 4)?;
        dev.upload(ids_buf, as_bytes_i32(&ids))?;
        let h = w.get(dev, "h", t * d * 4)?;
        let u = w.get(dev, "u", t * d * 4)?;
        let y = w.get(dev, "y", t * d * 4)?;
        self.embed.gather_rows(dev, ids_buf, h, t)?;
        // RoPE tables for every row: keys', and queries' (scaled by the attention temperature).
        let half = s.rot_dim / 2;
        let has_attention = self.layers.iter().any(|l| matches!(l.mixer, MixerWeights::Attention(_)));
        let (cs_k, cs_q) = if has_attention && half > 0 {
            let mut k_table = Vec::with_capacity(t * half * 2);
            for &p in &pos {
                k_table.extend(self.rope.pairs(p).into_iter().flat_map(|(c, sn)| [c, sn]));
            }
            let ck = w.get(dev, "cs_k", k_table.len() * 4)?;
            dev.upload(ck, crate::backend::bytemuck_f32(&k_table))?;
            // Queries share the keys' table unless a temperature scales them.
            let cq = match self.rope.temperature() {
                None => ck,
                Some(temp) => {
                    let mut q_table = k_table;
                    for (row, &p) in q_table.chunks_exact_mut(half * 2).zip(&pos) {
                        let scale = frognano_model::llama::attn_temperature(Some(temp), p);
                        row.iter_mut().for_each(|x| *x *= scale);
                    }
                    let cq = w.get(dev, "cs_q", q_table.len() * 4)?;
                    dev.upload(cq, crate::backend::bytemuck_f32(&q_table))?;
                    cq
                }
            };
            (ck, cq)
        } else {
            (0, 0)
        };
        for (li, layer) in self.layers.iter().enumerate() {
            kernels::rms_norm(dev, h, layer.attn_norm.ptr(), u, t, d, s.eps)?;
            match &layer.mixer {
                MixerWeights::Attention(a) => {
                    let q_width = hq * dh * if a.gated { 2 } else { 1 };
                    let qg = w.get(dev, "qg", t * q_width * 4)?;
                    let q = w.get(dev, "q", t * hq * dh * 4)?;
                    let gate = w.get(dev, "gate", t * hq * dh * 4)?;
                    let k = w.get(dev, "k", t * hkv * dh * 4)?;
                    let v = w.get(dev, "v", t * hkv * dh * 4)?;
                    let o = w.get(dev, "o", t * hq * dh * 4)?;
                    self.mm(&a.q, u, if a.gated { qg } else { q }, t, stepwise, &mut w.mm)?;
                    self.mm(&a.k, u, k, t, stepwise, &mut w.mm)?;
                    self.mm(&a.v, u, v, t, stepwise, &mut w.mm)?;
                    if let Some([bq, bk, bv]) = &a.bias {
                        kernels::add_bias(dev, q, bq.ptr(), t, hq * dh)?;
                        kernels::add_bias(dev, k, bk.ptr(), t, hkv * dh)?;
                        kernels::add_bias(dev, v, bv.ptr(), t, hkv * dh)?;
                    }
                    if a.gated {
                        kernels::split_halves(dev, qg, q, gate, t * hq, dh)?;
                    }
                    if let Some([qn, kn]) = &a.qk_norm {
                        kernels::rms_norm(dev, q, qn.ptr(), q, t * hq, dh, s.eps)?;
                        kernels::rms_norm(dev, k, kn.ptr(), k, t * hkv, dh, s.eps)?;
                    }
                    if half > 0 && a.rope {
                        attention::rope(dev, q, cs_q, t, hq, dh, s.rot_dim, s.halves)?;
                        attention::rope(dev, k, cs_k, t, hkv, dh, s.rot_dim, s.halves)?;
                    }
                    let scale = 1.0 / (dh as f32).sqrt();
                    let mut r0 = 0;
                    for (seg_ids, cache) in segs.iter_mut() {
                        let n = seg_ids.len();
                        let pos0 = cache.pos;
                        let LayerState::Attention { kv, rows } = &mut state_of(cache).layers[li] else {
                            unreachable!("layer kinds checked with the model id")
                        };
                        kv.reserve(dev, *rows, pos0 + n)?;
                        let (qo, ko) = ((r0 * hq * dh * 4) as u64, (r0 * hkv * dh * 4) as u64);
                        attention::kv_append(dev, kv, k + ko, v + ko, pos0, n)?;
                        *rows = pos0 + n;
                        if stepwise {
                            for i in 0..n {
                                let off = ((r0 + i) * hq * dh * 4) as u64;
                                attention::attention(
                                    dev,
                                    q + off,
                                    kv,
                                    o + off,
                                    1,
                                    pos0 + i,
                                    hq,
                                    hkv,
                                    dh,
                                    scale,
                                    &mut w.attn,
                                )?;
                            }
                        } else {
                            attention::attention(dev, q + qo, kv, o + qo, n, pos0, hq, hkv, dh, scale, &mut w.attn)?;
                        }
                        r0 += n;
                    }
                    if a.gated {
                        kernels::sigmoid_mul(dev, o, gate, t * hq * dh)?;
                    }
                    self.mm(&a.o, o, y, t, stepwise, &mut w.mm)?;
                }
                MixerWeights::DeltaNet(n) => {
                    let (hk, hv, dk, dv) = (s.hk, s.hv, s.dk, s.dv);
                    let conv_dim = 2 * hk * dk + hv * dv;
                    let mix = w.get(dev, "mix", t * conv_dim * 4)?;
                    let cy = w.get(dev, "conv_out", t * conv_dim * 4)?;
                    let z = w.get(dev, "z", t * hv * dv * 4)?;
                    let b = w.get(dev, "b", t * hv * 4)?;
                    let a = w.get(dev, "a", t * hv * 4)?;
                    let beta = w.get(dev, "beta", t * hv * 4)?;
                    let g = w.get(dev, "g", t * hv * 4)?;
                    let q = w.get(dev, "dq", t * hk * dk * 4)?;
                    let k = w.get(dev, "dk", t * hk * dk * 4)?;
                    let v = w.get(dev, "dv", t * hv * dv * 4)?;
                    let o = w.get(dev, "do", t * hv * dv * 4)?;
                    self.mm(&n.qkv, u, mix, t, stepwise, &mut w.mm)?;
                    self.mm(&n.z, u, z, t, stepwise, &mut w.mm)?;
                    self.mm(&n.b, u, b, t, stepwise, &mut w.mm)?;
                    self.mm(&n.a, u, a, t, stepwise, &mut w.mm)?;
                    let mut r0 = 0;
                    for (seg_ids, cache) in segs.iter_mut() {
                        let rows = seg_ids.len();
                        let LayerState::Linear { conv, .. } = &mut state_of(cache).layers[li] else {
                            unreachable!("layer kinds checked with the model id")
                        };
                        let piece = if stepwise { 1 } else { rows };
                        let mut i = 0;
                        while i < rows {
                            let off = ((r0 + i) * conv_dim * 4) as u64;
                            deltanet::conv1d_silu(
                                dev,
                                mix + off,
                                conv.ptr(),
                                n.conv.ptr(),
                                cy + off,
                                piece,
                                conv_dim,
                                s.conv_k,
                            )?;
                            i += piece;
                        }
                        r0 += rows;
                    }
                    deltanet::split_qkv(dev, cy, q, k, v, t, hk, hv, dk, dv)?;
                    deltanet::gates(dev, b, a, n.neg_a.ptr(), n.dt_bias.ptr(), beta, g, t, hv)?;
                    let mut r0 = 0;
                    for (seg_ids, cache) in segs.iter_mut() {
                        let rows = seg_ids.len();
                        let LayerState::Linear { state, .. } = &mut state_of(cache).layers[li] else {
                            unreachable!("layer kinds checked with the model id")
                        };
                        let piece = if stepwise { 1 } else { rows };
                        let mut i = 0;
                        while i < rows {
                            let r = r0 + i;
                            deltanet::delta_rule(
                                dev,
                                q + (r * hk * dk * 4) as u64,
                                k + (r * hk * dk * 4) as u64,
                                v + (r * hv * dv * 4) as u64,
                                g + (r * hv * 4) as u64,
                                beta + (r * hv * 4) as u64,
                                state.ptr(),
                                o + (r * hv * dv * 4) as u64,
                                n.key_head.ptr(),
                                piece,
                                hk,
                                hv,
                                dk,
                                dv,
                            )?;
                            i += piece;
                        }
                        r0 += rows;
                    }
                    deltanet::gated_rms_norm(dev, o, z, n.norm.ptr(), t * hv, dv, s.eps)?;
                    self.mm(&n.out, o, y, t, stepwise, &mut w.mm)?;
                }
            }
            kernels::add(dev, h, y, t * d)?;
            kernels::rms_norm(dev, h, layer.ffn_norm.ptr(), u, t, d, s.eps)?;
            let gbuf = w.get(dev, "mlp_g", t * s.ffn * 4)?;
            let ubuf = w.get(dev, "mlp_u", t * s.ffn * 4)?;
            self.mm(&layer.gate, u, gbuf, t, stepwise, &mut w.mm)?;
            self.mm(&layer.up, u, ubuf, t, stepwise, &mut w.mm)?;
            kernels::silu_mul(dev, gbuf, ubuf, t * s.ffn)?;
            self.mm(&layer.down, gbuf, y, t, stepwise, &mut w.mm)?;
            kernels::add(dev, h, y, t * d)?;
        }
        // The rows whose logits are wanted, gathered, normed and through the head.
        let mut rows_out = Vec::new();
        let mut r0 = 0;
        for (seg_ids, _) in segs.iter() {
            let n = seg_ids.len();
            if all {
                rows_out.extend(r0..r0 + n);
            } else {
                rows_out.push(r0 + n - 1);
            }
            r0 += n;
        }
        let m = rows_out.len();
        let sel = w.get(dev, "sel", m * d * 4)?;
        if m == t {
            // Every row (a prefill asking for all logits, or a decode step): normed in place.
            kernels::rms_norm(dev, h, self.norm.ptr(), sel, m, d, s.eps)?;
        } else {
            let idx: Vec<i32> = rows_out.iter().map(|&r| r as i32).collect();
            let rows_buf = w.get(dev, "sel_rows", m * 4)?;
            dev.upload(rows_buf, as_bytes_i32(&idx))?;
            kernels::gather_rows(dev, h, rows_buf, sel, m, d)?;
            kernels::rms_norm(dev, sel, self.norm.ptr(), sel, m, d, s.eps)?;
        }
        let logits = w.get(dev, "logits", m * s.vocab * 4)?;
        let head = self.head.as_ref().unwrap_or(&self.embed);
        self.mm(head, sel, logits, m, stepwise, &mut w.mm)?;
        let mut host = vec![0.0f32; m * s.vocab];
        dev.download(logits, as_bytes_f32_mut(&mut host))?;
        let mut out = Vec::with_capacity(segs.len());
        let mut at = 0;
        for (seg_ids, cache) in segs.iter_mut() {
            let rows = if all { seg_ids.len() } else { 1 };
            out.push(host[at * s.vocab..(at + rows) * s.vocab].to_vec());
            at += rows;
            cache.pos += seg_ids.len();
        }
        Ok(out)
    }
}

fn state_of(cache: &mut Cache) -> &mut SeqState {
    cache.device.as_mut().and_then(|d| d.0.as_any_mut().downcast_mut::<SeqState>()).expect("checked by GpuModel::run")
}

fn as_bytes_i32(v: &[i32]) -> &[u8] {
    // SAFETY: i32 has no padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn as_bytes_f32_mut(v: &mut [f32]) -> &mut [u8] {
    // SAFETY: f32 has no padding and every bit pattern is valid.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

impl CausalLm for GpuModel {
    fn vocab_size(&self) -> usize {
        self.shape.vocab
    }

    fn max_context(&self) -> usize {
        self.shape.max_context
    }

    fn new_cache(&self) -> Cache {
        // The trait has no error path here: running out of device memory for a new sequence
        // is reported by the forward that would use it.
        match self.new_state() {
            Ok(st) => Cache::on_device(Box::new(st)),
            Err(e) => panic!("cannot allocate a sequence's state on {}: {e}", self.dev.describe()),
        }
    }

    fn kv_type(&self) -> KvType {
        self.kv_type
    }

    fn set_kv_type(&mut self, ty: KvType) -> frognano_model::Result<()> {
        // Every attention layer has the shape's head_dim; the block types quantize each head in
        // whole blocks of 32, as the CPU path does (KvType::check_head_dim).
        if self.has_attention() {
            ty.check_head_dim(self.shape.head_dim)
                .map_err(|e| ModelError::Input(format!("{e}; on the GPU, f16 or f32 caches take any head_dim")))?;
        }
        self.kv_type = ty;
        Ok(())
    }

    fn cache_bytes(&self, tokens: usize) -> usize {
        let s = &self.shape;
        let full = self.layers.iter().filter(|l| matches!(l.mixer, MixerWeights::Attention(_))).count();
        let linear = self.layers.len() - full;
        let kv = 2 * full * tokens * self.kv_type.row_bytes(s.kv_heads * s.head_dim);
        let conv_dim = 2 * s.hk * s.dk + s.hv * s.dv;
        let state = s.conv_k.saturating_sub(1) * conv_dim + s.hv * s.dk * s.dv;
        kv + linear * state * 4
    }

    fn device_memory_free(&self) -> Option<u64> {
        self.dev.memory().map(|(free, _)| free as u64)
    }

    fn forward(&self, ids: &[u32], cache: &mut Cache, all_logits: bool) -> frognano_model::Result<Vec<f32>> {
        Ok(self.run(&mut [(ids, cache)], false, all_logits)?.remove(0))
    }

    fn forward_batch(&self, batch: &mut [(u32, &mut Cache)]) -> frognano_model::Result<Vec<Vec<f32>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<[u32; 1]> = batch.iter().map(|(id, _)| [*id]).collect();
        let mut segs: Vec<(&[u32], &mut Cache)> =
            ids.iter().zip(batch.iter_mut()).map(|(id, (_, c))| (&id[..], &mut **c)).collect();
        self.run(&mut segs, false, false)
    }

    fn forward_stepwise(&self, ids: &[u32], cache: &mut Cache) -> frognano_model::Result<Vec<f32>> {
        Ok(self.run(&mut [(ids, cache)], true, true)?.remove(0))
    }

    fn forward_batch_stepwise(&self, batch: &mut [(&[u32], &mut Cache)]) -> frognano_model::Result<Vec<Vec<f32>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        self.run(batch, true, true)
    }
}

/// One sequence's state on the device: per layer, keys and values (with the rows written) or
/// the conv window and recurrent state.
pub struct SeqState {
    dev: Gpu,
    model: u64,
    /// Values per head of the attention layers (for the layout a CPU cache would have).
    head_dim: usize,
    layers: Vec<LayerState>,
}

enum LayerState {
    Attention { kv: DeviceKv, rows: usize },
    Linear { conv: Buffer, state: Buffer },
}

impl std::fmt::Debug for SeqState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SeqState({} layers on {})", self.layers.len(), self.dev.describe())
    }
}

/// A [`SeqState`]'s recurrent states, copied ([`DeviceState::save`]).
pub struct SavedState {
    model: u64,
    linear: Vec<Option<(Buffer, Buffer)>>,
}

impl std::fmt::Debug for SavedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SavedState({} layers)", self.linear.len())
    }
}

/// A device operation inside a trait method with no error path: a failure here is an
/// exhausted or lost device, which no caller can go on from.
fn must<T>(r: Result<T>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what} on the GPU failed: {e}"))
}

impl DeviceState for SeqState {
    fn duplicate(&self) -> Box<dyn DeviceState> {
        let layers = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Attention { kv, rows } => LayerState::Attention {
                    kv: must(kv.duplicate(&self.dev, *rows), "copying a KV cache"),
                    rows: *rows,
                },
                LayerState::Linear { conv, state } => LayerState::Linear {
                    conv: must(conv.duplicate(), "copying a conv state"),
                    state: must(state.duplicate(), "copying a recurrent state"),
                },
            })
            .collect();
        Box::new(SeqState { dev: self.dev.clone(), model: self.model, head_dim: self.head_dim, layers })
    }

    fn save(&self) -> Box<dyn DeviceState> {
        let linear = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Attention { .. } => None,
                LayerState::Linear { conv, state } => Some((
                    must(conv.duplicate(), "saving a conv state"),
                    must(state.duplicate(), "saving a recurrent state"),
                )),
            })
            .collect();
        Box::new(SavedState { model: self.model, linear })
    }

    fn restore(&mut self, snap: &dyn DeviceState, pos: usize) -> std::result::Result<(), String> {
        let Some(saved) = snap.as_any().downcast_ref::<SavedState>() else {
            return Err("snapshot of another kind of cache".into());
        };
        if saved.model != self.model || saved.linear.len() != self.layers.len() {
            return Err("snapshot of another model's cache".into());
        }
        for (l, s) in self.layers.iter_mut().zip(&saved.linear) {
            match (l, s) {
                (LayerState::Attention { rows, .. }, None) => *rows = (*rows).min(pos),
                (LayerState::Linear { conv, state }, Some((c, st))) => {
                    self.dev.copy(conv.ptr(), c.ptr(), c.len()).map_err(|e| e.to_string())?;
                    self.dev.copy(state.ptr(), st.ptr(), st.len()).map_err(|e| e.to_string())?;
                }
                _ => return Err("snapshot layout does not match the cache".into()),
            }
        }
        Ok(())
    }

    fn is_rewindable(&self) -> bool {
        self.layers.iter().all(|l| matches!(l, LayerState::Attention { .. }))
    }

    fn truncate(&mut self, pos: usize) -> std::result::Result<(), String> {
        for l in &mut self.layers {
            match l {
                LayerState::Attention { rows, .. } => *rows = (*rows).min(pos),
                LayerState::Linear { .. } => return Err("a recurrent state cannot be cut back".into()),
            }
        }
        Ok(())
    }

    fn byte_len(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attention { kv, .. } => kv.byte_len(),
                LayerState::Linear { conv, state } => conv.len() + state.len(),
            })
            .sum()
    }

    fn layout(&self) -> Vec<LayerLayout> {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attention { kv, .. } => LayerLayout::Attention {
                    kv_type: KvType::from(kv.dtype()).to_string(),
                    width: kv.width(),
                    head_dim: self.head_dim,
                },
                LayerState::Linear { conv, state } => {
                    LayerLayout::Linear { conv: conv.len() / 4, state: state.len() / 4 }
                }
            })
            .collect()
    }

    fn to_host(&self, pos: usize) -> Vec<LayerCache> {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attention { kv, rows } => {
                    let rows = (*rows).min(pos);
                    let (kb, vb) = must(kv.download_raw(rows), "copying keys and values to the host");
                    let ty = KvType::from(kv.dtype());
                    let (mut k, mut v) =
                        (KvRows::new(ty, kv.width(), self.head_dim), KvRows::new(ty, kv.width(), self.head_dim));
                    k.push_raw(&kb).expect("rows of the cache's own type");
                    v.push_raw(&vb).expect("rows of the cache's own type");
                    LayerCache::Attention { k, v }
                }
                LayerState::Linear { conv, state } => LayerCache::Linear {
                    conv: must(conv.to_f32(), "copying a conv state to the host"),
                    state: must(state.to_f32(), "copying a recurrent state to the host"),
                },
            })
            .collect()
    }

    fn load_host(&mut self, layers: &[LayerCache], pos: usize) -> std::result::Result<(), String> {
        if layers.len() != self.layers.len() {
            return Err(format!("{} saved layers for a model of {}", layers.len(), self.layers.len()));
        }
        for (i, (l, h)) in self.layers.iter_mut().zip(layers).enumerate() {
            match (l, h) {
                (LayerState::Attention { kv, rows }, LayerCache::Attention { k, v }) => {
                    if k.len() != pos
                        || v.len() != pos
                        || k.width() != kv.width()
                        || KvType::from(kv.dtype()) != k.kv_type()
                    {
                        return Err(format!("layer {i}: saved keys and values do not fit this cache"));
                    }
                    // Room to go on without moving the cache at the next token.
                    kv.reserve(&self.dev, 0, pos + (pos / 4).max(256)).map_err(|e| e.to_string())?;
                    self.dev.upload(kv.k_ptr(), k.raw_rows(0..pos)).map_err(|e| e.to_string())?;
                    self.dev.upload(kv.v_ptr(), v.raw_rows(0..pos)).map_err(|e| e.to_string())?;
                    *rows = pos;
                }
                (LayerState::Linear { conv, state }, LayerCache::Linear { conv: c, state: s }) => {
                    if c.len() * 4 != conv.len() || s.len() * 4 != state.len() {
                        return Err(format!("layer {i}: saved recurrent state of the wrong size"));
                    }
                    conv.write_f32(c).map_err(|e| e.to_string())?;
                    state.write_f32(s).map_err(|e| e.to_string())?;
                }
                _ => return Err(format!("layer {i}: saved layer of another kind")),
            }
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl DeviceState for SavedState {
    fn duplicate(&self) -> Box<dyn DeviceState> {
        let linear = self
            .linear
            .iter()
            .map(|l| {
                l.as_ref().map(|(c, s)| {
                    (must(c.duplicate(), "copying a snapshot"), must(s.duplicate(), "copying a snapshot"))
                })
            })
            .collect();
        Box::new(SavedState { model: self.model, linear })
    }

    fn save(&self) -> Box<dyn DeviceState> {
        self.duplicate()
    }

    fn restore(&mut self, _snap: &dyn DeviceState, _pos: usize) -> std::result::Result<(), String> {
        Err("a snapshot is not a cache".into())
    }

    fn is_rewindable(&self) -> bool {
        self.linear.iter().all(Option::is_none)
    }

    fn truncate(&mut self, _pos: usize) -> std::result::Result<(), String> {
        Err("a snapshot is not a cache".into())
    }

    fn byte_len(&self) -> usize {
        self.linear.iter().flatten().map(|(c, s)| c.len() + s.len()).sum()
    }

    fn layout(&self) -> Vec<LayerLayout> {
        Vec::new()
    }

    fn to_host(&self, _pos: usize) -> Vec<LayerCache> {
        Vec::new()
    }

    fn load_host(&mut self, _layers: &[LayerCache], _pos: usize) -> std::result::Result<(), String> {
        Err("a snapshot is not a cache".into())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}
