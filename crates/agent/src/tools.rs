//! The five tools the model was trained with — Read, Write, Edit, Glob, Bash — with the
//! Leaf harness's schemas, behaviour and observation texts (docs/agent.md §5).
//!
//! Failures come back as text `ErrorType: message`, using the Python exception names and
//! messages the model saw in training (`ValueError: old_string was not found`,
//! `FileNotFoundError: [Errno 2] No such file or directory: '/path'`).
//!
//! Bash runs in the [`frognano_sandbox::Sandbox`]; the other four run on the host, so they
//! keep to the workspace themselves. Every host-side path is resolved beneath the workspace
//! root by the kernel (`openat2` with `RESOLVE_BENEATH`, see [`beneath`]): a symlink or `..`
//! that leads out counts as outside, whatever its spelling. Deliberate additions to Leaf:
//!
//! - Write and Edit refuse paths outside the workspace
//!   (`PermissionError: PATH is outside the workspace`).
//! - Read of a path outside the workspace runs `head` in the sandbox, so it shows exactly
//!   what a Bash command would see (files the sandbox hides stay hidden; with
//!   `--no-sandbox` that is the host file).
//! - Glob searches only the workspace (`PermissionError: PATH is outside the workspace;
//!   Glob searches only the workspace (use Bash, e.g. find, elsewhere)`), never follows a
//!   symlinked folder with `**`, and stops after [`GLOB_MAX_ENTRIES`] entries or
//!   [`GLOB_MAX_TIME`], saying so.
//! - Nothing blocks: FIFOs, sockets and devices are refused
//!   (`OSError: [Errno 22] Not a regular file: 'PATH'`), Read looks at no more than
//!   [`READ_SCAN_BYTES`] and stops after the last line asked for, Edit refuses files over
//!   [`EDIT_MAX_BYTES`] (`OSError: [Errno 27] File too large: 'PATH'`).

use frognano_sandbox::{Command, Sandbox};
use serde_json::{json, Map, Value};
use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

/// Read's output cap in characters.
pub const READ_OUTPUT_CHARS: usize = 20_000;
/// Bash's output cap in characters.
pub const BASH_OUTPUT_CHARS: usize = 30_000;
/// Glob's result cap.
pub const GLOB_LIMIT: usize = 1_000;
/// Bash's default timeout in seconds.
pub const BASH_DEFAULT_TIMEOUT_SECS: f64 = 120.0;

/// The Leaf system prompt (three sentences, one per line).
pub const SYSTEM_PROMPT: &str = "You are a software-engineering agent working in a checked-out repository.\nUse the available tools to inspect files, make focused edits, and run commands.\nSolve the task, validate when practical, then give a brief final answer.";

