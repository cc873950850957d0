//! Weight matrices as they lie in the file (memory-mapped, never copied) and the one
//! operation the model needs from them: `y = x · Wᵀ` for a batch of rows of `x`.
//!
//! Activations are always `f32`. Weights keep their stored dtype and are widened row by row
//! inside the kernel, so a bf16 checkpoint costs its file size in memory, not twice that.

use std::sync::Arc;

use rayon::prelude::*;

use crate::dtype::widen;
pub use crate::dtype::{to_f32_vec, DType};
use crate::kernels::gemm::dot;
use crate::kernels::matmul::{self, WeightRef};
pub use crate::kernels::{round_bf16, round_f16};
use crate::quant::QuantType;

/// Bytes shared with their owner (a memory map or an owned buffer).
#[derive(Clone)]
pub struct Bytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
    /// The owner again, when it is a read-only file map (see [`Bytes::release_pages`]).
    map: Option<Arc<memmap2::Mmap>>,
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({} bytes)", self.len)
    }
}

/// An owned `f32` buffer usable as [`Bytes`] (for weights made in memory or re-laid out).
struct OwnedF32(Vec<f32>);

impl AsRef<[u8]> for OwnedF32 {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: f32 has no padding and every bit pattern is a valid u8.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), self.0.len() * 4) }
    }
}

impl Bytes {
    /// A view of `owner[start..start + len]`; the caller checks the range.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, start: usize, len: usize) -> Self {
        assert!(start + len <= (*owner).as_ref().len());
        Bytes { owner, start, len, map: None }
    }
    /// A view of `map[start..start + len]` of a read-only file map; the caller checks the range.
    pub fn mapped(map: Arc<memmap2::Mmap>, start: usize, len: usize) -> Self {
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = map.clone();
        Bytes { map: Some(map), ..Bytes::new(owner, start, len) }
    }
    /// Whether these bytes are a view of a read-only file map.
    pub fn is_mapped(&self) -> bool {
        self.map.is_some()
    }
    /// Drops these bytes' pages from this process's memory when they come from a file map
    /// (after a copy of them was made: a re-quantized or repacked matrix), so the peak
    /// resident size does not hold both. Reading them again later faults them back in from
    /// the file; owned buffers are left alone.
    pub fn release_pages(&self) {
        if let Some(map) = &self.map {
            // SAFETY: the map is read-only and private; MADV_DONTNEED on it discards only this
            // process's page references, and any later read sees the file's bytes again.
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, self.start, self.len) };
        }
    }
    /// Bytes that own a copy of `v`.
    pub fn from_f32(v: Vec<f32>) -> Self {
        let len = v.len() * 4;
        Bytes { owner: Arc::new(OwnedF32(v)), start: 0, len, map: None }
    }
    /// Bytes that own `v`.
    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len();
        Bytes { owner: Arc::new(v), start: 0, len, map: None }
    }
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }
    /// Bytes `at..at + len` of these, sharing their owner (and file map); the caller checks
    /// the range.
    pub fn slice(&self, at: usize, len: usize) -> Self {
        assert!(at + len <= self.len, "slice {at}+{len} of {} bytes", self.len);
        Bytes { owner: self.owner.clone(), start: self.start + at, len, map: self.map.clone() }
    }
    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A 2-D weight `[rows, cols]` (PyTorch `[out, in]` layout), stored row-major.
#[derive(Debug, Clone)]
pub struct Matrix {
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Stored element type.
    pub dtype: DType,
    bytes: Bytes,
    /// The same weights repacked for an eight-row kernel ([`crate::quant::pack_rows8`]),
    /// when [`Matrix::pack_for_matmul`] made them; matmuls then read only these.
    packed: Option<Arc<Vec<u8>>>,
    /// `bytes` was an owned buffer and was dropped once packed: rows come from `packed`.
    only_packed: bool,
    /// A low-rank update added to every product ([`Matrix::set_low_rank`]).
    low_rank: Option<Arc<LowRank>>,
}

