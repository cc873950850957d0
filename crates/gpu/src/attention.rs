//! Attention on the device (kernels/attention.cu): RoPE from a host table, the KV cache of one
//! sequence's layer ([`DeviceKv`], f32 or f16 rows, or ggml Q8_0/Q4_0 blocks), and causal
//! grouped-query attention over it — split-K flash decoding for one or a few new tokens, a
//! tiled flash-attention prefill for longer batches ([`attention`]). The kernels accumulate in
//! f32; f16 keys and values are converted on read, Q8_0/Q4_0 ones dequantized on read.

use frognano_model::cache::KvType;

use crate::backend::{Arg, Buffer, Gpu, GpuError, Result};
use crate::kernels::blocks;
use frognano_model::quant::{self, QuantType};

/// Largest head_dim the attention kernels take (`ATTN_MAX_DIM`).
pub const MAX_HEAD_DIM: usize = 256;
/// Batches of at most this many new tokens take the split-K decoding path in
/// [`AttnPath::Auto`]; longer ones the tiled prefill.
pub const SPLIT_K_MAX_T: usize = 4;
/// Keys per split-K chunk by default (one shared-memory tile of the decoding kernel).
pub const DECODE_CHUNK: usize = 128;
/// Split-K chunks per query row at most by default: beyond `DECODE_CHUNK · DEFAULT_CHUNKS`
/// keys the chunks grow (by whole tiles) instead of the scratch.
pub const DEFAULT_CHUNKS: usize = 64;
/// Chunks per row the combine kernel takes at most (`ATTN_MAX_CHUNKS`).
pub const MAX_CHUNKS: usize = 256;

const DEC_THREADS: u32 = 128;
const DEC_HEADS: usize = 8;
const PF_THREADS: u32 = 128;
const PF_ROWS: usize = 16;

/// Storage type of the device KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// f32 rows.
    F32,
    /// IEEE half rows (rounded to nearest even on append).
    F16,
    /// ggml Q8_0 blocks: per 32 values an f16 scale and 32 int8 (34 bytes), quantized on
    /// append exactly as frognano-model's `KvRows::push` does (the same bytes).
    Q8_0,
    /// ggml Q4_0 blocks: per 32 values an f16 scale and 16 bytes of nibbles (18 bytes),
    /// quantized on append as `KvRows::push` does.
    Q4_0,
}

impl From<KvType> for KvDtype {
    /// The device cache type of a CPU cache type (`--kv-cache`).
    fn from(ty: KvType) -> KvDtype {
        match ty {
            KvType::F32 => KvDtype::F32,
            KvType::F16 => KvDtype::F16,
            KvType::Q8_0 => KvDtype::Q8_0,
            KvType::Q4_0 => KvDtype::Q4_0,
        }
    }
}

impl From<KvDtype> for KvType {
    /// The CPU's name for a device cache type (what a saved state's layout says).
    fn from(ty: KvDtype) -> KvType {
        match ty {
            KvDtype::F32 => KvType::F32,
            KvDtype::F16 => KvType::F16,
            KvDtype::Q8_0 => KvType::Q8_0,
            KvDtype::Q4_0 => KvType::Q4_0,
        }
    }
}

impl KvDtype {
    /// Bytes of one row of `width` values (`width` a multiple of 32 for the block types).
    pub fn row_bytes(self, width: usize) -> usize {
        match self {
            KvDtype::F32 => width * 4,
            KvDtype::F16 => width * 2,
            KvDtype::Q8_0 => width / 32 * 34,
            KvDtype::Q4_0 => width / 32 * 18,
        }
    }
    /// The ggml block type, for the block types.
    pub fn block_type(self) -> Option<QuantType> {
        match self {
            KvDtype::Q8_0 => Some(QuantType::Q8_0),
            KvDtype::Q4_0 => Some(QuantType::Q4_0),
            KvDtype::F32 | KvDtype::F16 => None,
        }
    }
    fn suffix(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Q8_0 => "q8_0",
            KvDtype::Q4_0 => "q4_0",
        }
    }
}