/// The five OpenAI function schemas, exactly as the model was trained with them.
pub fn tool_schemas() -> Vec<Value> {
    let f = |name: &str, description: &str, properties: Value, required: &[&str]| {
        json!({"type": "function", "function": {"name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required}}})
    };
    vec![
        f(
            "Read",
            "Read a text file. Returns numbered lines.",
            json!({
                "file_path": {"type": "string", "description": "Path to the file to read."},
                "offset": {"type": "integer", "description": "Optional 1-based starting line."},
                "limit": {"type": "integer", "description": "Optional maximum number of lines."}
            }),
            &["file_path"],
        ),
        f(
            "Write",
            "Write a complete file, creating parent directories when needed.",
            json!({
                "file_path": {"type": "string", "description": "Path to write."},
                "content": {"type": "string", "description": "Full file contents."}
            }),
            &["file_path", "content"],
        ),
        f(
            "Edit",
            "Replace an exact string in a text file.",
            json!({
                "file_path": {"type": "string", "description": "Path to edit."},
                "old_string": {"type": "string", "description": "Exact text to replace."},
                "new_string": {"type": "string", "description": "Replacement text."},
                "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of requiring one match."}
            }),
            &["file_path", "old_string", "new_string"],
        ),
        f(
            "Glob",
            "Find files by glob pattern.",
            json!({
                "pattern": {"type": "string", "description": "Glob pattern, e.g. **/*.py."},
                "path": {"type": "string", "description": "Optional directory to search from."}
            }),
            &["pattern"],
        ),
        f(
            "Bash",
            "Run a shell command in the repository workdir.",
            json!({
                "command": {"type": "string", "description": "Command to run."},
                "description": {"type": "string", "description": "Short description of the command."},
                "timeout": {"type": "number", "description": "Optional timeout in seconds."}
            }),
            &["command"],
        ),
    ]
}

/// How an over-long observation is shortened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truncation {
    /// Leaf: keep the head, then `\n[truncated K chars]`.
    Head,
    /// Drift guard: keep head and tail around `\n[truncated K chars]\n` (the end of a test
    /// run is usually what matters).
    HeadTail,
}

/// Shortens `text` to `limit` characters (plus the marker) the way `mode` says.
pub fn truncate(text: &str, limit: usize, mode: Truncation) -> String {
    let total = text.chars().count();
    if limit == 0 || total <= limit {
        return text.to_string();
    }
    let cut = total - limit;
    let byte_at = |n: usize| text.char_indices().nth(n).map_or(text.len(), |(i, _)| i);
    match mode {
        Truncation::Head => format!("{}\n[truncated {cut} chars]", &text[..byte_at(limit)]),
        Truncation::HeadTail => {
            let head = limit / 2;
            let tail_start = byte_at(total - (limit - head));
            format!("{}\n[truncated {cut} chars]\n{}", &text[..byte_at(head)], &text[tail_start..])
        }
    }
}

/// Asks the user before each Bash command (`--confirm`); `true` runs it.
pub type ConfirmFn = Box<dyn FnMut(&str) -> bool + Send>;

/// The tools bound to one workspace.
pub struct ToolBox {
    workdir: PathBuf,
    sandbox: Sandbox,
    /// How over-long Read/Bash output is cut.
    pub truncation: Truncation,
    /// Called before each Bash command, if set.
    pub confirm: Option<ConfirmFn>,
    /// Refuse Edit and Write on an existing file this run has not Read or written
    /// ([`ToolBox::require_read_before_edit`]).
    read_before_edit: bool,
    /// Files Read or written in this run (lexically resolved), for `read_before_edit`.
    seen: std::collections::HashSet<PathBuf>,
}

/// A tool failure, shown to the model as `{kind}: {message}`.
struct ToolError {
    kind: &'static str,
    message: String,
}

fn err(kind: &'static str, message: impl Into<String>) -> ToolError {
    ToolError { kind, message: message.into() }
}

impl ToolBox {
    /// Tools working in `sandbox`'s workspace.
    pub fn new(sandbox: Sandbox) -> Self {
        ToolBox {
            workdir: sandbox.workspace().to_path_buf(),
            sandbox,
            truncation: Truncation::Head,
            confirm: None,
            read_before_edit: false,
            seen: Default::default(),
        }
    }

    /// With `on`, Edit and Write refuse an existing file that this run has not Read (or
    /// written) yet, as Claude Code's tools do: a small model otherwise edits blind —
    /// guessing `old_string`, or replacing a whole module with a placeholder — and the
    /// refusal tells it to Read first. Off by default and in the Leaf harness.
    pub fn require_read_before_edit(&mut self, on: bool) {
        self.read_before_edit = on;
    }

    /// Counts the file of an earlier Read or Write call (`name`, `arguments`) as seen: a
    /// continued run has its first run's reads in its history.
    pub fn mark_seen(&mut self, name: &str, arguments: &str) {
        if let Ok(Value::Object(args)) = serde_json::from_str::<Value>(arguments) {
            self.remember(name, &args);
        }
    }

    /// Records the file of a Read or Write with `args` as seen.
    fn remember(&mut self, name: &str, args: &Map<String, Value>) {
        if matches!(name, "Read" | "Write") {
            if let Ok(path) = self.path_arg(args, "file_path") {
                self.seen.insert(resolve_lexically(&path));
            }
        }
    }

    /// The refusal of an Edit or Write of `args`' file when it is a regular file beneath the
    /// workspace root that has not been Read. Existence is asked beneath the root, as the
    /// tools open files, so the refusal tells nothing of files outside the workspace (those
    /// get the tools' own "outside the workspace" refusal).
    fn unread_file(&self, args: &Map<String, Value>) -> Option<ToolError> {
        let path = resolve_lexically(&self.path_arg(args, "file_path").ok()?);
        if self.seen.contains(&path) {
            return None;
        }
        let rel = self.inside(&path)?;
        let fd = beneath::open(self.root().ok()?.as_fd(), &rel, libc::O_PATH, 0).ok()?;
        if !std::fs::File::from(fd).metadata().is_ok_and(|m| m.is_file()) {
            return None;
        }
        Some(err(
            "PermissionError",
            format!(
                "{} has not been read in this session: Read it first, then Edit its current text (or Write it \
                 whole)",
                self.display(&path)
            ),
        ))
    }

    /// The workspace the tools work in.
    pub fn workdir(&self) -> &Path {
        &self.workdir
    }

    /// Runs tool `name` with `arguments` (an OpenAI arguments string; anything that is not a
    /// JSON object counts as no arguments) and returns the observation text.
    pub fn execute(&mut self, name: &str, arguments: &str) -> String {
        let args = match serde_json::from_str::<Value>(arguments) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        };
        if self.read_before_edit && matches!(name, "Edit" | "Write") {
            if let Some(e) = self.unread_file(&args) {
                return format!("{}: {}", e.kind, e.message);
            }
        }
        let result = match name {
            "Read" => self.read(&args),
            "Write" => self.write(&args),
            "Edit" => self.edit(&args),
            "Glob" => self.glob(&args),
            "Bash" => self.bash(&args),
            _ => return format!("Unknown tool: {name}"),
        };
        if result.is_ok() {
            self.remember(name, &args);
        }
        result.unwrap_or_else(|e| format!("{}: {}", e.kind, e.message))
    }

    fn path_arg(&self, args: &Map<String, Value>, key: &str) -> Result<PathBuf, ToolError> {
        let value = [key, "path"]
            .iter()
            .filter_map(|k| args.get(*k))
            .map(py_str)
            .find(|s| !s.is_empty())
            .ok_or_else(|| err("ValueError", format!("{key} is required")))?;
        Ok(self.resolve(&value))
    }

    fn resolve(&self, value: &str) -> PathBuf {
        let expanded = match (value.strip_prefix("~/"), std::env::var_os("HOME")) {
            (Some(rest), Some(home)) => Path::new(&home).join(rest),
            _ => PathBuf::from(value),
        };
        if expanded.is_absolute() {
            expanded
        } else {
            self.workdir.join(expanded)
        }
    }

    /// The path relative to the workdir if inside it, else as given.
    fn display(&self, path: &Path) -> String {
        let resolved = resolve_lexically(path);
        match resolved.strip_prefix(&self.workdir) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".into(),
            Ok(rel) => rel.to_string_lossy().into_owned(),
            Err(_) => path.to_string_lossy().into_owned(),
        }
    }

    /// `path` relative to the workspace root, when it is spelled as a path under the root
    /// (it may still contain `..` or symlinks: [`beneath::open`] decides where it really
    /// leads). `None` for any other absolute path.
    fn inside(&self, path: &Path) -> Option<PathBuf> {
        path.strip_prefix(&self.workdir).ok().map(Path::to_path_buf)
    }

    /// A handle on the workspace root that every host-side file operation starts from.
    fn root(&self) -> Result<OwnedFd, ToolError> {
        let dir = std::fs::File::open(&self.workdir).map_err(|e| io_error(e, &self.workdir))?;
        Ok(dir.into())
    }

    /// The refusal for paths that are, or resolve to, something outside the workspace.
    fn outside(path: &Path) -> ToolError {
        err("PermissionError", format!("{} is outside the workspace", path.display()))
    }

    /// An error from resolving beneath the workspace root, in Python's words (about `at`);
    /// EXDEV (the kernel's "this would leave the root") is our PermissionError about `path`.
    fn beneath_error(e: std::io::Error, path: &Path, at: &Path) -> ToolError {
        if e.raw_os_error() == Some(libc::EXDEV) {
            Self::outside(path)
        } else {
            io_error(e, at)
        }
    }

    /// Opens the regular file `rel` beneath the workspace root with `flags` (plus `O_CREAT`
    /// when `create`), refusing directories and anything that is not a regular file (FIFOs,
    /// sockets, devices) before opening it for real, so that nothing can block or have
    /// open-time side effects. `Ok(None)` when the path resolves outside the workspace.
    fn open_regular(
        root: &OwnedFd,
        rel: &Path,
        path: &Path,
        flags: i32,
        create: bool,
    ) -> Result<Option<std::fs::File>, ToolError> {
        let escaped = |e: &std::io::Error| e.raw_os_error() == Some(libc::EXDEV);
        match beneath::open(root.as_fd(), rel, libc::O_PATH, 0) {
            Ok(fd) => check_regular(&std::fs::File::from(fd), path)?,
            Err(e) if escaped(&e) => return Ok(None),
            Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(io_error(e, path)),
        }
        let mut flags = flags | libc::O_NONBLOCK | libc::O_NOCTTY;
        if create {
            flags |= libc::O_CREAT;
        }
        let file = match beneath::open(root.as_fd(), rel, flags, 0o666) {
            Ok(fd) => std::fs::File::from(fd),
            Err(e) if escaped(&e) => return Ok(None),
            Err(e) => return Err(io_error(e, path)),
        };
        // Checked again on what was actually opened (a file swapped in between counts).
        check_regular(&file, path)?;
        Ok(Some(file))
    }

    fn read(&self, args: &Map<String, Value>) -> Result<String, ToolError> {
        let path = self.path_arg(args, "file_path")?;
        // Inside the workspace: read on the host, resolved beneath the root. Anything else
        // (an outside path, or a symlink or `..` leading out) is read through the sandbox,
        // so the model sees exactly what its Bash commands see: hidden files stay hidden.
        let mut local = None;
        if let Some(rel) = self.inside(&path) {
            let root = self.root()?;
            local = Self::open_regular(&root, &rel, &path, libc::O_RDONLY, false)?;
        }
        let source = match local {
            Some(file) => {
                let size = file.metadata().map_err(|e| io_error(e, &path))?.len();
                ReadSource::File(file, size)
            }
            None => self.fetch_through_sandbox(&path)?,
        };
        let offset = optional_int(args.get("offset"), 1)?.max(1) as usize;
        let limit = optional_int(args.get("limit"), 0)?;
        let end = (limit > 0).then(|| (offset - 1).saturating_add(limit as usize));
        let mut out = ReadRender::new(self.display(&path), offset, end);
        let (read, size) = match source {
            ReadSource::File(file, size) => {
                let read = out.feed_from(file.take(READ_SCAN_BYTES)).map_err(|e| io_error(e, &path))?;
                (read, size)
            }
            ReadSource::Bytes(bytes, size) => {
                let read = out.feed_from(bytes.as_slice()).map_err(|e| io_error(e, &path))?;
                (read, size)
            }
        };
        Ok(out.finish(read, size, READ_OUTPUT_CHARS, self.truncation))
    }

    /// Reads up to [`READ_SCAN_BYTES`] of `path` inside the sandbox (what `head -c` there
    /// prints), with the file's size; the sandbox's own error becomes the Python error.
    fn fetch_through_sandbox(&self, path: &Path) -> Result<ReadSource, ToolError> {
        let cap = (self.sandbox.spec().output_limit as u64).min(READ_SCAN_BYTES);
        // Exit 21/22: a directory / not a regular file (checked first, so that a FIFO or a
        // device is never opened); otherwise head's own error message, then the size.
        let script = format!(
            "f=$1\nif [ -d \"$f\" ]; then exit 21; fi\nif [ -e \"$f\" ] && [ ! -f \"$f\" ]; then exit 22; fi\n\
             head -c {cap} -- \"$f\" || exit 1\nstat -L -c %s -- \"$f\" >&2"
        );
        let cmd = Command::new("bash")
            .args(["-c", script.as_str(), "frognano-read"])
            .arg(path.to_string_lossy())
            .timeout(SANDBOX_READ_TIMEOUT);
        let out = self.sandbox.run(&cmd).map_err(|e| err("OSError", e.to_string()))?;
        if out.timed_out {
            return Err(err("TimeoutError", format!("reading '{}' took too long", path.display())));
        }
        match out.exit_code {
            Some(0) => {
                // The size is stat's line, the last one (a shell warning may come before it).
                let size = out.stderr.lines().last().and_then(|l| l.trim().parse::<u64>().ok());
                let size = size.unwrap_or(out.stdout_bytes.len() as u64);
                Ok(ReadSource::Bytes(out.stdout_bytes, size))
            }
            Some(21) => Err(os_error(libc::EISDIR, path)),
            Some(22) => Err(not_regular(path)),
            _ => {
                // "head: cannot open 'P' for reading: No such file or directory"
                let message = out.stderr.trim_end().lines().last().unwrap_or_default();
                let strerror = message.rsplit(": ").next().unwrap_or(message);
                match errno_of(strerror) {
                    Some(errno) => Err(os_error(errno, path)),
                    None => Err(err("OSError", format!("{message}: '{}'", path.display()))),
                }
            }
        }
    }

    fn write(&self, args: &Map<String, Value>) -> Result<String, ToolError> {
        let path = self.path_arg(args, "file_path")?;
        let rel = self.inside(&path).ok_or_else(|| Self::outside(&path))?;
        let content = args.get("content").map(py_str).unwrap_or_default();
        let root = self.root()?;
        // Parent folders are made one at a time beneath the root, each one checked.
        if let Some(parent) = rel.parent() {
            make_dirs(&root, parent).map_err(|e| Self::beneath_error(e, &path, path.parent().unwrap_or(&path)))?;
        }
        let mut file =
            Self::open_regular(&root, &rel, &path, libc::O_WRONLY, true)?.ok_or_else(|| Self::outside(&path))?;
        file.set_len(0).map_err(|e| io_error(e, &path))?;
        file.write_all(content.as_bytes()).map_err(|e| io_error(e, &path))?;
        // Leaf reports Python's len(content): characters, labelled bytes.
        Ok(format!("Wrote {} ({} bytes).", self.display(&path), content.chars().count()))
    }

    fn edit(&self, args: &Map<String, Value>) -> Result<String, ToolError> {
        let path = self.path_arg(args, "file_path")?;
        let old = args.get("old_string").map(py_str).unwrap_or_default();
        let new = args.get("new_string").map(py_str).unwrap_or_default();
        if old.is_empty() {
            return Err(err("ValueError", "old_string must be non-empty"));
        }
        let rel = self.inside(&path).ok_or_else(|| Self::outside(&path))?;
        let root = self.root()?;
        let mut file =
            Self::open_regular(&root, &rel, &path, libc::O_RDWR, false)?.ok_or_else(|| Self::outside(&path))?;
        let mut bytes = Vec::new();
        (&mut file).take(EDIT_MAX_BYTES + 1).read_to_end(&mut bytes).map_err(|e| io_error(e, &path))?;
        if bytes.len() as u64 > EDIT_MAX_BYTES {
            return Err(os_error(libc::EFBIG, &path));
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let count = text.matches(old.as_str()).count();
        let replace_all = args.get("replace_all").is_some_and(truthy);
        if count == 0 {
            return Err(err("ValueError", "old_string was not found"));
        }
        if count != 1 && !replace_all {
            return Err(err(
                "ValueError",
                format!("old_string matched {count} times; set replace_all=true or use a more specific old_string"),
            ));
        }
        let updated = if replace_all { text.replace(&old, &new) } else { text.replacen(&old, &new, 1) };
        file.set_len(0).map_err(|e| io_error(e, &path))?;
        file.seek(SeekFrom::Start(0)).map_err(|e| io_error(e, &path))?;
        file.write_all(updated.as_bytes()).map_err(|e| io_error(e, &path))?;
        let changed = if replace_all { count } else { 1 };
        let s = if changed != 1 { "s" } else { "" };
        Ok(format!("Edited {} ({changed} replacement{s}).", self.display(&path)))
    }

    fn glob(&self, args: &Map<String, Value>) -> Result<String, ToolError> {
        let pattern = args.get("pattern").map(py_str).unwrap_or_default();
        if pattern.is_empty() {
            return Err(err("ValueError", "pattern is required"));
        }
        let root_arg = args.get("path").map(py_str).filter(|p| !p.is_empty()).unwrap_or_else(|| ".".into());
        let base = self.resolve(&root_arg);
        let full = if Path::new(&pattern).is_absolute() { PathBuf::from(&pattern) } else { base.join(&pattern) };
        let refuse = |shown: &Path| {
            err(
                "PermissionError",
                format!(
                    "{} is outside the workspace; Glob searches only the workspace (use Bash, e.g. find, elsewhere)",
                    shown.display()
                ),
            )
        };
        let Some(rel) = self.inside(&full) else {
            return Err(refuse(if Path::new(&pattern).is_absolute() { Path::new(&pattern) } else { &base }));
        };
        let root = self.root()?;
        let mut walk = GlobWalk::new(&root);
        // EXDEV: a symlink or `..` in the fixed part of the pattern leads out.
        let found = walk.run(&rel).map_err(|e| {
            if e.raw_os_error() == Some(libc::EXDEV) {
                refuse(&resolve_lexically(&full))
            } else {
                io_error(e, &full)
            }
        })?;
        let mut matches: Vec<String> = found.into_iter().collect();
        let mut out = if matches.is_empty() {
            "No files matched.".to_string()
        } else {
            let more = matches.len().saturating_sub(GLOB_LIMIT);
            matches.truncate(GLOB_LIMIT);
            let mut out = matches.join("\n");
            if more > 0 {
                out.push_str(&format!("\n... {more} more files"));
            }
            out
        };
        if walk.stopped {
            out.push_str(&format!(
                "\n[search stopped after visiting {} entries in {:.1}s; the list may be incomplete: narrow the pattern or path]",
                walk.visited,
                walk.started.elapsed().as_secs_f64()
            ));
        }
        Ok(out)
    }

    /// Whether the workspace differs from its last commit (tracked changes or new files, by
    /// `git status --porcelain` in the sandbox); `None` when that cannot be told (not a git
    /// repository, git missing). Not shown to the model, and no confirmation is asked.
    pub fn workspace_changed(&mut self) -> Option<bool> {
        let out = self.sandbox.run(&Command::bash("git status --porcelain").timeout(Duration::from_secs(30))).ok()?;
        (!out.timed_out && out.returncode() == 0).then(|| !out.stdout.trim().is_empty())
    }

    fn bash(&mut self, args: &Map<String, Value>) -> Result<String, ToolError> {
        let command = args.get("command").map(py_str).unwrap_or_default();
        if command.is_empty() {
            return Err(err("ValueError", "command is required"));
        }
        let timeout = timeout_seconds(args)?;
        if let Some(confirm) = self.confirm.as_mut() {
            if !confirm(&command) {
                return Err(err("PermissionError", "the user declined to run this command"));
            }
        }
        let out = self
            .sandbox
            .run(&Command::bash(&command).timeout(Duration::from_secs_f64(timeout)))
            .map_err(|e| err("OSError", e.to_string()))?;
        let text = if out.timed_out {
            format!("Timed out after {timeout:.1}s\nSTDOUT:\n{}\nSTDERR:\n{}", out.stdout, out.stderr)
        } else {
            format!("Exit code: {}\nSTDOUT:\n{}\nSTDERR:\n{}", out.returncode(), out.stdout, out.stderr)
        };
        Ok(truncate(&text, BASH_OUTPUT_CHARS, self.truncation))
    }
}

