//! Q6_K weights repacked eight rows at a time, and the AVX2 matmul over them.
//!
//! The same idea as [`super::q4k_x8`]: a ggml Q6_K row keeps each 256-element super-block on
//! its own (210 bytes), so a row-at-a-time dot applies each of the sixteen scales to one
//! register of products and ends every super-block in per-token work. Here eight rows are
//! interleaved so that a 256-bit register holds eight consecutive elements of each of four
//! rows, one 64-bit lane per row:
//!
//! * `vpmaddubsw` against the token's eight activation bytes broadcast to every 64-bit lane
//!   leaves each word two products of its own row; the two registers of a 16-element scale
//!   group are added as words (at most 2 · 2 · 63 · 127 = 32,004: no overflow), and one
//!   `vpmaddwd` by the row's signed scale turns each 64-bit lane into two 32-bit sums;
//! * the stored values are `q + 32` (0..63, as `vpmaddubsw` wants them unsigned); the
//!   `32 · Σ_g scale_g · Σ_{group g} y` this adds is taken off once per super-block and token
//!   from the activation's block sums, exactly, in integers;
//! * the float step per super-block (`ad · d · S`) serves four rows at once.
//!
//! A packed super-block takes exactly the bytes of the eight rows' ggml blocks (8 · 210). The
//! integers are [`super::dot_reference`]'s; only the float order differs (fixed, so one token
//! and a tile of tokens give bit-identical results for the same token).
//!
//! With AVX-512 BW and VNNI one 512-bit register holds all eight rows, so each instruction does
//! twice the work and the scale step is one `vpdpwssd`; its lanes hold the same integers as the
//! AVX2 kernel's and take the same float steps, so the two give the same bits. The row kernel
//! it replaces there read the 4B model's Q6_K weights (its tied 248K-row output head among them)
//! at about two thirds of the rate the packed Q4_K kernel reads its own.
//!
//! Packing happens once, at load, for matrices whose rows come in eights, on a CPU with AVX-512
//! BW and VNNI or with AVX2; an AVX-512 BW CPU without VNNI keeps its row kernels.

use super::{ActRow, GroupKernel, QK_K};

/// Rows interleaved in one packed group.
pub const GROUP: usize = 8;

/// Bytes of one packed super-block of eight rows: `d` ×8 (f16), the scales (i8) as
/// `[group pair][row][2]`, then per 32-element sub-block 192 bytes of values (see [`pack`]).
pub const BLOCK_BYTES: usize = 16 + 128 + 8 * 192;

const OFF_SCALES: usize = 16;
const OFF_QS: usize = 144;

/// Whether this CPU runs a packed kernel: AVX-512 BW with VNNI, or AVX2 (with FMA and F16C)
/// and no AVX-512 BW.
pub fn available() -> bool {
    avx512() || (super::has_avx2() && !super::has_avx512bw())
}

/// Whether the AVX-512 kernel runs here.
fn avx512() -> bool {
    super::has_avx512bw() && super::has_avx512vnni() && super::has_avx2()
}

