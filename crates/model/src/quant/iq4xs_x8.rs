//! IQ4_XS weights repacked eight rows at a time, and the AVX2 matmul over them.
//!
//! IQ4_XS is Q4_K's shape (256-element super-blocks, one 6-bit scale per 32 elements) with a
//! non-linear value table in place of a minimum: element `e` is `d · (s − 32) · K[q]`, `q` a
//! 4-bit index into the sixteen signed values of [`super::KVALUES_IQ4NL`]. The nibbles are
//! interleaved exactly as [`super::q4k_x8`] interleaves Q4_K's, so a 256-bit register holds
//! eight consecutive elements of each of four rows, one 64-bit lane per row:
//!
//! * `vpshufb` turns a register of indices into the table's signed values;
//! * `vpmaddubsw` wants one unsigned side, so each product is taken as `|K[q]| · ±y` (the sign
//!   of the weight moved onto the token's bytes with `vpsignb`); a word then holds up to
//!   2 · 127 · 127 = 32,258, so no two registers may be added as words, and each goes through
//!   its own `vpmaddwd` by the row's scale;
//! * the float step per super-block (`ad · d · S`) serves four rows at once.
//!
//! The integers are [`super::dot_reference`]'s; only the float order differs (fixed, so one
//! token and a tile of tokens give bit-identical results for the same token). A packed
//! super-block of eight rows takes 1,104 bytes against the rows' 8 · 136 = 1,088 (the scales
//! kept as whole bytes, 1.5 % more). Packing happens once, at load, on a CPU with AVX2 (every
//! x86 CPU here runs IQ4_XS's row kernels with AVX2, AVX-512 or not), for matrices whose rows
//! come in eights.

use super::{ActRow, GroupKernel, KVALUES_IQ4NL, QK_K};

/// Rows interleaved in one packed group.
pub const GROUP: usize = 8;

/// Bytes of one packed super-block of eight rows: `d` ×8 (f16), the signed scales (`s − 32`,
/// i8) as `[sub-block][row]`, then per sub-block two 64-byte registers of index nibbles (see
/// [`pack`]).
pub const BLOCK_BYTES: usize = 16 + 64 + 8 * 128;

const OFF_SCALES: usize = 16;
const OFF_QS: usize = 80;

/// Whether this CPU runs the packed kernel: AVX2, FMA and F16C.
pub fn available() -> bool {
    super::has_avx2()
}

/// The signed scale (`s − 32`) of sub-block `sb` (0..8) of a ggml IQ4_XS block.
fn scale(b: &[u8], sb: usize) -> i8 {
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let low = (b[4 + sb / 2] >> (4 * (sb % 2))) & 0xF;
    let high = ((scales_h >> (2 * sb)) & 3) as u8;
    (low | (high << 4)) as i8 - 32
}

