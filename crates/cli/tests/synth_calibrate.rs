//! `frognano synth` then `frognano synth calibrate` end to end through the binary: tasks are
//! synthesized from the small Python fixture project, then attempted K times by a scripted
//! solver (`--solver-cmd`). What a user reads changes with the solver: a solver that applies
//! the fix puts every task above the band (too easy: the controller asks for harder knobs),
//! one that does nothing puts them below it (easier knobs), one that fixes every other attempt
//! keeps them in the band; the printed table, the band line and `estimates.json` agree.

use std::path::{Path, PathBuf};
use std::process::Command;

use frognano_testkit::{copy_fixture_dir, git};
use serde_json::Value;

/// Runs the binary with `args`; asserts success and returns stdout.
fn frognano(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_frognano")).args(args).output().unwrap();
    assert!(o.status.success(), "frognano {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// `--no-sandbox` where bubblewrap is missing (a SKIPPED line; a failure under
/// FROGNANO_REQUIRE_FIXTURES), nothing where it runs.
fn sandbox_flag() -> Vec<&'static str> {
    let bwrap = frognano_sandbox::Sandbox::bubblewrap_available();
    if frognano_testkit::available_or_skip("bubblewrap", "synth calibrate through the binary", bwrap) {
        vec![]
    } else {
        vec!["--no-sandbox"]
    }
}

/// Two tasks synthesized by `frognano synth` from the pyproj fixture; returns tasks.jsonl.
fn synthesize(root: &Path) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../synth/tests/fixtures/pyproj");
    let repo = root.join("inventory");
    copy_fixture_dir(&fixture, &repo);
    std::fs::write(repo.join(".gitignore"), "__pycache__/\n").unwrap();
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "fixture"]);
    let out = root.join("synth-out");
    let mut args = vec!["synth", repo.to_str().unwrap(), "--out", out.to_str().unwrap(), "--python", "python3"];
    args.extend(["--max-tasks", "2", "--max-candidates", "10", "--seed", "1"]);
    args.extend(sandbox_flag());
    let stdout = frognano(&args);
    assert!(stdout.contains("accepted 2 of "), "{stdout}");
    out.join("tasks.jsonl")
}

/// `frognano synth calibrate` of `tasks` with `solver`, 4 attempts per task, into `dir`;
/// returns stdout and the estimate store.
fn calibrate(tasks: &Path, dir: &Path, solver: &str) -> (String, Value) {
    let estimates = dir.join("estimates.json");
    let output = dir.join("out");
    let mut args = vec!["synth", "calibrate", "--tasks", tasks.to_str().unwrap(), "--attempts", "4"];
    args.extend(["--estimates", estimates.to_str().unwrap(), "--output", output.to_str().unwrap()]);
    args.extend(["--solver-cmd", solver, "--timeout", "60", "--workers", "2"]);
    args.extend(sandbox_flag());
    let stdout = frognano(&args);
    assert!(stdout.contains(&format!("estimates: {}", estimates.display())), "{stdout}");
    let store: Value = serde_json::from_str(&std::fs::read_to_string(&estimates).unwrap()).unwrap();
    (stdout, store)
}

/// The task-table rows of calibrate's stdout: (id, p_hat, n, state).
fn table(stdout: &str) -> Vec<(String, String, String, String)> {
    stdout
        .lines()
        .skip_while(|l| !l.starts_with("task "))
        .skip(1)
        .take_while(|l| !l.starts_with("band "))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 4, "{l}");
            (f[0].to_string(), f[1].to_string(), f[2].to_string(), f[3].to_string())
        })
        .collect()
}

/// Checks every task of the table shows `p_hat` over 4 attempts, and that the store counts
/// `successes` of the 4 for each.
fn check(stdout: &str, store: &Value, ids: &[String], p_hat: &str, successes: f64) {
    let rows = table(stdout);
    assert_eq!(rows.iter().map(|r| r.0.clone()).collect::<Vec<_>>(), ids, "{stdout}");
    for (id, p, n, state) in &rows {
        assert_eq!((p.as_str(), n.as_str(), state.as_str()), (p_hat, "4.0", "Active"), "{id}: {stdout}");
        let e = &store["tasks"][id];
        assert_eq!((e["successes"].as_f64(), e["failures"].as_f64()), (Some(successes), Some(4.0 - successes)), "{e}");
    }
}

#[test]
fn calibration_tells_a_fixing_solver_from_a_no_op_and_a_half_right_one() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = synthesize(dir.path());
    let ids: Vec<String> = std::fs::read_to_string(&tasks)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["instance_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 2);
    // The fixing solver applies the task's own fix (its gold patch), found by instance id.
    let fix = dir.path().join("fix.sh");
    std::fs::write(
        &fix,
        format!(
            "python3 -c 'import json, os, sys\nfor t in map(json.loads, open(sys.argv[1])):\n    \
             if t[\"instance_id\"] == os.environ[\"FROGNANO_INSTANCE_ID\"]: sys.stdout.write(t[\"patch\"])' {} | git apply\n",
            tasks.display()
        ),
    )
    .unwrap();
    let fixer = format!("bash {}", fix.display());

    let (stdout, store) = calibrate(&tasks, &dir.path().join("fixer"), &fixer);
    // 4 of 4 solved: Beta(1,1) mean 5/6, above the [0.2, 0.8] band.
    check(&stdout, &store, &ids, "0.83", 4.0);
    assert!(
        stdout.contains("band [0.2, 0.8]: 0 in band, 2 above, 0 below, 0 calibrating, 0 new; direction Harder"),
        "{stdout}"
    );
    assert!(stdout.contains("): mean pass rate 0.83 over "), "{stdout}");
    let next = stdout.lines().find(|l| l.starts_with("next synthesis: frognano synth … ")).expect("a next line");
    let harder = next.to_string();
    // Every attempt is a graded result row: 2 tasks × 4 attempts, all resolved.
    let results = dir.path().join("fixer/out/logs/run_evaluation/calibrate-v0/results.jsonl");
    let rows: Vec<Value> =
        std::fs::read_to_string(&results).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 8);
    assert!(rows.iter().all(|r| r["resolved"] == true), "{rows:?}");
    // The same policy version again re-reads its rows instead of counting them twice.
    let (again, store) = calibrate(&tasks, &dir.path().join("fixer"), &fixer);
    check(&again, &store, &ids, "0.83", 4.0);

    let (stdout, store) = calibrate(&tasks, &dir.path().join("no-op"), "true");
    // 0 of 4: mean 1/6, below the band.
    check(&stdout, &store, &ids, "0.17", 0.0);
    assert!(stdout.contains("0 in band, 0 above, 2 below, 0 calibrating, 0 new; direction Easier"), "{stdout}");
    let easier = stdout.lines().find(|l| l.starts_with("next synthesis: ")).expect("a next line");
    assert_ne!(easier, harder, "too easy and too hard tasks ask for the same knobs");

    let half = format!("if [ $((FROGNANO_ATTEMPT % 2)) = 1 ]; then {fixer}; fi");
    let (stdout, store) = calibrate(&tasks, &dir.path().join("half"), &half);
    // 2 of 4: mean 1/2, in the band: the tasks stay in the pool and the knobs stay.
    check(&stdout, &store, &ids, "0.50", 2.0);
    assert!(stdout.contains("2 in band, 0 above, 0 below, 0 calibrating, 0 new; direction Hold"), "{stdout}");
}