/// One sequence's keys and values of one layer on the device: rows `[capacity, width]`
/// (width = kv_heads·head_dim, row `p` the key/value of position `p`), keys and values in two
/// buffers of [`KvDtype`] elements (for Q8_0/Q4_0, a row is `width / 32` ggml blocks, the
/// bytes frognano-model's `KvRows::raw_rows` holds).
pub struct DeviceKv {
    k: Buffer,
    v: Buffer,
    ty: KvDtype,
    width: usize,
    capacity: usize,
}

impl std::fmt::Debug for DeviceKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceKv({:?}, width {}, capacity {})", self.ty, self.width, self.capacity)
    }
}

impl DeviceKv {
    /// A zeroed cache of `capacity` rows of `width` values (a multiple of 32 for Q8_0/Q4_0:
    /// an error otherwise).
    pub fn new(dev: &Gpu, ty: KvDtype, width: usize, capacity: usize) -> Result<DeviceKv> {
        if ty.block_type().is_some() && !width.is_multiple_of(32) {
            return Err(GpuError::Unsupported(format!(
                "a {} KV cache needs rows in whole blocks of 32: width {width} is not a multiple of 32",
                ty.suffix()
            )));
        }
        let bytes = capacity * ty.row_bytes(width);
        Ok(DeviceKv { k: Buffer::zeroed(dev, bytes)?, v: Buffer::zeroed(dev, bytes)?, ty, width, capacity })
    }
    /// Rows the buffers hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Values per row (kv_heads·head_dim).
    pub fn width(&self) -> usize {
        self.width
    }
    /// The element type.
    pub fn dtype(&self) -> KvDtype {
        self.ty
    }
    /// Device bytes of both buffers.
    pub fn byte_len(&self) -> usize {
        2 * self.capacity * self.ty.row_bytes(self.width)
    }
    /// Bytes of one row of keys (or of values).
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.width)
    }
    /// The stored bytes of rows `0..rows` of the keys and of the values (f32 or f16 values in
    /// this machine's order, or the ggml blocks), as frognano-model's `KvRows::raw_rows` has them.
    pub fn download_raw(&self, rows: usize) -> Result<(Vec<u8>, Vec<u8>)> {
        if rows > self.capacity {
            return Err(GpuError::Unsupported(format!("{rows} rows of a KV cache of capacity {}", self.capacity)));
        }
        let read = |b: &Buffer| -> Result<Vec<u8>> {
            let mut bytes = vec![0u8; rows * self.row_bytes()];
            b.device().download(b.ptr(), &mut bytes)?;
            Ok(bytes)
        };
        Ok((read(&self.k)?, read(&self.v)?))
    }
    /// The device address of the keys `[capacity, width]`.
    pub fn k_ptr(&self) -> u64 {
        self.k.ptr()
    }
    /// The device address of the values `[capacity, width]`.
    pub fn v_ptr(&self) -> u64 {
        self.v.ptr()
    }
    /// Grows the capacity (new buffers, the first `keep` rows copied) to at least `need` rows:
    /// to `max(need, 2·capacity)`. Nothing happens when `need` rows fit already.
    pub fn reserve(&mut self, dev: &Gpu, keep: usize, need: usize) -> Result<()> {
        if need <= self.capacity {
            return Ok(());
        }
        let keep = keep.min(self.capacity);
        let grown = DeviceKv::new(dev, self.ty, self.width, need.max(2 * self.capacity))?;
        self.copy_rows_into(dev, &grown, keep)?;
        *self = grown;
        Ok(())
    }
    /// A device copy of the first `rows` rows (same capacity; the rest zero): a fork of a
    /// sequence.
    pub fn duplicate(&self, dev: &Gpu, rows: usize) -> Result<DeviceKv> {
        let copy = DeviceKv::new(dev, self.ty, self.width, self.capacity)?;
        self.copy_rows_into(dev, &copy, rows.min(self.capacity))?;
        Ok(copy)
    }
    /// Copies the first `rows` rows to the host as f32 (keys, values; each `[rows, width]`;
    /// Q8_0/Q4_0 dequantized as ggml does), for tests and saving.
    pub fn download_rows(&self, rows: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let (k, v) = self.download_raw(rows)?;
        let n = rows * self.width;
        let conv = |bytes: Vec<u8>| -> Vec<f32> {
            match self.ty {
                KvDtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect(),
                KvDtype::F16 => bytes
                    .chunks_exact(2)
                    .map(|c| half::f16::from_bits(u16::from_ne_bytes([c[0], c[1]])).to_f32())
                    .collect(),
                KvDtype::Q8_0 | KvDtype::Q4_0 => {
                    let mut out = vec![0.0f32; n];
                    let q = self.ty.block_type().expect("a block type");
                    quant::dequantize(q, &bytes, &mut out);
                    out
                }
            }
        };
        Ok((conv(k), conv(v)))
    }
    fn copy_rows_into(&self, dev: &Gpu, dst: &DeviceKv, rows: usize) -> Result<()> {
        let bytes = rows * self.row_bytes();
        if bytes > 0 {
            dev.copy(dst.k.ptr(), self.k.ptr(), bytes)?;
            dev.copy(dst.v.ptr(), self.v.ptr(), bytes)?;
        }
        Ok(())
    }
}

