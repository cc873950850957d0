//! Golden tests: every tool's observation text, byte for byte, in the Leaf formats.

use frognano_agent::tools::{tool_schemas, ToolBox, Truncation};
use frognano_sandbox::{Sandbox, SandboxSpec};
use serde_json::json;

fn toolbox() -> (tempfile::TempDir, ToolBox) {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::new(SandboxSpec::new(dir.path())).expect("bubblewrap (scripts/ci-setup.sh)");
    (dir, ToolBox::new(sandbox))
}

fn call(tb: &mut ToolBox, name: &str, args: serde_json::Value) -> String {
    tb.execute(name, &args.to_string())
}

#[test]
fn schemas_are_the_five_leaf_tools() {
    let names: Vec<String> =
        tool_schemas().iter().map(|t| t["function"]["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, ["Read", "Write", "Edit", "Glob", "Bash"]);
    let bash = &tool_schemas()[4]["function"]["parameters"];
    assert_eq!(bash["required"], json!(["command"]));
    assert_eq!(bash["properties"]["timeout"]["type"], json!("number"));
    let edit = &tool_schemas()[2]["function"]["parameters"];
    assert_eq!(edit["required"], json!(["file_path", "old_string", "new_string"]));
}

#[test]
fn read_numbers_lines_after_the_relative_path() {
    let (dir, mut tb) = toolbox();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/a.py"), "one\ntwo\r\nthree\nfour\n").unwrap();
    assert_eq!(call(&mut tb, "Read", json!({"file_path": "src/a.py"})), "src/a.py\n1. one\n2. two\n3. three\n4. four");
    assert_eq!(
        call(&mut tb, "Read", json!({"file_path": "src/a.py", "offset": 2, "limit": 2})),
        "src/a.py\n2. two\n3. three"
    );
    let abs = dir.path().canonicalize().unwrap().join("src/a.py");
    assert_eq!(call(&mut tb, "Read", json!({"file_path": abs, "offset": "3"})), "src/a.py\n3. three\n4. four");
}

#[test]
fn read_errors_use_python_exception_texts() {
    let (dir, mut tb) = toolbox();
    let ws = dir.path().canonicalize().unwrap();
    assert_eq!(
        call(&mut tb, "Read", json!({"file_path": "missing.py"})),
        format!("FileNotFoundError: [Errno 2] No such file or directory: '{}/missing.py'", ws.display())
    );
    assert_eq!(call(&mut tb, "Read", json!({})), "ValueError: file_path is required");
    assert_eq!(
        call(&mut tb, "Read", json!({"file_path": "."})),
        format!("IsADirectoryError: [Errno 21] Is a directory: '{}/.'", ws.display())
    );
    std::fs::write(dir.path().join("a"), "x\n").unwrap();
    assert_eq!(
        call(&mut tb, "Read", json!({"file_path": "a", "limit": "many"})),
        "ValueError: invalid literal for int() with base 10: 'many'"
    );
}

#[test]
fn read_output_is_capped_with_a_marker() {
    let (dir, mut tb) = toolbox();
    let text: String = (0..3000).map(|i| format!("line {i:04}\n")).collect();
    std::fs::write(dir.path().join("big.txt"), text).unwrap();
    let out = call(&mut tb, "Read", json!({"file_path": "big.txt"}));
    // "big.txt\n" + 3000 lines of "N. line NNNN" joined by \n.
    let full_len: usize = 8 + (1..=3000).map(|n| n.to_string().len() + 12).sum::<usize>() - 1;
    assert!(out.ends_with(&format!("\n[truncated {} chars]", full_len - 20_000)), "{}", &out[out.len() - 60..]);
    assert_eq!(out.find("\n[truncated"), Some(20_000));

    tb.truncation = Truncation::HeadTail;
    let out = call(&mut tb, "Read", json!({"file_path": "big.txt"}));
    assert!(out.ends_with("3000. line 2999"), "head+tail keeps the end");
    assert!(out.contains(&format!("\n[truncated {} chars]\n", full_len - 20_000)));
}

#[test]
fn write_creates_parents_and_reports_the_size() {
    let (dir, mut tb) = toolbox();
    assert_eq!(
        call(&mut tb, "Write", json!({"file_path": "pkg/new/mod.py", "content": "x = 'é'\n"})),
        "Wrote pkg/new/mod.py (8 bytes)."
    );
    assert_eq!(std::fs::read_to_string(dir.path().join("pkg/new/mod.py")).unwrap(), "x = 'é'\n");
}

#[test]
fn write_and_edit_refuse_paths_outside_the_workspace() {
    let (dir, mut tb) = toolbox();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("evil.txt");
    let out = call(&mut tb, "Write", json!({"file_path": target, "content": "x"}));
    assert_eq!(out, format!("PermissionError: {} is outside the workspace", target.display()));
    assert!(!target.exists());
    let out = call(&mut tb, "Write", json!({"file_path": "../escape.txt", "content": "x"}));
    assert!(out.starts_with("PermissionError: "), "{out}");
    // A symlink inside the workspace pointing outside does not help either.
    std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
    let out = call(&mut tb, "Write", json!({"file_path": "link/evil.txt", "content": "x"}));
    assert!(out.starts_with("PermissionError: "), "{out}");
    assert!(!target.exists());
}

#[test]
fn edit_replaces_exactly_and_reports_errors() {
    let (dir, mut tb) = toolbox();
    std::fs::write(dir.path().join("a.py"), "x = 1\ny = 1\nz = 2\n").unwrap();
    assert_eq!(
        call(&mut tb, "Edit", json!({"file_path": "a.py", "old_string": "z = 2", "new_string": "z = 3"})),
        "Edited a.py (1 replacement)."
    );
    assert_eq!(
        call(&mut tb, "Edit", json!({"file_path": "a.py", "old_string": "= 1", "new_string": "= 0"})),
        "ValueError: old_string matched 2 times; set replace_all=true or use a more specific old_string"
    );
    assert_eq!(
        call(
            &mut tb,
            "Edit",
            json!({"file_path": "a.py", "old_string": "= 1", "new_string": "= 0", "replace_all": true})
        ),
        "Edited a.py (2 replacements)."
    );
    assert_eq!(
        call(&mut tb, "Edit", json!({"file_path": "a.py", "old_string": "nope", "new_string": ""})),
        "ValueError: old_string was not found"
    );
    assert_eq!(
        call(&mut tb, "Edit", json!({"file_path": "a.py", "old_string": "", "new_string": "x"})),
        "ValueError: old_string must be non-empty"
    );
    assert_eq!(std::fs::read_to_string(dir.path().join("a.py")).unwrap(), "x = 0\ny = 0\nz = 3\n");
}

#[test]
fn glob_lists_sorted_relative_files() {
    let (dir, mut tb) = toolbox();
    for f in ["b.py", "a.py", "pkg/c.py", "pkg/deep/d.py", "pkg/e.txt", ".hidden/h.py", "pkg/.x.py"] {
        let p = dir.path().join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "").unwrap();
    }
    assert_eq!(call(&mut tb, "Glob", json!({"pattern": "**/*.py"})), "a.py\nb.py\npkg/c.py\npkg/deep/d.py");
    assert_eq!(call(&mut tb, "Glob", json!({"pattern": "*.py"})), "a.py\nb.py");
    assert_eq!(call(&mut tb, "Glob", json!({"pattern": "*.py", "path": "pkg"})), "pkg/c.py");
    assert_eq!(call(&mut tb, "Glob", json!({"pattern": "*.rs"})), "No files matched.");
    assert_eq!(call(&mut tb, "Glob", json!({})), "ValueError: pattern is required");
}

#[test]
fn glob_caps_at_one_thousand() {
    let (dir, mut tb) = toolbox();
    for i in 0..1005 {
        std::fs::write(dir.path().join(format!("f{i:04}.txt")), "").unwrap();
    }
    let out = call(&mut tb, "Glob", json!({"pattern": "*.txt"}));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1001);
    assert_eq!(lines[999], "f0999.txt");
    assert_eq!(lines[1000], "... 5 more files");
}

