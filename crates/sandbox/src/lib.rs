//! # frognano-sandbox
//!
//! Runs untrusted commands (the agent's Bash tool, the test runs of `frognano-swe`, the
//! validation runs of `frognano-synth`) with:
//!
//! - **no network** (a fresh network namespace with only a loopback device),
//! - **writes confined** to the workspace directory and a private, empty `/tmp`
//!   (the rest of the file system is mounted read-only),
//! - a **wall-clock limit** ([`SandboxSpec::timeout`], overridable per [`Command`]),
//! - an **output cap** per stream ([`SandboxSpec::output_limit`]); a command that floods far
//!   past it ([`SandboxSpec::flood_limit`]) is stopped,
//! - a **process-count limit** ([`SandboxSpec::max_processes`]) where a pids cgroup is
//!   writable (as root in our containers and CI), which bounds fork bombs,
//! - the **whole process tree killed** when the command ends or times out, background and
//!   `setsid` children included.
//!
//! ## How
//!
//! Confinement uses bubblewrap (`bwrap`, Debian package `bubblewrap`): `--ro-bind / /`,
//! `--tmpfs /tmp`, `--bind WORKSPACE WORKSPACE`, `--unshare-all` (user, pid, net, ipc, uts,
//! cgroup namespaces), `--die-with-parent`, `--new-session`. Because the command runs in its
//! own pid namespace, the kernel kills every process left in it the moment the command
//! (pid 2 under bwrap's init) exits, or bwrap is killed. We checked that bwrap works in our
//! containers, running as root (it creates its user namespace itself); [`Sandbox::new`]
//! probes it once and refuses with bwrap's own error message if it does not work.
//!
//! Where bwrap is missing or broken, [`Sandbox::new`] returns [`SandboxError::Unavailable`]
//! unless the caller asked for [`Isolation::Unconfined`] explicitly (the CLI's
//! `--no-sandbox`). Unconfined runs still get the time limit, output cap, process-group and
//! cgroup kill, but neither network nor write confinement.
//!
//! The pids cgroup (v1 `pids` hierarchy or a v2 hierarchy with the `pids` controller) is
//! used when this process may create child groups there; [`Sandbox::process_limit_enforced`]
//! says whether it is. `RLIMIT_NPROC` is not used: the kernel ignores it for root, and for
//! other users it counts every process of the user, not those of one command.
//!
//! ```no_run
//! use frognano_sandbox::{Command, Sandbox, SandboxSpec};
//! use std::time::Duration;
//!
//! let sandbox = Sandbox::new(SandboxSpec::new("/tmp/work").timeout(Duration::from_secs(30)))?;
//! let out = sandbox.run(&Command::bash("cargo test 2>&1 | tail -5"))?;
//! println!("exit {:?}, timed out {}: {}", out.exit_code, out.timed_out, out.stdout);
//! # Ok::<(), frognano_sandbox::SandboxError>(())
//! ```

pub mod patch;
pub mod scratch;

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Default wall-clock limit of one command.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Default number of bytes kept of each of stdout and stderr.
pub const DEFAULT_OUTPUT_LIMIT: usize = 1 << 20;
/// Default number of bytes (both streams together) after which a command is stopped.
pub const DEFAULT_FLOOD_LIMIT: u64 = 64 << 20;
/// Default limit on the number of processes (and threads) of one command.
pub const DEFAULT_MAX_PROCESSES: u32 = 512;

/// Whether commands are confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Confine with bubblewrap; [`Sandbox::new`] fails if bwrap is missing or broken.
    Bubblewrap,
    /// Run commands directly on the host, without network or write confinement. Only for
    /// trusted commands or when the user explicitly opted out (`--no-sandbox`); time limit,
    /// output cap and tree kill still apply.
    Unconfined,
}

