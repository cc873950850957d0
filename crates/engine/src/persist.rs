//! Conversation states on disk, so an agent's conversation survives a restart of the server
//! (`serve --session-dir`), of `frognano chat --session FILE`, or of the agent itself, without
//! prefilling its history again (docs/serve.md §9).
//!
//! **What is saved.** A *state file* holds one point of a conversation: its tokens, the logits
//! after the last of them, every Gated DeltaNet layer's conv window and recurrent state, and
//! the attention layers' keys and values — as stored in the cache (f16, Q8_0, …), byte for
//! byte, so a restored state continues exactly as the live one would have.
//!
//! **Chains.** Keys and values only grow, so a file saved later in a conversation holds only
//! the rows added since an earlier file of the same conversation (its *parent*, named in the
//! file) and the full recurrent state, which is small next to a long context's keys and
//! values. An agent turn writes its new rows, not the whole history again. Restoring reads the
//! chain from its root, memory-mapped.
//!
//! **Which points.** After each reply the store saves the conversation's end, and the end of
//! its prompt (where the next turn starts when the chat template renders the reply differently
//! in the history, e.g. without its reasoning). A prompt then restores from the file whose
//! tokens are its longest prefix (on attention-only models, any file sharing a prefix: keys and
//! values can be cut back).
//!
//! **Budget.** The files of a store stay within a byte budget: the least recently used file
//! that no other file continues is deleted first. Use is remembered in the files' modification
//! times, so the order survives restarts.
//!
//! **Safety.** Files are written under a temporary name and renamed when complete, so a crash
//! leaves no half-written state; every section carries a CRC-32 checked on load; a file saved
//! by another model (or the same model with another KV cache type) is never loaded.
//!
//! The format (version 1, little-endian): the magic `FNSTATE\0`, then the header's offset and
//! length (two u64), the sections each at a multiple of 64 bytes, and the header last, as
//! JSON: `{version, model, layout, parent, from, pos, sections: [{name, offset, len, crc32}],
//! extra}`. Sections: `tokens` (u32 per token, all `pos` of them), `logits` (f32), `k{i}` and
//! `v{i}` (attention layer `i`'s rows `from..pos`), `conv{i}` and `state{i}` (f32).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use frognano_model::cache::as_bytes;
use frognano_model::cache::KvRows;
use frognano_model::{Cache, CacheSnapshot, CausalLm, LayerCache, LayerLayout};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::session::Session;

/// The extension of state files.
pub const STATE_EXTENSION: &str = "fnstate";

const MAGIC: &[u8; 8] = b"FNSTATE\0";
const VERSION: u32 = 1;
/// Sections start at multiples of this (so f32 and u32 data are aligned in the mapping).
const ALIGN: u64 = 64;

/// What went wrong reading or writing a state; the message names the file and the field.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// Reading or writing the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// The file is not a state file this build can read, or it is damaged.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the field.
        message: String,
    },
    /// The state belongs to another model (or KV cache type).
    #[error("{path}: {message}")]
    OtherModel {
        /// The file.
        path: PathBuf,
        /// Which field differs, expected vs found.
        message: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PersistError + '_ {
    move |source| PersistError::Io { path: path.to_path_buf(), source }
}

fn invalid(path: &Path, message: impl Into<String>) -> PersistError {
    PersistError::Invalid { path: path.to_path_buf(), message: message.into() }
}

