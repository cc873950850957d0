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
/// blocks of 16 with the vector SiLU, the tail of each row with libm's `expf`. With AVX2 the
/// blocks run eight lanes at a time through [`x86::expf8`] (same bits, about 8× faster: it is
/// a few percent of a Coder-1.5B decode step); `FROGNANO_PLAIN_KERNELS=1` keeps the lane loop.
pub fn swiglu(g: &mut [f32], u: &[f32], width: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && !crate::kernels::plain_kernels()
    {
        // SAFETY: AVX2 and FMA were detected just above.
        return unsafe { x86::swiglu_avx2(g, u, width) };
    }
    swiglu_reference(g, u, width)
}

/// The lane-by-lane version of [`swiglu`] (its test reference, and what runs without AVX2).
pub fn swiglu_reference(g: &mut [f32], u: &[f32], width: usize) {
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
        swiglu_tail(&mut gr[body..], &ur[body..]);
    }
}

/// The elements of a row past its last block of 16: ggml's scalar loop, libm's `expf`.
#[inline(always)]
fn swiglu_tail(g: &mut [f32], u: &[f32]) {
    for (x, y) in g.iter_mut().zip(u) {
        *x = *x / (1.0 + (-*x).exp()) * y;
    }
}

/// GCC's `_mm512_reduce_add_ps` tree on sixteen values of any lane type: `v[i + 8] + v[i]`,
/// then `t[i + 4] + t[i]`, then `(s0 + s2) + (s1 + s3)`. [`reduce16`] runs it on floats; the
/// attention kernels run it on whole registers, lane `k` of the result reducing lane `k` of
/// `v[0..16]`.
#[inline(always)]
pub fn tree16<V: Copy>(v: &[V; 16], add: impl Fn(V, V) -> V) -> V {
    let t: [V; 8] = std::array::from_fn(|i| add(v[i + 8], v[i]));
    let s: [V; 4] = std::array::from_fn(|i| add(t[i + 4], t[i]));
    add(add(s[0], s[2]), add(s[1], s[3]))
}

