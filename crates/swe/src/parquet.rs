//! A small, dependency-free reader for the parquet files SWE-bench is published in (the
//! Hugging Face `datasets` writer: pyarrow, snappy, dictionary pages).
//!
//! It reads what those files hold: flat columns of strings, integers, floats and booleans,
//! nullable or not, and lists of such values (the standard three-level `LIST` layout and the
//! legacy two-level one); data pages v1 and v2; PLAIN and dictionary encodings; SNAPPY or no
//! compression. Anything else (other codecs, DELTA encodings, structs, maps) is a clear error
//! naming the column, never a panic. Each row becomes a JSON object, the shape the SWE-bench
//! loaders see after `pandas.read_parquet`.

use serde_json::{Map, Number, Value};

/// A parquet file that cannot be read: what, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParquetError(pub String);

/// A value that cannot be turned into JSON: its 0-based row, its column, the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueError {
    /// 0-based row index.
    pub row: usize,
    /// Column name.
    pub field: String,
    /// What is wrong.
    pub problem: String,
}

/// Why [`read_rows`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// The file's structure (footer, schema, pages) cannot be read.
    #[error("{0}")]
    File(ParquetError),
    /// One value cannot be converted.
    #[error("row {}: field `{}`: {}", .0.row, .0.field, .0.problem)]
    Value(ValueError),
}

impl From<ParquetError> for ReadError {
    fn from(e: ParquetError) -> Self {
        ReadError::File(e)
    }
}

type Result<T> = std::result::Result<T, ParquetError>;

fn err<T>(msg: impl Into<String>) -> Result<T> {
    Err(ParquetError(msg.into()))
}

// ---------------------------------------------------------------------------------------
// Thrift compact protocol (the encoding of the footer and of page headers).

#[derive(Debug, Clone)]
enum TValue {
    Bool(bool),
    Int(i64),
    Double,
    Binary(Vec<u8>),
    List(Vec<TValue>),
    Struct(Vec<(i16, TValue)>),
    Map,
}

struct Thrift<'a> {
    buf: &'a [u8],
    pos: usize,
    depth: usize,
}

impl<'a> Thrift<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Thrift { buf, pos: 0, depth: 0 }
    }

    fn byte(&mut self) -> Result<u8> {
        let b = *self.buf.get(self.pos).ok_or_else(|| ParquetError("thrift data ends early".into()))?;
        self.pos += 1;
        Ok(b)
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.buf.len());
        let end = end.ok_or_else(|| ParquetError("thrift data ends early".into()))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn varint(&mut self) -> Result<u64> {
        let mut out = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            out |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(out);
            }
        }
        err("thrift varint too long")
    }

    fn zigzag(&mut self) -> Result<i64> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    fn value(&mut self, ty: u8) -> Result<TValue> {
        Ok(match ty {
            1 => TValue::Bool(true),
            2 => TValue::Bool(false),
            3 => TValue::Int(self.byte()? as i8 as i64),
            4..=6 => TValue::Int(self.zigzag()?),
            7 => {
                self.bytes(8)?;
                TValue::Double
            }
            8 => {
                let n = self.varint()? as usize;
                TValue::Binary(self.bytes(n)?.to_vec())
            }
            9 | 10 => {
                let h = self.byte()?;
                let n = if h >> 4 == 15 { self.varint()? as usize } else { (h >> 4) as usize };
                let ety = h & 0x0f;
                anyhow_limit(n, self.buf.len())?;
                let mut items = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    items.push(if ety == 1 || ety == 2 {
                        // Booleans inside lists are one byte each.
                        TValue::Bool(self.byte()? == 1)
                    } else {
                        self.nested(ety)?
                    });
                }
                TValue::List(items)
            }
            11 => {
                let n = self.varint()? as usize;
                anyhow_limit(n, self.buf.len())?;
                if n > 0 {
                    let kv = self.byte()?;
                    for _ in 0..n {
                        self.nested(kv >> 4)?;
                        self.nested(kv & 0x0f)?;
                    }
                }
                TValue::Map
            }
            12 => self.nested(12)?,
            other => return err(format!("thrift: unknown type {other}")),
        })
    }

    fn nested(&mut self, ty: u8) -> Result<TValue> {
        if ty != 12 {
            return self.value(ty);
        }
        self.depth += 1;
        if self.depth > 64 {
            return err("thrift: structures nested too deep");
        }
        let mut fields = Vec::new();
        let mut last: i16 = 0;
        loop {
            let h = self.byte()?;
            let ty = h & 0x0f;
            if ty == 0 {
                break;
            }
            let delta = h >> 4;
            let id = if delta == 0 { self.zigzag()? as i16 } else { last.wrapping_add(i16::from(delta)) };
            last = id;
            let v = self.value(ty)?;
            fields.push((id, v));
        }
        self.depth -= 1;
        Ok(TValue::Struct(fields))
    }

    fn read_struct(&mut self) -> Result<Vec<(i16, TValue)>> {
        match self.nested(12)? {
            TValue::Struct(f) => Ok(f),
            _ => err("thrift: expected a struct"),
        }
    }
}

