//! `frognano eval run` end to end through the binary. With a scripted solver (`--solver-cmd`)
//! the command's edits are the patch, which is graded as swebench grades, and the results and
//! the summary line say so: a solver that fixes the bug resolves the task; one that does
//! nothing does not. With `--model` (the demo model, loaded in this process) the agent's
//! attempt is held to `--max-steps` / `--max-tokens-per-turn` and its trajectory and exit
//! reason land beside the graded result.

use std::path::Path;
use std::process::Command;

use frognano_testkit::{bash_project, diff_for};
use serde_json::{json, Value};

const LIB_BUGGY: &str = "greet() { echo \"Helo, $1\"; }\n";
const LIB_FIXED: &str = "greet() { echo \"Hello, $1\"; }\n";

/// A bash project whose `greet` misspells "Hello", as a one-instance JSONL file.
fn instances(root: &Path) -> std::path::PathBuf {
    let repo = root.join("greet");
    let base = bash_project(&repo, LIB_BUGGY);
    let gold = diff_for(&repo, "lib.sh", LIB_FIXED);
    let test_patch = diff_for(&repo, "tests/greet.t.sh", "TestGreet() { [ \"$(greet Bob)\" = \"Hello, Bob\" ]; }\n");
    let line = json!({
        "instance_id": "sh__greet-1", "repo": "sh/greet", "base_commit": base,
        "repo_path": repo.to_string_lossy(), "patch": gold, "test_patch": test_patch,
        "problem_statement": "greet prints Helo", "version": "0.1", "log_parser": "gotest",
        "test_cmd": "bash run_tests.sh", "FAIL_TO_PASS": ["TestGreet"], "PASS_TO_PASS": ["TestTrue"],
    });
    let path = root.join("instances.jsonl");
    std::fs::write(&path, format!("{line}\n")).unwrap();
    path
}

/// Runs `eval run` with the solver flags `solver`; returns stdout and the results rows.
fn run(root: &Path, run_id: &str, solver: &[&str]) -> (String, Vec<Value>) {
    let inst = instances(&root.join(run_id));
    let out_dir = root.join(format!("{run_id}-out"));
    let mut args = vec!["eval", "run", "--instances", inst.to_str().unwrap(), "--run-id", run_id];
    args.extend(["--output", out_dir.to_str().unwrap(), "--timeout", "60"]);
    args.extend(solver);
    let bwrap = frognano_sandbox::Sandbox::bubblewrap_available();
    if !frognano_testkit::available_or_skip("bubblewrap", "eval run through the binary", bwrap) {
        args.push("--no-sandbox");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_frognano")).args(&args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8(o.stdout).unwrap();
    let results = stdout.lines().find_map(|l| l.strip_prefix("results: ")).expect("a results line").to_string();
    let text = std::fs::read_to_string(&results).unwrap();
    (stdout, text.lines().map(|l| serde_json::from_str(l).unwrap()).collect())
}

#[test]
fn a_scripted_solver_that_fixes_the_bug_resolves_the_task_and_one_that_does_not_fails_it() {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, rows) = run(dir.path(), "fix", &["--solver-cmd", "sed -i 's/Helo/Hello/' lib.sh"]);
    assert!(stdout.contains("resolved 1/1 instances"), "{stdout}");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["resolved"], json!(true), "{rows:?}");
    let (stdout, rows) = run(dir.path(), "nothing", &["--solver-cmd", "true"]);
    assert!(stdout.contains("resolved 0/1 instances"), "{stdout}");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["resolved"], json!(false), "{rows:?}");
}

#[test]
fn hints_put_where_the_fix_goes_into_the_issue_the_solver_reads() {
    let dir = tempfile::tempdir().unwrap();
    // A solver that fixes the bug only when its issue file says where the fix goes.
    let solver = "grep -qF 'Hint: the code to fix is `lib.sh`, line 1.' \"$FROGNANO_ISSUE_FILE\" && sed -i 's/Helo/Hello/' lib.sh";
    let (stdout, _) = run(dir.path(), "hinted", &["--solver-cmd", solver, "--hints", "line"]);
    assert!(stdout.contains("resolved 1/1 instances"), "{stdout}");
    let (stdout, _) = run(dir.path(), "plain", &["--solver-cmd", solver]);
    assert!(stdout.contains("resolved 0/1 instances"), "{stdout}");
}

#[test]
fn the_demo_model_in_process_attempts_the_task_within_its_limits() {
    let Some(model) = frognano_testkit::demo_model() else { return };
    let dir = tempfile::tempdir().unwrap();
    let solver = ["--model", model.to_str().unwrap(), "--max-steps", "2", "--max-tokens-per-turn", "4"];
    let (stdout, rows) = run(dir.path(), "demo", &[&solver[..], &["--attempts", "3"]].concat());
    // A 135M model does not fix the bug; each attempt is graded, not an error.
    assert!(stdout.contains("resolved 0/1 instances") && stdout.contains("errors 0"), "{stdout}");
    assert_eq!(rows.len(), 3, "{rows:?}");
    let run_dir = dir.path().join("demo-out/logs/run_evaluation/demo");
    let preds = std::fs::read_to_string(run_dir.join("preds.jsonl")).unwrap();
    let mut cut_at_4 = 0;
    for row in &rows {
        assert!(matches!(row["status"].as_str(), Some("empty_patch" | "unresolved")), "{row}");
        let traj_path = run_dir.join(row["trajectory"].as_str().expect("the trajectory is stored"));
        let traj: Value = serde_json::from_str(&std::fs::read_to_string(traj_path).unwrap()).unwrap();
        assert_eq!(traj["trajectory_format"], "leaf-function-calling");
        let steps = traj["n_steps"].as_u64().unwrap();
        assert!((1..=2).contains(&steps), "--max-steps 2 ran {steps} steps: {traj}");
        let exit = traj["exit_reason"].as_str().unwrap();
        assert!(!exit.is_empty() && exit != "llm_query_error" && exit != "error", "{traj}");
        // The agent's notice after a reply cut by --max-tokens-per-turn names the limit.
        cut_at_4 += traj["messages"].as_array().unwrap().iter().any(|m| {
            m["role"] == "user" && m["content"].as_str().is_some_and(|c| c.contains("cut off at the limit of 4 tokens"))
        }) as usize;
        let pred: Value = preds
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(|p| p["attempt"] == row["attempt"])
            .expect("a prediction per attempt");
        assert_eq!(pred["model_name_or_path"], json!(model.to_str().unwrap()), "{pred}");
        assert_eq!(pred["exit_reason"], json!(exit), "the prediction carries the trajectory's exit reason");
    }
    // Four tokens cut nearly every reply of this model (which, unchecked, goes on for dozens):
    // without the limit no attempt would show the notice, and without --max-steps they would
    // run past two steps.
    assert!(cut_at_4 >= 1, "no reply of 3 attempts was held to 4 tokens: {rows:?}");
}
