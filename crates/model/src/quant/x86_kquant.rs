//! AVX2 + FMA + F16C kernels for the 256-element super-block formats that `x86` does not cover
//! (Q2_K, Q3_K, Q5_K, IQ4_XS) against Q8_K activations: one weight row against `N` tokens,
//! `N = 1` for decode and `N = 8`, then 4, for the prefill tiles.
//!
//! A super-block is unpacked once for all `N` tokens, and every token's sums and float steps
//! are the same whatever `N` is, so each result of the 4-token form is bit-identical to the
//! single dot for that token. The integer sums per super-block are exact (the same sums
//! [`crate::quant::dot_reference`] forms); only the order of the f32 additions differs from
//! the reference. Q5_K and Q2_K end a super-block with `x86`'s Q4_K epilogue (`d·Σ − dmin·m`).

use std::arch::x86_64::*;

use super::legacy::{f16_broadcast, iq4_table};
use super::{f16x2, hsum_ps, load_bsums, prefetch_ahead, q4k_accumulate, q4k_mins16, q4k_scales_mins_vec};
use crate::quant::{ActRow, QK_K};

/// Checks (in debug builds) that every token covers `nb` super-blocks.
#[inline(always)]
fn check_act<const N: usize>(a: &[ActRow; N], nb: usize) {
    for r in a {
        debug_assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.bsums.len() >= nb * 16);
    }
}

/// Token `k`'s 32 activation bytes at element `e` of super-block `ib`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn act32(a: &ActRow, ib: usize, e: usize) -> __m256i {
    _mm256_loadu_si256((a.qs.as_ptr() as *const u8).add(ib * QK_K + e) as *const __m256i)
}

/// The scales of the sixteen groups of 16 of a super-block as words (`sc16`, groups 0..8 in
/// the lower 128 bits) rearranged for the 32 elements `128n + 32j ..`: group `8n + 2j` in
/// every word of the lower half and `8n + 2j + 1` in the upper (the layout of a `madd`
/// against those elements' pair sums). One byte shuffle per 32 elements instead of two
/// scalar broadcasts.
struct ScalePairs {
    /// Byte shuffles picking word `2j` in the lower half and `2j + 1` in the upper.
    pick: [__m256i; 4],
}

impl ScalePairs {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn new() -> Self {
        ScalePairs {
            pick: std::array::from_fn(|j| {
                let c: [u8; 32] = std::array::from_fn(|i| {
                    let word = 2 * j + i / 16;
                    (2 * word + i % 2) as u8
                });
                _mm256_loadu_si256(c.as_ptr() as *const __m256i)
            }),
        }
    }

    /// Both halves of `sc16` set to its half `n` (groups `8n .. 8n + 8`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half(sc16: __m256i, n: usize) -> __m256i {
        if n == 0 {
            _mm256_permute2x128_si256::<0x00>(sc16, sc16)
        } else {
            _mm256_permute2x128_si256::<0x11>(sc16, sc16)
        }
    }

    /// The scales of elements `128n + 32j ..` from [`ScalePairs::half`]`(sc16, n)`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn get(&self, half: __m256i, j: usize) -> __m256i {
        _mm256_shuffle_epi8(half, self.pick[j])
    }
}

/// `q·y` for signed weight bytes `q` (|q| ≤ 127) given as `|q|` (`aq`) with `q` itself for the
/// sign, against signed activation bytes: 16 word lanes of pair sums, scaled by `scale` into 8
/// i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn signed_scaled(aq: __m256i, q: __m256i, y: __m256i, scale: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(y, q)), scale)
}

