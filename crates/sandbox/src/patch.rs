//! A workspace's changes as a patch, taken by git running **inside the sandbox**.
//!
//! The workspace is untrusted: the agent (or a task's own scripts) could have planted hooks,
//! filters, a textconv driver or an fsmonitor in its `.git/config`, and those must never run
//! on the host. So every git command here is a sandboxed [`Command`] with the system and
//! global git configuration switched off.
//!
//! The patch is kept as bytes end to end (`git diff --binary`): file names and contents that
//! are not UTF-8 survive, binary files come back as git binary patches. A file too large for
//! a reviewable patch (over [`PatchLimits::max_file_bytes`] in the base commit or the
//! workspace) is left out and named in [`Patch::left_out`], so one 300 MB artefact never
//! costs the rest of the change.

use crate::{Command, Isolation, Output, Sandbox, SandboxError, SandboxSpec};
use std::path::Path;
use std::time::Duration;

/// Default largest file (either side of the change) that goes into a patch.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 8 << 20;
/// Default largest patch.
pub const DEFAULT_MAX_PATCH_BYTES: usize = 128 << 20;

/// How large a patch and the files in it may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchLimits {
    /// A changed file larger than this (in the base commit or in the workspace) is left out.
    pub max_file_bytes: u64,
    /// The whole patch at most; past it the largest files are left out until it fits.
    pub max_patch_bytes: usize,
}

impl Default for PatchLimits {
    fn default() -> Self {
        PatchLimits { max_file_bytes: DEFAULT_MAX_FILE_BYTES, max_patch_bytes: DEFAULT_MAX_PATCH_BYTES }
    }
}

/// A changed file that is not in the patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftOutFile {
    /// Path inside the workspace (lossy UTF-8, for people to read).
    pub path: String,
    /// Its size in bytes (the larger of the base and workspace versions).
    pub bytes: u64,
    /// Why it was left out.
    pub reason: String,
}

/// The workspace's changes against a base commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Patch {
    /// The patch exactly as git wrote it (apply with `git apply`).
    pub bytes: Vec<u8>,
    /// Changed files left out of [`Patch::bytes`].
    pub left_out: Vec<LeftOutFile>,
    /// Files whose change is a git binary patch.
    pub binary_files: Vec<String>,
}

impl Patch {
    /// The patch as text, for JSON records and display (bytes that are not UTF-8 become
    /// U+FFFD; write [`Patch::bytes`] to files).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// True when nothing changed (or everything that changed was left out).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The paths the patch changes, in patch order (lossy UTF-8; quoted names stay quoted).
    pub fn files(&self) -> Vec<String> {
        changed_files(&self.bytes)
    }
}

/// The paths a git patch changes, read from its `diff --git` lines.
pub fn changed_files(patch: &[u8]) -> Vec<String> {
    patch.split(|&b| b == b'\n').filter_map(header_path).collect()
}

/// The path named by one `diff --git a/P b/P` line (both sides equal: no renames here).
fn header_path(line: &[u8]) -> Option<String> {
    let rest = line.strip_prefix(b"diff --git ")?;
    // `a/P b/P` or `"a/P" "b/P"`: the two halves have equal length.
    let half = rest.len().checked_sub(1)? / 2;
    let first = &rest[..half];
    let name =
        first.strip_prefix(b"a/").or_else(|| first.strip_prefix(b"\"a/").map(|n| &n[..n.len().saturating_sub(1)]))?;
    Some(String::from_utf8_lossy(name).into_owned())
}

/// Why a patch could not be taken at all.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The sandbox could not run git.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// A git command failed.
    #[error("cannot compute the workspace diff: `{step}` exited {code}: {stderr}")]
    Git {
        /// The git step that failed.
        step: String,
        /// Its exit status.
        code: i32,
        /// What git said.
        stderr: String,
    },
    /// Even without its largest files the patch is over the limit.
    #[error("cannot compute the workspace diff: the patch is over {limit} bytes even without its largest files")]
    TooLarge {
        /// [`PatchLimits::max_patch_bytes`].
        limit: usize,
    },
}