/// Everything that stays the same across the commands run in one workspace.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// The only directory (besides a private `/tmp`) the command may write; also the default
    /// working directory.
    pub workspace: PathBuf,
    /// Confinement mode.
    pub isolation: Isolation,
    /// Give the command the host's network (off by default).
    pub network: bool,
    /// Wall-clock limit, unless a [`Command`] sets its own.
    pub timeout: Duration,
    /// Bytes kept of each of stdout and stderr; the rest is counted and dropped.
    pub output_limit: usize,
    /// Total bytes of output after which the command is killed (a flood).
    pub flood_limit: u64,
    /// Maximum number of processes/threads alive at once (enforced where a pids cgroup is
    /// available, see [`Sandbox::process_limit_enforced`]).
    pub max_processes: u32,
    /// Extra environment variables for every command.
    pub env: Vec<(String, String)>,
    /// Extra host paths mounted read-write inside the sandbox (e.g. a shared build cache).
    pub writable_paths: Vec<PathBuf>,
}

impl SandboxSpec {
    /// A confined, offline spec for `workspace` with the default limits.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        SandboxSpec {
            workspace: workspace.into(),
            isolation: Isolation::Bubblewrap,
            network: false,
            timeout: DEFAULT_TIMEOUT,
            output_limit: DEFAULT_OUTPUT_LIMIT,
            flood_limit: DEFAULT_FLOOD_LIMIT,
            max_processes: DEFAULT_MAX_PROCESSES,
            env: Vec::new(),
            writable_paths: Vec::new(),
        }
    }
    /// Sets the confinement mode.
    pub fn isolation(mut self, isolation: Isolation) -> Self {
        self.isolation = isolation;
        self
    }
    /// Allows or forbids network access.
    pub fn network(mut self, allowed: bool) -> Self {
        self.network = allowed;
        self
    }
    /// Sets the default wall-clock limit.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
    /// Sets the bytes kept per stream.
    pub fn output_limit(mut self, bytes: usize) -> Self {
        self.output_limit = bytes;
        self
    }
    /// Sets the total output after which the command is killed.
    pub fn flood_limit(mut self, bytes: u64) -> Self {
        self.flood_limit = bytes;
        self
    }
    /// Sets the process-count limit.
    pub fn max_processes(mut self, n: u32) -> Self {
        self.max_processes = n;
        self
    }
    /// Adds an environment variable for every command.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
    /// Mounts another host path read-write.
    pub fn writable_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.writable_paths.push(path.into());
        self
    }
}

/// One command to run in a [`Sandbox`].
#[derive(Debug, Clone)]
pub struct Command {
    /// Program name (looked up in `PATH`) or path.
    pub program: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Working directory; relative paths are taken from the workspace. Default: workspace.
    pub cwd: Option<PathBuf>,
    /// Overrides [`SandboxSpec::timeout`].
    pub timeout: Option<Duration>,
    /// Bytes written to the command's stdin (then closed). Default: empty stdin.
    pub stdin: Vec<u8>,
    /// Extra environment variables for this command.
    pub env: Vec<(String, String)>,
}

impl Command {
    /// Runs `program` with no arguments.
    pub fn new(program: impl Into<String>) -> Self {
        Command {
            program: program.into(),
            args: Vec::new(),
            cwd: None,
            timeout: None,
            stdin: Vec::new(),
            env: Vec::new(),
        }
    }
    /// `bash -lc SCRIPT`, the way the agent's Bash tool runs commands.
    pub fn bash(script: impl Into<String>) -> Self {
        Command::new("bash").arg("-lc").arg(script)
    }
    /// Adds one argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }
    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }
    /// Sets the working directory (relative to the workspace unless absolute).
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }
    /// Sets this command's wall-clock limit.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
    /// Sets the bytes fed to stdin.
    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.stdin = bytes.into();
        self
    }
    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// What a finished (or stopped) command left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Exit status if the command exited normally; `None` if a signal ended it (including
    /// our own kill on timeout or flood).
    pub exit_code: Option<i32>,
    /// The signal that ended the command, if any.
    pub signal: Option<i32>,
    /// Captured stdout (lossy UTF-8), at most `output_limit` bytes of it.
    pub stdout: String,
    /// Captured stderr (lossy UTF-8), at most `output_limit` bytes of it.
    pub stderr: String,
    /// Captured stdout exactly as the command wrote it (the bytes behind [`Output::stdout`]),
    /// for output that must survive byte for byte, such as a patch with non-UTF-8 content.
    pub stdout_bytes: Vec<u8>,
    /// The wall-clock limit was reached and the command was killed.
    pub timed_out: bool,
    /// Some output was dropped because of the output cap (or the command was stopped for
    /// flooding, see [`Output::flooded`]).
    pub truncated: bool,
    /// The command was killed because its output passed [`SandboxSpec::flood_limit`].
    pub flooded: bool,
    /// Wall-clock time the command ran.
    pub elapsed: Duration,
}

