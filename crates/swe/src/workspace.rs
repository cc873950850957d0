//! The workspace of one instance, shared by both ways of verifying it ([`crate::executor`]
//! for SWE-bench eval scripts, [`crate::harbor`] for Harbor verifiers): a git checkout at
//! `base_commit` with later history invisible, the model patch applied with swebench 5.0.2's
//! fallback chain inside `frognano-sandbox`, and the result types of a run.

use std::path::{Path, PathBuf};
use std::time::Duration;

use frognano_sandbox::{Command, Isolation, Sandbox, SandboxSpec};
use serde_json::Value;

use crate::grading::{APPLY_PATCH_FAIL, APPLY_PATCH_PASS};
use crate::instance::{repo_source, Prediction, SweInstance};
use crate::report::LOG_PATCH;

/// swebench 5.0.2's `GIT_APPLY_CMDS`, tried in order on the patch file.
pub const GIT_APPLY_CMDS: &[&str] = &[
    "git apply --verbose",
    "git apply --verbose --3way",
    "git apply --verbose --reject",
    "patch --batch --forward --fuzz=5 -p1 -i",
];

/// How instances are executed.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// Directory with one clone per repository (`owner__name` or `name`).
    pub repos: Option<PathBuf>,
    /// Limit of the eval script (swebench's `--timeout`, default 1800 s).
    pub timeout: Duration,
    /// Confinement of the commands.
    pub isolation: Isolation,
    /// Where workspaces are created (removed after each instance).
    pub work_root: PathBuf,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            repos: None,
            timeout: Duration::from_secs(1800),
            isolation: Isolation::Bubblewrap,
            work_root: std::env::temp_dir(),
        }
    }
}

/// How one instance ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Graded; all FAIL_TO_PASS and PASS_TO_PASS succeed.
    Resolved,
    /// Graded; not resolved.
    Unresolved,
    /// `model_patch` empty or null: not run (swebench's empty-patch instances).
    EmptyPatch,
    /// No report: the instance could not be graded (swebench's error instances).
    Error(ErrorKind),
}

/// Why an instance is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// The repository or base commit could not be found.
    RepoMissing(String),
    /// No command of the apply chain applied the patch.
    PatchApplyFailed,
    /// The eval script ran past the timeout.
    TestTimeout(u64),
    /// The sandbox could not run the script, or the grader raised.
    Infra(String),
    /// The instance's recorded environment could not be rebuilt ([`crate::env_record`]).
    Environment(String),
}

impl Outcome {
    /// Short machine-readable label for result files.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Resolved => "resolved",
            Outcome::Unresolved => "unresolved",
            Outcome::EmptyPatch => "empty_patch",
            Outcome::Error(ErrorKind::RepoMissing(_)) => "error_repo_missing",
            Outcome::Error(ErrorKind::PatchApplyFailed) => "error_patch_apply_failed",
            Outcome::Error(ErrorKind::TestTimeout(_)) => "error_test_timeout",
            Outcome::Error(ErrorKind::Infra(_)) => "error",
            Outcome::Error(ErrorKind::Environment(_)) => "error_environment",
        }
    }

    /// Human-readable detail of an error.
    pub fn detail(&self) -> Option<String> {
        match self {
            Outcome::Error(ErrorKind::RepoMissing(m))
            | Outcome::Error(ErrorKind::Infra(m))
            | Outcome::Error(ErrorKind::Environment(m)) => Some(m.clone()),
            Outcome::Error(ErrorKind::PatchApplyFailed) => {
                Some("patch did not apply with any command of the fallback chain".into())
            }
            Outcome::Error(ErrorKind::TestTimeout(s)) => Some(format!("tests ran past the {s} s timeout")),
            _ => None,
        }
    }
}

/// The result of running one prediction.
#[derive(Debug, Clone)]
pub struct InstanceResult {
    /// Instance id.
    pub instance_id: String,
    /// How it ended.
    pub outcome: Outcome,
    /// `report.json` content when graded.
    pub report: Option<Value>,
    /// Whether the model patch applied (false when not tried).
    pub patch_applied: bool,
    /// Seconds spent, total.
    pub seconds: f64,
    /// Seconds spent in the eval script (test command included).
    pub test_seconds: f64,
}

/// Creates `dest` as a repository containing `base_commit` and its history only, checked out
/// detached at it: later commits, branches and tags of the source are not fetched, so the
/// agent cannot see the fix in the future history.
pub fn create_workspace(source: &Path, base_commit: &str, dest: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dest)?;
    let src =
        source.canonicalize().map_err(|e| anyhow::anyhow!("repository {} not readable: {e}", source.display()))?;
    let git = |args: &[&str]| -> anyhow::Result<std::process::Output> {
        let out = std::process::Command::new("git")
            .args(["-c", "safe.directory=*"])
            .args(args)
            .current_dir(dest)
            .output()
            .map_err(|e| anyhow::anyhow!("cannot run git: {e}"))?;
        Ok(out)
    };
    let ok = |out: std::process::Output, what: &str| -> anyhow::Result<()> {
        anyhow::ensure!(out.status.success(), "{what} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        Ok(())
    };
    ok(git(&["init", "-q"])?, "git init")?;
    let src_str = src.to_string_lossy().to_string();
    ok(
        git(&["fetch", "-q", "--no-tags", &src_str, base_commit])?,
        &format!("fetching base commit {base_commit} from {src_str}"),
    )?;
    ok(git(&["checkout", "-q", "--detach", "FETCH_HEAD"])?, "checkout of the base commit")?;
    // The fetched commit may be named by a short hash; make sure it is the one asked for.
    let head = git(&["rev-parse", "HEAD"])?;
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    anyhow::ensure!(
        head.starts_with(base_commit) || base_commit.starts_with(&head),
        "base commit {base_commit} resolved to {head}"
    );
    std::fs::remove_file(dest.join(".git/FETCH_HEAD")).ok();
    Ok(())
}

