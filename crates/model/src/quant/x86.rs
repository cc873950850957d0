//! AVX2 + FMA + F16C dot kernels for the formats people run (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K), with
//! AVX-512 VNNI forms of the 32-element-block ones, picked at run time, and the dispatch to
//! the AVX2 kernels of every other format (`x86_legacy.rs`: Q5_0, Q5_1, IQ4_NL and the
//! 4-token/4-row forms of Q4_0 and Q8_0; `x86_kquant.rs`: Q2_K, Q3_K, Q5_K, IQ4_XS). Each computes the same integer sums as [`super::dot_reference`] (exact), then
//! scales them in f32; tests hold them to the reference.

use std::arch::x86_64::*;

use super::{ActRow, DotFn, QuantType, QK_K};

// The kernels of the other formats, as child modules so they share this module's helpers.
#[path = "x86_kquant.rs"]
mod kquant;
#[path = "x86_legacy.rs"]
mod legacy;

/// A 4-token kernel for `ty` (one weight row against four activation rows, the weight blocks
/// unpacked once), if this CPU has AVX2, FMA and F16C and one is written for `ty`. Each of its
/// four results is bit-identical to what [`kernel`]'s single dot gives for that token.
pub(super) fn kernel_x4(ty: QuantType) -> Option<super::Dot4Fn> {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
        return None;
    }
    // SAFETY: only returned after the features it needs were detected above.
    let f: super::Dot4Fn = match ty {
        QuantType::Q4_1 if vnni() => |w, a| unsafe { dot_q4_1_x4_vnni(w, a) },
        QuantType::Q4_1 => |w, a| unsafe { dot_q4_1_x4(w, a) },
        QuantType::Q4_0 => |w, a| unsafe { legacy::dot_x4::<{ legacy::Q4_0 }>(w, a) },
        QuantType::Q5_0 => |w, a| unsafe { legacy::dot_x4::<{ legacy::Q5_0 }>(w, a) },
        QuantType::Q5_1 => |w, a| unsafe { legacy::dot_x4::<{ legacy::Q5_1 }>(w, a) },
        QuantType::Q8_0 => |w, a| unsafe { legacy::dot_x4::<{ legacy::Q8_0 }>(w, a) },
        QuantType::IQ4_NL => |w, a| unsafe { legacy::dot_x4::<{ legacy::IQ4_NL }>(w, a) },
        QuantType::Q2_K => |w, a| unsafe { kquant::dot_q2_k::<4>(w, a) },
        QuantType::Q3_K => |w, a| unsafe { kquant::dot_q3_k::<4>(w, a) },
        QuantType::Q5_K => |w, a| unsafe { kquant::dot_q5_k::<4>(w, a) },
        QuantType::IQ4_XS => |w, a| unsafe { kquant::dot_iq4_xs::<4>(w, a) },
        QuantType::Q4_K | QuantType::Q6_K if crate::kernels::plain_kernels() => return None,
        QuantType::Q4_K if avx512bw() => |w, a| unsafe { dot_q4_k_xn_512(w, a) },
        QuantType::Q4_K => |w, a| unsafe { dot_q4_k_x4(w, a) },
        QuantType::Q6_K if avx512bw() => |w, a| unsafe { dot_q6_k_xn_512(w, a) },
        QuantType::Q6_K => |w, a| unsafe { dot_q6_k_x4(w, a) },
    };
    Some(f)
}

/// An 8-token kernel for `ty` (one weight row against eight activation rows), where one is
/// written for `ty`: the k-quant tiles, whose weight unpacking then serves twice as many
/// tokens (Q4_K and Q6_K with AVX-512 BW; Q2_K, Q3_K, Q5_K and IQ4_XS with AVX2). Each result
/// bit-identical to [`kernel`]'s single dot.
pub(super) fn kernel_x8(ty: QuantType) -> Option<super::Dot8Fn> {
    let have = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
    if !have || crate::kernels::plain_kernels() {
        return None;
    }
    // SAFETY: only returned after the features it needs were detected above.
    let f: super::Dot8Fn = match ty {
        QuantType::Q4_K if avx512bw() => |w, a| unsafe { dot_q4_k_xn_512(w, a) },
        QuantType::Q6_K if avx512bw() => |w, a| unsafe { dot_q6_k_xn_512(w, a) },
        QuantType::Q2_K => |w, a| unsafe { kquant::dot_q2_k::<8>(w, a) },
        QuantType::Q3_K => |w, a| unsafe { kquant::dot_q3_k::<8>(w, a) },
        QuantType::Q5_K => |w, a| unsafe { kquant::dot_q5_k::<8>(w, a) },
        QuantType::IQ4_XS => |w, a| unsafe { kquant::dot_iq4_xs::<8>(w, a) },
        _ => return None,
    };
    Some(f)
}

/// How far ahead of the weight stream the decode kernels prefetch, in bytes. A one-token matmul
/// reads every weight byte once, front to back, and the hardware prefetchers stop at every 4 KiB
/// page boundary, so without this a core spends most of a decode step waiting on memory.
/// Measured on SmolLM2 Q4_1 decode, 1 thread: none 49 tok/s, 1 KiB ahead 56, 2 KiB 68,
/// 4–16 KiB 79–80 (llama.cpp 65 in the same minute).
const PREFETCH_AHEAD: usize = 4096;

