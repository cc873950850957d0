//! Weight matrices on the device in their stored formats (kernels/quant.cu): F32, F16, BF16 and
//! every ggml block format of `frognano_model::quant::QuantType`, uploaded byte for byte as
//! frognano-model keeps them ([`Matrix`]: `[rows, cols]`, PyTorch `[out, in]`, row-major, each
//! row a whole number of blocks).
//!
//! [`DeviceMatrix::matmul`] runs `y = x · Wᵀ` two ways: for up to [`GEMV_MAX_N`] rows of `x` a
//! GEMV kernel per format reads the weights once and dequantizes them in registers (one kernel
//! for up to 8 rows, a batched one with `x` staged in shared memory for up to 32; a row gets
//! the same bits from either, whatever `n` is); for more rows the weights are dequantized to f16 (bf16 and f32 weights are used as they are) into a
//! [`MatmulScratch`], `x` is converted to the same type, and [`crate::Device::matmul_nt`] (cuBLAS)
//! multiplies. Unlike the CPU path, activations are never quantized to 8 bits: the GEMV is an
//! f32 product of the dequantized weights, the GEMM one of f16-rounded (bf16) operands with
//! f32 accumulation.

use std::sync::Arc;

use frognano_model::tensor::{DType, Matrix};

use crate::backend::{Arg, Buffer, Gpu, GpuError, MatmulNt, Result};
use crate::kernels::blocks;
use crate::GemmType;

/// The most rows of `x` the GEMV kernels take in one launch; [`DeviceMatrix::matmul`] goes
/// the GEMM way above it. Every row of `x` up to this many gets the bits it gets alone
/// (`n = 1`), so a stepwise pass in pieces of at most this many rows is exact; that is why the
/// float formats (F32, F16, BF16) take the GEMV up to here too instead of cuBLAS.
pub const GEMV_MAX_N: usize = 32;

/// The most rows of `x` the small GEMV (`quant_gemv_<type>`) takes; the batched one
/// (`quant_gemv32_<type>`) takes the rest up to [`GEMV_MAX_N`].
const GEMV_SMALL_N: usize = 8;

/// Rows of output a GEMV block computes (one warp each).
const GEMV_ROWS_PER_BLOCK: usize = 4;

/// Rows of output a batched GEMV block computes (8 warps of 2 rows).
const GEMV32_ROWS_PER_BLOCK: usize = 16;

/// Threads of a batched GEMV block.
const GEMV32_THREADS: u32 = 256;

/// Columns of `x` a batched GEMV block stages in shared memory at a time (f32, per row of `x`).
const GEMV32_TILE: usize = 256;

/// Default bound on the dequantized weights [`MatmulScratch`] holds at once: 64 Mi elements
/// (128 MiB of f16).
pub const DEFAULT_CHUNK_ELEMENTS: usize = 64 << 20;

/// The kernel-name suffix of a dtype (`q4_k`, `bf16`, …).
fn suffix(dtype: DType) -> String {
    dtype.name().to_ascii_lowercase()
}

/// A weight matrix on the device, its bytes exactly as [`Matrix`] stores them.
#[derive(Debug)]
pub struct DeviceMatrix {
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Stored element type.
    pub dtype: DType,
    /// The stored bytes, `rows · dtype.row_bytes(cols)`.
    buf: Buffer,
}

impl DeviceMatrix {
    /// Uploads the stored bytes of `m` as they are (no conversion). Fails with
    /// [`GpuError::Unsupported`] for a matrix whose row bytes are gone (one that
    /// `Matrix::pack_for_matmul` left in its CPU-packed form only) or whose shape does not fit
    /// the kernels' 32-bit indices.
    pub fn upload(dev: &Gpu, m: &Matrix) -> Result<DeviceMatrix> {
        let row = m.dtype.row_bytes(m.cols).ok_or_else(|| {
            GpuError::Unsupported(format!(
                "{} matrix of width {}: not a whole number of blocks",
                m.dtype.name(),
                m.cols
            ))
        })?;
        let bytes = m.weight_ref().bytes;
        if bytes.len() != m.rows * row {
            return Err(GpuError::Unsupported(format!(
                "{} matrix [{}, {}] holds {} bytes instead of {} (packed for the CPU kernels only?)",
                m.dtype.name(),
                m.rows,
                m.cols,
                bytes.len(),
                m.rows * row
            )));
        }
        if m.rows > i32::MAX as usize || m.cols > i32::MAX as usize {
            return Err(GpuError::Unsupported(format!("matrix [{}, {}] is too large", m.rows, m.cols)));
        }
        if m.low_rank().is_some() {
            return Err(GpuError::Unsupported(format!(
                "matrix [{}, {}] carries a low-rank (LoRA) update, which the GPU kernels do not apply; merge it into the weights",
                m.rows, m.cols
            )));
        }
        Ok(DeviceMatrix { rows: m.rows, cols: m.cols, dtype: m.dtype, buf: Buffer::from_bytes(dev, bytes)? })
    }