/// Packs a row-major IQ4_XS matrix (`rows` a multiple of [`GROUP`], `cols` of 256): group
/// `g`'s super-block `ib` lands at `(g · nb + ib) · BLOCK_BYTES`. In sub-block `j` (elements
/// `32j..32j + 32`), register `i` (0..4) holds byte `8r + b` = the index of value
/// `32j + 8i + b` of row `r`; registers 0 and 1 share 64 bytes as low and high nibbles, as do 2
/// and 3 (Q4_K's packing, [`super::q4k_x8::pack`]).
pub fn pack(w: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    use rayon::prelude::*;
    assert!(rows.is_multiple_of(GROUP) && cols.is_multiple_of(QK_K), "pack: {rows} × {cols} does not tile");
    let nb = cols / QK_K;
    let row_bytes = nb * 136;
    assert_eq!(w.len(), rows * row_bytes, "pack: weight length");
    let mut out = super::pack_buffer(rows / GROUP * nb * BLOCK_BYTES);
    out.par_chunks_mut(nb * BLOCK_BYTES).enumerate().for_each(|(g, dst)| {
        for (ib, blk) in dst.chunks_exact_mut(BLOCK_BYTES).enumerate() {
            for r in 0..GROUP {
                let b = &w[(g * GROUP + r) * row_bytes + ib * 136..][..136];
                blk[2 * r..2 * r + 2].copy_from_slice(&b[0..2]);
                for j in 0..8 {
                    blk[OFF_SCALES + 8 * j + r] = scale(b, j) as u8;
                    // Element 32j + l is the low nibble of byte 16j + l (l < 16), else the high
                    // nibble of byte 16j + l − 16.
                    let qs = &b[8 + 16 * j..][..16];
                    let index = |l: usize| if l < 16 { qs[l] & 0xF } else { qs[l - 16] >> 4 };
                    for half in 0..2 {
                        let reg = &mut blk[OFF_QS + 128 * j + 64 * half + 8 * r..][..8];
                        for (i, o) in reg.iter_mut().enumerate() {
                            *o = index(16 * half + i) | (index(16 * half + 8 + i) << 4);
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
        let d = super::f16_at(blk, 2 * r);
        for j in 0..8 {
            let dl = d * (blk[OFF_SCALES + 8 * j + r] as i8) as f32;
            for i in 0..4 {
                for b in 0..8 {
                    let byte = blk[OFF_QS + 128 * j + 64 * (i / 2) + 8 * r + b];
                    let q = (byte >> (4 * (i % 2))) & 0xF;
                    y[32 * j + 8 * i + b] = dl * KVALUES_IQ4NL[q as usize] as f32;
                }
            }
        }
    }
}

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

    use super::{ActRow, BLOCK_BYTES, GROUP, KVALUES_IQ4NL, OFF_QS, OFF_SCALES, QK_K};

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
            debug_assert!(r.qs.len() >= nb * QK_K && r.d.len() >= nb);
        }
        let mask = _mm256_set1_epi8(0x0F);
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
        // Every word of row i's 64-bit lane ← row (4h + i)'s scale word, from the eight rows'
        // scales (words) in both 128-bit lanes.
        let scale_ctrl: [__m256i; 2] = std::array::from_fn(|h| {
            let c: [i8; 32] = std::array::from_fn(|i| (2 * (4 * h + i / 8) + i % 2) as i8);
            _mm256_loadu_si256(c.as_ptr() as *const __m256i)
        });
        let mut acc = [[_mm256_setzero_ps(); 2]; N];
        for ib in 0..nb {
            let blk = p.as_ptr().add(ib * BLOCK_BYTES);
            prefetch_ahead::<OFF_QS>(blk, 0);
            for h in 0..2 {
                let mut s = [_mm256_setzero_si256(); N];
                for j in 0..8 {
                    let q = blk.add(OFF_QS + 128 * j + 32 * h);
                    if h == 0 {
                        prefetch_ahead::<128>(q, 0);
                    }
                    let pa = _mm256_loadu_si256(q as *const __m256i);
                    let pb = _mm256_loadu_si256(q.add(64) as *const __m256i);
                    let v = [
                        _mm256_shuffle_epi8(table, _mm256_and_si256(pa, mask)),
                        _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(pa), mask)),
                        _mm256_shuffle_epi8(table, _mm256_and_si256(pb, mask)),
                        _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(pb), mask)),
                    ];
                    let av = v.map(|x| _mm256_abs_epi8(x));
                    let sc = _mm_cvtepi8_epi16(_mm_loadl_epi64(blk.add(OFF_SCALES + 8 * j) as *const __m128i));
                    let sw = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(sc), scale_ctrl[h]);
                    for k in 0..N {
                        let y = (a[k].qs.as_ptr() as *const u8).add(ib * QK_K + 32 * j);
                        let mut t = s[k];
                        for i in 0..4 {
                            let yb = _mm256_set1_epi64x((y.add(8 * i) as *const i64).read_unaligned());
                            let prod = _mm256_maddubs_epi16(av[i], _mm256_sign_epi8(yb, v[i]));
                            t = _mm256_add_epi32(t, _mm256_madd_epi16(prod, sw));
                        }
                        s[k] = t;
                    }
                }
                let d8 = crate::quant::row_scales4(blk.add(8 * h));
                for k in 0..N {
                    let da = _mm256_set1_ps(*a[k].d.get_unchecked(ib));
                    acc[k][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[k]), _mm256_mul_ps(d8, da), acc[k][h]);
                }
            }
        }
        acc.map(|[lo, hi]| crate::quant::group_sums(lo, hi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::check_packing;
    use crate::quant::QuantType;

    #[test]
    fn packed_groups_match_the_reference_dot_and_each_other() {
        let (Some(k1), Some(k4), Some(k8)) = (kernel::<1>(), kernel::<4>(), kernel::<8>()) else {
            crate::test_support::report_skip("avx2", "quant::iq4xs_x8 packed IQ4_XS group kernels (1, 4, 8 tokens)");
            return;
        };
        check_packing(QuantType::IQ4_XS, pack, dequantize_row, BLOCK_BYTES, (k1, k4, k8));
    }
}
