//! GGUF files (versions 2 and 3): header, metadata of every value type, tensor infos, and
//! tensors memory-mapped in place.
//!
//! Layout (little-endian): magic `GGUF`, version u32, tensor count u64, metadata count u64;
//! then the metadata `(key string, type u32, value)`; then per tensor `(name string, n_dims
//! u32, dims u64 × n_dims (ne0 = innermost first), ggml type u32, offset u64)`; then padding to
//! `general.alignment` (default 32) and the tensor data, each tensor at its offset from there.
//!
//! Every count, length and offset is checked against the bytes actually present before it is
//! used, so a corrupt or truncated file is a [`ModelError::Format`] naming the file and what is
//! wrong — never a panic or a huge allocation.
//!
//! ```no_run
//! let f = frognano_model::gguf::GgufFile::open("models/SmolLM2-135M-Instruct.Q4_1.gguf").unwrap();
//! assert_eq!(f.get_str("general.architecture").unwrap(), Some("llama"));
//! let emb = f.matrix("token_embd.weight", 49152, 576).unwrap();
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{ModelError, Result};
use crate::quant::QuantType;
use crate::tensor::{to_f32_vec, Bytes, DType, Matrix};

/// `GGUF` read as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Tensor data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest nesting of arrays accepted in metadata.
const MAX_ARRAY_DEPTH: usize = 4;
/// Most dimensions a ggml tensor has.
const MAX_DIMS: u32 = 4;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7.
    Bool(bool),
    /// Type 8 (UTF-8; invalid sequences are replaced by U+FFFD).
    String(String),
    /// Type 9: element type id and elements (all of that type).
    Array(u32, Vec<MetaValue>),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

impl MetaValue {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v as u64),
            MetaValue::U16(v) => Some(v as u64),
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v as i64),
            MetaValue::I16(v) => Some(v as i64),
            MetaValue::I32(v) => Some(v as i64),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }
    /// The value as a float (floats and integers).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }
    /// The string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }
    /// The bool, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }
    /// The elements, if it is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(_, v) => Some(v),
            _ => None,
        }
    }
    /// GGUF type name, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::F32(_) => "f32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(..) => "array",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F64(_) => "f64",
        }
    }
}

/// Where one tensor lies and what it holds.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the innermost (row length).
    pub dims: Vec<usize>,
    /// Storage type.
    pub dtype: DType,
    /// Absolute byte offset in the file.
    pub start: usize,
    /// Bytes of data.
    pub len: usize,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> usize {
        self.dims.iter().product()
    }
}

/// ggml's name for a type id (for messages about types we do not run).
fn ggml_type_name(id: u32) -> &'static str {
    match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => "unknown",
    }
}

/// The [`DType`] of a ggml type id, if FrogNano runs it.
pub fn dtype_from_ggml(id: u32) -> Option<DType> {
    Some(match id {
        0 => DType::F32,
        1 => DType::F16,
        30 => DType::BF16,
        _ => DType::Quant(QuantType::ALL.into_iter().find(|q| q.ggml_id() == id)?),
    })
}

/// The ggml type id of a [`DType`].
pub fn ggml_id(dtype: DType) -> u32 {
    match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 30,
        DType::Quant(q) => q.ggml_id(),
    }
}

