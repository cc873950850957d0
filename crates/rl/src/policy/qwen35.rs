//! Qwen3.5 (`qwen3_5` / `qwen3_5_text`) in candle, differentiable, computing what
//! `frognano_model::qwen35` computes (docs/model.md §3) in f32: zero-centred RMSNorms
//! (`1 + w`), gated full attention (per-head `[query | gate]` interleave, q/k norms, partial
//! rotate-half RoPE), Gated DeltaNet (causal depthwise conv + SiLU, l2-normalised q/k, decay
//! `g = −exp(A_log)·softplus(a + dt_bias)`, `β = σ(b)`, the delta rule in its chunked form
//! so the autograd graph keeps one state per 64 tokens, gated RMSNorm), SwiGLU MLPs, written
//! as stages ([`embed`], [`layer`], [`head`]) so the policy can back-propagate one layer at a
//! time. Weights keep their Hugging Face names and values; names, shapes and the conversions
//! of stored values come from frognano-model's [`Qwen35Map`].

use candle_core::{Result, Tensor};
use frognano_model::config::Qwen35Config;
use frognano_model::kernels::Act;
use frognano_model::qwen35::{AttentionMap, DeltaNetMap, MixerMap, Qwen35, Qwen35Map};
use frognano_model::weights::{HeadOrder, LM_HEAD};

use super::io::MergedWeights;
use super::ops;
use super::store::Store;

/// Tokens per chunk of the delta rule (as transformers and frognano-model's prefill).
const DELTA_CHUNK: usize = 64;

/// The weight map of a policy over `st` (with `lm_head.weight` when the store has one).
pub(crate) fn weight_map(c: &Qwen35Config, has_lm_head: bool) -> Qwen35Map {
    Qwen35Map::new(c, has_lm_head)
}

/// Gated full attention of one layer over `x` `[n, d]`.
fn attention(c: &Qwen35Config, st: &Store, a: &AttentionMap, x: &Tensor, rope: &(Tensor, Tensor)) -> Result<Tensor> {
    let n = x.dim(0)?;
    let (hq, hkv, dh) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    let eps = c.rms_norm_eps;
    let qg = st.linear(x, a.q_proj.module())?.reshape((n, hq, 2 * dh))?;
    let q = qg.narrow(2, 0, dh)?;
    let gate = qg.narrow(2, dh, dh)?.contiguous()?.reshape((n, hq * dh))?;
    let q = ops::rms_norm(&q, &st.model_form(&a.q_norm)?, eps)?;
    let k = st.linear(x, a.k_proj.module())?.reshape((n, hkv, dh))?;
    let k = ops::rms_norm(&k, &st.model_form(&a.k_norm)?, eps)?;
    let v = st.linear(x, a.v_proj.module())?.reshape((n, hkv, dh))?.transpose(0, 1)?;
    let q = ops::rope(&q.transpose(0, 1)?, &rope.0, &rope.1)?;
    let k = ops::rope(&k.transpose(0, 1)?, &rope.0, &rope.1)?;
    let o = ops::causal_attention(&q, &k, &v)?;
    st.linear(&(o * ops::sigmoid(&gate)?)?, a.o_proj.module())
}

/// Gated DeltaNet of one layer over `x` `[n, d]`, from empty conv and recurrent state.
fn delta_net(c: &Qwen35Config, st: &Store, w: &DeltaNetMap, x: &Tensor) -> Result<Tensor> {
    let n = x.dim(0)?;
    let (hk, hv, dk, dv) =
        (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim);
    let (key_dim, conv_dim, kk) = (c.key_dim(), c.conv_dim(), c.linear_conv_kernel_dim);
    let mix = st.linear(x, w.in_proj_qkv.module())?;
    let z = st.linear(x, w.in_proj_z.module())?.reshape((n, hv, dv))?;
    let b = st.linear(x, w.in_proj_b.module())?;
    let a = st.linear(x, w.in_proj_a.module())?;
    let kernel = st.model_form(&w.conv1d)?.reshape((conv_dim, kk))?;
    let conv = ops::causal_conv1d(&mix, &kernel)?.silu()?;
    // The policy holds Hugging Face weights: value heads grouped over the key heads.
    let key_head: Vec<u32> = HeadOrder::Grouped.key_heads(hv, hk).into_iter().map(|h| h as u32).collect();
    let key_head = Tensor::from_vec(key_head, hv, x.device())?;
    let heads = |t: Tensor, count: usize, dim: usize| -> Result<Tensor> { t.contiguous()?.reshape((n, count, dim)) };
    let q = heads(conv.narrow(1, 0, key_dim)?, hk, dk)?;
    let k = heads(conv.narrow(1, key_dim, key_dim)?, hk, dk)?;
    let v = heads(conv.narrow(1, 2 * key_dim, hv * dv)?, hv, dv)?;
    let q = (ops::l2_normalize(&q, 1e-6)? * (1.0 / (dk as f64).sqrt()))?.index_select(&key_head, 1)?;
    let k = ops::l2_normalize(&k, 1e-6)?.index_select(&key_head, 1)?;
    let beta = ops::sigmoid(&b)?;
    let neg_a = st.model_form(&w.a_log)?;
    let g = ops::softplus(&a.broadcast_add(&st.model_form(&w.dt_bias)?)?)?.broadcast_mul(&neg_a)?;
    let o = ops::delta_rule_chunked(
        &q.transpose(0, 1)?.contiguous()?,
        &k.transpose(0, 1)?.contiguous()?,
        &v.transpose(0, 1)?.contiguous()?,
        &g.t()?.contiguous()?,
        &beta.t()?.contiguous()?,
        DELTA_CHUNK,
    )?;
    // Gated RMSNorm per value head: norm · w, times silu(z).
    let y = (ops::rms_norm(&o, &st.model_form(&w.norm)?, c.rms_norm_eps)? * z.silu()?)?;
    st.linear(&y.reshape((n, hv * dv))?, w.out_proj.module())
}

