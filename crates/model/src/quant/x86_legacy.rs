//! AVX2 + FMA + F16C kernels for the 32-element-block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! IQ4_NL) against Q8_0/Q8_1 activations: the single dot, the 4-row form (four weight rows, one
//! token) and the 4-token form (one weight row, four tokens).
//!
//! Every form of one format unpacks a block with the same [`block`] and runs the same float
//! steps per token ([`Acc`]), so the 4-row and 4-token results are bit-identical to the single
//! dot of that row and token; the integer sums are exact, as in [`super::super::dot_reference`].
//! Q4_0, Q4_1 and Q8_0 already have single dots in `x86` (AVX2 and VNNI); the forms here for
//! them follow those kernels' float steps exactly (and VNNI's integer lanes equal AVX2's), so
//! they may be mixed with them in one matmul.

use std::arch::x86_64::*;

use super::{dot_i8, dot_u8_i8, f16x2, hsum_ps, nibbles, prefetch_ahead, PREFETCH_AHEAD};
use crate::quant::ActRow;

/// Format selectors for the `const F: u8` parameter of the kernels below.
pub(super) const Q4_0: u8 = 0;
/// Q4_1: `d·q + m`, q 4-bit.
pub(super) const Q4_1: u8 = 1;
/// Q5_0: `d·(q − 16)`, q 5-bit.
pub(super) const Q5_0: u8 = 2;
/// Q5_1: `d·q + m`, q 5-bit.
pub(super) const Q5_1: u8 = 3;
/// Q8_0: `d·q`, q int8.
pub(super) const Q8_0: u8 = 4;
/// IQ4_NL: `d·kvalues[q]`, q a 4-bit index into the non-linear table.
pub(super) const IQ4_NL: u8 = 5;

/// Bytes per block of format `F`.
const fn block_bytes(f: u8) -> usize {
    match f {
        Q4_0 | IQ4_NL => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        _ => 34,
    }
}

/// Whether format `F` has a minimum (`m·Σy` is added per block, from the Q8_1 sums), which
/// also means its values are unsigned.
const fn has_min(f: u8) -> bool {
    matches!(f, Q4_1 | Q5_1)
}

/// The 32 fifth bits of a Q5 block (`qh`, bit `i` for element `i`) as 32 bytes, each `0xFF`
/// where the bit is set and `0` where not.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bits_to_bytes(qh: u32) -> __m256i {
    // Byte i of the result takes byte i / 8 of qh (shuffles stay within 128-bit halves, and
    // every 32-bit lane holds all four bytes of qh).
    let spread =
        _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0x0000_0000_0000_0000);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), spread);
    // Every bit but bit i % 8 set in byte i: all ones exactly when that bit was set.
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, others), _mm256_set1_epi8(-1))
}

/// The non-linear IQ4_NL/IQ4_XS table (ggml's `kvalues_iq4nl`) in both 128-bit halves, for
/// `_mm256_shuffle_epi8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn iq4_table() -> __m256i {
    let t = _mm_loadu_si128(crate::quant::KVALUES_IQ4NL.as_ptr() as *const __m128i);
    _mm256_set_m128i(t, t)
}

/// The f16 at `p` widened into all eight lanes. Broadcast before the conversion, so that
/// every lane of the load is used: converting one f16 for one lane lets the compiler load it
/// with a 16-bit insert into whatever register is free — often a live accumulator, which then
/// chains every block of a dot to the previous one's float additions (measured: Q8_0 4-token
/// tiles at 20 instead of 30 G multiply-adds/s).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_broadcast(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16((p as *const u16).read_unaligned() as i16))
}

/// Block `b` of format `F`: its 32 weights as bytes (signed, or unsigned ≤ 31 where
/// [`has_min`]), its scale `d` in every lane and its minimum `m` (0 where none).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block<const F: u8>(b: *const u8, table: __m256i) -> (__m256i, __m256, f32) {
    match F {
        Q4_0 => (_mm256_sub_epi8(nibbles(b.add(2)), _mm256_set1_epi8(8)), f16_broadcast(b), 0.0),
        Q4_1 => {
            let (d, m) = f16x2(b);
            (nibbles(b.add(4)), _mm256_set1_ps(d), m)
        }
        Q5_0 => {
            let qh = (b.add(2) as *const u32).read_unaligned();
            // q − 16 as a byte is `0xF0 | q` where the fifth bit is clear, `q` where it is set.
            let high = _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8(0xF0u8 as i8));
            (_mm256_or_si256(nibbles(b.add(6)), high), f16_broadcast(b), 0.0)
        }
        Q5_1 => {
            let (d, m) = f16x2(b);
            let qh = (b.add(4) as *const u32).read_unaligned();
            let high = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
            (_mm256_or_si256(nibbles(b.add(8)), high), _mm256_set1_ps(d), m)
        }
        IQ4_NL => (_mm256_shuffle_epi8(table, nibbles(b.add(2))), f16_broadcast(b), 0.0),
        _ => (_mm256_loadu_si256(b.add(2) as *const __m256i), f16_broadcast(b), 0.0),
    }
}