/// An opened GGUF file.
pub struct GgufFile {
    path: PathBuf,
    data: Arc<dyn AsRef<[u8]> + Send + Sync>,
    /// `data` again when it is a file map (for [`crate::tensor::Bytes::release_pages`]).
    map: Option<Arc<memmap2::Mmap>>,
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// A bounds-checked little-endian reader over the header.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn err(&self, msg: impl std::fmt::Display) -> ModelError {
        ModelError::format(self.path, format!("{msg} (at byte {})", self.pos))
    }
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "truncated: {what} needs {n} bytes but only {} remain in the {}-byte file",
                self.remaining(),
                self.buf.len()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    /// A count that must fit in memory given at least `min_size` bytes per item.
    fn count(&mut self, what: &str, min_size: usize) -> Result<usize> {
        let n = self.u64(what)?;
        let limit = (self.remaining() / min_size.max(1)) as u64;
        if n > limit {
            return Err(self.err(format!(
                "{what} is {n}, but the {} bytes left could hold at most {limit}: the file is truncated or corrupt",
                self.remaining()
            )));
        }
        Ok(n as usize)
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(&format!("length of {what}"), 1)?;
        let b = self.take(n, what)?;
        Ok(String::from_utf8_lossy(b).into_owned())
    }
    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<MetaValue> {
        Ok(match ty {
            0 => MetaValue::U8(self.array::<1>(key)?[0]),
            1 => MetaValue::I8(self.array::<1>(key)?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => MetaValue::U32(self.u32(key)?),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => match self.array::<1>(key)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(self.err(format!("metadata `{key}`: bool byte is {b}, not 0 or 1"))),
            },
            8 => MetaValue::String(self.string(&format!("metadata `{key}`"))?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(format!("metadata `{key}`: arrays nested deeper than {MAX_ARRAY_DEPTH}")));
                }
                let ety = self.u32(&format!("element type of metadata `{key}`"))?;
                let min = match ety {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    other => {
                        return Err(
                            self.err(format!("metadata `{key}`: unknown array element type {other} (valid: 0..=12)"))
                        )
                    }
                };
                let n = self.count(&format!("element count of metadata `{key}`"), min)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(ety, key, depth + 1)?);
                }
                MetaValue::Array(ety, v)
            }
            10 => MetaValue::U64(self.u64(key)?),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(key)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(key)?)),
            other => return Err(self.err(format!("metadata `{key}`: unknown value type {other} (valid: 0..=12)"))),
        })
    }
}