/// Longest Bash timeout we accept (a day); Python would wait forever on `inf`.
const BASH_MAX_TIMEOUT_SECS: f64 = 86_400.0;

/// Bash's timeout: `timeout_ms`, else `timeout` (seconds; over 1000 read as milliseconds),
/// else 120 s; clamped to 0.1 s .. one day (NaN counts as the minimum).
fn timeout_seconds(args: &Map<String, Value>) -> Result<f64, ToolError> {
    let secs = if let Some(ms) = args.get("timeout_ms").filter(|v| !v.is_null()) {
        py_float(ms)? / 1000.0
    } else {
        match args.get("timeout").filter(|v| !v.is_null()) {
            None => BASH_DEFAULT_TIMEOUT_SECS,
            Some(raw) => {
                let v = py_float(raw)?;
                if v > 1000.0 {
                    v / 1000.0
                } else {
                    v
                }
            }
        }
    };
    Ok(secs.clamp(0.1, BASH_MAX_TIMEOUT_SECS).max(0.1))
}

/// Python's `str(value)` for JSON values as the tools see them.
fn py_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Null => "None".into(),
        other => other.to_string(),
    }
}

fn py_float(v: &Value) -> Result<f64, ToolError> {
    match v {
        Value::Number(n) => Ok(n.as_f64().unwrap_or(0.0)),
        Value::Bool(b) => Ok(f64::from(u8::from(*b))),
        other => {
            let s = py_str(other);
            s.trim().parse::<f64>().map_err(|_| err("ValueError", format!("could not convert string to float: '{s}'")))
        }
    }
}

