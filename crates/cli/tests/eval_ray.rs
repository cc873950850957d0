//! `frognano eval … --ray` on a real Ray cluster of two nodes on this machine
//! (`scripts/ray-local-cluster.sh`: `ray start --head` plus a worker node, each in a process
//! group of its own). Twenty instances of a bash project, solved by a scripted solver that
//! resolves a third, breaks a third and leaves a third alone:
//!
//! - through Ray, both nodes take units and the run leaves what the local run leaves: the
//!   same result rows, predictions and per-instance reports, and `eval grade --ray` writes a
//!   run report identical byte for byte to the local `eval grade`'s; a run cut short (its
//!   last five rows gone) is completed by a rerun that runs those five units and no others;
//!   units bigger than any node are refused instead of waiting for ever;
//! - killing the worker node (its process group, by id) while it runs a unit still finishes
//!   the run with every instance recorded exactly once, the lost units run again on the head;
//!   a rerun afterwards finds nothing left to do.
//!
//! Needs `.venv-ray` (scripts/setup-ray.sh, run by scripts/ci-setup.sh); with
//! FROGNANO_REQUIRE_FIXTURES set (CI) a missing Ray fails the test instead of skipping it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use frognano_testkit::ray::{lose_worker_node_mid_run, units_started_twice, RayCluster as Cluster};
use frognano_testkit::{bash_project, diff_for};
use serde_json::{json, Value};

const INSTANCES: usize = 20;

fn ray_python() -> Option<PathBuf> {
    frognano_testkit::ray::ray_python("eval --ray on a local cluster")
}

fn start_cluster(dir: &Path, python: &Path) -> Cluster {
    Cluster::start(dir, python, 1, 2, &[])
}

/// Twenty instances of one bash project whose `greet` misspells "Hello".
fn instances(root: &Path) -> PathBuf {
    let repo = root.join("greet");
    let base = bash_project(&repo, "greet() { echo \"Helo, $1\"; }\n");
    let gold = diff_for(&repo, "lib.sh", "greet() { echo \"Hello, $1\"; }\n");
    let test_patch = diff_for(&repo, "tests/greet.t.sh", "TestGreet() { [ \"$(greet Bob)\" = \"Hello, Bob\" ]; }\n");
    let lines: String = (1..=INSTANCES)
        .map(|n| {
            let line = json!({
                "instance_id": format!("sh__greet-{n}"), "repo": "sh/greet", "base_commit": base,
                "repo_path": repo.to_string_lossy(), "patch": gold, "test_patch": test_patch,
                "problem_statement": "greet prints Helo", "version": "0.1", "log_parser": "gotest",
                "test_cmd": "bash run_tests.sh", "FAIL_TO_PASS": ["TestGreet"], "PASS_TO_PASS": ["TestTrue"],
            });
            format!("{line}\n")
        })
        .collect();
    let path = root.join("instances.jsonl");
    std::fs::write(&path, lines).unwrap();
    path
}

/// The scripted solver: notes "<instance> <process group>" in `starts` when it starts, waits
/// `sleep` seconds, then fixes (n % 3 == 1), breaks (n % 3 == 2) or leaves (n % 3 == 0) the
/// bug of instance n.
fn solver(starts: &Path, sleep: f64) -> String {
    format!(
        "n=${{FROGNANO_INSTANCE_ID##*-}}; echo \"$FROGNANO_INSTANCE_ID $(ps -o pgid= $$ | tr -d ' ')\" >> {}; \
         sleep {sleep}; case $((n % 3)) in 1) sed -i s/Helo/Hello/ lib.sh;; 2) sed -i s/Helo/Hallo/ lib.sh;; esac",
        starts.display()
    )
}

fn frognano(python: &Path, cluster: Option<&Cluster>, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_frognano"));
    cmd.args(args).env("FROGNANO_RAY_PYTHON", python);
    if let Some(c) = cluster {
        cmd.env("FROGNANO_RAY_NODE_IP", &c.head_ip);
    }
    let bwrap = frognano_sandbox::Sandbox::bubblewrap_available();
    if !frognano_testkit::available_or_skip("bubblewrap", "eval --ray grades unconfined", bwrap) {
        cmd.arg("--no-sandbox");
    }
    cmd
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
        .collect()
}

