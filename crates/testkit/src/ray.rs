//! A real Ray cluster of several nodes on this machine for the `--ray` tests
//! (`scripts/ray-local-cluster.sh`: `ray start --head` plus worker nodes, each in a process
//! group of its own, so that killing one group is losing that machine).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository root")
}

/// The Python with Ray: `FROGNANO_RAY_PYTHON`, else the repository's `.venv-ray`
/// (scripts/setup-ray.sh, run by scripts/ci-setup.sh). `None` (with a SKIPPED note, or a
/// failure under `FROGNANO_REQUIRE_FIXTURES`) when it cannot import ray.
pub fn ray_python(context: &str) -> Option<PathBuf> {
    let python = std::env::var_os("FROGNANO_RAY_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv-ray/bin/python"));
    let status = match Command::new(&python).args(["-c", "import ray"]).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("{} cannot import ray: {}", python.display(), String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Err(format!("{}: {e}", python.display())),
    };
    crate::available_or_skip("ray (scripts/setup-ray.sh)", context, status).then_some(python)
}

/// A cluster started by the project's script; stopped (every node's process group killed)
/// when dropped, also when the test fails.
pub struct RayCluster {
    dir: PathBuf,
    /// `host:port` of the head.
    pub address: String,
    /// The head's IP: drivers attach there (`FROGNANO_RAY_NODE_IP`), not to a worker node a
    /// test kills.
    pub head_ip: String,
}

impl RayCluster {
    /// Starts `nodes` nodes of `cpus` CPUs each in `dir`, with `env` added to every node's
    /// environment (what their Ray workers, and so the `frognano unit` processes, see).
    pub fn start(dir: &Path, python: &Path, cpus: usize, nodes: usize, env: &[(&str, &Path)]) -> RayCluster {
        let mut cmd = Command::new(repo_root().join("scripts/ray-local-cluster.sh"));
        cmd.args(["start", dir.to_str().expect("a UTF-8 path"), &cpus.to_string(), &nodes.to_string()]);
        cmd.env("RAY_PYTHON", python);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let o = cmd.output().expect("scripts/ray-local-cluster.sh runs");
        let mut cluster = RayCluster { dir: dir.to_path_buf(), address: String::new(), head_ip: String::new() };
        assert!(o.status.success(), "cluster did not start: {}", String::from_utf8_lossy(&o.stderr));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("written by start").trim().to_string();
        cluster.address = read("address");
        cluster.head_ip = read("head-ip");
        cluster
    }

    /// Process group of worker node `i` (1-based): `kill -9 -- -PGID` is that machine lost.
    pub fn worker_pgid(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("worker{i}.pgid"))).expect("a worker node").trim().to_string()
    }

    /// Kills worker node `i` (its whole process group).
    pub fn kill_worker(&self, i: usize) {
        let killed = Command::new("kill").args(["-9", "--", &format!("-{}", self.worker_pgid(i))]).status();
        assert!(killed.is_ok_and(|s| s.success()), "could not kill worker node {i}");
    }
}

impl Drop for RayCluster {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("scripts/ray-local-cluster.sh"))
            .args(["stop", self.dir.to_str().unwrap_or_default()])
            .output();
    }
}

/// A stand-in for the `frognano` the cluster's workers run (`FROGNANO_BIN` in
/// [`RayCluster::start`]'s `env`): a script in `dir` that appends `LABEL PGID` to `starts`
/// (the unit's `label` and the process group, i.e. the node, it runs in), waits `sleep`
/// seconds so that a test can kill a node while it holds a unit, then runs `real`.
pub fn logging_frognano(dir: &Path, real: &Path, starts: &Path, sleep: f64) -> PathBuf {
    let path = dir.join("frognano-logging");
    let script = format!(
        "#!/bin/bash\nunit=$(cat)\nlabel=$(printf '%s' \"$unit\" | python3 -c 'import json,sys; print(json.load(sys.stdin).get(\"label\", \"\"))')\n\
         echo \"$label $(ps -o pgid= $$ | tr -d ' ')\" >> '{}'\nsleep {sleep}\nprintf '%s' \"$unit\" | exec '{}' \"$@\"\n",
        starts.display(),
        real.display()
    );
    std::fs::write(&path, script).expect("write the wrapper");
    let _ = Command::new("chmod").arg("+x").arg(&path).status();
    path
}

/// Waits while `child` (a `--ray` run) runs until worker node 1 has started `units` units (the
/// lines of `starts` that end in its process group, as [`logging_frognano`] or a test's
/// solver writes them), kills that node, and waits for the run to end. Returns whether the
/// run succeeded and its stderr. Panics when the run ends before the node took `units` units,
/// or after two minutes.
pub fn lose_worker_node_mid_run(
    cluster: &RayCluster,
    child: &mut Child,
    starts: &Path,
    units: usize,
) -> (bool, String) {
    let pgid = cluster.worker_pgid(1);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = std::fs::read_to_string(starts).unwrap_or_default();
        // `units` started on the worker node: the last is in its wait now.
        if text.lines().filter(|l| l.ends_with(&format!(" {pgid}"))).count() >= units {
            break;
        }
        assert!(Instant::now() < deadline, "the worker node never took {units} units");
        assert!(
            child.try_wait().expect("a child").is_none(),
            "the run ended before the worker node took {units} units"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    cluster.kill_worker(1);
    let status = loop {
        if let Some(s) = child.try_wait().expect("a child") {
            break s;
        }
        assert!(Instant::now() < deadline, "the run did not finish after the worker node was killed");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    if let Some(pipe) = child.stderr.as_mut() {
        let _ = std::io::Read::read_to_string(pipe, &mut stderr);
    }
    (status.success(), stderr)
}

/// The labels `starts` lists more than once: units that ran again (after their node was lost).
pub fn units_started_twice(starts: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(starts).unwrap_or_default();
    let mut count: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for line in text.lines() {
        *count.entry(line.rsplit_once(' ').map_or(line, |(label, _)| label)).or_default() += 1;
    }
    count.into_iter().filter(|(_, n)| *n > 1).map(|(label, _)| label.to_string()).collect()
}
