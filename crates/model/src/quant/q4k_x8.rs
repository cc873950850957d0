//! Q4_K weights repacked eight rows at a time, and the AVX-512 VNNI and AVX2 matmuls over them.
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
//! or AVX2 (same bytes; the AVX2 kernel reads half of a 64-byte register pair at a time, see
//! `group_dot_avx2`) and the matrix has a multiple of eight rows; otherwise the row-at-a-time
//! kernels run.

use super::{scale_min_k4, unpack_k, ActRow, GroupKernel, QuantType, QK_K};

/// Rows interleaved in one packed group.
pub const GROUP: usize = 8;

/// Bytes of one packed super-block of eight rows: `d` ×8 (f16), `dmin` ×8 (f16), scales
/// `[sub-block][row]` (u8), minimums `[row][sub-block]` (u8), then per sub-block two 64-byte
/// registers of nibbles (see [`pack`]).
pub const BLOCK_BYTES: usize = 16 + 16 + 64 + 64 + 8 * 128;

/// Bytes of one packed Q5_K super-block of eight rows: the Q4_K layout of its low four bits,
/// scales and minimums, then per sub-block 32 bytes of fifth bits (see [`pack_q5k`]).
pub const BLOCK_BYTES_Q5K: usize = BLOCK_BYTES + 8 * 32;

const OFF_SCALES: usize = 32;
const OFF_MINS: usize = 96;
const OFF_QS: usize = 160;
const OFF_HB: usize = BLOCK_BYTES;

/// Whether this CPU runs a packed kernel: AVX-512 F/BW/VL with VNNI, or AVX2 (each with F16C
/// and FMA).
pub fn available() -> bool {
    avx512() || super::has_avx2()
}

/// Whether the AVX-512 VNNI kernel runs here.
fn avx512() -> bool {
    super::has_avx512bw() && super::has_avx512vnni() && super::has_avx2()
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
    let mut out = super::pack_buffer(rows / GROUP * nb * BLOCK_BYTES);
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
                // nibbles and the next eight as high. Eight bytes at a time in a u64 (packing a
                // large matrix at load spends its time here).
                const LOW: u64 = 0x0F0F_0F0F_0F0F_0F0F;
                let word = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("eight bytes"));
                for j in 0..8 {
                    let (base, shift) = (16 + 32 * (j / 2), 4 * (j % 2));
                    for half in 0..2 {
                        let lo = (word(base + 16 * half) >> shift) & LOW;
                        let hi = (word(base + 16 * half + 8) >> shift) & LOW;
                        let o = OFF_QS + 128 * j + 64 * half + 8 * r;
                        blk[o..o + 8].copy_from_slice(&(lo | (hi << 4)).to_le_bytes());
                    }
                }
            }
        }
    });
    out
}

/// Packs a row-major Q5_K matrix as [`pack`] packs Q4_K (the low four bits of each value where
/// Q4_K keeps its nibbles), each super-block followed by the fifth bits: for sub-block `j`, 32
/// bytes at `BLOCK_BYTES + 32j` whose byte `8r + b` (r < 4) holds the fifth bit of value
/// `32j + 8i + b` of row `r` in bit `4 + i` and of row `r + 4` in bit `i`, so that one 256-bit
/// load serves both halves of the rows.
pub fn pack_q5k(w: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    use rayon::prelude::*;
    assert!(rows.is_multiple_of(GROUP) && cols.is_multiple_of(QK_K), "pack_q5k: {rows} × {cols} does not tile");
    let nb = cols / QK_K;
    let row_bytes = nb * 176;
    assert_eq!(w.len(), rows * row_bytes, "pack_q5k: weight length");
    let mut out = super::pack_buffer(rows / GROUP * nb * BLOCK_BYTES_Q5K);
    out.par_chunks_mut(nb * BLOCK_BYTES_Q5K).enumerate().for_each(|(g, dst)| {
        for (ib, blk) in dst.chunks_exact_mut(BLOCK_BYTES_Q5K).enumerate() {
            for r in 0..GROUP {
                let b = &w[(g * GROUP + r) * row_bytes + ib * 176..][..176];
                blk[2 * r..2 * r + 2].copy_from_slice(&b[0..2]);
                blk[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&b[2..4]);
                let u = unpack_k(QuantType::Q5_K, b);
                for j in 0..8 {
                    blk[OFF_SCALES + 8 * j + r] = u.scale[2 * j] as u8;
                    blk[OFF_MINS + 8 * r + j] = u.min[2 * j] as u8;
                    for i in 0..4 {
                        for bi in 0..8 {
                            let q = u.q[32 * j + 8 * i + bi] as u8;
                            blk[OFF_QS + 128 * j + 64 * (i / 2) + 8 * r + bi] |= (q & 0xF) << (4 * (i % 2));
                            let bit = if r < 4 { 4 + i } else { i };
                            blk[OFF_HB + 32 * j + 8 * (r % 4) + bi] |= (q >> 4) << bit;
                        }
                    }
                }
            }
        }
    });
    out
}