/// Prefetches the cache lines of `PREFETCH_AHEAD + off .. PREFETCH_AHEAD + off + LEN` past
/// `base` into L2 (`prefetcht1`): what a kernel that consumes `LEN` bytes of its weight stream
/// per step will reach `PREFETCH_AHEAD` bytes later. Issued at 64-byte steps from the start,
/// so consecutive steps leave no line out. The address may lie past the weights (a prefetch
/// never faults), hence the wrapping arithmetic.
///
/// Into L2 rather than L1 (`prefetcht0`): on Intel a line on its way to L1 holds one of the
/// core's few (16) fill buffers until it arrives, which caps a core's memory stream; L2 takes
/// more requests in flight, and the line moves on to L1 from L2 when the kernel loads it.
/// Qwen3.5-4B-shape Q4_K_M decode, 2 threads, Xeon with AVX-512, seven alternating runs of
/// each build: 5.31 → 5.67 tok/s (median) after 1K tokens, 4.68 → 5.06 after 8K (the attention
/// kernel's prefetch moved to L2 too), faster in 6 of 7 pairs each (AMD cores treat the hints
/// alike).
#[inline(always)]
pub(super) unsafe fn prefetch_ahead<const LEN: usize>(base: *const u8, off: usize) {
    let p = base.wrapping_add(PREFETCH_AHEAD + off);
    let mut l = 0;
    while l < LEN {
        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(l) as *const i8);
        l += 64;
    }
}

/// Whether this CPU has AVX-512 VNNI with 256-bit forms (AVX-512 VL).
fn vnni() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// Whether this CPU has AVX-512 with byte/word instructions (BW) and 256-bit forms (VL).
fn avx512bw() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vl")
}

/// The two f16 at `p` and `p + 2` widened with F16C (reads 4 bytes). One zero-extending 32-bit
/// load: a 16-bit insert would merge into a live register and chain every block of a dot to the
/// previous one's float additions.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16x2(p: *const u8) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_loadu_si32(p));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// The f16 at `p` widened with F16C (reads 4 bytes, `p..p + 4`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16c(p: *const u8) -> f32 {
    f16x2(p).0
}

/// A 4-row kernel for `ty` (four consecutive weight rows against one activation row), if this
/// CPU has AVX2, FMA and F16C and one is written for `ty`. Each result is bit-identical to what
/// [`kernel`]'s single dot gives for that row.
pub(super) fn kernel_rows4(ty: QuantType) -> Option<super::DotRows4Fn> {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
        return None;
    }
    // SAFETY: only returned after the features it needs were detected above.
    let f: super::DotRows4Fn = match ty {
        QuantType::Q4_1 if vnni() => |w, a| unsafe { dot_q4_1_r4_vnni(w, a) },
        QuantType::Q4_1 => |w, a| unsafe { dot_q4_1_r4(w, a) },
        QuantType::Q8_0 if vnni() => |w, a| unsafe { dot_q8_0_r4_vnni(w, a) },
        QuantType::Q8_0 => |w, a| unsafe { dot_q8_0_r4(w, a) },
        QuantType::Q4_0 => |w, a| unsafe { legacy::dot_rows4::<{ legacy::Q4_0 }>(w, a) },
        QuantType::Q5_0 => |w, a| unsafe { legacy::dot_rows4::<{ legacy::Q5_0 }>(w, a) },
        QuantType::Q5_1 => |w, a| unsafe { legacy::dot_rows4::<{ legacy::Q5_1 }>(w, a) },
        QuantType::IQ4_NL => |w, a| unsafe { legacy::dot_rows4::<{ legacy::IQ4_NL }>(w, a) },
        _ => return None,
    };
    Some(f)
}

/// The SIMD kernel for `ty`, if this CPU has AVX2 and FMA and one is written for `ty`.
pub(super) fn kernel(ty: QuantType) -> Option<DotFn> {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
        return None;
    }
    // SAFETY (all wrappers): only returned after the features they need were detected above.
    let f: DotFn = match ty {
        QuantType::Q4_0 if vnni() => |w, a| unsafe { dot_q4_0_vnni(w, a) },
        QuantType::Q4_1 if vnni() => |w, a| unsafe { dot_q4_1_vnni(w, a) },
        QuantType::Q8_0 if vnni() => |w, a| unsafe { dot_q8_0_vnni(w, a) },
        QuantType::Q4_0 => |w, a| unsafe { dot_q4_0(w, a) },
        QuantType::Q4_1 => |w, a| unsafe { dot_q4_1(w, a) },
        QuantType::Q8_0 => |w, a| unsafe { dot_q8_0(w, a) },
        QuantType::Q4_K => |w, a| unsafe { dot_q4_k(w, a) },
        QuantType::Q6_K => |w, a| unsafe { dot_q6_k(w, a) },
        QuantType::Q5_0 => |w, a| unsafe { legacy::dot::<{ legacy::Q5_0 }>(w, a) },
        QuantType::Q5_1 => |w, a| unsafe { legacy::dot::<{ legacy::Q5_1 }>(w, a) },
        QuantType::IQ4_NL => |w, a| unsafe { legacy::dot::<{ legacy::IQ4_NL }>(w, a) },
        QuantType::Q2_K => |w, a| unsafe { kquant::dot_q2_k::<1>(w, &[*a])[0] },
        QuantType::Q3_K => |w, a| unsafe { kquant::dot_q3_k::<1>(w, &[*a])[0] },
        QuantType::Q5_K => |w, a| unsafe { kquant::dot_q5_k::<1>(w, &[*a])[0] },
        QuantType::IQ4_XS => |w, a| unsafe { kquant::dot_iq4_xs::<1>(w, &[*a])[0] },
    };
    Some(f)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// 32 nibbles from 16 bytes: low nibbles in the lower 128 bits, high nibbles in the upper.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn nibbles(p: *const u8) -> __m256i {
    let x = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Σ x·y over 32 signed byte pairs, as 8 i32 partial sums (sign trick for `maddubs`).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
}

