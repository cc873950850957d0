//! `frognano eval` entry points as a user calls them, and bad-input messages.

use std::path::Path;
use std::process::{Command, Output};

/// Runs `frognano eval ARGS…`.
fn eval(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_frognano")).arg("eval").args(args).output().unwrap()
}

/// The command succeeded; its stdout.
fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// The command failed; its stderr.
fn err(o: Output) -> String {
    assert!(!o.status.success(), "expected a failure: {}", String::from_utf8_lossy(&o.stdout));
    String::from_utf8(o.stderr).unwrap()
}

fn parity_log(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../swe/tests/parity/logs").join(name).to_string_lossy().into_owned()
}

#[test]
fn parse_log_and_grade_log_run_on_real_logs() {
    let map: serde_json::Value =
        serde_json::from_str(&ok(eval(&["parse-log", "--parser", "pytest", &parity_log("pytest_ra.log")]))).unwrap();
    assert!(map.as_object().is_some_and(|m| !m.is_empty()), "{map}");
    assert!(
        err(eval(&["parse-log", "--parser", "nonsense", &parity_log("pytest_ra.log")])).contains("unknown log parser")
    );
    ok(eval(&["parse-log", "--parser", "jest", &parity_log("pytest_ra.log")]));
    assert!(ok(eval(&["parse-log", "--list"])).lines().any(|l| l == "parse_log_pytest"));
    // Spec-dependent parsers fail without their context, as swebench's do without a spec.
    assert!(err(eval(&["parse-log", "--parser", "next", &parity_log("pytest_ra.log")])).contains("version"));
    ok(eval(&["parse-log", "--parser", "next", "--version", "1.0", &parity_log("pytest_ra.log")]));

    let dir = tempfile::tempdir().unwrap();
    let inst = dir.path().join("i.json");
    std::fs::write(&inst, r#"{"instance_id":"a__b-1","repo":"a/b","base_commit":"x","log_parser":"parse_log_django","FAIL_TO_PASS":[],"PASS_TO_PASS":[]}"#).unwrap();
    let e = err(eval(&["grade-log", "--instance", inst.to_str().unwrap(), "--log", &parity_log("lone_fail_word.log")]));
    assert!(e.contains("grader error"), "{e}");
}

#[test]
fn malformed_instance_file_names_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("set.jsonl");
    std::fs::write(
        &p,
        "{\"instance_id\":\"a__b-1\",\"repo\":\"a/b\",\"base_commit\":\"x\",\"FAIL_TO_PASS\":[],\"PASS_TO_PASS\":[]}\n{\"instance_id\":\"a__b-2\",\"repo\":\"a/b\",\"base_commit\":\"x\",\"FAIL_TO_PASS\":[1],\"PASS_TO_PASS\":[]}\n",
    )
    .unwrap();
    let msg = err(eval(&["grade", "--instances", p.to_str().unwrap(), "--predictions", "gold"]));
    assert!(msg.contains("set.jsonl:2: field `FAIL_TO_PASS`: item 0 is a number"), "{msg}");
    assert!(msg.starts_with("error: ") && msg.lines().count() == 1, "{msg}");
}

#[test]
fn flag_errors_name_the_flag() {
    let msg = err(eval(&["run", "--instances", "x.jsonl", "--solver-cmd", "true", "--timeout", "0"]));
    assert_eq!(msg.trim(), "error: --timeout must be at least 1 second, got 0");
    let msg = err(eval(&["run", "--instances", "x.jsonl"]));
    assert!(msg.contains("--model"), "{msg}");
    let msg = err(eval(&["run", "--instances", "x.jsonl", "--model", "m", "--max-steps", "0"]));
    assert_eq!(msg.trim(), "error: --max-steps must be at least 1, got 0");
    // The agent's limits mean nothing to a shell command: refused, not ignored.
    let msg = err(eval(&["run", "--instances", "x.jsonl", "--solver-cmd", "true", "--max-tokens-per-turn", "9"]));
    assert!(msg.contains("--max-tokens-per-turn") && msg.contains("cannot be used with"), "{msg}");
}

#[test]
fn a_local_model_is_loaded_once_in_process_before_any_instance_runs() {
    let dir = tempfile::tempdir().unwrap();
    let set = dir.path().join("set.jsonl");
    std::fs::write(
        &set,
        "{\"instance_id\":\"a__b-1\",\"repo\":\"a/b\",\"base_commit\":\"x\",\"FAIL_TO_PASS\":[],\"PASS_TO_PASS\":[]}\n",
    )
    .unwrap();
    let missing = dir.path().join("no-such-model.gguf");
    let out = dir.path().join("out");
    let args = ["run", "--instances", set.to_str().unwrap(), "--model", missing.to_str().unwrap()];
    let msg = err(eval(&[&args[..], &["--output", out.to_str().unwrap()]].concat()));
    // In process, a model that does not load stops the run up front, instead of failing
    // every instance in its own `frognano solve`.
    assert!(msg.contains("loading") && msg.contains("no-such-model.gguf"), "{msg}");
    assert!(!out.join("logs/run_evaluation/frognano/results.jsonl").exists());
}