#[test]
fn bash_reports_exit_code_and_both_streams() {
    let (_dir, mut tb) = toolbox();
    assert_eq!(
        call(&mut tb, "Bash", json!({"command": "echo hi; echo oops >&2; exit 4", "description": "test"})),
        "Exit code: 4\nSTDOUT:\nhi\n\nSTDERR:\noops\n"
    );
    assert_eq!(call(&mut tb, "Bash", json!({})), "ValueError: command is required");
    // Absurd timeouts are clamped, never a crash.
    for timeout in [json!("inf"), json!(1e300)] {
        assert_eq!(
            call(&mut tb, "Bash", json!({"command": "echo ok", "timeout": timeout})),
            "Exit code: 0\nSTDOUT:\nok\n\nSTDERR:\n"
        );
    }
    for timeout in [json!("nan"), json!(-5)] {
        let out = call(&mut tb, "Bash", json!({"command": "echo ok", "timeout": timeout}));
        assert!(out.starts_with("Exit code: 0") || out.starts_with("Timed out after 0.1s"), "{out}");
    }
    assert_eq!(
        call(&mut tb, "Bash", json!({"command": "echo ok", "timeout": "soon"})),
        "ValueError: could not convert string to float: 'soon'"
    );
    assert_eq!(call(&mut tb, "Bash", json!({"command": "kill -9 $$"})), "Exit code: 137\nSTDOUT:\n\nSTDERR:\n");
}