impl Output {
    /// The exit status the way Python's `subprocess` reports it: the exit code, or minus the
    /// signal number (the Leaf harness shows this number to the model as `Exit code: N`).
    pub fn returncode(&self) -> i32 {
        match (self.exit_code, self.signal) {
            (Some(code), _) => code,
            (None, Some(sig)) => -sig,
            (None, None) => -1,
        }
    }
    /// Exited normally with status 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

/// Why a command could not be run at all (a command that runs and fails is an [`Output`]).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Confinement was required but bubblewrap is missing or does not work here.
    #[error(
        "cannot confine commands: {reason}. Install bubblewrap (Debian/Ubuntu: `apt-get install \
         bubblewrap`), or pass --no-sandbox to run commands unconfined (no network or write \
         protection)"
    )]
    Unavailable {
        /// What went wrong (missing binary, bwrap's own error message).
        reason: String,
    },
    /// The workspace directory does not exist or is not a directory.
    #[error("sandbox workspace {path} is not a directory")]
    BadWorkspace {
        /// The workspace path given.
        path: PathBuf,
    },
    /// The working directory of a command is outside the workspace or missing.
    #[error("working directory {path} is not a directory inside the workspace")]
    BadWorkingDir {
        /// The working directory given.
        path: PathBuf,
    },
    /// Spawning the process failed.
    #[error("could not start {program}: {source}")]
    Spawn {
        /// The program (bwrap or the command itself).
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Waiting for the process failed.
    #[error("lost track of the command: {0}")]
    Wait(std::io::Error),
}

/// A workspace with its limits, ready to run commands. Cheap to share between threads.
#[derive(Debug, Clone)]
pub struct Sandbox {
    spec: SandboxSpec,
    workspace: PathBuf,
    bwrap: Option<PathBuf>,
    pids_cgroup_root: Option<PathBuf>,
}

impl Sandbox {
    /// Checks the spec and the confinement tools. Fails if [`Isolation::Bubblewrap`] is asked
    /// for and bwrap is missing or broken (the message says how to fix it or opt out).
    pub fn new(spec: SandboxSpec) -> Result<Self, SandboxError> {
        let workspace = spec
            .workspace
            .canonicalize()
            .ok()
            .filter(|p| p.is_dir())
            .ok_or_else(|| SandboxError::BadWorkspace { path: spec.workspace.clone() })?;
        let bwrap = match spec.isolation {
            Isolation::Bubblewrap => {
                Some(bwrap_status().clone().map_err(|reason| SandboxError::Unavailable { reason })?)
            }
            Isolation::Unconfined => None,
        };
        Ok(Sandbox { spec, workspace, bwrap, pids_cgroup_root: pids_cgroup_root().clone() })
    }

    /// Whether bubblewrap is usable on this machine (without building a sandbox); the error
    /// text says why not.
    pub fn bubblewrap_available() -> Result<(), String> {
        bwrap_status().clone().map(|_| ())
    }

    /// The spec this sandbox was built from.
    pub fn spec(&self) -> &SandboxSpec {
        &self.spec
    }