/// An identity for the model at `path` that changes when the file does: its full path, size
/// and modification time. States saved by one model are never loaded into another.
pub fn model_identity(path: &Path) -> String {
    let full = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let meta = std::fs::metadata(&full).ok();
    let len = meta.as_ref().map_or(0, |m| m.len());
    let mtime = meta
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    format!("{}|{len}|{mtime}", full.display())
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SectionInfo {
    name: String,
    offset: u64,
    len: u64,
    crc32: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Header {
    version: u32,
    model: String,
    layout: Vec<LayerLayout>,
    /// The file (in the same folder) holding rows `0..from` of the keys and values.
    parent: Option<String>,
    from: usize,
    pos: usize,
    sections: Vec<SectionInfo>,
    #[serde(default)]
    extra: Value,
}

/// One state file, memory-mapped, its header checked.
struct StateFile {
    path: PathBuf,
    map: memmap2::Mmap,
    header: Header,
}

impl StateFile {
    /// Maps `path` and checks its header. `populate`: map every page now (for a file about
    /// to be read whole; not for a scan of headers).
    fn open(path: &Path, populate: bool) -> Result<StateFile, PersistError> {
        let file = File::open(path).map_err(io_err(path))?;
        // SAFETY: state files are written once under a temporary name and renamed; nothing
        // writes them in place while they are mapped.
        // Populated: the kernel maps every page at once instead of one fault per 4 KiB page
        // as the rows are copied (a 32K-token 4B state is a gigabyte).
        let mut options = memmap2::MmapOptions::new();
        if populate {
            options.populate();
        }
        let map = unsafe { options.map(&file) }.map_err(io_err(path))?;
        if map.len() < 24 || &map[..8] != MAGIC {
            return Err(invalid(path, "not a FrogNano state file (no FNSTATE magic at the start)"));
        }
        let word = |at: usize| u64::from_le_bytes(map[at..at + 8].try_into().expect("8 bytes"));
        let (at, len) = (word(8), word(16));
        if at.checked_add(len).is_none_or(|end| end > map.len() as u64) {
            return Err(invalid(
                path,
                format!(
                    "the header ({len} bytes at {at}) is past the end of the file ({} bytes): cut short",
                    map.len()
                ),
            ));
        }
        let header: Header = serde_json::from_slice(&map[at as usize..(at + len) as usize])
            .map_err(|e| invalid(path, format!("the header is not valid: {e}")))?;
        if header.version != VERSION {
            return Err(invalid(path, format!("format version {} (this build reads {VERSION})", header.version)));
        }
        for s in &header.sections {
            if s.offset.checked_add(s.len).is_none_or(|end| end > at) {
                return Err(invalid(path, format!("section {} is past the end of the data: cut short", s.name)));
            }
        }
        if header.from > header.pos {
            return Err(invalid(path, format!("from {} is after pos {}", header.from, header.pos)));
        }
        Ok(StateFile { path: path.to_path_buf(), map, header })
    }

    /// Fails unless the file was saved by `model` with this cache `layout`.
    fn check_model(&self, model: &str, layout: &[LayerLayout]) -> Result<(), PersistError> {
        let other = |message: String| PersistError::OtherModel { path: self.path.clone(), message };
        if self.header.model != model {
            return Err(other(format!("saved by model {:?}, not {model:?}", self.header.model)));
        }
        if self.header.layout != layout {
            let diff = self.header.layout.iter().zip(layout).position(|(a, b)| a != b).unwrap_or(layout.len());
            return Err(other(format!(
                "its cache layout differs at layer {diff}: saved {:?}, this model {:?} (another --kv-cache?)",
                self.header.layout.get(diff),
                layout.get(diff)
            )));
        }
        Ok(())
    }

    /// A section's bytes, checksum checked.
    fn section(&self, name: &str) -> Result<&[u8], PersistError> {
        let (bytes, crc) = self.section_unchecked(name)?;
        if crc32fast::hash(bytes) != crc {
            return Err(self.damaged(name));
        }
        Ok(bytes)
    }

    /// The error for section `name` failing its CRC-32.
    fn damaged(&self, name: &str) -> PersistError {
        invalid(&self.path, format!("section {name} is damaged (CRC-32 mismatch)"))
    }

    /// A section's bytes and the CRC-32 they must have, for a reader that checks them as it
    /// goes (the attention rows, in `load_chain`).
    fn section_unchecked(&self, name: &str) -> Result<(&[u8], u32), PersistError> {
        let s = self
            .header
            .sections
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| invalid(&self.path, format!("no section {name}")))?;
        Ok((&self.map[s.offset as usize..(s.offset + s.len) as usize], s.crc32))
    }

    fn tokens(&self) -> Result<Vec<u32>, PersistError> {
        let bytes = self.section("tokens")?;
        let tokens: Vec<u32> = bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4"))).collect();
        if tokens.len() != self.header.pos || bytes.len() % 4 != 0 {
            return Err(invalid(&self.path, format!("tokens: {} bytes for pos {}", bytes.len(), self.header.pos)));
        }
        Ok(tokens)
    }

    fn f32s(&self, name: &str) -> Result<Vec<f32>, PersistError> {
        let bytes = self.section(name)?;
        if bytes.len() % 4 != 0 {
            return Err(invalid(&self.path, format!("{name}: {} bytes are not whole f32 values", bytes.len())));
        }
        Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4"))).collect())
    }
}

/// Writes a state file: under a temporary name, then renamed. Returns its size.
fn write_file(path: &Path, mut header: Header, parts: &[(String, Vec<u8>)]) -> Result<u64, PersistError> {
    let tmp = path.with_extension(format!("{STATE_EXTENSION}.tmp"));
    let result = (|| {
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&tmp).map_err(io_err(&tmp))?);
        let mut at = ALIGN;
        header.sections.clear();
        for (name, bytes) in parts {
            header.sections.push(SectionInfo {
                name: name.clone(),
                offset: at,
                len: bytes.len() as u64,
                crc32: crc32fast::hash(bytes),
            });
            at = (at + bytes.len() as u64).div_ceil(ALIGN) * ALIGN;
        }
        let json = serde_json::to_vec(&header).expect("a header serializes");
        let mut head = Vec::with_capacity(ALIGN as usize);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&at.to_le_bytes());
        head.extend_from_slice(&(json.len() as u64).to_le_bytes());
        head.resize(ALIGN as usize, 0);
        let w = |out: &mut BufWriter<File>, b: &[u8]| out.write_all(b).map_err(io_err(&tmp));
        w(&mut out, &head)?;
        let mut written = ALIGN;
        for (_, bytes) in parts {
            w(&mut out, bytes)?;
            written += bytes.len() as u64;
            let pad = written.div_ceil(ALIGN) * ALIGN - written;
            w(&mut out, &[0u8; ALIGN as usize][..pad as usize])?;
            written += pad;
        }
        w(&mut out, &json)?;
        out.flush().map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io_err(path))?;
        Ok(written + json.len() as u64)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The sections of one point of a session: tokens `..pos`, its logits, keys and values rows
