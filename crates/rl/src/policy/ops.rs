//! Differentiable building blocks of the policy networks, written with candle ops that
//! back-propagate. Every function works in the dtype of its input (f32 in training, f64 in
//! the gradient checks); constants (RoPE tables, masks) are made in that dtype.
//!
//! Shapes use `n` for tokens of one sequence; all functions are for one sequence (no batch
//! dimension).

use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Storage, Tensor, D};

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

/// Softmax over the last dimension (the max is subtracted as a constant: the result does not
/// depend on it, so its gradient is not needed).
pub fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let m = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&m)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// Causal grouped-query attention for one sequence: `q` `[hq, n, dh]`, `k`, `v` `[hkv, n, dh]`
/// (query head `h` reads KV head `h / (hq/hkv)`), scale `1/√dh`. Returns `[n, hq·dh]`.
///
/// Computed by [`BlockedAttention`] in blocks of [`ATTENTION_BLOCK`] queries, each against the
/// keys up to its last position: memory `O(heads·block·n)` instead of the `[heads, n, n]`
/// scores (and their softmax, mask and gradients) that the autograd graph would keep, and half
/// the products of a full square.
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
    let o = q.contiguous()?.apply_op3(&k, &v, BlockedAttention { scale: 1.0 / (dh as f64).sqrt() })?;
    o.transpose(0, 1)?.contiguous()?.reshape((n, hq * dh))
}

/// Queries per block of [`BlockedAttention`].
pub const ATTENTION_BLOCK: usize = 128;

/// `softmax(q·kᵀ·scale + causal mask)·v` over `[h, n, dh]` tensors (f32 or f64), one block of
/// queries at a time, with its own backward pass: the probabilities of a block are recomputed
/// there rather than kept (as flash attention does), so neither direction holds more than one
/// block's `[h, block, n]` scores.
pub struct BlockedAttention {
    /// Multiplies the scores (`1/√dh`).
    pub scale: f64,
}

/// The probabilities `[h, rows, end]` of query rows `start..start+rows` against keys `0..end`
/// (`end = start + rows`), causal.
fn block_probs(q: &Tensor, k: &Tensor, start: usize, rows: usize, scale: f64) -> Result<Tensor> {
    let end = start + rows;
    let qb = q.narrow(1, start, rows)?;
    let kb = k.narrow(1, 0, end)?;
    let scores = (qb.matmul(&kb.t()?)? * scale)?;
    // Row r sees keys 0..=start+r.
    let mask: Vec<f32> =
        (0..rows * end).map(|i| if i % end > start + i / end { f32::NEG_INFINITY } else { 0.0 }).collect();
    let mask = Tensor::from_vec(mask, (rows, end), q.device())?.to_dtype(q.dtype())?;
    softmax_last(&scores.broadcast_add(&mask)?)
}

/// The blocks of `n` query rows: `(start, rows)`.
fn attention_blocks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).step_by(ATTENTION_BLOCK).map(move |s| (s, ATTENTION_BLOCK.min(n - s)))
}

/// The argument `what` of the custom op `op`, a contiguous f32/f64 CPU storage, as a tensor of
/// its layout's shape (copied): how a custom op's CPU forward gets candle tensors to compute
/// with.
pub(crate) fn storage_tensor(storage: &CpuStorage, layout: &Layout, op: &str, what: &str) -> Result<Tensor> {
    let (a, b) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op}: {what} must be contiguous")))?;
    match storage {
        CpuStorage::F32(v) => Tensor::from_slice(&v[a..b], layout.shape(), &Device::Cpu),
        CpuStorage::F64(v) => Tensor::from_slice(&v[a..b], layout.shape(), &Device::Cpu),
        _ => Err(candle_core::Error::Msg(format!("{op}: {what} must be f32 or f64"))),
    }
}

