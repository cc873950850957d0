//! Harbor task directories end to end with the local executor: a fixture dataset in the
//! layout `frognano synth` writes (task.toml, instruction.md, environment/Dockerfile naming
//! the repository and commit, tests/instance.json, tests/test.sh writing
//! /logs/verifier/reward.txt) plus a task known only by its Dockerfile and one with no source.
//! Gold patches resolve, a harmless patch does not, the agent never sees tests/.

use std::path::{Path, PathBuf};
use std::time::Duration;

use frognano_sandbox::{Isolation, Sandbox};
use frognano_swe::executor::ExecOptions;
use frognano_swe::instance::{Prediction, SweInstance, Verification};
use frognano_swe::load_instances;
use frognano_swe::runs::{grade, read_results, solve_and_grade, GradeOptions, Solution, SolveRunOptions, Solver};
use frognano_testkit::{git, write};
use serde_json::{json, Value};

const GREET_BUGGY: &str = "greet() { echo \"Helo, $1\"; }\n";
const GOLD: &str = "diff --git a/lib.sh b/lib.sh\n--- a/lib.sh\n+++ b/lib.sh\n@@ -1 +1 @@\n-greet() { echo \"Helo, $1\"; }\n+greet() { echo \"Hello, $1\"; }\n";
const HARMLESS: &str =
    "diff --git a/NOTES b/NOTES\nnew file mode 100644\n--- /dev/null\n+++ b/NOTES\n@@ -0,0 +1 @@\n+nothing\n";
const RUNNER: &str = "#!/bin/bash\n. ./lib.sh\nfor t in tests/*.t.sh; do . \"$t\"; done\nfor f in $(declare -F | awk '{print $3}' | grep '^Test'); do\n  if $f; then echo \"--- PASS: $f (0.00s)\"; else echo \"--- FAIL: $f (0.00s)\"; fi\ndone\n";
/// The verifier: hidden test copied in from /tests, tests run in the workdir, reward written.
const TEST_SH: &str = "#!/bin/bash\nset -uo pipefail\nmkdir -p /logs/verifier\ncd /app\ncp /tests/greet.t.sh tests/\n\
bash run_tests.sh > /logs/verifier/test_output.txt 2>&1\ncat /logs/verifier/test_output.txt\n\
if grep -q -- '--- FAIL' /logs/verifier/test_output.txt; then echo 0 > /logs/verifier/reward.txt; \
else echo 1 > /logs/verifier/reward.txt; fi\n";
const TEST_SH_JSON: &str = "#!/bin/bash\ncd /app && cp /tests/greet.t.sh tests/ && bash run_tests.sh > out.txt\n\
if grep -q -- '--- FAIL' out.txt; then r=0; else r=1.0; fi\necho \"{\\\"reward\\\": $r}\" > /logs/verifier/reward.json\n";

struct Fixture {
    _dir: tempfile::TempDir,
    dataset: PathBuf,
    repos: PathBuf,
}

fn task(root: &Path, id: &str, base: &str, instance_json: Option<Value>, test_sh: &str) {
    let t = root.join(id);
    write(&t, "instruction.md", "greet() misspells Hello; fix lib.sh.\n");
    write(
        &t,
        "task.toml",
        "version = \"1.0\"\n\n[metadata]\nsource = \"frognano-synth\"\n\n[verifier]\ntimeout_sec = 60.0\n\n\
[agent]\ntimeout_sec = 600.0\n\n[environment]\nworkdir = \"/app\"\nallow_internet = false\n",
    );
    write(
        &t,
        "environment/Dockerfile",
        &format!(
            "FROM frognano-synth/sh__greet:latest\nWORKDIR /app\n# The buggy tree is the single orphan commit {base} of the task repository\n# (refs/heads/task/{id}); no other history is present in the image.\n"
        ),
    );
    if let Some(v) = instance_json {
        write(&t, "tests/instance.json", &serde_json::to_string_pretty(&v).unwrap());
    }
    write(&t, "tests/greet.t.sh", "TestGreet() { [ \"$(greet Bob)\" = \"Hello, Bob\" ]; }\n");
    write(&t, "tests/test.sh", test_sh);
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let repos = dir.path().join("repos");
    let greet = repos.join("sh__greet");
    std::fs::create_dir_all(&greet).unwrap();
    git(&greet, &["init", "-q"]);
    write(&greet, "lib.sh", GREET_BUGGY);
    write(&greet, "run_tests.sh", RUNNER);
    write(&greet, "tests/other.t.sh", "TestTrue() { true; }\n");
    git(&greet, &["add", "-A"]);
    git(&greet, &["commit", "-q", "-m", "initial"]);
    let base = git(&greet, &["rev-parse", "HEAD"]);
    let dataset = dir.path().join("dataset");
    // As frognano synth writes it: tests/instance.json carries the SWE fields and gold patch.
    let inst = json!({
        "instance_id": "sh__greet-1", "repo": "sh/greet", "base_commit": base,
        "repo_path": greet.to_string_lossy(), "patch": GOLD, "test_patch": "",
        "problem_statement": "greeting misspelt", "version": "synth", "log_parser": "parse_log_gotest",
        "eval_type": "pass_and_fail", "test_cmd": "bash run_tests.sh",
        "FAIL_TO_PASS": ["TestGreet"], "PASS_TO_PASS": ["TestTrue"],
    });
    task(&dataset, "sh__greet-1", &base, Some(inst), TEST_SH);
    // Known only by its Dockerfile (repo from FROM, commit from the comment; --repos finds it).
    task(&dataset, "sh__greet-2", &base, None, TEST_SH_JSON);
    Fixture { _dir: dir, dataset, repos }
}

