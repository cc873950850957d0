//! Q2_K and Q3_K weights repacked eight rows at a time, and the AVX2 matmul over them.
//!
//! The idea of [`super::q6k_x8`] for the two smallest k-quants. A ggml Q2_K row keeps each
//! 256-element super-block on its own (84 bytes: sixteen 4-bit scale/minimum pairs, 2-bit
//! values, `d`, `dmin`), and so does Q3_K (110 bytes: a plane of high bits, 2-bit low parts,
//! sixteen 6-bit scales, `d`), so a row-at-a-time dot spends as much on per-group scales and
//! per-super-block float work as on the multiplies. Here eight rows are interleaved so that a
//! 256-bit register holds eight consecutive elements of each of four rows, one 64-bit lane per
//! row:
//!
//! * `vpmaddubsw` against the token's eight activation bytes broadcast to every 64-bit lane
//!   leaves each word two products of its own row; the two registers of a 16-element scale
//!   group are added as words (Q2_K at most 2 · 2 · 3 · 127 = 1,524, Q3_K 2 · 2 · 7 · 127 =
//!   3,556), and one `vpmaddwd` by the row's scale turns each 64-bit lane into two 32-bit sums;
//! * Q2_K's minimums (`Σ_g min_g · Σ_{group g} y`) come from the activation's block sums, one
//!   `vpmaddwd` per pair of groups for all eight rows;
//! * Q3_K's values are stored as `q + 4` (0..7, unsigned as `vpmaddubsw` wants them); the
//!   `4 · Σ_g scale_g · Σ_{group g} y` this adds is taken off exactly, in integers, from the
//!   same block sums;
//! * the float step per super-block serves four rows at once.
//!
//! The integers are [`super::dot_reference`]'s; only the float order differs (fixed, so one
//! token and a tile of tokens give bit-identical results for the same token). A packed Q2_K
//! super-block takes exactly the bytes of the eight rows' ggml blocks (8 · 84); a Q3_K one takes
//! 32 bytes more than 8 · 110 (its scales are kept as whole bytes: 3.6 % more memory for those
//! matrices, so that no scale is unpacked in the loop). Packing happens once, at load, on a CPU
//! with AVX2 (every x86 CPU here runs these types' row kernels with AVX2, AVX-512 or not), for
//! matrices whose rows come in eights.

use super::{q3k_scales, ActRow, GroupKernel, QuantType, QK_K};

/// Rows interleaved in one packed group.
pub const GROUP: usize = 8;

/// Bytes of one packed Q2_K super-block of eight rows: `d` ×8 and `dmin` ×8 (f16), the
/// scale/minimum bytes as ggml stores them (scale in the low nibble) as `[group pair][row][2]`,
/// then per 32-element sub-block 64 bytes of 2-bit values (see [`pack_q2k`]).
pub const BLOCK_BYTES_Q2K: usize = 32 + 128 + 8 * 64;

/// Bytes of one packed Q3_K super-block of eight rows: `d` ×8 (f16), the signed scales (i8,
/// `s − 32`) as `[group pair][row][2]`, then per sub-block 64 bytes of low 2-bit parts and 32
/// bytes of third bits (see [`pack_q3k`]).
pub const BLOCK_BYTES_Q3K: usize = 16 + 128 + 8 * 96;

/// Where the scales and the values start in a packed super-block of each type.
const fn offsets(three: bool) -> (usize, usize) {
    if three {
        (16, 144)
    } else {
        (32, 160)
    }
}

/// Bytes of one packed sub-block (32 elements of eight rows).
const fn sub_bytes(three: bool) -> usize {
    if three {
        96
    } else {
        64
    }
}

/// Whether this CPU runs the packed kernels: AVX2, FMA and F16C.
pub fn available() -> bool {
    super::has_avx2()
}

