//! # frognano-sandbox
//!
//! Runs untrusted commands (the agent's Bash tool, the test runs of `frognano-swe`, the
//! validation runs of `frognano-synth`). What a confined command ([`Isolation::Bubblewrap`],
//! the default) can and cannot do:
//!
//! - **No network**: a fresh network namespace with only a loopback device; a listener on
//!   the host's loopback cannot be reached ([`SandboxSpec::network`] opts in).
//! - **Writes confined** to the workspace, the caller's [`SandboxSpec::writable_paths`] and a
//!   private, empty, size-limited `/tmp`; the rest of the file system is read-only, and a
//!   hard link from the workspace to a host file cannot be made (another mount: `EXDEV`).
//! - **No privileges**: the command runs as a non-root uid in its own user namespace (the
//!   caller's uid, or [`SANDBOX_UID_FOR_ROOT`] when FrogNano runs as root; what it creates
//!   belongs to the caller on the host), with every capability dropped, no further user
//!   namespaces, cgroupfs replaced by an empty read-only folder, and a seccomp filter
//!   ([`seccomp`]) refusing mount, namespace, ptrace, kernel-key, BPF and module calls. So
//!   it cannot remount `/` read-write, leave its cgroup, or unshare its way out.
//! - **No secrets**: a clean environment ([`PASSED_ENV`], plus the names the caller allows
//!   with [`SandboxSpec::pass_env`], plus explicit values; `HOME=/tmp`); password hashes,
//!   sudo rules, private keys ([`MASKED_SYSTEM_PATHS`]) and `/run` (daemon and agent
//!   sockets) hidden; each home in [`SandboxSpec::masked_homes`] (default `$HOME` and
//!   `/root`) replaced by an empty folder in which only toolchains are shown again, read-only
//!   (the folders `PATH` points into and [`HOME_TOOLCHAIN_DIRS`]), with the credential and
//!   history files of [`HOME_SECRETS`] masked even there.
//! - **Bounded resources**: wall-clock time ([`SandboxSpec::timeout`]), output per stream
//!   ([`SandboxSpec::output_limit`]; a flood past [`SandboxSpec::flood_limit`] is stopped),
//!   processes ([`SandboxSpec::max_processes`], a pids cgroup: fork bombs), memory
//!   ([`SandboxSpec::memory_limit`], a memory cgroup), file size
//!   ([`SandboxSpec::file_size_limit`], `RLIMIT_FSIZE`), disk growth
//!   ([`SandboxSpec::disk_limit`]) and the size of `/tmp` ([`SandboxSpec::tmp_size`]).
//!   [`Output::limit_hit`] and a `frognano-sandbox:` line on stderr say when memory or disk
//!   stopped a command, or the process limit refused one of its forks.
//! - **Nothing left behind**: the whole process tree is killed when the command ends or is
//!   stopped, background, `nohup`, `setsid` and double-forked children included.
//!
//! Not promised: a kernel exploit is out of scope (the filter narrows the attack surface, it
//! does not remove it); files readable by everyone outside the masked places stay readable;
//! a Unix socket outside `/run`, `/tmp` and the masked homes can still be connected to;
//! with [`SandboxSpec::network`] on, the network (and abstract Unix sockets) are the host's;
//! the disk limit measures whole file systems, so other writers on the same disk count.
//!
//! ## How
//!
//! Confinement uses bubblewrap (`bwrap`, Debian package `bubblewrap`): `--ro-bind / /`, a new
//! `/dev` and `/proc`, `--size N --tmpfs /tmp` (and `/dev/shm`), empty read-only tmpfs over
//! `/sys/fs/cgroup`, `/run`, the masked homes and secret folders, `/dev/null` (unopenable: a
//! `nodev` bind) over secret files, read-only binds of the toolchain folders and of
//! [`SandboxSpec::readable_paths`], then `--bind` of the workspace and the writable paths (so
//! a workspace under `/tmp` or a masked home stays visible; secrets such a bind brings back
//! are masked again), `--unshare-all --unshare-user --uid U --gid G --disable-userns
//! --cap-drop ALL --seccomp FD --die-with-parent --new-session` (`--cap-drop` only as root:
//! a non-root uid gets no capabilities from bwrap anyway). The seccomp program reaches bwrap
//! as an inherited memfd. Because the command runs in its own pid namespace, the
//! kernel kills every process left in it the moment the command (pid 2 under bwrap's init)
//! exits, or bwrap is killed. [`Sandbox::new`] probes bwrap once with these flags and refuses
//! with bwrap's own error message if it does not work (bwrap before 0.8 works without
//! `--size` and `--disable-userns`).
//!
//! Where bwrap is missing or broken, [`Sandbox::new`] returns [`SandboxError::Unavailable`]
//! unless the caller asked for [`Isolation::Unconfined`] explicitly (the CLI's
//! `--no-sandbox`). Unconfined runs keep the host's environment and get neither network,
//! write nor secret confinement; they still get the time limit, output cap, process-group and
//! cgroup kill, and the process, memory, file-size and disk limits.
//!
//! The pids and memory cgroups (v1 hierarchies, or v2 with the controllers enabled for
//! children) are used where this process may create child groups there (as root in our
//! containers and CI); [`Sandbox::process_limit_enforced`] and
//! [`Sandbox::memory_limit_enforced`] say whether they are. Each command gets its own group
//! `frognano-sandbox-<pid>-<n>`, removed afterwards; groups a killed FrogNano process left
//! behind are removed at the next start ([`Sandbox::remove_stale_cgroups`]). Once a
//! hierarchy was found writable, failing to make a command's group or write its limit is an
//! error ([`SandboxError::Cgroup`]), never a run without the limit.
//! `RLIMIT_NPROC` is not used: the kernel ignores it for root, and for other users it counts
//! every process of the user, not those of one command.
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

