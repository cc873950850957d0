//! Dense weight × activation products for f32 and bf16 weights: `out[i·t + j] = W[i] · x[j]`
//! for `rows` weight rows and `t` activation rows, the weight kept in its stored form and
//! widened in registers. Tiles of 4 weight rows × 4 tokens (AVX-512) or 4 × 2 (AVX2+FMA)
//! reuse every loaded vector several times; decode (t = 1) streams the weight once.
//! [`gemm_reference`] is the plain version the tests hold the fast ones to.

/// Weight rows as stored (little-endian bytes, `rows × cols` elements, any alignment).
#[derive(Clone, Copy, Debug)]
pub enum Rows<'a> {
    /// f32 elements.
    F32(&'a [u8]),
    /// bf16 elements.
    BF16(&'a [u8]),
}

impl Rows<'_> {
    fn elem(&self) -> usize {
        match self {
            Rows::F32(_) => 4,
            Rows::BF16(_) => 2,
        }
    }
    fn bytes(&self) -> &[u8] {
        match self {
            Rows::F32(b) | Rows::BF16(b) => b,
        }
    }
    #[inline]
    fn get(&self, i: usize) -> f32 {
        match self {
            Rows::F32(b) => f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]),
            Rows::BF16(b) => f32::from_bits((u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32) << 16),
        }
    }
}

