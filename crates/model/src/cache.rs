//! Per-sequence model state. Full-attention layers keep keys and values ([`KvRows`], in the
//! [`KvType`] the model was set to: f16 by default, or ggml's Q8_0/Q4_0 blocks); Gated
//! DeltaNet layers keep the last `K-1` pre-conv inputs and the `[Hv, dk, dv]` recurrent state
//! (f32). The whole cache is a plain value: cloning it is a snapshot, which is how the engine
//! reuses a conversation prefix on a hybrid model where nothing can be "cropped".

use half::f16;

use crate::quant::{self, QuantType};

/// How attention keys and values are stored (llama.cpp's `-ctk`/`-ctv`; docs/model.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    /// f32, as computed (bf16/f32-activation models from safetensors keep their own numerics).
    F32,
    /// IEEE half, 2 bytes a value: llama.cpp's default, and ours.
    #[default]
    F16,
    /// ggml Q8_0 blocks (32 int8 values and an f16 scale: 34 bytes per 32 values).
    Q8_0,
    /// ggml Q4_0 blocks (32 four-bit values and an f16 scale: 18 bytes per 32 values).
    Q4_0,
}

impl KvType {
    /// The names `--kv-cache` takes.
    pub const NAMES: &'static str = "f16, q8_0, q4_0 (or f32)";

    /// Bytes one row of `width` values takes (`width` a multiple of 32 for the block types).
    pub fn row_bytes(self, width: usize) -> usize {
        match self {
            KvType::F32 => width * 4,
            KvType::F16 => width * 2,
            KvType::Q8_0 => width / 32 * 34,
            KvType::Q4_0 => width / 32 * 18,
        }
    }

    /// The ggml block type, for the quantized ones.
    fn quant(self) -> Option<QuantType> {
        match self {
            KvType::Q8_0 => Some(QuantType::Q8_0),
            KvType::Q4_0 => Some(QuantType::Q4_0),
            KvType::F32 | KvType::F16 => None,
        }
    }

    /// Fails unless rows of heads `head_dim` wide can be stored (the block types quantize each
    /// head in whole blocks of 32, so one head can be read alone).
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), String> {
        if self.quant().is_some() && !head_dim.is_multiple_of(32) {
            return Err(format!("--kv-cache {self}: head_dim {head_dim} is not a multiple of 32 (the block size)"));
        }
        Ok(())
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        })
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            "q4_0" => Ok(KvType::Q4_0),
            other => Err(format!("unknown KV cache type {other:?}: expected one of {}", KvType::NAMES)),
        }
    }
}

/// The storage of [`KvRows`].
#[derive(Debug, Clone)]
enum Store {
    F32(Vec<f32>),
    /// f16 bit patterns.
    F16(Vec<u16>),
    /// ggml blocks, `row_bytes` per row.
    Blocks(QuantType, Vec<u8>),
}

/// Keys or values of one attention layer: a row of `width` (= KV heads · head_dim) values per
/// position, appended as tokens are processed.
#[derive(Debug, Clone)]
pub struct KvRows {
    width: usize,
    head_dim: usize,
    len: usize,
    store: Store,
}

impl KvRows {
    /// Empty rows of `width` values in heads of `head_dim` (checked by
    /// [`KvType::check_head_dim`] when the type is chosen).
    pub fn new(ty: KvType, width: usize, head_dim: usize) -> Self {
        let store = match ty.quant() {
            Some(q) => Store::Blocks(q, Vec::new()),
            None if ty == KvType::F32 => Store::F32(Vec::new()),
            None => Store::F16(Vec::new()),
        };
        KvRows { width, head_dim, len: 0, store }
    }