fn optional_int(v: Option<&Value>, default: i64) -> Result<i64, ToolError> {
    match v {
        None | Some(Value::Null) => Ok(default),
        Some(Value::String(s)) if s.is_empty() => Ok(default),
        Some(Value::Number(n)) => Ok(n.as_i64().unwrap_or_else(|| n.as_f64().unwrap_or(0.0) as i64)),
        Some(Value::Bool(b)) => Ok(i64::from(*b)),
        Some(other) => {
            let s = py_str(other);
            s.trim()
                .parse::<i64>()
                .map_err(|_| err("ValueError", format!("invalid literal for int() with base 10: '{s}'")))
        }
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        other => matches!(py_str(other).trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"),
    }
}

/// An I/O error in Python's words (`FileNotFoundError: [Errno 2] ...: 'path'`).
fn io_error(e: std::io::Error, path: &Path) -> ToolError {
    match e.raw_os_error() {
        Some(errno) => os_error(errno, path),
        None => err("OSError", format!("[Errno 0] {e}: '{}'", path.display())),
    }
}

/// Errno `errno` about `path`, as Python raises it.
fn os_error(errno: i32, path: &Path) -> ToolError {
    let kind = match errno {
        2 => "FileNotFoundError",
        13 | 1 => "PermissionError",
        21 => "IsADirectoryError",
        20 => "NotADirectoryError",
        17 => "FileExistsError",
        _ => "OSError",
    };
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    // std says "No such file or directory (os error 2)"; Python says "[Errno 2] No such ...".
    let strerror = text.split(" (os error").next().unwrap_or(&text);
    err(kind, format!("[Errno {errno}] {strerror}: '{}'", path.display()))
}

/// Python's `str.splitlines()`: splits on every line boundary it knows, `\r\n` as one
/// (the reference [`ReadRender`] is tested against).
#[cfg(test)]
fn py_splitlines(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if is_line_break(c) {
            lines.push(&text[start..i]);
            let mut next = i + c.len_utf8();
            if c == '\r' {
                if let Some(&(j, '\n')) = chars.peek() {
                    chars.next();
                    next = j + 1;
                }
            }
            start = next;
        }
    }
    if start < text.len() {
        lines.push(&text[start..]);
    }
    lines
}

