//! `synth batch` over small local projects: outcomes land in the fixed failure categories,
//! and a batch killed mid-way (SIGKILL of a child process running it) resumes without
//! rerunning finished packages or writing any task or package line twice.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use frognano_sandbox::Isolation;
use frognano_swe::progress::NoProgress;
use frognano_synth::batch::{parse_manifest, run_batch, BatchOptions, PackageYield};
use frognano_synth::intake::Source;
use frognano_synth::pipeline::{GenOptions, SynthOptions};
use frognano_testkit::{copy_fixture_dir as copy_dir, git};

const CHILD_ENV: &str = "FROGNANO_BATCH_TEST_DIR";

fn commit(dir: &Path) {
    std::fs::write(dir.join(".gitignore"), "node_modules\n").unwrap();
    git(dir, &["init", "-q"]);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "fixture"]);
}

fn fixture(name: &str, dest: &Path) {
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name), dest);
    commit(dest);
}

/// Five packages: two good JavaScript projects, a Go module, one without tests and one
/// whose only test always fails.
fn write_manifest(root: &Path) -> PathBuf {
    fixture("jsnode", &root.join("js-a"));
    fixture("jsnode", &root.join("js-b"));
    fixture("gomod", &root.join("go-c"));
    let bare = root.join("no-tests");
    std::fs::create_dir_all(bare.join("src")).unwrap();
    std::fs::write(bare.join("package.json"), r#"{"name":"bare","version":"1.0.0","scripts":{"test":"node --test"}}"#)
        .unwrap();
    std::fs::write(bare.join("src/index.js"), "exports.f = (a) => a + 1;\n").unwrap();
    commit(&bare);
    let failing = root.join("failing");
    fixture("jsnode", &failing);
    std::fs::write(
        failing.join("test/index.test.js"),
        "const test = require('node:test');\nconst assert = require('node:assert');\ntest('always', () => { assert.strictEqual(1, 2); });\n",
    )
    .unwrap();
    git(&failing, &["commit", "-q", "-am", "a failing test"]);
    let manifest = root.join("manifest.txt");
    std::fs::write(&manifest, "# batch test\njs-a 120s\nno-tests\njs-b 2m\nfailing\ngo-c\n").unwrap();
    manifest
}

fn options(root: &Path) -> BatchOptions {
    let entries = parse_manifest(&root.join("manifest.txt"), Duration::from_secs(120)).unwrap();
    BatchOptions {
        entries,
        out: root.join("out"),
        jobs: 1,
        template: SynthOptions {
            source: Source::Local { path: PathBuf::from("."), commit: None },
            out: PathBuf::new(),
            gen: GenOptions { seed: 1, min_complexity: 3, operators: None, max_candidates: 30 },
            workers: 1,
            max_tasks: Some(2),
            combine: 0,
            max_combos: 0,
            min_timeout: Duration::from_secs(60),
            max_f2p_fraction: 0.5,
            isolation: Isolation::Bubblewrap,
            python: None,
            harbor: None,
            issue_model: None,
        },
        suite_limit: Duration::from_secs(120),
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
}

/// Runs the batch when started by [`batch_resumes_after_a_kill_and_counts_failures`] as
/// its child process; does nothing otherwise.
#[test]
#[ignore = "helper: run in a child process by batch_resumes_after_a_kill_and_counts_failures"]
fn batch_child() {
    let Ok(root) = std::env::var(CHILD_ENV) else { return };
    run_batch(&options(Path::new(&root)), &NoProgress).unwrap();
}

#[test]
fn batch_resumes_after_a_kill_and_counts_failures() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    write_manifest(root);
    let out = root.join("out");
    // A child runs the batch one package at a time and is killed once the first package is
    // recorded, while the next one is under way.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["batch_child", "--exact", "--ignored", "--nocapture"])
        .env(CHILD_ENV, root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while lines(&out.join("batch.jsonl")).is_empty() {
        assert!(child.try_wait().unwrap().is_none(), "the child batch ended before it could be killed");
        assert!(started.elapsed() < Duration::from_secs(300), "no package finished in the child");
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before_kill = lines(&out.join("batch.jsonl"));
    let tasks_at_kill = lines(&out.join("tasks.jsonl")).len();
    assert!(before_kill.len() < 5, "the kill came too late to test resuming: {before_kill:?}");
    assert!(tasks_at_kill >= 2, "the first package's tasks are merged when it is recorded");

    let mut opts = options(root);
    opts.jobs = 2;
    let report = run_batch(&opts, &NoProgress).unwrap();
    let after = lines(&out.join("batch.jsonl"));
    // Finished packages were not run again: their lines stay, each package has one line.
    assert_eq!(&after[..before_kill.len()], &before_kill[..]);
    assert_eq!(after.len(), 5, "{after:#?}");
    let rows: Vec<PackageYield> = after.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    let outcome = |spec: &str| rows.iter().find(|r| r.spec == spec).unwrap().outcome.clone();
    assert_eq!(outcome("js-a"), "ok");
    assert_eq!(outcome("js-b"), "ok");
    assert_eq!(outcome("go-c"), "ok");
    assert_eq!(outcome("no-tests"), "no_tests_shipped");
    assert_eq!(outcome("failing"), "baseline_failing");
    // Every task once in the merged file, as many as the packages report.
    let ids: Vec<String> = lines(&out.join("tasks.jsonl"))
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["instance_id"].as_str().unwrap().to_string())
        .collect();
    let unique: std::collections::HashSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "a task was merged twice");
    assert_eq!(ids.len(), rows.iter().map(|r| r.tasks).sum::<usize>());
    assert_eq!(ids.len(), 6, "2 tasks from each good package");
    // No candidate of a package was decided twice across the kill.
    for r in &rows {
        let keys: Vec<String> = lines(&r.dir.join("candidates.jsonl"))
            .iter()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["key"].as_str().unwrap().to_string())
            .collect();
        let unique: std::collections::HashSet<&String> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len(), "{}: a candidate validated twice", r.spec);
    }
    assert_eq!(report.packages.len(), 5);
    assert_eq!(report.outcomes["ok"], 3);
    assert!(report.unfinished.is_empty());
    assert!(out.join("yield.json").is_file());
    // A third run has nothing left to do and changes nothing.
    let again = run_batch(&opts, &NoProgress).unwrap();
    assert_eq!(lines(&out.join("batch.jsonl")), after);
    assert_eq!(again.tasks, 6);
}
