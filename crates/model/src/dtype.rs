//! Storage types of weights (float formats and ggml block formats) and their widening to
//! f32. Sits right above [`crate::quant`], below the kernels' dispatch and the tensor type.

use crate::quant::{dequantize, QuantType};

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

    /// Bytes of `n` consecutive elements, or `None` when `n` is not a whole number of blocks
    /// or the byte count does not fit a `usize` (a corrupt header's row length).
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_size()).then(|| (n / self.block_size()).checked_mul(self.size())).flatten()
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

/// Decode a little-endian buffer of `dtype` into f32 values.
pub fn to_f32_vec(bytes: &[u8], dtype: DType) -> Vec<f32> {
    let mut out = vec![0.0; bytes.len() / dtype.size() * dtype.block_size()];
    widen(bytes, dtype, &mut out);
    out
}

/// Widen `out.len()` elements of `dtype` from `bytes` into `out`.
pub fn widen(bytes: &[u8], dtype: DType, out: &mut [f32]) {
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
        DType::F16 => crate::kernels::f16_rows::widen(bytes, out),
        DType::Quant(q) => dequantize(q, bytes, out),
    }
}