/// Packs a row-major Q6_K matrix (`rows` a multiple of [`GROUP`], `cols` of 256): group `g`'s
/// super-block `ib` lands at `(g · nb + ib) · BLOCK_BYTES`. Sub-block `j` (elements
/// `32j..32j + 32`, scale groups `2j` and `2j + 1`) takes 192 bytes, three runs of 64 whose
/// byte `8r + b` holds, in bits 0–5, value `32j + b` of row `r` (first run), `32j + 8 + b`
/// (second) or `32j + 16 + b` (third), and in bits 6–7 two bits of value `32j + 24 + b`: its
/// bits 4–5 in the first run, 2–3 in the second, 0–1 in the third. Three values come out with
/// one mask each and the fourth with three shifts, three masks and two ors: eleven operations
/// for four registers of values, where nibbles and a separate run of top bits took seventeen.
/// On an AVX2 Zen 3, one thread, weights in cache (`matmul_stream`): 28.6–29.9 → 32.9–35.5 GB/s;
/// a 64-token tile (`quant_matmul_speed`) 69 → 71–72 G multiply-adds/s.
pub fn pack(w: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    use rayon::prelude::*;
    assert!(rows.is_multiple_of(GROUP) && cols.is_multiple_of(QK_K), "pack: {rows} × {cols} does not tile");
    let nb = cols / QK_K;
    let row_bytes = nb * 210;
    assert_eq!(w.len(), rows * row_bytes, "pack: weight length");
    let mut out = super::pack_buffer(rows / GROUP * nb * BLOCK_BYTES);
    out.par_chunks_mut(nb * BLOCK_BYTES).enumerate().for_each(|(g, dst)| {
        for (ib, blk) in dst.chunks_exact_mut(BLOCK_BYTES).enumerate() {
            for r in 0..GROUP {
                let b = &w[(g * GROUP + r) * row_bytes + ib * 210..][..210];
                blk[2 * r..2 * r + 2].copy_from_slice(&b[208..210]);
                for (s, &v) in b[192..208].iter().enumerate() {
                    blk[OFF_SCALES + 16 * (s / 2) + 2 * r + s % 2] = v;
                }
                let values = stored_values(b);
                // Eight values at a time in a u64 (each byte 0..63, so a shift by 2 or 4 leaves a
                // byte's top two bits in its bits 0–1 and the next byte's low bits above them,
                // masked off; a shift by 6 of bits 0–1 stays inside the byte).
                const TWO: u64 = 0x0303_0303_0303_0303;
                let word = |e: usize| u64::from_le_bytes(values[e..e + 8].try_into().expect("eight values"));
                for j in 0..8 {
                    let sub = &mut blk[OFF_QS + 192 * j..][..192];
                    let v: [u64; 4] = std::array::from_fn(|i| word(32 * j + 8 * i));
                    let put = |sub: &mut [u8], o: usize, x: u64| sub[o..o + 8].copy_from_slice(&x.to_le_bytes());
                    put(sub, 8 * r, v[0] | (((v[3] >> 4) & TWO) << 6));
                    put(sub, 64 + 8 * r, v[1] | (((v[3] >> 2) & TWO) << 6));
                    put(sub, 128 + 8 * r, v[2] | ((v[3] & TWO) << 6));
                }
            }
        }
    });
    out
}

/// The 256 stored values (0..63, the element plus 32) of a ggml Q6_K block, as
/// `quant::unpack_k` reads them (its `q + 32`), in straight loops (packing a large matrix at load
/// spends its time here).
fn stored_values(b: &[u8]) -> [u8; QK_K] {
    let (ql, qh) = (&b[0..128], &b[128..192]);
    let mut q = [0u8; QK_K];
    for n in 0..2 {
        for l in 0..32 {
            let (lo0, lo1, h) = (ql[64 * n + l], ql[64 * n + l + 32], qh[32 * n + l]);
            q[128 * n + l] = (lo0 & 0xF) | ((h & 3) << 4);
            q[128 * n + l + 32] = (lo1 & 0xF) | (((h >> 2) & 3) << 4);
            q[128 * n + l + 64] = (lo0 >> 4) | (((h >> 4) & 3) << 4);
            q[128 * n + l + 96] = (lo1 >> 4) | (((h >> 6) & 3) << 4);
        }
    }
    q
}

/// Row `r` (0..8) of one packed group (`nb` blocks) dequantized into `out` (`nb · 256`
/// values), with the float operations of [`super::dequantize`] (so the same values).
pub fn dequantize_row(group: &[u8], r: usize, out: &mut [f32]) {
    for (blk, y) in group.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let d = super::f16_at(blk, 2 * r);
        for (e, o) in y.iter_mut().enumerate() {
            let (j, i) = (e / 32, e % 32);
            let byte = |run: usize| blk[OFF_QS + 192 * j + 64 * run + 8 * r + i % 8];
            let q = if i < 24 {
                byte(i / 8) & 0x3F
            } else {
                ((byte(0) >> 6) << 4) | ((byte(1) >> 6) << 2) | (byte(2) >> 6)
            } as i32
                - 32;
            let g = e / 16;
            let s = blk[OFF_SCALES + 16 * (g / 2) + 2 * r + g % 2] as i8 as i32;
            *o = (d * s as f32) * q as f32 - 0.0 * 0.0;
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
                |p, a| unsafe { x86::group_dot_avx512::<N, true>(p, a) }
            } else {
                |p, a| unsafe { x86::group_dot_avx512::<N, false>(p, a) }
            });
        }
        if available() {
            return Some(|p, a| unsafe { x86::group_dot::<N>(p, a) });
        }
    }
    None
}

