//! `frognano eval` entry points as a user calls them, and bad-input messages.

use std::path::Path;

use clap::Parser;
use frognano_swe::cli::{run_eval, EvalCommand};

#[derive(Parser)]
struct Eval {
    #[command(subcommand)]
    cmd: EvalCommand,
}

fn parity_log(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/parity/logs").join(name).to_string_lossy().into_owned()
}

#[test]
fn parse_log_and_grade_log_run_on_real_logs() {
    let e = Eval::parse_from(["eval", "parse-log", "--parser", "pytest", &parity_log("pytest_ra.log")]);
    run_eval(e.cmd).unwrap();
    let e = Eval::parse_from(["eval", "parse-log", "--parser", "nonsense", &parity_log("pytest_ra.log")]);
    assert!(run_eval(e.cmd).unwrap_err().to_string().contains("unknown log parser"));
    let e = Eval::parse_from(["eval", "parse-log", "--parser", "jest", &parity_log("pytest_ra.log")]);
    run_eval(e.cmd).unwrap();
    run_eval(Eval::parse_from(["eval", "parse-log", "--list"]).cmd).unwrap();
    // Spec-dependent parsers fail without their context, as swebench's do without a spec.
    let e = Eval::parse_from(["eval", "parse-log", "--parser", "next", &parity_log("pytest_ra.log")]);
    assert!(run_eval(e.cmd).unwrap_err().to_string().contains("version"));
    let e =
        Eval::parse_from(["eval", "parse-log", "--parser", "next", "--version", "1.0", &parity_log("pytest_ra.log")]);
    run_eval(e.cmd).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let inst = dir.path().join("i.json");
    std::fs::write(&inst, r#"{"instance_id":"a__b-1","repo":"a/b","base_commit":"x","log_parser":"parse_log_django","FAIL_TO_PASS":[],"PASS_TO_PASS":[]}"#).unwrap();
    let e = Eval::parse_from([
        "eval",
        "grade-log",
        "--instance",
        inst.to_str().unwrap(),
        "--log",
        &parity_log("lone_fail_word.log"),
    ]);
    assert!(run_eval(e.cmd).unwrap_err().to_string().contains("grader error"));
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
    let e = Eval::parse_from(["eval", "grade", "--instances", p.to_str().unwrap(), "--predictions", "gold"]);
    let msg = run_eval(e.cmd).unwrap_err().to_string();
    assert!(msg.contains("set.jsonl:2: field `FAIL_TO_PASS`: item 0 is a number"), "{msg}");
}