/// Removes `.` and `..` without touching the file system.
fn resolve_lexically(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Bytes of a file Read looks at, at most: far more than the 20,000-character output needs,
/// yet bounded, so that a huge or endless file cannot take the memory or the time.
pub const READ_SCAN_BYTES: u64 = 16 << 20;
/// Largest file Edit rewrites (it holds the whole file in memory).
pub const EDIT_MAX_BYTES: u64 = 64 << 20;
/// Glob stops after visiting this many directory entries ...
pub const GLOB_MAX_ENTRIES: usize = 200_000;
/// ... or after this long, and says so in its observation.
pub const GLOB_MAX_TIME: Duration = Duration::from_secs(10);
/// Wall-clock limit of a Read performed through the sandbox.
const SANDBOX_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Where Read takes its bytes from: a file opened beneath the workspace root, or what a
/// command in the sandbox printed; each with the file's full size.
enum ReadSource {
    File(std::fs::File, u64),
    Bytes(Vec<u8>, u64),
}

/// Streams a file into Read's observation without holding more of it than the output needs:
/// decodes like Python's `bytes.decode(errors="replace")` would the whole file, splits lines
/// like `str.splitlines()`, numbers the lines from `offset` to `end`, stops reading after
/// line `end`, and keeps the head and tail of the text for the truncation marker while
/// counting every character.
struct ReadRender {
    offset: usize,
    end: Option<usize>,
    lineno: usize,
    in_line: bool,
    selected: bool,
    any_selected: bool,
    pending_cr: bool,
    done: bool,
    /// Characters of the whole observation.
    total: usize,
    /// The observation from its start, up to [`RENDER_KEEP_BYTES`] (plus one piece).
    head: String,
    /// `head` holds the whole observation.
    head_complete: bool,
    /// The last [`RENDER_TAIL_BYTES`] or more of the observation.
    tail: String,
}

const RENDER_KEEP_BYTES: usize = 4 << 20;
const RENDER_TAIL_BYTES: usize = 4 * READ_OUTPUT_CHARS + 4;

fn is_line_break(c: char) -> bool {
    matches!(c, '\n' | '\r' | '\x0b' | '\x0c' | '\x1c' | '\x1d' | '\x1e' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

impl ReadRender {
    fn new(display: String, offset: usize, end: Option<usize>) -> Self {
        let mut r = ReadRender {
            offset,
            end,
            lineno: 0,
            in_line: false,
            selected: false,
            any_selected: false,
            pending_cr: false,
            done: end.is_some_and(|e| e < offset),
            total: 0,
            head: String::new(),
            head_complete: true,
            tail: String::new(),
        };
        r.emit(&display);
        r.emit("\n");
        r
    }

    fn emit(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        self.total += s.chars().count();
        if self.head.len() < RENDER_KEEP_BYTES {
            self.head.push_str(s);
        } else {
            self.head_complete = false;
        }
        self.tail.push_str(s);
        if self.tail.len() > 2 * RENDER_TAIL_BYTES {
            let mut cut = self.tail.len() - RENDER_TAIL_BYTES;
            while !self.tail.is_char_boundary(cut) {
                cut += 1;
            }
            self.tail.drain(..cut);
        }
    }

    fn start_line(&mut self) {
        self.in_line = true;
        self.lineno += 1;
        self.selected = self.lineno >= self.offset && self.end.is_none_or(|e| self.lineno <= e);
        if self.selected {
            let prefix = if self.any_selected { format!("\n{}. ", self.lineno) } else { format!("{}. ", self.lineno) };
            self.any_selected = true;
            self.emit(&prefix);
        }
    }

    fn end_line(&mut self) {
        self.in_line = false;
        if self.end == Some(self.lineno) {
            self.done = true;
        }
    }

    /// Takes the next piece of decoded text.
    fn feed(&mut self, s: &str) {
        let mut run: Option<usize> = None;
        for (i, c) in s.char_indices() {
            if self.done {
                return;
            }
            if self.pending_cr {
                self.pending_cr = false;
                if c == '\n' {
                    continue;
                }
            }
            if is_line_break(c) {
                if let Some(start) = run.take() {
                    if self.selected {
                        self.emit(&s[start..i]);
                    }
                }
                if !self.in_line {
                    self.start_line();
                }
                self.end_line();
                self.pending_cr = c == '\r';
            } else {
                if !self.in_line {
                    self.start_line();
                }
                run.get_or_insert(i);
            }
        }
        if let Some(start) = run {
            if self.selected && !self.done {
                self.emit(&s[start..]);
            }
        }
    }

    /// Reads `src` to its end or until the last wanted line; returns the bytes read.
    fn feed_from(&mut self, mut src: impl Read) -> std::io::Result<u64> {
        let mut buf = vec![0u8; 64 << 10];
        let mut pending: Vec<u8> = Vec::new();
        let mut read = 0u64;
        while !self.done {
            let n = match src.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                // An incomplete sequence at the very end is one replacement character.
                if !pending.is_empty() {
                    self.feed(&String::from_utf8_lossy(&pending));
                }
                break;
            }
            read += n as u64;
            pending.extend_from_slice(&buf[..n]);
            let mut at = 0;
            while !self.done {
                match std::str::from_utf8(&pending[at..]) {
                    Ok(s) => {
                        self.feed(s);
                        at = pending.len();
                        break;
                    }
                    Err(e) => {
                        let valid = e.valid_up_to();
                        let s = std::str::from_utf8(&pending[at..at + valid]).expect("valid prefix");
                        self.feed(s);
                        at += valid;
                        match e.error_len() {
                            Some(bad) => {
                                self.feed("\u{fffd}");
                                at += bad;
                            }
                            // Incomplete: wait for the next bytes.
                            None => break,
                        }
                    }
                }
            }
            pending.drain(..at.min(pending.len()));
        }
        Ok(read)
    }

    /// The observation, given how many bytes were read of a file of `size` bytes.
    fn finish(self, read: u64, size: u64, limit: usize, mode: Truncation) -> String {
        let unread = !self.done && size > read;
        let byte_at = |text: &str, n: usize| text.char_indices().nth(n).map_or(text.len(), |(i, _)| i);
        if unread {
            // The file goes on past what was read: say so instead of guessing a count.
            let shown = &self.head[..byte_at(&self.head, limit)];
            let what = if self.total > limit {
                format!("truncated more than {} chars; ", self.total - limit)
            } else {
                String::new()
            };
            return format!("{shown}\n[{what}read stopped after {read} of {size} bytes]");
        }
        if self.head_complete {
            return truncate(&self.head, limit, mode);
        }
        let cut = self.total - limit;
        match mode {
            Truncation::Head => format!("{}\n[truncated {cut} chars]", &self.head[..byte_at(&self.head, limit)]),
            Truncation::HeadTail => {
                let head = limit / 2;
                let keep = limit - head;
                let tail_chars = self.tail.chars().count();
                let tail = &self.tail[byte_at(&self.tail, tail_chars.saturating_sub(keep))..];
                format!("{}\n[truncated {cut} chars]\n{tail}", &self.head[..byte_at(&self.head, head)])
            }
        }
    }
}

/// Fails unless `file` (already opened, possibly `O_PATH`) is a regular file.
fn check_regular(file: &std::fs::File, path: &Path) -> Result<(), ToolError> {
    let meta = file.metadata().map_err(|e| io_error(e, path))?;
    if meta.is_dir() {
        Err(os_error(libc::EISDIR, path))
    } else if !meta.is_file() {
        Err(not_regular(path))
    } else {
        Ok(())
    }
}

/// The refusal for FIFOs, sockets and devices, which could block a host-side tool forever.
fn not_regular(path: &Path) -> ToolError {
    err("OSError", format!("[Errno 22] Not a regular file: '{}'", path.display()))
}

/// Creates the folders of `rel` beneath the root one at a time, each resolved beneath the
/// root again (so a symlinked component leading out fails with EXDEV).
fn make_dirs(root: &OwnedFd, rel: &Path) -> std::io::Result<()> {
    let mut prefix = PathBuf::new();
    for c in rel.components() {
        prefix.push(c);
        let dir = libc::O_PATH | libc::O_DIRECTORY;
        match beneath::open(root.as_fd(), &prefix, dir, 0) {
            Ok(_) => continue,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let Component::Normal(name) = c else { return Err(e) };
                let parent = beneath::open(root.as_fd(), prefix.parent().unwrap_or(Path::new("")), dir, 0)?;
                match beneath::mkdirat(parent.as_fd(), name) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                    Err(e) => return Err(e),
                }
                beneath::open(root.as_fd(), &prefix, dir, 0)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Python's `glob.glob(pattern, recursive=True)` restricted to the workspace, then
/// filtered to regular files: `**` alone spans any number of folders, `*`, `?` and `[...]`
/// match within one name, names starting with a dot only match parts that spell the dot.
/// Unlike Python, `**` never follows symlinked folders (no cycles), symlinks elsewhere are
/// followed only while they stay beneath the root, and the walk is bounded by
/// [`GLOB_MAX_ENTRIES`] and [`GLOB_MAX_TIME`].
struct GlobWalk<'a> {
    root: &'a OwnedFd,
    max_entries: usize,
    max_time: Duration,
    visited: usize,
    started: Instant,
    stopped: bool,
}

/// What a directory entry is, from `d_type` (or `fstatat` where the file system does not say).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Link,
    Other,
}

impl<'a> GlobWalk<'a> {
    fn new(root: &'a OwnedFd) -> Self {
        GlobWalk {
            root,
            max_entries: GLOB_MAX_ENTRIES,
            max_time: GLOB_MAX_TIME,
            visited: 0,
            started: Instant::now(),
            stopped: false,
        }
    }

    /// Matches `rel` (a pattern relative to the root); returns sorted display paths.
    fn run(&mut self, rel: &Path) -> std::io::Result<std::collections::BTreeSet<String>> {
        let parts: Vec<String> = rel
            .components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                Component::ParentDir => Some("..".into()),
                _ => None,
            })
            .collect();
        let magic = |p: &str| p.contains(['*', '?', '[']);
        let literal = parts.iter().take_while(|p| !magic(p)).count();
        let prefix: PathBuf = parts[..literal].iter().collect();
        let mut found = std::collections::BTreeSet::new();
        if literal == parts.len() {
            // No wildcard: the path itself, if it is a regular file.
            if self.is_regular(&prefix)? {
                found.insert(display_rel(&prefix));
            }
            return Ok(found);
        }
        // The fixed start folder is resolved like any path (it must stay beneath the root).
        match beneath::open(self.root.as_fd(), &prefix, libc::O_PATH | libc::O_DIRECTORY, 0) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => return Err(e),
            Err(_) => return Ok(found),
        }
        let mut dirs = vec![prefix];
        let rest = &parts[literal..];
        for (i, part) in rest.iter().enumerate() {
            let last = i + 1 == rest.len();
            let mut next = Vec::new();
            for dir in &dirs {
                if self.stopped {
                    break;
                }
                if part == "**" {
                    self.recurse(dir, last, &mut next, &mut found);
                } else if part == ".." || !magic(part) {
                    let child = dir.join(part);
                    if last {
                        if self.is_regular(&child).unwrap_or(false) {
                            found.insert(display_rel(&child));
                        }
                    } else if self.is_dir(&child) {
                        next.push(child);
                    }
                } else {
                    let pat = compile_fnmatch(part);
                    let hidden_ok = part.starts_with('.');
                    for (name, kind) in self.list(dir, false) {
                        let name = name.to_string_lossy();
                        if (name.starts_with('.') && !hidden_ok) || !fnmatch(&pat, &name) {
                            continue;
                        }
                        let child = dir.join(name.as_ref());
                        if last {
                            if self.kind_is_regular(&child, kind) {
                                found.insert(display_rel(&child));
                            }
                        } else if kind == Kind::Dir || (kind == Kind::Link && self.is_dir(&child)) {
                            next.push(child);
                        }
                    }
                }
            }
            if last || next.is_empty() {
                break;
            }
            next.dedup();
            dirs = next;
        }
        Ok(found)
    }

    /// `**`: `dir` and every non-hidden folder below it (never through a symlink) go to
    /// `next`; when it is the last part, the non-hidden regular files below it are matches.
    fn recurse(
        &mut self,
        dir: &Path,
        last: bool,
        next: &mut Vec<PathBuf>,
        found: &mut std::collections::BTreeSet<String>,
    ) {
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            if self.stopped {
                return;
            }
            let entries = self.list(&d, true);
            if !last {
                next.push(d.clone());
            }
            let mut subdirs = Vec::new();
            for (name, kind) in entries {
                if name.as_bytes().first() == Some(&b'.') {
                    continue;
                }
                let child = d.join(&name);
                if kind == Kind::Dir {
                    subdirs.push(child);
                } else if last && self.kind_is_regular(&child, kind) {
                    found.insert(display_rel(&child));
                }
            }
            // Depth first, in name order.
            subdirs.sort();
            stack.extend(subdirs.into_iter().rev());
        }
    }

    /// The entries of folder `dir` (relative to the root), counted against the budget;
    /// empty when it cannot be listed. `nofollow`: `dir`'s last part must not be a symlink.
    fn list(&mut self, dir: &Path, nofollow: bool) -> Vec<(OsString, Kind)> {
        if self.stopped {
            return Vec::new();
        }
        let mut flags = libc::O_RDONLY | libc::O_DIRECTORY;
        if nofollow {
            flags |= libc::O_NOFOLLOW;
        }
        let Ok(fd) = beneath::open(self.root.as_fd(), dir, flags, 0) else { return Vec::new() };
        let budget = self.max_entries.saturating_sub(self.visited);
        let (entries, complete) = beneath::list_dir(fd, budget).unwrap_or_default();
        self.visited += entries.len();
        if !complete || self.visited >= self.max_entries || self.started.elapsed() > self.max_time {
            self.stopped = true;
        }
        entries
    }

    fn kind_is_regular(&self, child: &Path, kind: Kind) -> bool {
        match kind {
            Kind::File => true,
            Kind::Link => self.is_regular(child).unwrap_or(false),
            _ => false,
        }
    }

    /// `rel` resolves (beneath the root) to a regular file; EXDEV when it leads out.
    fn is_regular(&self, rel: &Path) -> std::io::Result<bool> {
        match beneath::open(self.root.as_fd(), rel, libc::O_PATH, 0) {
            Ok(fd) => Ok(std::fs::File::from(fd).metadata().is_ok_and(|m| m.is_file())),
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => Err(e),
            Err(_) => Ok(false),
        }
    }

    /// `rel` resolves (beneath the root) to a folder.
    fn is_dir(&self, rel: &Path) -> bool {
        beneath::open(self.root.as_fd(), rel, libc::O_PATH | libc::O_DIRECTORY, 0).is_ok()
    }
}

