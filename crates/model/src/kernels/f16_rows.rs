//! f16 weight rows (GGUF `F16` matrices, often a tied embedding/output head) without a
//! widened copy: [`dot_row`] streams one row against one activation row for decode, and
//! [`widen`] converts rows for the prefill path, both with F16C on x86-64.
//!
//! Both give exactly the bits of the plain path they replace — widen each element with
//! `half`, then [`super::gemm::dot`] (eight lane sums of separate multiplies and adds, lanes
//! combined `((0+4)+(1+5))+((2+6)+(3+7))`, then the tail in order) — since an f16 → f32
//! conversion is exact and the vector code performs the same roundings in the same order.

use half::f16;

/// `Σ w[k]·x[k]` for a row `w` of little-endian f16 (`2·x.len()` bytes), in
/// [`super::gemm::dot`]'s order.
pub fn dot_row(w: &[u8], x: &[f32]) -> f32 {
    assert!(w.len() >= 2 * x.len(), "f16 row of {} bytes for {} activations", w.len(), x.len());
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: AVX and F16C were detected; the row covers `x` (asserted above).
        return unsafe { x86::dot_row(w, x) };
    }
    dot_row_plain(w, x)
}

/// [`dot_row`] of four rows (`w`, `4·2·x.len()` bytes, row after row) against one activation
/// row: four independent chains (one row's sum is a single chain of additions, whose latency
/// would otherwise bound the speed), each row's result bit-identical to [`dot_row`]'s.
pub fn dot_rows4(w: &[u8], x: &[f32]) -> [f32; 4] {
    let rb = 2 * x.len();
    assert!(w.len() >= 4 * rb, "four f16 rows of {} bytes for {} activations", w.len(), x.len());
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: as in `dot_row`; the four rows cover `x` (asserted above).
        return unsafe { x86::dot_rows4(w, x) };
    }
    std::array::from_fn(|k| dot_row_plain(&w[k * rb..(k + 1) * rb], x))
}

/// The plain version of [`dot_row`]: the row widened, then [`super::gemm::dot`].
pub fn dot_row_plain(w: &[u8], x: &[f32]) -> f32 {
    let mut row = vec![0.0f32; x.len()];
    widen_plain(&w[..2 * x.len()], &mut row);
    super::gemm::dot(&row, x)
}

/// Widens little-endian f16 from `bytes` to f32 into `out`, as many as both hold (the
/// shorter one decides, as a zip would).
pub fn widen(bytes: &[u8], out: &mut [f32]) {
    let n = out.len().min(bytes.len() / 2);
    let (bytes, out) = (&bytes[..2 * n], &mut out[..n]);
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: as in `dot_row`.
        return unsafe { x86::widen(bytes, out) };
    }
    widen_plain(bytes, out)
}

