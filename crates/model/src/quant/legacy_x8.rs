//! The 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) repacked eight rows at a
//! time, and the AVX2 matmul over them.
//!
//! The idea of [`super::q4k_x8`] applied to blocks of 32: a row-at-a-time dot ends every block
//! of 32 products in a float step of its own (convert, scale, add), as much work as the
//! multiplies. Here a 256-bit register holds eight consecutive elements of each of four rows,
//! one 64-bit lane per row, so every step serves four rows:
//!
//! * unsigned codes (Q4_0, Q4_1: 0..15; Q5_0, Q5_1: 0..31): `vpmaddubsw` against the token's
//!   eight activation bytes broadcast to every 64-bit lane, the four registers of a block
//!   added as words (at most 4 · 2 · 31 · 127 = 31,496: no overflow), one `vpmaddwd` by ones;
//!   the offsets of Q4_0 (8) and Q5_0 (16) come off in integers from the activation block's
//!   sum, and the minimums of Q4_1/Q5_1 are `m · s` with the activation's `s = d·Σq` as ggml's
//!   Q8_1 has it;
//! * signed values (Q8_0, and IQ4_NL's table entries looked up with `vpshufb`): `vpmaddubsw`
//!   of `|w|` against `y` carrying `w`'s sign (`vpsignb`; |w| is taken once for every token),
//!   one `vpmaddwd` by ones per register (two such words would overflow);
//! * then one convert and one multiply-add by `d_w · d_y` per block for four rows.
//!
//! A packed block of eight rows takes exactly the bytes of their eight ggml blocks. The
//! integer sums per block are [`super::dot_reference`]'s; the float order differs (fixed, so
//! one token and a tile of tokens give bit-identical results for the same token). Packing
//! happens once, at load, on a CPU with AVX2 but not AVX-512 VNNI (which keeps its own
//! measured block-32 kernels), for matrices whose rows come in eights.

use super::{f16_at, ActRow, GroupKernel, QuantType, KVALUES_IQ4NL};

/// Rows interleaved in one packed group.
pub const GROUP: usize = 8;

/// Whether `ty` has an eight-row packing here.
pub fn handles(ty: QuantType) -> bool {
    matches!(
        ty,
        QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q5_1 | QuantType::Q8_0 | QuantType::IQ4_NL
    )
}

/// Bytes of one packed block of eight rows (eight times the ggml block).
pub fn block_bytes(ty: QuantType) -> usize {
    GROUP * ty.block_bytes()
}

/// Whether this CPU runs the packed kernels: AVX2, FMA and F16C, and no AVX-512 VNNI.
pub fn available() -> bool {
    super::has_avx2() && !super::has_avx512vnni()
}

/// Where the values start in a packed block: after `d` ×8 (f16), and `m` ×8 for Q4_1/Q5_1.
fn values_offset(ty: QuantType) -> usize {
    if matches!(ty, QuantType::Q4_1 | QuantType::Q5_1) {
        32
    } else {
        16
    }
}

