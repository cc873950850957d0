//! The host-side tools (Read, Write, Edit, Glob) keep to the workspace and never hang
//! (issue 13, items 2 and 5). Each attack below worked before the tools resolved paths
//! beneath the workspace root: a symlink or `..` led Write and Edit out, Read showed files
//! the sandbox hides, Glob listed them and looped through symlink cycles, and a FIFO or an
//! endless file blocked the agent for good.
//!
//! Workspaces live under the target folder, not /tmp, so that the sandbox's private /tmp
//! hides the host's /tmp from them (the "secret" planted there).

use frognano_agent::tools::ToolBox;
use frognano_sandbox::{Isolation, Sandbox, SandboxSpec};
use serde_json::json;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

struct Ws {
    _dir: tempfile::TempDir,
    path: PathBuf,
    tb: Option<ToolBox>,
}

fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("tool-escapes-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn workspace() -> Ws {
    workspace_showing(None)
}

/// A workspace whose sandbox also shows `outside` read-only where it would hide it: scratch
/// folders live in the build folder, which is under the private `/tmp` when the checkout is.
fn workspace_showing(outside: Option<&Path>) -> Ws {
    let dir = scratch();
    let path = dir.path().canonicalize().unwrap();
    let mut spec = SandboxSpec::new(&path);
    if let Some(o) = outside {
        if Sandbox::new(spec.clone()).expect("bubblewrap (scripts/ci-setup.sh)").hides(o) {
            spec = spec.readable_path(o.canonicalize().unwrap());
        }
    }
    let sandbox = Sandbox::new(spec).expect("bubblewrap (scripts/ci-setup.sh)");
    Ws { _dir: dir, path, tb: Some(ToolBox::new(sandbox)) }
}

impl Ws {
    /// Runs one tool call on a thread and fails the test if it does not return within 10 s
    /// (a regression must fail, not hang the suite).
    fn call(&mut self, name: &'static str, args: serde_json::Value) -> String {
        let mut tb = self.tb.take().expect("toolbox lost by an earlier timeout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let out = tb.execute(name, &args.to_string());
            let _ = tx.send((tb, out));
        });
        let (tb, out) = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| panic!("{name} hung"));
        self.tb = Some(tb);
        out
    }

    fn bash(&mut self, command: &str) {
        let out = self.call("Bash", json!({ "command": command }));
        assert!(out.starts_with("Exit code: 0\n"), "{command}: {out}");
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }
}

fn refused(out: &str) -> bool {
    out.starts_with("PermissionError: ")
}

// ---- Write and Edit do not follow symlinks out of the workspace -------------------------

#[test]
fn write_through_a_dangling_symlink_does_not_create_the_host_file() {
    let mut ws = workspace();
    let outside = scratch();
    let target = outside.path().join("new.txt");
    ws.bash(&format!("ln -s {} dang", target.display()));
    let out = ws.call("Write", json!({"file_path": "dang", "content": "pwned"}));
    assert_eq!(out, format!("PermissionError: {} is outside the workspace", ws.p("dang").display()));
    assert!(!target.exists());
    // A relative dangling link that leads out is no better.
    let rel_target = pathdiff(&target, &ws.path);
    symlink(&rel_target, ws.p("dang2")).unwrap();
    assert!(refused(&ws.call("Write", json!({"file_path": "dang2", "content": "pwned"}))));
    assert!(!target.exists());
}

#[test]
fn write_through_dotdot_after_a_symlink_lands_nowhere_outside() {
    let mut ws = workspace();
    let outside = scratch();
    std::fs::create_dir_all(outside.path().join("a/b")).unwrap();
    std::fs::create_dir_all(ws.p("x/y")).unwrap();
    symlink(outside.path().join("a/b"), ws.p("x/y/sd")).unwrap();
    // The kernel resolves `sd/..` as the parent of the link's target: /outside/a.
    let out = ws.call("Write", json!({"file_path": "x/y/sd/../f", "content": "pwned"}));
    assert!(refused(&out), "{out}");
    assert!(!outside.path().join("a/f").exists());
    // Parent folders are not created through the link either.
    let out = ws.call("Write", json!({"file_path": "x/y/sd/new/dir/f", "content": "pwned"}));
    assert!(refused(&out), "{out}");
    assert!(!outside.path().join("a/b/new").exists());
    // Nor through `..` above the root, spelled relative or absolute.
    assert!(refused(&ws.call("Write", json!({"file_path": "x/../../f", "content": "pwned"}))));
    let abs = format!("{}/x/../../f", ws.path.display());
    assert!(refused(&ws.call("Write", json!({"file_path": abs, "content": "pwned"}))));
}

