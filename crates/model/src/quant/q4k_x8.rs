//! Q4_K weights repacked eight rows at a time, and the AVX-512 VNNI matmul over them.
//!
//! A ggml Q4_K row stores each 256-element super-block on its own (144 bytes). Dotting one row
//! with one token leaves the partial sums of a super-block spread over a register's lanes, so
//! every super-block ends in a horizontal sum or in per-token float work as large as the
//! multiplies themselves. Here eight rows are interleaved so that one 512-bit register holds
//! eight consecutive elements of each of the eight rows, one 32-bit lane per (row, half):
//!
//! * `vpdpbusd` against the token's eight activation bytes broadcast to every 64-bit lane
//!   gives each lane four products of its own (row, token) pair — 64 multiply-adds per
//!   instruction, no lane ever mixes rows or tokens;
//! * the 6-bit scale of each 32-element sub-block is applied once per sub-block and token
//!   with `vpdpwssd` (the unscaled sub-block sum fits in 16 bits);
//! * the minimums (`Σ_j min_j · Σ_{sub-block j} y`) come from the activation's block sums in
//!   two more `vpdpwssd`;
//! * the float step per super-block (`ad · (d·S − dmin·M)`) then serves 16 lanes — eight rows —
//!   at once, and a row's two lanes are added only after the last super-block.
//!
//! Results are the same integers as [`super::dot_reference`] followed by a different (but
//! fixed) float order, so one token (decode) and a tile of tokens (prefill) give bit-identical
//! results for the same token. Packing happens once, at load, when the CPU has AVX-512 VNNI
//! and the matrix has a multiple of eight rows; otherwise the row-at-a-time kernels run.

use super::{scale_min_k4, ActRow, QK_K};

/// Rows interleaved in one packed group.
pub const GROUP: usize = 8;

/// Bytes of one packed super-block of eight rows: `d` ×8 (f16), `dmin` ×8 (f16), scales
/// `[sub-block][row]` (u8), minimums `[row][sub-block]` (u8), then per sub-block two 64-byte
/// registers of nibbles (see [`pack`]).
pub const BLOCK_BYTES: usize = 16 + 16 + 64 + 64 + 8 * 128;

const OFF_SCALES: usize = 32;
const OFF_MINS: usize = 96;
const OFF_QS: usize = 160;

/// Whether this CPU runs the packed kernel (AVX-512 F/BW/VL with VNNI, plus F16C and FMA).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Packs a row-major Q4_K matrix (`rows` a multiple of [`GROUP`], `cols` of 256): group `g`'s
/// super-block `ib` lands at `(g · nb + ib) · BLOCK_BYTES`. In sub-block `j` (elements
/// `32j..32j + 32`), register `i` (0..4) holds byte `8r + b` = value `32j + 8i + b` of row `r`;
/// registers 0 and 1 share 64 bytes as low and high nibbles, as do 2 and 3.
pub fn pack(w: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    use rayon::prelude::*;
    assert!(rows.is_multiple_of(GROUP) && cols.is_multiple_of(QK_K), "pack: {rows} × {cols} does not tile");
    let nb = cols / QK_K;
    let row_bytes = nb * 144;
    assert_eq!(w.len(), rows * row_bytes, "pack: weight length");
    let mut out = vec![0u8; rows / GROUP * nb * BLOCK_BYTES];
    out.par_chunks_mut(nb * BLOCK_BYTES).enumerate().for_each(|(g, dst)| {
        for (ib, blk) in dst.chunks_exact_mut(BLOCK_BYTES).enumerate() {
            let src = |r: usize| &w[(g * GROUP + r) * row_bytes + ib * 144..][..144];
            for r in 0..GROUP {
                let b = src(r);
                blk[2 * r..2 * r + 2].copy_from_slice(&b[0..2]);
                blk[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&b[2..4]);
                for j in 0..8 {
                    let (s, m) = scale_min_k4(j, &b[4..16]);
                    blk[OFF_SCALES + 8 * j + r] = s;
                    blk[OFF_MINS + 8 * r + j] = m;
                }
                // Sub-block j is nibble half j % 2 of bytes 32·(j / 2) .. + 32 of the values;
                // register pair `half` takes its elements 16·half .. + 16, the first eight as low
                // nibbles and the next eight as high.
                for j in 0..8 {
                    let bytes = &b[16 + 32 * (j / 2)..][..32];
                    let nib = |x: u8| if j % 2 == 0 { x & 0xF } else { x >> 4 };
                    for half in 0..2 {
                        let reg = &mut blk[OFF_QS + 128 * j + 64 * half + 8 * r..][..8];
                        for (i, o) in reg.iter_mut().enumerate() {
                            *o = nib(bytes[16 * half + i]) | (nib(bytes[16 * half + 8 + i]) << 4);
                        }
                    }
                }
            }
        }
    });
    out
}