    /// The storage type.
    pub fn kv_type(&self) -> KvType {
        match &self.store {
            Store::F32(_) => KvType::F32,
            Store::F16(_) => KvType::F16,
            Store::Blocks(QuantType::Q8_0, _) => KvType::Q8_0,
            Store::Blocks(..) => KvType::Q4_0,
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Values per row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Values per head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Appends whole rows (`x.len()` a multiple of the width): rounded to f16 or quantized.
    pub fn push(&mut self, x: &[f32]) {
        assert!(x.len().is_multiple_of(self.width), "{} values are not whole rows of {}", x.len(), self.width);
        match &mut self.store {
            Store::F32(v) => v.extend_from_slice(x),
            Store::F16(v) => v.extend(x.iter().map(|&e| f16::from_f32(e).to_bits())),
            Store::Blocks(q, v) => {
                for block in x.chunks_exact(32) {
                    match q {
                        QuantType::Q8_0 => quantize_q8_0(block, v),
                        _ => quantize_q4_0(block, v),
                    }
                }
            }
        }
        self.len += x.len() / self.width;
    }

    /// Keeps the first `rows` positions.
    pub fn truncate(&mut self, rows: usize) {
        let rows = rows.min(self.len);
        let w = self.width;
        match &mut self.store {
            Store::F32(v) => v.truncate(rows * w),
            Store::F16(v) => v.truncate(rows * w),
            Store::Blocks(q, v) => v.truncate(rows * w / 32 * q.block_bytes()),
        }
        self.len = rows;
    }

    /// Bytes held.
    pub fn byte_len(&self) -> usize {
        match &self.store {
            Store::F32(v) => v.len() * 4,
            Store::F16(v) => v.len() * 2,
            Store::Blocks(_, v) => v.len(),
        }
    }

    /// Reserves room for `rows` more positions (the memory check counts on it being real).
    pub fn reserve(&mut self, rows: usize) {
        let w = self.width;
        match &mut self.store {
            Store::F32(v) => v.reserve(rows * w),
            Store::F16(v) => v.reserve(rows * w),
            Store::Blocks(q, v) => v.reserve(rows * w / 32 * q.block_bytes()),
        }
    }

    /// The stored bytes of rows `rows` (little-endian f32 or f16 values, or ggml blocks), as
    /// a state file keeps them ([`push_raw`](Self::push_raw) appends them back).
    pub fn raw_rows(&self, rows: std::ops::Range<usize>) -> &[u8] {
        let per_row = self.kv_type().row_bytes(self.width);
        let (a, b) = (rows.start.min(self.len) * per_row, rows.end.min(self.len) * per_row);
        let bytes: &[u8] = match &self.store {
            Store::F32(v) => as_bytes(v),
            Store::F16(v) => as_bytes(v),
            Store::Blocks(_, v) => v,
        };
        &bytes[a.min(b)..b]
    }

    /// Appends whole rows given as stored bytes (from [`raw_rows`](Self::raw_rows) of rows of
    /// the same type and width). Fails, changing nothing, when `bytes` is not whole rows.
    pub fn push_raw(&mut self, bytes: &[u8]) -> Result<(), String> {
        let per_row = self.kv_type().row_bytes(self.width);
        if per_row == 0 || !bytes.len().is_multiple_of(per_row) {
            return Err(format!("{} bytes are not whole {} rows of {per_row} bytes", bytes.len(), self.kv_type()));
        }
        match &mut self.store {
            Store::F32(v) => extend_from_bytes(v, bytes),
            Store::F16(v) => extend_from_bytes(v, bytes),
            Store::Blocks(_, v) => v.extend_from_slice(bytes),
        }
        self.len += bytes.len() / per_row;
        Ok(())
    }

    /// The f16 bit patterns, `[len, width]`, when stored as f16.
    pub fn f16_bits(&self) -> Option<&[u16]> {
        match &self.store {
            Store::F16(v) => Some(v),
            _ => None,
        }
    }

    /// The ggml block type and the stored blocks (`len` rows of `width / 32` blocks each), when
    /// stored as Q8_0 or Q4_0.
    pub fn blocks(&self) -> Option<(QuantType, &[u8])> {
        match &self.store {
            Store::Blocks(q, v) => Some((*q, v)),
            _ => None,
        }
    }

    /// The f32 values, `[len, width]`, when stored as f32.
    pub fn f32_values(&self) -> Option<&[f32]> {
        match &self.store {
            Store::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Head `head` of row `j` as f32 (exact for f32/f16; ggml's dequantization for blocks).
    pub fn head_into(&self, j: usize, head: usize, out: &mut [f32]) {
        let (dh, at) = (self.head_dim, j * self.width + head * self.head_dim);
        match &self.store {
            Store::F32(v) => out[..dh].copy_from_slice(&v[at..at + dh]),
            Store::F16(v) => {
                for (o, &b) in out[..dh].iter_mut().zip(&v[at..at + dh]) {
                    *o = f16::from_bits(b).to_f32();
                }
            }
            Store::Blocks(q, v) => {
                let bb = q.block_bytes();
                quant::dequantize(*q, &v[at / 32 * bb..(at + dh) / 32 * bb], &mut out[..dh]);
            }
        }
    }

    /// Every row as f32, `[len, width]` (the plain reference path reads this).
    pub fn to_f32(&self) -> Vec<f32> {
        match &self.store {
            Store::F32(v) => v.clone(),
            Store::F16(v) => v.iter().map(|&b| f16::from_bits(b).to_f32()).collect(),
            Store::Blocks(q, v) => {
                let mut out = vec![0.0; self.len * self.width];
                quant::dequantize(*q, v, &mut out);
                out
            }
        }
    }
}

/// The bytes of a slice of plain numbers, in this machine's order (little-endian: x86-64 and
/// aarch64, the only targets; a big-endian build fails below).
pub fn as_bytes<T: Plain>(v: &[T]) -> &[u8] {
    // SAFETY: `Plain` types have no padding and every byte pattern of them is initialised.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Appends the values whose little-endian bytes are `bytes` (a whole number of them): one
/// copy, as a restored 32K-token cache is a gigabyte.
fn extend_from_bytes<T: Plain>(v: &mut Vec<T>, bytes: &[u8]) {
    let n = bytes.len() / std::mem::size_of::<T>();
    v.reserve(n);
    // SAFETY: the spare capacity holds at least `n` values; every byte pattern is a valid
    // `Plain` value, and the bytes are the values in this machine's (little-endian) order.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            v.as_mut_ptr().add(v.len()).cast::<u8>(),
            n * std::mem::size_of::<T>(),
        );
        v.set_len(v.len() + n);
    }
}

/// Number types whose bytes can be viewed directly ([`as_bytes`]).
pub trait Plain: Copy + private::Sealed {}
impl Plain for f32 {}
impl Plain for u16 {}
impl Plain for u32 {}
mod private {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u16 {}
    impl Sealed for u32 {}
}

#[cfg(target_endian = "big")]
compile_error!("state files and KV rows are stored little-endian; big-endian targets are not supported");

/// ggml's `quantize_row_q8_0_ref` for one block of 32: `d = max|x| / 127`, `q = round(x / d)`.
fn quantize_q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
    out.extend(x.iter().map(|v| (v * id).round() as i8 as u8));
}

/// ggml's `quantize_row_q4_0_ref` for one block of 32: `d = max / −8` (the signed value of
/// largest magnitude), `q = min(15, trunc(x / d + 8.5))`; element `j` in the low nibble of byte
/// `j`, element `j + 16` in its high nibble.
fn quantize_q4_0(x: &[f32], out: &mut Vec<u8>) {
    let max = x.iter().fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
    let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
    out.extend((0..16).map(|j| q(x[j]) | (q(x[j + 16]) << 4)));
}

/// State of one layer.
#[derive(Debug, Clone)]
pub enum LayerCache {
    /// Keys and values after norm and RoPE, a row of `heads · head_dim` per position.
    Attention {
        /// Keys, row per position.
        k: KvRows,
        /// Values, row per position.
        v: KvRows,
    },
    /// Gated DeltaNet state.
    Linear {
        /// Last `K-1` pre-conv inputs, `[K-1, conv_dim]`, oldest first (zeros at start).
        conv: Vec<f32>,
        /// Recurrent state `S`, `[Hv, dk, dv]`.
        state: Vec<f32>,
    },
}

impl LayerCache {
    /// An empty attention layer of `kv_heads` heads of `head_dim`, stored as `ty`.
    pub fn attention(ty: KvType, kv_heads: usize, head_dim: usize) -> Self {
        let w = kv_heads * head_dim;
        LayerCache::Attention { k: KvRows::new(ty, w, head_dim), v: KvRows::new(ty, w, head_dim) }
    }
}

/// One sequence's state kept on an accelerator (frognano-gpu): its layers' keys, values and
/// recurrent states in device memory, owned by the model that made the cache. The engine
/// only snapshots, restores, forks and cuts it back through [`Cache`]'s methods, which
/// forward here.
pub trait DeviceState: Send + Sync + std::fmt::Debug {
    /// A device copy of the whole state (a fork of the sequence).
    fn duplicate(&self) -> Box<dyn DeviceState>;
    /// A copy of what cannot be cut back — the recurrent states — for [`Cache::snapshot`]
    /// (keys and values are append-only: restoring cuts them back instead).
    fn save(&self) -> Box<dyn DeviceState>;
    /// Returns to `snap` (made by [`DeviceState::save`] of this state) at position `pos`.
    fn restore(&mut self, snap: &dyn DeviceState, pos: usize) -> Result<(), String>;
    /// Whether every layer can be cut back to an earlier position (attention only).
    fn is_rewindable(&self) -> bool;
    /// Cuts keys and values back to `pos` positions (attention-only states).
    fn truncate(&mut self, pos: usize) -> Result<(), String>;
    /// Bytes of device memory held.
    fn byte_len(&self) -> usize;
    /// Each layer's shape as a CPU cache of the model would have it (what a saved state must
    /// match, `frognano_engine::persist`).
    fn layout(&self) -> Vec<LayerLayout>;
    /// The state of the first `pos` positions as CPU layers (keys and values in their stored
    /// bytes), to save it. Panics when the device fails (an unusable device ends the process).
    fn to_host(&self, pos: usize) -> Vec<LayerCache>;
    /// Loads CPU layers of `pos` positions (as [`DeviceState::to_host`] gives them) into this
    /// state: a saved conversation restored.
    fn load_host(&mut self, layers: &[LayerCache], pos: usize) -> Result<(), String>;
    /// For the model that made it, to reach its own type.
    fn as_any(&self) -> &dyn std::any::Any;
    /// For the model that made it, to reach its own type.
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

/// A [`DeviceState`] in a [`Cache`] or [`CacheSnapshot`]; cloning it copies the device memory.
#[derive(Debug)]
pub struct DeviceSlot(pub Box<dyn DeviceState>);

impl Clone for DeviceSlot {
    fn clone(&self) -> Self {
        DeviceSlot(self.0.duplicate())
    }
}

/// The shape of one layer's state: what a saved state must match to be loaded into a model's
/// cache (`frognano_engine::persist`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LayerLayout {
    /// Keys and values of `width` values a row, in heads of `head_dim`, stored as `kv_type`.
    Attention {
        /// The storage type's name (`f16`, `q8_0`, …).
        kv_type: String,
        /// Values per row.
        width: usize,
        /// Values per head.
        head_dim: usize,
    },
    /// A Gated DeltaNet layer's conv window and recurrent state, in f32 values.
    Linear {
        /// Values of the conv window.
        conv: usize,
        /// Values of the recurrent state.
        state: usize,
    },
}

/// A point in a cache's history that it can return to (see [`Cache::snapshot`]).
#[derive(Debug, Clone)]
pub struct CacheSnapshot {
    /// Tokens processed at the snapshot.
    pub pos: usize,
    /// Per layer: conv and recurrent state of linear layers, `None` for attention layers.
    linear: Vec<Option<(Vec<f32>, Vec<f32>)>>,
    /// The saved device state of a cache on an accelerator.
    device: Option<DeviceSlot>,
}

impl CacheSnapshot {
    /// Layer `layer`'s conv window and recurrent state at the snapshot (`None` for an
    /// attention layer, whose keys and values the snapshot does not copy).
    pub fn linear(&self, layer: usize) -> Option<(&[f32], &[f32])> {
        self.linear.get(layer)?.as_ref().map(|(c, s)| (c.as_slice(), s.as_slice()))
    }

    /// Bytes this snapshot holds.
    pub fn byte_len(&self) -> usize {
        let device = self.device.as_ref().map_or(0, |d| d.0.byte_len());
        device + self.linear.iter().flatten().map(|(c, s)| (c.len() + s.len()) * 4).sum::<usize>()
    }
}

/// The state of one sequence across all layers.
#[derive(Debug, Clone)]
pub struct Cache {
    /// One entry per layer.
    pub layers: Vec<LayerCache>,
    /// Tokens already processed (the position of the next token).
    pub pos: usize,
    /// Recurrent states a stepwise forward keeps row by row ([`Cache::keep_row_states`]).
    pub(crate) row_states: Box<RowStates>,
    /// The state of a model on an accelerator ([`Cache::on_device`]); `layers` is then empty.
    /// (Boxed: a thin pointer keeps a CPU cache's size.)
    pub device: Option<Box<DeviceSlot>>,
}

/// The conv windows and recurrent states of every linear layer after each of the first rows of
/// one stepwise forward (a speculative verification), kept so that a rejected draft returns
/// to the state after the last kept row by a swap ([`Cache::return_to_row`]) instead of a
/// snapshot taken before and a rerun of the kept rows after. The buffers are reused from step
/// to step; a cloned cache starts without them.
#[derive(Debug, Default)]
pub struct RowStates {
    /// Rows to keep states after in the next stepwise forward (0: none).
    pub(crate) keep: usize,
    /// The cache position where that forward began.
    pub(crate) base: usize,
    /// Per layer (empty for attention layers), per kept row: (conv window, recurrent state).
    pub(crate) layers: Vec<Vec<(Vec<f32>, Vec<f32>)>>,
}

impl Clone for RowStates {
    /// Empty: the kept states belong to one verification of one cache.
    fn clone(&self) -> Self {
        RowStates::default()
    }
}

impl Cache {
    /// An empty cache (nothing processed) with these layers.
    pub fn new(layers: Vec<LayerCache>) -> Cache {
        Cache { layers, pos: 0, row_states: Box::default(), device: None }
    }

    /// An empty cache whose state lives on an accelerator (a model of frognano-gpu).
    pub fn on_device(state: Box<dyn DeviceState>) -> Cache {
        Cache { layers: Vec::new(), pos: 0, row_states: Box::default(), device: Some(Box::new(DeviceSlot(state))) }
    }

    /// Whether the state lives on an accelerator.
    pub fn is_on_device(&self) -> bool {
        self.device.is_some()
    }

    /// Tokens processed so far.
    pub fn len(&self) -> usize {
        self.pos
    }
    /// True when nothing has been processed.
    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }
    /// A snapshot to come back to later: the position plus a copy of every recurrent
    /// state. Keys and values are append-only, so they are not copied; restoring truncates
    /// them.
    pub fn snapshot(&self) -> CacheSnapshot {
        if let Some(d) = &self.device {
            return CacheSnapshot { pos: self.pos, linear: Vec::new(), device: Some(DeviceSlot(d.0.save())) };
        }
        let linear = self
            .layers
            .iter()
            .map(|l| match l {
                LayerCache::Linear { conv, state } => Some((conv.clone(), state.clone())),
                LayerCache::Attention { .. } => None,
            })
            .collect();
        CacheSnapshot { pos: self.pos, linear, device: None }
    }

    /// Returns to `snap`, taken earlier from this cache (and not from beyond a later restore
    /// to an earlier point). Fails if the cache no longer holds that many positions.
    pub fn restore(&mut self, snap: &CacheSnapshot) -> Result<(), String> {
        if let Some(d) = &mut self.device {
            let Some(saved) = &snap.device else { return Err("snapshot of a cache on the CPU".into()) };
            if snap.pos > self.pos {
                return Err(format!("snapshot at {} does not belong to this cache (at {})", snap.pos, self.pos));
            }
            d.0.restore(&*saved.0, snap.pos)?;
            self.pos = snap.pos;
            return Ok(());
        }
        if snap.pos > self.pos || snap.linear.len() != self.layers.len() {
            return Err(format!("snapshot at {} does not belong to this cache (at {})", snap.pos, self.pos));
        }
        self.row_states.keep = 0;
        for (l, s) in self.layers.iter_mut().zip(&snap.linear) {
            match (l, s) {
                (LayerCache::Attention { k, v }, None) => {
                    k.truncate(snap.pos);
                    v.truncate(snap.pos);
                }
                (LayerCache::Linear { conv, state }, Some((c, st))) => {
                    conv.clone_from(c);
                    state.clone_from(st);
                }
                _ => return Err("snapshot layout does not match the cache".into()),
            }
        }
        self.pos = snap.pos;
        Ok(())
    }

    /// Asks the next stepwise forward over this cache (`CausalLm::forward_stepwise`,
    /// `forward_batch_stepwise`) to keep every linear layer's state after each of its first
    /// `rows` rows, so that [`return_to_row`](Self::return_to_row) can bring the cache back to
    /// any of them; 0 stops keeping them (the buffers stay for the next time, until
    /// [`drop_row_states`](Self::drop_row_states)). A cache without linear layers keeps
    /// nothing: it cuts back by [`truncate`](Self::truncate).
    pub fn keep_row_states(&mut self, rows: usize) {
        let keep = if self.is_rewindable() || self.device.is_some() { 0 } else { rows };
        self.row_states.keep = keep;
        self.row_states.base = self.pos;
        self.row_states.layers.resize_with(self.layers.len(), Vec::new);
        for (kept, layer) in self.row_states.layers.iter_mut().zip(&self.layers) {
            if matches!(layer, LayerCache::Linear { .. }) && kept.len() < keep {
                kept.resize_with(keep, Default::default);
            }
        }
    }

    /// Keeps every linear layer's current state as the state after row `row` of the stepwise
    /// forward under way, when the cache was asked to keep that row
    /// ([`keep_row_states`](Self::keep_row_states)); otherwise nothing. For implementations of
    /// `CausalLm::forward_stepwise` that run the rows one forward at a time.
    pub fn keep_state_after_row(&mut self, row: usize) {
        if row >= self.row_states.keep {
            return;
        }
        for (layer, kept) in self.layers.iter().zip(&mut self.row_states.layers) {
            if let (LayerCache::Linear { conv, state }, Some((c, s))) = (layer, kept.get_mut(row)) {
                c.clone_from(conv);
                s.clone_from(state);
            }
        }
    }

    /// Bytes of state one kept row costs (every linear layer's conv window and recurrent
    /// state): what [`keep_row_states`](Self::keep_row_states) holds per row.
    pub fn row_state_bytes(&self) -> usize {
        if self.device.is_some() {
            // Row states are not kept on a device: far over any budget, so a verification
            // takes a snapshot instead.
            return 1 << 40;
        }
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Linear { conv, state } => (conv.len() + state.len()) * 4,
                LayerCache::Attention { .. } => 0,
            })
            .sum()
    }

