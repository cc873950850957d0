//! The Kubernetes manifests in scaleout/k8s/ (docs/scale-out.md) checked offline by
//! scaleout/validate_manifests.py against the Kubernetes client's models (and KubeRay's v1
//! fields): every shipped manifest passes, and a typo, a wrong type or a missing required
//! field in a copy fails, naming the document and the path.
//!
//! Needs `.venv-ray` (scripts/setup-ray.sh, run by scripts/ci-setup.sh); with
//! FROGNANO_REQUIRE_FIXTURES set (CI) a missing venv fails the test instead of skipping it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn python() -> Option<PathBuf> {
    let python = std::env::var_os("FROGNANO_RAY_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv-ray/bin/python"));
    let status = match Command::new(&python).args(["-c", "import kubernetes, yaml"]).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
        Err(e) => Err(format!("{}: {e}", python.display())),
    };
    frognano_testkit::available_or_skip("kubernetes client (scripts/setup-ray.sh)", "manifest validation", status)
        .then_some(python)
}

fn validate(python: &Path, files: &[PathBuf]) -> Output {
    Command::new(python).arg(repo_root().join("scaleout/validate_manifests.py")).args(files).output().unwrap()
}

fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("scaleout/k8s"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn the_shipped_manifests_pass_and_broken_copies_fail_naming_the_field() {
    let Some(python) = python() else { return };
    let files = manifests();
    let o = validate(&python, &files);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    for kind in ["RayCluster", "RayJob", "Job (V1Job)", "PersistentVolumeClaim"] {
        assert!(stdout.contains(kind), "{kind} not checked: {stdout}");
    }

    let dir = tempfile::tempdir().unwrap();
    let read = |name: &str| std::fs::read_to_string(repo_root().join("scaleout/k8s").join(name)).unwrap();
    let cases = [
        (
            "indexed-job.yaml",
            "imagePullPolicy",
            "imagePullPolcy",
            "spec.template.spec.containers[0]: unknown field 'imagePullPolcy'",
        ),
        ("indexed-job.yaml", "completions: 8", "completions: eight", "spec.completions: expected int"),
        ("indexed-job.yaml", "- name: grade\n          image:", "- image:", "V1Container"),
        ("raycluster.yaml", "replicas: 4", "replicas: \"4\"", "spec.workerGroupSpecs[0].replicas: expected int"),
        ("rayjob.yaml", "groupName", "group_name", "unknown field 'group_name' for KubeRay WorkerGroupSpec"),
        ("rayjob.yaml", "mountPath: /data}", "mountPth: /data}", "unknown field 'mountPth' for V1VolumeMount"),
        ("raycluster.yaml", "num-cpus: \"8\"", "num-cpus: 8", "expected a map of strings"),
    ];
    for (i, (file, from, to, expected)) in cases.iter().enumerate() {
        let text = read(file);
        assert!(text.contains(from), "{file} has no {from:?}");
        let broken = dir.path().join(format!("{i}-{file}"));
        std::fs::write(&broken, text.replacen(from, to, 1)).unwrap();
        let o = validate(&python, &[broken]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(!o.status.success(), "{file} with {to:?} passed: {out}");
        assert!(out.contains(expected), "{file} with {to:?}: expected {expected:?} in {out}");
    }
}