/// The result `y` of the custom op `op` as the CPU storage and shape its forward returns.
pub(crate) fn tensor_storage(y: Tensor, op: &str) -> Result<(CpuStorage, Shape)> {
    let y = y.contiguous()?;
    let shape = y.shape().clone();
    let (st, l) = y.storage_and_layout();
    let Storage::Cpu(cpu) = &*st else {
        return Err(candle_core::Error::Msg(format!("{op}: CPU only")));
    };
    if l.start_offset() != 0 {
        return Err(candle_core::Error::Msg(format!("{op}: unexpected output offset")));
    }
    Ok((cpu.clone(), shape))
}

/// [`BlockedAttention`]'s name in errors.
const BLOCKED_ATTENTION: &str = "blocked attention";

impl CustomOp3 for BlockedAttention {
    fn name(&self) -> &'static str {
        "blocked-causal-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = BLOCKED_ATTENTION;
        let (q, k, v) =
            (storage_tensor(s1, l1, op, "q")?, storage_tensor(s2, l2, op, "k")?, storage_tensor(s3, l3, op, "v")?);
        let n = q.dim(1)?;
        let mut outs = Vec::new();
        for (start, rows) in attention_blocks(n) {
            let p = block_probs(&q, &k, start, rows, self.scale)?;
            outs.push(p.matmul(&v.narrow(1, 0, start + rows)?)?);
        }
        tensor_storage(Tensor::cat(&outs, 1)?, op)
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (q, k, v, o, grad) = (q.detach(), k.detach(), v.detach(), o.detach(), grad.detach().contiguous()?);
        let n = q.dim(1)?;
        let (mut dq, mut dk, mut dv) = (Vec::new(), k.zeros_like()?, v.zeros_like()?);
        for (start, rows) in attention_blocks(n) {
            let end = start + rows;
            let p = block_probs(&q, &k, start, rows, self.scale)?;
            let g = grad.narrow(1, start, rows)?;
            let (kb, vb) = (k.narrow(1, 0, end)?, v.narrow(1, 0, end)?);
            // dV += pᵀ·g; dP = g·vᵀ; dS = p ⊙ (dP − rowsum(g ⊙ o));
            // dQ = dS·k·scale; dK += dSᵀ·q·scale.
            let dv_b = p.t()?.matmul(&g)?;
            let dp = g.matmul(&vb.t()?)?;
            let row = (&g * o.narrow(1, start, rows)?)?.sum_keepdim(D::Minus1)?;
            let ds = ((p * dp.broadcast_sub(&row)?)? * self.scale)?;
            dq.push(ds.matmul(&kb)?);
            let dk_b = ds.t()?.matmul(&q.narrow(1, start, rows)?)?;
            dk = (dk + dk_b.pad_with_zeros(1, 0, n - end)?)?;
            dv = (dv + dv_b.pad_with_zeros(1, 0, n - end)?)?;
        }
        Ok((Some(Tensor::cat(&dq, 1)?), Some(dk), Some(dv)))
    }
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

/// `(I + A)⁻¹` for a batch of strictly lower-triangular `a` `[b, m, m]`: blocks of up to 8
/// by the finite product `(I − A)(I + A²)(I + A⁴)` (exact there, since `A⁸ = 0`), larger ones
/// by the block rule `[[T11, 0], [−T22·A21·T11, T22]]`.
fn inv_unit_lower(a: &Tensor) -> Result<Tensor> {
    let (b, m, _) = a.dims3()?;
    let eye = Tensor::eye(m, a.dtype(), a.device())?.unsqueeze(0)?.broadcast_as((b, m, m))?.contiguous()?;
    if m <= 8 {
        let a2 = a.matmul(a)?;
        let a4 = a2.matmul(&a2)?;
        return (&eye - a)?.matmul(&(&eye + a2)?)?.matmul(&(eye + a4)?);
    }
    let h = m / 2;
    let block = |r: usize, c: usize, rows: usize, cols: usize| -> Result<Tensor> {
        a.narrow(1, r, rows)?.narrow(2, c, cols)?.contiguous()
    };
    let t11 = inv_unit_lower(&block(0, 0, h, h)?)?;
    let t22 = inv_unit_lower(&block(h, h, m - h, m - h)?)?;
    let t21 = t22.matmul(&block(h, 0, m - h, h)?)?.matmul(&t11)?.neg()?;
    let top = Tensor::cat(&[t11, Tensor::zeros((b, h, m - h), a.dtype(), a.device())?], 2)?;
    let bottom = Tensor::cat(&[t21, t22], 2)?;
    Tensor::cat(&[top, bottom], 1)
}

