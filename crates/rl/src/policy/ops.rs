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

#[cfg(test)]
mod tests {
    //! Finite-difference gradient checks (f64) of every custom piece, and agreement of the
    //! delta rule and conv with frognano-model's inference kernels.
    use super::*;
    use candle_core::Var;
    use rand::{Rng, SeedableRng};

    fn rand_tensor(shape: &[usize], scale: f64, seed: u64) -> Tensor {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| rng.random_range(-scale..scale)).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    /// Checks d(Σ f(x)·r)/dx from autograd against central differences at every element of
    /// every input (inputs are small).
    fn grad_check(inputs: &[Tensor], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
        let vars: Vec<Var> = inputs.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
        let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        let out = f(&ts).unwrap();
        let r = rand_tensor(out.dims(), 1.0, 99);
        let loss = |ts: &[Tensor]| -> f64 { (f(ts).unwrap() * &r).unwrap().sum_all().unwrap().to_scalar().unwrap() };
        let grads = (out * &r).unwrap().sum_all().unwrap().backward().unwrap();
        let eps = 1e-6;
        for (k, v) in vars.iter().enumerate() {
            let g: Vec<f64> = grads.get(v).expect("input reaches the output").flatten_all().unwrap().to_vec1().unwrap();
            let base: Vec<f64> = v.flatten_all().unwrap().to_vec1().unwrap();
            for i in 0..base.len() {
                let at = |delta: f64| {
                    let mut b = base.clone();
                    b[i] += delta;
                    let mut ts = ts.clone();
                    ts[k] = Tensor::from_vec(b, v.dims(), &Device::Cpu).unwrap();
                    loss(&ts)
                };
                let fd = (at(eps) - at(-eps)) / (2.0 * eps);
                let tol = 1e-6 * (1.0 + fd.abs());
                assert!((fd - g[i]).abs() < tol, "input {k} element {i}: autograd {} vs finite difference {fd}", g[i]);
            }
        }
    }

    #[test]
    fn rms_norm_and_l2_normalize_gradients() {
        grad_check(&[rand_tensor(&[3, 6], 1.0, 1), rand_tensor(&[6], 1.0, 2)], |t| {
            rms_norm(&t[0], &(&t[1] + 1.0)?, 1e-6)
        });
        grad_check(&[rand_tensor(&[2, 3, 5], 1.0, 3)], |t| l2_normalize(&t[0], 1e-6));
    }

    #[test]
    fn sigmoid_softplus_gradients_and_values() {
        let x = Tensor::new(&[-30.0f64, -2.0, 0.0, 0.5, 19.0, 25.0], &Device::Cpu).unwrap();
        let sp: Vec<f64> = softplus(&x).unwrap().to_vec1().unwrap();
        for (a, b) in sp.iter().zip([-30.0f64, -2.0, 0.0, 0.5, 19.0, 25.0]) {
            let want = if b > 20.0 { b } else { b.exp().ln_1p() };
            assert!((a - want).abs() < 1e-12, "softplus({b}) = {a}, want {want}");
        }
        grad_check(&[rand_tensor(&[7], 4.0, 4)], |t| softplus(&t[0]));
        grad_check(&[rand_tensor(&[7], 4.0, 5)], |t| sigmoid(&t[0]));
    }

    #[test]
    fn rope_full_and_partial_gradients_and_rotation() {
        let (cos, sin) = rope_tables(4, 6, 100.0, DType::F64, &Device::Cpu).unwrap();
        grad_check(&[rand_tensor(&[2, 4, 6], 1.0, 6)], |t| rope(&t[0], &cos, &sin));
        let (cos, sin) = rope_tables(4, 4, 100.0, DType::F64, &Device::Cpu).unwrap();
        grad_check(&[rand_tensor(&[2, 4, 8], 1.0, 7)], |t| rope(&t[0], &cos, &sin));
        // Against frognano-model's rotate-half kernel.
        let x = rand_tensor(&[1, 4, 8], 1.0, 8).to_dtype(DType::F32).unwrap();
        let (cos, sin) = rope_tables(4, 4, 100.0, DType::F32, &Device::Cpu).unwrap();
        let got: Vec<f32> = rope(&x, &cos, &sin).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let mut want: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        let r = frognano_model::kernels::Rope::new(4, 100.0);
        for (p, head) in want.chunks_exact_mut(8).enumerate() {
            r.apply(head, p, frognano_model::kernels::Act::F32);
        }
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }

    #[test]
    fn causal_attention_gqa_gradients_and_causality() {
        let q = rand_tensor(&[4, 5, 3], 1.0, 9);
        let k = rand_tensor(&[2, 5, 3], 1.0, 10);
        let v = rand_tensor(&[2, 5, 3], 1.0, 11);
        grad_check(&[q.clone(), k.clone(), v.clone()], |t| causal_attention(&t[0], &t[1], &t[2]));
        // Changing the last key/value leaves earlier outputs unchanged.
        let o1: Vec<f64> = causal_attention(&q, &k, &v).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let k2 = Tensor::cat(&[k.narrow(1, 0, 4).unwrap(), rand_tensor(&[2, 1, 3], 5.0, 12)], 1).unwrap();
        let o2: Vec<f64> = causal_attention(&q, &k2, &v).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(o1[..4 * 12], o2[..4 * 12]);
        assert_ne!(o1[4 * 12..], o2[4 * 12..]);
    }

    #[test]
    fn causal_conv_gradients_and_matches_inference_kernel() {
        grad_check(&[rand_tensor(&[5, 3], 1.0, 13), rand_tensor(&[3, 4], 1.0, 14)], |t| causal_conv1d(&t[0], &t[1]));
        let x = rand_tensor(&[6, 3], 1.0, 15);
        let w = rand_tensor(&[3, 4], 1.0, 16);
        let got: Vec<f64> = causal_conv1d(&x, &w).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let xf: Vec<f32> = x.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let wf: Vec<f32> = w.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let mut state = vec![0.0f32; 3 * 3];
        let want = frognano_model::kernels::conv::causal_conv1d(&xf, &mut state, &wf, 3, 4);
        for (a, b) in got.iter().zip(&want) {
            assert!((*a as f32 - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    fn delta_inputs(n: usize, hv: usize, dk: usize, dv: usize) -> Vec<Tensor> {
        let q = l2_normalize(&rand_tensor(&[hv, n, dk], 1.0, 17), 1e-6).unwrap();
        let k = l2_normalize(&rand_tensor(&[hv, n, dk], 1.0, 18), 1e-6).unwrap();
        let v = rand_tensor(&[hv, n, dv], 1.0, 19);
        let g = (rand_tensor(&[hv, n], 0.5, 20) - 0.6).unwrap();
        let beta = (rand_tensor(&[hv, n], 0.4, 21) + 0.5).unwrap();
        vec![q, k, v, g, beta]
    }

    #[test]
    fn delta_rule_gradients() {
        grad_check(&delta_inputs(4, 2, 3, 2), |t| delta_rule(&t[0], &t[1], &t[2], &t[3], &t[4]));
    }

    #[test]
    fn delta_rule_matches_inference_kernel() {
        let (n, hv, dk, dv) = (70, 2, 4, 3);
        let x = delta_inputs(n, hv, dk, dv);
        let got: Vec<f64> =
            delta_rule(&x[0], &x[1], &x[2], &x[3], &x[4]).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        // The kernel wants token-major `[n, heads, d]` / `[n, heads]`.
        let tm = |t: &Tensor| -> Vec<f32> {
            let t = if t.rank() == 3 { t.transpose(0, 1).unwrap() } else { t.t().unwrap() };
            t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
        };
        let (q, k, v, g, b) = (tm(&x[0]), tm(&x[1]), tm(&x[2]), tm(&x[3]), tm(&x[4]));
        use frognano_model::kernels::delta_rule::{chunked, DeltaInputs, DeltaShape};
        let shape = DeltaShape { t: n, hk: hv, hv, dk, dv, key_head: (0..hv).collect() };
        let mut state = vec![0.0f32; hv * dk * dv];
        let want = chunked(&DeltaInputs { q: &q, k: &k, v: &v, g: &g, beta: &b }, &mut state, &shape);
        let diff = got.iter().zip(&want).map(|(a, b)| (*a as f32 - b).abs()).fold(0.0, f32::max);
        assert!(diff < 1e-4, "delta rule differs from the inference kernel by {diff}");
    }

    #[test]
    fn gather_logprobs_gradients_and_normalisation() {
        grad_check(&[rand_tensor(&[3, 5], 3.0, 22)], |t| gather_logprobs(&t[0], &[4, 0, 2]));
        let lp: Vec<f64> = gather_logprobs(
            &rand_tensor(&[1, 5], 3.0, 23).broadcast_as((5, 5)).unwrap().contiguous().unwrap(),
            &[0, 1, 2, 3, 4],
        )
        .unwrap()
        .to_vec1()
        .unwrap();
        let total: f64 = lp.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-12, "probabilities sum to {total}");
    }
}