/// A low-rank update `scale · B·A` of a weight matrix, kept apart from the stored weights: a
/// LoRA adapter on a quantized model. Products then compute `x·(W + scale·B·A)ᵀ` at the speed
/// of `W` plus `t·rank·(rows + cols)` multiply-adds, and the weights stay as they were
/// quantized — a trainer's adapter is sampled from exactly as it is trained over the same
/// dequantized base, with no re-quantization of merged weights.
#[derive(Debug, Clone, PartialEq)]
pub struct LowRank {
    /// Rank `r`.
    pub rank: usize,
    /// `A`, `[r, cols]` row-major.
    pub a: Vec<f32>,
    /// `B`, `[rows, r]` row-major.
    pub b: Vec<f32>,
    /// The factor (`alpha / r` for LoRA).
    pub scale: f32,
}

impl LowRank {
    /// Adds `scale · (x·Aᵀ)·Bᵀ` to `y` (`[t, rows]`) for `x` (`[t, cols]`).
    fn add_to(&self, y: &mut [f32], x: &[f32], t: usize, rows: usize, cols: usize) {
        let r = self.rank;
        let mut u = vec![0.0f32; r];
        for tt in 0..t {
            let xt = &x[tt * cols..(tt + 1) * cols];
            for (k, uk) in u.iter_mut().enumerate() {
                *uk = self.scale * dot(&self.a[k * cols..(k + 1) * cols], xt);
            }
            for (row, out) in y[tt * rows..(tt + 1) * rows].iter_mut().enumerate() {
                *out += dot(&self.b[row * r..(row + 1) * r], &u);
            }
        }
    }
}

impl Matrix {
    /// A matrix over `bytes` (which must hold exactly `rows * cols` elements of `dtype`,
    /// `cols` a whole number of blocks).
    pub fn new(rows: usize, cols: usize, dtype: DType, bytes: Bytes) -> Self {
        let row = dtype.row_bytes(cols).expect("matrix width is a whole number of blocks");
        assert_eq!(bytes.len(), rows * row, "matrix byte length");
        Matrix { rows, cols, dtype, bytes, packed: None, only_packed: false, low_rank: None }
    }

    /// This matrix cut by rows into consecutive parts of `rows[i]` rows each (which must add
    /// up to all of them), each a view of the same bytes: a fused projection (Phi-3's
    /// `qkv_proj`) as its parts. Only for a matrix as loaded (not packed, no low-rank update).
    pub fn split_rows(&self, rows: &[usize]) -> Vec<Matrix> {
        assert!(self.packed.is_none() && self.low_rank.is_none(), "split_rows takes a matrix as loaded");
        assert_eq!(rows.iter().sum::<usize>(), self.rows, "the parts' rows add up to the matrix's");
        let row = self.dtype.row_bytes(self.cols).expect("matrix width is a whole number of blocks");
        let mut at = 0;
        rows.iter()
            .map(|&n| {
                let m = Matrix::new(n, self.cols, self.dtype, self.bytes.slice(at * row, n * row));
                at += n;
                m
            })
            .collect()
    }

    /// Adds (or with `None` removes) a low-rank update `scale · B·A` to every product of this
    /// matrix ([`LowRank`]); [`Matrix::to_f32`] and row lookups still give the stored weights.
    /// Errors when `A` is not `[rank, cols]` or `B` not `[rows, rank]`.
    pub fn set_low_rank(&mut self, update: Option<LowRank>) -> std::result::Result<(), String> {
        if let Some(u) = &update {
            if u.a.len() != u.rank * self.cols || u.b.len() != self.rows * u.rank {
                return Err(format!(
                    "low-rank update of a {}x{} matrix needs A {}x{} and B {}x{}; found {} and {} values",
                    self.rows,
                    self.cols,
                    u.rank,
                    self.cols,
                    self.rows,
                    u.rank,
                    u.a.len(),
                    u.b.len()
                ));
            }
        }
        self.low_rank = update.map(Arc::new);
        Ok(())
    }

