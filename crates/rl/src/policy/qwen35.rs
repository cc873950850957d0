//! Qwen3.5 (`qwen3_5` / `qwen3_5_text`) in candle, differentiable, computing what
//! `frognano_model::qwen35` computes (shared/docs/qwen35.md §3) in f32: zero-centred RMSNorms
//! (`1 + w`), gated full attention (per-head `[query | gate]` interleave, q/k norms, partial
//! rotate-half RoPE), Gated DeltaNet (causal depthwise conv + SiLU, l2-normalised q/k, decay
//! `g = −exp(A_log)·softplus(a + dt_bias)`, `β = σ(b)`, the delta rule in its chunked form
//! so the autograd graph keeps one state per 64 tokens, gated RMSNorm), SwiGLU MLPs. Weights keep their Hugging Face names and values.

use candle_core::{Result, Tensor};
use frognano_model::config::{LayerType, Qwen35Config};
use frognano_model::kernels::Act;
use frognano_model::qwen35::{GatedAttention, GatedDeltaNet, Layer, Mixer, Mlp, Qwen35};

use super::ops;
use super::store::Store;

/// Tokens per chunk of the delta rule (as transformers and frognano-model's prefill).
const DELTA_CHUNK: usize = 64;

/// Every weight name with its shape, in checkpoint order (canonical `model.` prefix).
pub(crate) fn weight_shapes(c: &Qwen35Config) -> Vec<(String, Vec<usize>)> {
    let d = c.hidden_size;
    let mut v = vec![("model.embed_tokens.weight".to_string(), vec![c.vocab_size, d])];
    for (i, ty) in c.layer_types.iter().enumerate() {
        let p = |n: &str| format!("model.layers.{i}.{n}");
        v.push((p("input_layernorm.weight"), vec![d]));
        match ty {
            LayerType::Full => {
                let (hq, hkv, dh) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
                v.push((p("self_attn.q_proj.weight"), vec![hq * 2 * dh, d]));
                v.push((p("self_attn.k_proj.weight"), vec![hkv * dh, d]));
                v.push((p("self_attn.v_proj.weight"), vec![hkv * dh, d]));
                v.push((p("self_attn.o_proj.weight"), vec![d, hq * dh]));
                v.push((p("self_attn.q_norm.weight"), vec![dh]));
                v.push((p("self_attn.k_norm.weight"), vec![dh]));
            }
            LayerType::Linear => {
                let (hv, dv, k) = (c.linear_num_value_heads, c.linear_value_head_dim, c.linear_conv_kernel_dim);
                v.push((p("linear_attn.in_proj_qkv.weight"), vec![c.conv_dim(), d]));
                v.push((p("linear_attn.in_proj_z.weight"), vec![hv * dv, d]));
                v.push((p("linear_attn.in_proj_b.weight"), vec![hv, d]));
                v.push((p("linear_attn.in_proj_a.weight"), vec![hv, d]));
                v.push((p("linear_attn.conv1d.weight"), vec![c.conv_dim(), 1, k]));
                v.push((p("linear_attn.dt_bias"), vec![hv]));
                v.push((p("linear_attn.A_log"), vec![hv]));
                v.push((p("linear_attn.norm.weight"), vec![dv]));
                v.push((p("linear_attn.out_proj.weight"), vec![d, hv * dv]));
            }
        }
        v.push((p("post_attention_layernorm.weight"), vec![d]));
        v.push((p("mlp.gate_proj.weight"), vec![c.intermediate_size, d]));
        v.push((p("mlp.up_proj.weight"), vec![c.intermediate_size, d]));
        v.push((p("mlp.down_proj.weight"), vec![d, c.intermediate_size]));
    }
    v.push(("model.norm.weight".to_string(), vec![d]));
    v
}