/// Σ u·y over 32 (unsigned ≤ 127, signed) byte pairs, as 8 i32 partial sums.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_u8_i8(u: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1))
}

/// Σ |x|·sign(y, x) over 32 signed byte pairs with VNNI (`vpdpbusd`): the same 8 i32 lanes
/// (each the sum of 4 adjacent products) as [`dot_i8`], exactly.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn dot_i8_vnni(x: __m256i, y: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// Σ u·y over 32 (unsigned, signed) byte pairs with VNNI: the lanes of [`dot_u8_i8`], exactly.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn dot_u8_i8_vnni(u: __m256i, y: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, y)
}

/// The 32-element-block kernels (Q4_0, Q4_1, Q8_0 and the 4-token Q4_1), written once and
/// compiled twice: with `maddubs`/`madd` (AVX2) and with VNNI. Both give the same integer
/// lanes, so the same float results.
macro_rules! block32_kernels {
    (
        $feat:literal, $dot_i8:ident, $dot_u8:ident, $q4_0:ident, $q4_1:ident, $q8_0:ident, $q4_1_x4:ident,
        $q4_1_r4:ident, $q8_0_r4:ident
    ) => {
        /// Four consecutive Q4_1 rows (`w`, `4 · row bytes`) against one activation row: four
        /// independent chains and memory streams, each row summed exactly as [`$q4_1`] sums it.
        #[target_feature(enable = $feat)]
        unsafe fn $q4_1_r4(w: &[u8], a: &ActRow) -> [f32; 4] {
            let rb = w.len() / 4;
            let nb = rb / 20;
            debug_assert!(a.qs.len() >= nb * 32 && a.d.len() >= nb && a.s.len() >= nb);
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut mins = [0.0f32; 4];
            let (wp, yp) = (w.as_ptr(), a.qs.as_ptr() as *const u8);
            for ib in 0..nb {
                // The four rows are contiguous: 80 bytes of the group per step.
                prefetch_ahead::<80>(wp, ib * 80);
                let qy = _mm256_loadu_si256(yp.add(ib * 32) as *const __m256i);
                let (ad, asum) = (*a.d.get_unchecked(ib), *a.s.get_unchecked(ib));
                for k in 0..4 {
                    let b = wp.add(k * rb + ib * 20);
                    let (dw, mw) = f16x2(b);
                    mins[k] += mw * asum;
                    let d = _mm256_set1_ps(dw * ad);
                    acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps($dot_u8(nibbles(b.add(4)), qy)), acc[k]);
                }
            }
            [hsum_ps(acc[0]) + mins[0], hsum_ps(acc[1]) + mins[1], hsum_ps(acc[2]) + mins[2], hsum_ps(acc[3]) + mins[3]]
        }

        /// Four consecutive Q8_0 rows against one activation row, each as [`$q8_0`] sums it.
        #[target_feature(enable = $feat)]
        unsafe fn $q8_0_r4(w: &[u8], a: &ActRow) -> [f32; 4] {
            let rb = w.len() / 4;
            let nb = rb / 34;
            debug_assert!(a.qs.len() >= nb * 32 && a.d.len() >= nb);
            let mut acc = [_mm256_setzero_ps(); 4];
            let (wp, yp) = (w.as_ptr(), a.qs.as_ptr() as *const u8);
            for ib in 0..nb {
                prefetch_ahead::<136>(wp, ib * 136);
                let qy = _mm256_loadu_si256(yp.add(ib * 32) as *const __m256i);
                let ad = *a.d.get_unchecked(ib);
                for k in 0..4 {
                    let b = wp.add(k * rb + ib * 34);
                    let d = _mm256_set1_ps(f16c(b) * ad);
                    let qx = _mm256_loadu_si256(b.add(2) as *const __m256i);
                    acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps($dot_i8(qx, qy)), acc[k]);
                }
            }
            [hsum_ps(acc[0]), hsum_ps(acc[1]), hsum_ps(acc[2]), hsum_ps(acc[3])]
        }

        #[target_feature(enable = $feat)]
        unsafe fn $q4_0(w: &[u8], a: &ActRow) -> f32 {
            let nb = w.len() / 18;
            debug_assert!(a.qs.len() >= nb * 32 && a.d.len() >= nb);
            let mut acc = _mm256_setzero_ps();
            let (wp, yp) = (w.as_ptr(), a.qs.as_ptr() as *const u8);
            for ib in 0..nb {
                let b = wp.add(ib * 18);
                prefetch_ahead::<18>(b, 0);
                let d = _mm256_set1_ps(f16c(b) * *a.d.get_unchecked(ib));
                let qx = _mm256_sub_epi8(nibbles(b.add(2)), _mm256_set1_epi8(8));
                let qy = _mm256_loadu_si256(yp.add(ib * 32) as *const __m256i);
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps($dot_i8(qx, qy)), acc);
            }
            hsum_ps(acc)
        }

        #[target_feature(enable = $feat)]
        unsafe fn $q4_1(w: &[u8], a: &ActRow) -> f32 {
            let nb = w.len() / 20;
            debug_assert!(a.qs.len() >= nb * 32 && a.d.len() >= nb && a.s.len() >= nb);
            let mut acc = _mm256_setzero_ps();
            let mut mins = 0.0f32;
            let (wp, yp) = (w.as_ptr(), a.qs.as_ptr() as *const u8);
            for ib in 0..nb {
                let b = wp.add(ib * 20);
                prefetch_ahead::<20>(b, 0);
                let (dw, mw) = f16x2(b);
                let d = _mm256_set1_ps(dw * *a.d.get_unchecked(ib));
                mins += mw * *a.s.get_unchecked(ib);
                let qx = nibbles(b.add(4));
                let qy = _mm256_loadu_si256(yp.add(ib * 32) as *const __m256i);
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps($dot_u8(qx, qy)), acc);
            }
            hsum_ps(acc) + mins
        }

        #[target_feature(enable = $feat)]
        unsafe fn $q8_0(w: &[u8], a: &ActRow) -> f32 {
            let nb = w.len() / 34;
            debug_assert!(a.qs.len() >= nb * 32 && a.d.len() >= nb);
            let mut acc = _mm256_setzero_ps();
            let (wp, yp) = (w.as_ptr(), a.qs.as_ptr() as *const u8);
            for ib in 0..nb {
                let b = wp.add(ib * 34);
                prefetch_ahead::<34>(b, 0);
                let d = _mm256_set1_ps(f16c(b) * *a.d.get_unchecked(ib));
                let qx = _mm256_loadu_si256(b.add(2) as *const __m256i);
                let qy = _mm256_loadu_si256(yp.add(ib * 32) as *const __m256i);
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps($dot_i8(qx, qy)), acc);
            }
            hsum_ps(acc)
        }

        #[target_feature(enable = $feat)]
        unsafe fn $q4_1_x4(w: &[u8], a: &[ActRow; 4]) -> [f32; 4] {
            let nb = w.len() / 20;
            for r in a {
                debug_assert!(r.qs.len() >= nb * 32 && r.d.len() >= nb && r.s.len() >= nb);
            }
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut mins = [0.0f32; 4];
            let wp = w.as_ptr();
            for ib in 0..nb {
                let b = wp.add(ib * 20);
                let (dw, mw) = f16x2(b);
                let qx = nibbles(b.add(4));
                for k in 0..4 {
                    let r = &a[k];
                    let d = _mm256_set1_ps(dw * *r.d.get_unchecked(ib));
                    mins[k] += mw * *r.s.get_unchecked(ib);
                    let qy = _mm256_loadu_si256((r.qs.as_ptr() as *const u8).add(ib * 32) as *const __m256i);
                    acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps($dot_u8(qx, qy)), acc[k]);
                }
            }
            [hsum_ps(acc[0]) + mins[0], hsum_ps(acc[1]) + mins[1], hsum_ps(acc[2]) + mins[2], hsum_ps(acc[3]) + mins[3]]
        }
    };
}