    /// Brings the cache back to the state after the first `rows` rows of the stepwise forward
    /// run since [`keep_row_states`](Self::keep_row_states) (1 ≤ `rows` ≤ the rows kept, or
    /// the forward's full length, which changes nothing): the kept recurrent states are
    /// swapped in and the keys and values cut back. Stops keeping row states.
    pub fn return_to_row(&mut self, rows: usize) -> Result<(), String> {
        let RowStates { keep, base, .. } = *self.row_states;
        self.row_states.keep = 0;
        let end = base + rows;
        if end == self.pos {
            return Ok(());
        }
        if rows == 0 || rows > keep || end > self.pos {
            return Err(format!(
                "the cache kept the states of {keep} rows from position {base}; row {rows} (position {end}) is not \
                 among them (the cache is at {})",
                self.pos
            ));
        }
        for (layer, kept) in self.layers.iter_mut().zip(&mut self.row_states.layers) {
            match layer {
                LayerCache::Attention { k, v } => {
                    k.truncate(end);
                    v.truncate(end);
                }
                LayerCache::Linear { conv, state } => {
                    let (c, s) = &mut kept[rows - 1];
                    std::mem::swap(conv, c);
                    std::mem::swap(state, s);
                }
            }
        }
        self.pos = end;
        Ok(())
    }