/// `from..pos`, and the recurrent state (from `snap`, or the cache's current one).
fn point_parts(
    session: &Session,
    pos: usize,
    from: usize,
    snap: Option<&CacheSnapshot>,
    logits: &[f32],
) -> Vec<(String, Vec<u8>)> {
    // A cache on a GPU is copied to the host first (only its current state is saved:
    // `SessionStore::save` skips a device cache's earlier snapshots).
    let host;
    let cache = match session.cache().is_on_device() {
        true => {
            host = session.cache().to_host();
            &host
        }
        false => session.cache(),
    };
    let mut parts = vec![
        ("tokens".to_string(), as_bytes(&session.tokens()[..pos]).to_vec()),
        ("logits".to_string(), as_bytes(logits).to_vec()),
    ];
    for (i, layer) in cache.layers.iter().enumerate() {
        match layer {
            LayerCache::Attention { k, v } => {
                parts.push((format!("k{i}"), k.raw_rows(from..pos).to_vec()));
                parts.push((format!("v{i}"), v.raw_rows(from..pos).to_vec()));
            }
            LayerCache::Linear { conv, state } => {
                let (c, s) = snap.and_then(|s| s.linear(i)).unwrap_or((conv, state));
                parts.push((format!("conv{i}"), as_bytes(c).to_vec()));
                parts.push((format!("state{i}"), as_bytes(s).to_vec()));
            }
        }
    }
    parts
}

/// Appends section `name` of `f` (attention rows) to `rows`, checking its CRC-32 as it goes:
/// pieces of about 256 KiB are checksummed, then copied while still in L2. On a mismatch the
/// rows already copied go with the cache the failed load throws away.
fn read_rows(f: &StateFile, name: &str, rows: &mut KvRows) -> Result<(), PersistError> {
    const PIECE: usize = 256 << 10;
    let (bytes, crc) = f.section_unchecked(name)?;
    let per_row = rows.kv_type().row_bytes(rows.width());
    if per_row == 0 || !bytes.len().is_multiple_of(per_row) {
        return Err(invalid(&f.path, format!("{name}: {} bytes are not whole rows of {per_row}", bytes.len())));
    }
    let mut hasher = crc32fast::Hasher::new();
    for piece in bytes.chunks(PIECE / per_row.min(PIECE) * per_row) {
        hasher.update(piece);
        rows.push_raw(piece).map_err(|e| invalid(&f.path, format!("{name}: {e}")))?;
    }
    if hasher.finalize() != crc {
        return Err(f.damaged(name));
    }
    if rows.len() != f.header.pos {
        return Err(invalid(&f.path, format!("{name}: {} rows, expected {}", rows.len(), f.header.pos)));
    }
    Ok(())
}