block32_kernels!(
    "avx2,fma,f16c",
    dot_i8,
    dot_u8_i8,
    dot_q4_0,
    dot_q4_1,
    dot_q8_0,
    dot_q4_1_x4,
    dot_q4_1_r4,
    dot_q8_0_r4
);
block32_kernels!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    dot_i8_vnni,
    dot_u8_i8_vnni,
    dot_q4_0_vnni,
    dot_q4_1_vnni,
    dot_q8_0_vnni,
    dot_q4_1_x4_vnni,
    dot_q4_1_r4_vnni,
    dot_q8_0_r4_vnni
);

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k(w: &[u8], a: &ActRow) -> f32 {
    let nb = w.len() / 144;
    debug_assert!(a.qs.len() >= nb * QK_K && a.d.len() >= nb && a.bsums.len() >= nb * 16);
    let mask = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let yp = a.qs.as_ptr() as *const u8;
    for ib in 0..nb {
        let b = w.as_ptr().add(ib * 144);
        prefetch_ahead::<144>(b, 0);
        let (d, dmin) = f16x2(b);
        let sm = q4k_scales_mins_vec(b.add(4));
        let sc: [u8; 16] = std::mem::transmute(sm);
        let mut sumi = _mm256_setzero_si256();
        let q = b.add(16);
        let y = yp.add(ib * QK_K);
        for j in 0..4 {
            let (s0, s1) = (sc[2 * j], sc[2 * j + 1]);
            let bits = _mm256_loadu_si256(q.add(32 * j) as *const __m256i);
            let lo = _mm256_and_si256(bits, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), mask);
            let ylo = _mm256_loadu_si256(y.add(64 * j) as *const __m256i);
            let yhi = _mm256_loadu_si256(y.add(64 * j + 32) as *const __m256i);
            let plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_set1_epi16(s0 as i16));
            let phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi), _mm256_set1_epi16(s1 as i16));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
        }
        let m = _mm256_madd_epi16(load_bsums(a, ib), q4k_mins16(sm));
        acc = q4k_accumulate(acc, sumi, m, _mm256_set1_ps(d), _mm256_set1_ps(dmin), a.d.as_ptr().add(ib));
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k(w: &[u8], a: &ActRow) -> f32 {
    let nb = w.len() / 210;
    debug_assert!(a.qs.len() >= nb * QK_K && a.d.len() >= nb && a.bsums.len() >= nb * 16);
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let yp = a.qs.as_ptr() as *const u8;
    for ib in 0..nb {
        let b = &w[ib * 210..(ib + 1) * 210];
        prefetch_ahead::<210>(b.as_ptr(), 0);
        // The last two bytes of the block: read from 206 so as not to run past it.
        let d = f16x2(b.as_ptr().add(206)).1;
        let sc = &b[192..208];
        let mut sumi = _mm256_setzero_si256();
        let y = yp.add(ib * QK_K);
        for n in 0..2 {
            let ql = b.as_ptr().add(64 * n);
            let qh = _mm256_loadu_si256(b.as_ptr().add(128 + 32 * n) as *const __m256i);
            let ql0 = _mm256_loadu_si256(ql as *const __m256i);
            let ql1 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
            let quarters = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0xC0u8 as i8)), 2),
                ),
            ];
            for (k, qv) in quarters.iter().enumerate() {
                let g = n * 8 + 2 * k;
                let scale =
                    _mm256_set_m128i(_mm_set1_epi16(sc[g + 1] as i8 as i16), _mm_set1_epi16(sc[g] as i8 as i16));
                let yv = _mm256_loadu_si256(y.add(128 * n + 32 * k) as *const __m256i);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(*qv, yv), scale));
            }
        }
        acc = q6k_accumulate(acc, sumi, load_bsums(a, ib), q6k_scales16(b.as_ptr()), *a.d.get_unchecked(ib) * d);
    }
    hsum_ps(acc)
}

