//! The rollout store (docs/rl.md §4): an append-only JSONL index, `rollouts.jsonl`, one
//! line per rollout (task, group, attempt, policy version, seed, exit, outcome, turn starts,
//! wall time, where its arrays are), and a binary sidecar, `rollouts.bin`, holding each
//! rollout's arrays back to back: n little-endian u32 token ids, n f32 logprobs, n u8
//! weights.
//!
//! Crash safety: the arrays are written before the index line, so an index line never points
//! at bytes that were not written first. After a crash the index may end in a torn line (no
//! newline, or not JSON): readers skip it with a warning, and opening the store for appending
//! cuts it off so the next line starts clean. Sidecar bytes without an index line are never
//! read.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::rollout::{Outcome, Rollout};

/// Index file name.
pub const INDEX: &str = "rollouts.jsonl";
/// Sidecar file name.
pub const ARRAYS: &str = "rollouts.bin";

/// Bytes per token in the sidecar (u32 id + f32 logprob + u8 weight).
const BYTES_PER_TOKEN: u64 = 9;

/// One line of `rollouts.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IndexEntry {
    /// Task id.
    pub task_id: String,
    /// Group id.
    pub group: u64,
    /// Attempt index within the group.
    pub attempt: u32,
    /// Policy version that sampled it.
    pub policy_version: u64,
    /// Sampling seed.
    pub seed: u64,
    /// The agent's exit reason.
    pub exit: String,
    /// How the attempt counts.
    pub outcome: Outcome,
    /// Start offset of each assistant turn in the token array.
    pub turn_starts: Vec<usize>,
    /// Wall-clock seconds of the attempt.
    pub wall_s: f64,
    /// Tokens in the sequence.
    pub n_tokens: usize,
    /// Tokens with weight 1.
    pub sampled_tokens: usize,
    /// Byte offset of the arrays in `rollouts.bin`.
    pub offset: u64,
}

impl IndexEntry {
    fn of(r: &Rollout, offset: u64) -> IndexEntry {
        IndexEntry {
            task_id: r.task_id.clone(),
            group: r.group,
            attempt: r.attempt,
            policy_version: r.policy_version,
            seed: r.seed,
            exit: r.exit.clone(),
            outcome: r.outcome.clone(),
            turn_starts: r.turn_starts.clone(),
            wall_s: r.wall_s,
            n_tokens: r.tokens.len(),
            sampled_tokens: r.sampled_tokens(),
            offset,
        }
    }

    fn bytes(&self) -> u64 {
        self.n_tokens as u64 * BYTES_PER_TOKEN
    }
}

/// An open store, appending.
pub struct RolloutStore {
    dir: PathBuf,
    index: File,
    arrays: File,
    arrays_len: u64,
}

impl RolloutStore {
    /// Opens (creating) the store in `dir`; a torn last index line from a crash is cut off
    /// with a warning.
    pub fn open(dir: &Path) -> anyhow::Result<RolloutStore> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create rollout store {}", dir.display()))?;
        let index_path = dir.join(INDEX);
        let mut index = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&index_path)
            .with_context(|| format!("cannot open {}", index_path.display()))?;
        let mut text = Vec::new();
        index.read_to_end(&mut text)?;
        if !text.is_empty() && !text.ends_with(b"\n") {
            let keep = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            tracing::warn!(
                "{}: cutting off a torn last record ({} bytes) left by an interrupted write",
                index_path.display(),
                text.len() - keep
            );
            index.set_len(keep as u64)?;
        }
        let arrays_path = dir.join(ARRAYS);
        let arrays = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&arrays_path)
            .with_context(|| format!("cannot open {}", arrays_path.display()))?;
        let arrays_len = arrays.metadata()?.len();
        Ok(RolloutStore { dir: dir.to_path_buf(), index, arrays, arrays_len })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends one rollout (arrays first, then its index line). Arrays of unequal length
    /// are refused.
    pub fn append(&mut self, r: &Rollout) -> anyhow::Result<IndexEntry> {
        anyhow::ensure!(
            r.tokens.len() == r.logprobs.len() && r.tokens.len() == r.weights.len(),
            "rollout of {}: {} tokens, {} logprobs, {} weights",
            r.task_id,
            r.tokens.len(),
            r.logprobs.len(),
            r.weights.len()
        );
        let entry = IndexEntry::of(r, self.arrays_len);
        let mut buf = Vec::with_capacity(entry.bytes() as usize);
        for t in &r.tokens {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        for l in &r.logprobs {
            buf.extend_from_slice(&l.to_le_bytes());
        }
        buf.extend_from_slice(&r.weights);
        self.arrays.write_all(&buf).context("writing rollout arrays")?;
        self.arrays.flush()?;
        self.arrays_len += buf.len() as u64;
        let mut line = serde_json::to_string(&entry)?;
        line.push('\n');
        self.index.write_all(line.as_bytes()).context("writing the rollout index")?;
        self.index.flush()?;
        Ok(entry)
    }

    /// Forces both files to disk.
    pub fn sync(&self) -> anyhow::Result<()> {
        self.arrays.sync_data()?;
        self.index.sync_data()?;
        Ok(())
    }
}