/// Builds a session from a chain of files (root first), checked against `model`.
fn load_chain(
    files: &[StateFile],
    model: &Arc<dyn CausalLm>,
    model_id: &str,
    keep: usize,
) -> Result<Session, PersistError> {
    let leaf = files.last().expect("a chain has a file");
    // A model on a GPU: the state is read into a CPU cache of its layout, then uploaded.
    let mut device = Some(model.new_cache()).filter(Cache::is_on_device);
    let mut cache = match &device {
        Some(d) => d.host_template().map_err(|e| invalid(&leaf.path, e))?,
        None => model.new_cache(),
    };
    let layout = cache.layout();
    let mut at = 0;
    let mut tokens = leaf.tokens()?;
    for f in files {
        f.check_model(model_id, &layout)?;
        if f.header.from != at {
            return Err(invalid(
                &f.path,
                format!("continues from position {} but its parent ends at {at}", f.header.from),
            ));
        }
        // Every earlier file of the chain is of this conversation (and undamaged); the leaf's
        // tokens were read above.
        if !std::ptr::eq(f, leaf) && f.tokens()? != tokens[..f.header.pos.min(tokens.len())] {
            return Err(invalid(&f.path, "its tokens are not the start of the conversation it continues into"));
        }
        at = f.header.pos;
    }
    // The attention rows are most of a long conversation's state (a gigabyte at 32K tokens of
    // the 4B shapes): each layer's keys and values are checked and copied on their own, on
    // threads of their own (not the compute pool, whose running decode must not wait behind a
    // restore), a piece at a time so that each piece is checksummed and copied while it is in
    // cache and the file's bytes come from memory once.
    let room = (leaf.header.pos + (leaf.header.pos / 4).max(4096)).min(model.max_context().max(leaf.header.pos));
    let attention: Vec<(String, &mut KvRows)> = cache
        .layers
        .iter_mut()
        .enumerate()
        .flat_map(|(i, layer)| match layer {
            LayerCache::Attention { k, v } => vec![(format!("k{i}"), k), (format!("v{i}"), v)],
            LayerCache::Linear { .. } => vec![],
        })
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, attention.len().max(1));
    let mut shares: Vec<Vec<(String, &mut KvRows)>> = (0..threads).map(|_| Vec::new()).collect();
    for (n, item) in attention.into_iter().enumerate() {
        shares[n % threads].push(item);
    }
    std::thread::scope(|scope| {
        let workers: Vec<_> = shares
            .into_iter()
            .map(|share| {
                scope.spawn(move || {
                    share.into_iter().try_for_each(|(name, rows)| {
                        // Room for the conversation to go on without moving a gigabyte at its
                        // next token (a Vec that is exactly full doubles by copying).
                        rows.reserve(room);
                        files.iter().try_for_each(|f| read_rows(f, &name, rows))
                    })
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| w.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    })?;
    for (i, layer) in cache.layers.iter_mut().enumerate() {
        match layer {
            LayerCache::Attention { .. } => {}
            LayerCache::Linear { conv, state } => {
                let (c, s) = (leaf.f32s(&format!("conv{i}"))?, leaf.f32s(&format!("state{i}"))?);
                if c.len() != conv.len() || s.len() != state.len() {
                    return Err(invalid(&leaf.path, format!("conv{i}/state{i}: wrong size for this model")));
                }
                *conv = c;
                *state = s;
            }
        }
    }
    cache.pos = leaf.header.pos;
    if let Some(mut d) = device.take() {
        d.load_host(cache).map_err(|e| invalid(&leaf.path, e))?;
        cache = d;
    }
    let mut logits = Some(leaf.f32s("logits")?);
    if logits.as_ref().is_some_and(|l| l.len() != model.vocab_size()) {
        return Err(invalid(
            &leaf.path,
            format!("logits: {} values, vocabulary {}", logits.map_or(0, |l| l.len()), model.vocab_size()),
        ));
    }
    if keep < tokens.len() {
        // An attention-only cache cut back to the prefix the prompt shares.
        cache.truncate(keep).map_err(|e| invalid(&leaf.path, e))?;
        tokens.truncate(keep);
        logits = None;
    }
    Ok(Session::from_state(Arc::clone(model), cache, tokens, logits))
}

/// Saves `session`'s current end as one self-contained file (no parent) at `path`, with
/// `extra` (the caller's own data, e.g. the chat's messages) in its header.
/// `frognano chat --session FILE` keeps its conversation this way.
pub fn save_session_file(path: &Path, model_id: &str, session: &Session, extra: Value) -> Result<u64, PersistError> {
    let Some((pos, _, logits)) = session.save_points().into_iter().find(|(pos, snap, _)| snap.is_none() && *pos > 0)
    else {
        return Err(invalid(path, "the session holds no state to save yet"));
    };
    let parts = point_parts(session, pos, 0, None, logits);
    let header = Header {
        version: VERSION,
        model: model_id.to_string(),
        layout: session.cache().layout(),
        parent: None,
        from: 0,
        pos,
        sections: Vec::new(),
        extra,
    };
    write_file(path, header, &parts)
}

/// Loads a file written by [`save_session_file`]: the session and the header's `extra`.
pub fn load_session_file(
    path: &Path,
    model_id: &str,
    model: &Arc<dyn CausalLm>,
) -> Result<(Session, Value), PersistError> {
    let file = StateFile::open(path, true)?;
    if file.header.parent.is_some() {
        return Err(invalid(path, "a file of a --session-dir chain, not a single session file"));
    }
    let extra = file.header.extra.clone();
    let pos = file.header.pos;
    Ok((load_chain(&[file], model, model_id, pos)?, extra))
}

/// One file of a [`SessionStore`].
#[derive(Debug, Clone)]
struct Entry {
    tokens: Arc<[u32]>,
    parent: Option<String>,
    bytes: u64,
    last_used: u64,
    /// Being written: a parent for new files, not yet a source for restores.
    pending: bool,
    /// Holds its recurrent state and logits: a conversation can start here. A file that
    /// others continue loses them when the budget runs short (it is *stripped*), keeping only
    /// the keys and values its children need.
    restorable: bool,
}

#[derive(Default)]
struct Index {
    entries: HashMap<String, Entry>,
    clock: u64,
    bytes: u64,
    pending: usize,
}

struct Inner {
    dir: PathBuf,
    model_id: String,
    layout: Vec<LayerLayout>,
    rewindable: bool,
    budget: u64,
    index: Mutex<Index>,
    settled: Condvar,
}

fn lock(m: &Mutex<Index>) -> MutexGuard<'_, Index> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct WriteJob {
    name: String,
    header: Header,
    parts: Vec<(String, Vec<u8>)>,
}

/// What a [`SessionStore`] holds, for `/health` and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StoreStats {
    /// State files.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The byte budget.
    pub budget: u64,
}

/// A folder of conversation states for one model, within a byte budget (see the module
/// docs). Saves are written by a thread of its own; restores read on the caller's thread,
/// which hands the attention rows to short-lived threads of its own, a layer each.
pub struct SessionStore {
    inner: Arc<Inner>,
    writer: Mutex<Option<(Sender<WriteJob>, JoinHandle<()>)>>,
}

impl std::fmt::Debug for SessionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionStore").field("dir", &self.inner.dir).field("stats", &self.stats()).finish()
    }
}