// ---------------------------------------------------------------------------------------------
// k-quant multi-token kernels: one weight row against four activation rows (tokens), each
// super-block unpacked once for all four. The integer sums of a super-block are exact whatever
// the lane layout, and the float epilogue per super-block is written as the single dots write
// it, so every result is bit-identical to `dot_q4_k` / `dot_q6_k` for that token.

/// The eight 6-bit scales (bytes 0..8) and eight minimums (bytes 8..16) of a Q4_K `scales[12]`
/// field at `p` ([`super::scale_min_k4`]'s values), unpacked in general registers with ggml's
/// masks, without a round trip through memory (byte stores followed by a vector load stall on
/// store forwarding).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_scales_mins_vec(p: *const u8) -> __m128i {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let u0 = (p as *const u32).read_unaligned();
    let u1 = (p.add(4) as *const u32).read_unaligned();
    let u2 = (p.add(8) as *const u32).read_unaligned();
    let sc_lo = u0 & LOW6;
    let sc_hi = (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4);
    let mn_lo = u1 & LOW6;
    let mn_hi = ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4);
    _mm_set_epi32(mn_hi as i32, mn_lo as i32, sc_hi as i32, sc_lo as i32)
}

/// Each minimum of a Q4_K super-block twice, as sixteen words (one per group of 16, the
/// layout of the activation's `bsums`), from [`q4k_scales_mins_vec`]'s register.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_mins16(sm: __m128i) -> __m256i {
    _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm))
}

/// The sixteen signed scales of a Q6_K super-block starting at `b`, as words.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_scales16(b: *const u8) -> __m256i {
    _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192) as *const __m128i))
}

/// The sixteen block sums (per group of 16) of super-block `ib` of an activation row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_bsums(a: &ActRow, ib: usize) -> __m256i {
    _mm256_loadu_si256(a.bsums.as_ptr().add(ib * 16) as *const __m256i)
}

/// The float step that ends a Q4_K super-block in every Q4_K kernel (one token or a tile, AVX2
/// or AVX-512), so that all of them give the same bits for a token: eight integer lanes `s` of
/// the scaled dot and eight lanes `m` of the minimum correction (`bsums · mins`) become
/// `d·s − dmin·m` (`d`, `dmin` broadcast once per super-block and shared by every token), and
/// that, times the token's activation scale `ad` (a broadcast load), is added to the token's
/// eight-lane accumulator. No horizontal sum per super-block: one at the end.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_accumulate(acc: __m256, s: __m256i, m: __m256i, d: __m256, dmin: __m256, ad: *const f32) -> __m256 {
    let v = _mm256_fmsub_ps(d, _mm256_cvtepi32_ps(s), _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(m)));
    _mm256_fmadd_ps(_mm256_broadcast_ss(&*ad), v, acc)
}

/// The same for Q6_K: lanes `s` of the scaled dot minus 32 × (`bsums · scales`), the offset of
/// the stored values, exact in integers, then one multiply-add by `d · ad`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_accumulate(acc: __m256, s: __m256i, bsums: __m256i, sc16: __m256i, d_ad: f32) -> __m256 {
    let t = _mm256_sub_epi32(s, _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, sc16)));
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(d_ad), acc)
}

/// Q4_K, one row × four tokens, AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k_x4(w: &[u8], a: &[ActRow; 4]) -> [f32; 4] {
    let nb = w.len() / 144;
    for r in a {
        debug_assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.bsums.len() >= nb * 16);
    }
    let mask = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); 4];
    for ib in 0..nb {
        let b = w.as_ptr().add(ib * 144);
        let (d, dmin) = f16x2(b);
        let sm = q4k_scales_mins_vec(b.add(4));
        let sc: [u8; 16] = std::mem::transmute(sm);
        let mut sumi = [_mm256_setzero_si256(); 4];
        for j in 0..4 {
            let bits = _mm256_loadu_si256(b.add(16 + 32 * j) as *const __m256i);
            let lo = _mm256_and_si256(bits, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), mask);
            let (s0, s1) = (_mm256_set1_epi16(sc[2 * j] as i16), _mm256_set1_epi16(sc[2 * j + 1] as i16));
            for k in 0..4 {
                let y = (a[k].qs.as_ptr() as *const u8).add(ib * QK_K + 64 * j);
                let ylo = _mm256_loadu_si256(y as *const __m256i);
                let yhi = _mm256_loadu_si256(y.add(32) as *const __m256i);
                let plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo), s0);
                let phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi), s1);
                sumi[k] = _mm256_add_epi32(sumi[k], _mm256_add_epi32(plo, phi));
            }
        }
        let mins16 = q4k_mins16(sm);
        let (dv, dminv) = (_mm256_set1_ps(d), _mm256_set1_ps(dmin));
        for k in 0..4 {
            let m = _mm256_madd_epi16(load_bsums(&a[k], ib), mins16);
            acc[k] = q4k_accumulate(acc[k], sumi[k], m, dv, dminv, a[k].d.as_ptr().add(ib));
        }
    }
    acc.map(|v| hsum_ps(v))
}

