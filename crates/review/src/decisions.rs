//! The reviewer's decisions on a run, kept next to it in `review.jsonl` (one JSON object a
//! line, appended, never rewritten), and the two that change things: Apply (after `git apply
//! --check`) and Send back (a continued run, [`crate::ReviewServer`] starts it).

use anyhow::{bail, Context};
use frognano_agent::run_dir::{self, RunInfo};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// One decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Seconds since the Unix epoch.
    pub at_unix: u64,
    /// Who decided (`frognano review --reviewer`, default the login name).
    pub by: String,
    /// `apply`, `apply_refused`, `reject` or `send_back`.
    pub action: String,
    /// The reviewer's note or comment.
    #[serde(default)]
    pub note: String,
    /// What came of it (`applied to /repo`, the refusal's reason, the new run).
    #[serde(default)]
    pub outcome: String,
}

/// Actions that set a run's review state (a refused Apply does not).
const STATE_ACTIONS: [&str; 3] = ["apply", "reject", "send_back"];

/// The decisions recorded for the run in `dir`, oldest first; lines that are not decisions
/// are reported in the second list (file and line number), not dropped silently.
pub fn load(dir: &Path) -> (Vec<Decision>, Vec<String>) {
    let path = dir.join(run_dir::REVIEW_LOG);
    let Ok(text) = std::fs::read_to_string(&path) else { return (Vec::new(), Vec::new()) };
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        match serde_json::from_str::<Decision>(line) {
            Ok(d) => out.push(d),
            Err(e) => problems.push(format!("{} line {}: not a decision ({e})", path.display(), i + 1)),
        }
    }
    (out, problems)
}

/// The decision that gives the run its state: the last Apply, Reject or Send back.
pub fn state(decisions: &[Decision]) -> Option<&Decision> {
    decisions.iter().rev().find(|d| STATE_ACTIONS.contains(&d.action.as_str()))
}

/// Appends `d` to the run's `review.jsonl`.
pub fn record(dir: &Path, d: &Decision) -> anyhow::Result<()> {
    let path = dir.join(run_dir::REVIEW_LOG);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("cannot record the decision in {}", path.display()))?;
    writeln!(f, "{}", serde_json::to_string(d)?)?;
    Ok(())
}

/// Applies the run's patch to its repository's working tree. `git apply --check` runs
/// first: when the patch no longer applies (the repository moved on, or it was applied
/// already) nothing is touched and the error says why, with the commit the run started from
/// and the one the repository is at now. Returns the repository.
pub fn apply(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let info =
        RunInfo::load(dir).context("the run does not say which repository it belongs to, so it cannot be applied")?;
    let patch_path = dir.join(run_dir::PATCH);
    let patch = std::fs::read(&patch_path).with_context(|| format!("cannot read {}", patch_path.display()))?;
    if patch.iter().all(u8::is_ascii_whitespace) {
        bail!("the run changed nothing: {} is empty", patch_path.display());
    }
    let repo = info.repo;
    if !repo.is_dir() {
        bail!("the run's repository {} does not exist any more", repo.display());
    }
    let check = frognano_agent::workspace::git_apply(&repo, &patch, true)?;
    if let Err(reason) = check {
        let head = git(&repo, &["rev-parse", "HEAD"]).unwrap_or_default();
        let moved = if !head.is_empty() && head != info.base_commit {
            format!(
                " The run started from commit {}; the repository is now at {}.",
                short(&info.base_commit),
                short(&head)
            )
        } else {
            String::new()
        };
        bail!(
            "git apply --check refused the patch in {}: {}.{moved}",
            repo.display(),
            reason.trim().trim_end_matches('.')
        );
    }
    if let Err(reason) = frognano_agent::workspace::git_apply(&repo, &patch, false)? {
        bail!("git apply failed in {}: {}", repo.display(), reason.trim());
    }
    Ok(repo)
}

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}

fn git(repo: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git").arg("-C").arg(repo).args(args).stdin(Stdio::null()).output()?;
    if !out.status.success() {
        bail!("git {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