/// The gated delta rule in its chunked (WY / UT-transform) form, docs/model.md §3.5:
/// the same function as [`delta_rule`] (same shapes), computed `chunk` tokens at a time with
/// matrix products, so the graph keeps one state per chunk instead of one per token. Within a
/// chunk, with `cᵢ` the cumulative log decay and `Dᵢⱼ = exp(cᵢ − cⱼ)` for `i ≥ j`:
///
/// ```text
/// A = strictly_lower((diag(β)K Kᵀ) ⊙ D);  T = (I + A)⁻¹
/// U = T·diag(β)V;  W = T·diag(β eᶜ)K;  Vnew = U − W·S
/// O = diag(eᶜ)Q·S + lower_incl((Q Kᵀ) ⊙ D)·Vnew
/// S ← e^(c_last)·S + (diag(e^(c_last − c))K)ᵀ·Vnew
/// ```
pub fn delta_rule_chunked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    chunk: usize,
) -> Result<Tensor> {
    let (hv, n, dk) = q.dims3()?;
    let dv = v.dim(2)?;
    let (dt, dev) = (q.dtype(), q.device());
    let mut s = Tensor::zeros((hv, dk, dv), dt, dev)?;
    let mut outs = Vec::with_capacity(n.div_ceil(chunk.max(1)));
    let mut n0 = 0;
    while n0 < n {
        let c = chunk.max(1).min(n - n0);
        let (qc, kc, vc) = (q.narrow(1, n0, c)?, k.narrow(1, n0, c)?, v.narrow(1, n0, c)?);
        let bc = beta.narrow(1, n0, c)?.unsqueeze(2)?; // [hv, c, 1]
        let cum = g.narrow(1, n0, c)?.contiguous()?.cumsum(1)?; // [hv, c]
        let incl: Vec<u8> = (0..c * c).map(|i| u8::from(i % c <= i / c)).collect();
        let incl = Tensor::from_vec(incl, (c, c), dev)?.broadcast_as((hv, c, c))?;
        let strict: Vec<f32> = (0..c * c).map(|i| if i % c < i / c { 1.0 } else { 0.0 }).collect();
        let strict = Tensor::from_vec(strict, (c, c), dev)?.to_dtype(dt)?;
        let diff = cum.unsqueeze(2)?.broadcast_sub(&cum.unsqueeze(1)?)?; // [hv, c, c]: cᵢ − cⱼ
        let neg_inf = Tensor::full(f32::NEG_INFINITY, (hv, c, c), dev)?.to_dtype(dt)?;
        let decay = incl.where_cond(&diff, &neg_inf)?.exp()?; // D, zero above the diagonal
        let ec = cum.exp()?.unsqueeze(2)?; // [hv, c, 1]
        let kb = kc.broadcast_mul(&bc)?;
        let a = kb.matmul(&kc.t()?)?.mul(&decay)?.broadcast_mul(&strict)?;
        let t = inv_unit_lower(&a)?;
        let u = t.matmul(&vc.broadcast_mul(&bc)?)?;
        let w = t.matmul(&kb.broadcast_mul(&ec)?)?;
        let vnew = (u - w.matmul(&s)?)?;
        let o = (qc.broadcast_mul(&ec)?.matmul(&s)? + qc.matmul(&kc.t()?)?.mul(&decay)?.matmul(&vnew)?)?;
        outs.push(o);
        let last = cum.narrow(1, c - 1, 1)?; // [hv, 1]
        let tail = last.broadcast_sub(&cum)?.exp()?.unsqueeze(2)?; // [hv, c, 1]
        s = (s.broadcast_mul(&last.exp()?.unsqueeze(2)?)? + kc.broadcast_mul(&tail)?.t()?.matmul(&vnew)?)?;
        n0 += c;
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