pub mod seccomp;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
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
/// Upper bound of the default memory limit: a laptop keeps working while a test suite runs
/// (the default is the smaller of this and half the machine's RAM, [`default_memory_limit`]).
pub const DEFAULT_MEMORY_LIMIT_MAX: u64 = 8 << 30;
/// Default largest file a command may write (`RLIMIT_FSIZE`): far past any source file,
/// build artefact or test fixture, well short of filling a laptop's disk in one go.
pub const DEFAULT_FILE_SIZE_LIMIT: u64 = 4 << 30;
/// Default growth of the workspace's file system during one command after which the command
/// is killed (build outputs of a large project fit; a runaway writer is stopped).
pub const DEFAULT_DISK_LIMIT: u64 = 16 << 30;
/// Default size of the sandbox's private `/tmp` (and of `/dev/shm`), both in memory.
pub const DEFAULT_TMP_SIZE: u64 = 2 << 30;
/// The uid and gid a confined command runs as when FrogNano itself runs as root (otherwise
/// it keeps the caller's uid); files it creates belong to the caller on the host.
pub const SANDBOX_UID_FOR_ROOT: u32 = 1000;

/// The default memory limit of one command: the smaller of [`DEFAULT_MEMORY_LIMIT_MAX`] and
/// half of this machine's RAM.
pub fn default_memory_limit() -> u64 {
    // SAFETY: sysinfo fills the struct we pass.
    let ram = unsafe {
        let mut info: libc::sysinfo = std::mem::zeroed();
        if libc::sysinfo(&mut info) == 0 {
            (info.totalram as u64).saturating_mul(info.mem_unit.max(1) as u64)
        } else {
            0
        }
    };
    if ram == 0 {
        DEFAULT_MEMORY_LIMIT_MAX
    } else {
        DEFAULT_MEMORY_LIMIT_MAX.min(ram / 2)
    }
}

/// Environment variables a confined command gets from the host when they are set there
/// (everything else is dropped; extend with [`SandboxSpec::pass_env`]): the search path,
/// locale and terminal, where the toolchains live (these name folders, never secrets), and
/// Python's switches for bytecode files and buffering. `PYTHONDONTWRITEBYTECODE` is `1`
/// unless the host sets it otherwise, so `.pyc` files stay out of workspaces and patches.
/// `HOME` is always `/tmp`, the sandbox's own writable folder.
pub const PASSED_ENV: &[&str] = &[
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "LC_COLLATE",
    "LC_NUMERIC",
    "LC_TIME",
    "TERM",
    "TZ",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "CARGO_HOME",
    "PYENV_ROOT",
    "PYENV_VERSION",
    "NVM_DIR",
    "NVM_BIN",
    "GOROOT",
    "GOPATH",
    "JAVA_HOME",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
];

/// Toolchain folders of a home directory (see [`SandboxSpec::masked_homes`]) that stay
/// visible, read-only, when the home is masked, besides the folders `PATH` points into:
/// toolchains, not configuration or caches. Secrets inside them ([`HOME_SECRETS`]) stay
/// masked.
pub const HOME_TOOLCHAIN_DIRS: &[&str] = &[
    ".cargo",
    ".rustup",
    ".pyenv",
    ".rbenv",
    ".nvm",
    ".volta",
    ".bun",
    ".deno",
    ".asdf",
    ".sdkman",
    ".ghcup",
    ".elan",
    ".opam",
    ".juliaup",
    "go",
    "sdk",
    ".local/bin",
    ".local/lib",
    "miniconda3",
    "anaconda3",
    "miniforge3",
    "mambaforge",
];

/// Files and folders of a home directory that hold credentials or history. The home is
/// masked as a whole; these stay masked even where a toolchain folder is shown again or
/// the workspace or a writable or readable path brings them back into view.
pub const HOME_SECRETS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".docker",
    ".netrc",
    ".npmrc",
    ".yarnrc",
    ".yarnrc.yml",
    ".pypirc",
    ".git-credentials",
    ".config/git/credentials",
    ".config/gh",
    ".config/hub",
    ".config/rclone",
    ".config/op",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
    ".m2/settings.xml",
    ".gradle/gradle.properties",
    ".terraformrc",
    ".terraform.d",
    ".vault-token",
    ".pgpass",
    ".my.cnf",
    ".s3cfg",
    ".boto",
    ".bash_history",
    ".zsh_history",
    ".history",
    ".sh_history",
    ".python_history",
    ".node_repl_history",
    ".psql_history",
    ".mysql_history",
    ".sqlite_history",
    ".lesshst",
    ".viminfo",
    ".local/share/keyrings",
    ".local/share/fish/fish_history",
    ".password-store",
];

/// System files and folders masked in every confined command (besides the homes): password
/// hashes, sudo rules, TLS and Kerberos private keys. SSH host private keys
/// (`/etc/ssh/ssh_host_*_key`) are masked too, and `/run` (with `/var/run`) is replaced by an
/// empty folder, so daemon sockets (Docker, D-Bus, ssh and gpg agents) cannot be reached.
pub const MASKED_SYSTEM_PATHS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssl/private",
    "/etc/krb5.keytab",
    "/etc/security/opasswd",
];

