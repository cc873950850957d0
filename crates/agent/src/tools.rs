//! The five tools the model was trained with — Read, Write, Edit, Glob, Bash — with the
//! Leaf harness's schemas, behaviour and observation texts (shared/docs/leaf-harness.md).
//!
//! Failures come back as text `ErrorType: message`, using the Python exception names and
//! messages the model saw in training (`ValueError: old_string was not found`,
//! `FileNotFoundError: [Errno 2] No such file or directory: '/path'`). Two deliberate
//! additions: Write and Edit refuse paths outside the workspace (`PermissionError`), because
//! these tools run on the host, not in a container; and Bash runs in the
//! [`frognano_sandbox::Sandbox`]. Reads outside the workspace stay allowed, like inside the
//! sandbox, where the whole file system is visible read-only.

use frognano_sandbox::{Command, Sandbox};
use serde_json::{json, Map, Value};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

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
        ToolBox { workdir: sandbox.workspace().to_path_buf(), sandbox, truncation: Truncation::Head, confirm: None }
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
        let result = match name {
            "Read" => self.read(&args),
            "Write" => self.write(&args),
            "Edit" => self.edit(&args),
            "Glob" => self.glob(&args),
            "Bash" => self.bash(&args),
            _ => return format!("Unknown tool: {name}"),
        };
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

    /// Refuses writes that would land outside the workspace (symlinks included).
    fn check_writable(&self, path: &Path) -> Result<(), ToolError> {
        let lexical = resolve_lexically(path);
        // Resolve the deepest existing ancestor so a symlink cannot point us outside.
        let mut existing = lexical.as_path();
        let mut rest = Vec::new();
        while !existing.exists() {
            match (existing.parent(), existing.file_name()) {
                (Some(p), Some(name)) => {
                    rest.push(name.to_owned());
                    existing = p;
                }
                _ => break,
            }
        }
        let mut real = existing.canonicalize().unwrap_or_else(|_| existing.to_path_buf());
        real.extend(rest.iter().rev());
        if real.starts_with(&self.workdir) {
            Ok(())
        } else {
            Err(err("PermissionError", format!("{} is outside the workspace", path.display())))
        }
    }

    fn read_text(path: &Path) -> Result<String, ToolError> {
        match std::fs::read(path) {
            Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
            Err(e) => Err(io_error(e, path)),
        }
    }

    fn read(&self, args: &Map<String, Value>) -> Result<String, ToolError> {
        let path = self.path_arg(args, "file_path")?;
        let text = Self::read_text(&path)?;
        let lines = py_splitlines(&text);
        let offset = optional_int(args.get("offset"), 1)?.max(1) as usize;
        let limit = optional_int(args.get("limit"), 0)?;
        let end = if limit <= 0 { lines.len() } else { lines.len().min(offset - 1 + limit as usize) };
        let selected: Vec<String> =
            lines.iter().enumerate().take(end).skip(offset - 1).map(|(i, line)| format!("{}. {line}", i + 1)).collect();
        Ok(truncate(&format!("{}\n{}", self.display(&path), selected.join("\n")), READ_OUTPUT_CHARS, self.truncation))
    }

    fn write(&self, args: &Map<String, Value>) -> Result<String, ToolError> {
        let path = self.path_arg(args, "file_path")?;
        self.check_writable(&path)?;
        let content = args.get("content").map(py_str).unwrap_or_default();
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_error(e, parent))?;
        }
        std::fs::write(&path, &content).map_err(|e| io_error(e, &path))?;
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
        let text = Self::read_text(&path)?;
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
        self.check_writable(&path)?;
        let updated = if replace_all { text.replace(&old, &new) } else { text.replacen(&old, &new, 1) };
        std::fs::write(&path, updated).map_err(|e| io_error(e, &path))?;
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
        let root = self.resolve(&root_arg);
        let full = if Path::new(&pattern).is_absolute() { PathBuf::from(&pattern) } else { root.join(&pattern) };
        // Python's glob: hidden names only match patterns that spell the dot.
        let options = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: true,
        };
        let paths = glob::glob_with(&full.to_string_lossy(), options)
            .map_err(|e| err("ValueError", format!("invalid glob pattern {pattern:?}: {e}")))?;
        let mut matches: Vec<String> =
            paths.filter_map(Result::ok).filter(|p| p.is_file()).map(|p| self.display(&p)).collect();
        matches.sort();
        matches.dedup();
        if matches.is_empty() {
            return Ok("No files matched.".into());
        }
        let more = matches.len().saturating_sub(GLOB_LIMIT);
        matches.truncate(GLOB_LIMIT);
        let mut out = matches.join("\n");
        if more > 0 {
            out.push_str(&format!("\n... {more} more files"));
        }
        Ok(out)
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
    let kind = match e.raw_os_error() {
        Some(2) => "FileNotFoundError",
        Some(13) | Some(1) => "PermissionError",
        Some(21) => "IsADirectoryError",
        Some(20) => "NotADirectoryError",
        Some(17) => "FileExistsError",
        _ => "OSError",
    };
    let errno = e.raw_os_error().unwrap_or(0);
    let text = e.to_string();
    // std says "No such file or directory (os error 2)"; Python says "[Errno 2] No such ...".
    let strerror = text.split(" (os error").next().unwrap_or(&text);
    err(kind, format!("[Errno {errno}] {strerror}: '{}'", path.display()))
}

/// Python's `str.splitlines()`: splits on every line boundary it knows, `\r\n` as one.
fn py_splitlines(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let is_break =
            matches!(c, '\n' | '\r' | '\x0b' | '\x0c' | '\x1c' | '\x1d' | '\x1e' | '\u{85}' | '\u{2028}' | '\u{2029}');
        if is_break {
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

    #[test]
    fn truncation_markers() {
        assert_eq!(truncate("abcdef", 4, Truncation::Head), "abcd\n[truncated 2 chars]");
        assert_eq!(truncate("abcdefgh", 4, Truncation::HeadTail), "ab\n[truncated 4 chars]\ngh");
        assert_eq!(truncate("abc", 4, Truncation::Head), "abc");
        assert_eq!(truncate("ééé", 2, Truncation::Head), "éé\n[truncated 1 chars]");
    }
}