    /// Bytes the matrix holds on the device.
    pub fn byte_len(&self) -> usize {
        self.buf.len()
    }

    /// The device address of the stored bytes.
    pub fn ptr(&self) -> u64 {
        self.buf.ptr()
    }

    /// Bytes of one stored row.
    fn row_bytes(&self) -> usize {
        self.dtype.row_bytes(self.cols).expect("checked at upload")
    }

    /// `y[n, rows] = x[n, cols] · Wᵀ` (`x`, `y`: f32 device buffers, row-major; `y`
    /// overwritten). `n ≤ 8`: one GEMV launch (`quant_gemv_<type>`, blocks of 128 threads, a
    /// warp per output row) that reads the weights once for all `n` rows. `8 < n ≤
    /// GEMV_MAX_N` (32): one batched GEMV launch (`quant_gemv32_<type>`, blocks of 256 threads,
    /// a warp per 2 output rows, `x` staged through `n` KiB of shared memory 256 columns at a
    /// time) that also reads and decodes the weights once. Both give row `j` of `y` the same
    /// bits whatever `n` is (each lane sums the same elements in the same order), so a row's
    /// result never depends on the rows batched with it. Larger `n` (prefill): W dequantized to f16 (`quant_dequant_<type>_f16`; f16, bf16 and f32 weights used as
    /// stored) in row chunks of at most `scratch`'s chunk size, `x` converted to the same type,
    /// and [`crate::Device::matmul_nt`] per chunk.
    pub fn matmul(&self, dev: &Gpu, x: u64, y: u64, n: usize, scratch: &mut MatmulScratch) -> Result<()> {
        if n == 0 || self.rows == 0 {
            return Ok(());
        }
        if n <= GEMV_MAX_N {
            return self.gemv(dev, x, y, n);
        }
        self.gemm(dev, x, y, n, scratch)
    }

    /// The GEMV path of [`DeviceMatrix::matmul`] (`n ≤ GEMV_MAX_N`).
    fn gemv(&self, dev: &Gpu, x: u64, y: u64, n: usize) -> Result<()> {
        debug_assert!(n <= GEMV_MAX_N);
        let (name, grid, block, shared) = if n <= GEMV_SMALL_N {
            let name = format!("quant_gemv_{}", suffix(self.dtype));
            (name, blocks(self.rows, GEMV_ROWS_PER_BLOCK), (32 * GEMV_ROWS_PER_BLOCK) as u32, 0)
        } else {
            let name = format!("quant_gemv32_{}", suffix(self.dtype));
            (name, blocks(self.rows, GEMV32_ROWS_PER_BLOCK), GEMV32_THREADS, (n * GEMV32_TILE * 4) as u32)
        };
        dev.launch(
            &name,
            [grid, 1, 1],
            [block, 1, 1],
            shared,
            &[
                Arg::Ptr(self.buf.ptr()),
                Arg::Ptr(x),
                Arg::Ptr(y),
                Arg::I32(self.rows as i32),
                Arg::I32(self.cols as i32),
                Arg::I32(n as i32),
            ],
        )
    }