/// In place RoPE on `x` `[rows, heads, head_dim]` f32: for each row `r` and pair
/// `i < rot_dim/2`, `(cos, sin) = cos_sin[(r·rot_dim/2 + i)·2 ..+2]` (a `[rows, rot_dim/2, 2]`
/// f32 table the host computes per row's position, so every model's RoPE variant stays on
/// the host) rotates dims `(i, i + rot_dim/2)` when `halves`, else `(2i, 2i+1)`:
/// `x0' = fma(x0, c, −(x1·s))`, `x1' = fma(x0, s, x1·c)` (llama.rs's fusing). Dims ≥ `rot_dim`
/// are untouched. One block of 128 threads a row.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    dev: &Gpu,
    x: u64,
    cos_sin: u64,
    rows: usize,
    heads: usize,
    head_dim: usize,
    rot_dim: usize,
    halves: bool,
) -> Result<()> {
    if rot_dim > head_dim || !rot_dim.is_multiple_of(2) {
        return Err(GpuError::Unsupported(format!("rope: rot_dim {rot_dim} of head_dim {head_dim}")));
    }
    if rows == 0 || rot_dim == 0 || heads == 0 {
        return Ok(());
    }
    dev.launch(
        "attn_rope",
        [rows as u32, 1, 1],
        [128, 1, 1],
        0,
        &[
            Arg::Ptr(x),
            Arg::Ptr(cos_sin),
            Arg::I32(heads as i32),
            Arg::I32(head_dim as i32),
            Arg::I32(rot_dim as i32),
            Arg::I32(halves as i32),
        ],
    )
}

/// Writes the `k`, `v` rows (`[rows, width]` f32) at positions `pos0..pos0+rows` of the cache
/// (converted to its type: f16 rounded to nearest even; Q8_0/Q4_0 quantized block by block
/// with the float operations of frognano-model's `KvRows::push`, so the bytes are the CPU
/// cache's). The caller reserves first; rows past the capacity are an error. f32/f16: one
/// thread an element, blocks of 256; Q8_0/Q4_0: one warp a block of 32 (of k and of v), 8
/// warps a block.
pub fn kv_append(dev: &Gpu, kv: &DeviceKv, k: u64, v: u64, pos0: usize, rows: usize) -> Result<()> {
    if pos0 + rows > kv.capacity {
        return Err(GpuError::Unsupported(format!(
            "kv_append: rows {pos0}..{} past the capacity {} (reserve first)",
            pos0 + rows,
            kv.capacity
        )));
    }
    let n = rows * kv.width;
    if n == 0 {
        return Ok(());
    }
    if n > i32::MAX as usize {
        return Err(GpuError::Unsupported(format!("kv_append: {rows} rows of {} values in one call", kv.width)));
    }
    let (grid, count) = match kv.ty.block_type() {
        Some(_) => (blocks(n / 32, 8), n / 32),
        None => (blocks(n, 256), n),
    };
    dev.launch(
        &format!("attn_kv_append_{}", kv.ty.suffix()),
        [grid, 1, 1],
        [256, 1, 1],
        0,
        &[
            Arg::Ptr(kv.k.ptr()),
            Arg::Ptr(kv.v.ptr()),
            Arg::Ptr(k),
            Arg::Ptr(v),
            Arg::I32(pos0 as i32),
            Arg::I32(kv.width as i32),
            Arg::I32(count as i32),
        ],
    )
}

