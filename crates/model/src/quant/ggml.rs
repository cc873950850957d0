//! The float operations of ggml's CPU backend (llama.cpp, x86-64 with AVX-512, as
//! `GGML_NATIVE` builds it), reproduced to the bit so that a GGUF model run here quantizes the
//! same 8-bit activations llama.cpp does.
//!
//! Why to the bit: every weight matmul first rounds its input to 8-bit blocks. A one-ulp
//! difference in a value that lies near a rounding boundary of a block with a large scale flips
//! that element by one step, and after a few layers such flips add up to logit differences of
//! 0.3–1.0 on SmolLM2-135M. The operations that feed a quantized matmul in a llama layer are
//! RMSNorm, RoPE, softmax·V and SwiGLU; this module holds the ones whose ggml numerics are not
//! the obvious ones:
//!
//! * `exp` is ggml's `ggml_v_expf` polynomial (not libm's `expf`): [`expf`];
//! * SiLU is `x / (1 + ggml_v_expf(0 − x))` in blocks of 16, libm `expf` for a tail: [`swiglu`];
//! * softmax sums `ggml_v_expf` in blocks of 16, each block reduced in f32 (GCC's
//!   `_mm512_reduce_add_ps` tree) and the block sums added in f64: [`softmax`];
//! * f16 dot products (attention against the f16 KV cache) keep 16 f32 lanes in llamafile's
//!   `tinyBLAS` when a batch has two or more tokens, and ggml's 4 × 16 lanes
//!   (`ggml_vec_dot_f16`) for a single token: [`F16Dot`].

/// ggml's `ggml_v_expf` (AVX-512 version), one lane: `exp(x)` as `2^n · p(b)` with
/// `n = round(x·log2 e)` and a degree-5 polynomial in the reduced argument, every step rounded
/// as the vector code rounds it (fused multiply-adds where it fuses). `x ≤ −192·ln 2` gives 0.
#[inline(always)]
pub fn expf(x: f32) -> f32 {
    let c = f32::from_bits;
    let r = c(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(c(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    if n.is_nan() {
        return f32::NAN;
    }
    let u = b * b;
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)))
        .mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
    // `_mm512_scalef_ps(j, n)`: j·2^n rounded once (the f64 product is exact).
    let p = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    (j as f64 * p) as f32
}

/// SiLU of one lane of ggml's vector code: `x / (1 + expf(0 − x))`.
#[inline(always)]
fn silu_v(x: f32) -> f32 {
    x / (1.0 + expf(0.0 - x))
}

/// `g[i] = silu(g[i]) · u[i]` along rows of `width`, as `ggml_vec_swiglu_f32` computes it:
/// blocks of 16 with the vector SiLU, the tail of each row with libm's `expf`.
pub fn swiglu(g: &mut [f32], u: &[f32], width: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: FMA was detected just above.
        return unsafe { swiglu_fma(g, u, width) };
    }
    swiglu_plain(g, u, width)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn swiglu_fma(g: &mut [f32], u: &[f32], width: usize) {
    swiglu_plain(g, u, width)
}

#[inline(always)]
fn swiglu_plain(g: &mut [f32], u: &[f32], width: usize) {
    let body = width / 16 * 16;
    for (gr, ur) in g.chunks_exact_mut(width).zip(u.chunks_exact(width)) {
        for (x, y) in gr[..body].iter_mut().zip(&ur[..body]) {
            *x = silu_v(*x) * y;
        }
        for (x, y) in gr[body..].iter_mut().zip(&ur[body..]) {
            *x = *x / (1.0 + (-*x).exp()) * y;
        }
    }
}

/// GCC's `_mm512_reduce_add_ps`: halves added pairwise down to one lane.
#[inline(always)]
pub fn reduce16(v: &[f32; 16]) -> f32 {
    let mut t = [0.0f32; 8];
    for i in 0..8 {
        t[i] = v[i + 8] + v[i];
    }
    let s = [t[4] + t[0], t[5] + t[1], t[6] + t[2], t[7] + t[3]];
    (s[0] + s[2]) + (s[1] + s[3])
}