/// `out[i * t + j] = Σ_k W[i, k] · x[j, k]` (`x` is `[t, cols]`, `out` is `[rows, t]`).
pub fn gemm(w: Rows, rows: usize, cols: usize, x: &[f32], t: usize, out: &mut [f32]) {
    assert!(w.bytes().len() >= rows * cols * w.elem() && x.len() >= t * cols && out.len() >= rows * t);
    #[cfg(target_arch = "x86_64")]
    {
        if matches!(w, Rows::BF16(_))
            && std::arch::is_x86_feature_detected!("avx512bf16")
            && std::arch::is_x86_feature_detected!("avx512f")
        {
            // bf16 × bf16 pairs with f32 accumulation (as llama.cpp's BF16 path and torch's
            // bf16 matmul do): activations are rounded to bf16 once, which for a bf16 model
            // changes nothing (its activations already are bf16 values).
            let xb: Vec<u16> = x[..t * cols].iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
            // SAFETY: the features are present; bounds were checked above.
            unsafe { x86::gemm_avx512_bf16(w.bytes(), rows, cols, &xb, t, out) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature is present; bounds were checked above.
            unsafe { x86::gemm_avx512(w, rows, cols, x, t, out) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: as above.
            unsafe { x86::gemm_avx2(w, rows, cols, x, t, out) };
            return;
        }
    }
    gemm_reference(w, rows, cols, x, t, out);
}

/// The plain version: one dot product per output.
pub fn gemm_reference(w: Rows, rows: usize, cols: usize, x: &[f32], t: usize, out: &mut [f32]) {
    let mut row = vec![0.0f32; cols];
    for i in 0..rows {
        for (k, v) in row.iter_mut().enumerate() {
            *v = w.get(i * cols + k);
        }
        for j in 0..t {
            out[i * t + j] = dot(&row, &x[j * cols..(j + 1) * cols]);
        }
    }
}

/// Dot product with eight independent accumulators so the compiler can vectorise it.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Rows;
    use std::arch::x86_64::*;

    /// Loads 16 weights at element `k` of the row starting at byte `p` as f32.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16<const BF16: bool>(p: *const u8, k: usize) -> __m512 {
        if BF16 {
            let h = _mm256_loadu_si256(p.add(2 * k) as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        } else {
            _mm512_loadu_ps(p.add(4 * k) as *const f32)
        }
    }

    /// One tile of R weight rows × N tokens.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile512<const R: usize, const N: usize, const BF16: bool>(
        w: &Rows,
        r0: usize,
        j0: usize,
        cols: usize,
        x: &[f32],
        t: usize,
        out: &mut [f32],
    ) {
        let base = w.bytes().as_ptr();
        let el = w.elem();
        let mut wp = [base; R];
        for (i, p) in wp.iter_mut().enumerate() {
            *p = base.add((r0 + i) * cols * el);
        }
        let mut xp = [x.as_ptr(); N];
        for (j, p) in xp.iter_mut().enumerate() {
            *p = x.as_ptr().add((j0 + j) * cols);
        }
        let mut acc = [[_mm512_setzero_ps(); N]; R];
        let main = cols / 16 * 16;
        let mut k = 0;
        while k < main {
            let mut xv = [_mm512_setzero_ps(); N];
            for j in 0..N {
                xv[j] = _mm512_loadu_ps(xp[j].add(k));
            }
            for i in 0..R {
                let wv = load16::<BF16>(wp[i], k);
                for j in 0..N {
                    acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);
                }
            }
            k += 16;
        }
        for i in 0..R {
            for j in 0..N {
                let mut s = _mm512_reduce_add_ps(acc[i][j]);
                for kk in main..cols {
                    s += w.get((r0 + i) * cols + kk) * *xp[j].add(kk);
                }
                out[(r0 + i) * t + j0 + j] = s;
            }
        }
    }

    /// Token tiles outside, row tiles inside: the few activation rows of a tile stay in L1
    /// while the block's weight rows (a few hundred KB at most) stay in L2.
    #[target_feature(enable = "avx512f")]
    unsafe fn run512<const BF16: bool>(w: Rows, rows: usize, cols: usize, x: &[f32], t: usize, out: &mut [f32]) {
        let full = rows / 4 * 4;
        let mut j = 0;
        while j < t {
            let n = if t - j >= 4 { 4 } else { 1 };
            let mut r = 0;
            while r < full {
                if n == 4 {
                    tile512::<4, 4, BF16>(&w, r, j, cols, x, t, out);
                } else {
                    tile512::<4, 1, BF16>(&w, r, j, cols, x, t, out);
                }
                r += 4;
            }
            for r in full..rows {
                for jj in j..j + n {
                    tile512::<1, 1, BF16>(&w, r, jj, cols, x, t, out);
                }
            }
            j += n;
        }
    }

    /// AVX-512 entry point.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn gemm_avx512(w: Rows, rows: usize, cols: usize, x: &[f32], t: usize, out: &mut [f32]) {
        match w {
            Rows::F32(_) => run512::<false>(w, rows, cols, x, t, out),
            Rows::BF16(_) => run512::<true>(w, rows, cols, x, t, out),
        }
    }

    /// One tile of R weight rows × N tokens, both bf16, 32 elements per step.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn tile_bf16<const R: usize, const N: usize>(
        w: &[u8],
        r0: usize,
        j0: usize,
        cols: usize,
        x: &[u16],
        t: usize,
        out: &mut [f32],
    ) {
        let mut wp = [w.as_ptr(); R];
        for (i, p) in wp.iter_mut().enumerate() {
            *p = w.as_ptr().add((r0 + i) * cols * 2);
        }
        let mut xp = [x.as_ptr(); N];
        for (j, p) in xp.iter_mut().enumerate() {
            *p = x.as_ptr().add((j0 + j) * cols);
        }
        let mut acc = [[_mm512_setzero_ps(); N]; R];
        let main = cols / 32 * 32;
        let mut k = 0;
        while k < main {
            let mut xv = [_mm512_setzero_si512(); N];
            for j in 0..N {
                xv[j] = _mm512_loadu_si512(xp[j].add(k) as *const __m512i);
            }
            for i in 0..R {
                let wv: __m512bh = std::mem::transmute(_mm512_loadu_si512(wp[i].add(2 * k) as *const __m512i));
                for j in 0..N {
                    acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv, std::mem::transmute::<__m512i, __m512bh>(xv[j]));
                }
            }
            k += 32;
        }
        for i in 0..R {
            for j in 0..N {
                let mut s = _mm512_reduce_add_ps(acc[i][j]);
                for kk in main..cols {
                    let wb = u16::from_le_bytes([*wp[i].add(2 * kk), *wp[i].add(2 * kk + 1)]);
                    s += f32::from_bits((wb as u32) << 16) * f32::from_bits((*xp[j].add(kk) as u32) << 16);
                }
                out[(r0 + i) * t + j0 + j] = s;
            }
        }
    }

    /// AVX-512 BF16 entry point: `x` already rounded to bf16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn gemm_avx512_bf16(w: &[u8], rows: usize, cols: usize, x: &[u16], t: usize, out: &mut [f32]) {
        let full = rows / 4 * 4;
        let mut j = 0;
        while j < t {
            let n = if t - j >= 4 { 4 } else { 1 };
            let mut r = 0;
            while r < full {
                if n == 4 {
                    tile_bf16::<4, 4>(w, r, j, cols, x, t, out);
                } else {
                    tile_bf16::<4, 1>(w, r, j, cols, x, t, out);
                }
                r += 4;
            }
            for r in full..rows {
                for jj in j..j + n {
                    tile_bf16::<1, 1>(w, r, jj, cols, x, t, out);
                }
            }
            j += n;
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load8<const BF16: bool>(p: *const u8, k: usize) -> __m256 {
        if BF16 {
            let h = _mm_loadu_si128(p.add(2 * k) as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        } else {
            _mm256_loadu_ps(p.add(4 * k) as *const f32)
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile256<const R: usize, const N: usize, const BF16: bool>(
        w: &Rows,
        r0: usize,
        j0: usize,
        cols: usize,
        x: &[f32],
        t: usize,
        out: &mut [f32],
    ) {
        let base = w.bytes().as_ptr();
        let el = w.elem();
        let mut wp = [base; R];
        for (i, p) in wp.iter_mut().enumerate() {
            *p = base.add((r0 + i) * cols * el);
        }
        let mut xp = [x.as_ptr(); N];
        for (j, p) in xp.iter_mut().enumerate() {
            *p = x.as_ptr().add((j0 + j) * cols);
        }
        let mut acc = [[_mm256_setzero_ps(); N]; R];
        let main = cols / 8 * 8;
        let mut k = 0;
        while k < main {
            let mut xv = [_mm256_setzero_ps(); N];
            for j in 0..N {
                xv[j] = _mm256_loadu_ps(xp[j].add(k));
            }
            for i in 0..R {
                let wv = load8::<BF16>(wp[i], k);
                for j in 0..N {
                    acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
                }
            }
            k += 8;
        }
        for i in 0..R {
            for j in 0..N {
                let mut s = hsum256(acc[i][j]);
                for kk in main..cols {
                    s += w.get((r0 + i) * cols + kk) * *xp[j].add(kk);
                }
                out[(r0 + i) * t + j0 + j] = s;
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn run256<const BF16: bool>(w: Rows, rows: usize, cols: usize, x: &[f32], t: usize, out: &mut [f32]) {
        let full = rows / 4 * 4;
        let mut j = 0;
        while j < t {
            let n = if t - j >= 2 { 2 } else { 1 };
            let mut r = 0;
            while r < full {
                if n == 2 {
                    tile256::<4, 2, BF16>(&w, r, j, cols, x, t, out);
                } else {
                    tile256::<4, 1, BF16>(&w, r, j, cols, x, t, out);
                }
                r += 4;
            }
            for r in full..rows {
                for jj in j..j + n {
                    tile256::<1, 1, BF16>(&w, r, jj, cols, x, t, out);
                }
            }
            j += n;
        }
    }

    /// AVX2 + FMA entry point.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn gemm_avx2(w: Rows, rows: usize, cols: usize, x: &[f32], t: usize, out: &mut [f32]) {
        match w {
            Rows::F32(_) => run256::<false>(w, rows, cols, x, t, out),
            Rows::BF16(_) => run256::<true>(w, rows, cols, x, t, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(rows: usize, cols: usize, t: usize, bf16: bool) {
        let wf: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 997) as f32 / 500.0) - 1.0).collect();
        let bytes: Vec<u8> = if bf16 {
            wf.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect()
        } else {
            wf.iter().flat_map(|v| v.to_le_bytes()).collect()
        };
        // An odd offset checks unaligned weights (memory maps give no alignment promise).
        let mut shifted = vec![0u8; 1];
        shifted.extend_from_slice(&bytes);
        let w = if bf16 { Rows::BF16(&shifted[1..]) } else { Rows::F32(&shifted[1..]) };
        // Activations that are bf16 values (as in a bf16 model), so every kernel sees the same
        // inputs.
        let x: Vec<f32> =
            (0..t * cols).map(|i| half::bf16::from_f32(((i * 31 % 101) as f32 / 50.0) - 1.0).to_f32()).collect();
        let mut slow = vec![0.0; rows * t];
        gemm_reference(w, rows, cols, &x, t, &mut slow);
        for (path, fast) in compiled_paths(w, rows, cols, &x, t) {
            for (a, b) in fast.iter().zip(&slow) {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{path} {rows}x{cols} t={t} bf16={bf16}: {a} vs {b}");
            }
        }
    }

    /// The output of the dispatched [`gemm`] and of every x86 kernel this CPU can run (not only
    /// the one `gemm` picks, so that a CPU with AVX-512 checks the AVX2 kernel too), each named.
    fn compiled_paths(w: Rows, rows: usize, cols: usize, x: &[f32], t: usize) -> Vec<(&'static str, Vec<f32>)> {
        let mut out = vec![("dispatched", vec![0.0; rows * t])];
        gemm(w, rows, cols, x, t, &mut out[0].1);
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let mut run = |name, f: &dyn Fn(&mut [f32])| {
                let mut y = vec![0.0; rows * t];
                f(&mut y);
                out.push((name, y));
            };
            if has!("avx2") && has!("fma") {
                // SAFETY: detected just above; `case` sizes the buffers as `gemm` requires.
                run("avx2", &|y| unsafe { x86::gemm_avx2(w, rows, cols, x, t, y) });
            }
            if has!("avx512f") {
                // SAFETY: as above.
                run("avx512", &|y| unsafe { x86::gemm_avx512(w, rows, cols, x, t, y) });
            }
            if let Rows::BF16(b) = w {
                if has!("avx512bf16") && has!("avx512f") {
                    let xb: Vec<u16> = x[..t * cols].iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
                    // SAFETY: as above.
                    run("avx512bf16", &|y| unsafe { x86::gemm_avx512_bf16(b, rows, cols, &xb, t, y) });
                }
            }
        }
        out
    }

    #[test]
    fn fast_kernels_equal_the_reference_on_ragged_shapes() {
        #[cfg(target_arch = "x86_64")]
        {
            use crate::test_support::report_skip;
            use std::arch::is_x86_feature_detected as has;
            if !(has!("avx2") && has!("fma")) {
                report_skip("avx2+fma", "kernels::gemm AVX2 kernel");
            }
            if !has!("avx512f") {
                report_skip("avx512f", "kernels::gemm AVX-512 kernel");
            }
            if !(has!("avx512bf16") && has!("avx512f")) {
                report_skip("avx512bf16", "kernels::gemm AVX-512 BF16 kernel");
            }
        }
        for bf16 in [false, true] {
            for (rows, cols, t) in
                [(1, 1, 1), (4, 16, 4), (7, 37, 5), (9, 64, 1), (13, 200, 9), (5, 8, 2), (8, 96, 6), (4, 33, 4)]
            {
                case(rows, cols, t, bf16);
            }
        }
    }
}