impl GgufFile {
    /// Opens and memory-maps `path`, validating the header and every tensor's range.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
        // SAFETY: read-only map; a file changed underneath us is the user's problem (as for
        // every mmap-based loader).
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        let map = Arc::new(mmap);
        Ok(GgufFile { map: Some(map.clone()), ..Self::from_bytes(map, path)? })
    }

    /// Parses a GGUF image held in memory; `path` names it in errors.
    pub fn from_bytes(data: Arc<dyn AsRef<[u8]> + Send + Sync>, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let buf: &[u8] = (*data).as_ref();
        let mut r = Reader { buf, pos: 0, path };
        let magic = r.u32("magic")?;
        if magic != GGUF_MAGIC {
            return Err(ModelError::format(
                path,
                format!("not a GGUF file: magic is {:02x?}, expected \"GGUF\"", magic.to_le_bytes()),
            ));
        }
        let version = r.u32("version")?;
        match version {
            2 | 3 => {}
            1 => return Err(ModelError::format(path, "GGUF version 1 is not supported (only 2 and 3)")),
            v if v.swap_bytes() <= 3 => {
                return Err(ModelError::format(path, "big-endian GGUF files are not supported"));
            }
            v => return Err(ModelError::format(path, format!("unknown GGUF version {v} (supported: 2, 3)"))),
        }
        // A tensor info is at least 24 bytes (empty name length, n_dims, type, offset).
        let n_tensors = r.count("tensor count", 24)?;
        // A key-value pair is at least 13 bytes (key length, type, a one-byte value).
        let n_kv = r.count("metadata count", 13)?;
        let mut metadata = Vec::with_capacity(n_kv);
        for i in 0..n_kv {
            let key = r.string(&format!("key of metadata entry {i}"))?;
            let ty = r.u32(&format!("type of metadata `{key}`"))?;
            let v = r.value(ty, &key, 0)?;
            metadata.push((key, v));
        }
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => return Err(ModelError::format(path, format!("general.alignment {v:?} is not a power of two"))),
            },
        };
        let mut raw = Vec::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = r.string(&format!("name of tensor {i}"))?;
            let n_dims = r.u32(&format!("dimension count of tensor `{name}`"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(r.err(format!("tensor `{name}` has {n_dims} dimensions (1..={MAX_DIMS} allowed)")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64(&format!("dimensions of tensor `{name}`"))?);
            }
            let ty = r.u32(&format!("type of tensor `{name}`"))?;
            let offset = r.u64(&format!("offset of tensor `{name}`"))?;
            raw.push((name, dims, ty, offset));
        }
        let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
        let file_len = buf.len() as u64;
        let mut tensors = Vec::with_capacity(n_tensors);
        for (name, dims, ty, offset) in raw {
            let bad = |msg: String| ModelError::format(path, format!("tensor `{name}`: {msg}"));
            let dtype = dtype_from_ggml(ty).ok_or_else(|| {
                bad(format!(
                    "type {} (ggml id {ty}) is not supported; supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, \
                     Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS",
                    ggml_type_name(ty)
                ))
            })?;
            let elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let Some(elements) = elements.filter(|&e| e <= file_len.saturating_mul(8)) else {
                return Err(bad(format!("dimensions {dims:?} describe more elements than the file could hold")));
            };
            let _ = elements;
            if dims[0] % dtype.block_size() as u64 != 0 {
                return Err(bad(format!(
                    "row length {} is not a multiple of the {} block size {}",
                    dims[0],
                    dtype.name(),
                    dtype.block_size()
                )));
            }
            let Some(row) = dtype.row_bytes(dims[0] as usize) else {
                return Err(bad(format!("row length {} of {} is too large", dims[0], dtype.name())));
            };
            let row = row as u64;
            let len = dims[1..].iter().try_fold(row, |a, &d| a.checked_mul(d));
            if !offset.is_multiple_of(alignment) {
                return Err(bad(format!("offset {offset} is not a multiple of the alignment {alignment}")));
            }
            let start = data_start.checked_add(offset);
            let end = len.and_then(|l| start.and_then(|s| s.checked_add(l)));
            match (start, end) {
                (Some(start), Some(end)) if end <= file_len => tensors.push(TensorInfo {
                    name: name.clone(),
                    dims: dims.iter().map(|&d| d as usize).collect(),
                    dtype,
                    start: start as usize,
                    len: (end - start) as usize,
                }),
                _ => {
                    return Err(bad(format!(
                        "data at offset {offset} ({} bytes) runs past the end of the {file_len}-byte file \
                         (data section starts at {data_start}); the file is truncated or corrupt",
                        len.map_or("overflowing".to_string(), |l| l.to_string())
                    )))
                }
            }
        }
        let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(ModelError::format(path, format!("tensor `{}` appears twice", w[0])));
        }
        Ok(GgufFile { path: path.to_path_buf(), data, map: None, version, metadata, tensors, alignment })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }
    /// Tensor data alignment.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    /// Size of the file in bytes.
    pub fn byte_len(&self) -> usize {
        (*self.data).as_ref().len()
    }
    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }
    /// All tensors, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
    /// A tensor's info.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
    /// True when a tensor of that name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensor(name).is_some()
    }

    fn wrong_type(&self, key: &str, want: &str, v: &MetaValue) -> ModelError {
        ModelError::format(&self.path, format!("metadata `{key}` is {} {v:?}, expected {want}", v.type_name()))
    }
    fn missing(&self, key: &str) -> ModelError {
        ModelError::format(&self.path, format!("metadata `{key}` is missing"))
    }

    /// An unsigned integer value (any integer width), `None` when absent.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.get(key).map(|v| v.as_u64().ok_or_else(|| self.wrong_type(key, "an unsigned integer", v))).transpose()
    }
    /// A required unsigned integer as `usize`.
    pub fn req_usize(&self, key: &str) -> Result<usize> {
        let v = self.get_u64(key)?.ok_or_else(|| self.missing(key))?;
        usize::try_from(v).map_err(|_| ModelError::format(&self.path, format!("metadata `{key}` = {v} is too large")))
    }
    /// A float value (floats or integers), `None` when absent.
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        self.get(key).map(|v| v.as_f64().ok_or_else(|| self.wrong_type(key, "a number", v))).transpose()
    }
    /// A string value, `None` when absent.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key).map(|v| v.as_str().ok_or_else(|| self.wrong_type(key, "a string", v))).transpose()
    }
    /// A bool value, `None` when absent.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key).map(|v| v.as_bool().ok_or_else(|| self.wrong_type(key, "a bool", v))).transpose()
    }
    /// An array of strings, `None` when absent.
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let arr = v.as_array().ok_or_else(|| self.wrong_type(key, "an array of strings", v))?;
        arr.iter()
            .map(|e| e.as_str().ok_or_else(|| self.wrong_type(key, "an array of strings", v)))
            .collect::<Result<_>>()
            .map(Some)
    }
    /// An array of integers, `None` when absent.
    pub fn get_i64_array(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let arr = v.as_array().ok_or_else(|| self.wrong_type(key, "an array of integers", v))?;
        arr.iter()
            .map(|e| e.as_i64().ok_or_else(|| self.wrong_type(key, "an array of integers", v)))
            .collect::<Result<_>>()
            .map(Some)
    }

    /// An array of numbers (floats or integers) as `f64`, `None` when absent.
    pub fn get_f64_array(&self, key: &str) -> Result<Option<Vec<f64>>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let arr = v.as_array().ok_or_else(|| self.wrong_type(key, "an array of numbers", v))?;
        arr.iter()
            .map(|e| e.as_f64().ok_or_else(|| self.wrong_type(key, "an array of numbers", v)))
            .collect::<Result<_>>()
            .map(Some)
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name).ok_or_else(|| ModelError::MissingTensor { path: self.path.clone(), name: name.to_string() })
    }

    /// The raw bytes of a tensor (in the file's type and layout).
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        let t = self.info(name)?;
        Ok(&(*self.data).as_ref()[t.start..t.start + t.len])
    }

    /// A `[rows, cols]` weight (ggml dims `[cols, rows]`, trailing 1s allowed), memory-mapped.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let t = self.info(name)?;
        let mut dims = t.dims.clone();
        while dims.len() > 2 && dims.last() == Some(&1) {
            dims.pop();
        }
        if dims.len() == 1 {
            dims.push(1);
        }
        if dims != [cols, rows] {
            return Err(ModelError::Shape {
                path: self.path.clone(),
                name: name.to_string(),
                expected: vec![rows, cols],
                found: t.dims.iter().rev().copied().collect(),
            });
        }
        let bytes = match &self.map {
            Some(map) => Bytes::mapped(map.clone(), t.start, t.len),
            None => Bytes::new(self.data.clone(), t.start, t.len),
        };
        Ok(Matrix::new(rows, cols, t.dtype, bytes))
    }

    /// A tensor with exactly `elements` values, widened/dequantized to f32 (norms, biases, small
    /// parameters).
    pub fn f32(&self, name: &str, elements: usize) -> Result<Vec<f32>> {
        let t = self.info(name)?;
        if t.elements() != elements {
            return Err(ModelError::Shape {
                path: self.path.clone(),
                name: name.to_string(),
                expected: vec![elements],
                found: t.dims.iter().rev().copied().collect(),
            });
        }
        Ok(to_f32_vec(self.tensor_bytes(name)?, t.dtype))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ggml_id_round_trips() {
        for id in 0..64 {
            if let Some(d) = dtype_from_ggml(id) {
                assert_eq!(ggml_id(d), id);
                assert_eq!(d.name(), ggml_type_name(id));
            }
        }
    }
}
