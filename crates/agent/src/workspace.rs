//! The workspace the agent edits: a private clone of the user's repository at its HEAD
//! commit, never the user's checkout. The result is `git diff` against that base commit,
//! new and deleted files included.
//!
//! The diff is taken by running git **inside the sandbox**: the agent could have planted
//! hooks, filters or an fsmonitor in the workspace's `.git/config`, and those must not run
//! on the host.

use anyhow::{bail, Context};
use frognano_sandbox::patch::{workspace_patch, Patch, PatchLimits};
use frognano_sandbox::{scratch, Isolation};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A private clone of a repository for one run. Deleted when dropped. Objects are copied,
/// not hard-linked or shared: inside the sandbox the agent could otherwise rewrite an object
/// file of the user's repository (and the sandbox's private /tmp would hide a repository
/// under /tmp from `--shared` alternates).
pub struct Workspace {
    _dir: tempfile::TempDir,
    path: PathBuf,
    base_commit: String,
    repo: PathBuf,
}

/// Runs trusted git on the host (only against the user's repository and our fresh clone,
/// before any untrusted code ran in it).
fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run git (is it installed?)")?;
    if !out.status.success() {
        bail!("git {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Checks that `repo` is the top of a git repository with at least one commit and, unless
/// `allow_dirty`, no uncommitted changes. Returns the canonical path.
pub fn check_repo(repo: &Path, allow_dirty: bool) -> anyhow::Result<PathBuf> {
    let repo = repo.canonicalize().with_context(|| format!("repository {} does not exist", repo.display()))?;
    let top = git(&repo, &["rev-parse", "--show-toplevel"])
        .map_err(|_| anyhow::anyhow!("{} is not a git repository", repo.display()))?;
    let top = PathBuf::from(top.trim());
    if git(&repo, &["rev-parse", "--verify", "-q", "HEAD"]).is_err() {
        bail!("{} has no commits yet; commit the code the agent should start from", top.display());
    }
    if !allow_dirty {
        let status = git(&top, &["status", "--porcelain"])?;
        if !status.trim().is_empty() {
            let first: Vec<&str> = status.lines().take(5).collect();
            bail!(
                "{} has uncommitted changes ({}{}); commit or stash them, or pass --allow-dirty \
                 (the agent starts from HEAD either way)",
                top.display(),
                first.join(", ").trim(),
                if status.lines().count() > 5 { ", ..." } else { "" }
            );
        }
    }
    Ok(top)
}

impl Workspace {
    /// Clones `repo` (checked with [`check_repo`]) at HEAD into a fresh temporary directory.
    pub fn create(repo: &Path, allow_dirty: bool) -> anyhow::Result<Self> {
        let repo = check_repo(repo, allow_dirty)?;
        let base_commit = git(&repo, &["rev-parse", "HEAD"])?.trim().to_string();
        Self::clone_at(repo, base_commit)
    }

    /// Clones `repo` at `commit` (not its HEAD: a continued run goes on from the commit its
    /// parent started at, whatever the repository did since). The working tree of `repo` may
    /// be dirty; only committed objects are copied.
    pub fn create_at(repo: &Path, commit: &str) -> anyhow::Result<Self> {
        let repo = check_repo(repo, true)?;
        let base_commit = git(&repo, &["rev-parse", "--verify", "-q", &format!("{commit}^{{commit}}")])
            .map_err(|_| anyhow::anyhow!("{} has no commit {commit} (was it rebased away?)", repo.display()))?
            .trim()
            .to_string();
        Self::clone_at(repo, base_commit)
    }

    fn clone_at(repo: PathBuf, base_commit: String) -> anyhow::Result<Self> {
        let root = std::env::temp_dir();
        let dir = scratch::scratch_dir(&root, "workspace")
            .with_context(|| format!("cannot create a temporary workspace in {}", root.display()))?;
        let path = dir.path().join("repo");
        let out = Command::new("git")
            .args(["clone", "-q", "--no-checkout", "--no-hardlinks"])
            .arg(&repo)
            .arg(&path)
            .stdin(Stdio::null())
            .output()
            .context("cannot run git clone")?;
        if !out.status.success() {
            bail!("cannot copy {} into a workspace: {}", repo.display(), String::from_utf8_lossy(&out.stderr).trim());
        }
        git(&path, &["checkout", "-q", "--detach", &base_commit])?;
        // Commits the agent makes need an identity; never the user's global one.
        git(&path, &["config", "user.name", "frognano"])?;
        git(&path, &["config", "user.email", "frognano@localhost"])?;
        let path = path.canonicalize()?;
        Ok(Workspace { _dir: dir, path, base_commit, repo })
    }

    /// The workspace directory (give this to the sandbox and tools).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The commit the run started from.
    pub fn base_commit(&self) -> &str {
        &self.base_commit
    }

    /// The user's repository this workspace was cloned from.
    pub fn repo(&self) -> &Path {
        &self.repo
    }

    /// The workspace's changes against the base commit (new and deleted files included,
    /// binary-safe, kept as bytes; files over the default limits left out and listed),
    /// computed by git running in a sandbox of the given isolation.
    pub fn diff(&self, isolation: Isolation) -> anyhow::Result<Patch> {
        diff_in_sandbox(&self.path, &self.base_commit, isolation)
    }
}

/// The changes of the checkout at `dir` against `base_commit` (see
/// [`frognano_sandbox::patch::workspace_patch`]): git runs in a sandbox of the given
/// isolation, so hooks, filters or an fsmonitor the agent planted never run on the host.
pub fn diff_in_sandbox(dir: &Path, base_commit: &str, isolation: Isolation) -> anyhow::Result<Patch> {
    Ok(workspace_patch(dir, base_commit, isolation, PatchLimits::default())?)
}

/// Applies `patch` to the user's repository `repo` (checking first that it applies
/// cleanly, so a failure leaves the tree untouched).
pub fn apply_patch(repo: &Path, patch: &[u8]) -> anyhow::Result<()> {
    if patch.iter().all(u8::is_ascii_whitespace) {
        bail!("the patch is empty; nothing to apply");
    }
    for check in [true, false] {
        if let Err(reason) = git_apply(repo, patch, check)? {
            bail!("the patch does not apply to {}: {}", repo.display(), reason.trim());
        }
    }
    Ok(())
}

/// `git apply [--check] -` on `repo` with `patch` on its stdin: `Ok(Err(stderr))` when git
/// refuses it, `Err` when git cannot be run.
pub fn git_apply(repo: &Path, patch: &[u8], check: bool) -> anyhow::Result<Result<(), String>> {
    let mut cmd = Command::new("git");
    cmd.arg("-C").arg(repo).arg("apply");
    if check {
        cmd.arg("--check");
    }
    let mut child = cmd
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run git (is it installed?)")?;
    child.stdin.take().context("git's stdin was piped")?.write_all(patch)?;
    let out = child.wait_with_output()?;
    Ok(if out.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&out.stderr).into_owned()) })
}
