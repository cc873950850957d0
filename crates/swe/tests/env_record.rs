//! `eval grade` rebuilds a synthesized task's environment from its record
//! (`frognano_environment`): the virtualenv the task was validated in is deleted, grading
//! builds one with exactly the recorded packages in the environment cache, runs the tests
//! with it (a test checks that its interpreter is the rebuilt one), and reuses it; a corrupt
//! record, a record that disagrees with what gets installed, and a task whose environment is
//! gone without a record are errors that say so. No network: the recorded set is what
//! `python3 -m venv` installs by itself (pip, and setuptools where bundled).
//!
//! One test function: it sets `FROGNANO_ENV_CACHE` for this test binary.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use frognano_sandbox::{Isolation, Sandbox};
use frognano_swe::env_record::ENVIRONMENT_KEY;
use frognano_swe::executor::{run_instance, ErrorKind, ExecOptions, Outcome};
use frognano_swe::instance::{gold_predictions, parse_jsonl_instances, Prediction, SweInstance};
use frognano_testkit::{commit, diff_for, git, write};
use serde_json::json;

const CALC_BUGGY: &str = "def add(a, b):\n    return a - b\n";
const CALC_FIXED: &str = "def add(a, b):\n    return a + b\n";
// test_env passes only under the rebuilt virtualenv: the cache folder holding it has the
// rebuild's marker file beside it.
const TESTS: &str = "import os, sys, unittest\n\nfrom calc import add\n\n\nclass CalcTest(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n\n    def test_env(self):\n        marker = os.path.join(os.path.dirname(sys.prefix), 'frognano-environment.json')\n        self.assertTrue(os.path.exists(marker), sys.prefix)\n";

fn unittest_id(test: &str) -> String {
    frognano_testkit::unittest_verbose_name(test, "tests.test_calc.CalcTest")
}

fn isolation() -> Isolation {
    if frognano_testkit::available_or_skip(
        "bubblewrap",
        "swe/tests/env_record.rs grades unconfined",
        Sandbox::bubblewrap_available(),
    ) {
        Isolation::Bubblewrap
    } else {
        Isolation::Unconfined
    }
}

fn grade_one(inst: &SweInstance, patch: Option<String>, root: &Path, name: &str) -> Outcome {
    let mut pred: Prediction = gold_predictions(std::slice::from_ref(inst)).remove(0);
    pred.model_patch = patch;
    let opts = ExecOptions {
        repos: None,
        timeout: Duration::from_secs(300),
        isolation: isolation(),
        work_root: root.join("work"),
    };
    std::fs::create_dir_all(root.join("work")).unwrap();
    let result = run_instance(inst, &pred, &opts, &root.join("logs").join(name));
    if let Outcome::Error(ErrorKind::Infra(m)) = &result.outcome {
        panic!("{name}: infrastructure error: {m}");
    }
    result.outcome
}

