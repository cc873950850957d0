//! `frognano train --toy … --ray` on a real Ray cluster of two nodes on this machine
//! (`scripts/ray-local-cluster.sh`). Each step's rollout groups are units: a worker rebuilds
//! the toy policy, loads the step's weights from the run folder and rolls the group out with
//! the seeds the trainer chose.
//!
//! - The run through Ray equals the local run under the same seed: the same metrics (timings
//!   aside) and the same rollouts, token for token and logprob for logprob, so the updates
//!   are the same; both nodes take groups.
//! - Killing the worker node while it holds a group still completes every step, each group
//!   rolled out (recorded) exactly once, with the local run's results.
//!
//! Needs `.venv-ray` (scripts/setup-ray.sh, run by scripts/ci-setup.sh); with
//! FROGNANO_REQUIRE_FIXTURES set (CI) a missing Ray fails the test instead of skipping it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use frognano_rl::rollout::Rollout;
use frognano_testkit::ray::{logging_frognano, lose_worker_node_mid_run, ray_python, units_started_twice, RayCluster};
use serde_json::Value;

const STEPS: &str = "3";

fn train(out: &Path, ray: Option<(&RayCluster, &Path)>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_frognano"));
    cmd.args(["train", "--toy", "--steps", STEPS, "--tasks-per-step", "4", "--group-size", "4", "--seed", "7"]);
    cmd.arg("--out").arg(out);
    if let Some((cluster, python)) = ray {
        cmd.args(["--ray", &cluster.address]).env("FROGNANO_RAY_PYTHON", python);
        cmd.env("FROGNANO_RAY_NODE_IP", &cluster.head_ip);
    }
    cmd
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The metrics rows without their timings (which differ from run to run).
fn metrics(out: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            for k in ["rollout_s", "train_s", "rollout_tokens_per_s", "train_tokens_per_s"] {
                v.as_object_mut().unwrap().remove(k);
            }
            v
        })
        .collect()
}

/// Every stored rollout by (group, attempt), its wall time zeroed; panics on one recorded twice.
fn rollouts(out: &Path) -> BTreeMap<(u64, u32), Rollout> {
    let mut map = BTreeMap::new();
    for mut r in frognano_rl::store::read_all(&out.join("rollouts")).unwrap() {
        r.wall_s = 0.0;
        let key = (r.group, r.attempt);
        assert!(map.insert(key, r).is_none(), "group {} attempt {} recorded twice", key.0, key.1);
    }
    map
}

fn placements(out: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(out.join("ray/placements.jsonl")).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn toy_training_through_ray_equals_the_local_run_and_survives_a_lost_node() {
    let Some(python) = ray_python("train --ray on a local cluster") else { return };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let starts = root.join("starts");
    // The nodes run `frognano unit` through a wrapper that notes each unit's node and holds
    // it for a moment, so that the kill below lands while the worker node runs one.
    let wrapper = logging_frognano(root, Path::new(env!("CARGO_BIN_EXE_frognano")), &starts, 0.4);
    let cluster = RayCluster::start(&root.join("cluster"), &python, 1, 2, &[("FROGNANO_BIN", &wrapper)]);

    let local = root.join("local");
    ok(train(&local, None).output().unwrap());
    let ray = root.join("ray");
    let log = ok(train(&ray, Some((&cluster, &python))).output().unwrap());
    assert!(log.contains("rollout groups on the Ray cluster"), "{log}");
    let local_metrics = metrics(&local);
    assert_eq!(local_metrics.len(), 3);
    assert_eq!(metrics(&ray), local_metrics, "the same steps through Ray");
    let local_rollouts = rollouts(&local);
    assert_eq!(local_rollouts.len(), 3 * 4 * 4);
    let ray_rollouts = rollouts(&ray);
    assert_eq!(ray_rollouts.keys().collect::<Vec<_>>(), local_rollouts.keys().collect::<Vec<_>>());
    for (key, r) in &local_rollouts {
        assert!(ray_rollouts[key] == *r, "rollout {key:?} differs:\n{:?}\nlocally:\n{r:?}", ray_rollouts[key]);
    }
    // The policy changed between steps (the workers loaded the new weights) …
    let versions: BTreeSet<u64> = ray_rollouts.values().map(|r| r.policy_version).collect();
    assert!(versions.len() >= 2, "{versions:?}");
    // … and both nodes rolled out groups, each exactly once.
    let placed = placements(&ray);
    assert_eq!(placed.len(), 3 * 4);
    let nodes: BTreeSet<&str> = placed.iter().filter_map(|p| p["node"].as_str()).collect();
    assert_eq!(nodes.len(), 2, "both nodes take groups: {placed:?}");
    // Only the current version's weights file is kept.
    let files: Vec<String> = std::fs::read_dir(ray.join("ray"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");

    // A lost node: the worker node is killed while it holds a group.
    std::fs::write(&starts, "").unwrap();
    let kill = root.join("kill");
    let mut child =
        train(&kill, Some((&cluster, &python))).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let (ok_run, stderr) = lose_worker_node_mid_run(&cluster, &mut child, &starts, 2);
    assert!(ok_run, "{stderr}");
    assert_eq!(metrics(&kill), local_metrics, "every step completed, with the local run's results");
    let kill_rollouts = rollouts(&kill);
    assert_eq!(kill_rollouts.len(), local_rollouts.len(), "every group rolled out exactly once");
    for (key, r) in &local_rollouts {
        assert!(kill_rollouts[key] == *r, "rollout {key:?} differs after the lost node");
    }
    // The group the worker node held when it died ran again on the head.
    let twice = units_started_twice(&starts);
    assert!(!twice.is_empty(), "no group of the killed node ran again: {}", std::fs::read_to_string(&starts).unwrap());
}
