//! Causal attention of a batch of new queries against an f16-valued KV cache, in llama.cpp's
//! batch order (`F16Dot::Gemm`, see `quant::ggml`): the llama architecture's prefill.
//!
//! [`causal_reference`] is the plain version: per query and head, scores `q·k` summed in 16
//! lanes (element `e` in lane `e mod 16`) and reduced by GCC's `_mm512_reduce_add_ps` tree,
//! ggml's softmax, the weights rounded to f16, and `Σ p·v` summed in 16 slots (key `j` in slot
//! `j mod 16`) reduced by the same tree. Every product is of two f16 values, so it is exact in
//! f32 and only the order of the additions matters.
//!
//! A single new token (decode) follows `ggml_vec_dot_f16`'s order instead (`F16Dot::Vec`: four
//! 16-lane accumulators per step of 64, and 64 value slots).
//!
//! [`causal`] computes the same numbers with AVX-512 in that same order, vectorised across
//! what is independent: for a batch sixteen keys at a time for the scores (one lane per key,
//! the cache transposed into blocks of 16 keys), for one token one key at a time in four
//! registers; the exponentials sixteen at a time; the value sum one 16-wide chunk of the head
//! at a time with four slots in flight. Tests hold it to the reference bit for bit.

use rayon::prelude::*;

use super::round_f16;
use crate::quant::ggml::{self, F16Dot};

/// Shapes of one [`causal`] call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// New queries (tokens).
    pub t: usize,
    /// Cache positions before the first new token (query `i` sees keys `0..=pos0 + i`).
    pub pos0: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (`heads` a multiple of it).
    pub kv_heads: usize,
    /// Dimensions per head.
    pub head_dim: usize,
    /// Score scale (`1/√head_dim`).
    pub scale: f32,
}

/// Causal attention of `q` (`[t, heads, head_dim]`, values already f16-rounded) against the
/// cache `kc`/`vc` (`[pos0 + t, kv_heads, head_dim]`, f16-rounded) in llama.cpp's summation
/// `order` for the batch ([`F16Dot::for_batch`]). Returns `[t, heads · head_dim]`.
/// Bit-identical to [`causal_reference`].
pub fn causal(q: &[f32], kc: &[f32], vc: &[f32], s: AttnShape, order: F16Dot) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if s.head_dim.is_multiple_of(16) && x86::available() && !super::plain_kernels() {
        return x86::causal(q, kc, vc, s, order);
    }
    causal_reference(q, kc, vc, s, order)
}