#[test]
fn grading_rebuilds_the_recorded_environment_and_bad_records_are_named() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let cache = dir.path().join("env-cache");
    std::env::set_var("FROGNANO_ENV_CACHE", &cache);

    // The environment synthesis validated in: a fresh virtualenv, recorded then deleted.
    let venv = dir.path().join("synth-out/env/venv");
    let made = Command::new("python3").args(["-m", "venv"]).arg(&venv).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let python = venv.join("bin/python");
    let freeze = Command::new(&python).args(["-m", "pip", "freeze", "--all"]).output().unwrap();
    let pins: Vec<String> = String::from_utf8_lossy(&freeze.stdout).lines().map(str::to_string).collect();
    assert!(pins.iter().any(|p| p.starts_with("pip==")), "{pins:?}");
    let version =
        Command::new(&python).args(["-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"]).output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    std::fs::remove_dir_all(&venv).unwrap();

    let repo = dir.path().join("calc");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    write(&repo, "calc.py", CALC_BUGGY);
    write(&repo, "tests/__init__.py", "");
    write(&repo, "tests/test_calc.py", TESTS);
    let base = commit(&repo, "buggy");
    let gold = diff_for(&repo, "calc.py", CALC_FIXED);
    let record = json!({
        "kind": "python_venv", "python": version, "venv": venv, "packages": pins,
        "project": null, "exclude_newer": null, "tools_exclude_newer": null,
    });
    let line = json!({
        "instance_id": "calc.op__1", "repo": "local/calc", "base_commit": base, "environment_setup_commit": base,
        "repo_path": repo, "patch": gold, "problem_statement": "add() subtracts", "version": "synth",
        "log_parser": "parse_log_django", "eval_type": "pass_and_fail",
        "test_cmd": format!("PYTHONDONTWRITEBYTECODE=1 '{}' -m unittest -v 2>&1", python.display()),
        "FAIL_TO_PASS": [unittest_id("test_add")], "PASS_TO_PASS": [unittest_id("test_env")],
        "frognano_readable_paths": [venv], ENVIRONMENT_KEY: record,
    });
    let inst = parse_jsonl_instances(&format!("{line}\n"), "tasks.jsonl").unwrap().remove(0);

    // The gold patch resolves in the rebuilt environment (test_env passes only there); the
    // empty fix does not; the second grade reuses the one cached environment.
    assert_eq!(grade_one(&inst, Some(inst.patch.clone()), dir.path(), "gold"), Outcome::Resolved);
    let buggy = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return 0\n";
    assert_eq!(grade_one(&inst, Some(buggy.into()), dir.path(), "wrong"), Outcome::Unresolved);
    let built: Vec<_> = std::fs::read_dir(&cache).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(built.len(), 1, "{built:?}");
    assert!(built[0].to_string_lossy().starts_with("py3."), "{built:?}");
    assert!(!venv.exists(), "grading must not recreate the recorded folder");

    let environment_error = |outcome: Outcome| match outcome {
        Outcome::Error(ErrorKind::Environment(m)) => m,
        other => panic!("expected an environment error, got {other:?}"),
    };
    // A corrupt record: the field, what was expected and what was found.
    let mut corrupt = inst.clone();
    corrupt.extra[ENVIRONMENT_KEY]["packages"] = json!(["pip>=20"]);
    let m = environment_error(grade_one(&corrupt, Some(inst.patch.clone()), dir.path(), "corrupt"));
    assert_eq!(
        m,
        "instance calc.op__1: field `frognano_environment.packages`: expected `name==version` pins, found \"pip>=20\""
    );
    let mut no_kind = inst.clone();
    no_kind.extra[ENVIRONMENT_KEY].as_object_mut().unwrap().remove("kind");
    let m = environment_error(grade_one(&no_kind, Some(inst.patch.clone()), dir.path(), "no-kind"));
    assert!(m.contains("field `frognano_environment` is not a valid environment record (missing field `kind`"), "{m}");
    // A record that leaves out an installed package: the rebuild's check names it.
    let mut short = inst.clone();
    let kept: Vec<String> = pins.iter().filter(|p| !p.starts_with("pip==")).cloned().collect();
    short.extra[ENVIRONMENT_KEY]["packages"] = json!(kept);
    let m = environment_error(grade_one(&short, Some(inst.patch.clone()), dir.path(), "short"));
    assert!(m.contains("the installed packages differ from the record: missing [], not recorded [\"pip=="), "{m}");
    // No record, and the folder its command reads is gone.
    let mut missing = inst.clone();
    missing.extra.remove(ENVIRONMENT_KEY);
    let m = environment_error(grade_one(&missing, Some(inst.patch.clone()), dir.path(), "missing"));
    assert_eq!(
        m,
        format!(
            "instance calc.op__1: its test command reads {}, which does not exist, and the instance has no \
             `frognano_environment` record to rebuild it from (synthesize the task again to record one)",
            venv.display()
        )
    );
}