/// What reading a store found.
#[derive(Debug, Clone, Default)]
pub struct StoreContents {
    /// Every complete rollout, in append order.
    pub rollouts: Vec<Rollout>,
    /// Records skipped (a torn tail), each with why.
    pub warnings: Vec<String>,
}

/// Reads the index only (no arrays); a torn last line is skipped with a warning. A bad line
/// elsewhere is an error naming it.
pub fn read_index(dir: &Path) -> anyhow::Result<(Vec<IndexEntry>, Vec<String>)> {
    let path = dir.join(INDEX);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let complete = text.ends_with(b"\n");
    let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    let n = lines.len();
    let (mut out, mut warnings) = (Vec::new(), Vec::new());
    for (i, line) in lines.into_iter().enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        // The last record: the last line when it lacks its newline, else the one before.
        let last = i + 1 == n || (i + 2 == n && complete);
        let torn = i + 1 == n && !complete;
        match serde_json::from_slice::<IndexEntry>(line) {
            Ok(e) if !torn => out.push(e),
            Err(e) if !last => anyhow::bail!("{}:{}: not a rollout index record: {e}", path.display(), i + 1),
            _ => {
                let w = format!("{}:{}: ignoring a torn last record (interrupted write)", path.display(), i + 1);
                tracing::warn!("{w}");
                warnings.push(w);
            }
        }
    }
    Ok((out, warnings))
}

/// Reads every rollout; see [`read_all_with_warnings`].
pub fn read_all(dir: &Path) -> anyhow::Result<Vec<Rollout>> {
    Ok(read_all_with_warnings(dir)?.rollouts)
}

/// Reads every rollout with its arrays. A torn last index line, or a last record whose
/// arrays run past the end of the sidecar, is skipped with a warning; damage elsewhere is an
/// error.
pub fn read_all_with_warnings(dir: &Path) -> anyhow::Result<StoreContents> {
    let (entries, mut warnings) = read_index(dir)?;
    let mut out = StoreContents::default();
    if entries.is_empty() {
        out.warnings = warnings;
        return Ok(out);
    }
    let path = dir.join(ARRAYS);
    let mut f = File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
    let len = f.metadata()?.len();
    let n = entries.len();
    for (i, e) in entries.into_iter().enumerate() {
        if e.offset + e.bytes() > len {
            let w = format!(
                "{}: record {} ({}) needs bytes {}..{} but the file has {len}",
                path.display(),
                i + 1,
                e.task_id,
                e.offset,
                e.offset + e.bytes()
            );
            if i + 1 == n {
                tracing::warn!("{w}; ignoring it");
                warnings.push(w);
                break;
            }
            anyhow::bail!("{w}");
        }
        f.seek(SeekFrom::Start(e.offset))?;
        let mut buf = vec![0u8; e.bytes() as usize];
        f.read_exact(&mut buf)?;
        let k = e.n_tokens;
        let word = |j: usize| [buf[4 * j], buf[4 * j + 1], buf[4 * j + 2], buf[4 * j + 3]];
        let tokens = (0..k).map(|j| u32::from_le_bytes(word(j))).collect();
        let logprobs = (k..2 * k).map(|j| f32::from_le_bytes(word(j))).collect();
        let weights = buf[8 * k..].to_vec();
        out.rollouts.push(Rollout {
            task_id: e.task_id,
            group: e.group,
            attempt: e.attempt,
            policy_version: e.policy_version,
            seed: e.seed,
            tokens,
            logprobs,
            weights,
            turn_starts: e.turn_starts,
            exit: e.exit,
            outcome: e.outcome,
            wall_s: e.wall_s,
        });
    }
    out.warnings = warnings;
    Ok(out)
}