/// Q5_K (176 bytes: d, dmin, 12 bytes of 6-bit scales and minimums, 32 bytes of fifth bits,
/// 128 bytes of nibbles): one row × `N` tokens.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q5_k<const N: usize>(w: &[u8], a: &[ActRow; N]) -> [f32; N] {
    let nb = w.len() / 176;
    check_act(a, nb);
    let (m4, one) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(1));
    let mut acc = [_mm256_setzero_ps(); N];
    for ib in 0..nb {
        let b = w.as_ptr().add(ib * 176);
        if N == 1 {
            prefetch_ahead::<176>(b, 0);
        }
        let (d, dmin) = f16x2(b);
        let sm = q4k_scales_mins_vec(b.add(4));
        let sc: [u8; 16] = std::mem::transmute(sm);
        // Bit s of byte l is the fifth bit of element 32·s + l; shifted down one sub-block at a
        // time (16-bit shifts: bit 0 of each byte still comes from that byte for s < 8).
        let mut qh = _mm256_loadu_si256(b.add(16) as *const __m256i);
        let mut sumi = [_mm256_setzero_si256(); N];
        for j in 0..4 {
            let bits = _mm256_loadu_si256(b.add(48 + 32 * j) as *const __m256i);
            let lo = _mm256_or_si256(_mm256_and_si256(bits, m4), _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
            qh = _mm256_srli_epi16(qh, 1);
            let hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(qh, one), 4),
            );
            qh = _mm256_srli_epi16(qh, 1);
            let (s0, s1) = (_mm256_set1_epi16(sc[2 * j] as i16), _mm256_set1_epi16(sc[2 * j + 1] as i16));
            for k in 0..N {
                let plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, act32(&a[k], ib, 64 * j)), s0);
                let phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, act32(&a[k], ib, 64 * j + 32)), s1);
                sumi[k] = _mm256_add_epi32(sumi[k], _mm256_add_epi32(plo, phi));
            }
        }
        let mins16 = q4k_mins16(sm);
        let (dv, dminv) = (_mm256_set1_ps(d), _mm256_set1_ps(dmin));
        for k in 0..N {
            let m = _mm256_madd_epi16(load_bsums(&a[k], ib), mins16);
            acc[k] = q4k_accumulate(acc[k], sumi[k], m, dv, dminv, a[k].d.as_ptr().add(ib));
        }
    }
    acc.map(|v| hsum_ps(v))
}

/// Q2_K (84 bytes: 16 bytes of 4-bit scale and minimum per group of 16, 64 bytes of 2-bit
/// values, d, dmin): one row × `N` tokens.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q2_k<const N: usize>(w: &[u8], a: &[ActRow; N]) -> [f32; N] {
    let nb = w.len() / 84;
    check_act(a, nb);
    let (m2, m4) = (_mm256_set1_epi8(3), _mm_set1_epi8(0x0F));
    let pairs = ScalePairs::new();
    let mut acc = [_mm256_setzero_ps(); N];
    for ib in 0..nb {
        let b = w.as_ptr().add(ib * 84);
        if N == 1 {
            prefetch_ahead::<84>(b, 0);
        }
        // The last four bytes of the block: d, dmin.
        let (d, dmin) = f16x2(b.add(80));
        let scv = _mm_loadu_si128(b as *const __m128i);
        let sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(scv, m4));
        let mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(scv, 4), m4));
        let mut sumi = [_mm256_setzero_si256(); N];
        for n in 0..2 {
            let bits = _mm256_loadu_si256(b.add(16 + 32 * n) as *const __m256i);
            let half = ScalePairs::half(sc16, n);
            // Element 128n + 32j + l is bits 2j, 2j + 1 of byte l; its group 8n + 2j + l / 16.
            let mut shifted = bits;
            for j in 0..4 {
                let q = _mm256_and_si256(shifted, m2);
                shifted = _mm256_srli_epi16(shifted, 2);
                let scale = pairs.get(half, j);
                for k in 0..N {
                    let y = act32(&a[k], ib, 128 * n + 32 * j);
                    sumi[k] = _mm256_add_epi32(sumi[k], _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), scale));
                }
            }
        }
        let (dv, dminv) = (_mm256_set1_ps(d), _mm256_set1_ps(dmin));
        for k in 0..N {
            let m = _mm256_madd_epi16(load_bsums(&a[k], ib), mins16);
            acc[k] = q4k_accumulate(acc[k], sumi[k], m, dv, dminv, a[k].d.as_ptr().add(ib));
        }
    }
    acc.map(|v| hsum_ps(v))
}

/// The sixteen signed scales (`s − 32`) of a Q3_K `scales[12]` field at `p` (the values of
/// [`crate::quant::q3k_scales`]), unpacked four at a time in general registers.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3k_scales_vec(p: *const u8) -> __m128i {
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let a0 = (p as *const u32).read_unaligned();
    let a1 = (p.add(4) as *const u32).read_unaligned();
    let a2 = (p.add(8) as *const u32).read_unaligned();
    // Groups 0..4 and 4..8 take the low nibbles of bytes 0..8, groups 8..16 the high ones; the
    // two high bits of group g are bits 2·(g / 4) of byte 8 + g % 4.
    let s0 = (a0 & LOW4) | ((a2 & LOW2) << 4);
    let s1 = (a1 & LOW4) | (((a2 >> 2) & LOW2) << 4);
    let s2 = ((a0 >> 4) & LOW4) | (((a2 >> 4) & LOW2) << 4);
    let s3 = ((a1 >> 4) & LOW4) | (((a2 >> 6) & LOW2) << 4);
    _mm_sub_epi8(_mm_set_epi32(s3 as i32, s2 as i32, s1 as i32, s0 as i32), _mm_set1_epi8(32))
}

