//! Eval scripts: swebench's rewriting of a dataset `eval_script`, and the script FrogNano's
//! local executor writes for instances that give a test command instead.

use crate::grading::{END_TEST_OUTPUT, START_TEST_OUTPUT, TEST_EXIT_CODE, TEST_EXIT_CODE_VAR};
use crate::pytext::py_strip;

/// `parse_eval_script`: the script's lines without the shebang and `set -uxo pipefail`.
pub fn parse_eval_script(script: &str) -> Vec<String> {
    py_strip(script)
        .split('\n')
        .filter(|l| *l != "#!/bin/bash" && *l != "set -uxo pipefail")
        .map(str::to_string)
        .collect()
}

/// `record_test_exit_code`: captures `$?` before the first end-marker line and echoes it
/// after; a script without the marker is returned unchanged.
pub fn record_test_exit_code(lines: Vec<String>) -> Vec<String> {
    let Some(i) = lines.iter().position(|l| l.contains(END_TEST_OUTPUT)) else {
        return lines;
    };
    let mut out = Vec::with_capacity(lines.len() + 2);
    out.extend_from_slice(&lines[..i]);
    out.push(format!("{TEST_EXIT_CODE_VAR}=$?"));
    out.push(lines[i].clone());
    out.push(format!("echo \"{TEST_EXIT_CODE}: ${TEST_EXIT_CODE_VAR}\""));
    out.extend_from_slice(&lines[i + 1..]);
    out
}

/// `TestSpec.eval_script`: the full rewritten script text.
pub fn rewrite_eval_script(script: &str) -> String {
    let lines = record_test_exit_code(parse_eval_script(script));
    let mut text = String::from("#!/bin/bash\nset -uxo pipefail");
    for l in lines {
        text.push('\n');
        text.push_str(&l);
    }
    text.push('\n');
    text
}

/// File extensions swebench does not pass to the test runner (`NON_TEST_EXTS`; `csv` has no dot).
pub const NON_TEST_EXTS: &[&str] =
    &[".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml"];

/// The `b/` paths of `diff --git a/X b/Y` lines.
pub fn diff_paths(patch: &str) -> Vec<String> {
    patch
        .split('\n')
        .filter_map(|l| l.strip_prefix("diff --git a/"))
        .filter_map(|rest| rest.split_once(" b/").map(|(_, b)| b.to_string()))
        .collect()
}

/// Test directives: the test patch's paths minus non-test files.
pub fn test_directives(test_patch: &str) -> Vec<String> {
    diff_paths(test_patch).into_iter().filter(|p| !NON_TEST_EXTS.iter().any(|e| p.ends_with(e))).collect()
}

/// Pre-image paths of files the test patch modifies (not ones it creates): these are reset
/// to the base commit before and after the tests.
pub fn test_files_to_reset(test_patch: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    let mut created = false;
    let flush = |cur: &mut Option<String>, created: bool, out: &mut Vec<String>| {
        if let Some(p) = cur.take() {
            if !created {
                out.push(p);
            }
        }
    };
    for line in patch_lines(test_patch) {
        if let Some(rest) = line.strip_prefix("diff --git a/") {
            flush(&mut current, created, &mut out);
            current = rest.split_once(" b/").map(|(a, _)| a.to_string());
            created = false;
        } else if line.starts_with("new file mode") || line == "--- /dev/null" {
            created = true;
        }
    }
    flush(&mut current, created, &mut out);
    out
}

fn patch_lines(p: &str) -> impl Iterator<Item = &str> {
    p.split('\n')
}

/// Single-quotes a string for bash.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The eval script FrogNano's local executor runs for an instance with a `test_cmd`: the
/// v4 Python shape (reset test files, apply the test patch from a here-doc, markers echoed
/// by `set -x`, the test command, reset again), already rewritten to record the exit code.
pub fn local_eval_script(
    workdir: &str,
    base_commit: &str,
    test_patch: &str,
    test_cmd: &str,
    setup_commands: &[String],
) -> String {
    let reset = test_files_to_reset(test_patch);
    let checkout = if reset.is_empty() {
        None
    } else {
        Some(format!(
            "git checkout {base_commit} {}",
            reset.iter().map(|p| shell_quote(p)).collect::<Vec<_>>().join(" ")
        ))
    };
    let mut lines = vec![format!("cd {}", shell_quote(workdir))];
    lines.extend(setup_commands.iter().cloned());
    lines.push(format!("git -c core.fileMode=false diff {base_commit}"));
    if let Some(c) = &checkout {
        lines.push(c.clone());
    }
    if !test_patch.is_empty() {
        let mut body = test_patch.to_string();
        if !body.ends_with('\n') {
            body.push('\n');
        }
        lines.push(format!("git apply -v - <<'EOF_114329324912'\n{body}EOF_114329324912"));
    }
    lines.push(format!(": '{START_TEST_OUTPUT}'"));
    let directives = test_directives(test_patch);
    lines.push(test_cmd.replace("{tests}", &directives.join(" ")));
    lines.push(format!(": '{END_TEST_OUTPUT}'"));
    if let Some(c) = checkout {
        lines.push(c);
    }
    let mut script = String::from("#!/bin/bash\nset -uxo pipefail\n");
    script.push_str(&lines.join("\n"));
    rewrite_eval_script(&script)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_code_lines_wrap_the_end_marker() {
        let s = rewrite_eval_script("#!/bin/bash\nset -uxo pipefail\nrun\n: '>>>>> End Test Output'\nreset\n");
        assert_eq!(
            s,
            "#!/bin/bash\nset -uxo pipefail\nrun\nSWEBENCH_TEST_EXIT_CODE=$?\n: '>>>>> End Test Output'\necho \">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE\"\nreset\n"
        );
    }

    #[test]
    fn created_test_files_are_not_reset_and_data_files_are_not_directives() {
        let p = "diff --git a/tests/test_a.py b/tests/test_a.py\nindex 1..2\n--- a/tests/test_a.py\n+++ b/tests/test_a.py\n\
diff --git a/tests/test_new.py b/tests/test_new.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/test_new.py\n\
diff --git a/tests/data.json b/tests/data.json\n--- a/tests/data.json\n+++ b/tests/data.json\n";
        assert_eq!(test_files_to_reset(p), vec!["tests/test_a.py", "tests/data.json"]);
        assert_eq!(test_directives(p), vec!["tests/test_a.py", "tests/test_new.py"]);
    }
}