/// The plain version of [`widen`].
pub fn widen_plain(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Whether this CPU has AVX and F16C.
    pub(super) fn available() -> bool {
        is_x86_feature_detected!("avx") && is_x86_feature_detected!("f16c")
    }

    /// Eight f16 at byte `p` as f32.
    #[inline]
    #[target_feature(enable = "avx,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn dot_row(w: &[u8], x: &[f32]) -> f32 {
        let n = x.len();
        let body = n / 8 * 8;
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let mut acc = _mm256_setzero_ps();
        let mut k = 0;
        while k < body {
            // A separate multiply and add, as the plain dot does (no fused multiply-add).
            acc = _mm256_add_ps(acc, _mm256_mul_ps(load8(wp.add(2 * k)), _mm256_loadu_ps(xp.add(k))));
            k += 8;
        }
        // Lanes 0..4 plus lanes 4..8, then (0 + 1) + (2 + 3).
        let s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        let s: [f32; 4] = std::mem::transmute(s4);
        let mut sum = (s[0] + s[1]) + (s[2] + s[3]);
        for k in body..n {
            let h = half::f16::from_bits(u16::from_le_bytes([w[2 * k], w[2 * k + 1]]));
            sum += h.to_f32() * x[k];
        }
        sum
    }

    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn dot_rows4(w: &[u8], x: &[f32]) -> [f32; 4] {
        let n = x.len();
        let body = n / 8 * 8;
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut k = 0;
        while k < body {
            if k % 32 == 0 {
                // Each row is its own stream: one cache line of each, a page ahead (the
                // hardware prefetchers stop at page boundaries; see `quant::x86`).
                for r in 0..4 {
                    _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(2 * (r * n + k) + 4096) as *const i8);
                }
            }
            let xv = _mm256_loadu_ps(xp.add(k));
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_add_ps(*a, _mm256_mul_ps(load8(wp.add(2 * (r * n + k))), xv));
            }
            k += 8;
        }
        std::array::from_fn(|r| {
            let s4 = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
            let s: [f32; 4] = std::mem::transmute(s4);
            let mut sum = (s[0] + s[1]) + (s[2] + s[3]);
            let row = &w[2 * r * n..2 * (r + 1) * n];
            for k in body..n {
                let h = half::f16::from_bits(u16::from_le_bytes([row[2 * k], row[2 * k + 1]]));
                sum += h.to_f32() * x[k];
            }
            sum
        })
    }

    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn widen(bytes: &[u8], out: &mut [f32]) {
        let n = out.len();
        let body = n / 8 * 8;
        let (bp, op) = (bytes.as_ptr(), out.as_mut_ptr());
        let mut k = 0;
        while k < body {
            _mm256_storeu_ps(op.add(k), load8(bp.add(2 * k)));
            k += 8;
        }
        super::widen_plain(&bytes[2 * body..2 * n], &mut out[body..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: usize, seed: u32) -> (Vec<u8>, Vec<f32>) {
        let w: Vec<u8> = (0..n)
            .flat_map(|i| {
                // Values of very different magnitudes (and some subnormal f16), so that the
                // order of the additions shows in the bits.
                let v = (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0;
                let v = if i % 7 == 0 {
                    v * 3e4
                } else if i % 11 == 0 {
                    v * 1e-6
                } else {
                    v
                };
                f16::from_f32(v).to_le_bytes()
            })
            .collect();
        let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
        (w, x)
    }

    #[test]
    fn f16_row_dots_and_widening_give_the_plain_bits() {
        #[cfg(target_arch = "x86_64")]
        if !x86::available() {
            crate::test_support::report_skip("avx+f16c", "kernels::f16_rows F16C row dot and widening");
        }
        for (n, seed) in [(0usize, 1u32), (5, 2), (8, 3), (37, 4), (1536, 5), (2051, 6)] {
            let (w, x) = row(n, seed);
            assert_eq!(dot_row(&w, &x).to_bits(), dot_row_plain(&w, &x).to_bits(), "dot of {n}");
            let w4: Vec<u8> = (0..4).flat_map(|r| row(n, seed * 10 + r).0).collect();
            let want: Vec<u32> =
                w4.chunks_exact(2 * n.max(1)).take(4).map(|r| dot_row_plain(r, &x).to_bits()).collect();
            if n > 0 {
                assert_eq!(dot_rows4(&w4, &x).map(f32::to_bits).to_vec(), want, "4 rows of {n}");
            }
            let (mut fast, mut plain) = (vec![0.0f32; n], vec![0.0f32; n]);
            widen(&w, &mut fast);
            widen_plain(&w, &mut plain);
            assert_eq!(
                fast.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                plain.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "widen of {n}"
            );
        }
    }

    /// An f16 matrix gives a one-token input (streamed rows) exactly the bits it gives that
    /// token inside a batch (widened rows), so decode after prefill sees no drift.
    #[test]
    fn f16_matmul_of_one_token_equals_its_row_of_a_batch() {
        use crate::dtype::DType;
        use crate::tensor::{Bytes, Matrix};
        let (rows, cols, t) = (70, 1030, 3);
        let w: Vec<u8> = (0..rows).flat_map(|r| row(cols, r as u32).0).collect();
        let m = Matrix::new(rows, cols, DType::F16, Bytes::from_vec(w));
        let x: Vec<f32> = (0..t * cols).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 97.0).collect();
        let batch = m.matmul(&x, t);
        for tt in 0..t {
            let one = m.matmul(&x[tt * cols..(tt + 1) * cols], 1);
            let want: Vec<u32> = batch[tt * rows..(tt + 1) * rows].iter().map(|v| v.to_bits()).collect();
            assert_eq!(one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "token {tt}");
        }
    }
}
