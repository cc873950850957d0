//! End to end over fixture repositories created at test time: gold patches resolve every
//! instance, empty patches resolve none, a broken patch is reported as not applied, and a
//! hung test or a missing repository is recorded per instance while the run goes on.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use frognano_sandbox::{Isolation, Sandbox};
use frognano_swe::executor::{create_workspace, ExecOptions};
use frognano_swe::instance::{gold_predictions, parse_jsonl_instances, Prediction, SweInstance};
use frognano_swe::runs::{grade, read_results, solve_and_grade, GradeOptions, Solution, SolveRunOptions, Solver};
use frognano_testkit::{commit, diff_for, git, write};
use serde_json::{json, Value};

const CALC_BUGGY: &str = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n";
const CALC_FIXED: &str = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n";
const TESTS_BASE: &str = "import unittest\n\nfrom calc import add, mul\n\n\nclass CalcTest(unittest.TestCase):\n    def test_mul(self):\n        self.assertEqual(mul(3, 4), 12)\n";
const TESTS_NEW: &str = "import unittest\n\nfrom calc import add, mul\n\n\nclass CalcTest(unittest.TestCase):\n    def test_mul(self):\n        self.assertEqual(mul(3, 4), 12)\n\n    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n";

const GREET_BUGGY: &str = "greet() { echo \"Helo, $1\"; }\n";
const GREET_FIXED: &str = "greet() { echo \"Hello, $1\"; }\n";
const RUNNER: &str = "#!/bin/bash\n# go-test style runner over tests/*.t.sh\n. ./lib.sh\nfor t in tests/*.t.sh; do . \"$t\"; done\nfor f in $(declare -F | awk '{print $3}' | grep '^Test'); do\n  if $f; then echo \"--- PASS: $f (0.00s)\"; else echo \"--- FAIL: $f (0.00s)\"; fi\ndone\n";
const GREET_TEST: &str = "TestGreet() { [ \"$(greet Bob)\" = \"Hello, Bob\" ]; }\n";
const OTHER_TEST: &str = "TestTrue() { true; }\n";

struct Fixture {
    _dir: tempfile::TempDir,
    repos: PathBuf,
    instances: Vec<SweInstance>,
    future_commit: String,
}

fn unittest_id(test: &str) -> String {
    frognano_testkit::unittest_verbose_name(test, "tests.test_calc.CalcTest")
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let repos = dir.path().join("repos");
    // calc: a Python project graded with Django's (unittest) parser.
    let calc = repos.join("calc__calc");
    std::fs::create_dir_all(&calc).unwrap();
    git(&calc, &["init", "-q"]);
    write(&calc, "calc.py", CALC_FIXED);
    write(&calc, "tests/__init__.py", "");
    write(&calc, "tests/test_calc.py", TESTS_BASE);
    commit(&calc, "initial");
    write(&calc, "calc.py", CALC_BUGGY);
    let calc_base = commit(&calc, "refactor add (introduces the bug)");
    let calc_gold = diff_for(&calc, "calc.py", CALC_FIXED);
    let calc_tests = diff_for(&calc, "tests/test_calc.py", TESTS_NEW);
    // Future history: the fix itself lands later; the workspace must not see it.
    write(&calc, "calc.py", CALC_FIXED);
    write(&calc, "tests/test_calc.py", TESTS_NEW);
    let future_commit = commit(&calc, "fix add");

    // greet: a bash project with a go-test style runner.
    let greet = repos.join("greet");
    std::fs::create_dir_all(&greet).unwrap();
    git(&greet, &["init", "-q"]);
    write(&greet, "lib.sh", GREET_BUGGY);
    write(&greet, "run_tests.sh", RUNNER);
    write(&greet, "tests/other.t.sh", OTHER_TEST);
    let greet_base = commit(&greet, "initial");
    let greet_gold = diff_for(&greet, "lib.sh", GREET_FIXED);
    let greet_tests = diff_for(&greet, "tests/greet.t.sh", GREET_TEST);

    let lines = [
        json!({
            "instance_id": "calc__calc-1", "repo": "calc/calc", "base_commit": calc_base,
            "patch": calc_gold, "test_patch": calc_tests, "problem_statement": "add() subtracts",
            "version": "1.0", "log_parser": "parse_log_django", "eval_type": "pass_and_fail",
            "test_cmd": "python3 -m unittest -v tests.test_calc",
            "FAIL_TO_PASS": [unittest_id("test_add")], "PASS_TO_PASS": json!([unittest_id("test_mul")]).to_string(),
        }),
        json!({
            "instance_id": "greet__greet-1", "repo": "sh/greet", "base_commit": greet_base,
            "repo_path": greet.to_string_lossy(),
            "patch": greet_gold, "test_patch": greet_tests, "problem_statement": "greeting misspelt",
            "version": "0.1", "log_parser": "gotest",
            "test_cmd": "bash run_tests.sh",
            "FAIL_TO_PASS": ["TestGreet"], "PASS_TO_PASS": ["TestTrue"],
        }),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let instances = parse_jsonl_instances(&text, "fixture.jsonl").unwrap();
    Fixture { _dir: dir, repos, instances, future_commit }
}

fn isolation() -> Isolation {
    if frognano_testkit::available_or_skip(
        "bubblewrap",
        "swe/tests/e2e.rs grades unconfined",
        Sandbox::bubblewrap_available(),
    ) {
        Isolation::Bubblewrap
    } else {
        Isolation::Unconfined
    }
}

fn options(fx: &Fixture, out: &Path, run_id: &str, workers: usize, timeout: u64) -> GradeOptions {
    GradeOptions {
        run_id: run_id.into(),
        output: out.to_path_buf(),
        workers,
        shard: None,
        exec: ExecOptions {
            repos: Some(fx.repos.clone()),
            timeout: Duration::from_secs(timeout),
            isolation: isolation(),
            work_root: out.join("work"),
        },
    }
}

fn report_file(out: &Path, name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(out.join(name)).unwrap()).unwrap()
}