impl SessionStore {
    /// Opens (creating it if needed) the folder `dir` for `model`, whose identity is
    /// `model_id` ([`model_identity`]), keeping at most `budget` bytes of states. Files of
    /// other models in the folder are left alone and not counted; damaged ones are reported
    /// and left alone; leftovers of an interrupted write are removed.
    pub fn open(dir: &Path, model_id: &str, model: &dyn CausalLm, budget: u64) -> Result<SessionStore, PersistError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let cache = model.new_cache();
        let layout = cache.layout();
        let mut found = Vec::new();
        for item in std::fs::read_dir(dir).map_err(io_err(dir))? {
            let path = item.map_err(io_err(dir))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            if name.ends_with(&format!(".{STATE_EXTENSION}.tmp")) {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some(STATE_EXTENSION) {
                continue;
            }
            match StateFile::open(&path, false).and_then(|f| f.check_model(model_id, &layout).map(|()| f)) {
                Ok(f) => {
                    let tokens = match f.tokens() {
                        Ok(t) => t,
                        Err(e) => {
                            tracing::warn!("session store: skipping {e}");
                            continue;
                        }
                    };
                    let mtime = std::fs::metadata(&path).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
                    let entry = Entry {
                        tokens: tokens.into(),
                        parent: f.header.parent.clone(),
                        bytes: f.map.len() as u64,
                        last_used: 0,
                        pending: false,
                        restorable: f.header.sections.iter().any(|s| s.name == "logits"),
                    };
                    found.push((mtime, name, entry));
                }
                Err(PersistError::OtherModel { .. }) => {}
                Err(e) => tracing::warn!("session store: skipping {e}"),
            }
        }
        // The clock follows the files' modification times, so use survives restarts.
        found.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let mut index = Index::default();
        for (_, name, mut entry) in found {
            index.clock += 1;
            entry.last_used = index.clock;
            index.bytes += entry.bytes;
            index.entries.insert(name, entry);
        }
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            model_id: model_id.to_string(),
            layout,
            rewindable: cache.is_rewindable(),
            budget,
            index: Mutex::new(index),
            settled: Condvar::new(),
        });
        inner.evict(&mut lock(&inner.index));
        let (tx, rx) = channel::<WriteJob>();
        let worker = Arc::clone(&inner);
        let handle = std::thread::Builder::new()
            .name("session-store".into())
            .spawn(move || {
                for job in rx {
                    worker.write(job);
                }
            })
            .map_err(io_err(dir))?;
        Ok(SessionStore { inner, writer: Mutex::new(Some((tx, handle))) })
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Files and bytes held (written ones).
    pub fn stats(&self) -> StoreStats {
        let index = lock(&self.inner.index);
        let files = index.entries.values().filter(|e| !e.pending).count();
        StoreStats { files, bytes: index.bytes, budget: self.inner.budget }
    }

    /// Saves `session`'s points worth keeping ([`Session::save_points`]) that the store
    /// does not hold yet, each continuing the longest file of the same conversation. The
    /// bytes are copied here and written on the store's thread.
    pub fn save(&self, session: &Session) {
        let mut points = session.save_points();
        if session.cache().is_on_device() {
            // The snapshots of a cache on a GPU stay there; its current state is saved.
            points.retain(|(_, snap, _)| snap.is_none());
        }
        let mut jobs = Vec::new();
        {
            let mut index = lock(&self.inner.index);
            // Earliest first, so the end continues the prompt end saved just before it.
            for (pos, snap, logits) in points.into_iter().rev() {
                let tokens = &session.tokens()[..pos];
                index.clock += 1;
                let now = index.clock;
                let mut rewrite = None;
                if let Some((name, e)) = index.entries.iter_mut().find(|(_, e)| &e.tokens[..] == tokens) {
                    e.last_used = now;
                    if e.restorable || e.pending {
                        touch(&self.inner.dir.join(name));
                        continue;
                    }
                    // Stripped earlier: written again whole, under its name (its children
                    // read it as they did; the old file serves them until the new one is in).
                    rewrite = Some((name.clone(), e.bytes));
                }
                let parent = index
                    .entries
                    .iter()
                    .filter(|(_, e)| e.tokens.len() < pos && tokens.starts_with(&e.tokens))
                    .max_by_key(|(_, e)| e.tokens.len())
                    .map(|(n, e)| (n.clone(), e.tokens.len()));
                let from = parent.as_ref().map_or(0, |p| p.1);
                let name = match rewrite {
                    Some((name, old_bytes)) => {
                        index.bytes = index.bytes.saturating_sub(old_bytes);
                        name
                    }
                    None => file_name(tokens),
                };
                let header = Header {
                    version: VERSION,
                    model: self.inner.model_id.clone(),
                    layout: self.inner.layout.clone(),
                    parent: parent.map(|p| p.0),
                    from,
                    pos,
                    sections: Vec::new(),
                    extra: Value::Null,
                };
                let parts = point_parts(session, pos, from, snap, logits);
                index.entries.insert(
                    name.clone(),
                    Entry {
                        tokens: tokens.into(),
                        parent: header.parent.clone(),
                        bytes: 0,
                        last_used: now,
                        pending: true,
                        restorable: true,
                    },
                );
                index.pending += 1;
                jobs.push(WriteJob { name, header, parts });
            }
        }
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        for job in jobs {
            let name = job.name.clone();
            let sent = writer.as_ref().is_some_and(|(tx, _)| tx.send(job).is_ok());
            if !sent {
                // No writer (the store is closing): the job will never settle.
                let mut index = lock(&self.inner.index);
                index.pending = index.pending.saturating_sub(1);
                index.entries.remove(&name);
                self.inner.settled.notify_all();
            }
        }
    }

    /// Waits until every save so far is on disk (or failed).
    pub fn flush(&self) {
        let mut index = lock(&self.inner.index);
        while index.pending > 0 {
            index = match self.inner.settled.wait_timeout(index, Duration::from_millis(100)) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// Whether [`restore`](Self::restore) has a saved state to offer `prompt` that reaches
    /// beyond `better_than` tokens: a look at the index only, no file is read (the scheduler
    /// asks before it hands the restore to a thread of its own).
    pub fn can_restore(&self, prompt: &[u32], better_than: usize) -> bool {
        let index = lock(&self.inner.index);
        index.entries.values().filter(|e| !e.pending && e.restorable).any(|e| {
            let shared = e.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
            let keep = if shared == e.tokens.len() || self.inner.rewindable { shared } else { 0 };
            keep > better_than
        })
    }

    /// The longest saved state `prompt` can start from, when it reaches beyond `better_than`
    /// tokens (what the caller already holds in memory): the session and how many of the
    /// prompt's tokens it holds. A damaged or missing file is reported, dropped from the
    /// store, and the next best tried.
    pub fn restore(&self, prompt: &[u32], better_than: usize, model: &Arc<dyn CausalLm>) -> Option<(Session, usize)> {
        loop {
            let (name, keep, chain) = {
                let mut index = lock(&self.inner.index);
                let (name, keep) = index
                    .entries
                    .iter()
                    .filter(|(_, e)| !e.pending && e.restorable)
                    .map(|(n, e)| {
                        let shared = e.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
                        let keep = if shared == e.tokens.len() || self.inner.rewindable { shared } else { 0 };
                        (keep, e.last_used, n)
                    })
                    .filter(|(keep, _, _)| *keep > better_than)
                    .max()
                    .map(|(keep, _, n)| (n.clone(), keep))?;
                // Every parent must be a file the store holds (not one skipped as damaged).
                let mut chain = vec![name.clone()];
                while let Some(parent) =
                    index.entries.get(chain.last().expect("nonempty")).and_then(|e| e.parent.clone())
                {
                    let known = index.entries.contains_key(&parent);
                    chain.push(parent);
                    if !known || chain.len() > 100_000 {
                        break;
                    }
                }
                chain.reverse();
                index.clock += 1;
                let now = index.clock;
                for n in &chain {
                    if let Some(e) = index.entries.get_mut(n) {
                        e.last_used = now;
                    }
                }
                (name, keep, chain)
            };
            let files: Result<Vec<StateFile>, PersistError> =
                chain.iter().map(|n| StateFile::open(&self.inner.dir.join(n), true)).collect();
            match files.and_then(|files| load_chain(&files, model, &self.inner.model_id, keep)) {
                Ok(session) => {
                    for n in &chain {
                        touch(&self.inner.dir.join(n));
                    }
                    return Some((session, keep));
                }
                Err(e) => {
                    tracing::warn!("session store: cannot restore from {name}: {e}; dropping it");
                    self.inner.forget(&name);
                }
            }
        }
    }
}

impl Drop for SessionStore {
    /// Finishes the writes under way.
    fn drop(&mut self) {
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((tx, handle)) = writer {
            drop(tx);
            let _ = handle.join();
        }
    }
}

impl Inner {
    fn write(&self, job: WriteJob) {
        let path = self.dir.join(&job.name);
        let result = write_file(&path, job.header, &job.parts);
        let mut index = lock(&self.index);
        index.pending = index.pending.saturating_sub(1);
        match result {
            Ok(bytes) => {
                if let Some(e) = index.entries.get_mut(&job.name) {
                    e.pending = false;
                    e.bytes = bytes;
                    index.bytes += bytes;
                    self.evict(&mut index);
                } else {
                    // Dropped while it was being written (its parent turned out damaged).
                    let _ = std::fs::remove_file(&path);
                }
            }
            Err(e) => {
                tracing::warn!("session store: cannot save a state: {e}");
                index.entries.remove(&job.name);
            }
        }
        self.settled.notify_all();
    }

    /// Until within budget, takes the least recently used of: the files no other file
    /// continues (deleted), and the restorable files others continue (stripped to the keys
    /// and values their children need). A long conversation thus keeps its keys and values
    /// once and only its latest recurrent states, whatever its number of turns.
    fn evict(&self, index: &mut Index) {
        while index.bytes > self.budget {
            let victim = {
                let parents: std::collections::HashSet<&String> =
                    index.entries.values().filter_map(|e| e.parent.as_ref()).collect();
                index
                    .entries
                    .iter()
                    .filter(|(n, e)| !e.pending && (!parents.contains(n) || e.restorable))
                    .min_by_key(|(_, e)| e.last_used)
                    .map(|(n, _)| (n.clone(), parents.contains(n)))
            };
            let Some((victim, continued)) = victim else { break };
            let path = self.dir.join(&victim);
            if continued {
                match strip(&path) {
                    Ok(bytes) => {
                        let e = index.entries.get_mut(&victim).expect("present");
                        index.bytes = index.bytes.saturating_sub(e.bytes) + bytes;
                        e.bytes = bytes;
                        e.restorable = false;
                        continue;
                    }
                    // Cannot be stripped: it goes, and the files continuing it with it.
                    Err(err) => tracing::warn!("session store: cannot strip {victim}: {err}"),
                }
                self.remove_with_descendants(index, &victim);
                continue;
            }
            let e = index.entries.remove(&victim).expect("present");
            index.bytes = index.bytes.saturating_sub(e.bytes);
            if let Err(err) = std::fs::remove_file(&path) {
                tracing::warn!("session store: cannot delete {victim}: {err}");
            }
        }
    }

    /// Drops a file and every file continuing it (they cannot be restored without it).
    fn forget(&self, name: &str) {
        let mut index = lock(&self.index);
        self.remove_with_descendants(&mut index, name);
        self.settled.notify_all();
    }

    /// Removes `name` and the files continuing it from the index and the disk. A pending
    /// one's file is deleted by the writer when it finds its entry gone.
    fn remove_with_descendants(&self, index: &mut Index, name: &str) {
        let mut gone = vec![name.to_string()];
        while let Some(n) = gone.pop() {
            if let Some(e) = index.entries.remove(&n) {
                if !e.pending {
                    index.bytes = index.bytes.saturating_sub(e.bytes);
                    let _ = std::fs::remove_file(self.dir.join(&n));
                }
            }
            gone.extend(
                index.entries.iter().filter(|(_, e)| e.parent.as_deref() == Some(n.as_str())).map(|(c, _)| c.clone()),
            );
        }
    }
}

/// Rewrites a state file with only its tokens and keys and values (what the files continuing
/// it read); returns the new size.
fn strip(path: &Path) -> Result<u64, PersistError> {
    let file = StateFile::open(path, true)?;
    let keep: Vec<(String, Vec<u8>)> = file
        .header
        .sections
        .iter()
        .filter(|s| s.name == "tokens" || s.name.starts_with('k') || s.name.starts_with('v'))
        .map(|s| Ok((s.name.clone(), file.section(&s.name)?.to_vec())))
        .collect::<Result<_, PersistError>>()?;
    let header = file.header.clone();
    drop(file);
    write_file(path, header, &keep)
}

/// Marks a file used now (its modification time is the store's memory of use).
fn touch(path: &Path) {
    if let Ok(f) = File::options().write(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// A file name for a state after `tokens`: a hash of them and their count.
fn file_name(tokens: &[u32]) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    tokens.hash(&mut h);
    format!("{:016x}-{}.{STATE_EXTENSION}", h.finish(), tokens.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_or_foreign_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.fnstate");
        std::fs::write(&p, b"hello world, not a state file").unwrap();
        let e = StateFile::open(&p, false).err().unwrap().to_string();
        assert!(e.contains("x.fnstate") && e.contains("magic"), "{e}");
        let header = Header {
            version: VERSION,
            model: "m1".into(),
            layout: vec![LayerLayout::Linear { conv: 2, state: 4 }],
            parent: None,
            from: 0,
            pos: 1,
            sections: Vec::new(),
            extra: Value::Null,
        };
        let tokens = 7u32.to_le_bytes();
        write_file(&p, header, &[("tokens".into(), tokens.to_vec())]).unwrap();
        let f = StateFile::open(&p, false).unwrap();
        assert_eq!(f.tokens().unwrap(), vec![7]);
        let e = f.check_model("m2", &[]).unwrap_err().to_string();
        assert!(e.contains("m1") && e.contains("m2"), "{e}");
        let e = f.check_model("m1", &[LayerLayout::Linear { conv: 2, state: 8 }]).unwrap_err().to_string();
        assert!(e.contains("layer 0"), "{e}");
        // One flipped byte in the data is caught by its checksum; a cut file by its length.
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[ALIGN as usize] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        let e = StateFile::open(&p, false).unwrap().tokens().unwrap_err().to_string();
        assert!(e.contains("damaged"), "{e}");
        std::fs::write(&p, &bytes[..bytes.len() - 5]).unwrap();
        let e = StateFile::open(&p, false).err().unwrap().to_string();
        assert!(e.contains("cut short"), "{e}");
    }
}