/// The changes of the checkout at `dir` against `base_commit`: new, modified and deleted files
/// (mode changes and symlinks included, renames as delete + add), binary-safe, with files over
/// the limits left out and listed. git runs in a sandbox of the given isolation.
pub fn workspace_patch(
    dir: &Path,
    base_commit: &str,
    isolation: Isolation,
    limits: PatchLimits,
) -> Result<Patch, PatchError> {
    let sandbox = Sandbox::new(
        SandboxSpec::new(dir)
            .isolation(isolation)
            .timeout(Duration::from_secs(300))
            .output_limit(limits.max_patch_bytes)
            .flood_limit(limits.max_patch_bytes as u64 * 2 + (1 << 20)),
    )?;
    // One git step in the sandbox; a failing step is an error naming it.
    let git = |step: &str, script: &str, stdin: &[u8]| -> Result<Output, PatchError> {
        let out = sandbox.run(&git_command(script).stdin(stdin.to_vec()))?;
        if !out.success() {
            return Err(PatchError::Git {
                step: step.into(),
                code: out.returncode(),
                stderr: out.stderr.trim().into(),
            });
        }
        Ok(out)
    };
    // 1. Stage everything and list what changed, with blob ids of both sides.
    let raw = git(
        "git add -A",
        &format!("git add -A -- . && git diff --cached --raw -z --no-abbrev --no-renames {base_commit}"),
        b"",
    )?
    .stdout_bytes;
    let entries = parse_raw(&raw);
    // 2. Sizes of both sides of every change.
    let ids: Vec<&str> =
        entries.iter().flat_map(|e| [e.old_id.as_str(), e.new_id.as_str()]).filter(|id| !is_null(id)).collect();
    let sizes = if ids.is_empty() {
        std::collections::HashMap::new()
    } else {
        let mut query = ids.join("\n");
        query.push('\n');
        let out = git("git cat-file", "git cat-file --batch-check='%(objectname) %(objectsize)'", query.as_bytes())?;
        String::from_utf8_lossy(&out.stdout_bytes)
            .lines()
            .filter_map(|l| {
                let (id, size) = l.split_once(' ')?;
                Some((id.to_string(), size.parse::<u64>().ok()?))
            })
            .collect()
    };
    let size_of = |id: &str| sizes.get(id).copied().unwrap_or(0);
    let mut sized: Vec<(&RawEntry, u64)> =
        entries.iter().map(|e| (e, size_of(&e.old_id).max(size_of(&e.new_id)))).collect();
    sized.sort_by_key(|e| std::cmp::Reverse(e.1));
    // 3. Leave out files over the per-file limit, then the largest ones until the rest is
    //    expected to fit (a binary patch takes about 1.25 bytes per byte, both sides).
    let to_fit = format!("left out to keep the patch under {}", human_bytes(limits.max_patch_bytes as u64));
    let mut left_out: Vec<(&RawEntry, u64, String)> = Vec::new();
    let mut budget: u64 = sized.iter().map(|(_, s)| s * 5 / 2).sum();
    for &(entry, size) in &sized {
        let reason = if size > limits.max_file_bytes {
            format!("larger than the {} per-file limit", human_bytes(limits.max_file_bytes))
        } else if budget > limits.max_patch_bytes as u64 {
            to_fit.clone()
        } else {
            continue;
        };
        budget = budget.saturating_sub(size * 5 / 2);
        left_out.push((entry, size, reason));
    }
    let diff_script = format!(
        "git -c core.quotepath=off diff --cached --binary --no-color --no-ext-diff --no-textconv --no-renames {base_commit}"
    );
    // Files left out so far are unstaged (back to the base commit's version in the index).
    let mut unstaged = 0;
    loop {
        if unstaged < left_out.len() {
            let mut specs = Vec::new();
            for (e, _, _) in &left_out[unstaged..] {
                specs.extend_from_slice(b":(literal)");
                specs.extend_from_slice(&e.path);
                specs.push(0);
            }
            git(
                "git reset (left-out files)",
                &format!("git reset -q {base_commit} --pathspec-from-file=- --pathspec-file-nul"),
                &specs,
            )?;
            unstaged = left_out.len();
        }
        let out = git("git diff", &diff_script, b"")?;
        if !out.truncated {
            let binary_files = binary_files(&out.stdout_bytes);
            let left_out = left_out
                .into_iter()
                .map(|(e, bytes, reason)| LeftOutFile {
                    path: String::from_utf8_lossy(&e.path).into_owned(),
                    bytes,
                    reason,
                })
                .collect();
            return Ok(Patch { bytes: out.stdout_bytes, left_out, binary_files });
        }
        // Larger than estimated: drop the largest file still in and try again.
        match sized.iter().find(|(e, _)| !left_out.iter().any(|(l, _, _)| l.path == e.path)) {
            Some(&(e, size)) => left_out.push((e, size, to_fit.clone())),
            None => return Err(PatchError::TooLarge { limit: limits.max_patch_bytes }),
        }
    }
}