/// What the stages of one forward pass share: the weight map and the RoPE tables for `n`
/// tokens.
pub(crate) struct Pass {
    map: Qwen35Map,
    rope: (Tensor, Tensor),
}

impl Pass {
    /// The pass over `n` tokens.
    pub fn new(c: &Qwen35Config, st: &Store, n: usize) -> Result<Pass> {
        let rope = ops::rope_tables(n, c.rotary_dim(), c.rope_theta, st.compute, &candle_core::Device::Cpu)?;
        Ok(Pass { map: weight_map(c, st.contains(LM_HEAD)), rope })
    }

    /// Decoder layers.
    pub fn layers(&self) -> usize {
        self.map.layers.len()
    }
}

/// The token embeddings `[n, d]` of `ids`.
pub(crate) fn embed(pass: &Pass, st: &Store, ids: &Tensor) -> Result<Tensor> {
    st.get(&pass.map.embed_tokens.name)?.index_select(ids, 0)
}

/// Decoder layer `i` (token mixer, then MLP) over the residual stream `h` `[n, d]`.
pub(crate) fn layer(c: &Qwen35Config, pass: &Pass, st: &Store, i: usize, h: &Tensor) -> Result<Tensor> {
    let l = &pass.map.layers[i];
    let eps = c.rms_norm_eps;
    let x = ops::rms_norm(h, &st.model_form(&l.input_norm)?, eps)?;
    let u = match &l.mixer {
        MixerMap::Attention(a) => attention(c, st, a, &x, &pass.rope)?,
        MixerMap::DeltaNet(w) => delta_net(c, st, w, &x)?,
    };
    let h = (h + u)?;
    let x = ops::rms_norm(&h, &st.model_form(&l.post_attention_norm)?, eps)?;
    let g = st.linear(&x, l.mlp.gate.module())?.silu()?;
    let u = st.linear(&x, l.mlp.up.module())?;
    h + st.linear(&(g * u)?, l.mlp.down.module())?
}

/// Logits `[n, vocab]` of the final residual stream `h` `[n, d]`.
pub(crate) fn head(c: &Qwen35Config, pass: &Pass, st: &Store, h: &Tensor) -> Result<Tensor> {
    let x = ops::rms_norm(h, &st.model_form(&pass.map.norm)?, c.rms_norm_eps)?;
    match &pass.map.lm_head {
        Some(head) => st.linear(&x, head.module()),
        None => st.matmul_weight(&x, &pass.map.embed_tokens.name),
    }
}

/// Logits `[n, vocab]` (compute dtype) of the Qwen3.5 network over `ids`.
pub(crate) fn logits(c: &Qwen35Config, st: &Store, ids: &Tensor) -> Result<Tensor> {
    let pass = Pass::new(c, st, ids.dim(0)?)?;
    let mut h = embed(&pass, st, ids)?;
    for i in 0..pass.layers() {
        h = layer(c, &pass, st, i, &h)?;
    }
    head(c, &pass, st, &h)
}

/// frognano-model's inference Qwen3.5 over the current (LoRA-merged) weights, computing in
/// f32 whatever the storage dtype.
pub(crate) fn inference_model(c: &Qwen35Config, st: &Store) -> anyhow::Result<Qwen35> {
    Ok(Qwen35::load(c.clone(), &MergedWeights(st), Some(Act::F32))?)
}