/// Q3_K (110 bytes: 32 bytes of high bits, 64 bytes of 2-bit low parts, 12 bytes of 6-bit
/// scales, d): one row × `N` tokens. Values are `low − 4` where the high bit is clear, i.e.
/// `(low + 4·high) − 4`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q3_k<const N: usize>(w: &[u8], a: &[ActRow; N]) -> [f32; N] {
    let nb = w.len() / 110;
    check_act(a, nb);
    let (m2, four) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4));
    let pairs = ScalePairs::new();
    let mut acc = [_mm256_setzero_ps(); N];
    for ib in 0..nb {
        let b = w.as_ptr().add(ib * 110);
        if N == 1 {
            prefetch_ahead::<110>(b, 0);
        }
        let d = f16_broadcast(b.add(108));
        let sc16 = _mm256_cvtepi8_epi16(q3k_scales_vec(b.add(96)));
        let hmask = _mm256_loadu_si256(b as *const __m256i);
        let mut sumi = [_mm256_setzero_si256(); N];
        for n in 0..2 {
            let bits = _mm256_loadu_si256(b.add(32 + 32 * n) as *const __m256i);
            let half = ScalePairs::half(sc16, n);
            let mut shifted = bits;
            for j in 0..4 {
                let low = _mm256_and_si256(shifted, m2);
                shifted = _mm256_srli_epi16(shifted, 2);
                // Element 128n + 32j + l has its high bit at bit 4n + j of hmask byte l. The
                // value plus 4 (0..7, unsigned: no sign fix-up per token); the 4·Σy this adds
                // comes off once per super-block, from the block sums.
                let bit = _mm256_set1_epi8(1 << (4 * n + j));
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), bit);
                let q = _mm256_or_si256(low, _mm256_and_si256(set, four));
                let scale = pairs.get(half, j);
                for k in 0..N {
                    let y = act32(&a[k], ib, 128 * n + 32 * j);
                    sumi[k] = _mm256_add_epi32(sumi[k], _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), scale));
                }
            }
        }
        for k in 0..N {
            let offset = _mm256_slli_epi32::<2>(_mm256_madd_epi16(load_bsums(&a[k], ib), sc16));
            let dd = _mm256_mul_ps(d, _mm256_broadcast_ss(a[k].d.get_unchecked(ib)));
            acc[k] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[k], offset)), acc[k]);
        }
    }
    acc.map(|v| hsum_ps(v))
}