/// Packs a row-major matrix of `ty` (`rows` a multiple of [`GROUP`]): group `g`'s block `ib`
/// lands at `(g · nb + ib) · block_bytes(ty)`. After the scales, the values of the eight rows:
/// 4- and 5-bit codes as two 64-byte chunks whose byte `8r + b` holds element `b` (low
/// nibble) and `8 + b` (high) of row `r`, then `16 + b` and `24 + b`; Q5's fifth bits as 32
/// bytes whose byte `8r + b` (r < 4) holds those of elements `8k + b` of row `r` in bit
/// `4 + k` and of row `r + 4` in bit `k`; Q8_0's bytes as eight 32-byte registers, register
/// `4h + k` holding element `8k + b` of row `4h + r` at byte `8r + b`.
pub fn pack(ty: QuantType, w: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    use rayon::prelude::*;
    assert!(handles(ty) && rows.is_multiple_of(GROUP) && cols.is_multiple_of(32), "pack: {ty} {rows} × {cols}");
    let (nb, bb) = (cols / 32, ty.block_bytes());
    let row_bytes = nb * bb;
    assert_eq!(w.len(), rows * row_bytes, "pack: weight length");
    let pb = block_bytes(ty);
    let vo = values_offset(ty);
    let five_bits = matches!(ty, QuantType::Q5_0 | QuantType::Q5_1);
    let mut out = super::pack_buffer(rows / GROUP * nb * pb);
    out.par_chunks_mut(nb * pb).enumerate().for_each(|(g, dst)| {
        for (ib, blk) in dst.chunks_exact_mut(pb).enumerate() {
            for r in 0..GROUP {
                let b = &w[(g * GROUP + r) * row_bytes + ib * bb..][..bb];
                blk[2 * r..2 * r + 2].copy_from_slice(&b[0..2]);
                if vo == 32 {
                    blk[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&b[2..4]);
                }
                let v = &mut blk[vo..];
                if ty == QuantType::Q8_0 {
                    for k in 0..4 {
                        v[128 * (r / 4) + 32 * k + 8 * (r % 4)..][..8].copy_from_slice(&b[2 + 8 * k..][..8]);
                    }
                    continue;
                }
                // ggml's byte j holds elements j (low nibble) and j + 16 (high); eight bytes at a
                // time in a u64, the two 64-byte chunks come out of `x` = bytes 0..8 and `y` =
                // bytes 8..16 in a few word operations (packing a large matrix at load runs here).
                let qs = match ty {
                    QuantType::Q4_1 => 4,
                    QuantType::Q5_0 => 6,
                    QuantType::Q5_1 => 8,
                    _ => 2,
                };
                let word = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("eight bytes"));
                let (x, y) = (word(qs), word(qs + 8));
                const LOW: u64 = 0x0F0F_0F0F_0F0F_0F0F;
                v[8 * r..][..8].copy_from_slice(&((x & LOW) | ((y & LOW) << 4)).to_le_bytes());
                v[64 + 8 * r..][..8].copy_from_slice(&(((x >> 4) & LOW) | (y & !LOW)).to_le_bytes());
                if five_bits {
                    let h = if ty == QuantType::Q5_0 { 2 } else { 4 };
                    let qh = u32::from_le_bytes([b[h], b[h + 1], b[h + 2], b[h + 3]]);
                    let base = if r < 4 { 4 } else { 0 };
                    for k in 0..4 {
                        for (i, o) in v[128 + 8 * (r % 4)..][..8].iter_mut().enumerate() {
                            *o |= (((qh >> (8 * k + i)) & 1) as u8) << (base + k);
                        }
                    }
                }
            }
        }
    });
    out
}

/// Row `r` (0..8) of one packed group dequantized into `out`, with the float operations of
/// [`super::dequantize`] (so the same values).
pub fn dequantize_row(ty: QuantType, group: &[u8], r: usize, out: &mut [f32]) {
    let vo = values_offset(ty);
    for (blk, y) in group.chunks_exact(block_bytes(ty)).zip(out.chunks_exact_mut(32)) {
        let d = f16_at(blk, 2 * r);
        let m = if vo == 32 { f16_at(blk, 16 + 2 * r) } else { 0.0 };
        let v = &blk[vo..];
        for (e, o) in y.iter_mut().enumerate() {
            let (k, i) = (e / 8, e % 8);
            let c = if ty == QuantType::Q8_0 {
                v[128 * (r / 4) + 32 * k + 8 * (r % 4) + i]
            } else {
                let low = (v[64 * (k / 2) + 8 * r + i] >> (4 * (k % 2))) & 0xF;
                let high = if matches!(ty, QuantType::Q5_0 | QuantType::Q5_1) {
                    let bit = if r < 4 { 4 + k } else { k };
                    (v[128 + 8 * (r % 4) + i] >> bit) & 1
                } else {
                    0
                };
                low | (high << 4)
            };
            *o = match ty {
                QuantType::Q4_0 => (c as i32 - 8) as f32 * d,
                QuantType::Q5_0 => (c as i32 - 16) as f32 * d,
                QuantType::Q4_1 | QuantType::Q5_1 => c as f32 * d + m,
                QuantType::Q8_0 => c as i8 as f32 * d,
                _ => d * KVALUES_IQ4NL[c as usize] as f32,
            };
        }
    }
}