/// Packs a row-major Q2_K matrix (`rows` a multiple of [`GROUP`], `cols` of 256): group `g`'s
/// super-block `ib` lands at `(g · nb + ib) · BLOCK_BYTES_Q2K`. Sub-block `j` (elements
/// `32j..32j + 32`, scale groups `2j` and `2j + 1`) takes 64 bytes whose byte `8r + b` holds
/// values `32j + b`, `32j + 8 + b`, `32j + 16 + b` and `32j + 24 + b` of row `r` in bits 0–1,
/// 2–3, 4–5 and 6–7.
pub fn pack_q2k(w: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    pack_of::<false>(w, rows, cols)
}

/// Packs a row-major Q3_K matrix as [`pack_q2k`] packs Q2_K's values, the low two bits of
/// each stored value `q + 4` (0..7) where Q2_K keeps its values; each sub-block's 64 bytes are
/// followed by 32 bytes of third bits whose byte `8r + b` (r < 4) holds the third bit of value
/// `32j + 8i + b` of row `r` in bit `4 + i` and of row `r + 4` in bit `i` (the layout of
/// Q5_K's fifth bits, so one 256-bit load serves both halves of the rows).
pub fn pack_q3k(w: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    pack_of::<true>(w, rows, cols)
}

fn pack_of<const THREE: bool>(w: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    use rayon::prelude::*;
    assert!(rows.is_multiple_of(GROUP) && cols.is_multiple_of(QK_K), "pack: {rows} × {cols} does not tile");
    let (ty, bb) = if THREE { (QuantType::Q3_K, BLOCK_BYTES_Q3K) } else { (QuantType::Q2_K, BLOCK_BYTES_Q2K) };
    let (off_scales, off_qs) = offsets(THREE);
    let src_bytes = ty.block_bytes();
    let nb = cols / QK_K;
    let row_bytes = nb * src_bytes;
    assert_eq!(w.len(), rows * row_bytes, "pack: weight length");
    let mut out = super::pack_buffer(rows / GROUP * nb * bb);
    out.par_chunks_mut(nb * bb).enumerate().for_each(|(g, dst)| {
        for (ib, blk) in dst.chunks_exact_mut(bb).enumerate() {
            for r in 0..GROUP {
                let b = &w[(g * GROUP + r) * row_bytes + ib * src_bytes..][..src_bytes];
                let values = stored_values::<THREE>(b);
                if THREE {
                    blk[2 * r..2 * r + 2].copy_from_slice(&b[108..110]);
                    for (s, v) in q3k_scales(&b[96..108]).iter().enumerate() {
                        blk[off_scales + 16 * (s / 2) + 2 * r + s % 2] = *v as u8;
                    }
                } else {
                    blk[2 * r..2 * r + 2].copy_from_slice(&b[80..82]);
                    blk[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&b[82..84]);
                    for (s, &v) in b[0..16].iter().enumerate() {
                        blk[off_scales + 16 * (s / 2) + 2 * r + s % 2] = v;
                    }
                }
                for j in 0..8 {
                    let sub = &mut blk[off_qs + sub_bytes(THREE) * j..][..sub_bytes(THREE)];
                    for i in 0..4 {
                        for bi in 0..8 {
                            let q = values[32 * j + 8 * i + bi];
                            sub[8 * r + bi] |= (q & 3) << (2 * i);
                            if THREE {
                                let bit = if r < 4 { 4 + i } else { i };
                                sub[64 + 8 * (r % 4) + bi] |= (q >> 2) << bit;
                            }
                        }
                    }
                }
            }
        }
    });
    out
}

/// The 256 stored values of a ggml block: Q2_K's `q` (0..3), Q3_K's `q + 4` (0..7), in
/// straight loops (packing a large matrix at load spends its time here).
fn stored_values<const THREE: bool>(b: &[u8]) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    let (qs, hmask) = if THREE { (&b[32..96], &b[0..32]) } else { (&b[16..80], &b[0..0]) };
    for half in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let mut v = (qs[32 * half + l] >> (2 * j)) & 3;
                if THREE {
                    v |= ((hmask[l] >> (4 * half + j)) & 1) << 2;
                }
                q[128 * half + 32 * j + l] = v;
            }
        }
    }
    q
}