#[test]
fn edit_through_a_symlink_does_not_touch_the_host_file() {
    let mut ws = workspace();
    let outside = scratch();
    let victim = outside.path().join("victim.txt");
    std::fs::write(&victim, "secret = 1\n").unwrap();
    std::fs::create_dir_all(outside.path().join("a/b")).unwrap();
    std::fs::create_dir_all(ws.p("x/y")).unwrap();
    symlink(outside.path().join("a/b"), ws.p("x/y/sd")).unwrap();
    symlink(&victim, ws.p("v")).unwrap();
    for file_path in ["x/y/sd/../../victim.txt", "v"] {
        let out =
            ws.call("Edit", json!({"file_path": file_path, "old_string": "secret = 1", "new_string": "secret = 2"}));
        assert!(refused(&out), "{file_path}: {out}");
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "secret = 1\n");
}

#[test]
fn write_over_a_symlink_to_an_outside_file_neither_follows_nor_replaces_it() {
    let mut ws = workspace();
    let outside = scratch();
    let target = outside.path().join("target.txt");
    std::fs::write(&target, "original").unwrap();
    symlink(&target, ws.p("t")).unwrap();
    assert!(refused(&ws.call("Write", json!({"file_path": "t", "content": "pwned"}))));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "original");
    assert!(ws.p("t").symlink_metadata().unwrap().file_type().is_symlink());
}

#[test]
fn the_read_before_edit_guard_tells_nothing_of_files_outside_the_workspace() {
    // Whether a host file exists must not show in the guard's refusal: an outside path (and
    // a symlink leading out) gets the tools' own "outside the workspace" answer, whether the
    // file is there or not.
    let mut ws = workspace();
    ws.tb.as_mut().unwrap().require_read_before_edit(true);
    let secret = host_secret();
    symlink(secret.path(), ws.p("v")).unwrap();
    let missing = format!("{}-missing", secret.path().display());
    for file_path in [secret.path().to_str().unwrap(), "v", missing.as_str()] {
        for (tool, args) in [
            ("Edit", json!({"file_path": file_path, "old_string": "TOP", "new_string": "BOTTOM"})),
            ("Write", json!({"file_path": file_path, "content": "pwned"})),
        ] {
            let out = ws.call(tool, args);
            assert!(refused(&out) && out.contains("is outside the workspace"), "{tool} {file_path}: {out}");
        }
    }
    assert_eq!(std::fs::read_to_string(secret.path()).unwrap(), "TOP SECRET\n");
    // A file inside the workspace is still guarded.
    std::fs::write(ws.p("inside.txt"), "x\n").unwrap();
    let out = ws.call("Edit", json!({"file_path": "inside.txt", "old_string": "x", "new_string": "y"}));
    assert!(out.contains("inside.txt has not been read in this session"), "{out}");
}

// ---- Read and Glob see what the sandbox sees ------------------------------------------

/// A file in the host's /tmp, which sandboxed commands do not see (private /tmp).
fn host_secret() -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().prefix("frognano-secret-").tempfile_in("/tmp").unwrap();
    std::io::Write::write_all(&mut f, b"TOP SECRET\n").unwrap();
    f
}

#[test]
fn read_does_not_show_a_file_the_sandbox_hides() {
    let mut ws = workspace();
    let secret = host_secret();
    let path = secret.path().to_path_buf();
    // What a sandboxed command sees ...
    let bash = ws.call("Bash", json!({"command": format!("cat {}", path.display())}));
    assert!(!bash.contains("TOP SECRET"), "{bash}");
    // ... is what Read sees, by absolute path and through a link in the workspace.
    let out = ws.call("Read", json!({"file_path": path}));
    assert_eq!(out, format!("FileNotFoundError: [Errno 2] No such file or directory: '{}'", path.display()));
    symlink(&path, ws.p("peek")).unwrap();
    let out = ws.call("Read", json!({"file_path": "peek"}));
    assert!(!out.contains("TOP SECRET"), "{out}");
    assert!(out.starts_with("FileNotFoundError: [Errno 2] "), "{out}");
}

#[test]
fn read_does_not_show_password_hashes() {
    let mut ws = workspace();
    // Only meaningful where the host file is readable to us (as root in CI).
    let Ok(host) = std::fs::read_to_string("/etc/shadow") else { return };
    let Some(first) = host.lines().next().filter(|l| !l.is_empty()) else { return };
    let bash = ws.call("Bash", json!({"command": "cat /etc/shadow"}));
    assert!(!bash.contains(first), "the sandbox masks /etc/shadow: {bash}");
    let out = ws.call("Read", json!({"file_path": "/etc/shadow"}));
    assert!(!out.contains(first), "{out}");
    assert!(out.starts_with("OSError: ") || out.starts_with("PermissionError: "), "{out}");
}