/// The home directories masked by default: this process's `$HOME` and `/root`.
pub fn default_masked_homes() -> Vec<PathBuf> {
    let mut homes = Vec::new();
    if let Some(home) = std::env::var_os("HOME").map(PathBuf::from) {
        if home.is_absolute() && home != Path::new("/") {
            homes.push(home);
        }
    }
    let root = PathBuf::from("/root");
    if !homes.contains(&root) {
        homes.push(root);
    }
    homes
}

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
    /// Extra host paths shown read-only inside the sandbox even where the sandbox would hide
    /// them (a virtualenv under `/tmp`, whose `/tmp` the sandbox replaces; a folder in a
    /// masked home).
    pub readable_paths: Vec<PathBuf>,
    /// Names of host environment variables a confined command also gets (when set), besides
    /// [`PASSED_ENV`]. Unconfined commands get the whole host environment anyway.
    pub env_passthrough: Vec<String>,
    /// Home directories masked by an empty folder in confined commands (only their
    /// toolchain folders, [`HOME_TOOLCHAIN_DIRS`] and those `PATH` points into, stay
    /// visible). Default: [`default_masked_homes`].
    pub masked_homes: Vec<PathBuf>,
    /// Memory limit of the command's processes together, in bytes (a cgroup `memory.max`
    /// or v1 `memory.limit_in_bytes`; enforced where a memory cgroup is writable, see
    /// [`Sandbox::memory_limit_enforced`]). `None`: no limit. Default:
    /// [`default_memory_limit`].
    pub memory_limit: Option<u64>,
    /// Largest file a command may write, in bytes (`RLIMIT_FSIZE`; writing past it fails
    /// with `EFBIG` or ends the writer with `SIGXFSZ`). `None`: no limit. Default:
    /// [`DEFAULT_FILE_SIZE_LIMIT`].
    pub file_size_limit: Option<u64>,
    /// Growth in bytes of the file systems holding the workspace and the writable paths
    /// during one command, after which it is killed ([`Output::limit_hit`] says so). It is
    /// measured on the whole file system, so other writers on the machine count too.
    /// `None`: no limit. Default: [`DEFAULT_DISK_LIMIT`].
    pub disk_limit: Option<u64>,
    /// Size of the private `/tmp` and `/dev/shm` of a confined command (each). `None`: the
    /// kernel's default (half the RAM). Default: [`DEFAULT_TMP_SIZE`].
    pub tmp_size: Option<u64>,
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
            readable_paths: Vec::new(),
            env_passthrough: Vec::new(),
            masked_homes: default_masked_homes(),
            memory_limit: Some(default_memory_limit()),
            file_size_limit: Some(DEFAULT_FILE_SIZE_LIMIT),
            disk_limit: Some(DEFAULT_DISK_LIMIT),
            tmp_size: Some(DEFAULT_TMP_SIZE),
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
    /// Shows another host path read-only (even under `/tmp` or a masked home).
    pub fn readable_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.readable_paths.push(path.into());
        self
    }
    /// Passes the host environment variable `name` (when set) to confined commands too
    /// (the CLI's `--sandbox-env NAME`).
    pub fn pass_env(mut self, name: impl Into<String>) -> Self {
        self.env_passthrough.push(name.into());
        self
    }
    /// Sets the home directories to mask (replacing the default list).
    pub fn masked_homes<I, P>(mut self, homes: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        self.masked_homes = homes.into_iter().map(Into::into).collect();
        self
    }
    /// Sets the memory limit in bytes; 0 turns it off.
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = (bytes > 0).then_some(bytes);
        self
    }
    /// Sets the largest file a command may write, in bytes; 0 turns the limit off.
    pub fn file_size_limit(mut self, bytes: u64) -> Self {
        self.file_size_limit = (bytes > 0).then_some(bytes);
        self
    }
    /// Sets the disk growth (bytes) after which a command is killed; 0 turns it off.
    pub fn disk_limit(mut self, bytes: u64) -> Self {
        self.disk_limit = (bytes > 0).then_some(bytes);
        self
    }
    /// Sets the size of the private `/tmp` (and `/dev/shm`) in bytes; 0: the kernel's default.
    pub fn tmp_size(mut self, bytes: u64) -> Self {
        self.tmp_size = (bytes > 0).then_some(bytes);
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
    /// A resource limit stopped the command or one of its processes (a line saying so is
    /// appended to [`Output::stderr`]).
    pub limit_hit: Option<Limit>,
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

/// A resource limit that stopped a command (see [`Output::limit_hit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Limit {
    /// The memory limit: the kernel killed a process of the command for lack of memory.
    Memory,
    /// The disk limit: the command wrote more than [`SandboxSpec::disk_limit`] and was killed.
    Disk,
    /// The process limit: the kernel refused at least one fork or thread because
    /// [`SandboxSpec::max_processes`] were alive (the pids cgroup's `pids.events` count; the
    /// command saw `EAGAIN`, "Resource temporarily unavailable", and went on or gave up).
    Processes,
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
    /// A cgroup that was found writable when the sandbox started could not be made or given
    /// its limit, so the command would have run without the process or memory limit.
    #[error("cannot set the sandbox's {what} limit in cgroup {path}: {source}")]
    Cgroup {
        /// Which limit: "process" or "memory".
        what: &'static str,
        /// The cgroup directory or file that could not be written.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A workspace with its limits, ready to run commands. Cheap to share between threads.
#[derive(Debug, Clone)]
pub struct Sandbox {
    spec: SandboxSpec,
    workspace: PathBuf,
    bwrap: Option<Bwrap>,
    cgroups: CgroupRoots,
}

/// The bwrap binary and what it supports.
#[derive(Debug, Clone)]
struct Bwrap {
    path: PathBuf,
    /// bwrap ≥ 0.8 with a kernel that lets it: `--disable-userns` and `--size`.
    modern: bool,
}

/// Where this process may create cgroups, per controller.
#[derive(Debug, Clone, Default)]
struct CgroupRoots {
    pids: Option<PathBuf>,
    memory: Option<(PathBuf, MemApi)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MemApi {
    /// cgroup v1 memory controller; `memsw`: swap accounting files exist.
    V1 { memsw: bool },
    /// cgroup v2 memory controller.
    V2,
}

/// The cgroups of one run.
#[derive(Debug, Default)]
struct RunGroups {
    /// Every directory made (one per hierarchy), removed at the end.
    dirs: Vec<PathBuf>,
    /// The pids group, if the process limit applies.
    pids: Option<PathBuf>,
    /// The memory group, if the memory limit applies.
    memory: Option<(PathBuf, MemApi)>,
}

impl RunGroups {
    /// A group holding every process of the run (for the kill loop).
    fn any(&self) -> Option<&Path> {
        self.dirs.first().map(PathBuf::as_path)
    }

    /// How many processes the kernel killed for lack of memory in the memory group.
    fn oom_kills(&self) -> u64 {
        let Some((dir, api)) = &self.memory else { return 0 };
        let file = match api {
            MemApi::V1 { .. } => "memory.oom_control",
            MemApi::V2 => "memory.events",
        };
        let text = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
    }

    /// How many forks the kernel refused in the pids group because the process limit was
    /// reached (the `max` line of `pids.events`, the same in cgroup v1 and v2).
    fn refused_forks(&self) -> u64 {
        let Some(dir) = &self.pids else { return 0 };
        let text = std::fs::read_to_string(dir.join("pids.events")).unwrap_or_default();
        text.lines().find_map(|l| l.strip_prefix("max ")).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
    }

    fn remove(&self) {
        for dir in &self.dirs {
            remove_cgroup(dir);
        }
    }
}

impl Sandbox {
    /// Checks the spec and the confinement tools. Fails if [`Isolation::Bubblewrap`] is asked
    /// for and bwrap is missing or broken (the message says how to fix it or opt out). The
    /// first call in a process also removes the cgroups that killed FrogNano processes left
    /// behind ([`Sandbox::remove_stale_cgroups`]).
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
        static CLEANED: std::sync::Once = std::sync::Once::new();
        CLEANED.call_once(|| {
            Sandbox::remove_stale_cgroups();
        });
        Ok(Sandbox { spec, workspace, bwrap, cgroups: cgroup_roots().clone() })
    }

    /// Whether bubblewrap is usable on this machine (without building a sandbox); the error
    /// text says why not.
    pub fn bubblewrap_available() -> Result<(), String> {
        bwrap_status().clone().map(|_| ())
    }

    /// Removes the empty `frognano-sandbox-<pid>-<n>` (and `frognano-probe-<pid>`) cgroups
    /// whose `<pid>` is no longer alive: what a FrogNano process killed mid-run left in the
    /// pids and memory hierarchies. Groups of live processes and groups that still hold
    /// processes are kept. Returns how many were removed. [`Sandbox::new`] calls this once
    /// per process.
    pub fn remove_stale_cgroups() -> usize {
        let mut removed = 0;
        for root in Sandbox::cgroup_roots() {
            let Ok(entries) = std::fs::read_dir(&root) else { continue };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(pid) = name.to_str().and_then(stale_group_pid) else { continue };
                if pid != std::process::id() as i32 && !process_alive(pid) && std::fs::remove_dir(entry.path()).is_ok()
                {
                    removed += 1;
                }
            }
        }
        removed
    }

    /// The cgroup directories (pids, then memory; one where both share a v2 hierarchy)
    /// under which this process makes a group per command, if it may; for diagnostics.
    pub fn cgroup_roots() -> Vec<PathBuf> {
        let roots = cgroup_roots();
        let mut dirs: Vec<PathBuf> =
            roots.pids.iter().cloned().chain(roots.memory.as_ref().map(|(d, _)| d.clone())).collect();
        dirs.dedup();
        dirs
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
        self.cgroups.pids.is_some()
    }

    /// True when [`SandboxSpec::memory_limit`] is set and enforced (a memory cgroup is
    /// writable: as root in our containers and CI, or under a delegated cgroup v2 subtree).
    pub fn memory_limit_enforced(&self) -> bool {
        self.spec.memory_limit.is_some() && self.cgroups.memory.is_some()
    }

    /// Runs one command to completion, timeout, flood or limit, then kills whatever it left
    /// behind.
    pub fn run(&self, cmd: &Command) -> Result<Output, SandboxError> {
        let cwd = self.working_dir(cmd)?;
        let timeout = cmd.timeout.unwrap_or(self.spec.timeout);
        let bwrap_name = |b: &Bwrap| b.path.display().to_string();
        let program = self.bwrap.as_ref().map(bwrap_name).unwrap_or_else(|| cmd.program.clone());
        let seccomp_fd = match (&self.bwrap, seccomp::filter()) {
            (Some(_), Some(filter)) => Some(
                seccomp::memfd_with(&filter)
                    .map_err(|source| SandboxError::Spawn { program: program.clone(), source })?,
            ),
            _ => None,
        };
        let mut proc = match &self.bwrap {
            Some(bwrap) => {
                let env = self.confined_env(cmd);
                let path = env.get(OsStr::new("PATH")).cloned().unwrap_or_default();
                let mut p = self.bwrap_command(bwrap, cmd, &cwd, &path, seccomp_fd.as_ref().map(|f| f.as_raw_fd()));
                p.env_clear().envs(env);
                p
            }
            None => {
                let mut p = std::process::Command::new(&cmd.program);
                p.args(&cmd.args).current_dir(&cwd);
                for (k, v) in self.spec.env.iter().chain(&cmd.env) {
                    p.env(k, v);
                }
                p
            }
        };
        proc.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // Own process group: lets us kill the tree with one killpg, and keeps terminal
        // signals (Ctrl-C) aimed at us from reaching the command directly.
        proc.process_group(0);
        let groups = self.new_cgroups()?;
        let procs_files: Vec<std::ffi::CString> = groups
            .dirs
            .iter()
            .map(|g| {
                std::ffi::CString::new(g.join("cgroup.procs").as_os_str().as_bytes())
                    .expect("cgroup path has no NUL byte")
            })
            .collect();
        let file_size_limit = self.spec.file_size_limit;
        let inherit_fd = seccomp_fd.as_ref().map(|f| f.as_raw_fd());
        // SAFETY: only async-signal-safe libc calls (open/write/close, get/setrlimit, fcntl)
        // on data prepared before the fork.
        unsafe {
            proc.pre_exec(move || {
                for procs in &procs_files {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // "0" moves the writing process itself (cgroup v1 and v2 alike).
                    let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                    libc::close(fd);
                    if !ok {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if let Some(limit) = file_size_limit {
                    let mut cur: libc::rlimit = std::mem::zeroed();
                    if libc::getrlimit(libc::RLIMIT_FSIZE, &mut cur) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let lim = (limit as libc::rlim_t).min(cur.rlim_max);
                    let new = libc::rlimit { rlim_cur: lim, rlim_max: lim };
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &new) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // The seccomp program's descriptor is the one bwrap must inherit.
                if let Some(fd) = inherit_fd {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut disk = self.spec.disk_limit.map(|limit| DiskWatch::new(&self.disk_paths(), limit));
        let started = Instant::now();
        let spawned = proc.spawn();
        drop(seccomp_fd);
        let mut child = match spawned {
            Ok(c) => c,
            Err(source) => {
                groups.remove();
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
        let mut disk_hit = false;
        let mut polls: u64 = 0;
        let status = loop {
            match child.try_wait().map_err(SandboxError::Wait)? {
                Some(status) => break status,
                None => {
                    if flooded.load(Ordering::Relaxed) {
                        kill_tree(pgid, groups.any());
                        break child.wait().map_err(SandboxError::Wait)?;
                    }
                    if Instant::now() >= deadline {
                        timed_out = true;
                        kill_tree(pgid, groups.any());
                        break child.wait().map_err(SandboxError::Wait)?;
                    }
                    polls += 1;
                    if polls.is_multiple_of(8) && disk.as_mut().is_some_and(DiskWatch::exceeded) {
                        disk_hit = true;
                        kill_tree(pgid, groups.any());
                        break child.wait().map_err(SandboxError::Wait)?;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        };
        let elapsed = started.elapsed();
        // The command is done: nothing it started may outlive it.
        kill_tree(pgid, groups.any());
        let (stdout_bytes, out_cut) = out.finish();
        let (stderr, err_cut) = err.finish();
        let stdout = String::from_utf8_lossy(&stdout_bytes).into_owned();
        let mut stderr = String::from_utf8_lossy(&stderr).into_owned();
        let oom_kills = groups.oom_kills();
        let refused_forks = groups.refused_forks();
        groups.remove();
        let flooded = flooded.load(Ordering::Relaxed);
        let limit_hit = if disk_hit {
            let limit = self.spec.disk_limit.unwrap_or(0);
            note(&mut stderr, &format!("killed: wrote more than {limit} bytes to disk (the sandbox's disk limit)"));
            Some(Limit::Disk)
        } else if oom_kills > 0 {
            let limit = self.spec.memory_limit.unwrap_or(0);
            note(
                &mut stderr,
                &format!("{oom_kills} process(es) killed: out of memory (the sandbox's memory limit is {limit} bytes)"),
            );
            Some(Limit::Memory)
        } else if refused_forks > 0 {
            let limit = self.spec.max_processes;
            note(
                &mut stderr,
                &format!("{refused_forks} fork(s) refused: the sandbox's process limit is {limit} processes"),
            );
            Some(Limit::Processes)
        } else {
            None
        };
        let killed = timed_out || flooded || disk_hit;
        let (exit_code, signal) = if killed { (None, Some(libc::SIGKILL)) } else { decode_status(status) };
        Ok(Output {
            exit_code,
            signal,
            stdout,
            stderr,
            stdout_bytes,
            timed_out,
            truncated: out_cut || err_cut || flooded,
            flooded,
            limit_hit,
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

    /// The folders whose file systems the disk limit watches.
    fn disk_paths(&self) -> Vec<PathBuf> {
        std::iter::once(self.workspace.clone()).chain(self.spec.writable_paths.iter().cloned()).collect()
    }

    /// The environment of a confined command: [`PASSED_ENV`] and the caller's
    /// [`SandboxSpec::env_passthrough`] from the host, `HOME=/tmp`, where the home's
    /// toolchains are, then the explicit values of the spec and the command.
    fn confined_env(&self, cmd: &Command) -> BTreeMap<OsString, OsString> {
        let mut env = BTreeMap::new();
        env.insert(OsString::from("HOME"), OsString::from("/tmp"));
        // Python's bytecode caches would otherwise land in the workspace (and in patches
        // taken from it) whenever a command runs the project's tests.
        env.insert(OsString::from("PYTHONDONTWRITEBYTECODE"), OsString::from("1"));
        let host_home = std::env::var_os("HOME").map(PathBuf::from).filter(|h| h.is_absolute());
        if let Some(home) = &host_home {
            // HOME moves to /tmp: toolchains found through it are still found.
            for (var, dir) in
                [("RUSTUP_HOME", ".rustup"), ("CARGO_HOME", ".cargo"), ("PYENV_ROOT", ".pyenv"), ("NVM_DIR", ".nvm")]
            {
                if home.join(dir).is_dir() {
                    env.insert(OsString::from(var), home.join(dir).into_os_string());
                }
            }
        }
        for name in PASSED_ENV.iter().copied().chain(self.spec.env_passthrough.iter().map(String::as_str)) {
            if let Some(value) = std::env::var_os(name) {
                env.insert(OsString::from(name), value);
            }
        }
        env.entry(OsString::from("PATH"))
            .or_insert_with(|| OsString::from("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"));
        for (k, v) in self.spec.env.iter().chain(&cmd.env) {
            env.insert(OsString::from(k), OsString::from(v));
        }
        env
    }

    /// The mounts of a confined command, in bwrap's order (a later mount covers what is
    /// below it, as in the kernel).
    fn mount_plan(&self, path_env: &OsStr) -> Vec<MountOp> {
        let mut plan = vec![MountOp::Dev, MountOp::Proc];
        for tmp in ["/tmp", "/dev/shm"] {
            plan.push(MountOp::Tmpfs(PathBuf::from(tmp)));
        }
        // No cgroupfs (its files are how a process leaves its limits), no daemon sockets.
        for dir in ["/sys/fs/cgroup", "/run", "/var/run"] {
            if is_real_dir(Path::new(dir)) {
                plan.push(MountOp::Hide(PathBuf::from(dir)));
            }
        }
        if self.spec.network {
            // DNS keeps working where resolv.conf lives under /run (systemd-resolved).
            if let Ok(conf) = Path::new("/etc/resolv.conf").canonicalize() {
                if conf.starts_with("/run") || conf.starts_with("/var/run") {
                    plan.push(MountOp::RoBind(conf));
                }
            }
        }
        // Secrets: system files, then each home as a whole with its toolchains shown again.
        let mut secrets: Vec<PathBuf> = system_secret_paths();
        for p in &secrets {
            if !p.starts_with("/tmp") {
                plan.push(MountOp::mask(p));
            }
        }
        for home in &self.spec.masked_homes {
            let Ok(h) = home.canonicalize() else { continue };
            if !h.is_dir() || h == Path::new("/") {
                continue;
            }
            let home_secrets: Vec<PathBuf> =
                HOME_SECRETS.iter().filter_map(|s| existing_canonical(&h.join(s))).collect();
            if !h.starts_with("/tmp") {
                plan.push(MountOp::Hide(h.clone()));
                let backs = toolchain_dirs(home, &h, path_env);
                plan.extend(backs.iter().cloned().map(MountOp::RoBind));
                for s in &home_secrets {
                    if backs.iter().any(|b| s.starts_with(b)) {
                        plan.push(MountOp::mask(s));
                    }
                }
            }
            secrets.extend(home_secrets);
        }
        // What the caller asked to see, then the workspace, on top of all of that (a
        // workspace under /tmp or a masked home stays visible).
        let mut binds = Vec::new();
        for p in &self.spec.readable_paths {
            let p = p.canonicalize().unwrap_or_else(|_| p.clone());
            plan.push(MountOp::RoBind(p.clone()));
            binds.push(p);
        }
        plan.push(MountOp::Bind(self.workspace.clone()));
        binds.push(self.workspace.clone());
        for p in &self.spec.writable_paths {
            let p = p.canonicalize().unwrap_or_else(|_| p.clone());
            plan.push(MountOp::Bind(p.clone()));
            binds.push(p);
        }
        // Secrets those binds brought back into view are masked again.
        for s in &secrets {
            if binds.iter().any(|b| s.starts_with(b)) {
                plan.push(MountOp::mask(s));
            }
        }
        plan
    }

    /// Whether a confined command of this sandbox cannot see the host's `path` (hidden by
    /// the private `/tmp`, a masked home or secret, `/run`...), so that tools working on
    /// the host side can refuse what the sandbox hides. Always false when unconfined.
    pub fn hides(&self, path: &Path) -> bool {
        if self.bwrap.is_none() {
            return false;
        }
        let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        let path_env = self.confined_env(&Command::new("true")).remove(OsStr::new("PATH")).unwrap_or_default();
        let plan = self.mount_plan(&path_env);
        match plan.iter().rev().find(|op| path.starts_with(op.dest())) {
            Some(op) => op.hides_host(),
            None => false,
        }
    }

    fn bwrap_command(
        &self,
        bwrap: &Bwrap,
        cmd: &Command,
        cwd: &Path,
        path_env: &OsStr,
        seccomp_fd: Option<i32>,
    ) -> std::process::Command {
        let plan = self.mount_plan(path_env);
        let mut args: Vec<OsString> = ["--ro-bind", "/", "/"].map(OsString::from).to_vec();
        let mut read_only = Vec::new();
        for (i, op) in plan.iter().enumerate() {
            match op {
                MountOp::Dev => args.extend(["--dev", "/dev"].map(OsString::from)),
                MountOp::Proc => args.extend(["--proc", "/proc"].map(OsString::from)),
                MountOp::Tmpfs(dir) => {
                    if let (Some(size), true) = (self.spec.tmp_size, bwrap.modern) {
                        args.extend(["--size".into(), size.to_string().into()]);
                    }
                    args.extend(["--tmpfs".into(), dir.into()]);
                }
                MountOp::Hide(dir) => {
                    args.extend(["--tmpfs".into(), dir.into()]);
                    // Read-only at the end, once every mount point inside exists, unless a
                    // later bind sits over it (the remount would hit the bind).
                    let covered = plan[i + 1..].iter().any(|later| {
                        matches!(later, MountOp::Bind(_) | MountOp::RoBind(_)) && dir.starts_with(later.dest())
                    });
                    if !covered {
                        read_only.push(dir.clone());
                    }
                }
                MountOp::MaskFile(file) => args.extend(["--ro-bind".into(), "/dev/null".into(), file.into()]),
                MountOp::RoBind(p) => args.extend(["--ro-bind".into(), p.into(), p.into()]),
                MountOp::Bind(p) => args.extend(["--bind".into(), p.into(), p.into()]),
            }
        }
        for dir in read_only {
            args.extend(["--remount-ro".into(), dir.into()]);
        }
        let (uid, gid) = sandbox_ids();
        args.push("--unshare-all".into());
        if self.spec.network {
            args.push("--share-net".into());
        }
        args.extend(["--unshare-user", "--uid", &uid.to_string(), "--gid", &gid.to_string()].map(OsString::from));
        args.extend(cap_drop_args().iter().map(OsString::from));
        if bwrap.modern {
            args.push("--disable-userns".into());
        }
        if let Some(fd) = seccomp_fd {
            args.extend(["--seccomp".into(), fd.to_string().into()]);
        }
        args.extend(["--die-with-parent", "--new-session", "--chdir"].map(OsString::from));
        args.push(cwd.into());
        args.push("--".into());
        let mut p = std::process::Command::new(&bwrap.path);
        p.args(args).arg(&cmd.program).args(&cmd.args);
        p
    }

    /// Makes this run's cgroups and writes their limits. The roots were probed writable when
    /// the sandbox started, so a failure here is an error: running on without the limit
    /// would silently drop it.
    fn new_cgroups(&self) -> Result<RunGroups, SandboxError> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = format!("frognano-sandbox-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        let mut groups = RunGroups::default();
        let fail = |groups: &RunGroups, what: &'static str, path: PathBuf, source: std::io::Error| {
            groups.remove();
            SandboxError::Cgroup { what, path, source }
        };
        if let Some(root) = &self.cgroups.pids {
            let dir = root.join(&name);
            std::fs::create_dir(&dir).map_err(|e| fail(&groups, "process", dir.clone(), e))?;
            groups.dirs.push(dir.clone());
            let file = dir.join("pids.max");
            std::fs::write(&file, self.spec.max_processes.to_string())
                .map_err(|e| fail(&groups, "process", file, e))?;
            groups.pids = Some(dir);
        }
        if let (Some(limit), Some((root, api))) = (self.spec.memory_limit, &self.cgroups.memory) {
            let dir = root.join(&name);
            if !groups.dirs.contains(&dir) {
                std::fs::create_dir(&dir).map_err(|e| fail(&groups, "memory", dir.clone(), e))?;
                groups.dirs.push(dir.clone());
            }
            let file = match api {
                MemApi::V1 { .. } => dir.join("memory.limit_in_bytes"),
                MemApi::V2 => dir.join("memory.max"),
            };
            std::fs::write(&file, limit.to_string()).map_err(|e| fail(&groups, "memory", file, e))?;
            match api {
                // No swapping past the limit either (fails harmlessly without swap accounting).
                MemApi::V1 { memsw: true } => {
                    let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), limit.to_string());
                }
                MemApi::V1 { memsw: false } => {}
                MemApi::V2 => {
                    let _ = std::fs::write(dir.join("memory.swap.max"), "0");
                }
            }
            groups.memory = Some((dir, *api));
        }
        Ok(groups)
    }
}

/// One mount of a confined command, over the read-only view of the host's `/`.
#[derive(Debug, Clone)]
enum MountOp {
    /// A new `/dev` with the usual device nodes.
    Dev,
    /// A new `/proc` for the command's pid namespace.
    Proc,
    /// A private writable tmpfs (sized by [`SandboxSpec::tmp_size`]).
    Tmpfs(PathBuf),
    /// An empty folder over a host folder, read-only in the end.
    Hide(PathBuf),
    /// `/dev/null` over a host file (unopenable: binds are `nodev`).
    MaskFile(PathBuf),
    /// The host path shown read-only.
    RoBind(PathBuf),
    /// The host path shown read-write.
    Bind(PathBuf),
}

impl MountOp {
    /// Hides a folder or a file.
    fn mask(path: &Path) -> MountOp {
        if path.is_dir() {
            MountOp::Hide(path.to_path_buf())
        } else {
            MountOp::MaskFile(path.to_path_buf())
        }
    }

    fn dest(&self) -> &Path {
        match self {
            MountOp::Dev => Path::new("/dev"),
            MountOp::Proc => Path::new("/proc"),
            MountOp::Tmpfs(p) | MountOp::Hide(p) | MountOp::MaskFile(p) | MountOp::RoBind(p) | MountOp::Bind(p) => p,
        }
    }

    /// Whether the host's files at and under [`MountOp::dest`] are out of sight.
    fn hides_host(&self) -> bool {
        matches!(self, MountOp::Tmpfs(_) | MountOp::Hide(_) | MountOp::MaskFile(_))
    }
}

/// Appends a line from us to a command's stderr.
fn note(stderr: &mut String, text: &str) {
    if !stderr.is_empty() && !stderr.ends_with('\n') {
        stderr.push('\n');
    }
    stderr.push_str("frognano-sandbox: ");
    stderr.push_str(text);
    stderr.push('\n');
}

/// A directory, not a link to one.
fn is_real_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

/// The path with links resolved, if it exists.
fn existing_canonical(path: &Path) -> Option<PathBuf> {
    std::fs::symlink_metadata(path).ok()?;
    path.canonicalize().ok()
}

/// [`MASKED_SYSTEM_PATHS`] and the SSH host private keys that exist here.
fn system_secret_paths() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = MASKED_SYSTEM_PATHS.iter().filter_map(|p| existing_canonical(Path::new(p))).collect();
    if let Ok(entries) = std::fs::read_dir("/etc/ssh") {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("ssh_host_") && name.ends_with("_key") {
                paths.extend(existing_canonical(&entry.path()));
            }
        }
    }
    paths
}

/// The folders of a masked home shown again, read-only: each folder `PATH` points into
/// (its first component under the home; two under `.local`, `.config`, `.cache`, three under
/// `.local/share`) and the
/// [`HOME_TOOLCHAIN_DIRS`] that exist. `home` as given, `canonical` with links resolved.
fn toolchain_dirs(home: &Path, canonical: &Path, path_env: &OsStr) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for dir in std::env::split_paths(path_env) {
        let Some(rel) = dir.strip_prefix(canonical).ok().or_else(|| dir.strip_prefix(home).ok()) else { continue };
        let parts: Vec<_> = rel.components().collect();
        let Some(first) = parts.first() else { continue };
        let nested = [".local", ".config", ".cache", ".var"].iter().any(|n| first.as_os_str() == *n);
        let shared = parts.get(1).is_some_and(|c| c.as_os_str() == "share");
        let take = match (nested, shared) {
            (true, true) => 3,
            (true, false) => 2,
            _ => 1,
        }
        .min(parts.len());
        dirs.push(parts[..take].iter().fold(canonical.to_path_buf(), |p, c| p.join(c)));
    }
    dirs.extend(HOME_TOOLCHAIN_DIRS.iter().map(|d| canonical.join(d)));
    // Only real folders inside the home (a link could point anywhere, e.g. at the home).
    dirs.retain(|d| is_real_dir(d) && !HOME_SECRETS.iter().any(|s| d.starts_with(canonical.join(s))));
    dirs.sort();
    dirs.dedup();
    let mut kept: Vec<PathBuf> = Vec::new();
    for d in dirs {
        if !kept.iter().any(|k| d.starts_with(k)) {
            kept.push(d);
        }
    }
    kept
}

/// `--cap-drop ALL` when FrogNano runs as root (then bwrap would otherwise keep the bounding
/// set); a non-root caller's command runs as a non-root uid, which bwrap gives no
/// capabilities anyway, and a setuid bwrap refuses `--cap-drop` from non-root callers.
fn cap_drop_args() -> &'static [&'static str] {
    // SAFETY: plain syscall without arguments.
    if unsafe { libc::geteuid() } == 0 {
        &["--cap-drop", "ALL"]
    } else {
        &[]
    }
}

/// The uid and gid inside the sandbox: the caller's, or [`SANDBOX_UID_FOR_ROOT`] for root.
fn sandbox_ids() -> (u32, u32) {
    // SAFETY: plain syscalls without arguments.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if uid == 0 {
        (SANDBOX_UID_FOR_ROOT, SANDBOX_UID_FOR_ROOT)
    } else {
        (uid, gid)
    }
}

/// Watches how much the file systems of some folders grew since a command started.
struct DiskWatch {
    /// (a folder on the file system, used bytes at the start)
    filesystems: Vec<(PathBuf, u64)>,
    limit: u64,
}

impl DiskWatch {
    fn new(paths: &[PathBuf], limit: u64) -> DiskWatch {
        let mut devices = Vec::new();
        let mut filesystems = Vec::new();
        for p in paths {
            let Ok(meta) = std::fs::metadata(p) else { continue };
            if devices.contains(&meta.dev()) {
                continue;
            }
            if let Some(used) = used_bytes(p) {
                devices.push(meta.dev());
                filesystems.push((p.clone(), used));
            }
        }
        DiskWatch { filesystems, limit }
    }

    fn exceeded(&mut self) -> bool {
        let grown: u64 =
            self.filesystems.iter().map(|(p, start)| used_bytes(p).unwrap_or(*start).saturating_sub(*start)).sum();
        grown > self.limit
    }
}

/// Bytes in use on the file system holding `path` (delayed allocations included on ext4,
/// xfs, btrfs: their `statfs` counts reserved blocks).
fn used_bytes(path: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills the struct we pass; the path is NUL-terminated.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        Some((st.f_blocks as u64).saturating_sub(st.f_bfree as u64).saturating_mul(st.f_frsize as u64))
    }
}

/// The creator pid in a group name of ours (`frognano-sandbox-<pid>-<n>`,
/// `frognano-probe-<pid>`).
fn stale_group_pid(name: &str) -> Option<i32> {
    if let Some(rest) = name.strip_prefix("frognano-sandbox-") {
        let (pid, seq) = rest.split_once('-')?;
        seq.parse::<u64>().ok()?;
        pid.parse().ok()
    } else {
        name.strip_prefix("frognano-probe-")?.parse().ok()
    }
}

/// True if a process with this pid may exist (any answer but "no such process" counts as
/// alive, so nothing of a live process is ever removed).
pub(crate) fn process_alive(pid: i32) -> bool {
    if pid <= 0 {
        return true;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
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

/// Finds bwrap and checks, once per process, that it can build a sandbox here, with the
/// flags every run uses (a non-root uid, no capabilities, user namespaces disabled).
fn bwrap_status() -> &'static Result<Bwrap, String> {
    static STATUS: OnceLock<Result<Bwrap, String>> = OnceLock::new();
    STATUS.get_or_init(|| {
        let path = find_in_path("bwrap").ok_or_else(|| "bwrap is not installed".to_string())?;
        let (uid, gid) = sandbox_ids();
        let probe = |modern: bool| {
            let mut p = std::process::Command::new(&path);
            p.args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]);
            if modern {
                p.args(["--size", "1048576"]);
            }
            p.args(["--tmpfs", "/tmp", "--unshare-all", "--unshare-user", "--uid", &uid.to_string()])
                .args(["--gid", &gid.to_string()])
                .args(cap_drop_args());
            if modern {
                p.arg("--disable-userns");
            }
            p.args(["--die-with-parent", "--", "true"])
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("cannot run {}: {e}", path.display()))
        };
        let full = probe(true)?;
        if full.status.success() {
            return Ok(Bwrap { path, modern: true });
        }
        // bwrap before 0.8 has neither --size nor --disable-userns; the seccomp filter
        // still refuses new namespaces, and the memory limit still bounds /tmp.
        let plain = probe(false)?;
        if plain.status.success() {
            return Ok(Bwrap { path, modern: false });
        }
        Err(format!(
            "bwrap does not work here (user namespaces disabled?): {}",
            String::from_utf8_lossy(&plain.stderr).trim()
        ))
    })
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// The pids and memory cgroup directories under which this process may create child
/// groups, found once.
fn cgroup_roots() -> &'static CgroupRoots {
    static ROOTS: OnceLock<CgroupRoots> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let pids = controller_root("pids", |_| "pids.max").map(|(dir, _)| dir);
        let memory =
            controller_root("memory", |v2| if v2 { "memory.max" } else { "memory.limit_in_bytes" }).map(|(dir, v2)| {
                let api = if v2 {
                    MemApi::V2
                } else {
                    MemApi::V1 { memsw: dir.join("memory.memsw.limit_in_bytes").exists() }
                };
                (dir, api)
            });
        CgroupRoots { pids, memory }
    })
}

/// A directory of the `controller` hierarchy (v1, or v2 with the controller enabled for
/// children) where this process can create a child group that has the controller's file;
/// and whether it is v2.
fn controller_root(controller: &str, file: impl Fn(bool) -> &'static str) -> Option<(PathBuf, bool)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let mut candidates = Vec::new();
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        let (mnt, fstype, opts) = (f[1], f[2], f[3]);
        if fstype == "cgroup" && opts.split(',').any(|o| o == controller) {
            // v1: our path in the hierarchy whose controller list names the controller.
            let rel = own.lines().find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, ctl, path) = (parts.next()?, parts.next()?, parts.next()?);
                ctl.split(',').any(|c| c == controller).then(|| path.to_string())
            });
            if let Some(rel) = rel {
                candidates.push((Path::new(mnt).join(rel.trim_start_matches('/')), false));
            }
        } else if fstype == "cgroup2" {
            let Some(rel) = own.lines().find_map(|l| l.strip_prefix("0::")) else { continue };
            let dir = Path::new(mnt).join(rel.trim_start_matches('/'));
            let ctl = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
            if ctl.split_whitespace().any(|c| c == controller) {
                candidates.push((dir, true));
            }
        }
    }
    candidates.into_iter().find(|(dir, v2)| {
        let probe = dir.join(format!("frognano-probe-{}", std::process::id()));
        let ok = std::fs::create_dir(&probe).is_ok() && probe.join(file(*v2)).exists();
        let _ = std::fs::remove_dir(&probe);
        ok
    })
}