/// One token's running sum over the blocks of a row: eight f32 lanes of `d·Σ` and, for the
/// formats with a minimum, the scalar sum of `m·s`. Each block is added in the same steps
/// whichever kernel form does it, so every form gives the same bits for a row and token.
#[derive(Clone, Copy)]
struct Acc {
    lanes: __m256,
    mins: f32,
}

impl Acc {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn new() -> Self {
        Acc { lanes: _mm256_setzero_ps(), mins: 0.0 }
    }

    /// Adds block `ib` of weights `(qx, d, m)` against token `a`: `d·d_a` is one f32 product
    /// in every lane, the same value the `x86` kernels broadcast.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn add<const F: u8>(&mut self, qx: __m256i, d: __m256, m: f32, a: &ActRow, ib: usize) {
        let qy = _mm256_loadu_si256((a.qs.as_ptr() as *const u8).add(ib * 32) as *const __m256i);
        let dd = _mm256_mul_ps(d, _mm256_broadcast_ss(a.d.get_unchecked(ib)));
        let lanes = if has_min(F) {
            self.mins += m * *a.s.get_unchecked(ib);
            dot_u8_i8(qx, qy)
        } else {
            dot_i8(qx, qy)
        };
        self.lanes = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(lanes), self.lanes);
    }

    /// The row's dot product.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn total<const F: u8>(self) -> f32 {
        // No `+ 0.0` for the formats without a minimum: it would turn a −0 sum into +0 and
        // break bit equality with the `x86` single dots.
        if has_min(F) {
            hsum_ps(self.lanes) + self.mins
        } else {
            hsum_ps(self.lanes)
        }
    }
}

/// Checks (in debug builds) that `a` covers `nb` blocks of format `F`.
#[inline(always)]
fn check_act<const F: u8>(a: &ActRow, nb: usize) {
    debug_assert!(a.qs.len() >= nb * 32 && a.d.len() >= nb && (!has_min(F) || a.s.len() >= nb));
}

/// One row of format `F` against one token.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot<const F: u8>(w: &[u8], a: &ActRow) -> f32 {
    let bb = block_bytes(F);
    let nb = w.len() / bb;
    check_act::<F>(a, nb);
    let table = iq4_table();
    let mut acc = Acc::new();
    let wp = w.as_ptr();
    for ib in 0..nb {
        let b = wp.add(ib * bb);
        prefetch_ahead::<34>(b, 0);
        let (qx, d, m) = block::<F>(b, table);
        acc.add::<F>(qx, d, m, a, ib);
    }
    acc.total::<F>()
}

/// Four consecutive rows of format `F` (`w`, four rows' bytes) against one token: four
/// independent chains and memory streams, each row summed exactly as [`dot`] sums it.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows4<const F: u8>(w: &[u8], a: &ActRow) -> [f32; 4] {
    let bb = block_bytes(F);
    let rb = w.len() / 4;
    let nb = rb / bb;
    check_act::<F>(a, nb);
    let table = iq4_table();
    let mut acc = [Acc::new(); 4];
    let wp = w.as_ptr();
    for ib in 0..nb {
        // The four rows are contiguous: `4·bb` bytes of the group per step, `PREFETCH_AHEAD`
        // bytes ahead of where the group's stream is (as `x86`'s 4-row kernels do).
        let ahead = wp.wrapping_add(PREFETCH_AHEAD + ib * 4 * bb);
        let mut l = 0;
        while l < 4 * bb {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(l) as *const i8);
            l += 64;
        }
        for (k, acc) in acc.iter_mut().enumerate() {
            let b = wp.add(k * rb + ib * bb);
            let (qx, d, m) = block::<F>(b, table);
            acc.add::<F>(qx, d, m, a, ib);
        }
    }
    acc.map(|acc| acc.total::<F>())
}