/// The packed kernel of `ty` for `N` tokens (1, 4 or 8), when [`available`].
pub fn kernel<const N: usize>(ty: QuantType) -> Option<GroupKernel<N>> {
    #[cfg(target_arch = "x86_64")]
    if available() {
        use x86::*;
        // SAFETY (all): the features the kernels are compiled for were detected by `available`.
        let f: GroupKernel<N> = match ty {
            QuantType::Q4_0 => |p, a| unsafe { group_dot::<Q4_0, N>(p, a) },
            QuantType::Q4_1 => |p, a| unsafe { group_dot::<Q4_1, N>(p, a) },
            QuantType::Q5_0 => |p, a| unsafe { group_dot::<Q5_0, N>(p, a) },
            QuantType::Q5_1 => |p, a| unsafe { group_dot::<Q5_1, N>(p, a) },
            QuantType::Q8_0 => |p, a| unsafe { group_dot::<Q8_0, N>(p, a) },
            QuantType::IQ4_NL => |p, a| unsafe { group_dot::<IQ4_NL, N>(p, a) },
            _ => return None,
        };
        return Some(f);
    }
    let _ = ty;
    None
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{ActRow, GROUP, KVALUES_IQ4NL};
    use crate::quant::x86::prefetch_ahead;

    // The kernel's type parameter (a const generic, so each type compiles to its own loop).
    pub(super) const Q4_0: u8 = 0;
    pub(super) const Q4_1: u8 = 1;
    pub(super) const Q5_0: u8 = 2;
    pub(super) const Q5_1: u8 = 3;
    pub(super) const Q8_0: u8 = 4;
    pub(super) const IQ4_NL: u8 = 5;

    /// Bytes of a packed block of type `T`.
    const fn block_bytes(t: u8) -> usize {
        8 * match t {
            Q4_0 | IQ4_NL => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            _ => 34,
        }
    }

    /// The four weight registers of half `h` (rows `4h..4h + 4`) of the packed block at `blk`
    /// (values at `v`): unsigned codes for Q4_0/Q4_1/Q5_0/Q5_1, signed values for Q8_0/IQ4_NL.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weights<const T: u8>(v: *const u8, h: usize) -> [__m256i; 4] {
        if T == Q8_0 {
            return std::array::from_fn(|k| _mm256_loadu_si256(v.add(128 * h + 32 * k) as *const __m256i));
        }
        let m4 = _mm256_set1_epi8(0x0F);
        let a = _mm256_loadu_si256(v.add(32 * h) as *const __m256i);
        let b = _mm256_loadu_si256(v.add(64 + 32 * h) as *const __m256i);
        let mut w = [
            _mm256_and_si256(a, m4),
            _mm256_and_si256(_mm256_srli_epi16::<4>(a), m4),
            _mm256_and_si256(b, m4),
            _mm256_and_si256(_mm256_srli_epi16::<4>(b), m4),
        ];
        if T == Q5_0 || T == Q5_1 {
            let hb = _mm256_loadu_si256(v.add(128) as *const __m256i);
            let fifth = crate::quant::fifth_bits(hb, h);
            for (wk, f) in w.iter_mut().zip(fifth) {
                *wk = _mm256_or_si256(*wk, f);
            }
        }
        if T == IQ4_NL {
            let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
            for wk in &mut w {
                *wk = _mm256_shuffle_epi8(table, *wk);
            }
        }
        w
    }

    /// Prefetches the lines of the packed block of type `T` that the stream reaches
    /// `PREFETCH_AHEAD` bytes later (every block but Q8_0's spans three lines, Q8_0's five).
    #[inline(always)]
    unsafe fn prefetch_block<const T: u8>(blk: *const u8) {
        if T == Q8_0 {
            prefetch_ahead::<{ block_bytes(Q8_0) }>(blk, 0);
        } else {
            prefetch_ahead::<192>(blk, 0);
        }
    }

    /// Half `h` (rows `4h..4h + 4`) of packed block `ib` (at `blk`) against the `N` tokens,
    /// added into their accumulators.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_half<const T: u8, const N: usize>(
        blk: *const u8,
        ib: usize,
        h: usize,
        a: &[ActRow; N],
        acc: &mut [__m256; N],
    ) {
        let with_min = T == Q4_1 || T == Q5_1;
        let signed = T == Q8_0 || T == IQ4_NL;
        let ones = _mm256_set1_epi16(1);
        // The minimum term goes into one lane of each row.
        let first_lane = _mm256_set_ps(0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0);
        let vo = if with_min { 32 } else { 16 };
        let w = weights::<T>(blk.add(vo), h);
        // One row's scale (and minimum) for both of its lanes.
        let widen = |off: usize| crate::quant::row_scales4(blk.add(off + 8 * h));
        let d8 = widen(0);
        let m8 = if with_min { _mm256_mul_ps(widen(16), first_lane) } else { _mm256_setzero_ps() };
        let aw: [__m256i; 4] = if signed { w.map(|x| _mm256_sign_epi8(x, x)) } else { w };
        for k in 0..N {
            let y = (a[k].qs.as_ptr() as *const u8).add(32 * ib);
            let yb = |j: usize| _mm256_set1_epi64x((y.add(8 * j) as *const i64).read_unaligned());
            let mut s = if signed {
                let dot = |j: usize| {
                    let p = _mm256_maddubs_epi16(aw[j], _mm256_sign_epi8(yb(j), w[j]));
                    _mm256_madd_epi16(p, ones)
                };
                _mm256_add_epi32(_mm256_add_epi32(dot(0), dot(1)), _mm256_add_epi32(dot(2), dot(3)))
            } else {
                let t = _mm256_add_epi16(
                    _mm256_add_epi16(_mm256_maddubs_epi16(w[0], yb(0)), _mm256_maddubs_epi16(w[1], yb(1))),
                    _mm256_add_epi16(_mm256_maddubs_epi16(w[2], yb(2)), _mm256_maddubs_epi16(w[3], yb(3))),
                );
                _mm256_madd_epi16(t, ones)
            };
            if T == Q4_0 || T == Q5_0 {
                // The offset (8 or 16) times the block's activation sum, half in each
                // of a row's two lanes.
                let half_offset = if T == Q4_0 { 4 } else { 8 };
                let sum = *a[k].sums32.get_unchecked(ib) as i32;
                s = _mm256_sub_epi32(s, _mm256_set1_epi32(half_offset * sum));
            }
            let dd = _mm256_mul_ps(d8, _mm256_set1_ps(*a[k].d.get_unchecked(ib)));
            acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dd, acc[k]);
            if with_min {
                acc[k] = _mm256_fmadd_ps(m8, _mm256_set1_ps(*a[k].s.get_unchecked(ib)), acc[k]);
            }
        }
    }

    /// Eight rows (one packed group) against `N` tokens, as the module docs describe: lanes
    /// `(row, half)` of a register serve four rows (half `h`: rows `4h..4h + 4`); per block,
    /// a half's weights are unpacked once for all `N` tokens.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn group_dot<const T: u8, const N: usize>(p: &[u8], a: &[ActRow; N]) -> [[f32; GROUP]; N] {
        let bb = block_bytes(T);
        let nb = p.len() / bb;
        let with_min = T == Q4_1 || T == Q5_1;
        for r in a {
            debug_assert!(r.qs.len() >= nb * 32 && r.d.len() >= nb);
            debug_assert!(!with_min || r.s.len() >= nb);
            debug_assert!(!(T == Q4_0 || T == Q5_0) || r.sums32.len() >= nb);
        }
        let mut out = [[0.0f32; GROUP]; N];
        if N == 1 {
            // Decode: both halves of a block in turn, so the weights stream through once.
            let mut acc = [[_mm256_setzero_ps(); N]; 2];
            for ib in 0..nb {
                let blk = p.as_ptr().add(ib * bb);
                prefetch_block::<T>(blk);
                block_half::<T, N>(blk, ib, 0, a, &mut acc[0]);
                block_half::<T, N>(blk, ib, 1, a, &mut acc[1]);
            }
            for (h, acc) in acc.iter().enumerate() {
                for (o, v) in out.iter_mut().zip(acc) {
                    o[4 * h..4 * h + 4].copy_from_slice(&crate::quant::row_pair_sums(*v));
                }
            }
            return out;
        }
        // A tile: one half of the rows at a time, over the whole row, so that the tile's float
        // accumulators stay in registers (the group's bytes are in cache again for the second
        // half).
        for h in 0..2 {
            let mut acc = [_mm256_setzero_ps(); N];
            for ib in 0..nb {
                let blk = p.as_ptr().add(ib * bb);
                if h == 0 {
                    prefetch_block::<T>(blk);
                }
                block_half::<T, N>(blk, ib, h, a, &mut acc);
            }
            for (o, v) in out.iter_mut().zip(acc) {
                o[4 * h..4 * h + 4].copy_from_slice(&crate::quant::row_pair_sums(v));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::{dot_magnitude, random_blocks};
    use crate::quant::{dot_reference, QuantizedActs};

    const TYPES: [QuantType; 6] =
        [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_0, QuantType::Q5_1, QuantType::Q8_0, QuantType::IQ4_NL];

    #[test]
    fn packed_groups_match_the_reference_dot_and_each_other() {
        if !available() {
            crate::test_support::report_skip("avx2 and no avx512vnni", "quant::legacy_x8 packed block-32 kernels");
            return;
        }
        let (rows, cols) = (16, 320);
        // Activations that reach ±127 in every block, so the word sums meet their bound.
        let x: Vec<f32> = (0..8 * cols).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 97.0).collect();
        for ty in TYPES {
            let (k1, k4, k8) = (kernel::<1>(ty).unwrap(), kernel::<4>(ty).unwrap(), kernel::<8>(ty).unwrap());
            let w = random_blocks(ty, rows * cols / 32, 5);
            let p = pack(ty, &w, rows, cols);
            let acts = QuantizedActs::new(ty.act_format(), &x, 8);
            let rows8: [ActRow; 8] = std::array::from_fn(|k| acts.row(k));
            let (gb, rb) = (cols / 32 * block_bytes(ty), cols / 32 * ty.block_bytes());
            for g in 0..rows / GROUP {
                let pg = &p[g * gb..(g + 1) * gb];
                let y8 = k8(pg, &rows8);
                let y4 = k4(pg, &[rows8[4], rows8[5], rows8[6], rows8[7]]);
                for k in 0..8 {
                    assert_eq!(k1(pg, &[rows8[k]])[0], y8[k], "{ty} group {g} token {k}: one token vs eight");
                    if k >= 4 {
                        assert_eq!(y4[k - 4], y8[k], "{ty} group {g} token {k}: four vs eight");
                    }
                    for (r, got) in y8[k].iter().enumerate() {
                        let row = &w[(g * GROUP + r) * rb..][..rb];
                        let want = dot_reference(ty, row, &rows8[k]);
                        let tol = 1e-5 * dot_magnitude(ty, row, &rows8[k]);
                        assert!((got - want).abs() <= tol, "{ty} row {} token {k}: {got} vs {want}", g * GROUP + r);
                    }
                }
            }
        }
    }

    #[test]
    fn packed_rows_dequantize_to_the_original_values() {
        let (rows, cols) = (16, 128);
        for ty in TYPES {
            let w = random_blocks(ty, rows * cols / 32, 3);
            let p = pack(ty, &w, rows, cols);
            let (gb, rb) = (cols / 32 * block_bytes(ty), cols / 32 * ty.block_bytes());
            for row in 0..rows {
                let mut want = vec![0.0; cols];
                crate::quant::dequantize(ty, &w[row * rb..][..rb], &mut want);
                let mut got = vec![0.0; cols];
                dequantize_row(ty, &p[row / GROUP * gb..][..gb], row % GROUP, &mut got);
                assert_eq!(got, want, "{ty} row {row}");
            }
        }
    }
}