/// The sandbox settings every command of an instance runs under.
pub(crate) fn sandbox_spec(ws: &Path, opts: &ExecOptions, timeout: Duration) -> SandboxSpec {
    SandboxSpec::new(ws)
        .isolation(opts.isolation)
        .timeout(timeout)
        .output_limit(64 << 20)
        .flood_limit(256 << 20)
        // Inside the sandbox the workspace may appear owned by another uid.
        .env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "safe.directory")
        .env("GIT_CONFIG_VALUE_0", "*")
}

/// Runs `script` with bash in the sandbox, stdout and stderr merged as in the harness.
pub(crate) fn run_merged(sb: &Sandbox, script: &str, timeout: Duration) -> anyhow::Result<(String, i32, bool)> {
    let cmd = Command::new("bash").arg("-c").arg(format!("exec 2>&1\n{script}")).timeout(timeout);
    let out = sb.run(&cmd).map_err(|e| anyhow::anyhow!("{e}"))?;
    let code = out.returncode();
    Ok((out.stdout, code, out.timed_out))
}

/// Applies the patch at `patch_file` with the 5.0.2 chain; returns the log lines and whether
/// it applied (an already-applied patch counts as applied).
pub fn apply_patch_chain(sb: &Sandbox, patch_file: &Path) -> anyhow::Result<(String, bool)> {
    let p = crate::eval_script::shell_quote(&patch_file.to_string_lossy());
    let mut log = String::new();
    for (i, cmd) in GIT_APPLY_CMDS.iter().enumerate() {
        if i > 0 {
            run_merged(sb, "git checkout -- . ; git clean -fd", Duration::from_secs(120))?;
        }
        let (out, code, _) = run_merged(sb, &format!("{cmd} {p}"), Duration::from_secs(300))?;
        log.push_str(&format!("$ {cmd} patch.diff\n{out}"));
        if code == 0 {
            log.push_str(&format!("{APPLY_PATCH_PASS}:\n"));
            return Ok((log, true));
        }
        log.push_str(&format!("Failed to apply patch to container: {cmd}\n"));
    }
    let (_, code, _) = run_merged(sb, &format!("git apply --check --reverse {p}"), Duration::from_secs(120))?;
    if code == 0 {
        log.push_str(&format!("{APPLY_PATCH_PASS} (already applied)\n"));
        return Ok((log, true));
    }
    log.push_str(&format!("{APPLY_PATCH_FAIL}:\n"));
    Ok((log, false))
}

/// Key of an instance's `extra` field listing host folders its test command reads (a
/// virtualenv made by `frognano synth`): each is shown read-only in the instance's sandbox,
/// even under `/tmp` or in a masked home.
pub const READABLE_PATHS_KEY: &str = "frognano_readable_paths";

/// The host folders `inst`'s commands need to read ([`READABLE_PATHS_KEY`]).
pub fn instance_readable_paths(inst: &SweInstance) -> Vec<PathBuf> {
    inst.extra
        .get(READABLE_PATHS_KEY)
        .and_then(|v| v.as_array())
        .map(|paths| paths.iter().filter_map(|p| p.as_str()).map(PathBuf::from).collect())
        .unwrap_or_default()
}

/// A workspace for `inst` at its base commit, in a temporary folder under `opts.work_root`
/// (removed when the returned holder drops), with the prediction's patch written to the log
/// folder and applied through the 5.0.2 fallback chain (its log appended to `log`). Returns
/// the holder, the workspace path and a sandbox over it whose commands get `timeout`.
pub(crate) fn patched_workspace(
    inst: &SweInstance,
    pred: &Prediction,
    opts: &ExecOptions,
    log_dir: &Path,
    log: &mut String,
    timeout: Duration,
) -> Result<(tempfile::TempDir, PathBuf, Sandbox), ErrorKind> {
    let infra = |e: anyhow::Error| ErrorKind::Infra(format!("{e:#}"));
    let source = repo_source(inst, opts.repos.as_deref()).map_err(|e| ErrorKind::RepoMissing(format!("{e:#}")))?;
    let holder =
        frognano_sandbox::scratch::scratch_dir(&opts.work_root, &inst.instance_id).map_err(|e| infra(e.into()))?;
    let ws = holder.path().join("repo");
    create_workspace(&source, &inst.base_commit, &ws).map_err(|e| ErrorKind::RepoMissing(format!("{e:#}")))?;
    let patch = pred.model_patch.clone().unwrap_or_default();
    std::fs::write(log_dir.join(LOG_PATCH), &patch).map_err(|e| infra(e.into()))?;
    // Inside the workspace's git dir: readable in the sandbox (its /tmp is private), and
    // untouched by `git clean`.
    let patch_file = ws.join(".git/frognano-patch.diff");
    std::fs::write(&patch_file, &patch).map_err(|e| infra(e.into()))?;
    let mut spec = sandbox_spec(&ws, opts, timeout);
    for path in instance_readable_paths(inst) {
        spec = spec.readable_path(path);
    }
    let sb = Sandbox::new(spec).map_err(|e| infra(anyhow::anyhow!("{e}")))?;
    let (apply_log, applied) = apply_patch_chain(&sb, &patch_file).map_err(infra)?;
    log.push_str(&apply_log);
    if !applied {
        return Err(ErrorKind::PatchApplyFailed);
    }
    Ok((holder, ws, sb))
}