fn exec(fx: &Fixture, out: &Path) -> ExecOptions {
    ExecOptions {
        repos: Some(fx.repos.clone()),
        timeout: Duration::from_secs(60),
        isolation: if frognano_testkit::available_or_skip(
            "bubblewrap",
            "swe/tests/harbor.rs runs its graders unconfined",
            Sandbox::bubblewrap_available(),
        ) {
            Isolation::Bubblewrap
        } else {
            Isolation::Unconfined
        },
        work_root: out.join("work"),
    }
}

fn preds(insts: &[SweInstance], patch: &str) -> Vec<Prediction> {
    insts
        .iter()
        .map(|i| Prediction {
            instance_id: i.instance_id.clone(),
            model_name_or_path: "m".into(),
            model_patch: Some(patch.into()),
            extra: Default::default(),
        })
        .collect()
}

#[test]
fn harbor_dataset_gold_resolves_and_harmless_patch_does_not() {
    let fx = fixture();
    let insts = load_instances(&fx.dataset).unwrap();
    assert_eq!(insts.iter().map(|i| i.instance_id.as_str()).collect::<Vec<_>>(), ["sh__greet-1", "sh__greet-2"]);
    assert_eq!(insts[0].problem_statement, "greet() misspells Hello; fix lib.sh.\n");
    assert_eq!(insts[1].repo, "sh/greet");
    // Verified by the task's own tests/test.sh, not by an eval script.
    let task_dir = fx.dataset.join("sh__greet-1").canonicalize().unwrap();
    assert_eq!(insts[0].verification, Verification::Harbor { task_dir });
    let out = tempfile::tempdir().unwrap();
    let opts = |run_id: &str| GradeOptions {
        run_id: run_id.into(),
        output: out.path().to_path_buf(),
        workers: 2,
        shard: None,
        exec: exec(&fx, out.path()),
    };
    let s = grade(insts.clone(), preds(&insts, GOLD), &opts("gold")).unwrap();
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("m.gold.json")).unwrap()).unwrap();
    assert_eq!(report["resolved_ids"], json!(["sh__greet-1", "sh__greet-2"]), "{report}");
    assert_eq!(s.resolved, 2);
    let per = out.path().join("logs/run_evaluation/gold/m/sh__greet-1");
    let text = std::fs::read_to_string(per.join("report.json")).unwrap();
    assert!(text.contains("\"resolved\": true") && text.contains("\"reward\": 1.0"), "{text}");
    assert_eq!(std::fs::read_to_string(per.join("verifier/reward.txt")).unwrap(), "1\n");
    assert!(std::fs::read_to_string(per.join("test_output.txt")).unwrap().contains("--- PASS: TestGreet"));

    // The gold patch from tests/instance.json (`--predictions gold`) resolves the synth task.
    let gold = frognano_swe::instance::gold_predictions(&insts[..1]);
    let s = grade(insts[..1].to_vec(), gold, &opts("gold-file")).unwrap();
    assert_eq!(s.resolved, 1);

    let s = grade(insts.clone(), preds(&insts, HARMLESS), &opts("harmless")).unwrap();
    assert_eq!(s.resolved, 0);
    let rows = read_results(&s.results_path);
    assert!(rows.iter().all(|r| r["status"] == "unresolved"), "{rows:?}");
    let r2 = rows.iter().find(|r| r["instance_id"] == "sh__greet-2").unwrap();
    assert_eq!(r2["report"]["sh__greet-2"]["reward"], 0.0);
}