/// Q4_K, one row × `N` tokens (a multiple of 4), AVX-512 (BW): the low and high nibbles of 32
/// weight bytes (64 consecutive elements, two scale groups) in one register, unpacked once for
/// all `N` tokens.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn dot_q4_k_xn_512<const N: usize>(w: &[u8], a: &[ActRow; N]) -> [f32; N] {
    let nb = w.len() / 144;
    for r in a {
        debug_assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.bsums.len() >= nb * 16);
    }
    let mask = _mm512_set1_epi8(0x0F);
    // Word lane l of scale register j holds scale 2j + l / 16 (the low nibbles of 32 bytes are
    // sub-block 2j, the high nibbles 2j + 1).
    let idx: [__m512i; 4] = std::array::from_fn(|j| {
        let v: [i16; 32] = std::array::from_fn(|l| (2 * j + l / 16) as i16);
        _mm512_loadu_si512(v.as_ptr() as *const _)
    });
    let mut acc = [_mm256_setzero_ps(); N];
    for ib in 0..nb {
        let b = w.as_ptr().add(ib * 144);
        let (d, dmin) = f16x2(b);
        let sm = q4k_scales_mins_vec(b.add(4));
        // The scales as words (lanes 0..8).
        let sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sm));
        let mut sumi = [_mm512_setzero_si512(); N];
        for (j, ix) in idx.iter().enumerate() {
            let bits = _mm256_loadu_si256(b.add(16 + 32 * j) as *const __m256i);
            let both = _mm512_inserti64x4(_mm512_castsi256_si512(bits), _mm256_srli_epi16(bits, 4), 1);
            let q = _mm512_and_si512(both, mask);
            let s = _mm512_permutexvar_epi16(*ix, sc16);
            for k in 0..N {
                let y = _mm512_loadu_si512((a[k].qs.as_ptr() as *const u8).add(ib * QK_K + 64 * j) as *const _);
                sumi[k] = _mm512_add_epi32(sumi[k], _mm512_madd_epi16(_mm512_maddubs_epi16(q, y), s));
            }
        }
        // The two halves' lanes added give the AVX2 kernels' eight lanes exactly.
        let mins16 = q4k_mins16(sm);
        let (dv, dminv) = (_mm256_set1_ps(d), _mm256_set1_ps(dmin));
        for k in 0..N {
            let m = _mm256_madd_epi16(load_bsums(&a[k], ib), mins16);
            acc[k] = q4k_accumulate(acc[k], half_sum(sumi[k]), m, dv, dminv, a[k].d.as_ptr().add(ib));
        }
    }
    acc.map(|v| hsum_ps(v))
}

/// The two 256-bit halves of `v` added (16 i32 lanes to 8).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn half_sum(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// The four 6-bit quarters of half `n` of a Q6_K super-block (`b` its start): quarter `k` holds
/// elements `128n + 32k ..`, values 0..63 (still offset by 32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_quarters(b: *const u8, n: usize) -> [__m256i; 4] {
    let m4 = _mm256_set1_epi8(0x0F);
    let ql = b.add(64 * n);
    let qh = _mm256_loadu_si256(b.add(128 + 32 * n) as *const __m256i);
    let ql0 = _mm256_loadu_si256(ql as *const __m256i);
    let ql1 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
    [
        _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4)),
        _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, _mm256_set1_epi8(0x30))),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
            _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0xC0u8 as i8)), 2),
        ),
    ]
}

/// Q6_K, one row × four tokens, AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k_x4(w: &[u8], a: &[ActRow; 4]) -> [f32; 4] {
    let nb = w.len() / 210;
    for r in a {
        debug_assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.bsums.len() >= nb * 16);
    }
    let mut acc = [_mm256_setzero_ps(); 4];
    for ib in 0..nb {
        let b = w.as_ptr().add(ib * 210);
        let d = f16x2(b.add(206)).1;
        let sc = std::slice::from_raw_parts(b.add(192), 16);
        let mut sumi = [_mm256_setzero_si256(); 4];
        for n in 0..2 {
            let quarters = q6k_quarters(b, n);
            for (kq, qv) in quarters.iter().enumerate() {
                let g = n * 8 + 2 * kq;
                let scale =
                    _mm256_set_m128i(_mm_set1_epi16(sc[g + 1] as i8 as i16), _mm_set1_epi16(sc[g] as i8 as i16));
                for k in 0..4 {
                    let y = (a[k].qs.as_ptr() as *const u8).add(ib * QK_K + 128 * n + 32 * kq);
                    let yv = _mm256_loadu_si256(y as *const __m256i);
                    sumi[k] = _mm256_add_epi32(sumi[k], _mm256_madd_epi16(_mm256_maddubs_epi16(*qv, yv), scale));
                }
            }
        }
        let sc16 = q6k_scales16(b);
        for k in 0..4 {
            acc[k] = q6k_accumulate(acc[k], sumi[k], load_bsums(&a[k], ib), sc16, *a[k].d.get_unchecked(ib) * d);
        }
    }
    acc.map(|v| hsum_ps(v))
}

