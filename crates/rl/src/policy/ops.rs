//! Differentiable building blocks of the policy networks, written with candle ops that
//! back-propagate. Every function works in the dtype of its input (f32 in training, f64 in
//! the gradient checks); constants (RoPE tables, masks) are made in that dtype.
//!
//! Shapes use `n` for tokens of one sequence; all functions are for one sequence (no batch
//! dimension).

use candle_core::{DType, Device, Result, Tensor, D};

/// `x · Wᵀ` for `x` `[n, in]` and a PyTorch-layout weight `w` `[out, in]`.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.matmul(&w.t()?)
}

/// RMSNorm over the last dimension: `x · rsqrt(mean(x²) + eps) · scale`. Zero-centred norms
/// pass `scale = 1 + w`.
pub fn rms_norm(x: &Tensor, scale: &Tensor, eps: f64) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (ms + eps)?.sqrt()?.recip()?;
    x.broadcast_mul(&inv)?.broadcast_mul(scale)
}

/// `x · rsqrt(Σx² + eps)` over the last dimension (the DeltaNet q/k normalisation).
pub fn l2_normalize(x: &Tensor, eps: f64) -> Result<Tensor> {
    let ss = x.sqr()?.sum_keepdim(D::Minus1)?;
    x.broadcast_mul(&(ss + eps)?.sqrt()?.recip()?)
}

/// Logistic sigmoid `1 / (1 + e^(−x))`.
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    (x.neg()?.exp()? + 1.0)?.recip()
}

/// Softplus `ln(1 + eˣ)`, written as `max(x, 0) + ln(1 + e^(−|x|))` so that it neither
/// overflows nor loses its gradient for large `x` (equal to PyTorch's thresholded softplus to
/// within f32 rounding).
pub fn softplus(x: &Tensor) -> Result<Tensor> {
    x.relu()? + (x.abs()?.neg()?.exp()? + 1.0)?.log()?
}

/// Per-position rotation tables for rotate-half RoPE: `(cos, sin)`, each `[n, rotary_dim/2]`,
/// for positions `0..n`, with `inv_freq[j] = 1 / theta^(2j/R)` and the angle computed in f32
/// (as transformers does), then converted to `dtype`.
pub fn rope_tables(n: usize, rotary_dim: usize, theta: f64, dtype: DType, dev: &Device) -> Result<(Tensor, Tensor)> {
    let half = rotary_dim / 2;
    let inv: Vec<f32> = (0..half).map(|j| 1.0 / (theta as f32).powf((2 * j) as f32 / rotary_dim as f32)).collect();
    let mut cos = Vec::with_capacity(n * half);
    let mut sin = Vec::with_capacity(n * half);
    for p in 0..n {
        for f in &inv {
            let a = p as f32 * f;
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
    let cos = Tensor::from_vec(cos, (n, half), dev)?.to_dtype(dtype)?;
    let sin = Tensor::from_vec(sin, (n, half), dev)?.to_dtype(dtype)?;
    Ok((cos, sin))
}

/// Rotate-half (NeoX / Hugging Face) RoPE on the first `2·cos.dim(1)` dims of every head of
/// `x` `[heads, n, dh]`; the remaining dims pass through. With `a, b` the two halves of the
/// rotated part: `(a·cos − b·sin, b·cos + a·sin)`.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let dh = x.dim(2)?;
    let half = cos.dim(1)?;
    let a = x.narrow(2, 0, half)?;
    let b = x.narrow(2, half, half)?;
    let ra = (a.broadcast_mul(cos)? - b.broadcast_mul(sin)?)?;
    let rb = (b.broadcast_mul(cos)? + a.broadcast_mul(sin)?)?;
    if 2 * half == dh {
        Tensor::cat(&[ra, rb], 2)
    } else {
        Tensor::cat(&[ra, rb, x.narrow(2, 2 * half, dh - 2 * half)?], 2)
    }
}

/// `[n, n]` additive causal mask: 0 where key ≤ query, −∞ above the diagonal.
fn causal_mask(n: usize, dtype: DType, dev: &Device) -> Result<Tensor> {
    let v: Vec<f32> = (0..n * n).map(|i| if i % n > i / n { f32::NEG_INFINITY } else { 0.0 }).collect();
    Tensor::from_vec(v, (n, n), dev)?.to_dtype(dtype)
}

/// Softmax over the last dimension (the max is subtracted as a constant: the result does not
/// depend on it, so its gradient is not needed).
pub fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let m = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&m)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// Causal grouped-query attention for one sequence: `q` `[hq, n, dh]`, `k`, `v` `[hkv, n, dh]`
/// (query head `h` reads KV head `h / (hq/hkv)`), scale `1/√dh`. Returns `[n, hq·dh]`.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (hq, n, dh) = q.dims3()?;
    let hkv = k.dim(0)?;
    let group = hq / hkv;
    let expand = |t: &Tensor| -> Result<Tensor> {
        if group == 1 {
            t.contiguous()
        } else {
            t.unsqueeze(1)?.broadcast_as((hkv, group, n, dh))?.contiguous()?.reshape((hq, n, dh))
        }
    };
    let (k, v) = (expand(k)?, expand(v)?);
    let scores = (q.contiguous()?.matmul(&k.t()?)? * (1.0 / (dh as f64).sqrt()))?;
    let scores = scores.broadcast_add(&causal_mask(n, q.dtype(), q.device())?)?;
    let p = softmax_last(&scores)?;
    p.matmul(&v.contiguous()?)?.transpose(0, 1)?.contiguous()?.reshape((n, hq * dh))
}