/// A root-relative path as Glob shows it (`a/../b` as `b`).
fn display_rel(rel: &Path) -> String {
    resolve_lexically(rel).to_string_lossy().into_owned()
}

/// One element of a compiled `fnmatch` pattern.
#[derive(Debug, Clone, PartialEq)]
enum Pat {
    Char(char),
    Any,
    Star,
    Class { negated: bool, ranges: Vec<(char, char)> },
}

/// Compiles a pattern the way Python's `fnmatch.translate` reads it: `*`, `?`, `[seq]`,
/// `[!seq]` with ranges; a `[` without its `]` is a plain character.
fn compile_fnmatch(pattern: &str) -> Vec<Pat> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        match c {
            '*' => {
                if out.last() != Some(&Pat::Star) {
                    out.push(Pat::Star);
                }
            }
            '?' => out.push(Pat::Any),
            '[' => {
                let mut j = i;
                if j < chars.len() && chars[j] == '!' {
                    j += 1;
                }
                if j < chars.len() && chars[j] == ']' {
                    j += 1;
                }
                while j < chars.len() && chars[j] != ']' {
                    j += 1;
                }
                if j >= chars.len() {
                    out.push(Pat::Char('['));
                    continue;
                }
                let mut body = &chars[i..j];
                i = j + 1;
                let negated = body.first() == Some(&'!');
                if negated {
                    body = &body[1..];
                }
                let mut ranges = Vec::new();
                let mut k = 0;
                while k < body.len() {
                    if k + 2 < body.len() && body[k + 1] == '-' {
                        if body[k] <= body[k + 2] {
                            ranges.push((body[k], body[k + 2]));
                        }
                        k += 3;
                    } else {
                        ranges.push((body[k], body[k]));
                        k += 1;
                    }
                }
                out.push(Pat::Class { negated, ranges });
            }
            other => out.push(Pat::Char(other)),
        }
    }
    out
}

