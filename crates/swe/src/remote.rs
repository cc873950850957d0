//! Units of a run executed somewhere else (a Ray cluster, [`crate::ray`]): what goes out to a
//! worker and what comes back, as JSON.
//!
//! A *unit* is one instance attempt. The driver (the `frognano` process the user started)
//! turns each unit into a self-contained JSON object: the instance, the prediction or the
//! solver, and the execution settings. A worker (`frognano unit`, on any machine that
//! has the binary and the repositories) runs it into a private folder and answers with the
//! result and the text of every file it wrote. The driver then writes those files where the
//! local run writes them and appends the same result rows, so a run through a cluster leaves
//! exactly the files of a local run and resumes the same way.

use std::path::{Path, PathBuf};
use std::time::Duration;

use frognano_sandbox::Isolation;
use serde_json::{json, Map, Value};

use crate::executor::{ErrorKind, ExecOptions, InstanceResult, Outcome};
use crate::instance::{Prediction, SweInstance, Verification};
use crate::progress::Progress;

/// Runs units elsewhere and streams their answers back.
pub trait UnitRunner: Sync {
    /// Runs every unit of `units` (JSON objects made by this module's callers) and calls
    /// `on_done(index, answer)` once per unit, in completion order, as each finishes. An
    /// `Err` return means the runner itself failed; units answered before that were handed
    /// to `on_done` and the rest were not (a rerun does them).
    fn run_units(
        &self,
        units: &[Value],
        progress: &dyn Progress,
        on_done: &mut dyn FnMut(usize, UnitAnswer),
    ) -> anyhow::Result<()>;
}

/// What came back for one unit.
#[derive(Debug, Clone)]
pub struct UnitAnswer {
    /// The worker's answer (see [`crate::runs::grade_unit`]), or why the unit failed for good
    /// (the worker's error, or retries exhausted after lost workers).
    pub outcome: Result<Value, String>,
    /// Where and how it ran (for Ray: node id, seconds through Ray), recorded beside the
    /// results in `ray.jsonl`.
    pub placement: Value,
}

/// `ExecOptions` as a unit carries it.
pub fn exec_to_json(exec: &ExecOptions) -> Value {
    json!({
        "repos": exec.repos,
        "timeout_s": exec.timeout.as_secs(),
        "isolation": match exec.isolation { Isolation::Bubblewrap => "bubblewrap", Isolation::Unconfined => "unconfined" },
        "work_root": exec.work_root,
    })
}

/// The inverse of [`exec_to_json`]; errors name the field.
pub fn exec_from_json(v: &Value) -> anyhow::Result<ExecOptions> {
    let isolation = match v["isolation"].as_str() {
        Some("bubblewrap") => Isolation::Bubblewrap,
        Some("unconfined") => Isolation::Unconfined,
        other => {
            anyhow::bail!("unit field `exec.isolation`: expected \"bubblewrap\" or \"unconfined\", found {other:?}")
        }
    };
    let timeout = v["timeout_s"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("unit field `exec.timeout_s`: expected seconds, found {}", v["timeout_s"]))?;
    let path = |k: &str| v[k].as_str().map(PathBuf::from);
    Ok(ExecOptions {
        repos: path("repos"),
        timeout: Duration::from_secs(timeout),
        isolation,
        work_root: path("work_root").unwrap_or_else(std::env::temp_dir),
    })
}

/// An instance as a unit carries it (the Harbor task folder alongside, which is not a field of
/// the instance files).
pub fn instance_to_json(inst: &SweInstance) -> Value {
    let task_dir = match &inst.verification {
        Verification::SweBench => Value::Null,
        Verification::Harbor { task_dir } => json!(task_dir),
    };
    json!({ "record": inst.to_json(), "harbor_task_dir": task_dir })
}

/// The inverse of [`instance_to_json`].
pub fn instance_from_json(v: &Value) -> anyhow::Result<SweInstance> {
    let err = |field: &str, problem: String| crate::instance::InstanceError {
        source_name: "unit".into(),
        line: None,
        field: field.into(),
        problem,
    };
    let mut inst = SweInstance::from_json(v["record"].clone(), &err)?;
    if let Some(dir) = v["harbor_task_dir"].as_str() {
        inst.verification = Verification::Harbor { task_dir: PathBuf::from(dir) };
    }
    Ok(inst)
}

/// A prediction from a unit's JSON object.
pub fn prediction_from_json(v: &Value) -> anyhow::Result<Prediction> {
    let line = serde_json::to_string(v)?;
    let mut preds = crate::instance::parse_predictions(&line, "unit.jsonl")?;
    anyhow::ensure!(preds.len() == 1, "unit: expected one prediction, found {}", preds.len());
    Ok(preds.remove(0))
}

/// An instance result as a worker sends it back.
pub fn result_to_json(r: &InstanceResult) -> Value {
    let timeout = match &r.outcome {
        Outcome::Error(ErrorKind::TestTimeout(s)) => json!(s),
        _ => Value::Null,
    };
    json!({
        "instance_id": r.instance_id,
        "status": r.outcome.label(),
        "error": r.outcome.detail(),
        "timeout_s": timeout,
        "report": r.report,
        "patch_applied": r.patch_applied,
        "seconds": r.seconds,
        "test_seconds": r.test_seconds,
    })
}

