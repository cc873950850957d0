//! swebench's report files: the per-instance `report.json` and the run report
//! (`harness/reporting.py::make_run_report`), byte-identical to Python's output.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde_json::{json, Map, Value};

use crate::grading::{classify_infra_failure_files, InfraTier};
use crate::instance::Prediction;
use crate::pyjson;

/// File name of the per-instance report.
pub const LOG_REPORT: &str = "report.json";
/// File name of the test output log.
pub const LOG_TEST_OUTPUT: &str = "test_output.txt";
/// File name of the per-instance harness log.
pub const LOG_INSTANCE: &str = "run_instance.log";
/// File name of the patch that was applied.
pub const LOG_PATCH: &str = "patch.diff";

/// `logs/run_evaluation/<run_id>` under `root`.
pub fn run_dir(root: &Path, run_id: &str) -> PathBuf {
    root.join("logs").join("run_evaluation").join(run_id)
}

/// `logs/run_evaluation/<run_id>/<model>/<instance_id>` under `root`.
pub fn instance_dir(root: &Path, run_id: &str, pred: &Prediction) -> PathBuf {
    run_dir(root, run_id).join(pred.model_dir_name()).join(&pred.instance_id)
}

/// The text of `report.json` as swebench writes it (`indent=4`, no trailing newline).
pub fn instance_report_text(report: &Value) -> String {
    pyjson::dumps(report, Some(4))
}

/// Predictions keyed by id, a later duplicate replacing the value but keeping the position
/// (Python dict semantics).
pub fn predictions_by_id(preds: &[Prediction]) -> IndexMap<String, Prediction> {
    let mut map = IndexMap::new();
    for p in preds {
        map.insert(p.instance_id.clone(), p.clone());
    }
    map
}

fn python_truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// `make_run_report(predictions, full_dataset, run_id, client=None)`, with the log tree under
/// `root`. Returns the report object and its file name `<model>.<run_id>.json`.
pub fn make_run_report(
    predictions: &IndexMap<String, Prediction>,
    dataset_ids: &[String],
    run_id: &str,
    root: &Path,
) -> (Value, String) {
    let mut completed = BTreeSet::new();
    let mut resolved = BTreeSet::new();
    let mut unresolved = BTreeSet::new();
    let mut errors = BTreeSet::new();
    let mut incomplete = BTreeSet::new();
    let mut empty = BTreeSet::new();
    for id in dataset_ids {
        let Some(pred) = predictions.get(id) else {
            incomplete.insert(id.clone());
            continue;
        };
        if pred.is_empty_patch() {
            empty.insert(id.clone());
            continue;
        }
        let file = instance_dir(root, run_id, pred).join(LOG_REPORT);
        if !file.exists() {
            errors.insert(id.clone());
            continue;
        }
        completed.insert(id.clone());
        let text = std::fs::read(&file).map(|b| crate::pytext::read_text_replace(&b)).unwrap_or_default();
        let text = crate::pytext::py_strip(&text);
        match serde_json::from_str::<Value>(text) {
            Ok(v) => match v.get(id).and_then(|e| e.get("resolved")) {
                Some(r) if python_truthy(r) => {
                    resolved.insert(id.clone());
                }
                Some(_) => {
                    unresolved.insert(id.clone());
                }
                None => {
                    errors.insert(id.clone());
                }
            },
            Err(_) => {
                errors.insert(id.clone());
            }
        }
    }
    let mut reasons = std::collections::BTreeMap::new();
    let mut infra = BTreeSet::new();
    let mut ambiguous = BTreeSet::new();
    for id in unresolved.iter().chain(errors.iter()) {
        let dir = instance_dir(root, run_id, &predictions[id]);
        let paths = [dir.join(LOG_TEST_OUTPUT), dir.join(LOG_INSTANCE)];
        let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        if let Some((reason, tier)) = classify_infra_failure_files(&refs) {
            reasons.insert(id.clone(), reason);
            match tier {
                InfraTier::Environment => infra.insert(id.clone()),
                InfraTier::Ambiguous => ambiguous.insert(id.clone()),
            };
        }
    }
    let list = |s: &BTreeSet<String>| Value::from(s.iter().cloned().collect::<Vec<_>>());
    let mut submitted: Vec<String> = predictions.keys().cloned().collect();
    submitted.sort();
    let mut report = Map::new();
    report.insert("total_instances".into(), json!(dataset_ids.len()));
    report.insert("submitted_instances".into(), json!(predictions.len()));
    report.insert("completed_instances".into(), json!(completed.len()));
    report.insert("resolved_instances".into(), json!(resolved.len()));
    report.insert("unresolved_instances".into(), json!(unresolved.len()));
    report.insert("infra_failure_instances".into(), json!(infra.len()));
    report.insert("ambiguous_failure_instances".into(), json!(ambiguous.len()));
    report.insert("empty_patch_instances".into(), json!(empty.len()));
    report.insert("error_instances".into(), json!(errors.len()));
    report.insert("completed_ids".into(), list(&completed));
    report.insert("incomplete_ids".into(), list(&incomplete));
    report.insert("empty_patch_ids".into(), list(&empty));
    report.insert("submitted_ids".into(), submitted.into());
    report.insert("resolved_ids".into(), list(&resolved));
    report.insert("unresolved_ids".into(), list(&unresolved));
    report.insert("infra_failure_ids".into(), list(&infra));
    report.insert("ambiguous_failure_ids".into(), list(&ambiguous));
    report.insert(
        "failure_reasons".into(),
        Value::Object(reasons.into_iter().map(|(k, v)| (k, Value::from(v))).collect()),
    );
    report.insert("error_ids".into(), list(&errors));
    report.insert("schema_version".into(), json!(2));
    let model = predictions.values().next().map(Prediction::model_dir_name).unwrap_or_default();
    (Value::Object(report), format!("{model}.{run_id}.json"))
}

/// The run report's file text (`indent=4` plus the newline `print` adds).
pub fn run_report_text(report: &Value) -> String {
    let mut s = pyjson::dumps(report, Some(4));
    s.push('\n');
    s
}