#[test]
fn read_outside_the_workspace_shows_what_the_sandbox_shows() {
    let outside = scratch();
    let mut ws = workspace_showing(Some(outside.path()));
    let file = outside.path().join("lib.py");
    std::fs::write(&file, "def f():\n    return 1\n").unwrap();
    let out = ws.call("Read", json!({"file_path": file, "offset": 2}));
    assert_eq!(out, format!("{}\n2.     return 1", file.display()));
    // An absolute symlink inside the workspace is read through the sandbox too.
    symlink(&file, ws.p("lib_link.py")).unwrap();
    assert_eq!(ws.call("Read", json!({"file_path": "lib_link.py"})), "lib_link.py\n1. def f():\n2.     return 1");
    // Errors keep Python's words.
    let missing = outside.path().join("missing.py");
    assert_eq!(
        ws.call("Read", json!({"file_path": missing})),
        format!("FileNotFoundError: [Errno 2] No such file or directory: '{}'", missing.display())
    );
    assert_eq!(
        ws.call("Read", json!({"file_path": outside.path()})),
        format!("IsADirectoryError: [Errno 21] Is a directory: '{}'", outside.path().display())
    );
}

#[test]
fn read_without_the_sandbox_shows_the_host_file_as_before() {
    // `--no-sandbox`: commands see the host, and so does Read outside the workspace.
    let dir = scratch();
    let spec = SandboxSpec::new(dir.path()).isolation(Isolation::Unconfined);
    let mut tb = ToolBox::new(Sandbox::new(spec).unwrap());
    let secret = host_secret();
    let out = tb.execute("Read", &json!({"file_path": secret.path()}).to_string());
    assert_eq!(out, format!("{}\n1. TOP SECRET", secret.path().display()));
    // Writes outside stay refused.
    let out = tb.execute("Write", &json!({"file_path": secret.path(), "content": "x"}).to_string());
    assert!(refused(&out), "{out}");
    assert_eq!(std::fs::read_to_string(secret.path()).unwrap(), "TOP SECRET\n");
}

#[test]
fn glob_does_not_list_hidden_or_outside_content() {
    let mut ws = workspace();
    let secret = host_secret();
    let name = secret.path().file_name().unwrap().to_string_lossy().into_owned();
    std::fs::write(ws.p("a.py"), "").unwrap();
    symlink("/tmp", ws.p("t")).unwrap();
    for args in [
        json!({"pattern": "*", "path": "/tmp"}),
        json!({"pattern": "/tmp/frognano-secret-*"}),
        json!({"pattern": "t/frognano-secret-*"}),
        json!({"pattern": "../*"}),
        json!({"pattern": "*", "path": ".."}),
    ] {
        let out = ws.call("Glob", args.clone());
        assert!(!out.contains(&name), "{args}: {out}");
        assert!(refused(&out), "{args}: {out}");
    }
    assert_eq!(
        ws.call("Glob", json!({"pattern": "*", "path": "/tmp"})),
        "PermissionError: /tmp is outside the workspace; Glob searches only the workspace (use Bash, e.g. find, \
         elsewhere)"
    );
    assert_eq!(
        ws.call("Glob", json!({"pattern": "t/frognano-secret-*"})),
        format!(
            "PermissionError: {}/t/frognano-secret-* is outside the workspace; Glob searches only the workspace \
             (use Bash, e.g. find, elsewhere)",
            ws.path.display()
        )
    );
    // Inside, `*` does not descend into the link's target, and `**` never follows links.
    let out = ws.call("Glob", json!({"pattern": "*/*"}));
    assert!(!out.contains(&name), "{out}");
    assert_eq!(ws.call("Glob", json!({"pattern": "**/frognano-secret-*"})), "No files matched.");
}

// ---- Nothing hangs -----------------------------------------------------------------------

#[test]
fn fifos_are_refused_at_once() {
    let mut ws = workspace();
    ws.bash("mkfifo f");
    let expected = format!("OSError: [Errno 22] Not a regular file: '{}'", ws.p("f").display());
    assert_eq!(ws.call("Read", json!({"file_path": "f"})), expected);
    assert_eq!(ws.call("Write", json!({"file_path": "f", "content": "x"})), expected);
    assert_eq!(ws.call("Edit", json!({"file_path": "f", "old_string": "a", "new_string": "b"})), expected);
    // A link to it, too.
    symlink("f", ws.p("g")).unwrap();
    assert_eq!(
        ws.call("Read", json!({"file_path": "g"})),
        format!("OSError: [Errno 22] Not a regular file: '{}'", ws.p("g").display())
    );
    assert_eq!(ws.call("Glob", json!({"pattern": "*"})), "No files matched.");
}