/// Row `r` (0..8) of one packed group (`nb` blocks) dequantized into `out` (`nb · 256`
/// values), with the float operations of [`super::dequantize`] (so the same values).
pub fn dequantize_row(group: &[u8], r: usize, out: &mut [f32]) {
    for (blk, y) in group.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (super::f16_at(blk, 2 * r), super::f16_at(blk, 16 + 2 * r));
        for j in 0..8 {
            let (s, m) = (blk[OFF_SCALES + 8 * j + r] as f32, blk[OFF_MINS + 8 * r + j] as f32);
            for i in 0..4 {
                for b in 0..8 {
                    let byte = blk[OFF_QS + 128 * j + 64 * (i / 2) + 8 * r + b];
                    let v = (byte >> (4 * (i % 2))) & 0xF;
                    y[32 * j + 8 * i + b] = (d * s) * v as f32 - dmin * m;
                }
            }
        }
    }
}

/// Eight rows (one packed group, `nb` super-blocks) against `N` tokens: `out[k][r]`.
pub type GroupKernel<const N: usize> = fn(&[u8], &[ActRow; N]) -> [[f32; GROUP]; N];

/// The packed kernel for `N` tokens (1, 4 or 8), when [`available`].
pub fn kernel<const N: usize>() -> Option<GroupKernel<N>> {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: the features the kernel is compiled for were detected by `available`.
        return Some(|p, a| unsafe { x86::group_dot::<N>(p, a) });
    }
    None
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{ActRow, BLOCK_BYTES, GROUP, OFF_MINS, OFF_QS, OFF_SCALES, QK_K};

    /// How far ahead of the packed stream to prefetch (one-token matmuls stream the weights
    /// once; see `PREFETCH_AHEAD` of the row kernels).
    const AHEAD: usize = 4096;

    #[inline(always)]
    unsafe fn prefetch(p: *const u8, off: usize) {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(AHEAD + off) as *const i8);
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn group_dot<const N: usize>(p: &[u8], a: &[ActRow; N]) -> [[f32; GROUP]; N] {
        let nb = p.len() / BLOCK_BYTES;
        for r in a {
            debug_assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.sums32.len() >= nb * 8);
        }
        let mask = _mm512_set1_epi8(0x0F);
        // 32-bit lane L takes byte L / 2 (its row) of the eight scales broadcast to every
        // 64-bit lane, zero-extended: the word pair (scale, 0) `vpdpwssd` multiplies by.
        let scale_ctrl = {
            let c: [i8; 64] = std::array::from_fn(|i| if i % 4 == 0 { (i / 8) as i8 } else { -128 });
            _mm512_loadu_si512(c.as_ptr() as *const _)
        };
        // Lane L ← row L / 2 of eight floats.
        let dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
        // Minimum words: lane (r, p) = (min[r][4p], min[r][4p + 1]) and, second, (4p + 2, 4p + 3),
        // taken from the minimums widened to words, row-major ([r][j] at word 8r + j).
        let mins_idx1 = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        let mins_idx2 = _mm512_add_epi32(mins_idx1, _mm512_set1_epi32(1));
        let mut acc = [_mm512_setzero_ps(); N];
        for ib in 0..nb {
            let blk = p.as_ptr().add(ib * BLOCK_BYTES);
            prefetch(blk, 0);
            prefetch(blk, 64);
            prefetch(blk, 128);
            let d16 = _mm512_permutexvar_ps(
                dup,
                _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i))),
            );
            let dmin16 = _mm512_permutexvar_ps(
                dup,
                _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(blk.add(16) as *const __m128i))),
            );
            let mins_a = _mm512_cvtepu8_epi16(_mm256_loadu_si256(blk.add(OFF_MINS) as *const __m256i));
            let mins_b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(blk.add(OFF_MINS + 32) as *const __m256i));
            let mw1 = _mm512_permutex2var_epi32(mins_a, mins_idx1, mins_b);
            let mw2 = _mm512_permutex2var_epi32(mins_a, mins_idx2, mins_b);
            let mut s = [_mm512_setzero_si512(); N];
            for j in 0..8 {
                let q = blk.add(OFF_QS + 128 * j);
                prefetch(q, 0);
                prefetch(q, 64);
                let pa = _mm512_loadu_si512(q as *const _);
                let pb = _mm512_loadu_si512(q.add(64) as *const _);
                let r0 = _mm512_and_si512(pa, mask);
                let r1 = _mm512_and_si512(_mm512_srli_epi16::<4>(pa), mask);
                let r2 = _mm512_and_si512(pb, mask);
                let r3 = _mm512_and_si512(_mm512_srli_epi16::<4>(pb), mask);
                let sc = (blk.add(OFF_SCALES + 8 * j) as *const i64).read_unaligned();
                let sw = _mm512_shuffle_epi8(_mm512_set1_epi64(sc), scale_ctrl);
                for k in 0..N {
                    let y = (a[k].qs.as_ptr() as *const u8).add(ib * QK_K + 32 * j);
                    let yb = |o: usize| _mm512_set1_epi64((y.add(o) as *const i64).read_unaligned());
                    let mut t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), r0, yb(0));
                    t = _mm512_dpbusd_epi32(t, r1, yb(8));
                    t = _mm512_dpbusd_epi32(t, r2, yb(16));
                    t = _mm512_dpbusd_epi32(t, r3, yb(24));
                    s[k] = _mm512_dpwssd_epi32(s[k], t, sw);
                }
            }
            for k in 0..N {
                // Sub-block sums stored as [B0, B1, B4, B5 | B2, B3, B6, B7]: each half,
                // broadcast, gives lane (r, p) the pair its minimum words multiply.
                let b = a[k].sums32.as_ptr().add(ib * 8) as *const i64;
                let m = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mw1, _mm512_set1_epi64(b.read_unaligned()));
                let m = _mm512_dpwssd_epi32(m, mw2, _mm512_set1_epi64(b.add(1).read_unaligned()));
                let v = _mm512_fmsub_ps(d16, _mm512_cvtepi32_ps(s[k]), _mm512_mul_ps(dmin16, _mm512_cvtepi32_ps(m)));
                acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(*a[k].d.get_unchecked(ib)), v, acc[k]);
            }
        }
        let mut out = [[0.0f32; GROUP]; N];
        for (o, v) in out.iter_mut().zip(acc) {
            let mut lanes = [0.0f32; 16];
            _mm512_storeu_ps(lanes.as_mut_ptr(), v);
            for (r, x) in o.iter_mut().enumerate() {
                *x = lanes[2 * r] + lanes[2 * r + 1];
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::random_blocks;
    use crate::quant::{dot_reference, QuantType, QuantizedActs};

    #[test]
    fn packed_groups_match_the_reference_dot_and_each_other() {
        let Some(k1) = kernel::<1>() else {
            crate::test_support::report_skip("avx512vnni", "quant::q4k_x8 packed Q4_K group kernels (1, 4, 8 tokens)");
            return;
        };
        let (k4, k8) = (kernel::<4>().unwrap(), kernel::<8>().unwrap());
        let (rows, cols) = (16, 768);
        let w = random_blocks(QuantType::Q4_K, rows * cols / QK_K, 5);
        let p = pack(&w, rows, cols);
        let x: Vec<f32> = (0..8 * cols).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 97.0).collect();
        let acts = QuantizedActs::new(QuantType::Q4_K.act_format(), &x, 8);
        let rows8: [ActRow; 8] = std::array::from_fn(|k| acts.row(k));
        let gb = cols / QK_K * BLOCK_BYTES;
        for g in 0..rows / GROUP {
            let pg = &p[g * gb..(g + 1) * gb];
            let y8 = k8(pg, &rows8);
            let y4 = k4(pg, &[rows8[4], rows8[5], rows8[6], rows8[7]]);
            for k in 0..8 {
                let y1 = k1(pg, &[rows8[k]]);
                assert_eq!(y1[0], y8[k], "group {g} token {k}: one token vs eight");
                if k >= 4 {
                    assert_eq!(y4[k - 4], y8[k], "group {g} token {k}: four vs eight");
                }
                for (r, got) in y8[k].iter().enumerate() {
                    let row = g * GROUP + r;
                    let want =
                        dot_reference(QuantType::Q4_K, &w[row * cols / QK_K * 144..][..cols / QK_K * 144], &rows8[k]);
                    assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "row {row} token {k}: {got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn packed_rows_dequantize_to_the_original_values() {
        let (rows, cols) = (16, 512);
        let w = random_blocks(QuantType::Q4_K, rows * cols / QK_K, 3);
        let p = pack(&w, rows, cols);
        let gb = cols / QK_K * BLOCK_BYTES;
        for row in 0..rows {
            let mut want = vec![0.0; cols];
            crate::quant::dequantize(QuantType::Q4_K, &w[row * cols / QK_K * 144..][..cols / QK_K * 144], &mut want);
            let mut got = vec![0.0; cols];
            dequantize_row(&p[row / GROUP * gb..][..gb], row % GROUP, &mut got);
            assert_eq!(got, want, "row {row}");
        }
    }
}
