//! `frognano synth … --ray` and `frognano synth batch … --ray` on a real Ray cluster of two
//! nodes on this machine (`scripts/ray-local-cluster.sh`):
//!
//! - a package's candidates validated as Ray units leave the verdicts and tasks of the local
//!   run (every candidate recorded once, the same accepted tasks with the same tests and
//!   patches), both nodes take units, and a rerun validates nothing again;
//! - killing the worker node while it validates a candidate still records every candidate
//!   exactly once, with the local run's verdicts;
//! - a batch of two packages, each package one unit, merges the same tasks and reports the
//!   same rows as the local batch.
//!
//! Needs `.venv-ray` (scripts/setup-ray.sh, run by scripts/ci-setup.sh); with
//! FROGNANO_REQUIRE_FIXTURES set (CI) a missing Ray fails the test instead of skipping it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use frognano_testkit::ray::{logging_frognano, lose_worker_node_mid_run, ray_python, units_started_twice, RayCluster};
use frognano_testkit::{copy_fixture_dir, git};
use serde_json::Value;

fn fixture(name: &str, dest: &Path) -> PathBuf {
    copy_fixture_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../synth/tests/fixtures").join(name), dest);
    std::fs::write(dest.join(".gitignore"), "__pycache__/\nnode_modules\n").unwrap();
    git(dest, &["init", "-q"]);
    git(dest, &["add", "-A"]);
    git(dest, &["commit", "-q", "-m", "fixture"]);
    dest.to_path_buf()
}

fn frognano(args: &[&str], ray: Option<(&RayCluster, &Path)>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_frognano"));
    cmd.args(args);
    if let Some((cluster, python)) = ray {
        cmd.args(["--ray", &cluster.address]).env("FROGNANO_RAY_PYTHON", python);
        cmd.env("FROGNANO_RAY_NODE_IP", &cluster.head_ip);
    }
    let bwrap = frognano_sandbox::Sandbox::bubblewrap_available();
    if !frognano_testkit::available_or_skip("bubblewrap", "synth --ray validates unconfined", bwrap) {
        cmd.arg("--no-sandbox");
    }
    cmd
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display()))).collect()
}

/// Candidate key → its verdict (outcome and rejection), from candidates.jsonl; panics on a
/// candidate recorded twice.
fn verdicts(out: &Path) -> BTreeMap<String, (Value, Value)> {
    let mut map = BTreeMap::new();
    for v in jsonl(&out.join("candidates.jsonl")) {
        let key = v["key"].as_str().unwrap().to_string();
        let verdict = (v["outcome"].clone(), v["rejection"].clone());
        assert!(map.insert(key.clone(), verdict).is_none(), "candidate {key} recorded twice");
    }
    map
}

/// Instance id → what a task's grading rests on (tests and patch); panics on a task written
/// twice. (Paths such as `repo_path` name each run's own folder and are left out.)
fn tasks(file: &Path) -> BTreeMap<String, (Value, Value, Value)> {
    let mut map = BTreeMap::new();
    for v in jsonl(file) {
        let id = v["instance_id"].as_str().unwrap().to_string();
        let task = (v["FAIL_TO_PASS"].clone(), v["PASS_TO_PASS"].clone(), v["patch"].clone());
        assert!(map.insert(id.clone(), task).is_none(), "task {id} written twice");
    }
    map
}