/// Device scratch of [`attention`]'s split-K partials (max, sum, accumulator per chunk);
/// grows on demand and is reused across calls.
#[derive(Default)]
pub struct AttnScratch {
    buf: Option<Buffer>,
}

impl std::fmt::Debug for AttnScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AttnScratch({} bytes)", self.buf.as_ref().map_or(0, Buffer::len))
    }
}

impl AttnScratch {
    /// Empty scratch (allocated on first use).
    pub fn new() -> Self {
        AttnScratch { buf: None }
    }
    /// Bytes held on the device.
    pub fn byte_len(&self) -> usize {
        self.buf.as_ref().map_or(0, Buffer::len)
    }
    fn ensure(&mut self, dev: &Gpu, bytes: usize) -> Result<u64> {
        if self.buf.as_ref().is_none_or(|b| b.len() < bytes) {
            self.buf = None;
            self.buf = Some(Buffer::zeroed(dev, bytes.next_power_of_two())?);
        }
        Ok(self.buf.as_ref().expect("allocated above").ptr())
    }
}

/// Which kernel [`attention_with`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttnPath {
    /// Split-K decoding for `t ≤` [`SPLIT_K_MAX_T`], else the tiled prefill.
    #[default]
    Auto,
    /// Split-K flash decoding with `chunk` keys per block (`None`: [`DECODE_CHUNK`], grown so
    /// that a row has at most [`DEFAULT_CHUNKS`]); a chunk that would make more than
    /// [`MAX_CHUNKS`] is grown to fit.
    SplitK {
        /// Keys per block.
        chunk: Option<usize>,
    },
    /// The tiled flash-attention prefill.
    Tiled,
}

/// `out[t, heads, head_dim] = causal softmax(q·kᵀ·scale)·v` over the cache, query row `i` (at
/// position `pos0 + i`) seeing keys `0..=pos0+i`; query head `h` reads KV head
/// `h / (heads / kv_heads)`. `q` and `out` are `[t, heads, head_dim]` f32 (distinct buffers);
/// the cache must hold rows `0..pos0+t` (append first). `t ≤` [`SPLIT_K_MAX_T`]: split-K
/// flash decoding (keys in chunks across blocks, then a combine kernel), else a tiled
/// flash-attention prefill. `head_dim ≤` [`MAX_HEAD_DIM`]. Scratch for the split-K partials
/// comes from `scratch`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    dev: &Gpu,
    q: u64,
    kv: &DeviceKv,
    out: u64,
    t: usize,
    pos0: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f32,
    scratch: &mut AttnScratch,
) -> Result<()> {
    attention_with(dev, q, kv, out, t, pos0, heads, kv_heads, head_dim, scale, AttnPath::Auto, scratch)
}