/// Whether `name` matches the compiled pattern (case-sensitive, as on POSIX).
fn fnmatch(pat: &[Pat], name: &str) -> bool {
    let name: Vec<char> = name.chars().collect();
    let one = |p: &Pat, c: char| match p {
        Pat::Char(x) => *x == c,
        Pat::Any => true,
        Pat::Class { negated, ranges } => ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated,
        Pat::Star => false,
    };
    // Linear-time wildcard matching with one backtrack point (the last star).
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pat.len() && pat[p] == Pat::Star {
            star = Some((p, n));
            p += 1;
        } else if p < pat.len() && one(&pat[p], name[n]) {
            p += 1;
            n += 1;
        } else if let Some((sp, sn)) = star {
            p = sp + 1;
            n = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    pat[p..].iter().all(|x| *x == Pat::Star)
}

/// The errno whose message is `strerror` ("No such file or directory" -> 2).
fn errno_of(strerror: &str) -> Option<i32> {
    (1..134).find(|&n| {
        let text = std::io::Error::from_raw_os_error(n).to_string();
        text.split(" (os error").next() == Some(strerror)
    })
}

/// Opening files beneath a directory with the kernel's help: `openat2(2)` with
/// `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` resolves every component — symlinks and `..`
/// included, in the kernel, the way a later `open` would — and fails with EXDEV the moment
/// resolution would leave the directory. Absolute symlinks count as leaving it, even those
/// whose target spells a path inside the workspace: following them safely would need our
/// own resolver, and a repository's links are relative anyway (absolute ones break on every
/// clone). Read still shows such files, through the sandbox; Write and Edit refuse them.
///
/// Kernels before 5.6 (ENOSYS) get the same rules from a walk in user space: one component
/// at a time with `O_NOFOLLOW` relative to the folder before, symlinks read and expanded by
/// hand, `..` popping our own stack of opened folders.
mod beneath {
    use std::collections::VecDeque;
    use std::ffi::{CString, OsStr, OsString};
    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::path::{Component, Path};
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::Kind;

    const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
    const RESOLVE_BENEATH: u64 = 0x08;
    /// The kernel's own limit on symlinks in one resolution.
    const MAX_LINKS: usize = 40;

    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }

    static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

    fn errno(n: i32) -> io::Error {
        io::Error::from_raw_os_error(n)
    }

    fn cstring(s: &OsStr) -> io::Result<CString> {
        CString::new(s.as_bytes()).map_err(|_| errno(libc::EINVAL))
    }

    fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
        if fd < 0 {
            Err(io::Error::last_os_error())
        } else {
            // SAFETY: the kernel just handed us this new descriptor.
            Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
        }
    }

    /// Opens `rel` (relative; empty means `dir` itself) beneath `dir` with `flags`
    /// (`O_CLOEXEC` added); `mode` applies with `O_CREAT`. EXDEV when it leads out.
    pub fn open(dir: BorrowedFd<'_>, rel: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
        if rel.is_absolute() {
            return Err(errno(libc::EXDEV));
        }
        if !NO_OPENAT2.load(Ordering::Relaxed) {
            match openat2(dir, rel, flags, mode) {
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => NO_OPENAT2.store(true, Ordering::Relaxed),
                other => return other,
            }
        }
        walk(dir, rel, flags, mode)
    }

    fn openat2(dir: BorrowedFd<'_>, rel: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
        let path = cstring(if rel.as_os_str().is_empty() { OsStr::new(".") } else { rel.as_os_str() })?;
        let how = OpenHow {
            flags: (flags | libc::O_CLOEXEC) as u64,
            mode: if flags & libc::O_CREAT != 0 { u64::from(mode) } else { 0 },
            resolve: RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
        };
        let mut tries = 0;
        loop {
            // SAFETY: a valid descriptor, a NUL-terminated path and a properly sized open_how.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    dir.as_raw_fd(),
                    path.as_ptr(),
                    &how as *const OpenHow,
                    std::mem::size_of::<OpenHow>(),
                )
            };
            match owned(fd) {
                // EAGAIN: a concurrent rename raced the `..` check; the kernel asks to retry.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) && tries < 32 => tries += 1,
                other => return other,
            }
        }
    }

    fn openat(dir: RawFd, name: &OsStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
        let name = cstring(name)?;
        // SAFETY: a valid descriptor and a NUL-terminated name.
        owned(unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) }.into())
    }

    /// The type bits of `name` in `dir`, not following a symlink.
    fn lstat_mode(dir: RawFd, name: &OsStr) -> io::Result<u32> {
        let name = cstring(name)?;
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: valid descriptor, NUL-terminated name, a stat buffer to fill.
        let r = unsafe { libc::fstatat(dir, name.as_ptr(), st.as_mut_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fstatat succeeded, so the buffer is filled.
        Ok(unsafe { st.assume_init() }.st_mode & libc::S_IFMT)
    }

    fn readlinkat(dir: RawFd, name: &OsStr) -> io::Result<OsString> {
        let name = cstring(name)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: valid descriptor, NUL-terminated name, a buffer of the length given.
        let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(OsString::from_vec(buf))
    }

    /// Creates folder `name` in `dir`.
    pub fn mkdirat(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
        let name = cstring(name)?;
        // SAFETY: valid descriptor and NUL-terminated name.
        if unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o777) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// The user-space resolver for kernels without openat2, with the same rules.
    pub(super) fn walk(root: BorrowedFd<'_>, rel: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
        let mut pending: VecDeque<OsString> = VecDeque::new();
        let push_front = |pending: &mut VecDeque<OsString>, path: &Path| -> io::Result<()> {
            for c in path.components().rev() {
                match c {
                    Component::Normal(s) => pending.push_front(s.to_os_string()),
                    Component::ParentDir => pending.push_front("..".into()),
                    Component::CurDir => {}
                    Component::RootDir | Component::Prefix(_) => return Err(errno(libc::EXDEV)),
                }
            }
            Ok(())
        };
        push_front(&mut pending, rel)?;
        // Folders opened below the root, innermost last; the current folder is the last one.
        let mut stack: Vec<OwnedFd> = Vec::new();
        let mut links = 0;
        loop {
            let cur = stack.last().map_or(root.as_raw_fd(), AsRawFd::as_raw_fd);
            let Some(name) = pending.pop_front() else {
                return openat(cur, OsStr::new("."), flags, mode);
            };
            if name == ".." {
                if stack.pop().is_none() {
                    return Err(errno(libc::EXDEV));
                }
                continue;
            }
            let last = pending.is_empty();
            match lstat_mode(cur, &name) {
                Ok(libc::S_IFLNK) => {
                    if last && flags & libc::O_NOFOLLOW != 0 {
                        return Err(errno(libc::ELOOP));
                    }
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(errno(libc::ELOOP));
                    }
                    let target = readlinkat(cur, &name)?;
                    if target.as_bytes().first() == Some(&b'/') {
                        return Err(errno(libc::EXDEV));
                    }
                    push_front(&mut pending, Path::new(&target))?;
                    continue;
                }
                Ok(_) => {}
                Err(e) if last && e.raw_os_error() == Some(libc::ENOENT) && flags & libc::O_CREAT != 0 => {}
                Err(e) => return Err(e),
            }
            if last {
                // O_NOFOLLOW: a symlink swapped in since the check fails instead of being followed.
                return openat(cur, &name, flags | libc::O_NOFOLLOW, mode);
            }
            stack.push(openat(cur, &name, libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)?);
        }
    }

    /// Up to `budget` entries of the folder open at `dir` (`.` and `..` left out), and
    /// whether that was all of them.
    pub fn list_dir(dir: OwnedFd, budget: usize) -> io::Result<(Vec<(OsString, Kind)>, bool)> {
        let raw = dir.as_raw_fd();
        // SAFETY: fdopendir takes over the descriptor (closedir closes it).
        let stream = unsafe { libc::fdopendir(raw) };
        if stream.is_null() {
            return Err(io::Error::last_os_error());
        }
        std::mem::forget(dir);
        let mut out = Vec::new();
        let mut complete = true;
        loop {
            // SAFETY: the stream is open; the entry is valid until the next readdir.
            let entry = unsafe { libc::readdir(stream) };
            if entry.is_null() {
                break;
            }
            if out.len() >= budget {
                complete = false;
                break;
            }
            // SAFETY: as above; d_name is NUL-terminated.
            let (name, d_type) =
                unsafe { (std::ffi::CStr::from_ptr((*entry).d_name.as_ptr()).to_bytes().to_vec(), (*entry).d_type) };
            if name == b"." || name == b".." {
                continue;
            }
            let name = OsString::from_vec(name);
            let kind = match d_type {
                libc::DT_DIR => Kind::Dir,
                libc::DT_REG => Kind::File,
                libc::DT_LNK => Kind::Link,
                libc::DT_UNKNOWN => match lstat_mode(raw, &name) {
                    Ok(libc::S_IFDIR) => Kind::Dir,
                    Ok(libc::S_IFREG) => Kind::File,
                    Ok(libc::S_IFLNK) => Kind::Link,
                    _ => Kind::Other,
                },
                _ => Kind::Other,
            };
            out.push((name, kind));
        }
        // SAFETY: closes the stream (and the descriptor) exactly once.
        unsafe { libc::closedir(stream) };
        Ok((out, complete))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitlines_like_python() {
        assert_eq!(py_splitlines("a\nb\r\nc\rd"), ["a", "b", "c", "d"]);
        assert_eq!(py_splitlines("a\n"), ["a"]);
        assert_eq!(py_splitlines(""), Vec::<&str>::new());
        assert_eq!(py_splitlines("\n\n"), ["", ""]);
    }

    /// The old Read, whole file in memory: the reference for [`ReadRender`].
    fn read_reference(display: &str, bytes: &[u8], offset: usize, limit: usize, mode: Truncation) -> String {
        let text = String::from_utf8_lossy(bytes);
        let lines = py_splitlines(&text);
        let end = if limit == 0 { lines.len() } else { lines.len().min(offset - 1 + limit) };
        let selected: Vec<String> =
            lines.iter().enumerate().take(end).skip(offset - 1).map(|(i, line)| format!("{}. {line}", i + 1)).collect();
        truncate(&format!("{display}\n{}", selected.join("\n")), READ_OUTPUT_CHARS, mode)
    }

    /// Feeds `bytes` in pieces of `chunk` bytes, as a pipe might deliver them.
    struct Chunks<'a>(&'a [u8], usize);
    impl Read for Chunks<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.len().min(self.1).min(buf.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn streamed_read_matches_whole_file_read() {
        let samples: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"\n".to_vec(),
            b"a\r\nb\rc\n\nd".to_vec(),
            "x\u{2028}y\u{85}z\u{2029}".as_bytes().to_vec(),
            b"caf\xe9\n\xe2\x80\nA\xf0\x9f\x98".to_vec(),
            "é\r\n€\r".repeat(50).into_bytes(),
            (0..3000).map(|i| format!("line {i:04}\n")).collect::<String>().into_bytes(),
        ];
        for bytes in &samples {
            for (offset, limit) in [(1, 0), (1, 1), (2, 2), (5, 0), (2999, 0), (4000, 3)] {
                for chunk in [1, 2, 3, 7, 1 << 20] {
                    for mode in [Truncation::Head, Truncation::HeadTail] {
                        let want = read_reference("f", bytes, offset, limit, mode);
                        let end = (limit > 0).then(|| offset - 1 + limit);
                        let mut r = ReadRender::new("f".into(), offset, end);
                        let read = r.feed_from(Chunks(bytes, chunk)).unwrap();
                        let got = r.finish(read, read, READ_OUTPUT_CHARS, mode);
                        assert_eq!(got, want, "{bytes:?} offset {offset} limit {limit} chunk {chunk}");
                    }
                }
            }
        }
    }

    #[test]
    fn streamed_read_past_the_kept_head_counts_exactly() {
        // Over RENDER_KEEP_BYTES of output: head, tail and count come from the stream.
        let text: String = (0..400_000).map(|i| format!("{i:09}\n")).collect();
        for mode in [Truncation::Head, Truncation::HeadTail] {
            let mut r = ReadRender::new("f".into(), 1, None);
            let read = r.feed_from(text.as_bytes()).unwrap();
            assert!(!r.head_complete);
            assert_eq!(r.finish(read, read, READ_OUTPUT_CHARS, mode), read_reference("f", text.as_bytes(), 1, 0, mode));
        }
    }

    #[test]
    fn fnmatch_like_python() {
        let m = |p: &str, n: &str| fnmatch(&compile_fnmatch(p), n);
        assert!(m("*.py", "a.py") && !m("*.py", "a.pyc") && m("*", ""));
        assert!(m("a?c", "abc") && !m("a?c", "ac"));
        assert!(m("[ab]x", "bx") && !m("[!ab]x", "bx") && m("[!ab]x", "cx"));
        assert!(m("[a-c]", "b") && !m("[c-a]", "b"));
        assert!(m("[]]", "]") && m("[!]]", "x") && !m("[!]]", "]"));
        assert!(m("[abc", "[abc") && !m("[abc", "a"));
        assert!(m("*a*b*c*", "xxaxxbxxcxx") && !m("*a*b*c", "abcx"));
        assert!(m("[a-]", "-"));
    }

    #[test]
    fn user_space_walk_resolves_like_openat2() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(ws.join("x/y")).unwrap();
        std::fs::create_dir_all(outside.join("a/b")).unwrap();
        std::fs::write(ws.join("x/f.txt"), "f").unwrap();
        std::fs::write(outside.join("victim"), "v").unwrap();
        let link = |target: &Path, name: &str| std::os::unix::fs::symlink(target, ws.join(name)).unwrap();
        link(&outside.join("a/b"), "x/y/sd");
        link(Path::new("../f.txt"), "x/y/rel");
        link(Path::new("../../../outside/victim"), "x/y/out");
        link(&outside.join("new"), "dang");
        link(Path::new("loop"), "loop");
        link(Path::new("nothing"), "inside_dang");
        let root: OwnedFd = std::fs::File::open(&ws).unwrap().into();
        let cases: [(&str, i32, Option<i32>); 14] = [
            ("x/f.txt", libc::O_RDONLY, None),
            ("x/y/rel", libc::O_RDONLY, None),
            ("x/y/../f.txt", libc::O_RDONLY, None),
            ("x/y/sd/../f", libc::O_RDONLY, Some(libc::EXDEV)),
            ("x/y/sd", libc::O_PATH, Some(libc::EXDEV)),
            ("x/y/out", libc::O_RDONLY, Some(libc::EXDEV)),
            ("dang", libc::O_WRONLY | libc::O_CREAT, Some(libc::EXDEV)),
            ("../ws/x/f.txt", libc::O_RDONLY, Some(libc::EXDEV)),
            ("x/../..", libc::O_PATH, Some(libc::EXDEV)),
            ("loop", libc::O_RDONLY, Some(libc::ELOOP)),
            ("x/f.txt/z", libc::O_RDONLY, Some(libc::ENOTDIR)),
            ("missing/z", libc::O_RDONLY, Some(libc::ENOENT)),
            ("x/y/rel", libc::O_RDONLY | libc::O_NOFOLLOW, Some(libc::ELOOP)),
            ("", libc::O_PATH | libc::O_DIRECTORY, None),
        ];
        for (rel, flags, want) in cases {
            let kernel = beneath::open(root.as_fd(), Path::new(rel), flags, 0o666).err().and_then(|e| e.raw_os_error());
            let walked = beneath::walk(root.as_fd(), Path::new(rel), flags, 0o666).err().and_then(|e| e.raw_os_error());
            assert_eq!(kernel, want, "openat2 {rel}");
            assert_eq!(walked, want, "walk {rel}");
        }
        // O_CREAT through a dangling link inside creates its target, in both.
        let fd = beneath::walk(root.as_fd(), Path::new("inside_dang"), libc::O_WRONLY | libc::O_CREAT, 0o666).unwrap();
        drop(fd);
        assert!(ws.join("nothing").is_file());
        assert!(!outside.join("new").exists());
    }

    #[test]
    fn glob_walk_stops_at_its_budget() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..50 {
            std::fs::create_dir_all(dir.path().join(format!("d{i:02}"))).unwrap();
            std::fs::write(dir.path().join(format!("d{i:02}/f.py")), "").unwrap();
        }
        let root: OwnedFd = std::fs::File::open(dir.path()).unwrap().into();
        let mut walk = GlobWalk::new(&root);
        assert_eq!(walk.run(Path::new("**/*.py")).unwrap().len(), 50);
        assert!(!walk.stopped);
        let mut walk = GlobWalk::new(&root);
        walk.max_entries = 30;
        let found = walk.run(Path::new("**/*.py")).unwrap();
        assert!(walk.stopped && walk.visited <= 30 && found.len() < 30, "{} {}", walk.visited, found.len());
        let mut walk = GlobWalk::new(&root);
        walk.max_time = Duration::ZERO;
        walk.run(Path::new("*/*.py")).unwrap();
        assert!(walk.stopped);
    }

    #[test]
    fn truncation_markers() {
        assert_eq!(truncate("abcdef", 4, Truncation::Head), "abcd\n[truncated 2 chars]");
        assert_eq!(truncate("abcdefgh", 4, Truncation::HeadTail), "ab\n[truncated 4 chars]\ngh");
        assert_eq!(truncate("abc", 4, Truncation::Head), "abc");
        assert_eq!(truncate("ééé", 2, Truncation::Head), "éé\n[truncated 1 chars]");
    }
}