#[test]
fn synth_candidates_and_batch_packages_through_ray_match_the_local_runs() {
    let Some(python) = ray_python("synth --ray on a local cluster") else { return };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let starts = root.join("starts");
    let wrapper = logging_frognano(root, Path::new(env!("CARGO_BIN_EXE_frognano")), &starts, 0.3);
    let cluster = RayCluster::start(&root.join("cluster"), &python, 1, 2, &[("FROGNANO_BIN", &wrapper)]);
    let ray = Some((&cluster, python.as_path()));
    let repo = fixture("pyproj", &root.join("pyproj"));
    let synth = |out: &str| -> Vec<String> {
        let out = root.join(out);
        let mut args = vec!["synth".to_string(), repo.to_string_lossy().into_owned(), "--out".into()];
        args.push(out.to_string_lossy().into_owned());
        for a in ["--python", "python3", "--seed", "1", "--max-candidates", "12", "--workers", "2"] {
            args.push(a.into());
        }
        args
    };
    let run = |out: &str, ray: Option<(&RayCluster, &Path)>| {
        let args = synth(out);
        frognano(&args.iter().map(String::as_str).collect::<Vec<_>>(), ray)
    };

    // One package's candidates, locally and as Ray units.
    ok(run("local", None).output().unwrap());
    let local = verdicts(&root.join("local"));
    assert_eq!(local.len(), 12);
    let local_tasks = tasks(&root.join("local/tasks.jsonl"));
    assert!(local_tasks.len() >= 2, "the fixture yields tasks: {local:?}");
    let stdout = ok(run("ray", ray).output().unwrap());
    assert!(stdout.contains(&format!("accepted {} of 12 candidates", local_tasks.len())), "{stdout}");
    assert_eq!(verdicts(&root.join("ray")), local);
    assert_eq!(tasks(&root.join("ray/tasks.jsonl")), local_tasks);
    let placed = jsonl(&root.join("ray/placements.jsonl"));
    let nodes: BTreeSet<&str> = placed.iter().filter_map(|p| p["node"].as_str()).collect();
    assert_eq!((placed.len(), nodes.len()), (12, 2), "both nodes validate: {placed:?}");
    // A rerun finds every candidate decided.
    let starts_before = std::fs::read_to_string(&starts).unwrap();
    let again = ok(run("ray", ray).output().unwrap());
    assert!(again.contains("accepted 0 of 0 candidates (12 skipped as done)"), "{again}");
    assert_eq!(std::fs::read_to_string(&starts).unwrap(), starts_before, "a decided candidate ran again");

    // A lost node while it validates a candidate.
    std::fs::write(&starts, "").unwrap();
    let mut child = run("kill", ray).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let (ok_run, stderr) = lose_worker_node_mid_run(&cluster, &mut child, &starts, 2);
    assert!(ok_run, "{stderr}");
    assert_eq!(verdicts(&root.join("kill")), local, "every candidate once, with the local verdicts");
    assert_eq!(tasks(&root.join("kill/tasks.jsonl")), local_tasks);
    let twice = units_started_twice(&starts);
    assert!(
        !twice.is_empty(),
        "no candidate of the killed node ran again: {}",
        std::fs::read_to_string(&starts).unwrap()
    );

    // A batch of two packages (the head alone is left), each package one unit.
    fixture("jsnode", &root.join("js-a"));
    fixture("jsnode", &root.join("js-b"));
    let manifest = root.join("manifest.txt");
    std::fs::write(&manifest, "js-a\njs-b\n").unwrap();
    let batch = |out: &str, ray: Option<(&RayCluster, &Path)>| {
        let out = root.join(out);
        let m = manifest.to_str().unwrap();
        let args = ["synth", "batch", m, "--out", out.to_str().unwrap(), "--max-tasks", "2", "--max-candidates", "8"];
        ok(frognano(&args, ray).output().unwrap());
        let rows: BTreeMap<String, (Value, Value, Value)> = jsonl(&out.join("batch.jsonl"))
            .into_iter()
            .map(|r| {
                (
                    r["spec"].as_str().unwrap().to_string(),
                    (r["outcome"].clone(), r["tasks"].clone(), r["candidates_tried"].clone()),
                )
            })
            .collect();
        (rows, tasks(&out.join("tasks.jsonl")))
    };
    let (local_rows, local_batch_tasks) = batch("batch-local", None);
    assert_eq!(local_rows.len(), 2);
    assert!(!local_batch_tasks.is_empty(), "{local_rows:?}");
    let (ray_rows, ray_batch_tasks) = batch("batch-ray", ray);
    assert_eq!(ray_rows, local_rows);
    assert_eq!(ray_batch_tasks, local_batch_tasks);
}