fn with_patch(fx: &Fixture, f: impl Fn(&SweInstance) -> Option<String>) -> Vec<Prediction> {
    let mut preds = gold_predictions(&fx.instances);
    for (p, i) in preds.iter_mut().zip(&fx.instances) {
        p.model_patch = f(i);
        p.model_name_or_path = "org/test-model".into();
    }
    preds
}

#[test]
fn gold_resolves_every_instance_and_rerun_skips_done() {
    let fx = fixture();
    let out = tempfile::tempdir().unwrap();
    let opts = options(&fx, out.path(), "gold", 2, 120);
    let s = grade(fx.instances.clone(), gold_predictions(&fx.instances), &opts).unwrap();
    let report = report_file(out.path(), "gold.gold.json");
    assert_eq!(report["resolved_ids"], json!(["calc__calc-1", "greet__greet-1"]), "{report}");
    assert_eq!(s.resolved, 2);
    let per =
        std::fs::read_to_string(out.path().join("logs/run_evaluation/gold/gold/calc__calc-1/report.json")).unwrap();
    assert!(per.starts_with("{\n    \"calc__calc-1\": {\n        \"patch_is_None\": false"), "{per}");
    // A rerun grades nothing again.
    let rows_before = read_results(&s.results_path).len();
    grade(fx.instances.clone(), gold_predictions(&fx.instances), &opts).unwrap();
    assert_eq!(read_results(&s.results_path).len(), rows_before);
}

#[test]
fn empty_patches_resolve_nothing_and_broken_patch_is_not_applied() {
    let fx = fixture();
    let out = tempfile::tempdir().unwrap();
    let opts = options(&fx, out.path(), "bad", 1, 120);
    let mut preds = with_patch(&fx, |_| Some(String::new()));
    // A patch whose context does not exist in the file.
    preds[1].model_patch = Some(
        "diff --git a/lib.sh b/lib.sh\n--- a/lib.sh\n+++ b/lib.sh\n@@ -1 +1 @@\n-nothing like this\n+greet() { :; }\n"
            .into(),
    );
    let s = grade(fx.instances.clone(), preds, &opts).unwrap();
    let report = report_file(out.path(), "org__test-model.bad.json");
    assert_eq!(report["resolved_instances"], 0);
    assert_eq!(report["empty_patch_ids"], json!(["calc__calc-1"]));
    assert_eq!(report["error_ids"], json!(["greet__greet-1"]));
    let rows = read_results(&s.results_path);
    let greet = rows.iter().find(|r| r["instance_id"] == "greet__greet-1").unwrap();
    assert_eq!(greet["status"], "error_patch_apply_failed");
    assert_eq!(greet["patch_applied"], false);
    let log = std::fs::read_to_string(
        out.path().join("logs/run_evaluation/bad/org__test-model/greet__greet-1/run_instance.log"),
    )
    .unwrap();
    assert!(log.contains(">>>>> Patch Apply Failed"), "{log}");
    assert!(log.contains("patch --batch --forward --fuzz=5"), "every fallback was tried: {log}");
}