#[test]
fn task_without_source_or_reward_is_an_error_and_the_run_goes_on() {
    let fx = fixture();
    let t = fx.dataset.join("ghost__ghost-1");
    write(&t, "task.toml", "version = \"1.0\"\n");
    write(&t, "instruction.md", "x");
    write(&t, "tests/test.sh", "true\n");
    let nr = fx.dataset.join("sh__greet-3");
    std::fs::create_dir_all(&nr).unwrap();
    for f in ["task.toml", "instruction.md", "environment/Dockerfile"] {
        write(&nr, f, &std::fs::read_to_string(fx.dataset.join("sh__greet-2").join(f)).unwrap());
    }
    write(&nr, "tests/test.sh", "echo no reward\n");
    let insts = load_instances(&fx.dataset).unwrap();
    let out = tempfile::tempdir().unwrap();
    let opts = GradeOptions {
        run_id: "r".into(),
        output: out.path().into(),
        workers: 1,
        shard: None,
        exec: exec(&fx, out.path()),
    };
    let s = grade(insts.clone(), preds(&insts, GOLD), &opts).unwrap();
    let rows = read_results(&s.results_path);
    let status = |id: &str| rows.iter().find(|r| r["instance_id"] == id).unwrap()["status"].clone();
    assert_eq!(status("ghost__ghost-1"), "error_repo_missing");
    assert_eq!(status("sh__greet-3"), "error");
    assert_eq!(status("sh__greet-1"), "resolved");
    let err = rows.iter().find(|r| r["instance_id"] == "sh__greet-3").unwrap()["error"].to_string();
    assert!(err.contains("no reward.json or reward.txt"), "{err}");
}

/// An agent stand-in: checks it sees only the instruction and the repository, then fixes it.
struct CheckingSolver;

impl Solver for CheckingSolver {
    fn model_name(&self) -> String {
        "checker".into()
    }
    fn solve(&self, inst: &SweInstance, ws: &Path, _attempt: usize) -> anyhow::Result<Solution> {
        anyhow::ensure!(inst.problem_statement.starts_with("greet() misspells"), "prompt is instruction.md");
        anyhow::ensure!(!ws.join("tests/greet.t.sh").exists(), "hidden test visible in the workspace");
        anyhow::ensure!(!ws.join("tests/test.sh").exists() && !ws.join("instance.json").exists());
        std::fs::write(ws.join("lib.sh"), "greet() { echo \"Hello, $1\"; }\n")?;
        Ok(Solution { exit_reason: "submitted".into(), ..Default::default() })
    }
}

#[test]
fn eval_run_solves_harbor_tasks_and_verifies_after_the_agent() {
    let fx = fixture();
    let insts = load_instances(&fx.dataset.join("sh__greet-1")).unwrap();
    assert_eq!(insts.len(), 1);
    let out = tempfile::tempdir().unwrap();
    let opts = SolveRunOptions {
        run_id: "solve".into(),
        output: out.path().into(),
        workers: 1,
        attempts: 1,
        shard: None,
        exec: exec(&fx, out.path()),
    };
    let (s, m) = solve_and_grade(insts, &CheckingSolver, &opts).unwrap();
    let rows = read_results(&s.results_path);
    let log = out.path().join("logs/run_evaluation/solve/attempt-0/checker/sh__greet-1");
    let (o, sh) = (log.join("test_output.txt"), log.join("test.sh"));
    let (o, sh) = (std::fs::read_to_string(o).unwrap_or_default(), std::fs::read_to_string(sh).unwrap_or_default());
    assert_eq!(s.resolved, 1, "{rows:?}\n{o}\n{sh}");
    assert_eq!(m.pass_at_k, 1.0);
}

#[test]
fn eval_grade_grades_a_harbor_folder_with_gold_from_instance_json() {
    use frognano_swe::eval::{ExecConfig, GradeJob};
    let fx = fixture();
    let out = tempfile::tempdir().unwrap();
    let job = GradeJob {
        exec: ExecConfig {
            repos: Some(fx.repos.clone()),
            output: out.path().to_path_buf(),
            run_id: "cli".into(),
            isolation: exec(&fx, out.path()).isolation,
            ..ExecConfig::new(fx.dataset.join("sh__greet-1"))
        },
        predictions: "gold".into(),
    };
    frognano_swe::eval::grade(&job, &frognano_swe::progress::NoProgress).unwrap();
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("gold.cli.json")).unwrap()).unwrap();
    assert_eq!(report["resolved_ids"], json!(["sh__greet-1"]), "{report}");
}
