//! Weight matrices as they lie in the file (memory-mapped, never copied) and the one
//! operation the model needs from them: `y = x · Wᵀ` for a batch of rows of `x`.
//!
//! Activations are always `f32`. Weights keep their stored dtype and are widened row by row
//! inside the kernel, so a bf16 checkpoint costs its file size in memory, not twice that.

use std::sync::Arc;

use half::{bf16, f16};
use rayon::prelude::*;

use crate::kernels::gemm::{gemm, Rows};

use crate::quant::QuantType;

/// Storage type of a weight matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (the upper half of an f32).
    BF16,
    /// A ggml block-quantized format (GGUF files, `--quant`).
    Quant(QuantType),
}

impl DType {
    /// Bytes of one storage unit: an element for the float types, a block for quantized ones
    /// (see [`DType::block_size`]).
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Quant(q) => q.block_bytes(),
        }
    }

    /// Elements per storage unit (1 for the float types).
    pub fn block_size(self) -> usize {
        match self {
            DType::Quant(q) => q.block_size(),
            _ => 1,
        }
    }

    /// Bytes of `n` consecutive elements, or `None` when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_size()).then(|| n / self.block_size() * self.size())
    }

    /// Display name (`F32`, `BF16`, `Q4_K`, …).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Quant(q) => q.name(),
        }
    }
}

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
    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Decode a little-endian buffer of `dtype` into f32 values.
pub fn to_f32_vec(bytes: &[u8], dtype: DType) -> Vec<f32> {
    let mut out = vec![0.0; bytes.len() / dtype.size() * dtype.block_size()];
    widen(bytes, dtype, &mut out);
    out
}

/// Widen `out.len()` elements of `dtype` from `bytes` into `out`.
fn widen(bytes: &[u8], dtype: DType, out: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
            }
        }
        DType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        DType::Quant(q) => crate::quant::dequantize(q, bytes, out),
    }
}

/// Round an f32 to the nearest bf16 and back (what a bf16 model stores between ops).
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// Round an f32 to the nearest f16 and back.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
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
    /// The same Q4_K weights repacked for the eight-row kernel ([`crate::quant::q4k_x8`]),
    /// when [`Matrix::pack_for_matmul`] made them; matmuls then read only these.
    packed: Option<Arc<Vec<u8>>>,
    /// `bytes` was an owned buffer and was dropped once packed: rows come from `packed`.
    only_packed: bool,
}

impl Matrix {
    /// A matrix over `bytes` (which must hold exactly `rows * cols` elements of `dtype`,
    /// `cols` a whole number of blocks).
    pub fn new(rows: usize, cols: usize, dtype: DType, bytes: Bytes) -> Self {
        let row = dtype.row_bytes(cols).expect("matrix width is a whole number of blocks");
        assert_eq!(bytes.len(), rows * row, "matrix byte length");
        Matrix { rows, cols, dtype, bytes, packed: None, only_packed: false }
    }

    /// Repacks a Q4_K matrix for the eight-row AVX-512 VNNI kernel when this CPU has it and
    /// the rows come in eights (a one-time copy of the weights, made at load); anything else
    /// is left as it is. Results stay within the Q4_K dot's rounding, and one token and a
    /// tile of tokens keep giving the same bits. `FROGNANO_PLAIN_KERNELS=1` skips it.
    pub fn pack_for_matmul(&mut self) {
        use crate::quant::{q4k_x8, QuantType};
        if self.dtype == DType::Quant(QuantType::Q4_K)
            && self.packed.is_none()
            && self.rows.is_multiple_of(q4k_x8::GROUP)
            && q4k_x8::available()
            && !crate::kernels::plain_kernels()
        {
            self.packed = Some(Arc::new(q4k_x8::pack(self.bytes.as_slice(), self.rows, self.cols)));
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

    fn quant_mat(&self, ty: crate::quant::QuantType) -> crate::quant::QuantMat<'_> {
        debug_assert!(!self.only_packed || self.packed.is_some());
        crate::quant::QuantMat {
            ty,
            w: self.bytes.as_slice(),
            rows: self.rows,
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
        Matrix::new(self.rows, self.cols, DType::Quant(q), Bytes::from_vec(bytes))
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
            let gb = p.len() / (self.rows / crate::quant::q4k_x8::GROUP);
            let g = r / crate::quant::q4k_x8::GROUP;
            return crate::quant::q4k_x8::dequantize_row(
                &p[g * gb..(g + 1) * gb],
                r % crate::quant::q4k_x8::GROUP,
                out,
            );
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
    /// ([`crate::quant::matmul_many`]). Returns one `[t, rows]` product per matrix.
    pub fn matmul_many(ms: &[&Matrix], x: &[f32], t: usize) -> Vec<Vec<f32>> {
        let quant: Option<Vec<crate::quant::QuantMat>> = ms
            .iter()
            .map(|m| match m.dtype {
                DType::Quant(ty) if m.cols == ms[0].cols => Some(m.quant_mat(ty)),
                _ => None,
            })
            .collect();
        match quant {
            Some(qm) if !ms.is_empty() => crate::quant::matmul_many(&qm, ms[0].cols, x, t),
            _ => ms.iter().map(|m| m.matmul(x, t)).collect(),
        }
    }

    /// `y[t, r] = Σ_k x[t, k] · W[r, k]` for `t` rows of `x` (`x.len() == t * cols`);
    /// returns `y` as `[t, rows]`.
    pub fn matmul(&self, x: &[f32], t: usize) -> Vec<f32> {
        let (rows, cols) = (self.rows, self.cols);
        assert_eq!(x.len(), t * cols, "matmul input length");
        if let DType::Quant(q) = self.dtype {
            return crate::quant::matmul_many(&[self.quant_mat(q)], cols, x, t).pop().expect("one product");
        }
        // Work in [rows, t] so each task owns a contiguous slice, then transpose. Enough
        // blocks for every thread several times over; at most 64 rows so a block's weights
        // stay in L2 while the activations stream past.
        let mut yt = vec![0.0f32; rows * t];
        let threads = rayon::current_num_threads().max(1);
        let block = (rows / (4 * threads)).clamp(4, 64) / 4 * 4;
        let row_bytes = cols * self.dtype.size();
        let bytes = self.bytes.as_slice();
        yt.par_chunks_mut(block * t).enumerate().for_each(|(blk, out)| {
            let r0 = blk * block;
            let nr = out.len() / t;
            let wb = &bytes[r0 * row_bytes..(r0 + nr) * row_bytes];
            match self.dtype {
                DType::F32 => gemm(Rows::F32(wb), nr, cols, x, t, out),
                DType::BF16 => gemm(Rows::BF16(wb), nr, cols, x, t, out),
                _ => {
                    let mut wbuf = vec![0.0f32; nr * cols];
                    for i in 0..nr {
                        self.row_into(r0 + i, &mut wbuf[i * cols..(i + 1) * cols]);
                    }
                    for (tt, xr) in x.chunks_exact(cols).enumerate() {
                        for (i, wr) in wbuf.chunks_exact(cols).enumerate() {
                            out[i * t + tt] = dot(wr, xr);
                        }
                    }
                }
            }
        });
        if t == 1 {
            return yt;
        }
        let mut y = vec![0.0f32; rows * t];
        for r in 0..rows {
            for tt in 0..t {
                y[tt * rows + r] = yt[r * t + tt];
            }
        }
        y
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