/// Q6_K, one row × `N` tokens (a multiple of 4), AVX-512 (BW): two quarters (64 consecutive
/// elements, four scale groups) per register, unpacked once for all `N` tokens.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn dot_q6_k_xn_512<const N: usize>(w: &[u8], a: &[ActRow; N]) -> [f32; N] {
    let nb = w.len() / 210;
    for r in a {
        debug_assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.bsums.len() >= nb * 16);
    }
    // Word lane l of a 512-bit register covers element group 4·c + l / 8 of its 64 elements.
    let idx: [__m512i; 4] = std::array::from_fn(|c| {
        let v: [i16; 32] = std::array::from_fn(|l| (4 * c + l / 8) as i16);
        _mm512_loadu_si512(v.as_ptr() as *const _)
    });
    let mut acc = [_mm256_setzero_ps(); N];
    for ib in 0..nb {
        let b = w.as_ptr().add(ib * 210);
        let d = f16x2(b.add(206)).1;
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192) as *const __m128i));
        let mut sumi = [_mm512_setzero_si512(); N];
        for n in 0..2 {
            let q = q6k_quarters(b, n);
            let pairs = [
                _mm512_inserti64x4(_mm512_castsi256_si512(q[0]), q[1], 1),
                _mm512_inserti64x4(_mm512_castsi256_si512(q[2]), q[3], 1),
            ];
            for (h, qv) in pairs.iter().enumerate() {
                let scale = _mm512_permutexvar_epi16(idx[2 * n + h], _mm512_castsi256_si512(sc16));
                for k in 0..N {
                    let y = (a[k].qs.as_ptr() as *const u8).add(ib * QK_K + 128 * n + 64 * h);
                    let yv = _mm512_loadu_si512(y as *const _);
                    sumi[k] = _mm512_add_epi32(sumi[k], _mm512_madd_epi16(_mm512_maddubs_epi16(*qv, yv), scale));
                }
            }
        }
        for k in 0..N {
            acc[k] =
                q6k_accumulate(acc[k], half_sum(sumi[k]), load_bsums(&a[k], ib), sc16, *a[k].d.get_unchecked(ib) * d);
        }
    }
    acc.map(|v| hsum_ps(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::random_blocks;
    use crate::quant::{dot_reference, QuantizedActs};
    use crate::test_support::report_skip;

    fn avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }

    /// Every compiled form of the 32-element-block dots equals the scalar reference: the AVX2
    /// forms wherever AVX2 runs (so an AVX2-only machine checks them too), the VNNI forms where
    /// the CPU has VNNI, bit-identical to the AVX2 ones (same integer lanes, same float order).
    /// The 4-token and 4-row forms give, bit for bit, the single dot of each token and row.
    #[test]
    fn block32_dots_of_every_compiled_isa_equal_the_reference() {
        if !avx2() {
            report_skip("avx2+fma+f16c", "quant::x86 AVX2 block-32 dots");
            return;
        }
        let have_vnni = vnni();
        if !have_vnni {
            report_skip("avx512vnni", "quant::x86 VNNI block-32 dots (Q4_0, Q4_1, Q8_0; 4-token, 4-row)");
        }
        let cols = 1024;
        let x: Vec<f32> = (0..4 * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
        for ty in [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q8_0] {
            let w = random_blocks(ty, cols / 32, 5);
            let acts = QuantizedActs::new(ty.act_format(), &x, 4);
            let rows = [acts.row(0), acts.row(1), acts.row(2), acts.row(3)];
            // SAFETY (all calls below): AVX2/FMA/F16C were detected above, VNNI where `have_vnni`.
            let single = |w: &[u8], r: &ActRow| unsafe {
                match ty {
                    QuantType::Q4_0 => dot_q4_0(w, r),
                    QuantType::Q4_1 => dot_q4_1(w, r),
                    _ => dot_q8_0(w, r),
                }
            };
            let single_vnni = |w: &[u8], r: &ActRow| unsafe {
                match ty {
                    QuantType::Q4_0 => dot_q4_0_vnni(w, r),
                    QuantType::Q4_1 => dot_q4_1_vnni(w, r),
                    _ => dot_q8_0_vnni(w, r),
                }
            };
            for r in &rows {
                let (want, got) = (dot_reference(ty, &w, r), single(&w, r));
                assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "{ty} avx2: {got} vs reference {want}");
                if have_vnni {
                    assert_eq!(got.to_bits(), single_vnni(&w, r).to_bits(), "{ty} vnni vs avx2");
                }
            }
            let w4 = random_blocks(ty, 4 * cols / 32, 9);
            let rb = w4.len() / 4;
            for r in &rows {
                let want: Vec<u32> = w4.chunks_exact(rb).map(|row| single(row, r).to_bits()).collect();
                let forms = unsafe {
                    match ty {
                        QuantType::Q4_1 => vec![
                            ("avx2", Some(dot_q4_1_r4(&w4, r))),
                            ("vnni", have_vnni.then(|| dot_q4_1_r4_vnni(&w4, r))),
                        ],
                        QuantType::Q8_0 => vec![
                            ("avx2", Some(dot_q8_0_r4(&w4, r))),
                            ("vnni", have_vnni.then(|| dot_q8_0_r4_vnni(&w4, r))),
                        ],
                        _ => vec![],
                    }
                };
                for (isa, y) in forms {
                    if let Some(y) = y {
                        assert_eq!(y.map(f32::to_bits).to_vec(), want, "{ty} rows4 {isa}");
                    }
                }
                if let Some(r4) = kernel_rows4(ty) {
                    assert_eq!(r4(&w4, r).map(f32::to_bits).to_vec(), want, "{ty} dispatched rows4");
                }
            }
            if ty == QuantType::Q4_1 {
                let want: Vec<u32> = rows.iter().map(|r| single(&w, r).to_bits()).collect();
                let avx2 = unsafe { dot_q4_1_x4(&w, &rows) };
                assert_eq!(avx2.map(f32::to_bits).to_vec(), want, "Q4_1 x4 avx2");
                if have_vnni {
                    let fast = unsafe { dot_q4_1_x4_vnni(&w, &rows) };
                    assert_eq!(fast.map(f32::to_bits).to_vec(), want, "Q4_1 x4 vnni");
                }
            }
        }
    }

    /// The k-quant single dots (AVX2, the kernels every CPU with AVX2 runs for Q4_K and Q6_K rows
    /// that are not packed) equal the scalar reference on ragged super-block counts.
    #[test]
    fn k_quant_avx2_dots_equal_the_reference() {
        if !avx2() {
            report_skip("avx2+fma+f16c", "quant::x86 AVX2 Q4_K/Q6_K dots");
            return;
        }
        for (nsb, seed) in [(1usize, 1u64), (3, 2), (11, 4)] {
            let cols = nsb * QK_K;
            let x: Vec<f32> = (0..cols).map(|i| ((i * 7919 + seed as usize) % 1013) as f32 / 37.0 - 13.7).collect();
            let acts = QuantizedActs::new(crate::quant::ActFormat::Q8_K, &x, 1);
            for ty in [QuantType::Q4_K, QuantType::Q6_K] {
                let w = random_blocks(ty, nsb, seed);
                let want = dot_reference(ty, &w, &acts.row(0));
                // SAFETY: detected above.
                let got = unsafe {
                    if ty == QuantType::Q4_K {
                        dot_q4_k(&w, &acts.row(0))
                    } else {
                        dot_q6_k(&w, &acts.row(0))
                    }
                };
                assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "{ty} {nsb} super-blocks: {got} vs {want}");
            }
        }
    }

    /// The k-quant 4-token kernels (AVX2 and AVX-512) are bit-identical, token by token, to the
    /// single dots, on ragged super-block counts and activations of very different magnitudes.
    #[test]
    fn k_quant_token_tiles_equal_the_single_dots() {
        if !avx2() {
            report_skip("avx2+fma+f16c", "quant::x86 AVX2 Q4_K/Q6_K 4-token tiles");
            return;
        }
        if !avx512bw() {
            report_skip("avx512bw", "quant::x86 AVX-512 Q4_K/Q6_K 4- and 8-token tiles");
        }
        for (nsb, seed) in [(1usize, 1u64), (3, 2), (10, 3), (11, 4)] {
            let cols = nsb * QK_K;
            let x: Vec<f32> = (0..4 * cols)
                .map(|i| {
                    let v = ((i * 7919 + seed as usize * 31) % 1013) as f32 - 506.0;
                    v / 37.0
                        * if (i / cols).is_multiple_of(2) { 1.0 } else { 1e-3 }
                        * if i % 97 == 0 { 50.0 } else { 1.0 }
                })
                .collect();
            let acts = QuantizedActs::new(crate::quant::ActFormat::Q8_K, &x, 4);
            let rows = [acts.row(0), acts.row(1), acts.row(2), acts.row(3)];
            for ty in [QuantType::Q4_K, QuantType::Q6_K] {
                let single = kernel(ty).unwrap();
                for r in 0..5u64 {
                    let w = random_blocks(ty, nsb, seed * 100 + r);
                    let want: Vec<u32> = rows.iter().map(|a| single(&w, a).to_bits()).collect();
                    // SAFETY: AVX2/FMA/F16C detected above; the AVX-512 forms only where detected.
                    let avx2 = unsafe {
                        if ty == QuantType::Q4_K {
                            dot_q4_k_x4(&w, &rows)
                        } else {
                            dot_q6_k_x4(&w, &rows)
                        }
                    };
                    assert_eq!(avx2.map(f32::to_bits).to_vec(), want, "{ty} avx2 x4, {nsb} super-blocks");
                    if avx512bw() {
                        // SAFETY: detected just above.
                        let z = unsafe {
                            if ty == QuantType::Q4_K {
                                dot_q4_k_xn_512(&w, &rows)
                            } else {
                                dot_q6_k_xn_512(&w, &rows)
                            }
                        };
                        assert_eq!(z.map(f32::to_bits).to_vec(), want, "{ty} avx512 x4, {nsb} super-blocks");
                    }
                    let via = kernel_x4(ty).unwrap()(&w, &rows);
                    assert_eq!(via.map(f32::to_bits).to_vec(), want, "{ty} dispatched x4");
                    if let Some(x8) = kernel_x8(ty) {
                        // Eight tokens: the four above, then the same four in reverse order.
                        let rows8 = [rows[0], rows[1], rows[2], rows[3], rows[3], rows[2], rows[1], rows[0]];
                        let want8: Vec<u32> = want.iter().chain(want.iter().rev()).copied().collect();
                        assert_eq!(x8(&w, &rows8).map(f32::to_bits).to_vec(), want8, "{ty} x8");
                    }
                }
            }
        }
    }
}