    /// The low-rank update added to this matrix's products, if any.
    pub fn low_rank(&self) -> Option<&LowRank> {
        self.low_rank.as_deref()
    }

    /// Repacks a Q4_K or Q6_K matrix for its eight-row kernel when this CPU has one and the
    /// rows come in eights (a one-time copy of the weights, made at load); anything else is
    /// left as it is. Results stay within the row dot's rounding, and one token and a tile of
    /// tokens keep giving the same bits. `FROGNANO_PLAIN_KERNELS=1` skips it.
    pub fn pack_for_matmul(&mut self) {
        if self.packed.is_some() {
            return;
        }
        if let Some(p) = matmul::pack(self.dtype, self.bytes.as_slice(), self.rows, self.cols) {
            self.packed = Some(Arc::new(p));
            if self.bytes.is_mapped() {
                // Re-read from the file if a row is ever asked for (an embedding lookup).
                self.bytes.release_pages();
            } else {
                // An owned copy (`--quant`): rows are unpacked from the packed form on demand.
                self.bytes = Bytes::from_vec(Vec::new());
                self.only_packed = true;
            }
        }
    }

    /// This matrix as the kernels see it.
    pub fn weight_ref(&self) -> WeightRef<'_> {
        debug_assert!(!self.only_packed || self.packed.is_some());
        WeightRef {
            rows: self.rows,
            cols: self.cols,
            dtype: self.dtype,
            bytes: self.bytes.as_slice(),
            packed: self.packed.as_deref().map(Vec::as_slice),
        }
    }

    /// The stored bytes (row-major, `dtype` layout); empty for a matrix that
    /// [`Matrix::pack_for_matmul`] left in packed form only.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// This matrix quantized to `q` (Q8_0 or Q4_K), through f32. A matrix whose width is not
    /// a whole number of `q` blocks falls back to Q8_0 (32-wide blocks), as llama.cpp's
    /// quantizer does, and is returned unchanged when even that does not fit.
    pub fn quantized(&self, q: QuantType) -> Matrix {
        let q = if self.cols.is_multiple_of(q.block_size()) { q } else { QuantType::Q8_0 };
        if !self.cols.is_multiple_of(q.block_size()) || self.dtype == DType::Quant(q) {
            return self.clone();
        }
        // Rows quantize independently; a 4B model has ~1M of them, so spread them over the
        // threads (in order: the output is the rows' bytes concatenated).
        let row_bytes = q.row_bytes(self.cols).unwrap_or(0);
        let mut bytes = vec![0u8; self.rows * row_bytes];
        bytes.par_chunks_mut(row_bytes.max(1) * 64).enumerate().for_each(|(blk, out)| {
            let mut row = vec![0.0f32; self.cols];
            for (i, dst) in out.chunks_mut(row_bytes.max(1)).enumerate() {
                self.row_into(blk * 64 + i, &mut row);
                dst.copy_from_slice(&crate::quant::quantize::quantize(q, &row));
            }
        });
        self.bytes.release_pages();
        Matrix {
            low_rank: self.low_rank.clone(),
            ..Matrix::new(self.rows, self.cols, DType::Quant(q), Bytes::from_vec(bytes))
        }
    }

    /// An f32 matrix owning `data`.
    pub fn from_f32(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        Matrix::new(rows, cols, DType::F32, Bytes::from_f32(data))
    }

    /// Bytes held by this matrix.
    pub fn byte_len(&self) -> usize {
        self.bytes.len() + if self.only_packed { self.packed.as_ref().map_or(0, |p| p.len()) } else { 0 }
    }

    /// Row `r` widened to f32 into `out` (length `cols`).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        if let (true, Some(p)) = (self.only_packed, &self.packed) {
            return matmul::unpack_row(self.dtype, p, self.rows, r, out);
        }
        let w = self.dtype.row_bytes(self.cols).expect("checked in Matrix::new");
        widen(&self.bytes.as_slice()[r * w..(r + 1) * w], self.dtype, out);
    }

    /// Row `r` as a new f32 vector (embedding lookup).
    pub fn row(&self, r: usize) -> Vec<f32> {
        let mut v = vec![0.0; self.cols];
        self.row_into(r, &mut v);
        v
    }

    /// All of it as f32 (tests and small tensors).
    pub fn to_f32(&self) -> Vec<f32> {
        if self.only_packed {
            let mut out = vec![0.0; self.rows * self.cols];
            for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
                self.row_into(r, row);
            }
            return out;
        }
        to_f32_vec(self.bytes.as_slice(), self.dtype)
    }

    /// [`Matrix::matmul`] of one input with several matrices of the same width; block-quantized
    /// ones share one quantized copy of the input and one parallel dispatch
    /// ([`crate::kernels::matmul::matmul_many`]). Returns one `[t, rows]` product per matrix.
    pub fn matmul_many(ms: &[&Matrix], x: &[f32], t: usize) -> Vec<Vec<f32>> {
        let ws: Vec<WeightRef<'_>> = ms.iter().map(|m| m.weight_ref()).collect();
        let mut ys = matmul::matmul_many(&ws, x, t);
        for (m, y) in ms.iter().zip(ys.iter_mut()) {
            if let Some(u) = &m.low_rank {
                u.add_to(y, x, t, m.rows, m.cols);
            }
        }
        ys
    }

    /// `y[t, r] = Σ_k x[t, k] · W[r, k]` for `t` rows of `x` (`x.len() == t * cols`), plus the
    /// [`LowRank`] update when one is set;
    /// returns `y` as `[t, rows]`.
    pub fn matmul(&self, x: &[f32], t: usize) -> Vec<f32> {
        let mut y = matmul::matmul(&self.weight_ref(), x, t);
        if let Some(u) = &self.low_rank {
            u.add_to(&mut y, x, t, self.rows, self.cols);
        }
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn low_rank_update_adds_scale_b_a_to_every_product() {
        let (rows, cols, rank, t) = (24, 32, 3, 4);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 113) as f32 / 50.0 - 1.0).collect();
        let a: Vec<f32> = (0..rank * cols).map(|i| ((i * 13) % 7) as f32 / 7.0 - 0.5).collect();
        let b: Vec<f32> = (0..rows * rank).map(|i| ((i * 5) % 11) as f32 / 11.0 - 0.5).collect();
        let x: Vec<f32> = (0..t * cols).map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0).collect();
        let scale = 0.75;
        // The merged matrix W + scale·B·A, as f32.
        let mut merged = w.clone();
        for r in 0..rows {
            for c in 0..cols {
                merged[r * cols + c] += scale * (0..rank).map(|k| b[r * rank + k] * a[k * cols + c]).sum::<f32>();
            }
        }
        let want = Matrix::from_f32(rows, cols, merged).matmul(&x, t);
        for base in [
            Matrix::from_f32(rows, cols, w.clone()),
            Matrix::from_f32(rows, cols, w.clone()).quantized(QuantType::Q8_0),
        ] {
            let plain = base.matmul(&x, t);
            let mut m = base.clone();
            m.set_low_rank(Some(LowRank { rank, a: a.clone(), b: b.clone(), scale })).unwrap();
            let got = m.matmul(&x, t);
            let many = Matrix::matmul_many(&[&m, &base], &x, t);
            // The update is there (the base product differs), and it is the merged product's
            // up to the base's own quantization error.
            let err = |y: &[f32]| y.iter().zip(&want).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
            let base_err = plain.iter().zip(&base.matmul(&x, t)).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
            assert_eq!(base_err, 0.0);
            assert!(err(&plain) > 0.1, "the update is not negligible");
            assert!(err(&got) < 0.05, "{:?}: {}", base.dtype, err(&got));
            assert_eq!(many[0], got, "matmul_many adds it too");
            assert_eq!(many[1], plain, "and only to the matrix carrying it");
            // Quantizing keeps the update; the stored weights are untouched by it.
            assert_eq!(m.quantized(QuantType::Q8_0).low_rank(), m.low_rank());
            assert_eq!(m.to_f32(), base.to_f32());
        }
        let mut m = Matrix::from_f32(rows, cols, w);
        let e = m.set_low_rank(Some(LowRank { rank, a: vec![0.0; 5], b, scale })).unwrap_err();
        assert!(e.contains("needs A 3x32 and B 24x3; found 5 and 72 values"), "{e}");
    }

    #[test]
    fn matmul_matches_naive_for_every_dtype() {
        let (rows, cols, t) = (37, 29, 5);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 113) as f32 / 50.0 - 1.0).collect();
        let x: Vec<f32> = (0..t * cols).map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0).collect();
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let bytes: Vec<u8> = match dtype {
                DType::F32 => w.iter().flat_map(|v| v.to_le_bytes()).collect(),
                DType::BF16 => w.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect(),
                DType::F16 => w.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect(),
                DType::Quant(_) => unreachable!("only float types are listed"),
            };
            let m = Matrix::new(rows, cols, dtype, Bytes::from_vec(bytes));
            let wq = m.to_f32();
            let y = m.matmul(&x, t);
            for tt in 0..t {
                for r in 0..rows {
                    let want: f32 = (0..cols).map(|k| x[tt * cols + k] * wq[r * cols + k]).sum();
                    assert!((y[tt * rows + r] - want).abs() < 1e-4, "{dtype:?} t={tt} r={r}");
                }
            }
        }
    }

    #[test]
    fn packed_matmul_agrees_with_the_row_kernels_and_is_batch_invariant() {
        use crate::quant::tests::random_blocks;
        if crate::kernels::plain_kernels() {
            crate::test_support::report_skip(
                "FROGNANO_PLAIN_KERNELS unset",
                "tensor packed matmuls vs the row kernels",
            );
            return;
        }
        let (rows, cols, t) = (40, 512, 13);
        use QuantType::*;
        for ty in [Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL] {
            if !crate::quant::packs(ty, rows) {
                let why = match ty {
                    Q4_K | Q2_K | Q3_K | IQ4_XS => "avx2",
                    Q5_K | Q6_K => "avx2 and no avx512bw",
                    _ => "avx2 and no avx512vnni",
                };
                crate::test_support::report_skip(why, &format!("tensor packed {ty} matmul vs the row kernels"));
                continue;
            }
            let w = random_blocks(ty, rows * cols / ty.block_size(), 9);
            let plain = Matrix::new(rows, cols, DType::Quant(ty), Bytes::from_vec(w));
            let mut packed = plain.clone();
            packed.pack_for_matmul();
            // An owned matrix keeps only the packed copy, and still answers for its rows.
            assert!(packed.bytes().is_empty(), "{ty}");
            assert_eq!(packed.to_f32(), plain.to_f32(), "{ty}");
            assert_eq!(packed.row(17), plain.row(17), "{ty}");
            let x: Vec<f32> = (0..t * cols).map(|i| ((i * 31 % 97) as f32 - 48.0) / 13.0).collect();
            let (yp, yr) = (packed.matmul(&x, t), plain.matmul(&x, t));
            for (i, (a, b)) in yp.iter().zip(&yr).enumerate() {
                assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{ty} element {i}: packed {a} vs rows {b}");
            }
            // Prefill tiles (8 + 4 + 1 tokens here) and decode give the same bits per token.
            for tt in 0..t {
                let one = packed.matmul(&x[tt * cols..(tt + 1) * cols], 1);
                assert_eq!(&yp[tt * rows..(tt + 1) * rows], &one[..], "{ty} token {tt}");
            }
        }
    }
}
