//! The one dispatch point of `y = x · Wᵀ`: given a weight as stored (its dtype, bytes and any
//! packed copy) it picks the kernel — the ggml block-format kernels of [`crate::quant`] (SIMD
//! picked at run time, the eight-row Q4_K/Q6_K packings of [`crate::quant::q4k_x8`] and [`crate::quant::q6k_x8`]), the f32/bf16
//! tiles of [`super::gemm`], or for f16 a widen-and-dot ([`super::f16_rows`]: streamed rows for
//! one token). The tensor type above calls
//! only this; a GPU backend is one more arm here, chosen once per call and never per row.

use rayon::prelude::*;

use super::gemm::{dot, gemm, Rows};
use crate::dtype::{widen, DType};
use crate::quant::{self, QuantMat};

/// A weight matrix as the kernels see it: `[rows, cols]` of `dtype`, row-major in `bytes`,
/// and the packed copy [`pack`] made of it, if any (then the block kernels read only that).
#[derive(Debug, Clone, Copy)]
pub struct WeightRef<'a> {
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Stored element type.
    pub dtype: DType,
    /// The stored bytes (may be empty when `packed` holds the only copy).
    pub bytes: &'a [u8],
    /// The packed copy made by [`pack`].
    pub packed: Option<&'a [u8]>,
}

impl<'a> WeightRef<'a> {
    fn quant(&self) -> Option<QuantMat<'a>> {
        match self.dtype {
            DType::Quant(ty) => Some(QuantMat { ty, w: self.bytes, rows: self.rows, packed: self.packed }),
            _ => None,
        }
    }
}

/// `x · Wᵀ` of one input (`t` rows of `ws[0].cols`) with several weights of the same width.
/// Block-quantized weights share one quantized copy of the input and one parallel dispatch
/// ([`crate::quant::matmul_many`]); otherwise each weight runs on its own. Returns one
/// `[t, rows]` product per weight.
pub fn matmul_many(ws: &[WeightRef<'_>], x: &[f32], t: usize) -> Vec<Vec<f32>> {
    let quant: Option<Vec<QuantMat>> = ws.iter().map(|w| if w.cols == ws[0].cols { w.quant() } else { None }).collect();
    match quant {
        Some(qm) if !ws.is_empty() => quant::matmul_many(&qm, ws[0].cols, x, t),
        _ => ws.iter().map(|w| matmul(w, x, t)).collect(),
    }
}

/// `y[t, r] = Σ_k x[t, k] · W[r, k]` for `t` rows of `x` (`x.len() == t * cols`); returns `y`
/// as `[t, rows]`.
pub fn matmul(w: &WeightRef<'_>, x: &[f32], t: usize) -> Vec<f32> {
    let (rows, cols) = (w.rows, w.cols);
    assert_eq!(x.len(), t * cols, "matmul input length");
    if let Some(q) = w.quant() {
        return quant::matmul_many(&[q], cols, x, t).pop().expect("one product");
    }
    // Work in [rows, t] so each task owns a contiguous slice, then transpose. Enough blocks
    // for every thread several times over; at most 64 rows so a block's weights stay in L2
    // while the activations stream past.
    let mut yt = vec![0.0f32; rows * t];
    let threads = rayon::current_num_threads().max(1);
    let block = (rows / (4 * threads)).clamp(4, 64) / 4 * 4;
    let row_bytes = cols * w.dtype.size();
    let bytes = w.bytes;
    yt.par_chunks_mut(block * t).enumerate().for_each(|(blk, out)| {
        let r0 = blk * block;
        let nr = out.len() / t;
        let wb = &bytes[r0 * row_bytes..(r0 + nr) * row_bytes];
        match w.dtype {
            DType::F32 => gemm(Rows::F32(wb), nr, cols, x, t, out),
            DType::BF16 => gemm(Rows::BF16(wb), nr, cols, x, t, out),
            // One token: stream the f16 rows against it, four at a time (no widened copy);
            // same bits as the widen-and-dot below.
            DType::F16 if t == 1 => {
                let mut i = 0;
                while i + 4 <= nr {
                    out[i..i + 4].copy_from_slice(&super::f16_rows::dot_rows4(&wb[i * row_bytes..], x));
                    i += 4;
                }
                for (i, o) in out.iter_mut().enumerate().skip(i) {
                    *o = super::f16_rows::dot_row(&wb[i * row_bytes..(i + 1) * row_bytes], x);
                }
            }
            _ => {
                let mut wbuf = vec![0.0f32; nr * cols];
                for (i, dst) in wbuf.chunks_exact_mut(cols).enumerate() {
                    widen(&wb[i * row_bytes..(i + 1) * row_bytes], w.dtype, dst);
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

/// The packed copy of a weight the fastest kernel on this CPU wants, made once at load: the
/// eight-row layouts of [`quant::pack_rows8`] (every GGUF quant type on AVX2; docs/model.md §2.3
/// says which an AVX-512 CPU keeps row kernels for) for matrices whose rows come in eights. `None` when the weight is best read as stored (or
/// `FROGNANO_PLAIN_KERNELS=1`).
pub fn pack(dtype: DType, bytes: &[u8], rows: usize, cols: usize) -> Option<Vec<u8>> {
    match dtype {
        DType::Quant(ty) if !super::plain_kernels() => quant::pack_rows8(ty, bytes, rows, cols),
        _ => None,
    }
}

/// Row `r` (of `rows`) of a weight kept only in [`pack`]ed form, widened to f32 into `out`.
pub fn unpack_row(dtype: DType, packed: &[u8], rows: usize, r: usize, out: &mut [f32]) {
    let DType::Quant(ty) = dtype else { unreachable!("only block-quantized weights are packed") };
    quant::unpack_row8(ty, packed, rows, r, out);
}