/// Canonical names of the linear modules LoRA can adapt.
pub(crate) fn linear_modules(c: &Qwen35Config) -> Vec<String> {
    let mut v = Vec::new();
    for (i, ty) in c.layer_types.iter().enumerate() {
        let mods: &[&str] = match ty {
            LayerType::Full => &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"],
            LayerType::Linear => &[
                "linear_attn.in_proj_qkv",
                "linear_attn.in_proj_z",
                "linear_attn.in_proj_b",
                "linear_attn.in_proj_a",
                "linear_attn.out_proj",
            ],
        };
        for m in mods.iter().chain(&["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]) {
            v.push(format!("model.layers.{i}.{m}"));
        }
    }
    v
}

/// `rms_norm(x) · (1 + w)` with `w` the stored zero-centred weight `name`.
fn norm1p(st: &Store, x: &Tensor, name: &str, eps: f64) -> Result<Tensor> {
    ops::rms_norm(x, &(st.get(name)? + 1.0)?, eps)
}

/// Gated full attention of layer prefix `p` over `x` `[n, d]`.
fn attention(c: &Qwen35Config, st: &Store, p: &str, x: &Tensor, rope: &(Tensor, Tensor)) -> Result<Tensor> {
    let n = x.dim(0)?;
    let (hq, hkv, dh) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    let eps = c.rms_norm_eps;
    let qg = st.linear(x, &format!("{p}.self_attn.q_proj"))?.reshape((n, hq, 2 * dh))?;
    let q = qg.narrow(2, 0, dh)?;
    let gate = qg.narrow(2, dh, dh)?.contiguous()?.reshape((n, hq * dh))?;
    let q = norm1p(st, &q, &format!("{p}.self_attn.q_norm.weight"), eps)?;
    let k = st.linear(x, &format!("{p}.self_attn.k_proj"))?.reshape((n, hkv, dh))?;
    let k = norm1p(st, &k, &format!("{p}.self_attn.k_norm.weight"), eps)?;
    let v = st.linear(x, &format!("{p}.self_attn.v_proj"))?.reshape((n, hkv, dh))?.transpose(0, 1)?;
    let q = ops::rope(&q.transpose(0, 1)?, &rope.0, &rope.1)?;
    let k = ops::rope(&k.transpose(0, 1)?, &rope.0, &rope.1)?;
    let o = ops::causal_attention(&q, &k, &v)?;
    st.linear(&(o * ops::sigmoid(&gate)?)?, &format!("{p}.self_attn.o_proj"))
}

/// Gated DeltaNet of layer prefix `p` over `x` `[n, d]`, from empty conv and recurrent state.
fn delta_net(c: &Qwen35Config, st: &Store, p: &str, x: &Tensor) -> Result<Tensor> {
    let n = x.dim(0)?;
    let (hk, hv, dk, dv) =
        (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim);
    let (key_dim, conv_dim, kk) = (c.key_dim(), c.conv_dim(), c.linear_conv_kernel_dim);
    let w = |m: &str| format!("{p}.linear_attn.{m}");
    let mix = st.linear(x, &w("in_proj_qkv"))?;
    let z = st.linear(x, &w("in_proj_z"))?.reshape((n, hv, dv))?;
    let b = st.linear(x, &w("in_proj_b"))?;
    let a = st.linear(x, &w("in_proj_a"))?;
    let kernel = st.get(&w("conv1d.weight"))?.reshape((conv_dim, kk))?;
    let conv = ops::causal_conv1d(&mix, &kernel)?.silu()?;
    // Value head h reads key head h / (Hv/Hk) (grouped, as Hugging Face stores them).
    let r = hv / hk;
    let key_head: Vec<u32> = (0..hv).map(|h| (h / r) as u32).collect();
    let key_head = Tensor::from_vec(key_head, hv, x.device())?;
    let heads = |t: Tensor, count: usize, dim: usize| -> Result<Tensor> { t.contiguous()?.reshape((n, count, dim)) };
    let q = heads(conv.narrow(1, 0, key_dim)?, hk, dk)?;
    let k = heads(conv.narrow(1, key_dim, key_dim)?, hk, dk)?;
    let v = heads(conv.narrow(1, 2 * key_dim, hv * dv)?, hv, dv)?;
    let q = (ops::l2_normalize(&q, 1e-6)? * (1.0 / (dk as f64).sqrt()))?.index_select(&key_head, 1)?;
    let k = ops::l2_normalize(&k, 1e-6)?.index_select(&key_head, 1)?;
    let beta = ops::sigmoid(&b)?;
    let neg_a = st.get(&w("A_log"))?.exp()?.neg()?;
    let g = ops::softplus(&a.broadcast_add(&st.get(&w("dt_bias"))?)?)?.broadcast_mul(&neg_a)?;
    let o = ops::delta_rule_chunked(
        &q.transpose(0, 1)?.contiguous()?,
        &k.transpose(0, 1)?.contiguous()?,
        &v.transpose(0, 1)?.contiguous()?,
        &g.t()?.contiguous()?,
        &beta.t()?.contiguous()?,
        DELTA_CHUNK,
    )?;
    // Gated RMSNorm per value head: norm · w, times silu(z).
    let y = (ops::rms_norm(&o, &st.get(&w("norm.weight"))?, c.rms_norm_eps)? * z.silu()?)?;
    st.linear(&y.reshape((n, hv * dv))?, &w("out_proj"))
}

/// Logits `[n, vocab]` (compute dtype) of the Qwen3.5 network over `ids`.
pub(crate) fn logits(c: &Qwen35Config, st: &Store, ids: &Tensor) -> Result<Tensor> {
    let n = ids.dim(0)?;
    let eps = c.rms_norm_eps;
    let embed = st.get("model.embed_tokens.weight")?;
    let mut h = embed.index_select(ids, 0)?;
    let rope = ops::rope_tables(n, c.rotary_dim(), c.rope_theta, st.compute, ids.device())?;
    for (i, ty) in c.layer_types.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let x = norm1p(st, &h, &format!("{p}.input_layernorm.weight"), eps)?;
        let u = match ty {
            LayerType::Full => attention(c, st, &p, &x, &rope)?,
            LayerType::Linear => delta_net(c, st, &p, &x)?,
        };
        h = (h + u)?;
        let x = norm1p(st, &h, &format!("{p}.post_attention_layernorm.weight"), eps)?;
        let g = st.linear(&x, &format!("{p}.mlp.gate_proj"))?.silu()?;
        let u = st.linear(&x, &format!("{p}.mlp.up_proj"))?;
        h = (h + st.linear(&(g * u)?, &format!("{p}.mlp.down_proj"))?)?;
    }
    let x = norm1p(st, &h, "model.norm.weight", eps)?;
    if st.contains("lm_head.weight") {
        st.linear(&x, "lm_head")
    } else {
        st.matmul_weight(&x, "model.embed_tokens.weight")
    }
}