/// Causal depthwise conv1d (no bias) over `x` `[n, C]` with kernel `w` `[C, K]`, zero history:
/// `y[t, c] = Σ_j w[c, j] · x[t − (K−1) + j, c]` (`w[c, K−1]` multiplies the current token).
pub fn causal_conv1d(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (n, c) = x.dims2()?;
    let k = w.dim(1)?;
    let ext = if k > 1 {
        Tensor::cat(&[Tensor::zeros((k - 1, c), x.dtype(), x.device())?, x.clone()], 0)?
    } else {
        x.clone()
    };
    let mut y: Option<Tensor> = None;
    for j in 0..k {
        let term = ext.narrow(0, j, n)?.broadcast_mul(&w.narrow(1, j, 1)?.t()?)?;
        y = Some(match y {
            None => term,
            Some(acc) => (acc + term)?,
        });
    }
    y.ok_or_else(|| candle_core::Error::Msg("conv kernel has no taps".into()))
}

/// The gated delta rule as its recurrence over tokens, per value head, from a zero state:
///
/// ```text
/// S = exp(g_t)·S;  δ = β_t·(v_t − k_tᵀS);  S += k_t ⊗ δ;  o_t = q_tᵀ S
/// ```
///
/// `q`, `k` `[hv, n, dk]` (already expanded to value heads, normalised, q scaled), `v`
/// `[hv, n, dv]`, `g` (log decay) and `beta` `[hv, n]`. Returns `[n, hv, dv]`.
pub fn delta_rule(q: &Tensor, k: &Tensor, v: &Tensor, g: &Tensor, beta: &Tensor) -> Result<Tensor> {
    let (hv, n, dk) = q.dims3()?;
    let dv = v.dim(2)?;
    let alpha = g.exp()?;
    let mut s = Tensor::zeros((hv, dk, dv), q.dtype(), q.device())?;
    let mut outs = Vec::with_capacity(n);
    for t in 0..n {
        let qt = q.narrow(1, t, 1)?; // [hv, 1, dk]
        let kt = k.narrow(1, t, 1)?;
        let vt = v.narrow(1, t, 1)?; // [hv, 1, dv]
        let at = alpha.narrow(1, t, 1)?.unsqueeze(2)?; // [hv, 1, 1]
        let bt = beta.narrow(1, t, 1)?.unsqueeze(2)?;
        s = s.broadcast_mul(&at)?;
        let pred = kt.matmul(&s)?; // [hv, 1, dv]
        let delta = (vt - pred)?.broadcast_mul(&bt)?;
        s = (s + kt.transpose(1, 2)?.matmul(&delta)?)?;
        outs.push(qt.matmul(&s)?); // [hv, 1, dv]
    }
    Tensor::cat(&outs, 1)?.transpose(0, 1)?.contiguous()
}

/// `log softmax(logits)[i, targets[i]]` for `logits` `[n, V]`: shape `[n]`.
pub fn gather_logprobs(logits: &Tensor, targets: &[u32]) -> Result<Tensor> {
    let n = logits.dim(0)?;
    let m = logits.max_keepdim(D::Minus1)?.detach();
    let lse = (logits.broadcast_sub(&m)?.exp()?.sum_keepdim(D::Minus1)?.log()? + &m)?;
    let idx = Tensor::from_slice(targets, (n, 1), logits.device())?;
    (logits.gather(&idx, 1)? - lse)?.squeeze(1)
}