/// IQ4_XS (136 bytes: d, 16 bits of high scale bits, 4 bytes of low scale nibbles, 128 bytes of
/// 4-bit table indices): one row × `N` tokens. Eight groups of 32, each `(s − 32)·K[q]`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_iq4_xs<const N: usize>(w: &[u8], a: &[ActRow; N]) -> [f32; N] {
    let nb = w.len() / 136;
    check_act(a, nb);
    let (table, m4) = (iq4_table(), _mm256_set1_epi8(0x0F));
    let mut acc = [_mm256_setzero_ps(); N];
    for ib in 0..nb {
        let b = w.as_ptr().add(ib * 136);
        if N == 1 {
            prefetch_ahead::<136>(b, 0);
        }
        let d = f16_broadcast(b);
        let sh = u16::from_le_bytes([*b.add(2), *b.add(3)]) as u32;
        let sl = (b.add(4) as *const u32).read_unaligned();
        let mut sumi = [_mm256_setzero_si256(); N];
        for sb in 0..8 {
            let ls = ((sl >> (4 * sb)) & 0xF) | (((sh >> (2 * sb)) & 3) << 4);
            let scale = _mm256_set1_epi16(ls as i16 - 32);
            let x = _mm_loadu_si128(b.add(8 + 16 * sb) as *const __m128i);
            let idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), m4);
            let q = _mm256_shuffle_epi8(table, idx);
            let aq = _mm256_sign_epi8(q, q);
            for k in 0..N {
                sumi[k] = _mm256_add_epi32(sumi[k], signed_scaled(aq, q, act32(&a[k], ib, 32 * sb), scale));
            }
        }
        for k in 0..N {
            let dd = _mm256_mul_ps(d, _mm256_broadcast_ss(a[k].d.get_unchecked(ib)));
            acc[k] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sumi[k]), acc[k]);
        }
    }
    acc.map(|v| hsum_ps(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::{dot_magnitude, random_blocks};
    use crate::quant::{dot_reference, q3k_scales, ActFormat, QuantType, QuantizedActs};
    use crate::test_support::report_skip;

    fn avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }

    type Dot1 = unsafe fn(&[u8], &[ActRow; 1]) -> [f32; 1];
    type Dot4 = unsafe fn(&[u8], &[ActRow; 4]) -> [f32; 4];

    /// The form of `ty` for one token and for four.
    fn forms(ty: QuantType) -> (Dot1, Dot4) {
        match ty {
            QuantType::Q2_K => (dot_q2_k::<1>, dot_q2_k::<4>),
            QuantType::Q3_K => (dot_q3_k::<1>, dot_q3_k::<4>),
            QuantType::Q5_K => (dot_q5_k::<1>, dot_q5_k::<4>),
            QuantType::IQ4_XS => (dot_iq4_xs::<1>, dot_iq4_xs::<4>),
            _ => unreachable!(),
        }
    }

    /// On ragged super-block counts and tokens of very different magnitudes: the single dot
    /// equals the scalar reference (same integer sums, f32 additions in another order), the
    /// dispatched single dot is this one, and the 4- and 8-token forms give every token the
    /// single dot's bits.
    #[test]
    fn k_quant_dots_equal_the_reference_and_tiles_the_single_dots() {
        if !avx2() {
            report_skip("avx2+fma+f16c", "quant::x86_kquant Q2_K/Q3_K/Q5_K/IQ4_XS dots");
            return;
        }
        for (nsb, seed) in [(1usize, 1u64), (3, 2), (10, 3)] {
            let cols = nsb * QK_K;
            let x: Vec<f32> = (0..4 * cols)
                .map(|i| {
                    let v = ((i * 7919 + seed as usize * 31) % 1013) as f32 / 37.0 - 13.7;
                    v * if (i / cols).is_multiple_of(2) { 1.0 } else { 1e-3 } * if i % 97 == 0 { 50.0 } else { 1.0 }
                })
                .collect();
            let acts = QuantizedActs::new(ActFormat::Q8_K, &x, 4);
            let toks = [acts.row(0), acts.row(1), acts.row(2), acts.row(3)];
            for ty in [QuantType::Q2_K, QuantType::Q3_K, QuantType::Q5_K, QuantType::IQ4_XS] {
                let (single, x4) = forms(ty);
                let dispatched = crate::quant::dot_kernel(ty);
                let tile = crate::quant::dot_kernel_x4(ty).expect("a 4-token kernel where AVX2 runs");
                for r in 0..4u64 {
                    let w = random_blocks(ty, nsb, seed * 100 + r);
                    // SAFETY (all calls): AVX2, FMA and F16C were detected above.
                    let want: Vec<u32> = toks.iter().map(|t| unsafe { single(&w, &[*t]) }[0].to_bits()).collect();
                    for (t, bits) in toks.iter().zip(&want) {
                        let (got, reference) = (f32::from_bits(*bits), dot_reference(ty, &w, t));
                        let tol = 1e-5 * dot_magnitude(ty, &w, t);
                        assert!(
                            (got - reference).abs() <= tol,
                            "{ty} {nsb} super-blocks: {got} vs reference {reference} (tolerance {tol})"
                        );
                        assert_eq!(dispatched(&w, t).to_bits(), *bits, "{ty}: dispatched single dot");
                    }
                    assert_eq!(
                        unsafe { x4(&w, &toks) }.map(f32::to_bits).to_vec(),
                        want,
                        "{ty} x4, {nsb} super-blocks"
                    );
                    assert_eq!(tile(&w, &toks).map(f32::to_bits).to_vec(), want, "{ty} dispatched x4");
                    // Eight tokens: the four, then the same four in reverse order.
                    let toks8 = [toks[0], toks[1], toks[2], toks[3], toks[3], toks[2], toks[1], toks[0]];
                    let want8: Vec<u32> = want.iter().chain(want.iter().rev()).copied().collect();
                    let tile8 = crate::quant::dot_kernel_x8(ty).expect("an 8-token kernel where AVX2 runs");
                    assert_eq!(tile8(&w, &toks8).map(f32::to_bits).to_vec(), want8, "{ty} dispatched x8");
                }
            }
        }
    }

    /// The vector unpacking of the Q3_K scales gives the scalar unpacking's values for every
    /// bit of the field.
    #[test]
    fn q3_k_scales_unpack_as_the_scalar_code_does() {
        if !avx2() {
            report_skip("avx2+fma+f16c", "quant::x86_kquant Q3_K scales");
            return;
        }
        let mut s = 5u64;
        for _ in 0..200 {
            let field: [u8; 12] = std::array::from_fn(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (s >> 33) as u8
            });
            // SAFETY: detected above.
            let got: [i8; 16] = unsafe { std::mem::transmute(q3k_scales_vec(field.as_ptr())) };
            assert_eq!(got, q3k_scales(&field), "{field:?}");
        }
    }
}