/// `bash -c SCRIPT` with git's system and global configuration off and the checkout trusted
/// whoever owns it inside the sandbox.
fn git_command(script: &str) -> Command {
    Command::new("bash")
        .arg("-c")
        .arg(script)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "safe.directory")
        .env("GIT_CONFIG_VALUE_0", "*")
}

/// One record of `git diff --raw -z --no-abbrev`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RawEntry {
    old_id: String,
    new_id: String,
    path: Vec<u8>,
}

fn is_null(id: &str) -> bool {
    id.bytes().all(|b| b == b'0')
}

/// Parses `:OLDMODE NEWMODE OLDID NEWID STATUS\0PATH\0` records.
fn parse_raw(raw: &[u8]) -> Vec<RawEntry> {
    let mut fields = raw.split(|&b| b == 0);
    let mut entries = Vec::new();
    while let Some(meta) = fields.next() {
        let Some(meta) = meta.strip_prefix(b":") else { continue };
        let Some(path) = fields.next() else { break };
        let parts: Vec<&[u8]> = meta.split(|&b| b == b' ').collect();
        if parts.len() < 5 {
            continue;
        }
        entries.push(RawEntry {
            old_id: String::from_utf8_lossy(parts[2]).into_owned(),
            new_id: String::from_utf8_lossy(parts[3]).into_owned(),
            path: path.to_vec(),
        });
    }
    entries
}

/// Files whose section of `patch` is a git binary patch.
fn binary_files(patch: &[u8]) -> Vec<String> {
    let mut files = Vec::new();
    let mut current: Option<String> = None;
    for line in patch.split(|&b| b == b'\n') {
        if let Some(path) = header_path(line) {
            current = Some(path);
        } else if line == b"GIT binary patch" {
            if let Some(path) = current.take() {
                files.push(path);
            }
        }
    }
    files
}

/// `300.0 MB`, `8.0 MiB`-style sizes for people.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} bytes")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_paths_plain_and_quoted() {
        assert_eq!(header_path(b"diff --git a/src/x.py b/src/x.py").as_deref(), Some("src/x.py"));
        assert_eq!(header_path(b"diff --git a/a b b/a b").as_deref(), Some("a b"));
        assert_eq!(header_path(b"diff --git \"a/t\\tab\" \"b/t\\tab\"").as_deref(), Some("t\\tab"));
        assert_eq!(header_path(b"+diff --git a/x b/x"), None);
    }

    #[test]
    fn raw_records_parse() {
        let raw = b":100644 100644 aa bb M\0a\0:000000 100644 00 cc A\0dir/\xff.txt\0";
        let e = parse_raw(raw);
        assert_eq!(e.len(), 2);
        assert_eq!(e[1].path, b"dir/\xff.txt");
        assert!(is_null(&e[1].old_id));
    }

    #[test]
    fn sizes_for_people() {
        assert_eq!(human_bytes(512), "512 bytes");
        assert_eq!(human_bytes(300 << 20), "300.0 MiB");
    }
}