/// The plain version of [`causal`] (what the llama forward computed before the vector kernel,
/// kept as its test reference and for CPUs without AVX-512).
pub fn causal_reference(q: &[f32], kc: &[f32], vc: &[f32], s: AttnShape, order: F16Dot) -> Vec<f32> {
    let AttnShape { t, pos0, heads: hq, kv_heads: hkv, head_dim: dh, scale } = s;
    let group = hq / hkv;
    let mut o = vec![0.0f32; t * hq * dh];
    o.par_chunks_mut(dh).enumerate().for_each(|(idx, oh)| {
        let (i, h) = (idx / hq, idx % hq);
        let kvh = h / group;
        let qh = &q[idx * dh..(idx + 1) * dh];
        let n = pos0 + i + 1;
        let mut sc: Vec<f32> =
            (0..n).map(|j| order.dot(qh, &kc[(j * hkv + kvh) * dh..(j * hkv + kvh + 1) * dh], dh) * scale).collect();
        ggml::softmax(&mut sc);
        let slots = if order == F16Dot::Gemm { 16 } else { 64 };
        let mut acc = vec![0.0f32; slots * dh];
        for (j, p) in sc.iter().enumerate() {
            let p = round_f16(*p);
            let vr = &vc[(j * hkv + kvh) * dh..(j * hkv + kvh + 1) * dh];
            let slot = &mut acc[(j % slots) * dh..(j % slots + 1) * dh];
            for (e, vv) in slot.iter_mut().zip(vr) {
                *e += p * vv;
            }
        }
        for (e, out) in oh.iter_mut().enumerate() {
            *out = if order == F16Dot::Gemm {
                ggml::reduce16(&std::array::from_fn(|l| acc[l * dh + e]))
            } else {
                F16Dot::combine_vec(&std::array::from_fn(|l| acc[l * dh + e]))
            };
        }
    });
    o
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use rayon::prelude::*;

    use super::{AttnShape, F16Dot};

    /// One KV head of the cache.
    struct Kv<'a> {
        kc: &'a [f32],
        vc: &'a [f32],
        hkv: usize,
        kvh: usize,
        dh: usize,
    }

    impl Kv<'_> {
        #[inline(always)]
        fn row(&self, j: usize) -> usize {
            (j * self.hkv + self.kvh) * self.dh
        }
    }

    pub(super) fn available() -> bool {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("f16c") && is_x86_feature_detected!("fma")
    }

    /// GCC's `_mm512_reduce_add_ps` of sixteen vectors at once, lane by lane: lane `k` of the
    /// result is the reduction of lane `k` of `v[0..16]` (`v[l]` holding element `l`).
    #[inline]
    #[target_feature(enable = "avx512f,fma,f16c")]
    unsafe fn reduce16_lanes(v: &[__m512; 16]) -> __m512 {
        let t: [__m512; 8] = std::array::from_fn(|i| _mm512_add_ps(v[i + 8], v[i]));
        let s: [__m512; 4] = std::array::from_fn(|i| _mm512_add_ps(t[i + 4], t[i]));
        _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]))
    }

    /// GCC's `_mm512_reduce_add_ps` of one vector (the tree of `ggml::reduce16`).
    #[inline]
    #[target_feature(enable = "avx512f,fma,f16c")]
    unsafe fn reduce16(v: __m512) -> f32 {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        let t = _mm256_add_ps(hi, _mm512_castps512_ps256(v));
        let s = _mm_add_ps(_mm256_extractf128_ps::<1>(t), _mm256_castps256_ps128(t));
        let u = _mm_add_ps(_mm_movehl_ps(s, s), s); // [s0 + s2, s1 + s3, ..]
        _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)))
    }

    /// `ggml::expf` on sixteen lanes, the same operations in the same order.
    #[inline]
    #[target_feature(enable = "avx512f,fma,f16c")]
    unsafe fn expf16(x: __m512) -> __m512 {
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

    /// [`expf16`] for the tests.
    #[cfg(test)]
    #[target_feature(enable = "avx512f,fma,f16c")]
    pub(super) unsafe fn expf16_for_tests(x: __m512) -> __m512 {
        expf16(x)
    }

    /// Keys of one KV head transposed into blocks of 16: `kt[(b·dh + e)·16 + l]` is element
    /// `e` of key `16b + l` (zero past the last key).
    fn transpose_keys(kc: &[f32], n: usize, hkv: usize, kvh: usize, dh: usize) -> Vec<f32> {
        let nb = n.div_ceil(16);
        let mut kt = vec![0.0f32; nb * dh * 16];
        for j in 0..n {
            let (b, l) = (j / 16, j % 16);
            let key = &kc[(j * hkv + kvh) * dh..(j * hkv + kvh + 1) * dh];
            for (e, &v) in key.iter().enumerate() {
                kt[(b * dh + e) * 16 + l] = v;
            }
        }
        kt
    }

    pub(super) fn causal(q: &[f32], kc: &[f32], vc: &[f32], s: AttnShape, order: F16Dot) -> Vec<f32> {
        let AttnShape { t, pos0, heads: hq, kv_heads: hkv, head_dim: dh, .. } = s;
        let n_all = pos0 + t;
        let kts: Vec<Vec<f32>> = if order == F16Dot::Gemm {
            (0..hkv).into_par_iter().map(|kvh| transpose_keys(kc, n_all, hkv, kvh, dh)).collect()
        } else {
            Vec::new()
        };
        let slots = if order == F16Dot::Gemm { 16 } else { 64 };
        let mut o = vec![0.0f32; t * hq * dh];
        o.par_chunks_mut(dh).enumerate().for_each_init(
            || (Vec::new(), Vec::new()),
            |(sc, acc), (idx, oh)| {
                let (i, h) = (idx / hq, idx % hq);
                let kvh = h / (hq / hkv);
                let qh = &q[idx * dh..(idx + 1) * dh];
                let n = pos0 + i + 1;
                sc.clear();
                sc.resize(n.div_ceil(16) * 16, 0.0);
                acc.clear();
                acc.resize(slots * dh, 0.0);
                let kv = Kv { kc, vc, hkv, kvh, dh };
                // SAFETY: `available()` checked the features; the buffers are sized above.
                unsafe {
                    if order == F16Dot::Gemm {
                        scores_gemm(qh, &kts[kvh], n, dh, s.scale, sc);
                    } else {
                        scores_vec(qh, &kv, n, s.scale, sc);
                    }
                    softmax_f16(sc, n);
                    weighted_values(&kv, sc, n, slots, acc, oh);
                }
            },
        );
        o
    }

    /// Scores of one query against keys `0..n` in the batch order, sixteen keys at a time: lane
    /// `l` of `a[e mod 16]` accumulates `q[e]·k[e]` of key `16b + l` over `e` ascending, exactly
    /// the lanes of the reference's dot for that key; then the reduction tree and `· scale`.
    #[target_feature(enable = "avx512f,fma,f16c")]
    unsafe fn scores_gemm(qh: &[f32], kt: &[f32], n: usize, dh: usize, scale: f32, sc: &mut [f32]) {
        let scale_v = _mm512_set1_ps(scale);
        for b in 0..n.div_ceil(16) {
            let kb = kt.as_ptr().add(b * dh * 16);
            let mut a = [_mm512_setzero_ps(); 16];
            for c in 0..dh / 16 {
                for (l, al) in a.iter_mut().enumerate() {
                    let e = 16 * c + l;
                    *al = _mm512_fmadd_ps(_mm512_set1_ps(*qh.get_unchecked(e)), _mm512_loadu_ps(kb.add(e * 16)), *al);
                }
            }
            _mm512_storeu_ps(sc.as_mut_ptr().add(16 * b), _mm512_mul_ps(reduce16_lanes(&a), scale_v));
        }
    }

    /// Scores of one query against keys `0..n` in `ggml_vec_dot_f16`'s order: four 16-lane
    /// accumulators over steps of 64, combined `(a0 + a2) + (a1 + a3)`, the tree, a tail past
    /// the last whole step added in f64; then `· scale`.
    #[target_feature(enable = "avx512f,fma,f16c")]
    unsafe fn scores_vec(qh: &[f32], kv: &Kv, n: usize, scale: f32, sc: &mut [f32]) {
        let dh = kv.dh;
        let np = dh / 64 * 64;
        for (j, out) in sc.iter_mut().enumerate().take(n) {
            let k = kv.kc.as_ptr().add(kv.row(j));
            let mut a = [_mm512_setzero_ps(); 4];
            for step in (0..np).step_by(64) {
                for (g, ag) in a.iter_mut().enumerate() {
                    let e = step + 16 * g;
                    *ag = _mm512_fmadd_ps(_mm512_loadu_ps(qh.as_ptr().add(e)), _mm512_loadu_ps(k.add(e)), *ag);
                }
            }
            let lanes = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
            let body = reduce16(lanes);
            *out = if np == dh {
                body * scale
            } else {
                let kr = std::slice::from_raw_parts(k, dh);
                let tail: f64 = qh[np..dh].iter().zip(&kr[np..dh]).map(|(x, y)| (x * y) as f64).sum();
                (body as f64 + tail) as f32 * scale
            };
        }
    }

    /// `ggml::softmax` of `sc[..n]` (max, exp in blocks of 16 reduced by the tree, block sums in
    /// f64, one multiply by 1/sum), then every weight rounded to f16; lanes past `n` are zero.
    #[target_feature(enable = "avx512f,fma,f16c")]
    unsafe fn softmax_f16(sc: &mut [f32], n: usize) {
        let nb = n.div_ceil(16);
        let mut max = f32::NEG_INFINITY;
        for &v in &sc[..n] {
            if v > max {
                max = v;
            }
        }
        let max_v = _mm512_set1_ps(max);
        let mut sum = 0.0f64;
        for b in 0..nb {
            let p = sc.as_mut_ptr().add(16 * b);
            let live = if 16 * b + 16 <= n { 0xFFFF } else { ((1u32 << (n - 16 * b)) - 1) as u16 };
            let e = _mm512_maskz_mov_ps(live, expf16(_mm512_sub_ps(_mm512_loadu_ps(p), max_v)));
            _mm512_storeu_ps(p, e);
            sum += reduce16(e) as f64;
        }
        let inv = _mm512_set1_ps((1.0 / sum) as f32);
        for b in 0..nb {
            let p = sc.as_mut_ptr().add(16 * b);
            let w = _mm512_mul_ps(_mm512_loadu_ps(p), inv);
            let r = _mm512_cvtph_ps(_mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(w));
            _mm512_storeu_ps(p, r);
        }
    }

    /// `Σ p·v` over keys `0..n`: slot `j mod slots` sums its keys in ascending order (four
    /// slots in flight per 16-wide chunk of the head), then the slots are reduced per element:
    /// by the tree (16 slots, batch order) or `ggml_vec_dot_f16`'s combine and tree (64 slots).
    #[target_feature(enable = "avx512f,fma,f16c")]
    unsafe fn weighted_values(kv: &Kv, sc: &[f32], n: usize, slots: usize, acc: &mut [f32], oh: &mut [f32]) {
        let dh = kv.dh;
        for c in 0..dh / 16 {
            for g in 0..slots / 4 {
                let mut s4 = [_mm512_setzero_ps(); 4];
                let mut j0 = 0;
                while j0 < n {
                    for (k, sk) in s4.iter_mut().enumerate() {
                        let j = j0 + 4 * g + k;
                        if j < n {
                            let p = _mm512_set1_ps(*sc.get_unchecked(j));
                            let v = kv.vc.as_ptr().add(kv.row(j) + 16 * c);
                            *sk = _mm512_fmadd_ps(p, _mm512_loadu_ps(v), *sk);
                        }
                    }
                    j0 += slots;
                }
                for (k, sk) in s4.iter().enumerate() {
                    _mm512_storeu_ps(acc.as_mut_ptr().add((4 * g + k) * dh + 16 * c), *sk);
                }
            }
        }
        let slot = |l: usize, c: usize| _mm512_loadu_ps(acc.as_ptr().add(l * dh + 16 * c));
        for c in 0..dh / 16 {
            let lanes: [__m512; 16] = if slots == 16 {
                std::array::from_fn(|l| slot(l, c))
            } else {
                std::array::from_fn(|l| {
                    _mm512_add_ps(
                        _mm512_add_ps(slot(l, c), slot(32 + l, c)),
                        _mm512_add_ps(slot(16 + l, c), slot(48 + l, c)),
                    )
                })
            };
            _mm512_storeu_ps(oh.as_mut_ptr().add(16 * c), reduce16_lanes(&lanes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn f16_values(n: usize, seed: u64, amp: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n).map(|_| round_f16(lcg(&mut s) * amp)).collect()
    }

    #[test]
    fn vector_attention_equals_the_reference_bit_for_bit() {
        #[cfg(target_arch = "x86_64")]
        if !x86::available() {
            // `causal` falls back to the reference itself: the comparison below checks nothing.
            crate::test_support::report_skip("avx512f", "kernels::attention AVX-512 causal attention");
        }
        for (t, pos0, hq, hkv, dh, amp) in [
            (1, 0, 2, 1, 16, 1.0),
            (5, 0, 9, 3, 64, 2.0),
            (17, 3, 4, 2, 32, 4.0),
            (33, 40, 6, 2, 64, 8.0),
            (20, 0, 3, 3, 48, 30.0), // wide scores: exponentials that underflow to subnormals and 0
            (7, 100, 2, 1, 128, 0.5),
            (1, 300, 9, 3, 64, 3.0), // decode at a longer position
            (2, 70, 4, 1, 80, 1.0),  // a head of 80: the f64 tail of the one-token order
            (6, 2, 2, 1, 40, 1.0),   // head_dim not a multiple of 16: the plain path
        ] {
            let n = pos0 + t;
            let q = f16_values(t * hq * dh, 1 + t as u64, amp);
            let k = f16_values(n * hkv * dh, 2 + n as u64, amp);
            let v = f16_values(n * hkv * dh, 3 + dh as u64, 1.0);
            let s = AttnShape { t, pos0, heads: hq, kv_heads: hkv, head_dim: dh, scale: 1.0 / (dh as f32).sqrt() };
            for order in [F16Dot::Gemm, F16Dot::Vec] {
                let want = causal_reference(&q, &k, &v, s, order);
                let got = causal(&q, &k, &v, s, order);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{order:?} t={t} pos0={pos0} hq={hq} hkv={hkv} dh={dh}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_exp_equals_ggml_expf() {
        use std::arch::x86_64::*;
        if !x86::available() {
            crate::test_support::report_skip("avx512f", "kernels::attention AVX-512 vector exp");
            return;
        }
        let mut xs: Vec<f32> = (-200_000..20_000).map(|i| i as f32 / 997.0).collect();
        xs.extend([0.0, -0.0, f32::NEG_INFINITY, -1e30, 88.7, 89.0, -87.5, -103.9, -150.0]);
        xs.resize(xs.len().div_ceil(16) * 16, 1.0);
        for chunk in xs.chunks_exact(16) {
            let mut out = [0.0f32; 16];
            // SAFETY: the features were detected above.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), x86_exp(_mm512_loadu_ps(chunk.as_ptr()))) };
            for (x, y) in chunk.iter().zip(out) {
                assert_eq!(y.to_bits(), ggml::expf(*x).to_bits(), "expf({x})");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma,f16c")]
    unsafe fn x86_exp(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
        x86::expf16_for_tests(x)
    }
}