/// Row `r` (0..8) of one packed Q2_K group (`nb` blocks) dequantized into `out` (`nb · 256`
/// values), with the float operations of [`super::dequantize`] (so the same values).
pub fn dequantize_row_q2k(group: &[u8], r: usize, out: &mut [f32]) {
    dequantize_row_of::<false>(group, r, out)
}

/// [`dequantize_row_q2k`] for a group packed by [`pack_q3k`].
pub fn dequantize_row_q3k(group: &[u8], r: usize, out: &mut [f32]) {
    dequantize_row_of::<true>(group, r, out)
}

fn dequantize_row_of<const THREE: bool>(group: &[u8], r: usize, out: &mut [f32]) {
    let bb = if THREE { BLOCK_BYTES_Q3K } else { BLOCK_BYTES_Q2K };
    let (off_scales, off_qs) = offsets(THREE);
    for (blk, y) in group.chunks_exact(bb).zip(out.chunks_exact_mut(QK_K)) {
        let d = super::f16_at(blk, 2 * r);
        for (e, o) in y.iter_mut().enumerate() {
            let (j, i, bi) = (e / 32, (e % 32) / 8, e % 8);
            let sub = &blk[off_qs + sub_bytes(THREE) * j..];
            let mut q = (sub[8 * r + bi] >> (2 * i)) & 3;
            let g = e / 16;
            let sc = blk[off_scales + 16 * (g / 2) + 2 * r + g % 2];
            if THREE {
                let bit = if r < 4 { 4 + i } else { i };
                q |= ((sub[64 + 8 * (r % 4) + bi] >> bit) & 1) << 2;
                *o = (d * (sc as i8) as f32) * (q as i32 - 4) as f32;
            } else {
                let dmin = super::f16_at(blk, 16 + 2 * r);
                *o = (d * (sc & 0xF) as f32) * q as f32 - dmin * (sc >> 4) as f32;
            }
        }
    }
}

/// The packed Q2_K kernel for `N` tokens (1, 4 or 8), when [`available`].
pub fn kernel_q2k<const N: usize>() -> Option<GroupKernel<N>> {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: the features the kernel is compiled for were detected by `available`.
        return Some(|p, a| unsafe { x86::group_dot::<false, N>(p, a) });
    }
    None
}