/// Rows keyed by instance id, without the timings (which differ from run to run); panics on
/// an instance recorded twice.
fn by_id(rows: Vec<Value>) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for mut r in rows {
        let id = r["instance_id"].as_str().unwrap().to_string();
        for k in ["seconds", "test_seconds"] {
            r.as_object_mut().unwrap().remove(k);
        }
        assert!(out.insert(id.clone(), r).is_none(), "{id} recorded twice");
    }
    out
}

/// Every file of every instance folder under `dir`, by relative path, with the text of the
/// reports and patches (the logs name each attempt's temporary workspace, so for them only
/// their presence is compared).
fn instance_files(dir: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                let text = if rel.ends_with("report.json") || rel.ends_with("patch.diff") {
                    std::fs::read_to_string(&p).unwrap()
                } else {
                    String::new()
                };
                out.insert(rel, text);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

#[test]
fn a_ray_cluster_runs_every_instance_once_and_leaves_what_the_local_run_leaves() {
    let Some(python) = ray_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cluster = start_cluster(&root.join("cluster"), &python);
    let set = instances(root);
    let set = set.to_str().unwrap();
    let run = |out: &str, starts: &str, sleep: f64, ray: bool| -> Command {
        let out = root.join(out);
        let mut args = vec!["eval", "run", "--instances", set, "--run-id", "r", "--timeout", "60"];
        args.extend(["--output", out.to_str().unwrap()]);
        let solver = solver(&root.join(starts), sleep);
        let mut cmd = frognano(&python, Some(&cluster), &args);
        cmd.args(["--solver-cmd", &solver]);
        if ray {
            cmd.args(["--ray", &cluster.address]);
        } else {
            cmd.args(["--workers", "2"]);
        }
        cmd
    };
    let run_dir = |out: &str| root.join(out).join("logs/run_evaluation/r");

    // The same run, locally and through Ray.
    let local_stdout = ok(run("local", "starts-local", 0.0, false).output().unwrap());
    // A short wait per unit so that the worker node, whose first Ray worker process starts
    // cold, still finds units left to take on a loaded machine.
    let ray_stdout = ok(run("ray", "starts-ray", 0.3, true).output().unwrap());
    let summary = |s: &str| s.lines().find(|l| l.starts_with("resolved")).unwrap().to_string();
    assert_eq!(summary(&ray_stdout), summary(&local_stdout));
    assert!(summary(&local_stdout).starts_with("resolved 7/20 instances"), "{local_stdout}");
    let local_rows = by_id(jsonl(&run_dir("local").join("results.jsonl")));
    let ray_rows = by_id(jsonl(&run_dir("ray").join("results.jsonl")));
    assert_eq!(ray_rows.len(), INSTANCES);
    assert_eq!(ray_rows, local_rows);
    let statuses: BTreeSet<&str> = ray_rows.values().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, BTreeSet::from(["empty_patch", "resolved", "unresolved"]));
    assert_eq!(by_id(jsonl(&run_dir("ray").join("preds.jsonl"))), by_id(jsonl(&run_dir("local").join("preds.jsonl"))));
    let (ray_files, local_files) =
        (instance_files(&run_dir("ray").join("attempt-0")), instance_files(&run_dir("local").join("attempt-0")));
    assert_eq!(ray_files.keys().collect::<Vec<_>>(), local_files.keys().collect::<Vec<_>>());
    for (name, text) in &local_files {
        assert!(ray_files[name] == *text, "{name} differs:\n{}\nlocally:\n{text}", ray_files[name]);
    }
    assert_eq!(ray_files.keys().filter(|k| k.ends_with("report.json")).count(), 14, "{:?}", ray_files.keys());
    let placements = jsonl(&run_dir("ray").join("placements.jsonl"));
    let nodes: BTreeSet<&str> = placements.iter().filter_map(|p| p["node"].as_str()).collect();
    assert_eq!((placements.len(), nodes.len()), (INSTANCES, 2), "both nodes take units: {placements:?}");

    // A run cut short (as if the driver died after 15 answers): the rerun runs the other five,
    // and only those.
    let results_path = run_dir("ray").join("results.jsonl");
    for file in [&results_path, &run_dir("ray").join("preds.jsonl")] {
        let kept: Vec<String> = std::fs::read_to_string(file).unwrap().lines().take(15).map(String::from).collect();
        std::fs::write(file, kept.join("\n") + "\n").unwrap();
    }
    let starts_before = std::fs::read_to_string(root.join("starts-ray")).unwrap().lines().count();
    ok(run("ray", "starts-ray", 0.0, true).output().unwrap());
    let starts_after = std::fs::read_to_string(root.join("starts-ray")).unwrap().lines().count();
    assert_eq!(starts_after - starts_before, 5, "the rerun ran exactly the five unrecorded units");
    assert_eq!(by_id(jsonl(&results_path)), local_rows);
    assert_eq!(by_id(jsonl(&run_dir("ray").join("preds.jsonl"))).len(), INSTANCES);

    // Grading those predictions: the swebench run report is the same file either way.
    let preds = run_dir("ray").join("preds.jsonl");
    let grade = |out: &str, ray: bool| {
        let out = root.join(out);
        let args = ["eval", "grade", "--instances", set, "--run-id", "g", "--timeout", "60"];
        let mut cmd = frognano(&python, Some(&cluster), &args);
        cmd.arg("--predictions").arg(&preds).arg("--output").arg(&out);
        if ray {
            cmd.args(["--ray", &cluster.address]);
        }
        ok(cmd.output().unwrap());
        std::fs::read_to_string(out.join("command.g.json")).unwrap()
    };
    let (local_report, ray_report) = (grade("grade-local", false), grade("grade-ray", true));
    // Units bigger than any node are refused, not left waiting for ever.
    let mut too_big =
        frognano(&python, Some(&cluster), &["eval", "grade", "--instances", set, "--predictions", "gold"]);
    too_big.arg("--output").arg(root.join("too-big")).args(["--ray", &cluster.address, "--ray-cpus", "4"]);
    let o = too_big.output().unwrap();
    let msg = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && msg.contains("no node of the cluster can run a unit of --ray-cpus 4"), "{msg}");
    assert_eq!(ray_report, local_report);
    assert!(ray_report.contains("\"resolved_instances\": 7"), "{ray_report}");

    // A lost node: the worker node is killed while it runs a unit.
    let starts = root.join("starts-kill");
    let mut child = run("kill", "starts-kill", 0.6, true).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let (ok_run, stderr) = lose_worker_node_mid_run(&cluster, &mut child, &starts, 2);
    assert!(ok_run, "{stderr}");
    let kill_rows = by_id(jsonl(&run_dir("kill").join("results.jsonl")));
    assert_eq!(kill_rows, local_rows, "every instance once, with the local run's results");
    assert_eq!(by_id(jsonl(&run_dir("kill").join("preds.jsonl"))).len(), INSTANCES);
    // The unit the worker node was running when it died started again on the head.
    let started = std::fs::read_to_string(&starts).unwrap();
    assert!(!units_started_twice(&starts).is_empty(), "no unit of the killed node ran again: {started}");

    // A rerun finds every unit finished: nothing runs, nothing is appended.
    ok(run("kill", "starts-kill", 0.0, true).output().unwrap());
    assert_eq!(jsonl(&run_dir("kill").join("results.jsonl")).len(), INSTANCES);
    assert_eq!(std::fs::read_to_string(&starts).unwrap(), started, "a finished unit ran again");
}