/// The AVX2 kernel for `N` tokens wherever the CPU has AVX2, FMA and F16C, even where
/// [`kernel`] picks the AVX-512 one: the tests hold the two to the same bits.
#[cfg(test)]
fn kernel_avx2<const N: usize>() -> Option<GroupKernel<N>> {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: the features the kernel is compiled for were detected just before.
        return Some(|p, a| unsafe { x86::group_dot::<N>(p, a) });
    }
    None
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{ActRow, BLOCK_BYTES, GROUP, OFF_QS, OFF_SCALES, QK_K};

    // One-token matmuls stream the packed weights once; the row kernels' prefetch serves them.
    use crate::quant::x86::prefetch_ahead;

    /// The loop the module docs describe. Lanes `(row, half)` of a register serve four rows
    /// (half `h` of the group: rows `4h..4h + 4`); the halves run one after the other so that
    /// a tile's accumulators stay in registers.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::needless_range_loop)] // `h` picks the rows' bytes as well as the accumulator
    pub(super) unsafe fn group_dot<const N: usize>(p: &[u8], a: &[ActRow; N]) -> [[f32; GROUP]; N] {
        let nb = p.len() / BLOCK_BYTES;
        for r in a {
            debug_assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.bsums.len() >= nb * 16);
        }
        let m_3f = _mm256_set1_epi8(0x3F);
        let (m_03, m_0c, m_30) = (_mm256_set1_epi8(0x03), _mm256_set1_epi8(0x0C), _mm256_set1_epi8(0x30));
        // From the four rows' (scale 2j, scale 2j + 1) words in both 128-bit lanes: every word
        // of row i's 64-bit lane ← that row's scale `e` (lanes 0, 1 are rows 0, 1 of the low
        // half, lanes 2, 3 rows 2, 3 of the high one).
        let scale_ctrl: [__m256i; 2] = std::array::from_fn(|e| {
            let c: [i8; 32] = std::array::from_fn(|i| (4 * (i / 8) + 2 * e + i % 2) as i8);
            _mm256_loadu_si256(c.as_ptr() as *const __m256i)
        });
        let mut acc = [[_mm256_setzero_ps(); 2]; N];
        for ib in 0..nb {
            let blk = p.as_ptr().add(ib * BLOCK_BYTES);
            prefetch_ahead::<OFF_QS>(blk, 0);
            // 32 · Σ_g scale[r][g] · bsum_g per row (lane r of eight), one pair of groups per
            // `vpmaddwd`.
            // (A plain loop: `array::from_fn`'s closure would not be inlined here.)
            let mut offset = [_mm256_setzero_si256(); N];
            for pair in 0..8 {
                let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(OFF_SCALES + 16 * pair) as *const __m128i));
                for (c, r) in offset.iter_mut().zip(a) {
                    let bs = r.bsums.as_ptr().add(ib * 16 + 2 * pair) as *const i32;
                    *c = _mm256_add_epi32(*c, _mm256_madd_epi16(sc, _mm256_set1_epi32(bs.read_unaligned())));
                }
            }
            for c in &mut offset {
                *c = _mm256_slli_epi32::<5>(*c);
            }
            for h in 0..2 {
                let mut s = [_mm256_setzero_si256(); N];
                for j in 0..8 {
                    let q = blk.add(OFF_QS + 192 * j);
                    if h == 0 {
                        prefetch_ahead::<192>(q, 0);
                    }
                    let run = |i: usize| _mm256_loadu_si256(q.add(64 * i + 32 * h) as *const __m256i);
                    let (r0, r1, r2) = (run(0), run(1), run(2));
                    let (w0, w1, w2) =
                        (_mm256_and_si256(r0, m_3f), _mm256_and_si256(r1, m_3f), _mm256_and_si256(r2, m_3f));
                    let w3 = _mm256_or_si256(
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<2>(r0), m_30),
                            _mm256_and_si256(_mm256_srli_epi16::<4>(r1), m_0c),
                        ),
                        _mm256_and_si256(_mm256_srli_epi16::<6>(r2), m_03),
                    );
                    // The four rows' scales of groups 2j and 2j + 1, sign-extended.
                    let pair =
                        _mm_cvtepi8_epi16(_mm_loadl_epi64(blk.add(OFF_SCALES + 16 * j + 8 * h) as *const __m128i));
                    let pair = _mm256_broadcastsi128_si256(pair);
                    let (sw0, sw1) =
                        (_mm256_shuffle_epi8(pair, scale_ctrl[0]), _mm256_shuffle_epi8(pair, scale_ctrl[1]));
                    for k in 0..N {
                        let y = (a[k].qs.as_ptr() as *const u8).add(ib * QK_K + 32 * j);
                        let yb = |o: usize| _mm256_set1_epi64x((y.add(o) as *const i64).read_unaligned());
                        let t0 = _mm256_add_epi16(_mm256_maddubs_epi16(w0, yb(0)), _mm256_maddubs_epi16(w1, yb(8)));
                        let t1 = _mm256_add_epi16(_mm256_maddubs_epi16(w2, yb(16)), _mm256_maddubs_epi16(w3, yb(24)));
                        s[k] = _mm256_add_epi32(
                            s[k],
                            _mm256_add_epi32(_mm256_madd_epi16(t0, sw0), _mm256_madd_epi16(t1, sw1)),
                        );
                    }
                }
                let d8 = crate::quant::row_scales4(blk.add(8 * h));
                for k in 0..N {
                    // This half's four row offsets into lanes (row, 0), zeros in (row, 1).
                    let off = if h == 0 {
                        _mm256_castsi256_si128(offset[k])
                    } else {
                        _mm256_extracti128_si256::<1>(offset[k])
                    };
                    let t = _mm256_sub_epi32(s[k], _mm256_cvtepu32_epi64(off));
                    let dd = _mm256_mul_ps(d8, _mm256_set1_ps(*a[k].d.get_unchecked(ib)));
                    acc[k][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), dd, acc[k][h]);
                }
            }
        }
        acc.map(|[lo, hi]| crate::quant::group_sums(lo, hi))
    }

    /// [`group_dot`] with 512-bit registers: one register holds a sub-block's eight elements
    /// of all eight rows (64-bit lane `r` is row `r`), `vpdpwssd` applies the scales, and
    /// every lane holds the integer [`group_dot`]'s lane `(row, half)` holds (the stored-value
    /// offset in the first lane of a row), so the float steps and the result are the same.
    /// `PREFETCH`: whether to ask for the weights ahead of use (`kernels::software_prefetch`).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn group_dot_avx512<const N: usize, const PREFETCH: bool>(
        p: &[u8],
        a: &[ActRow; N],
    ) -> [[f32; GROUP]; N] {
        let nb = p.len() / BLOCK_BYTES;
        for r in a {
            debug_assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb && r.bsums.len() >= nb * 16);
        }
        let m_3f = _mm512_set1_epi8(0x3F);
        let (m_03, m_0c, m_30) = (_mm512_set1_epi8(0x03), _mm512_set1_epi8(0x0C), _mm512_set1_epi8(0x30));
        // From a pair's sixteen scale words (row r's (2j, 2j + 1) at words 2r, 2r + 1): every
        // word of row r's 64-bit lane ← its scale `e`.
        let scale_idx: [__m512i; 2] = std::array::from_fn(|e| {
            let c: [i16; 32] = std::array::from_fn(|i| (2 * (i / 4) + e) as i16);
            _mm512_loadu_si512(c.as_ptr() as *const _)
        });
        // From two pairs' 32 scale words (pair 2q at words 0..16, 2q + 1 at 16..32): row r's
        // 64-bit lane ← (scale 4q, 4q + 1 | 4q + 2, 4q + 3), against the token's four sums of 16
        // broadcast to every 64-bit lane.
        let offset_idx = {
            let c: [i16; 32] = std::array::from_fn(|i| (2 * (i / 4) + i % 2 + 16 * ((i % 4) / 2)) as i16);
            _mm512_loadu_si512(c.as_ptr() as *const _)
        };
        let first_lane = _mm512_set1_epi64(0xFFFF_FFFF);
        // Lane L ← row L / 2 of eight floats.
        let dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
        let mut acc = [_mm512_setzero_ps(); N];
        for ib in 0..nb {
            let blk = p.as_ptr().add(ib * BLOCK_BYTES);
            if PREFETCH {
                prefetch_ahead::<OFF_QS>(blk, 0);
            }
            let mut s = [_mm512_setzero_si512(); N];
            for j in 0..8 {
                let q = blk.add(OFF_QS + 192 * j);
                if PREFETCH {
                    prefetch_ahead::<192>(q, 0);
                }
                let (r0, r1, r2) = (
                    _mm512_loadu_si512(q as *const _),
                    _mm512_loadu_si512(q.add(64) as *const _),
                    _mm512_loadu_si512(q.add(128) as *const _),
                );
                let (w0, w1, w2) = (_mm512_and_si512(r0, m_3f), _mm512_and_si512(r1, m_3f), _mm512_and_si512(r2, m_3f));
                let w3 = _mm512_or_si512(
                    _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16::<2>(r0), m_30),
                        _mm512_and_si512(_mm512_srli_epi16::<4>(r1), m_0c),
                    ),
                    _mm512_and_si512(_mm512_srli_epi16::<6>(r2), m_03),
                );
                let pair = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(
                    blk.add(OFF_SCALES + 16 * j) as *const __m128i
                )));
                let (sw0, sw1) =
                    (_mm512_permutexvar_epi16(scale_idx[0], pair), _mm512_permutexvar_epi16(scale_idx[1], pair));
                for k in 0..N {
                    let y = (a[k].qs.as_ptr() as *const u8).add(ib * QK_K + 32 * j);
                    let yb = |o: usize| _mm512_set1_epi64((y.add(o) as *const i64).read_unaligned());
                    let t0 = _mm512_add_epi16(_mm512_maddubs_epi16(w0, yb(0)), _mm512_maddubs_epi16(w1, yb(8)));
                    let t1 = _mm512_add_epi16(_mm512_maddubs_epi16(w2, yb(16)), _mm512_maddubs_epi16(w3, yb(24)));
                    s[k] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(s[k], t0, sw0), t1, sw1);
                }
            }
            // 32 · Σ_g scale[r][g] · bsum_g per row, four groups per `vpdpwssd`, summed into the
            // first lane of the row.
            let sc: [__m512i; 4] = std::array::from_fn(|q| {
                let words = _mm512_cvtepi8_epi16(_mm256_loadu_si256(blk.add(OFF_SCALES + 32 * q) as *const __m256i));
                _mm512_permutexvar_epi16(offset_idx, words)
            });
            let d16 = _mm512_permutexvar_ps(
                dup,
                _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i))),
            );
            for k in 0..N {
                let bs = a[k].bsums.as_ptr().add(ib * 16) as *const i64;
                let mut off = _mm512_setzero_si512();
                for (q, c) in sc.iter().enumerate() {
                    off = _mm512_dpwssd_epi32(off, *c, _mm512_set1_epi64(bs.add(q).read_unaligned()));
                }
                let off = _mm512_and_si512(_mm512_add_epi32(off, _mm512_srli_epi64::<32>(off)), first_lane);
                let t = _mm512_sub_epi32(s[k], _mm512_slli_epi32::<5>(off));
                let dd = _mm512_mul_ps(d16, _mm512_set1_ps(*a[k].d.get_unchecked(ib)));
                acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), dd, acc[k]);
            }
        }
        acc.map(|v| crate::quant::group_sums512(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::{check_packing, random_blocks};
    use crate::quant::{unpack_k, QuantType};

    #[test]
    fn packed_groups_match_the_reference_dot_and_each_other() {
        let Some(k1) = kernel::<1>() else {
            crate::test_support::report_skip(
                "avx512bw + avx512vnni, or avx2 and no avx512bw",
                "quant::q6k_x8 packed Q6_K group kernels",
            );
            return;
        };
        let (k4, k8) = (kernel::<4>().unwrap(), kernel::<8>().unwrap());
        check_packing(QuantType::Q6_K, pack, dequantize_row, BLOCK_BYTES, (k1, k4, k8));
        if let Some(k1) = kernel_avx2::<1>() {
            let (k4, k8) = (kernel_avx2::<4>().unwrap(), kernel_avx2::<8>().unwrap());
            check_packing(QuantType::Q6_K, pack, dequantize_row, BLOCK_BYTES, (k1, k4, k8));
        }
    }

    /// The AVX-512 kernel gives the AVX2 kernel's bits (the same integers per lane, the same
    /// float steps), on extreme values too: every stored value 0 or 63, scales ±127 and −128,
    /// activations ±127.
    #[test]
    fn avx512_and_avx2_kernels_give_the_same_bits() {
        let (Some(k1), Some(a1)) = (kernel::<1>().filter(|_| avx512()), kernel_avx2::<1>()) else {
            crate::test_support::report_skip("avx512bw + avx512vnni", "quant::q6k_x8 AVX-512 against AVX2");
            return;
        };
        let (k4, k8) = (kernel::<4>().unwrap(), kernel::<8>().unwrap());
        let (a4, a8) = (kernel_avx2::<4>().unwrap(), kernel_avx2::<8>().unwrap());
        let (rows, cols) = (16, 1024);
        let mut w = random_blocks(QuantType::Q6_K, rows * cols / QK_K, 17);
        // The last rows' blocks at the extremes: all values 0 (low bits and high bits clear) or
        // all 63, and scales at the ends of i8.
        for (i, b) in w.chunks_exact_mut(210).enumerate().skip(rows * cols / QK_K - 12) {
            let fill = if i % 2 == 0 { 0x00 } else { 0xFF };
            b[..192].fill(fill);
            for (s, v) in b[192..208].iter_mut().enumerate() {
                *v = [127i8, -128, -127, 1][(s + i) % 4] as u8;
            }
        }
        let p = pack(&w, rows, cols);
        let mut x: Vec<f32> = (0..8 * cols).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 97.0).collect();
        for (i, v) in x[7 * cols..].iter_mut().enumerate() {
            *v = if i % 3 == 0 { 3.0 } else { -3.0 };
        }
        let acts = crate::quant::QuantizedActs::new(QuantType::Q6_K.act_format(), &x, 8);
        let t: [ActRow; 8] = std::array::from_fn(|k| acts.row(k));
        let gb = cols / QK_K * BLOCK_BYTES;
        for (g, pg) in p.chunks_exact(gb).enumerate() {
            assert_eq!(k8(pg, &t), a8(pg, &t), "group {g}: eight tokens");
            let t4 = [t[0], t[3], t[5], t[7]];
            assert_eq!(k4(pg, &t4), a4(pg, &t4), "group {g}: four tokens");
            for (k, row) in t.iter().enumerate() {
                assert_eq!(k1(pg, &[*row]), a1(pg, &[*row]), "group {g} token {k}");
            }
        }
    }

    /// Both builds of the AVX-512 kernel, with and without the weight prefetch
    /// (`kernels::software_prefetch` picks one per CPU), whichever this CPU defaults to.
    #[test]
    fn the_avx512_kernel_matches_the_reference_with_and_without_its_prefetch() {
        if !avx512() {
            crate::test_support::report_skip("avx512vnni", "quant::q6k_x8 AVX-512 kernel with and without prefetch");
            return;
        }
        check_avx512_build::<true>();
        check_avx512_build::<false>();
    }

    /// `check_packing` on the AVX-512 kernel built with `PREFETCH`; the caller has detected
    /// AVX-512.
    fn check_avx512_build<const PREFETCH: bool>() {
        // SAFETY (all three): the caller detected AVX-512 BW/VNNI and AVX2.
        check_packing(
            QuantType::Q6_K,
            pack,
            dequantize_row,
            BLOCK_BYTES,
            (
                |p, a| unsafe { x86::group_dot_avx512::<1, PREFETCH>(p, a) },
                |p, a| unsafe { x86::group_dot_avx512::<4, PREFETCH>(p, a) },
                |p, a| unsafe { x86::group_dot_avx512::<8, PREFETCH>(p, a) },
            ),
        );
    }

    #[test]
    fn stored_values_are_the_unpacked_values_plus_32() {
        for b in random_blocks(QuantType::Q6_K, 8, 11).chunks_exact(210) {
            let u = unpack_k(QuantType::Q6_K, b);
            let want: Vec<u8> = u.q.iter().map(|&q| (q + 32) as u8).collect();
            assert_eq!(stored_values(b).to_vec(), want);
        }
    }
}