/// Row `r` (0..8) of one packed Q4_K group (`nb` blocks) dequantized into `out` (`nb · 256`
/// values), with the float operations of [`super::dequantize`] (so the same values).
pub fn dequantize_row(group: &[u8], r: usize, out: &mut [f32]) {
    dequantize_row_of::<false>(group, r, out)
}

/// [`dequantize_row`] for a group packed by [`pack_q5k`].
pub fn dequantize_row_q5k(group: &[u8], r: usize, out: &mut [f32]) {
    dequantize_row_of::<true>(group, r, out)
}

fn dequantize_row_of<const FIVE: bool>(group: &[u8], r: usize, out: &mut [f32]) {
    let bb = if FIVE { BLOCK_BYTES_Q5K } else { BLOCK_BYTES };
    for (blk, y) in group.chunks_exact(bb).zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (super::f16_at(blk, 2 * r), super::f16_at(blk, 16 + 2 * r));
        for j in 0..8 {
            let (s, m) = (blk[OFF_SCALES + 8 * j + r] as f32, blk[OFF_MINS + 8 * r + j] as f32);
            for i in 0..4 {
                for b in 0..8 {
                    let byte = blk[OFF_QS + 128 * j + 64 * (i / 2) + 8 * r + b];
                    let mut v = (byte >> (4 * (i % 2))) & 0xF;
                    if FIVE {
                        let bit = if r < 4 { 4 + i } else { i };
                        v |= ((blk[OFF_HB + 32 * j + 8 * (r % 4) + b] >> bit) & 1) << 4;
                    }
                    y[32 * j + 8 * i + b] = (d * s) * v as f32 - dmin * m;
                }
            }
        }
    }
}

/// The packed kernel for `N` tokens (1, 4 or 8), when [`available`].
pub fn kernel<const N: usize>() -> Option<GroupKernel<N>> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY (both): the features each kernel is compiled for were detected just before.
        if avx512() {
            return Some(if crate::kernels::software_prefetch() {
                |p, a| unsafe { x86::group_dot::<N, true>(p, a) }
            } else {
                |p, a| unsafe { x86::group_dot::<N, false>(p, a) }
            });
        }
        if super::has_avx2() {
            return Some(|p, a| unsafe { x86::group_dot_avx2::<false, N>(p, a) });
        }
    }
    None
}