    /// The canonical workspace path.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// True when commands run confined by bubblewrap.
    pub fn is_confined(&self) -> bool {
        self.bwrap.is_some()
    }

    /// True when [`SandboxSpec::max_processes`] is enforced (a pids cgroup is writable).
    pub fn process_limit_enforced(&self) -> bool {
        self.pids_cgroup_root.is_some()
    }

    /// Runs one command to completion, timeout or flood, then kills whatever it left behind.
    pub fn run(&self, cmd: &Command) -> Result<Output, SandboxError> {
        let cwd = self.working_dir(cmd)?;
        let timeout = cmd.timeout.unwrap_or(self.spec.timeout);
        let mut proc = match &self.bwrap {
            Some(bwrap) => self.bwrap_command(bwrap, cmd, &cwd),
            None => {
                let mut p = std::process::Command::new(&cmd.program);
                p.args(&cmd.args).current_dir(&cwd);
                p
            }
        };
        for (k, v) in self.spec.env.iter().chain(&cmd.env) {
            proc.env(k, v);
        }
        proc.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // Own process group: lets us kill the tree with one killpg, and keeps terminal
        // signals (Ctrl-C) aimed at us from reaching the command directly.
        proc.process_group(0);
        let cgroup = self.new_cgroup();
        if let Some(group) = &cgroup {
            let procs = std::ffi::CString::new(group.join("cgroup.procs").as_os_str().as_encoded_bytes())
                .expect("cgroup path has no NUL byte");
            // SAFETY: only async-signal-safe libc calls (open/write/close) on data prepared
            // before the fork.
            unsafe {
                proc.pre_exec(move || {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // "0" moves the writing process itself (cgroup v1 and v2 alike).
                    let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                    libc::close(fd);
                    if ok {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let program = self.bwrap.as_ref().map(|b| b.display().to_string()).unwrap_or_else(|| cmd.program.clone());
        let started = Instant::now();
        let mut child = match proc.spawn() {
            Ok(c) => c,
            Err(source) => {
                if let Some(group) = &cgroup {
                    remove_cgroup(group);
                }
                return Err(SandboxError::Spawn { program, source });
            }
        };
        let pgid = child.id() as i32;

        // Feed stdin from a thread so a command that does not read it cannot block us.
        let mut stdin = child.stdin.take();
        let input = cmd.stdin.clone();
        std::thread::spawn(move || {
            if let Some(s) = stdin.as_mut() {
                let _ = s.write_all(&input);
            }
            drop(stdin);
        });
        let total = Arc::new(AtomicU64::new(0));
        let flooded = Arc::new(AtomicBool::new(false));
        let out = Capture::start(
            child.stdout.take(),
            self.spec.output_limit,
            total.clone(),
            self.spec.flood_limit,
            flooded.clone(),
        );
        let err = Capture::start(
            child.stderr.take(),
            self.spec.output_limit,
            total.clone(),
            self.spec.flood_limit,
            flooded.clone(),
        );

        let deadline = started + timeout;
        let mut timed_out = false;
        let status = loop {
            match child.try_wait().map_err(SandboxError::Wait)? {
                Some(status) => break status,
                None => {
                    if flooded.load(Ordering::Relaxed) {
                        kill_tree(pgid, cgroup.as_deref());
                        break child.wait().map_err(SandboxError::Wait)?;
                    }
                    if Instant::now() >= deadline {
                        timed_out = true;
                        kill_tree(pgid, cgroup.as_deref());
                        break child.wait().map_err(SandboxError::Wait)?;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        };
        let elapsed = started.elapsed();
        // The command is done: nothing it started may outlive it.
        kill_tree(pgid, cgroup.as_deref());
        let (stdout_bytes, out_cut) = out.finish();
        let (stderr, err_cut) = err.finish();
        let stdout = String::from_utf8_lossy(&stdout_bytes).into_owned();
        let stderr = String::from_utf8_lossy(&stderr).into_owned();
        if let Some(group) = &cgroup {
            remove_cgroup(group);
        }
        let flooded = flooded.load(Ordering::Relaxed);
        let (exit_code, signal) =
            if timed_out || flooded { (None, Some(libc::SIGKILL)) } else { decode_status(status) };
        Ok(Output {
            exit_code,
            signal,
            stdout,
            stderr,
            stdout_bytes,
            timed_out,
            truncated: out_cut || err_cut || flooded,
            flooded,
            elapsed,
        })
    }

    fn working_dir(&self, cmd: &Command) -> Result<PathBuf, SandboxError> {
        let Some(dir) = &cmd.cwd else {
            return Ok(self.workspace.clone());
        };
        let joined = self.workspace.join(dir);
        match joined.canonicalize() {
            Ok(p) if p.is_dir() && p.starts_with(&self.workspace) => Ok(p),
            _ => Err(SandboxError::BadWorkingDir { path: dir.clone() }),
        }
    }

    fn bwrap_command(&self, bwrap: &Path, cmd: &Command, cwd: &Path) -> std::process::Command {
        let mut p = std::process::Command::new(bwrap);
        p.args(["--ro-bind", "/", "/"])
            .args(["--dev", "/dev"])
            .args(["--proc", "/proc"])
            .args(["--tmpfs", "/tmp"])
            .args(["--tmpfs", "/dev/shm"])
            .arg("--bind")
            .arg(&self.workspace)
            .arg(&self.workspace);
        for extra in &self.spec.writable_paths {
            p.arg("--bind").arg(extra).arg(extra);
        }
        p.arg("--unshare-all");
        if self.spec.network {
            p.arg("--share-net");
        }
        p.args(["--die-with-parent", "--new-session"])
            // HOME inside the read-only root would make every tool that caches fail.
            .args(["--setenv", "HOME", "/tmp"])
            .arg("--chdir")
            .arg(cwd)
            .arg("--")
            .arg(&cmd.program)
            .args(&cmd.args);
        p
    }

    fn new_cgroup(&self) -> Option<PathBuf> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let root = self.pids_cgroup_root.as_ref()?;
        let name = format!("frognano-sandbox-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        let dir = root.join(name);
        std::fs::create_dir(&dir).ok()?;
        if std::fs::write(dir.join("pids.max"), self.spec.max_processes.to_string()).is_err() {
            remove_cgroup(&dir);
            return None;
        }
        Some(dir)
    }
}

/// Splits a wait status into exit code or signal. Under bwrap, a command killed by a signal
/// inside the sandbox shows up as exit code 128+N from bwrap's init, like bash reports it.
fn decode_status(status: std::process::ExitStatus) -> (Option<i32>, Option<i32>) {
    match status.signal() {
        Some(sig) => (None, Some(sig)),
        None => (Some(status.code().unwrap_or(-1)), None),
    }
}

/// Drains one pipe into a bounded buffer on its own thread.
struct Capture {
    buf: Arc<Mutex<(Vec<u8>, bool)>>,
    done: Arc<AtomicBool>,
}

impl Capture {
    fn start<R: Read + Send + 'static>(
        pipe: Option<R>,
        limit: usize,
        total: Arc<AtomicU64>,
        flood_limit: u64,
        flooded: Arc<AtomicBool>,
    ) -> Capture {
        let buf = Arc::new(Mutex::new((Vec::new(), false)));
        let done = Arc::new(AtomicBool::new(false));
        let (b, d) = (buf.clone(), done.clone());
        std::thread::spawn(move || {
            if let Some(mut pipe) = pipe {
                let mut chunk = [0u8; 16 * 1024];
                loop {
                    match pipe.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let mut g = b.lock().unwrap_or_else(|e| e.into_inner());
                            let room = limit.saturating_sub(g.0.len());
                            g.0.extend_from_slice(&chunk[..n.min(room)]);
                            if n > room {
                                g.1 = true;
                            }
                            drop(g);
                            if total.fetch_add(n as u64, Ordering::Relaxed) + n as u64 > flood_limit {
                                flooded.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                }
            }
            d.store(true, Ordering::Release);
        });
        Capture { buf, done }
    }

    /// Waits briefly for the reader to reach end of file, then takes what it has. A
    /// straggler holding the pipe (only possible unconfined without a cgroup) cannot hold
    /// us up past the grace period.
    fn finish(self) -> (Vec<u8>, bool) {
        let grace = Instant::now() + Duration::from_secs(2);
        while !self.done.load(Ordering::Acquire) && Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut g = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        (std::mem::take(&mut g.0), g.1)
    }
}

/// SIGKILLs the process group and, where there is one, every process in the cgroup (which
/// also catches `setsid` escapees), until the cgroup is empty.
fn kill_tree(pgid: i32, cgroup: Option<&Path>) {
    // SAFETY: plain syscall; a stale group id just yields ESRCH.
    unsafe {
        libc::killpg(pgid, libc::SIGKILL);
    }
    let Some(group) = cgroup else { return };
    let kill_file = group.join("cgroup.kill");
    if kill_file.exists() {
        let _ = std::fs::write(&kill_file, "1");
    }
    // A fork bomb keeps making processes while we kill; bounded by pids.max, so this ends.
    for _ in 0..2000 {
        let procs = std::fs::read_to_string(group.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<i32> = procs.split_whitespace().filter_map(|s| s.parse().ok()).collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            // SAFETY: plain syscall on a pid read from our own cgroup.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn remove_cgroup(group: &Path) {
    // Killed processes leave the cgroup a moment after they die.
    for _ in 0..500 {
        if std::fs::remove_dir(group).is_ok() || !group.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Finds bwrap and checks, once per process, that it can build a sandbox here.
fn bwrap_status() -> &'static Result<PathBuf, String> {
    static STATUS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    STATUS.get_or_init(|| {
        let path = find_in_path("bwrap").ok_or_else(|| "bwrap is not installed".to_string())?;
        let probe = std::process::Command::new(&path)
            .args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"])
            .args(["--tmpfs", "/tmp", "--unshare-all", "--die-with-parent", "--", "true"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
        if probe.status.success() {
            Ok(path)
        } else {
            Err(format!(
                "bwrap does not work here (user namespaces disabled?): {}",
                String::from_utf8_lossy(&probe.stderr).trim()
            ))
        }
    })
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// A pids cgroup directory under which this process may create child groups, found once.
fn pids_cgroup_root() -> &'static Option<PathBuf> {
    static ROOT: OnceLock<Option<PathBuf>> = OnceLock::new();
    ROOT.get_or_init(|| {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
        let mut candidates = Vec::new();
        for line in mounts.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 4 {
                continue;
            }
            let (mnt, fstype, opts) = (f[1], f[2], f[3]);
            if fstype == "cgroup" && opts.split(',').any(|o| o == "pids") {
                // v1: our path in the hierarchy whose controller list names pids.
                let rel = own.lines().find_map(|l| {
                    let mut parts = l.splitn(3, ':');
                    let (_, ctl, path) = (parts.next()?, parts.next()?, parts.next()?);
                    ctl.split(',').any(|c| c == "pids").then(|| path.to_string())
                });
                if let Some(rel) = rel {
                    candidates.push(Path::new(mnt).join(rel.trim_start_matches('/')));
                }
            } else if fstype == "cgroup2" {
                let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?.to_string();
                let dir = Path::new(mnt).join(rel.trim_start_matches('/'));
                let ctl = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
                if ctl.split_whitespace().any(|c| c == "pids") {
                    candidates.push(dir);
                }
            }
        }
        candidates.into_iter().find(|dir| {
            let probe = dir.join(format!("frognano-probe-{}", std::process::id()));
            let ok = std::fs::create_dir(&probe).is_ok() && probe.join("pids.max").exists();
            let _ = std::fs::remove_dir(&probe);
            ok
        })
    })
}