/// The inverse of [`result_to_json`]; an unknown status is an error naming it.
pub fn result_from_json(v: &Value) -> anyhow::Result<InstanceResult> {
    let detail = v["error"].as_str().unwrap_or_default().to_string();
    let outcome = match v["status"].as_str().unwrap_or_default() {
        "resolved" => Outcome::Resolved,
        "unresolved" => Outcome::Unresolved,
        "empty_patch" => Outcome::EmptyPatch,
        "error_repo_missing" => Outcome::Error(ErrorKind::RepoMissing(detail)),
        "error_patch_apply_failed" => Outcome::Error(ErrorKind::PatchApplyFailed),
        "error_test_timeout" => Outcome::Error(ErrorKind::TestTimeout(v["timeout_s"].as_u64().unwrap_or(0))),
        "error" => Outcome::Error(ErrorKind::Infra(detail)),
        other => anyhow::bail!("unit answer: unknown status {other:?}"),
    };
    Ok(InstanceResult {
        instance_id: v["instance_id"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("unit answer: field `instance_id` missing"))?
            .to_string(),
        outcome,
        report: v.get("report").filter(|r| !r.is_null()).cloned(),
        patch_applied: v["patch_applied"] == true,
        seconds: v["seconds"].as_f64().unwrap_or(0.0),
        test_seconds: v["test_seconds"].as_f64().unwrap_or(0.0),
    })
}

/// The result of a unit that never produced one (the worker failed, or the cluster gave up on
/// it): an infrastructure error, recorded as the local run records one.
pub fn failed_result(instance_id: &str, why: &str) -> InstanceResult {
    InstanceResult {
        instance_id: instance_id.to_string(),
        outcome: Outcome::Error(ErrorKind::Infra(format!("remote unit failed: {why}"))),
        report: None,
        patch_applied: false,
        seconds: 0.0,
        test_seconds: 0.0,
    }
}

/// Every file under `dir`, by path relative to it, as text (the executor writes text only;
/// other bytes are replaced as lossy UTF-8 decoding replaces them).
pub fn collect_files(dir: &Path) -> anyhow::Result<Map<String, Value>> {
    fn walk(root: &Path, dir: &Path, out: &mut Map<String, Value>) -> anyhow::Result<()> {
        let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
        for e in entries {
            let path = e?.path();
            if path.is_dir() {
                walk(root, &path, out)?;
            } else {
                let rel = path.strip_prefix(root)?.to_string_lossy().into_owned();
                let bytes = std::fs::read(&path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
                out.insert(rel, Value::String(String::from_utf8_lossy(&bytes).into_owned()));
            }
        }
        Ok(())
    }
    let mut out = Map::new();
    walk(dir, dir, &mut out)?;
    Ok(out)
}

/// Writes the files of a unit answer under `dir`; a path that would leave `dir` (absolute, or
/// with `..`) is refused.
pub fn write_files(dir: &Path, files: &Value) -> anyhow::Result<()> {
    let Some(files) = files.as_object() else { return Ok(()) };
    for (rel, text) in files {
        let rel_path = Path::new(rel);
        anyhow::ensure!(
            rel_path.components().all(|c| matches!(c, std::path::Component::Normal(_))),
            "unit answer: file path {rel:?} leaves the instance folder"
        );
        let path = dir.join(rel_path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, text.as_str().unwrap_or_default())
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_and_settings_survive_the_trip() {
        for outcome in [
            Outcome::Resolved,
            Outcome::EmptyPatch,
            Outcome::Error(ErrorKind::TestTimeout(7)),
            Outcome::Error(ErrorKind::RepoMissing("no clone".into())),
            Outcome::Error(ErrorKind::PatchApplyFailed),
        ] {
            let r = InstanceResult {
                instance_id: "a__b-1".into(),
                outcome: outcome.clone(),
                report: Some(json!({"a__b-1": {"resolved": true}})),
                patch_applied: true,
                seconds: 1.5,
                test_seconds: 0.5,
            };
            let back = result_from_json(&result_to_json(&r)).unwrap();
            assert_eq!(back.outcome, outcome);
            assert_eq!((back.report, back.seconds), (r.report, 1.5));
        }
        let exec = ExecOptions { repos: Some("/r".into()), ..Default::default() };
        let back = exec_from_json(&exec_to_json(&exec)).unwrap();
        assert_eq!((back.repos, back.timeout, back.isolation), (exec.repos, exec.timeout, exec.isolation));
        let bad = exec_from_json(&json!({"isolation": "docker", "timeout_s": 1})).unwrap_err().to_string();
        assert!(bad.contains("exec.isolation") && bad.contains("docker"), "{bad}");
    }

    #[test]
    fn answer_files_stay_inside_the_instance_folder() {
        let dir = tempfile::tempdir().unwrap();
        write_files(dir.path(), &json!({"report.json": "{}", "verifier/reward.txt": "1"})).unwrap();
        let files = collect_files(dir.path()).unwrap();
        assert_eq!(files["verifier/reward.txt"], "1");
        let err = write_files(dir.path(), &json!({"../escape": "x"})).unwrap_err().to_string();
        assert!(err.contains("leaves the instance folder"), "{err}");
    }
}