/// The packed Q5_K kernel for `N` tokens (1, 4 or 8): AVX2, on a CPU without AVX-512 BW (which
/// keeps its own measured Q5_K tiles).
pub fn kernel_q5k<const N: usize>() -> Option<GroupKernel<N>> {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() && !super::has_avx512bw() {
        // SAFETY: the features the kernel is compiled for were detected just before.
        return Some(|p, a| unsafe { x86::group_dot_avx2::<true, N>(p, a) });
    }
    None
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{ActRow, BLOCK_BYTES, BLOCK_BYTES_Q5K, GROUP, OFF_HB, OFF_MINS, OFF_QS, OFF_SCALES, QK_K};

    // One-token matmuls stream the packed weights once; the row kernels' prefetch serves them.
    use crate::quant::x86::prefetch_ahead;

    /// `PREFETCH`: whether to ask for the weights ahead of use (`kernels::software_prefetch`).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn group_dot<const N: usize, const PREFETCH: bool>(
        p: &[u8],
        a: &[ActRow; N],
    ) -> [[f32; GROUP]; N] {
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
            if PREFETCH {
                prefetch_ahead::<OFF_QS>(blk, 0);
            }
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
                if PREFETCH {
                    prefetch_ahead::<128>(q, 0);
                }
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
        acc.map(|v| crate::quant::group_sums512(v))
    }

    /// The same product with AVX2 (+ FMA, F16C), on the same packed bytes. A 256-bit register
    /// holds one half of a 64-byte register pair: eight consecutive elements of each of four
    /// rows, one 64-bit lane per row. `vpmaddubsw` against the token's eight activation bytes
    /// broadcast to every 64-bit lane leaves each word two products of its own row; the four
    /// registers of a sub-block are added as words (at most 4 · 2 · 15 · 127 = 15,240, so no
    /// word overflows), and one `vpmaddwd` by the row's scale then turns each 64-bit lane into
    /// two 32-bit sums — one multiply by the scale per 128 products, where the row-at-a-time
    /// kernel needs one per 32. Lanes `(row, half)` as in the AVX-512 kernel, four rows per
    /// register, so the float step per super-block serves four rows at once.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn group_dot_avx2<const FIVE: bool, const N: usize>(
        p: &[u8],
        a: &[ActRow; N],
    ) -> [[f32; GROUP]; N] {
        if N == 1 {
            let mut out = [[0.0; GROUP]; N];
            out[0] = one_token_avx2::<FIVE>(p, &a[0]);
            return out;
        }
        let bb = if FIVE { BLOCK_BYTES_Q5K } else { BLOCK_BYTES };
        let nb = p.len() / bb;
        for r in a {
            debug_assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.sums32.len() >= nb * 8);
        }
        let mask = _mm256_set1_epi8(0x0F);
        // Word w of half `h`'s scale register ← scale byte 4h + w / 4 (its row), zero-extended,
        // from the eight scale bytes broadcast to both 128-bit lanes.
        let scale_ctrl: [__m256i; 2] = std::array::from_fn(|h| {
            let c: [i8; 32] = std::array::from_fn(|i| if i % 2 == 0 { (4 * h + i / 8) as i8 } else { -128 });
            _mm256_loadu_si256(c.as_ptr() as *const __m256i)
        });
        // The sums of 32 come in the order [B0, B1, B4, B5, B2, B3, B6, B7] (words); back to
        // B0..B7.
        let natural = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
        let mut acc = [[_mm256_setzero_ps(); 2]; N];
        for ib in 0..nb {
            let blk = p.as_ptr().add(ib * bb);
            prefetch_ahead::<OFF_QS>(blk, 0);
            if FIVE {
                prefetch_ahead::<{ 8 * 32 }>(blk, OFF_HB);
            }
            // Each token's eight sums of 32, as words, in both 128-bit lanes.
            let bsum: [__m256i; N] = std::array::from_fn(|k| {
                let b = _mm_loadu_si128(a[k].sums32.as_ptr().add(ib * 8) as *const __m128i);
                _mm256_broadcastsi128_si256(_mm_shuffle_epi8(b, natural))
            });
            for h in 0..2 {
                let mut s = [_mm256_setzero_si256(); N];
                for j in 0..8 {
                    let q = blk.add(OFF_QS + 128 * j + 32 * h);
                    if h == 0 {
                        prefetch_ahead::<128>(q, 0);
                    }
                    let pa = _mm256_loadu_si256(q as *const __m256i);
                    let pb = _mm256_loadu_si256(q.add(64) as *const __m256i);
                    let mut r0 = _mm256_and_si256(pa, mask);
                    let mut r1 = _mm256_and_si256(_mm256_srli_epi16::<4>(pa), mask);
                    let mut r2 = _mm256_and_si256(pb, mask);
                    let mut r3 = _mm256_and_si256(_mm256_srli_epi16::<4>(pb), mask);
                    if FIVE {
                        // Q5_K: values 0..31, and four words of them still fit (4 · 2 · 31 ·
                        // 127 = 31,496).
                        let hb = _mm256_loadu_si256(blk.add(OFF_HB + 32 * j) as *const __m256i);
                        let f = crate::quant::fifth_bits(hb, h);
                        r0 = _mm256_or_si256(r0, f[0]);
                        r1 = _mm256_or_si256(r1, f[1]);
                        r2 = _mm256_or_si256(r2, f[2]);
                        r3 = _mm256_or_si256(r3, f[3]);
                    }
                    let sc = (blk.add(OFF_SCALES + 8 * j) as *const i64).read_unaligned();
                    let sw = _mm256_shuffle_epi8(_mm256_set1_epi64x(sc), scale_ctrl[h]);
                    for k in 0..N {
                        let y = (a[k].qs.as_ptr() as *const u8).add(ib * QK_K + 32 * j);
                        let yb = |o: usize| _mm256_set1_epi64x((y.add(o) as *const i64).read_unaligned());
                        let t = _mm256_add_epi16(
                            _mm256_add_epi16(_mm256_maddubs_epi16(r0, yb(0)), _mm256_maddubs_epi16(r1, yb(8))),
                            _mm256_add_epi16(_mm256_maddubs_epi16(r2, yb(16)), _mm256_maddubs_epi16(r3, yb(24))),
                        );
                        s[k] = _mm256_add_epi32(s[k], _mm256_madd_epi16(t, sw));
                    }
                }
                // This half's rows: d and dmin per lane, and the minimum words of rows (0, 1)
                // and (2, 3) of the half, [row][sub-block].
                let d8 = crate::quant::row_scales4(blk.add(8 * h));
                let dmin8 = crate::quant::row_scales4(blk.add(16 + 8 * h));
                let mins01 = _mm256_cvtepu8_epi16(_mm_loadu_si128(blk.add(OFF_MINS + 32 * h) as *const __m128i));
                let mins23 = _mm256_cvtepu8_epi16(_mm_loadu_si128(blk.add(OFF_MINS + 32 * h + 16) as *const __m128i));
                for k in 0..N {
                    // Lanes [r0: j0+1, j2+3, j4+5, j6+7 | r1: ...], then pairs added: lane
                    // (row, half) = the minimums of sub-blocks 4·half .. + 4, in row order.
                    let m01 = _mm256_madd_epi16(mins01, bsum[k]);
                    let m23 = _mm256_madd_epi16(mins23, bsum[k]);
                    let m = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_hadd_epi32(m01, m23));
                    let v = _mm256_fmsub_ps(d8, _mm256_cvtepi32_ps(s[k]), _mm256_mul_ps(dmin8, _mm256_cvtepi32_ps(m)));
                    acc[k][h] = _mm256_fmadd_ps(_mm256_set1_ps(*a[k].d.get_unchecked(ib)), v, acc[k][h]);
                }
            }
        }
        acc.map(|[lo, hi]| crate::quant::group_sums(lo, hi))
    }

    /// [`group_dot_avx2`] for one token (decode): both halves of every sub-block in one pass,
    /// so the token's activation bytes are broadcast once for the eight rows (not once per
    /// half) and the two halves' sums are independent chains. Each half's integers and float
    /// steps are the tiled kernel's, so the bits are too.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn one_token_avx2<const FIVE: bool>(p: &[u8], a: &ActRow) -> [f32; GROUP] {
        let bb = if FIVE { BLOCK_BYTES_Q5K } else { BLOCK_BYTES };
        let nb = p.len() / bb;
        debug_assert!(a.qs.len() >= nb * QK_K && a.d.len() >= nb && a.sums32.len() >= nb * 8);
        let mask = _mm256_set1_epi8(0x0F);
        let scale_ctrl: [__m256i; 2] = std::array::from_fn(|h| {
            let c: [i8; 32] = std::array::from_fn(|i| if i % 2 == 0 { (4 * h + i / 8) as i8 } else { -128 });
            _mm256_loadu_si256(c.as_ptr() as *const __m256i)
        });
        let natural = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
        let mut acc = [_mm256_setzero_ps(); 2];
        for ib in 0..nb {
            let blk = p.as_ptr().add(ib * bb);
            prefetch_ahead::<OFF_QS>(blk, 0);
            if FIVE {
                prefetch_ahead::<{ 8 * 32 }>(blk, OFF_HB);
            }
            let b = _mm_loadu_si128(a.sums32.as_ptr().add(ib * 8) as *const __m128i);
            let bsum = _mm256_broadcastsi128_si256(_mm_shuffle_epi8(b, natural));
            let mut s = [_mm256_setzero_si256(); 2];
            for j in 0..8 {
                let q = blk.add(OFF_QS + 128 * j);
                prefetch_ahead::<128>(q, 0);
                let y = (a.qs.as_ptr() as *const u8).add(ib * QK_K + 32 * j);
                let yb: [__m256i; 4] =
                    std::array::from_fn(|i| _mm256_set1_epi64x((y.add(8 * i) as *const i64).read_unaligned()));
                let sc = _mm256_set1_epi64x((blk.add(OFF_SCALES + 8 * j) as *const i64).read_unaligned());
                let hb = if FIVE {
                    _mm256_loadu_si256(blk.add(OFF_HB + 32 * j) as *const __m256i)
                } else {
                    _mm256_setzero_si256()
                };
                for (h, sh) in s.iter_mut().enumerate() {
                    let pa = _mm256_loadu_si256(q.add(32 * h) as *const __m256i);
                    let pb = _mm256_loadu_si256(q.add(64 + 32 * h) as *const __m256i);
                    let mut r0 = _mm256_and_si256(pa, mask);
                    let mut r1 = _mm256_and_si256(_mm256_srli_epi16::<4>(pa), mask);
                    let mut r2 = _mm256_and_si256(pb, mask);
                    let mut r3 = _mm256_and_si256(_mm256_srli_epi16::<4>(pb), mask);
                    if FIVE {
                        let f = crate::quant::fifth_bits(hb, h);
                        r0 = _mm256_or_si256(r0, f[0]);
                        r1 = _mm256_or_si256(r1, f[1]);
                        r2 = _mm256_or_si256(r2, f[2]);
                        r3 = _mm256_or_si256(r3, f[3]);
                    }
                    let t = _mm256_add_epi16(
                        _mm256_add_epi16(_mm256_maddubs_epi16(r0, yb[0]), _mm256_maddubs_epi16(r1, yb[1])),
                        _mm256_add_epi16(_mm256_maddubs_epi16(r2, yb[2]), _mm256_maddubs_epi16(r3, yb[3])),
                    );
                    *sh = _mm256_add_epi32(*sh, _mm256_madd_epi16(t, _mm256_shuffle_epi8(sc, scale_ctrl[h])));
                }
            }
            let da = _mm256_set1_ps(*a.d.get_unchecked(ib));
            for (h, (acc_h, s_h)) in acc.iter_mut().zip(s).enumerate() {
                let d8 = crate::quant::row_scales4(blk.add(8 * h));
                let dmin8 = crate::quant::row_scales4(blk.add(16 + 8 * h));
                let mins01 = _mm256_cvtepu8_epi16(_mm_loadu_si128(blk.add(OFF_MINS + 32 * h) as *const __m128i));
                let mins23 = _mm256_cvtepu8_epi16(_mm_loadu_si128(blk.add(OFF_MINS + 32 * h + 16) as *const __m128i));
                let m01 = _mm256_madd_epi16(mins01, bsum);
                let m23 = _mm256_madd_epi16(mins23, bsum);
                let m = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_hadd_epi32(m01, m23));
                let v = _mm256_fmsub_ps(d8, _mm256_cvtepi32_ps(s_h), _mm256_mul_ps(dmin8, _mm256_cvtepi32_ps(m)));
                *acc_h = _mm256_fmadd_ps(da, v, *acc_h);
            }
        }
        crate::quant::group_sums(acc[0], acc[1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::check_packing;

    fn check(ty: QuantType, kernels: (GroupKernel<1>, GroupKernel<4>, GroupKernel<8>)) {
        if ty == QuantType::Q4_K {
            check_packing(ty, pack, dequantize_row, BLOCK_BYTES, kernels);
        } else {
            check_packing(ty, pack_q5k, dequantize_row_q5k, BLOCK_BYTES_Q5K, kernels);
        }
    }

    #[test]
    fn packed_q4_k_groups_match_the_reference() {
        match (kernel::<1>(), kernel::<4>(), kernel::<8>()) {
            (Some(k1), Some(k4), Some(k8)) => check(QuantType::Q4_K, (k1, k4, k8)),
            _ => crate::test_support::report_skip("avx2", "quant::q4k_x8 packed Q4_K group kernels (1, 4, 8 tokens)"),
        }
    }

    /// Both builds of the AVX-512 kernel, with and without the weight prefetch
    /// (`kernels::software_prefetch` picks one per CPU), whichever this CPU defaults to.
    #[test]
    fn the_avx512_kernel_matches_the_reference_with_and_without_its_prefetch() {
        if !avx512() {
            crate::test_support::report_skip("avx512vnni", "quant::q4k_x8 AVX-512 kernel with and without prefetch");
            return;
        }
        check_avx512_build::<true>();
        check_avx512_build::<false>();
    }

    /// [`check`] on the AVX-512 kernel built with `PREFETCH`; the caller has detected AVX-512.
    fn check_avx512_build<const PREFETCH: bool>() {
        // SAFETY (all three): the caller detected AVX-512 BW/VNNI and AVX2.
        check(
            QuantType::Q4_K,
            (
                |p, a| unsafe { x86::group_dot::<1, PREFETCH>(p, a) },
                |p, a| unsafe { x86::group_dot::<4, PREFETCH>(p, a) },
                |p, a| unsafe { x86::group_dot::<8, PREFETCH>(p, a) },
            ),
        );
    }

    #[test]
    fn packed_q5_k_groups_match_the_reference() {
        match (kernel_q5k::<1>(), kernel_q5k::<4>(), kernel_q5k::<8>()) {
            (Some(k1), Some(k4), Some(k8)) => check(QuantType::Q5_K, (k1, k4, k8)),
            _ => crate::test_support::report_skip(
                "avx2 and no avx512bw",
                "quant::q4k_x8 packed Q5_K group kernels (1, 4, 8 tokens)",
            ),
        }
    }
}