#[test]
fn bash_times_out_with_what_was_printed() {
    let (_dir, mut tb) = toolbox();
    assert_eq!(
        call(&mut tb, "Bash", json!({"command": "echo started; sleep 30", "timeout": 1})),
        "Timed out after 1.0s\nSTDOUT:\nstarted\n\nSTDERR:\n"
    );
    // Over 1000 means milliseconds.
    assert_eq!(
        call(&mut tb, "Bash", json!({"command": "sleep 30", "timeout": 1500})),
        "Timed out after 1.5s\nSTDOUT:\n\nSTDERR:\n"
    );
}

#[test]
fn bash_output_is_capped_at_30000_chars() {
    let (_dir, mut tb) = toolbox();
    let out = call(&mut tb, "Bash", json!({"command": "seq 1 20000"}));
    assert_eq!(out.find("\n[truncated"), Some(30_000));
    // "Exit code: 0\nSTDOUT:\n" + seq output + "\nSTDERR:\n"
    let seq_len: usize = (1..=20000).map(|n: u32| n.to_string().len() + 1).sum();
    let total = 21 + seq_len + 9;
    assert!(out.ends_with(&format!("[truncated {} chars]", total - 30_000)));
}

#[test]
fn bash_runs_in_the_sandbox_and_the_workspace() {
    let (dir, mut tb) = toolbox();
    let out = call(&mut tb, "Bash", json!({"command": "pwd; touch made-here; touch /usr/evil"}));
    let ws = dir.path().canonicalize().unwrap();
    assert!(out.starts_with(&format!("Exit code: 1\nSTDOUT:\n{}\n", ws.display())), "{out}");
    assert!(out.contains("Read-only file system"));
    assert!(dir.path().join("made-here").exists());
}

#[test]
fn unknown_tools_and_non_object_arguments() {
    let (_dir, mut tb) = toolbox();
    assert_eq!(tb.execute("Delete", "{}"), "Unknown tool: Delete");
    assert_eq!(tb.execute("Read", "[1, 2]"), "ValueError: file_path is required");
    assert_eq!(tb.execute("Glob", "not json"), "ValueError: pattern is required");
}

#[test]
fn confirm_can_decline_a_command() {
    let (dir, mut tb) = toolbox();
    tb.confirm = Some(Box::new(|cmd: &str| !cmd.contains("rm")));
    assert_eq!(
        call(&mut tb, "Bash", json!({"command": "rm -rf ."})),
        "PermissionError: the user declined to run this command"
    );
    std::fs::write(dir.path().join("keep"), "").unwrap();
    assert!(call(&mut tb, "Bash", json!({"command": "ls"})).contains("keep"));
}