/// GCC's `_mm512_reduce_add_ps`: halves added pairwise down to one lane ([`tree16`]).
#[inline(always)]
pub fn reduce16(v: &[f32; 16]) -> f32 {
    tree16(v, |a, b| a + b)
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

/// The vector forms of [`expf`] and the vector [`swiglu`]: lane for lane the scalar operations,
/// so every lane equals [`expf`] bit for bit (NaN inputs give some NaN; the scalar code's is
/// the canonical one).
#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use std::arch::x86_64::*;

    /// [`super::expf`] on sixteen lanes (AVX-512, `ggml_v_expf` itself): saturations by mask,
    /// `_mm512_scalef_ps` for `j·2^n`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and FMA.
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn expf16(x: __m512) -> __m512 {
        let c = |b: u32| _mm512_set1_ps(f32::from_bits(b));
        let r = c(0x4b40_0000);
        let z = _mm512_fmadd_ps(x, c(0x3fb8_aa3b), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(n, c(0x35bf_be8e), _mm512_fnmadd_ps(n, c(0x3f31_7200), x));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm512_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm512_fmadd_ps(c(0x3f7f_fff6), b, _mm512_set1_ps(1.0)),
        );
        let big = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
        let pos = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(n, _mm512_setzero_ps());
        let sat = _mm512_maskz_mov_ps(pos, _mm512_set1_ps(f32::INFINITY));
        _mm512_mask_blend_ps(big, _mm512_scalef_ps(j, n), sat)
    }

    /// [`super::expf`] on eight lanes (AVX2): the operations of [`expf16`] on one 256-bit half,
    /// with `_mm512_scalef_ps(j, n)` done as the scalar code does it, `j·2^n` as an exact f64
    /// product rounded once to f32 (four lanes per `__m256d`), or, when every lane's result
    /// is a normal f32 (or saturates), as the same exact product in f32. Lanes with
    /// `|n| > 192` take the saturation (`+∞` for `n > 0`, else 0) whatever the product gave.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn expf8(x: __m256) -> __m256 {
        let c = |b: u32| _mm256_set1_ps(f32::from_bits(b));
        let r = c(0x4b40_0000);
        let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm256_fmadd_ps(c(0x3f7f_fff6), b, _mm256_set1_ps(1.0)),
        );
        let abs_n = _mm256_and_ps(n, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)));
        let big = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
        // j lies in [0.70, 1.42], so for −125 ≤ n ≤ 127 the product j·2^n is a normal f32,
        // exact in f32 as in f64: an f32 product with 2^n built from f32 bits gives the same
        // bits, at a third of the operations. The softmaxes (weights ≥ e^−86 or masked to
        // −∞, which saturates) and SiLU almost always take it; any other lane takes the f64
        // product for all eight.
        let normal = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_GE_OQ>(n, _mm256_set1_ps(-125.0)),
            _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_set1_ps(127.0)),
        );
        let scaled = if _mm256_movemask_ps(_mm256_or_ps(normal, big)) == 0xFF {
            let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
            _mm256_mul_ps(j, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e)))
        } else {
            // 2^n as f64 bits, `(n + 1023) << 52`: n is a whole number wherever |n| ≤ 192,
            // the only lanes whose product is kept.
            let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(1023));
            let p_lo = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(e))));
            let p_hi =
                _mm256_castsi256_pd(_mm256_slli_epi64::<52>(_mm256_cvtepi32_epi64(_mm256_extracti128_si256::<1>(e))));
            let lo = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(j)), p_lo));
            let hi = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(j)), p_hi));
            _mm256_set_m128(hi, lo)
        };
        let pos = _mm256_cmp_ps::<_CMP_GT_OQ>(n, _mm256_setzero_ps());
        let sat = _mm256_and_ps(pos, _mm256_set1_ps(f32::INFINITY));
        _mm256_blendv_ps(scaled, sat, big)
    }

    /// [`super::swiglu`] with AVX2: each block of 16 as two halves of eight lanes, SiLU as
    /// `x / (1 + expf8(0 − x))` (an IEEE division, as the lane code's), times `u`.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn swiglu_avx2(g: &mut [f32], u: &[f32], width: usize) {
        let body = width / 16 * 16;
        let one = _mm256_set1_ps(1.0);
        for (gr, ur) in g.chunks_exact_mut(width).zip(u.chunks_exact(width)) {
            for i in (0..body).step_by(8) {
                let x = _mm256_loadu_ps(gr.as_ptr().add(i));
                let e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), x));
                let silu = _mm256_div_ps(x, _mm256_add_ps(one, e));
                _mm256_storeu_ps(gr.as_mut_ptr().add(i), _mm256_mul_ps(silu, _mm256_loadu_ps(ur.as_ptr().add(i))));
            }
            super::swiglu_tail(&mut gr[body..], &ur[body..]);
        }
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

    /// Inputs over the whole f32 range: every 997th bit pattern (both signs, subnormals,
    /// `f32::MAX`, the range where `n` is no longer a whole number), a dense sweep of the
    /// finite results, and the neighbours of every edge: overflow to +∞ (88.72), the first
    /// subnormal (−87.34) and the last one (−103.97) of the result, and the saturation
    /// `|n| > 192` (±133.43). NaNs left out (their bits are not the contract).
    fn exp_inputs() -> Vec<f32> {
        let mut xs: Vec<f32> = (0..=u32::MAX).step_by(997).map(f32::from_bits).filter(|x| !x.is_nan()).collect();
        xs.extend((-150_000..100_000).map(|i| i as f32 / 997.0));
        for edge in [88.72284f32, -87.33655, -103.97208, 133.4309, -133.4309] {
            xs.extend((-300..300).map(|d| f32::from_bits(edge.to_bits().wrapping_add_signed(d))));
        }
        xs.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN, 1e30, -1e30, 4.2e6, -4.2e6]);
        xs.resize(xs.len().div_ceil(16) * 16, 1.0);
        xs
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_exp_equals_expf_lane_for_lane() {
        use std::arch::is_x86_feature_detected as has;
        use std::arch::x86_64::*;
        let xs = exp_inputs();
        let want: Vec<u32> = xs.iter().map(|x| expf(*x).to_bits()).collect();
        let check = |got: &[f32], width: &str| {
            for ((x, y), w) in xs.iter().zip(got).zip(&want) {
                assert_eq!(y.to_bits(), *w, "{width} expf({x:e}) = {y:e}, scalar {:e}", f32::from_bits(*w));
            }
        };
        if has!("avx2") && has!("fma") {
            let mut got = vec![0.0f32; xs.len()];
            for (x, y) in xs.chunks_exact(8).zip(got.chunks_exact_mut(8)) {
                // SAFETY: AVX2 and FMA were detected above; the chunks hold eight lanes.
                unsafe { _mm256_storeu_ps(y.as_mut_ptr(), x86::expf8(_mm256_loadu_ps(x.as_ptr()))) };
            }
            check(&got, "expf8");
        } else {
            crate::test_support::report_skip("avx2+fma", "quant::ggml AVX2 vector exp");
        }
        if has!("avx512f") && has!("fma") {
            let mut got = vec![0.0f32; xs.len()];
            for (x, y) in xs.chunks_exact(16).zip(got.chunks_exact_mut(16)) {
                // SAFETY: AVX-512F and FMA were detected above; the chunks hold sixteen lanes.
                unsafe { avx512_exp(x, y) };
            }
            check(&got, "expf16");
        } else {
            crate::test_support::report_skip("avx512f", "quant::ggml AVX-512 vector exp");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn avx512_exp(x: &[f32], y: &mut [f32]) {
        use std::arch::x86_64::*;
        _mm512_storeu_ps(y.as_mut_ptr(), x86::expf16(_mm512_loadu_ps(x.as_ptr())));
    }

    #[test]
    fn swiglu_equals_its_reference_bit_for_bit() {
        // Rows of 37 (two blocks and a libm tail) and of 64; gates from −120 to 120, where the
        // exponential saturates on both sides, and the small values around 0.
        for width in [37, 64, 16, 5] {
            let g: Vec<f32> = (0..3 * width).map(|i| ((i * 7919 % 4801) as f32 - 2400.0) / 20.0).collect();
            let u: Vec<f32> = (0..3 * width).map(|i| 1.0 + (i % 11) as f32 / 7.0).collect();
            let (mut got, mut want) = (g.clone(), g.clone());
            swiglu(&mut got, &u, width);
            swiglu_reference(&mut want, &u, width);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "width {width}");
        }
        #[cfg(target_arch = "x86_64")]
        if !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")) {
            crate::test_support::report_skip("avx2+fma", "quant::ggml AVX2 swiglu (compared with itself)");
        }
    }
}