fn anyhow_limit(n: usize, len: usize) -> Result<()> {
    if n > len {
        return err(format!("thrift: collection of {n} items in {len} bytes"));
    }
    Ok(())
}

fn field(s: &[(i16, TValue)], id: i16) -> Option<&TValue> {
    s.iter().find(|(i, _)| *i == id).map(|(_, v)| v)
}

fn int(s: &[(i16, TValue)], id: i16) -> Option<i64> {
    match field(s, id) {
        Some(TValue::Int(v)) => Some(*v),
        _ => None,
    }
}

fn need_int(s: &[(i16, TValue)], id: i16, what: &str) -> Result<i64> {
    int(s, id).ok_or_else(|| ParquetError(format!("metadata: {what} missing")))
}

fn string(s: &[(i16, TValue)], id: i16) -> Option<String> {
    match field(s, id) {
        Some(TValue::Binary(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

fn list(s: &[(i16, TValue)], id: i16) -> &[TValue] {
    match field(s, id) {
        Some(TValue::List(l)) => l,
        _ => &[],
    }
}

fn strukt(v: &TValue) -> &[(i16, TValue)] {
    match v {
        TValue::Struct(f) => f,
        _ => &[],
    }
}

// ---------------------------------------------------------------------------------------
// Snappy (raw block format, as parquet stores it).

fn snappy_decompress(src: &[u8], expected: usize) -> Result<Vec<u8>> {
    let mut t = Thrift::new(src);
    let len = t.varint()? as usize;
    if len != expected {
        return err(format!("snappy: block says {len} bytes, page header says {expected}"));
    }
    let mut out: Vec<u8> = Vec::with_capacity(len);
    while t.pos < src.len() {
        let tag = t.byte()?;
        let (copy_len, offset) = match tag & 3 {
            0 => {
                let mut n = (tag >> 2) as usize;
                if n >= 60 {
                    let extra = n - 59;
                    n = t.bytes(extra)?.iter().rev().fold(0usize, |acc, b| (acc << 8) | *b as usize);
                }
                out.extend_from_slice(t.bytes(n + 1)?);
                continue;
            }
            1 => (((tag >> 2) & 7) as usize + 4, (((tag >> 5) as usize) << 8) | t.byte()? as usize),
            2 => {
                let b = t.bytes(2)?;
                ((tag >> 2) as usize + 1, u16::from_le_bytes([b[0], b[1]]) as usize)
            }
            _ => {
                let b = t.bytes(4)?;
                ((tag >> 2) as usize + 1, u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            }
        };
        if offset == 0 || offset > out.len() {
            return err("snappy: copy offset out of range");
        }
        let start = out.len() - offset;
        for i in 0..copy_len {
            let b = out[start + i];
            out.push(b);
        }
        if out.len() > len {
            return err("snappy: output longer than declared");
        }
    }
    if out.len() != len {
        return err(format!("snappy: got {} bytes, expected {len}", out.len()));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Schema.

#[derive(Debug, Clone)]
struct SchemaNode {
    name: String,
    physical: Option<i64>,
    repetition: i64,
    children: Vec<SchemaNode>,
}

fn build_schema(elems: &[TValue], pos: &mut usize, depth: usize) -> Result<SchemaNode> {
    let e = strukt(elems.get(*pos).ok_or_else(|| ParquetError("metadata: schema ends early".into()))?);
    *pos += 1;
    if depth > 32 {
        return err("metadata: schema nested too deep");
    }
    let n_children = int(e, 5).unwrap_or(0).max(0) as usize;
    let mut node = SchemaNode {
        name: string(e, 4).unwrap_or_default(),
        physical: if n_children == 0 { int(e, 1) } else { None },
        repetition: int(e, 3).unwrap_or(0),
        children: Vec::new(),
    };
    for _ in 0..n_children {
        node.children.push(build_schema(elems, pos, depth + 1)?);
    }
    Ok(node)
}

const REQUIRED: i64 = 0;
const REPEATED: i64 = 2;

/// A top-level column and how its one leaf maps back to values.
#[derive(Debug, Clone)]
struct Column {
    name: String,
    physical: i64,
    max_def: i16,
    max_rep: i16,
    /// For lists: definition level at which the list itself is present (below: null).
    list_def: i16,
    /// For lists: definition level at which an element exists (below: empty list).
    elem_def: i16,
    is_list: bool,
}

fn columns_of(root: &SchemaNode) -> Result<Vec<Column>> {
    let mut out = Vec::new();
    for top in &root.children {
        let unsupported =
            || ParquetError(format!("column `{}`: only flat columns and lists of values are supported", top.name));
        let mut def = 0i16;
        let mut rep = 0i16;
        let mut node = top;
        let mut list_def = 0;
        let mut elem_def = 0;
        let mut is_list = false;
        loop {
            match node.repetition {
                REQUIRED => {}
                REPEATED => {
                    if is_list {
                        return Err(unsupported());
                    }
                    is_list = true;
                    list_def = def;
                    def += 1;
                    rep += 1;
                    elem_def = def;
                }
                _ => def += 1,
            }
            match node.children.as_slice() {
                [] => break,
                [only] => node = only,
                _ => return Err(unsupported()),
            }
        }
        let physical = node.physical.ok_or_else(unsupported)?;
        out.push(Column { name: top.name.clone(), physical, max_def: def, max_rep: rep, list_def, elem_def, is_list });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Pages.

#[derive(Debug, Clone)]
enum PVal {
    Bool(bool),
    Int(i64),
    Float(f64),
    Bytes(Vec<u8>),
}

/// RLE / bit-packed hybrid decoder; returns `count` values.
fn rle_hybrid(data: &[u8], bit_width: u32, count: usize) -> Result<Vec<u32>> {
    if bit_width > 32 {
        return err(format!("bit width {bit_width} out of range"));
    }
    let mut out = Vec::with_capacity(count.min(1 << 20));
    let mut t = Thrift::new(data);
    let byte_width = bit_width.div_ceil(8) as usize;
    while out.len() < count {
        let header = t.varint()?;
        if header & 1 == 1 {
            let groups = (header >> 1) as usize;
            let bytes = t.bytes(
                groups.checked_mul(bit_width as usize).ok_or_else(|| ParquetError("bit-packed run too long".into()))?,
            )?;
            let total = groups * 8;
            for i in 0..total {
                if out.len() >= count {
                    break;
                }
                let mut v = 0u32;
                for b in 0..bit_width as usize {
                    let bit = i * bit_width as usize + b;
                    if bytes[bit / 8] >> (bit % 8) & 1 == 1 {
                        v |= 1 << b;
                    }
                }
                out.push(v);
            }
        } else {
            let run = (header >> 1) as usize;
            let raw = t.bytes(byte_width)?;
            let v = raw.iter().rev().fold(0u32, |acc, b| (acc << 8) | *b as u32);
            if run == 0 {
                return err("empty RLE run");
            }
            let n = run.min(count - out.len());
            out.extend(std::iter::repeat_n(v, n));
        }
    }
    Ok(out)
}

fn bit_width(max: i16) -> u32 {
    16 - (max as u16).leading_zeros()
}

fn plain_values(data: &[u8], physical: i64, count: usize, col: &str) -> Result<Vec<PVal>> {
    let mut out = Vec::with_capacity(count.min(1 << 20));
    let mut t = Thrift::new(data);
    let short = |_| ParquetError(format!("column `{col}`: value data ends early"));
    match physical {
        0 => {
            let bytes = t.bytes(count.div_ceil(8)).map_err(short)?;
            out.extend((0..count).map(|i| PVal::Bool(bytes[i / 8] >> (i % 8) & 1 == 1)));
        }
        1 => {
            for _ in 0..count {
                let b = t.bytes(4).map_err(short)?;
                out.push(PVal::Int(i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64));
            }
        }
        2 => {
            for _ in 0..count {
                let b: [u8; 8] = t.bytes(8).map_err(short)?.try_into().map_err(|_| ParquetError("int64".into()))?;
                out.push(PVal::Int(i64::from_le_bytes(b)));
            }
        }
        4 => {
            for _ in 0..count {
                let b = t.bytes(4).map_err(short)?;
                out.push(PVal::Float(f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64));
            }
        }
        5 => {
            for _ in 0..count {
                let b: [u8; 8] = t.bytes(8).map_err(short)?.try_into().map_err(|_| ParquetError("double".into()))?;
                out.push(PVal::Float(f64::from_le_bytes(b)));
            }
        }
        6 => {
            for _ in 0..count {
                let n = t.bytes(4).map_err(short)?;
                let n = u32::from_le_bytes([n[0], n[1], n[2], n[3]]) as usize;
                out.push(PVal::Bytes(t.bytes(n).map_err(short)?.to_vec()));
            }
        }
        other => return err(format!("column `{col}`: physical type {other} is not supported")),
    }
    Ok(out)
}

/// Decodes one column chunk into (repetition level, definition level, value) entries.
struct ChunkData {
    reps: Vec<u32>,
    defs: Vec<u32>,
    values: Vec<PVal>,
}

fn decompress(codec: i64, data: &[u8], uncompressed: usize, col: &str) -> Result<Vec<u8>> {
    match codec {
        0 => Ok(data.to_vec()),
        1 => snappy_decompress(data, uncompressed).map_err(|e| ParquetError(format!("column `{col}`: {}", e.0))),
        other => {
            let name = match other {
                2 => "GZIP",
                3 => "LZO",
                4 => "BROTLI",
                5 => "LZ4",
                6 => "ZSTD",
                7 => "LZ4_RAW",
                _ => "unknown",
            };
            err(format!(
                "column `{col}`: compression {name} is not supported (SNAPPY and uncompressed are; the \
                 Hugging Face SWE-bench files use SNAPPY)"
            ))
        }
    }
}

fn read_chunk(file: &[u8], meta: &[(i16, TValue)], col: &Column) -> Result<ChunkData> {
    let name = col.name.as_str();
    let codec = need_int(meta, 4, "codec")?;
    let num_values = need_int(meta, 5, "num_values")?.max(0) as usize;
    let data_off = need_int(meta, 9, "data_page_offset")?;
    let start = match int(meta, 11) {
        Some(d) if d > 0 && d < data_off => d,
        _ => data_off,
    };
    let mut pos = usize::try_from(start).map_err(|_| ParquetError(format!("column `{name}`: bad page offset")))?;
    let mut dict: Option<Vec<PVal>> = None;
    let mut out = ChunkData { reps: Vec::new(), defs: Vec::new(), values: Vec::new() };
    while out.defs.len() < num_values {
        let mut t = Thrift::new(
            file.get(pos..)
                .ok_or_else(|| ParquetError(format!("column `{name}`: page offset past the end of the file")))?,
        );
        let h = t.read_struct().map_err(|e| ParquetError(format!("column `{name}`: page header: {}", e.0)))?;
        let ptype = need_int(&h, 1, "page type")?;
        let usize_of =
            |v: i64| usize::try_from(v).map_err(|_| ParquetError(format!("column `{name}`: negative page size")));
        let uncompressed = usize_of(need_int(&h, 2, "uncompressed_page_size")?)?;
        let compressed = usize_of(need_int(&h, 3, "compressed_page_size")?)?;
        let body_start = pos + t.pos;
        let body = file
            .get(body_start..body_start.saturating_add(compressed))
            .ok_or_else(|| ParquetError(format!("column `{name}`: page runs past the end of the file")))?;
        pos = body_start + compressed;
        match ptype {
            2 => {
                let dh = strukt(
                    field(&h, 7)
                        .ok_or_else(|| ParquetError(format!("column `{name}`: dictionary page header missing")))?,
                );
                let n = need_int(dh, 1, "dictionary num_values")?.max(0) as usize;
                let data = decompress(codec, body, uncompressed, name)?;
                dict = Some(plain_values(&data, col.physical, n, name)?);
            }
            0 | 3 => {
                let v2 = ptype == 3;
                let dh = strukt(
                    field(&h, if v2 { 8 } else { 5 })
                        .ok_or_else(|| ParquetError(format!("column `{name}`: data page header missing")))?,
                );
                let n = need_int(dh, 1, "page num_values")?.max(0) as usize;
                let encoding = need_int(dh, if v2 { 4 } else { 2 }, "page encoding")?;
                let (reps, defs, values_data): (Vec<u32>, Vec<u32>, Vec<u8>);
                if v2 {
                    let rl = need_int(dh, 6, "repetition_levels_byte_length")?.max(0) as usize;
                    let dl = need_int(dh, 5, "definition_levels_byte_length")?.max(0) as usize;
                    let compressed_values = !matches!(field(dh, 7), Some(TValue::Bool(false)));
                    if rl + dl > body.len() {
                        return err(format!("column `{name}`: level data longer than the page"));
                    }
                    reps =
                        if col.max_rep > 0 { rle_hybrid(&body[..rl], bit_width(col.max_rep), n)? } else { vec![0; n] };
                    defs = if col.max_def > 0 {
                        rle_hybrid(&body[rl..rl + dl], bit_width(col.max_def), n)?
                    } else {
                        vec![0; n]
                    };
                    let rest = &body[rl + dl..];
                    values_data = if compressed_values {
                        decompress(codec, rest, uncompressed.saturating_sub(rl + dl), name)?
                    } else {
                        rest.to_vec()
                    };
                } else {
                    let data = decompress(codec, body, uncompressed, name)?;
                    let mut p = 0usize;
                    let mut levels = |max: i16| -> Result<Vec<u32>> {
                        if max == 0 {
                            return Ok(vec![0; n]);
                        }
                        let len = data
                            .get(p..p + 4)
                            .ok_or_else(|| ParquetError(format!("column `{name}`: levels end early")))?;
                        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
                        let lv = data
                            .get(p + 4..p + 4 + len)
                            .ok_or_else(|| ParquetError(format!("column `{name}`: levels end early")))?;
                        p += 4 + len;
                        rle_hybrid(lv, bit_width(max), n)
                    };
                    reps = levels(col.max_rep)?;
                    defs = levels(col.max_def)?;
                    values_data = data[p..].to_vec();
                }
                let present = defs.iter().filter(|d| **d == col.max_def as u32).count();
                let values = match encoding {
                    0 => plain_values(&values_data, col.physical, present, name)?,
                    // Booleans in v2 pages: a 4-byte length, then the RLE hybrid at width 1.
                    3 if col.physical == 0 => {
                        let len = values_data.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
                        let runs = len.and_then(|l| values_data.get(4..4 + l));
                        let runs =
                            runs.ok_or_else(|| ParquetError(format!("column `{name}`: boolean data ends early")))?;
                        rle_hybrid(runs, 1, present)?.into_iter().map(|b| PVal::Bool(b == 1)).collect()
                    }
                    2 | 8 => {
                        let dict = dict.as_ref().ok_or_else(|| {
                            ParquetError(format!("column `{name}`: dictionary-encoded page without a dictionary"))
                        })?;
                        let (&w, idx) = values_data.split_first().map_or((&0, &[][..]), |(a, b)| (a, b));
                        let ids = if present == 0 { Vec::new() } else { rle_hybrid(idx, u32::from(w), present)? };
                        ids.into_iter()
                            .map(|i| {
                                dict.get(i as usize).cloned().ok_or_else(|| {
                                    ParquetError(format!("column `{name}`: dictionary index {i} out of range"))
                                })
                            })
                            .collect::<Result<Vec<_>>>()?
                    }
                    other => {
                        return err(format!(
                            "column `{name}`: value encoding {other} is not supported (PLAIN and dictionary are)"
                        ))
                    }
                };
                out.reps.extend(reps);
                out.defs.extend(defs);
                out.values.extend(values);
            }
            _ => {} // index pages: skip
        }
    }
    Ok(out)
}

/// A value in the JSON form pandas would give; `row` and `col` locate errors.
fn to_json(v: PVal, row: usize, col: &str) -> std::result::Result<Value, ReadError> {
    Ok(match v {
        PVal::Bool(b) => Value::Bool(b),
        PVal::Int(i) => Value::Number(i.into()),
        PVal::Float(f) => Number::from_f64(f).map_or(Value::Null, Value::Number),
        PVal::Bytes(b) => match String::from_utf8(b) {
            Ok(s) => Value::String(s),
            Err(e) => {
                return Err(ReadError::Value(ValueError {
                    row,
                    field: col.to_string(),
                    problem: format!("not valid UTF-8 at byte {}", e.utf8_error().valid_up_to()),
                }))
            }
        },
    })
}

/// Reads every row of a parquet file as a JSON object (columns in schema order).
pub fn read_rows(file: &[u8]) -> std::result::Result<Vec<Map<String, Value>>, ReadError> {
    if file.len() < 12 || &file[..4] != b"PAR1" || &file[file.len() - 4..] != b"PAR1" {
        return Err(ParquetError("not a parquet file (no PAR1 magic)".into()).into());
    }
    let n = file.len();
    let meta_len = u32::from_le_bytes([file[n - 8], file[n - 7], file[n - 6], file[n - 5]]) as usize;
    if meta_len > n - 12 {
        return Err(ParquetError("footer length out of range".into()).into());
    }
    let meta_bytes = &file[n - 8 - meta_len..n - 8];
    let meta = Thrift::new(meta_bytes).read_struct().map_err(|e| ParquetError(format!("footer: {}", e.0)))?;
    let schema = list(&meta, 2);
    let mut pos = 0;
    let root = build_schema(schema, &mut pos, 0)?;
    let columns = columns_of(&root)?;
    let mut rows: Vec<Map<String, Value>> = Vec::new();
    for rg in list(&meta, 4) {
        let rg = strukt(rg);
        let rg_rows = need_int(rg, 3, "row group num_rows")?.max(0) as usize;
        let base = rows.len();
        rows.extend((0..rg_rows).map(|_| Map::new()));
        let chunks = list(rg, 1);
        if chunks.len() != columns.len() {
            let msg = format!("row group has {} column chunks for {} columns", chunks.len(), columns.len());
            return Err(ParquetError(msg).into());
        }
        for (col, chunk) in columns.iter().zip(chunks) {
            let meta = strukt(
                field(strukt(chunk), 3)
                    .ok_or_else(|| ParquetError(format!("column `{}`: chunk metadata missing", col.name)))?,
            );
            let data = read_chunk(file, meta, col)?;
            let mut values = data.values.into_iter();
            let mut row = base;
            let mut started = false;
            let bad = |what: &str| ReadError::File(ParquetError(format!("column `{}`: {what}", col.name)));
            let mut next_val = |row: usize| -> std::result::Result<Value, ReadError> {
                let v = values.next().ok_or_else(|| bad("fewer values than levels"))?;
                to_json(v, row, &col.name)
            };
            for (rep, def) in data.reps.iter().zip(&data.defs) {
                let def = *def as i16;
                if !col.is_list {
                    if row >= rows.len() {
                        return Err(bad("more values than rows"));
                    }
                    let v = if def == col.max_def { next_val(row)? } else { Value::Null };
                    rows[row].insert(col.name.clone(), v);
                    row += 1;
                    continue;
                }
                if *rep == 0 {
                    if started {
                        row += 1;
                    }
                    started = true;
                    if row >= rows.len() {
                        return Err(bad("more values than rows"));
                    }
                    let start = if def < col.list_def { Value::Null } else { Value::Array(Vec::new()) };
                    rows[row].insert(col.name.clone(), start);
                }
                if def >= col.elem_def {
                    let v = if def == col.max_def { next_val(row)? } else { Value::Null };
                    match rows[row].get_mut(&col.name) {
                        Some(Value::Array(items)) => items.push(v),
                        _ => return Err(bad("list element without a list")),
                    }
                }
            }
            let filled = if col.is_list {
                if started {
                    row + 1
                } else {
                    base
                }
            } else {
                row
            };
            if filled != base + rg_rows {
                return Err(bad(&format!("{} values for {rg_rows} rows", filled - base)));
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snappy_literals_and_overlapping_copies() {
        // "abcabcabcabc": literal "abc" then a copy of 9 bytes at offset 3.
        let block = [12u8, 0b0000_1000, b'a', b'b', b'c', 0b0001_0101, 3];
        assert_eq!(snappy_decompress(&block, 12).unwrap(), b"abcabcabcabc");
        assert!(snappy_decompress(&[12u8, 0b0001_0110, 3], 12).is_err());
        assert!(snappy_decompress(&[5u8, 0b0000_1000, b'a'], 5).is_err());
    }

    #[test]
    fn rle_hybrid_runs() {
        // RLE run of 3 × value 1, then a bit-packed group of 8 values (width 1): 0b10101010.
        let data = [3u8 << 1, 1, (1 << 1) | 1, 0b1010_1010];
        assert_eq!(rle_hybrid(&data, 1, 11).unwrap(), vec![1, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
        assert!(rle_hybrid(&[3u8], 1, 5).is_err());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(read_rows(b"PAR1").is_err());
        assert!(read_rows(b"PAR1\x00\x00\x00\x00\xff\xff\xff\x7fPAR1").is_err());
        let mut f = b"PAR1".to_vec();
        f.extend_from_slice(&[0x19, 0x4c, 0xff, 0xff, 0xff]);
        f.extend_from_slice(&5u32.to_le_bytes());
        f.extend_from_slice(b"PAR1");
        assert!(read_rows(&f).is_err());
    }
}