#[test]
fn no_address_or_an_unreachable_cluster_is_a_clear_error_and_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let set = instances(dir.path());
    let out = dir.path().join("out");
    let grade = |ray: &[&str], python: &Path| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_frognano"));
        cmd.args(["eval", "grade", "--predictions", "gold", "--instances", set.to_str().unwrap()]);
        cmd.arg("--output").arg(&out).args(ray).env("FROGNANO_RAY_PYTHON", python).env_remove("RAY_ADDRESS");
        let o = cmd.output().unwrap();
        assert!(!o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
        String::from_utf8(o.stderr).unwrap()
    };
    let msg = grade(&["--ray"], Path::new("python3"));
    assert_eq!(msg.trim(), "error: --ray needs a cluster ADDRESS (or RAY_ADDRESS), got none");
    let msg = grade(&["--ray", "127.0.0.1:9"], Path::new("/no/such/python"));
    assert!(msg.contains("FROGNANO_RAY_PYTHON") && msg.contains("/no/such/python"), "{msg}");
    let Some(python) = ray_python() else { return };
    // Port 1 on the loopback: nothing listens there; `ray.init` alone would retry for minutes.
    let msg = grade(&["--ray", "127.0.0.1:1"], &python);
    assert!(msg.contains("cannot reach the Ray cluster at 127.0.0.1:1"), "{msg}");
    assert!(msg.contains("20 of 20 unit(s) got no answer"), "{msg}");
    let results = out.join("logs/run_evaluation/frognano/results.jsonl");
    assert!(jsonl(&results).is_empty(), "nothing is recorded for units that never ran");
}