    /// A CPU cache holding this cache's state (a copy from the device for a cache on an
    /// accelerator, a plain clone otherwise): what is saved to disk.
    pub fn to_host(&self) -> Cache {
        match &self.device {
            Some(d) => Cache { layers: d.0.to_host(self.pos), pos: self.pos, row_states: Box::default(), device: None },
            None => self.clone(),
        }
    }

    /// An empty CPU cache with this cache's layout (a device cache's too), to load a saved
    /// state into before [`Cache::load_host`].
    pub fn host_template(&self) -> Result<Cache, String> {
        let layers = self
            .layout()
            .into_iter()
            .map(|l| match l {
                LayerLayout::Attention { kv_type, width, head_dim } => {
                    let ty: KvType = kv_type.parse()?;
                    Ok(LayerCache::Attention {
                        k: KvRows::new(ty, width, head_dim),
                        v: KvRows::new(ty, width, head_dim),
                    })
                }
                LayerLayout::Linear { conv, state } => {
                    Ok(LayerCache::Linear { conv: vec![0.0; conv], state: vec![0.0; state] })
                }
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Cache::new(layers))
    }

    /// Makes this cache hold `host`'s state (a CPU cache of the same layout): uploaded for a
    /// cache on an accelerator, moved in otherwise.
    pub fn load_host(&mut self, host: Cache) -> Result<(), String> {
        if host.layout() != self.layout() {
            return Err("the saved state's layers do not match this model's".into());
        }
        match &mut self.device {
            Some(d) => d.0.load_host(&host.layers, host.pos)?,
            None => self.layers = host.layers,
        }
        self.pos = host.pos;
        Ok(())
    }

    /// Frees the buffers of [`keep_row_states`](Self::keep_row_states) (a finished reply's
    /// session keeps only its state).
    pub fn drop_row_states(&mut self) {
        *self.row_states = RowStates::default();
    }

    /// Each layer's shape ([`LayerLayout`]).
    pub fn layout(&self) -> Vec<LayerLayout> {
        if let Some(d) = &self.device {
            return d.0.layout();
        }
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Attention { k, .. } => LayerLayout::Attention {
                    kv_type: k.kv_type().to_string(),
                    width: k.width(),
                    head_dim: k.head_dim(),
                },
                LayerCache::Linear { conv, state } => LayerLayout::Linear { conv: conv.len(), state: state.len() },
            })
            .collect()
    }

    /// True when every layer can be rewound to any earlier position without a snapshot
    /// (pure attention models).
    pub fn is_rewindable(&self) -> bool {
        if let Some(d) = &self.device {
            return d.0.is_rewindable();
        }
        self.layers.iter().all(|l| matches!(l, LayerCache::Attention { .. }))
    }

    /// Rewinds an attention-only cache to `pos` tokens.
    pub fn truncate(&mut self, pos: usize) -> Result<(), String> {
        if !self.is_rewindable() {
            return Err("a cache with recurrent (linear-attention) state can only return to a snapshot".into());
        }
        if let Some(d) = &mut self.device {
            let pos = pos.min(self.pos);
            d.0.truncate(pos)?;
            self.pos = pos;
            return Ok(());
        }
        let snap = CacheSnapshot { pos: pos.min(self.pos), linear: vec![None; self.layers.len()], device: None };
        self.restore(&snap)
    }

    /// Bytes of state held (for memory reports).
    pub fn byte_len(&self) -> usize {
        if let Some(d) = &self.device {
            return d.0.byte_len();
        }
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Attention { k, v } => k.byte_len() + v.byte_len(),
                LayerCache::Linear { conv, state } => (conv.len() + state.len()) * 4,
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect()
    }

    #[test]
    fn rows_take_the_bytes_of_their_type_and_read_back() {
        let (w, dh) = (192, 64);
        // Values in about ±7.2: a Q8_0 step is 7.2/127, half of it the worst rounding; Q4_0's
        // is 7.2/8, and a whole step where a block's largest value has the other sign (ggml
        // clamps the top nibble at +7 steps).
        let x = values(3 * w);
        for (ty, per_row, tol) in
            [(KvType::F32, 768, 0.0), (KvType::F16, 384, 4e-3), (KvType::Q8_0, 204, 0.03), (KvType::Q4_0, 108, 0.93)]
        {
            let mut r = KvRows::new(ty, w, dh);
            r.push(&x[..w]);
            r.push(&x[w..]);
            assert_eq!((r.len(), r.byte_len(), ty.row_bytes(w)), (3, 3 * per_row, per_row), "{ty}");
            let all = r.to_f32();
            let worst = all.iter().zip(&x).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(worst <= tol, "{ty}: read back {worst} off (allowed {tol})");
            let mut head = vec![0.0; dh];
            r.head_into(2, 1, &mut head);
            assert_eq!(head, all[2 * w + dh..2 * w + 2 * dh], "{ty}: one head equals its part of the row");
            r.truncate(1);
            assert_eq!((r.len(), r.byte_len()), (1, per_row), "{ty} truncated");
            assert_eq!(r.to_f32(), all[..w], "{ty}: truncation keeps the first rows");
        }
    }

    #[test]
    fn raw_rows_copy_back_to_the_same_values() {
        let (w, dh) = (64, 32);
        let x = values(4 * w);
        for ty in [KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q4_0] {
            let mut r = KvRows::new(ty, w, dh);
            r.push(&x);
            let mut copy = KvRows::new(ty, w, dh);
            copy.push_raw(r.raw_rows(0..1)).unwrap();
            copy.push_raw(r.raw_rows(1..4)).unwrap();
            assert_eq!((copy.len(), copy.to_f32()), (4, r.to_f32()), "{ty}");
            assert_eq!(r.raw_rows(3..9).len(), ty.row_bytes(w), "{ty}: rows past the end are left out");
            let e = copy.push_raw(&r.raw_rows(0..1)[1..]).unwrap_err();
            assert!(e.contains("not whole") && copy.len() == 4, "{ty}: {e}");
        }
    }

    #[test]
    fn f16_rows_hold_the_f16_rounding_exactly() {
        let x = values(64);
        let mut r = KvRows::new(KvType::F16, 64, 64);
        r.push(&x);
        let want: Vec<f32> = x.iter().map(|&v| crate::kernels::round_f16(v)).collect();
        assert_eq!(r.to_f32(), want);
    }

    #[test]
    fn a_cache_returns_to_a_kept_row_and_refuses_rows_it_did_not_keep() {
        let linear = |x: f32| LayerCache::Linear { conv: vec![x; 4], state: vec![x; 8] };
        let mut c = Cache::new(vec![LayerCache::attention(KvType::F32, 1, 4), linear(0.0)]);
        c.keep_row_states(2);
        // What a stepwise forward of three rows leaves: states after rows 0 and 1 kept, the
        // cache itself after row 2.
        for (row, x) in [1.0f32, 2.0, 3.0].into_iter().enumerate() {
            if let LayerCache::Attention { k, v } = &mut c.layers[0] {
                k.push(&[x; 4]);
                v.push(&[x; 4]);
            }
            if row < 2 {
                c.row_states.layers[1][row] = (vec![x; 4], vec![x; 8]);
            }
            c.pos += 1;
        }
        c.layers[1] = linear(3.0);
        let mut again = c.clone();
        assert!(again.return_to_row(1).unwrap_err().contains("kept the states of 0 rows"), "a clone keeps none");
        assert!(c.clone().return_to_row(3).is_ok(), "the full length changes nothing");
        c.return_to_row(2).unwrap();
        assert_eq!(c.pos, 2);
        let LayerCache::Linear { conv, state } = &c.layers[1] else { unreachable!() };
        assert!(conv.iter().chain(state).all(|&v| v == 2.0), "{conv:?} {state:?}");
        let LayerCache::Attention { k, .. } = &c.layers[0] else { unreachable!() };
        assert_eq!(k.len(), 2);
        // Once returned, nothing is kept any more.
        let err = c.return_to_row(1).unwrap_err();
        assert!(err.contains("kept the states of 0 rows from position 0"), "{err}");
        // An attention-only cache keeps nothing: it cuts back by truncation.
        let mut a = Cache::new(vec![LayerCache::attention(KvType::F32, 1, 4)]);
        a.keep_row_states(3);
        assert_eq!(a.row_states.keep, 0);
        assert_eq!(c.row_state_bytes(), (4 + 8) * 4);
    }

    #[test]
    fn kv_type_names_parse_and_bad_ones_are_named() {
        for ty in [KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q4_0] {
            assert_eq!(ty.to_string().parse::<KvType>(), Ok(ty));
        }
        let e = "q5_k".parse::<KvType>().unwrap_err();
        assert!(e.contains("q5_k") && e.contains("q8_0"), "{e}");
        assert!(KvType::Q8_0.check_head_dim(80).unwrap_err().contains("head_dim 80"));
        assert!(KvType::F16.check_head_dim(80).is_ok());
    }
}