/// The packed Q3_K kernel for `N` tokens (1, 4 or 8), when [`available`].
pub fn kernel_q3k<const N: usize>() -> Option<GroupKernel<N>> {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: the features the kernel is compiled for were detected by `available`.
        return Some(|p, a| unsafe { x86::group_dot::<true, N>(p, a) });
    }
    None
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{offsets, sub_bytes, ActRow, BLOCK_BYTES_Q2K, BLOCK_BYTES_Q3K, GROUP, QK_K};

    // One-token matmuls stream the packed weights once; the row kernels' prefetch serves them.
    use crate::quant::x86::prefetch_ahead;

    /// The loop the module docs describe. Lanes `(row, half)` of a register serve four rows
    /// (half `h` of the group: rows `4h..4h + 4`); the halves run one after the other so that
    /// a tile's accumulators stay in registers.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::needless_range_loop)] // `h` picks the rows' bytes as well as the accumulator
    pub(super) unsafe fn group_dot<const THREE: bool, const N: usize>(p: &[u8], a: &[ActRow; N]) -> [[f32; GROUP]; N] {
        let bb = if THREE { BLOCK_BYTES_Q3K } else { BLOCK_BYTES_Q2K };
        let (off_scales, off_qs) = offsets(THREE);
        let sub = sub_bytes(THREE);
        let nb = p.len() / bb;
        for r in a {
            debug_assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.bsums.len() >= nb * 16);
        }
        let m3 = _mm256_set1_epi8(0x03);
        let m4 = _mm256_set1_epi8(0x0F);
        // From the four rows' (scale 2j, scale 2j + 1) words in both 128-bit lanes: every word
        // of row i's 64-bit lane ← that row's scale `e` (lanes 0, 1 are rows 0, 1 of the low
        // half, lanes 2, 3 rows 2, 3 of the high one).
        let scale_ctrl: [__m256i; 2] = std::array::from_fn(|e| {
            let c: [i8; 32] = std::array::from_fn(|i| (4 * (i / 8) + 2 * e + i % 2) as i8);
            _mm256_loadu_si256(c.as_ptr() as *const __m256i)
        });
        let mut acc = [[_mm256_setzero_ps(); 2]; N];
        for ib in 0..nb {
            let blk = p.as_ptr().add(ib * bb);
            prefetch_ahead::<144>(blk, 0);
            // Per row (lane r of eight), Σ_g c[r][g] · bsum_g: Q2_K's minimums, or Q3_K's
            // scales (times the offset 4 below), one pair of groups per `vpmaddwd`.
            // (A plain loop: `array::from_fn`'s closure would not be inlined here.)
            let mut offset = [_mm256_setzero_si256(); N];
            for pair in 0..8 {
                let bytes = _mm_loadu_si128(blk.add(off_scales + 16 * pair) as *const __m128i);
                let c = if THREE {
                    _mm256_cvtepi8_epi16(bytes)
                } else {
                    _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(bytes), _mm256_castsi256_si128(m4)))
                };
                for (o, r) in offset.iter_mut().zip(a) {
                    let bs = r.bsums.as_ptr().add(ib * 16 + 2 * pair) as *const i32;
                    *o = _mm256_add_epi32(*o, _mm256_madd_epi16(c, _mm256_set1_epi32(bs.read_unaligned())));
                }
            }
            if THREE {
                for o in &mut offset {
                    *o = _mm256_slli_epi32::<2>(*o);
                }
            }
            for h in 0..2 {
                let mut s = [_mm256_setzero_si256(); N];
                for j in 0..8 {
                    let q = blk.add(off_qs + sub * j);
                    if h == 0 {
                        prefetch_ahead::<96>(q, 0);
                    }
                    let plane = _mm256_loadu_si256(q.add(32 * h) as *const __m256i);
                    let mut w = [
                        _mm256_and_si256(plane, m3),
                        _mm256_and_si256(_mm256_srli_epi16::<2>(plane), m3),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(plane), m3),
                        _mm256_and_si256(_mm256_srli_epi16::<6>(plane), m3),
                    ];
                    if THREE {
                        let hb = _mm256_loadu_si256(q.add(64) as *const __m256i);
                        for (wi, f) in w.iter_mut().zip(crate::quant::fifth_bits(hb, h)) {
                            // The bit at 0x10 of each byte moved to 0x04 (a byte's own bits).
                            *wi = _mm256_or_si256(*wi, _mm256_srli_epi16::<2>(f));
                        }
                    }
                    // The four rows' scales of groups 2j and 2j + 1, as words.
                    let bytes = _mm_loadl_epi64(blk.add(off_scales + 16 * j + 8 * h) as *const __m128i);
                    let pair = if THREE {
                        _mm_cvtepi8_epi16(bytes)
                    } else {
                        _mm_cvtepu8_epi16(_mm_and_si128(bytes, _mm256_castsi256_si128(m4)))
                    };
                    let pair = _mm256_broadcastsi128_si256(pair);
                    let (sw0, sw1) =
                        (_mm256_shuffle_epi8(pair, scale_ctrl[0]), _mm256_shuffle_epi8(pair, scale_ctrl[1]));
                    for k in 0..N {
                        let y = (a[k].qs.as_ptr() as *const u8).add(ib * QK_K + 32 * j);
                        let yb = |o: usize| _mm256_set1_epi64x((y.add(o) as *const i64).read_unaligned());
                        let t0 = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], yb(0)), _mm256_maddubs_epi16(w[1], yb(8)));
                        let t1 =
                            _mm256_add_epi16(_mm256_maddubs_epi16(w[2], yb(16)), _mm256_maddubs_epi16(w[3], yb(24)));
                        s[k] = _mm256_add_epi32(
                            s[k],
                            _mm256_add_epi32(_mm256_madd_epi16(t0, sw0), _mm256_madd_epi16(t1, sw1)),
                        );
                    }
                }
                let d8 = crate::quant::row_scales4(blk.add(8 * h));
                let dmin8 = if THREE { _mm256_setzero_ps() } else { crate::quant::row_scales4(blk.add(16 + 8 * h)) };
                for k in 0..N {
                    // This half's four row offsets into lanes (row, 0), zeros in (row, 1).
                    let off = if h == 0 {
                        _mm256_castsi256_si128(offset[k])
                    } else {
                        _mm256_extracti128_si256::<1>(offset[k])
                    };
                    let off = _mm256_cvtepu32_epi64(off);
                    let da = _mm256_set1_ps(*a[k].d.get_unchecked(ib));
                    acc[k][h] = if THREE {
                        let t = _mm256_sub_epi32(s[k], off);
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(d8, da), acc[k][h])
                    } else {
                        let v = _mm256_fmsub_ps(
                            d8,
                            _mm256_cvtepi32_ps(s[k]),
                            _mm256_mul_ps(dmin8, _mm256_cvtepi32_ps(off)),
                        );
                        _mm256_fmadd_ps(da, v, acc[k][h])
                    };
                }
            }
        }
        acc.map(|[lo, hi]| crate::quant::group_sums(lo, hi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::{check_packing, random_blocks};
    use crate::quant::unpack_k;

    fn check(ty: QuantType, kernels: (GroupKernel<1>, GroupKernel<4>, GroupKernel<8>)) {
        if ty == QuantType::Q3_K {
            check_packing(ty, pack_q3k, dequantize_row_q3k, BLOCK_BYTES_Q3K, kernels);
        } else {
            check_packing(ty, pack_q2k, dequantize_row_q2k, BLOCK_BYTES_Q2K, kernels);
        }
    }

    #[test]
    fn packed_q2_k_groups_match_the_reference() {
        match (kernel_q2k::<1>(), kernel_q2k::<4>(), kernel_q2k::<8>()) {
            (Some(k1), Some(k4), Some(k8)) => check(QuantType::Q2_K, (k1, k4, k8)),
            _ => crate::test_support::report_skip("avx2", "quant::q2k_x8 packed Q2_K group kernels (1, 4, 8 tokens)"),
        }
    }

    #[test]
    fn packed_q3_k_groups_match_the_reference() {
        match (kernel_q3k::<1>(), kernel_q3k::<4>(), kernel_q3k::<8>()) {
            (Some(k1), Some(k4), Some(k8)) => check(QuantType::Q3_K, (k1, k4, k8)),
            _ => crate::test_support::report_skip("avx2", "quant::q2k_x8 packed Q3_K group kernels (1, 4, 8 tokens)"),
        }
    }

    #[test]
    fn stored_values_are_the_unpacked_values() {
        for b in random_blocks(QuantType::Q2_K, 8, 11).chunks_exact(84) {
            let u = unpack_k(QuantType::Q2_K, b);
            let want: Vec<u8> = u.q.iter().map(|&q| q as u8).collect();
            assert_eq!(stored_values::<false>(b).to_vec(), want);
        }
        for b in random_blocks(QuantType::Q3_K, 8, 11).chunks_exact(110) {
            let u = unpack_k(QuantType::Q3_K, b);
            let want: Vec<u8> = u.q.iter().map(|&q| (q + 4) as u8).collect();
            assert_eq!(stored_values::<true>(b).to_vec(), want);
        }
    }
}