/// frognano-model's inference Qwen3.5 over the current (LoRA-merged) weights, computing in
/// f32 whatever the storage dtype.
pub(crate) fn inference_model(c: &Qwen35Config, st: &Store) -> anyhow::Result<Qwen35> {
    use super::io::{matrix, vector};
    let one_plus = |name: &str| -> anyhow::Result<Vec<f32>> { Ok(vector(st, name)?.iter().map(|w| 1.0 + w).collect()) };
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for (i, ty) in c.layer_types.iter().enumerate() {
        let p = |n: &str| format!("model.layers.{i}.{n}");
        let mixer = match ty {
            LayerType::Full => Mixer::Attention(GatedAttention {
                q_proj: matrix(st, &p("self_attn.q_proj.weight"))?,
                k_proj: matrix(st, &p("self_attn.k_proj.weight"))?,
                v_proj: matrix(st, &p("self_attn.v_proj.weight"))?,
                o_proj: matrix(st, &p("self_attn.o_proj.weight"))?,
                q_norm: one_plus(&p("self_attn.q_norm.weight"))?,
                k_norm: one_plus(&p("self_attn.k_norm.weight"))?,
            }),
            LayerType::Linear => {
                let r = c.linear_num_value_heads / c.linear_num_key_heads;
                Mixer::DeltaNet(GatedDeltaNet {
                    in_proj_qkv: matrix(st, &p("linear_attn.in_proj_qkv.weight"))?,
                    in_proj_z: matrix(st, &p("linear_attn.in_proj_z.weight"))?,
                    in_proj_b: matrix(st, &p("linear_attn.in_proj_b.weight"))?,
                    in_proj_a: matrix(st, &p("linear_attn.in_proj_a.weight"))?,
                    conv1d: vector(st, &p("linear_attn.conv1d.weight"))?,
                    dt_bias: vector(st, &p("linear_attn.dt_bias"))?,
                    neg_a: vector(st, &p("linear_attn.A_log"))?.iter().map(|a| -a.exp()).collect(),
                    norm: vector(st, &p("linear_attn.norm.weight"))?,
                    out_proj: matrix(st, &p("linear_attn.out_proj.weight"))?,
                    key_head: (0..c.linear_num_value_heads).map(|v| v / r).collect(),
                })
            }
        };
        layers.push(Layer {
            input_norm: one_plus(&p("input_layernorm.weight"))?,
            post_attention_norm: one_plus(&p("post_attention_layernorm.weight"))?,
            mixer,
            mlp: Mlp {
                gate: matrix(st, &p("mlp.gate_proj.weight"))?,
                up: matrix(st, &p("mlp.up_proj.weight"))?,
                down: matrix(st, &p("mlp.down_proj.weight"))?,
            },
        });
    }
    let lm_head = if st.contains("lm_head.weight") { Some(matrix(st, "lm_head.weight")?) } else { None };
    Ok(Qwen35::new(
        c.clone(),
        matrix(st, "model.embed_tokens.weight")?,
        lm_head,
        layers,
        one_plus("model.norm.weight")?,
        Act::F32,
    ))
}