/// One row of format `F` against four tokens: each block unpacked once for all four, each
/// token summed exactly as [`dot`] sums it.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_x4<const F: u8>(w: &[u8], a: &[ActRow; 4]) -> [f32; 4] {
    let bb = block_bytes(F);
    let nb = w.len() / bb;
    for r in a {
        check_act::<F>(r, nb);
    }
    let table = iq4_table();
    let mut acc = [Acc::new(); 4];
    let wp = w.as_ptr();
    for ib in 0..nb {
        let (qx, d, m) = block::<F>(wp.add(ib * bb), table);
        for (acc, r) in acc.iter_mut().zip(a) {
            acc.add::<F>(qx, d, m, r, ib);
        }
    }
    acc.map(|acc| acc.total::<F>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::{dot_magnitude, random_blocks};
    use crate::quant::{dot_reference, QuantType, QuantizedActs};
    use crate::test_support::report_skip;

    fn avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }

    type Forms = (unsafe fn(&[u8], &ActRow) -> f32, unsafe fn(&[u8], &ActRow) -> [f32; 4], Dot4);
    type Dot4 = unsafe fn(&[u8], &[ActRow; 4]) -> [f32; 4];

    fn forms(ty: QuantType) -> Forms {
        match ty {
            QuantType::Q4_0 => (dot::<Q4_0>, dot_rows4::<Q4_0>, dot_x4::<Q4_0>),
            QuantType::Q4_1 => (dot::<Q4_1>, dot_rows4::<Q4_1>, dot_x4::<Q4_1>),
            QuantType::Q5_0 => (dot::<Q5_0>, dot_rows4::<Q5_0>, dot_x4::<Q5_0>),
            QuantType::Q5_1 => (dot::<Q5_1>, dot_rows4::<Q5_1>, dot_x4::<Q5_1>),
            QuantType::Q8_0 => (dot::<Q8_0>, dot_rows4::<Q8_0>, dot_x4::<Q8_0>),
            QuantType::IQ4_NL => (dot::<IQ4_NL>, dot_rows4::<IQ4_NL>, dot_x4::<IQ4_NL>),
            _ => unreachable!(),
        }
    }

    /// The single dot of every 32-element format equals the scalar reference (exact integer
    /// sums, so the only difference is the order of the f32 additions); the 4-row and 4-token
    /// forms give, bit for bit, the single dot of each row and token; and for the formats that
    /// also have a single dot in `x86` (the one a matmul dispatches), the two agree to the bit.
    #[test]
    fn every_form_of_every_block32_format_equals_the_reference() {
        if !avx2() {
            report_skip("avx2+fma+f16c", "quant::x86_legacy block-32 dots");
            return;
        }
        for (cols, seed) in [(32usize, 1u64), (96, 2), (1024, 3)] {
            let x: Vec<f32> = (0..4 * cols)
                .map(|i| {
                    let v = ((i * 7919 + seed as usize * 13) % 1013) as f32 / 37.0 - 13.7;
                    // Tokens of very different magnitudes, and a large outlier now and then.
                    v * if (i / cols).is_multiple_of(2) { 1.0 } else { 1e-3 } * if i % 97 == 0 { 50.0 } else { 1.0 }
                })
                .collect();
            for ty in
                [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_0, QuantType::Q5_1, QuantType::Q8_0, QuantType::IQ4_NL]
            {
                let (single, rows4, x4) = forms(ty);
                let acts = QuantizedActs::new(ty.act_format(), &x, 4);
                let toks = [acts.row(0), acts.row(1), acts.row(2), acts.row(3)];
                let w = random_blocks(ty, 4 * cols / 32, seed);
                let rb = w.len() / 4;
                let row0 = &w[..rb];
                let dispatched = crate::quant::dot_kernel(ty);
                // SAFETY (all calls): AVX2, FMA and F16C were detected above.
                for t in &toks {
                    for row in w.chunks_exact(rb) {
                        let (want, got) = (dot_reference(ty, row, t), unsafe { single(row, t) });
                        let tol = 1e-5 * dot_magnitude(ty, row, t);
                        assert!(
                            (got - want).abs() <= tol,
                            "{ty} cols={cols}: {got} vs reference {want} (tolerance {tol})"
                        );
                        assert_eq!(dispatched(row, t).to_bits(), got.to_bits(), "{ty}: dispatched single dot");
                    }
                    let want: Vec<u32> = w.chunks_exact(rb).map(|row| unsafe { single(row, t) }.to_bits()).collect();
                    assert_eq!(unsafe { rows4(&w, t) }.map(f32::to_bits).to_vec(), want, "{ty} rows4 cols={cols}");
                }
                let want: Vec<u32> = toks.iter().map(|t| unsafe { single(row0, t) }.to_bits()).collect();
                assert_eq!(unsafe { x4(row0, &toks) }.map(f32::to_bits).to_vec(), want, "{ty} x4 cols={cols}");
            }
        }
    }

    /// The fifth bits land on the right elements: a Q5_0 block whose nibbles are all zero and
    /// whose high bits are one pattern gives exactly the values the pattern says.
    #[test]
    fn q5_high_bits_go_to_their_own_elements() {
        if !avx2() {
            report_skip("avx2+fma+f16c", "quant::x86_legacy Q5 high bits");
            return;
        }
        for qh in [1u32, 0x8000_0000, 0x0001_0000, 0xA5A5_0F0F, u32::MAX] {
            // SAFETY: detected above.
            let bytes: [u8; 32] = unsafe { std::mem::transmute(bits_to_bytes(qh)) };
            for (i, b) in bytes.iter().enumerate() {
                assert_eq!(*b == 0xFF, qh >> i & 1 == 1, "qh {qh:#x} element {i}");
                assert!(*b == 0 || *b == 0xFF);
            }
        }
    }
}