/// In-place softmax of the first `x.len()` scores of a row whose remaining positions are
/// masked (−∞), as `ggml_compute_forward_soft_max_f32` computes it: max, `expf(x − max)` in
/// blocks of 16 each summed by [`reduce16`], block sums added in f64, then one f32 multiply by
/// `1/sum`. (ggml's rows are padded to a multiple of 256 by the KV cache, so every block is a
/// vector block; masked lanes add zero.)
pub fn softmax(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: FMA was detected just above.
        return unsafe { softmax_fma(x) };
    }
    softmax_plain(x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn softmax_fma(x: &mut [f32]) {
    softmax_plain(x)
}

#[inline(always)]
fn softmax_plain(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    let mut sum = 0.0f64;
    for chunk in x.chunks_mut(16) {
        let mut lanes = [0.0f32; 16];
        for (l, v) in lanes.iter_mut().zip(chunk.iter_mut()) {
            *v = expf(*v - max);
            *l = *v;
        }
        sum += reduce16(&lanes) as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Which summation order an f16 dot product follows (the operands hold f16 values widened to
/// f32, so every product is exact and only the order of the additions matters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum F16Dot {
    /// llamafile `tinyBLAS<16, __m512>` (batches of ≥ 2 tokens): element `i` goes to lane
    /// `i mod 16`, lanes reduced by [`reduce16`].
    Gemm,
    /// `ggml_vec_dot_f16` (one token): four 16-lane accumulators over steps of 64, combined
    /// `(a0 + a2) + (a1 + a3)` lane-wise, reduced by [`reduce16`]; a tail past the last whole
    /// step is added in f64.
    Vec,
}

impl F16Dot {
    /// The order llama.cpp uses for a batch of `tokens` tokens.
    pub fn for_batch(tokens: usize) -> Self {
        if tokens >= 2 {
            F16Dot::Gemm
        } else {
            F16Dot::Vec
        }
    }

    /// `Σ a[i]·b[i]` in this order, over the first `min(a.len(), b.len())` elements of a dot
    /// whose length in ggml is `len` (at least that many): positions past the given ones are
    /// zeros there (masked attention weights, padded KV cells) and leave every lane unchanged;
    /// `len` decides where [`F16Dot::Vec`]'s f64 tail starts.
    pub fn dot(self, a: &[f32], b: &[f32], len: usize) -> f32 {
        let n = a.len().min(b.len());
        match self {
            F16Dot::Gemm => {
                // Whole groups of 16 lane by lane (vectorisable), then the tail; products of
                // f16 values are exact in f32, so only this order of additions matters.
                let mut lanes = [0.0f32; 16];
                let (ca, cb) = (a[..n].chunks_exact(16), b[..n].chunks_exact(16));
                let (ta, tb) = (ca.remainder(), cb.remainder());
                for (x, y) in ca.zip(cb) {
                    for l in 0..16 {
                        lanes[l] += x[l] * y[l];
                    }
                }
                for (l, (x, y)) in ta.iter().zip(tb).enumerate() {
                    lanes[l] += x * y;
                }
                reduce16(&lanes)
            }
            F16Dot::Vec => {
                let np = (len / 64 * 64).min(n);
                let mut acc = [0.0f32; 64];
                let (ca, cb) = (a[..np].chunks_exact(64), b[..np].chunks_exact(64));
                let (ra, rb) = (ca.remainder(), cb.remainder());
                for (x, y) in ca.zip(cb) {
                    for l in 0..64 {
                        acc[l] += x[l] * y[l];
                    }
                }
                for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
                    acc[l] += x * y;
                }
                let tail: f64 = a[np..n].iter().zip(&b[np..n]).map(|(x, y)| (x * y) as f64).sum();
                (F16Dot::combine_vec(&acc) as f64 + tail) as f32
            }
        }
    }

    /// `ggml_vec_dot_f16`'s reduction of its four 16-lane accumulators (`acc[16·g + l]`).
    #[inline]
    pub fn combine_vec(acc: &[f32; 64]) -> f32 {
        let mut lanes = [0.0f32; 16];
        for (l, o) in lanes.iter_mut().enumerate() {
            *o = (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]);
        }
        reduce16(&lanes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expf_is_close_to_exp_and_saturates() {
        for i in -2000..2000 {
            let x = i as f32 / 37.0;
            let (got, want) = (expf(x), (x as f64).exp());
            assert!(((got as f64 - want) / want).abs() < 3e-7, "expf({x}) = {got}, exp = {want}");
        }
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(-200.0), 0.0);
        assert_eq!(expf(200.0), f32::INFINITY);
        assert_eq!(expf(0.0), 1.0);
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
        softmax(&mut x);
        let s: f32 = x.iter().sum();
        assert!((s - 1.0).abs() < 1e-5, "{s}");
        assert!(x.iter().all(|&p| p > 0.0));
    }

    #[test]
    fn swiglu_matches_the_formula_and_keeps_the_tail() {
        let width = 37;
        let mut g: Vec<f32> = (0..2 * width).map(|i| i as f32 / 9.0 - 4.0).collect();
        let u: Vec<f32> = (0..2 * width).map(|i| 1.0 + i as f32 / 100.0).collect();
        let want: Vec<f32> = g.iter().zip(&u).map(|(x, y)| x / (1.0 + (-x).exp()) * y).collect();
        swiglu(&mut g, &u, width);
        for (a, b) in g.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
        }
    }

    #[test]
    fn f16_dots_agree_with_the_plain_sum_up_to_order() {
        let a: Vec<f32> = (0..200).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
        let b: Vec<f32> = (0..150).map(|i| ((i * 5 % 11) as f32 - 5.0) / 4.0).collect();
        let want: f64 = a.iter().zip(&b).map(|(x, y)| (x * y) as f64).sum();
        for order in [F16Dot::Gemm, F16Dot::Vec] {
            let got = order.dot(&a, &b, 150) as f64;
            assert!((got - want).abs() < 1e-4, "{order:?}: {got} vs {want}");
        }
        // Different orders really are different: lane sums of values of different magnitude.
        let big: Vec<f32> =
            (0..128).map(|i| if i % 3 == 0 { 1024.0 } else { 1.0 / 1024.0 + i as f32 * 1e-3 }).collect();
        let one = vec![1.0f32; 128];
        let plain: f32 = big.iter().sum();
        assert!(F16Dot::Gemm.dot(&big, &one, 128) != plain || F16Dot::Vec.dot(&big, &one, 128) != plain);
    }
}