#[test]
fn glob_through_symlink_cycles_returns_promptly() {
    let mut ws = workspace();
    ws.bash("ln -s . l1; ln -s . l2; mkdir -p pkg/sub; ln -s .. pkg/sub/up; touch pkg/a.py pkg/sub/b.py");
    let started = Instant::now();
    assert_eq!(ws.call("Glob", json!({"pattern": "**/*.py"})), "pkg/a.py\npkg/sub/b.py");
    // Wildcards may pass through links inside the workspace; the depth is the pattern's.
    let out = ws.call("Glob", json!({"pattern": "*/*/*/*/*/*.py"}));
    assert!(out.contains("l1/l1/l2/pkg/sub/b.py"), "{out}");
    assert!(refused(&ws.call("Glob", json!({"pattern": "/**/*.x"}))));
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
fn read_of_an_endless_file_stops_at_once() {
    let mut ws = workspace();
    ws.bash("ln -s /dev/zero z");
    assert_eq!(
        ws.call("Read", json!({"file_path": "z", "limit": 2})),
        format!("OSError: [Errno 22] Not a regular file: '{}'", ws.p("z").display())
    );
    // A huge regular (sparse) file: limit=2 stops after two lines ...
    let big = std::fs::File::create(ws.p("big.txt")).unwrap();
    std::io::Write::write_all(&mut &big, b"one\ntwo\nthree\n").unwrap();
    big.set_len(1 << 30).unwrap();
    let started = Instant::now();
    assert_eq!(ws.call("Read", json!({"file_path": "big.txt", "limit": 2})), "big.txt\n1. one\n2. two");
    // ... and a read of everything stops after READ_SCAN_BYTES, saying so honestly.
    let out = ws.call("Read", json!({"file_path": "big.txt", "offset": 3}));
    assert!(out.starts_with("big.txt\n3. three\n4. \0\0\0"), "{:?}", &out[..40]);
    let scanned = frognano_agent::tools::READ_SCAN_BYTES;
    assert!(
        out.ends_with(&format!("; read stopped after {scanned} of {} bytes]", 1u64 << 30)),
        "{:?}",
        &out[out.len() - 120..]
    );
    assert!(out.contains("\n[truncated more than "), "{:?}", &out[out.len() - 120..]);
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
}

// ---- What keeps working ----------------------------------------------------------------

#[test]
fn relative_symlinks_inside_the_workspace_still_work() {
    let mut ws = workspace();
    std::fs::create_dir_all(ws.p("src/real")).unwrap();
    std::fs::write(ws.p("src/real/mod.py"), "x = 1\n").unwrap();
    symlink("real", ws.p("src/alias")).unwrap();
    symlink("src/real/mod.py", ws.p("m.py")).unwrap();
    assert_eq!(ws.call("Read", json!({"file_path": "m.py"})), "m.py\n1. x = 1");
    assert_eq!(ws.call("Read", json!({"file_path": "src/alias/mod.py"})), "src/alias/mod.py\n1. x = 1");
    assert_eq!(
        ws.call("Edit", json!({"file_path": "m.py", "old_string": "x = 1", "new_string": "x = 2"})),
        "Edited m.py (1 replacement)."
    );
    assert_eq!(std::fs::read_to_string(ws.p("src/real/mod.py")).unwrap(), "x = 2\n");
    assert!(ws.p("m.py").symlink_metadata().unwrap().file_type().is_symlink(), "the link stays a link");
    assert_eq!(
        ws.call("Write", json!({"file_path": "src/alias/new/deep.py", "content": "y"})),
        "Wrote src/alias/new/deep.py (1 bytes)."
    );
    assert_eq!(std::fs::read_to_string(ws.p("src/real/new/deep.py")).unwrap(), "y");
    // `..` after a link inside is the parent of the link's target, as in the shell.
    assert_eq!(
        ws.call("Write", json!({"file_path": "src/alias/../top.py", "content": "z"})),
        "Wrote src/top.py (1 bytes)."
    );
    assert!(ws.p("src/top.py").exists());
    // A dangling relative link inside creates its target.
    symlink("made.txt", ws.p("later")).unwrap();
    assert_eq!(ws.call("Write", json!({"file_path": "later", "content": "ok"})), "Wrote later (2 bytes).");
    assert_eq!(std::fs::read_to_string(ws.p("made.txt")).unwrap(), "ok");
    // Glob lists links to files, and `*` walks through an inside link to a folder.
    assert_eq!(ws.call("Glob", json!({"pattern": "*.py"})), "m.py");
    assert_eq!(ws.call("Glob", json!({"pattern": "src/*/mod.py"})), "src/alias/mod.py\nsrc/real/mod.py");
}

#[test]
fn absolute_paths_inside_the_workspace_work_and_absolute_links_are_not_followed_for_writes() {
    let mut ws = workspace();
    let abs = ws.p("pkg/a/b/c.py");
    assert_eq!(ws.call("Write", json!({"file_path": abs, "content": "v = 1\n"})), "Wrote pkg/a/b/c.py (6 bytes).");
    assert_eq!(ws.call("Read", json!({"file_path": abs})), "pkg/a/b/c.py\n1. v = 1");
    assert_eq!(
        ws.call("Edit", json!({"file_path": abs, "old_string": "1", "new_string": "2"})),
        "Edited pkg/a/b/c.py (1 replacement)."
    );
    assert_eq!(ws.call("Glob", json!({"pattern": format!("{}/**/*.py", ws.path.display())})), "pkg/a/b/c.py");
    // An absolute link, even one pointing inside: Read follows it (through the sandbox),
    // Write and Edit refuse it.
    symlink(&abs, ws.p("abs_link.py")).unwrap();
    assert_eq!(ws.call("Read", json!({"file_path": "abs_link.py"})), "abs_link.py\n1. v = 2");
    assert!(refused(&ws.call("Write", json!({"file_path": "abs_link.py", "content": "x"}))));
    assert_eq!(std::fs::read_to_string(&abs).unwrap(), "v = 2\n");
}

#[test]
fn glob_keeps_python_semantics() {
    let mut ws = workspace();
    for f in ["a.py", "b1.py", "b2.py", "c.txt", ".h.py", ".hid/x.py", "d/.e/y.py", "d/z.py", "d/w/v.py"] {
        let p = ws.p(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "").unwrap();
    }
    assert_eq!(ws.call("Glob", json!({"pattern": "b[0-9].py"})), "b1.py\nb2.py");
    assert_eq!(ws.call("Glob", json!({"pattern": "b[!1].py"})), "b2.py");
    assert_eq!(ws.call("Glob", json!({"pattern": "?.py"})), "a.py");
    assert_eq!(ws.call("Glob", json!({"pattern": ".*.py"})), ".h.py");
    assert_eq!(ws.call("Glob", json!({"pattern": ".hid/*.py"})), ".hid/x.py");
    assert_eq!(ws.call("Glob", json!({"pattern": "**/*.py"})), "a.py\nb1.py\nb2.py\nd/w/v.py\nd/z.py");
    assert_eq!(ws.call("Glob", json!({"pattern": "d/**"})), "d/w/v.py\nd/z.py");
    assert_eq!(ws.call("Glob", json!({"pattern": "**/.e/*.py"})), "d/.e/y.py");
    assert_eq!(ws.call("Glob", json!({"pattern": "**/v.py", "path": "d"})), "d/w/v.py");
    assert_eq!(ws.call("Glob", json!({"pattern": "c.txt"})), "c.txt");
    assert_eq!(ws.call("Glob", json!({"pattern": "d"})), "No files matched.");
    assert_eq!(ws.call("Glob", json!({"pattern": "nope/*.py"})), "No files matched.");
}

#[test]
fn write_errors_keep_python_words() {
    let mut ws = workspace();
    std::fs::create_dir(ws.p("pkg")).unwrap();
    std::fs::write(ws.p("file"), "").unwrap();
    assert_eq!(
        ws.call("Write", json!({"file_path": "pkg", "content": "x"})),
        format!("IsADirectoryError: [Errno 21] Is a directory: '{}'", ws.p("pkg").display())
    );
    assert_eq!(
        ws.call("Write", json!({"file_path": "file/sub/x.py", "content": "x"})),
        format!("NotADirectoryError: [Errno 20] Not a directory: '{}'", ws.p("file/sub").display())
    );
    assert_eq!(
        ws.call("Edit", json!({"file_path": "nope.py", "old_string": "a", "new_string": "b"})),
        format!("FileNotFoundError: [Errno 2] No such file or directory: '{}'", ws.p("nope.py").display())
    );
}

/// `to` as a relative path from folder `from` (both absolute, canonical).
fn pathdiff(to: &Path, from: &Path) -> PathBuf {
    let to: Vec<_> = to.components().collect();
    let from: Vec<_> = from.components().collect();
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for c in &to[common..] {
        out.push(c);
    }
    out
}