#[test]
fn hung_test_and_missing_repository_are_recorded_and_the_run_goes_on() {
    let mut fx = fixture();
    fx.instances[0].test_cmd = Some("sleep 60".into());
    let mut missing = fx.instances[1].clone();
    missing.instance_id = "ghost__ghost-1".into();
    missing.repo = "ghost/ghost".into();
    missing.repo_path = None;
    fx.instances.push(missing);
    let out = tempfile::tempdir().unwrap();
    let opts = options(&fx, out.path(), "hang", 2, 3);
    let s = grade(fx.instances.clone(), gold_predictions(&fx.instances), &opts).unwrap();
    let rows = read_results(&s.results_path);
    let status = |id: &str| rows.iter().find(|r| r["instance_id"] == id).unwrap()["status"].clone();
    assert_eq!(status("calc__calc-1"), "error_test_timeout");
    assert_eq!(status("ghost__ghost-1"), "error_repo_missing");
    assert_eq!(status("greet__greet-1"), "resolved");
    let out_log =
        std::fs::read_to_string(out.path().join("logs/run_evaluation/hang/gold/calc__calc-1/test_output.txt")).unwrap();
    assert!(out_log.ends_with("\n\nTimeout error: 3 seconds exceeded."));
    let report = report_file(out.path(), "gold.hang.json");
    assert_eq!(report["failure_reasons"]["calc__calc-1"], "tests_timed_out");
}

#[test]
fn workspace_hides_future_history() {
    let fx = fixture();
    let dest = tempfile::tempdir().unwrap();
    let ws = dest.path().join("ws");
    create_workspace(&fx.repos.join("calc__calc"), &fx.instances[0].base_commit, &ws).unwrap();
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), fx.instances[0].base_commit);
    let all = git(&ws, &["log", "--all", "--format=%H"]);
    assert!(!all.contains(&fx.future_commit), "future commit visible: {all}");
    assert_eq!(all.lines().count(), 2);
    assert_eq!(std::fs::read_to_string(ws.join("calc.py")).unwrap(), CALC_BUGGY);
}

/// A solver that edits the workspace the way an agent would: applies the gold patch.
struct GoldSolver;

impl Solver for GoldSolver {
    fn model_name(&self) -> String {
        "gold-solver".into()
    }
    fn solve(&self, inst: &SweInstance, ws: &Path, attempt: usize) -> anyhow::Result<Solution> {
        if attempt == 1 {
            return Ok(Solution { exit_reason: "gave_up".into(), ..Default::default() });
        }
        let mut child =
            Command::new("git").args(["apply", "-"]).current_dir(ws).stdin(std::process::Stdio::piped()).spawn()?;
        use std::io::Write;
        child.stdin.take().unwrap().write_all(inst.patch.as_bytes())?;
        anyhow::ensure!(child.wait()?.success(), "git apply failed");
        Ok(Solution { exit_reason: "submitted".into(), trajectory: Some(json!({"steps": 1})), ..Default::default() })
    }
}

#[test]
fn run_solves_grades_and_computes_pass_at_k() {
    let fx = fixture();
    let out = tempfile::tempdir().unwrap();
    let g = options(&fx, out.path(), "solve", 2, 120);
    let opts = SolveRunOptions {
        run_id: "solve".into(),
        output: out.path().to_path_buf(),
        workers: 2,
        attempts: 2,
        shard: None,
        exec: g.exec.clone(),
    };
    let (s, m) = solve_and_grade(fx.instances.clone(), &GoldSolver, &opts).unwrap();
    assert_eq!(s.resolved, 2);
    assert_eq!(m.pass_at_k, 1.0);
    assert!((m.avg_at_k - 0.5).abs() < 1e-12);
    assert!((m.pass_at_1 - 0.5).abs() < 1e-12);
    let preds = std::fs::read_to_string(out.path().join("logs/run_evaluation/solve/preds.jsonl")).unwrap();
    assert_eq!(preds.lines().count(), 4);
    // Rerun: nothing left to do.
    let (s2, _) = solve_and_grade(fx.instances.clone(), &GoldSolver, &opts).unwrap();
    assert_eq!(read_results(&s2.results_path).len(), 4);
}
