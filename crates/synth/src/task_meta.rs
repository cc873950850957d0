//! The `synth` record of a synthesized task: how it was made (source, operators, seed,
//! parents, the mutations themselves), how hard it is, how long validation took and who
//! wrote the issue. `frognano synth` writes it into each instance's `synth` field (kept in
//! [`SweInstance::extra`], so `tasks.jsonl` stays plain SWE-bench JSONL); the Harbor writer,
//! the combination step, the calibrator and the trainer read it back through this type.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use frognano_swe::SweInstance;

use crate::calibrate::Knobs;
use crate::mutate::{Edit, OperatorId};

/// Key of the record in an instance's `extra` fields.
pub const SYNTH_FIELD: &str = "synth";

/// The changes a candidate makes to one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMutation {
    /// Path relative to the repository root.
    pub path: String,
    /// Byte-range edits on the clean file.
    pub edits: Vec<Edit>,
}

/// How a task was synthesized (the `synth` field; fields in the order they are written).
/// Missing fields read as their defaults, as older task files may lack some.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SynthMeta {
    /// `owner/name` of the source repository.
    pub source_repo: String,
    /// The source commit the bug was injected into.
    pub source_commit: String,
    /// `procedural` (one operator firing) or `combine` (validated bugs combined).
    pub family: String,
    /// Strategy names of the operators applied (`func_pm_…`), one per combined bug.
    pub operators: Vec<String>,
    /// The seed the candidate was drawn with.
    pub seed: u64,
    /// Stable key of the candidate (a hash of the base commit and the edits).
    pub candidate_key: String,
    /// Instance ids of the validated bugs a combination was built from.
    pub parents: Vec<String>,
    /// `path::Entity` of each mutated entity.
    pub entities: Vec<String>,
    /// The edits, per file.
    pub mutations: Vec<FileMutation>,
    /// Difficulty measures.
    pub difficulty: Difficulty,
    /// Test-suite times of the validation.
    pub validation: ValidationTimes,
    /// Who wrote the issue text: `generator` (`"model"` or `"template"`), `prompt_version`,
    /// and for model runs `model`, `attempts` and the reasons earlier replies were rejected
    /// (see [`crate::issue_model::IssueOutcome::record`]).
    pub issue: Value,
    /// The environment the task was validated in ([`crate::project::environment_record`]):
    /// runner, test command, tool versions and the exact installed package versions.
    pub environment: Value,
}

/// Difficulty measures of a synthesized task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Difficulty {
    /// Bugs combined into the task (1 for a single bug).
    pub num_mutations: usize,
    /// Files changed.
    pub files: usize,
    /// FAIL_TO_PASS tests.
    pub f2p_count: usize,
    /// PASS_TO_PASS tests.
    pub p2p_count: usize,
    /// Largest complexity among the mutated entities.
    pub entity_complexity: u32,
    /// Lines the gold patch changes.
    pub lines_changed: usize,
    /// How many of the operators are strong ones (removal, control flow, class).
    pub strong_operators: usize,
}

/// Test-suite times measured while validating a task.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ValidationTimes {
    /// Seconds of the suite on the clean tree.
    pub reference_seconds: f64,
    /// Seconds of the suite on the buggy tree.
    pub bug_seconds: f64,
}

impl SynthMeta {
    /// The record of `inst`: `None` when it has none (not a synthesized task), an error
    /// naming the instance when the record does not parse.
    pub fn of(inst: &SweInstance) -> anyhow::Result<Option<SynthMeta>> {
        match inst.extra.get(SYNTH_FIELD) {
            None => Ok(None),
            Some(v) => Self::from_value(v)
                .map(Some)
                .map_err(|e| anyhow::anyhow!("instance {}: field `{SYNTH_FIELD}`: {e}", inst.instance_id)),
        }
    }

    /// The record from its JSON form.
    pub fn from_value(v: &Value) -> Result<SynthMeta, serde_json::Error> {
        SynthMeta::deserialize(v)
    }

    /// The record in its JSON form, as written into the instance.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a SynthMeta always serializes")
    }

    /// The operators applied, as ids (strategy names no longer known are skipped).
    pub fn operator_ids(&self) -> Vec<OperatorId> {
        self.operators.iter().filter_map(|o| OperatorId::parse(o)).collect()
    }

    /// The knobs the task was generated with.
    pub fn knobs(&self) -> Knobs {
        Knobs { combine: self.difficulty.num_mutations.max(1), strong_operators: self.difficulty.strong_operators > 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_round_trips_and_old_records_read_with_defaults() {
        let meta = SynthMeta {
            source_repo: "o/n".into(),
            family: "combine".into(),
            operators: vec!["func_pm_remove_loop".into(), "func_pm_op_swap".into()],
            parents: vec!["a".into(), "b".into()],
            difficulty: Difficulty { num_mutations: 2, strong_operators: 1, ..Difficulty::default() },
            issue: serde_json::json!({"generator": "template"}),
            ..SynthMeta::default()
        };
        let v = meta.to_value();
        assert_eq!(v["difficulty"]["num_mutations"], 2);
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys[..3], ["source_repo", "source_commit", "family"]);
        assert_eq!(SynthMeta::from_value(&v).unwrap(), meta);
        assert_eq!(meta.knobs(), Knobs { combine: 2, strong_operators: true });
        assert_eq!(meta.operator_ids().len(), 2);

        let old = SynthMeta::from_value(&serde_json::json!({"family": "procedural"})).unwrap();
        assert_eq!(old.knobs(), Knobs::default());
        let mut inst = SweInstance { instance_id: "t-1".into(), ..SweInstance::default() };
        assert!(SynthMeta::of(&inst).unwrap().is_none());
        inst.extra.insert(SYNTH_FIELD.into(), serde_json::json!({"seed": "x"}));
        let e = SynthMeta::of(&inst).unwrap_err().to_string();
        assert!(e.starts_with("instance t-1: field `synth`: invalid type"), "{e}");
    }
}