/// [`attention`] with the kernel chosen by `path` (tests run both on the same input).
///
/// Launch shapes (the same for every [`KvDtype`]). Split-K:
/// `attn_decode_partial_{f32,f16,q8_0,q4_0}` on grid `(chunks, heads / hb, t)`
/// of 128 threads, `hb` = the largest divisor of `heads / kv_heads` up to 8 (the query heads
/// of one KV head that share every key and value read), chunks = ⌈(pos0+t) / chunk⌉; then
/// `attn_decode_combine` on `t·heads` blocks of ⌈head_dim/32⌉·32 threads (at most 256).
/// Partials in `scratch`: max and sum `[t·heads, chunks]`, accumulators
/// `[t·heads, chunks, head_dim]`. Tiled: `attn_prefill_{f32,f16,q8_0,q4_0}` on grid `(⌈t/16⌉, heads)` of
/// 128 threads, key tiles of `bk` = 64 (head_dim ≤ 64), 32 (≤ 128) or 16 keys, dynamic shared
/// memory `((16 + bk)·(head_dim+1) + 16·bk)·4` bytes (under 34 KB).
#[allow(clippy::too_many_arguments)]
pub fn attention_with(
    dev: &Gpu,
    q: u64,
    kv: &DeviceKv,
    out: u64,
    t: usize,
    pos0: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f32,
    path: AttnPath,
    scratch: &mut AttnScratch,
) -> Result<()> {
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(GpuError::Unsupported(format!("attention: {heads} query heads on {kv_heads} KV heads")));
    }
    if head_dim == 0 || head_dim > MAX_HEAD_DIM || kv_heads * head_dim != kv.width {
        return Err(GpuError::Unsupported(format!(
            "attention: head_dim {head_dim} × {kv_heads} KV heads on a cache of width {} (head_dim ≤ {MAX_HEAD_DIM})",
            kv.width
        )));
    }
    if pos0 + t > kv.capacity {
        return Err(GpuError::Unsupported(format!(
            "attention: positions up to {} on a cache of capacity {}",
            pos0 + t,
            kv.capacity
        )));
    }
    if t == 0 {
        return Ok(());
    }
    let split = match path {
        AttnPath::Auto => t <= SPLIT_K_MAX_T,
        AttnPath::SplitK { .. } => true,
        AttnPath::Tiled => false,
    };
    let ty = kv.ty.suffix();
    if !split {
        let bk: usize = match head_dim {
            0..=64 => 64,
            65..=128 => 32,
            _ => 16,
        };
        let shared = ((PF_ROWS + bk) * (head_dim + 1) + PF_ROWS * bk) * 4;
        return dev.launch(
            &format!("attn_prefill_{ty}"),
            [blocks(t, PF_ROWS), heads as u32, 1],
            [PF_THREADS, 1, 1],
            shared as u32,
            &[
                Arg::Ptr(q),
                Arg::Ptr(kv.k.ptr()),
                Arg::Ptr(kv.v.ptr()),
                Arg::Ptr(out),
                Arg::I32(t as i32),
                Arg::I32(pos0 as i32),
                Arg::I32(heads as i32),
                Arg::I32(kv_heads as i32),
                Arg::I32(head_dim as i32),
                Arg::I32(bk as i32),
                Arg::F32(scale),
            ],
        );
    }
    let keys = pos0 + t;
    let mut chunk = match path {
        AttnPath::SplitK { chunk: Some(c) } => c.max(1),
        _ => DECODE_CHUNK * keys.div_ceil(DECODE_CHUNK * DEFAULT_CHUNKS).max(1),
    };
    if keys.div_ceil(chunk) > MAX_CHUNKS {
        chunk = keys.div_ceil(MAX_CHUNKS);
    }
    let chunks = keys.div_ceil(chunk);
    let group = heads / kv_heads;
    let hb = (1..=DEC_HEADS.min(group)).rev().find(|&d| group.is_multiple_of(d)).unwrap_or(1);
    let rh = t * heads;
    let align = |b: usize| b.div_ceil(256) * 256;
    let (m_bytes, acc_bytes) = (align(rh * chunks * 4), rh * chunks * head_dim * 4);
    let base = scratch.ensure(dev, 2 * m_bytes + acc_bytes)?;
    let (pm, pl, pacc) = (base, base + m_bytes as u64, base + 2 * m_bytes as u64);
    dev.launch(
        &format!("attn_decode_partial_{ty}"),
        [chunks as u32, (heads / hb) as u32, t as u32],
        [DEC_THREADS, 1, 1],
        0,
        &[
            Arg::Ptr(q),
            Arg::Ptr(kv.k.ptr()),
            Arg::Ptr(kv.v.ptr()),
            Arg::Ptr(pm),
            Arg::Ptr(pl),
            Arg::Ptr(pacc),
            Arg::I32(pos0 as i32),
            Arg::I32(heads as i32),
            Arg::I32(kv_heads as i32),
            Arg::I32(head_dim as i32),
            Arg::I32(hb as i32),
            Arg::I32(chunk as i32),
            Arg::F32(scale),
        ],
    )?;
    let threads = (head_dim.div_ceil(32) * 32).min(256) as u32;
    dev.launch(
        "attn_decode_combine",
        [rh as u32, 1, 1],
        [threads, 1, 1],
        0,
        &[
            Arg::Ptr(pm),
            Arg::Ptr(pl),
            Arg::Ptr(pacc),
            Arg::Ptr(out),
            Arg::I32(chunks as i32),
            Arg::I32(head_dim as i32),
        ],
    )
}