    /// The GEMM path of [`DeviceMatrix::matmul`].
    fn gemm(&self, dev: &Gpu, x: u64, y: u64, n: usize, scratch: &mut MatmulScratch) -> Result<()> {
        let (ty, dequant) = match self.dtype {
            DType::F32 => (GemmType::F32, false),
            DType::F16 => (GemmType::F16, false),
            DType::BF16 => (GemmType::BF16, false),
            DType::Quant(_) => (GemmType::F16, true),
        };
        let count = n * self.cols;
        // x in the GEMM's type.
        let xg = match ty {
            GemmType::F32 => x,
            GemmType::F16 | GemmType::BF16 => {
                if count > u32::MAX as usize {
                    return Err(GpuError::Unsupported(format!("{n} × {} activations in one matmul", self.cols)));
                }
                let buf = MatmulScratch::ensure(&mut scratch.x, dev, count * 2)?;
                let name = if ty == GemmType::F16 { "quant_f32_to_f16" } else { "quant_f32_to_bf16" };
                dev.launch(
                    name,
                    [blocks(count, 256), 1, 1],
                    [256, 1, 1],
                    0,
                    &[Arg::Ptr(x), Arg::Ptr(buf), Arg::U32(count as u32)],
                )?;
                buf
            }
        };
        // Rows of W per GEMM: all of them for the float formats (used in place), else as many
        // as the chunk bound allows.
        let chunk = if dequant { (scratch.chunk_elements / self.cols).clamp(1, self.rows) } else { self.rows };
        let row_bytes = self.row_bytes();
        let mut r0 = 0;
        while r0 < self.rows {
            let rc = chunk.min(self.rows - r0);
            let wg = if dequant {
                let buf = MatmulScratch::ensure(&mut scratch.w, dev, rc * self.cols * 2)?;
                dev.launch(
                    &format!("quant_dequant_{}_f16", suffix(self.dtype)),
                    [blocks(rc * self.cols / 8, 256), 1, 1],
                    [256, 1, 1],
                    0,
                    &[
                        Arg::Ptr(self.buf.ptr() + (r0 * row_bytes) as u64),
                        Arg::Ptr(buf),
                        Arg::I32(rc as i32),
                        Arg::I32(self.cols as i32),
                    ],
                )?;
                buf
            } else {
                self.buf.ptr()
            };
            if rc == self.rows {
                dev.matmul_nt(&MatmulNt { w: wg, x: xg, ty, y, rows: rc, cols: self.cols, n })?;
            } else {
                let tmp = MatmulScratch::ensure(&mut scratch.y, dev, n * rc * 4)?;
                dev.matmul_nt(&MatmulNt { w: wg, x: xg, ty, y: tmp, rows: rc, cols: self.cols, n })?;
                dev.launch(
                    "quant_scatter_cols",
                    [blocks(n * rc, 256), 1, 1],
                    [256, 1, 1],
                    0,
                    &[
                        Arg::Ptr(tmp),
                        Arg::Ptr(y),
                        Arg::I32(n as i32),
                        Arg::I32(rc as i32),
                        Arg::I32(self.rows as i32),
                        Arg::I32(r0 as i32),
                    ],
                )?;
            }
            r0 += rc;
        }
        Ok(())
    }

    /// `out[i, :] = W[ids[i], :]` as f32 for `i < n` (embedding lookup); `ids`: device i32
    /// `[n]`, each in `0..rows` (not checked on the device); `out`: f32 `[n, cols]`. Kernel
    /// `quant_gather_<type>`, grid (row chunks, n): blocks of 128 threads, one thread per 8
    /// elements of a block-format row, per element of a float row.
    pub fn gather_rows(&self, dev: &Gpu, ids: u64, out: u64, n: usize) -> Result<()> {
        if n == 0 || self.cols == 0 {
            return Ok(());
        }
        if n > u16::MAX as usize {
            return Err(GpuError::Unsupported(format!("gathering {n} rows at once (grid y is at most 65535)")));
        }
        let per_thread = match self.dtype {
            DType::Quant(_) => 8,
            _ => 1,
        };
        dev.launch(
            &format!("quant_gather_{}", suffix(self.dtype)),
            [blocks(self.cols / per_thread, 128), n as u32, 1],
            [128, 1, 1],
            0,
            &[Arg::Ptr(self.buf.ptr()), Arg::Ptr(ids), Arg::Ptr(out), Arg::I32(self.cols as i32)],
        )
    }
}

/// Reusable device buffers for [`DeviceMatrix::matmul`]'s GEMM path: the dequantized weights
/// (a chunk of rows in f16), the converted activations and, when W is done in several chunks,
/// one chunk's output. They grow on demand and are kept for the next call.
#[derive(Debug)]
pub struct MatmulScratch {
    w: Option<Buffer>,
    x: Option<Buffer>,
    y: Option<Buffer>,
    chunk_elements: usize,
}

impl Default for MatmulScratch {
    fn default() -> Self {
        MatmulScratch::new()
    }
}

impl MatmulScratch {
    /// Empty scratch that dequantizes at most [`DEFAULT_CHUNK_ELEMENTS`] weights at a time.
    pub fn new() -> Self {
        MatmulScratch::with_chunk_elements(DEFAULT_CHUNK_ELEMENTS)
    }

    /// Empty scratch that dequantizes at most `elements` weights at a time (at least one row:
    /// a row wider than `elements` is done alone).
    pub fn with_chunk_elements(elements: usize) -> Self {
        MatmulScratch { w: None, x: None, y: None, chunk_elements: elements.max(1) }
    }

    /// Bytes held on the device now.
    pub fn byte_len(&self) -> usize {
        [&self.w, &self.x, &self.y].iter().map(|b| b.as_ref().map_or(0, Buffer::len)).sum()
    }

    /// The address of `slot`, reallocated when it is smaller than `bytes` or on another device.
    fn ensure(slot: &mut Option<Buffer>, dev: &Gpu, bytes: usize) -> Result<u64> {
        let fits = slot.as_ref().is_some_and(|b| b.len() >= bytes && Arc::ptr_eq(b.device(), dev));
        if !fits {
            *slot = None; // free the old one first
            *slot = Some(Buffer::zeroed(dev, bytes)?);
        }
        Ok(slot.as_ref().expect("set above").ptr())
    }
}
