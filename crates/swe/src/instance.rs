//! SWE-bench task instances and predictions: types and loaders (JSON, JSONL, parquet via [`crate::parquet`]).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::grading::{EvalType, GradingSpec, FAIL_ONLY_REPOS};

/// One SWE-bench task instance (v4 and v5 fields), plus FrogNano's optional additions.
///
/// Unknown fields are kept in [`SweInstance::extra`] and written back untouched.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SweInstance {
    /// `owner__name-PR`.
    pub instance_id: String,
    /// `owner/name`.
    pub repo: String,
    /// Commit the repository is checked out at.
    pub base_commit: String,
    /// Gold fix (unified diff).
    pub patch: String,
    /// Diff adding the grading tests; never shown to the agent.
    pub test_patch: String,
    /// Issue text.
    pub problem_statement: String,
    /// Hints (may be empty).
    pub hints_text: String,
    /// Creation time, as given.
    pub created_at: String,
    /// Environment version; always a string (`"3.0"` stays `"3.0"`).
    pub version: String,
    /// Tests the fix must make pass.
    pub fail_to_pass: Vec<String>,
    /// Tests that must keep passing.
    pub pass_to_pass: Vec<String>,
    /// Commit the environment was built from.
    pub environment_setup_commit: String,
    /// v5: container image.
    pub image: Option<String>,
    /// v5: eval script text.
    pub eval_script: Option<String>,
    /// v5: registry name of the log parser.
    pub log_parser: Option<String>,
    /// v5: `pass_and_fail` or `fail_only`.
    pub eval_type: Option<String>,
    /// FrogNano: local repository to clone instead of a `--repos` mirror.
    pub repo_path: Option<String>,
    /// FrogNano: test command run in the workspace by the local executor (e.g. `pytest -rA`).
    pub test_cmd: Option<String>,
    /// FrogNano: environment set-up commands run in the workspace before the tests.
    pub setup_commands: Vec<String>,
    /// How a prediction for this instance is verified. Not a field of the instance files: a
    /// SWE-bench record is [`Verification::SweBench`]; an instance loaded from a Harbor task
    /// directory carries that directory.
    pub verification: Verification,
    /// Every other field, in input order.
    pub extra: Map<String, Value>,
}

/// How a prediction for an instance is verified.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Verification {
    /// SWE-bench: the instance's `test_cmd` or v5 `eval_script` runs in the patched workspace
    /// and its log is graded with the instance's log parser, FAIL_TO_PASS and PASS_TO_PASS.
    #[default]
    SweBench,
    /// Harbor: the task directory's `tests/test.sh` runs as the verifier and its reward file
    /// decides (resolved iff the reward is at least 1).
    Harbor {
        /// The task directory (with `task.toml` and `tests/`), canonicalized when loaded.
        task_dir: PathBuf,
    },
}

/// A malformed instance: which record, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}{loc}: field `{field}`: {problem}", loc = location_suffix(source_name, *.line))]
pub struct InstanceError {
    /// File the record came from.
    pub source_name: String,
    /// 1-based line (JSONL) or record (JSON list), or 0-based row index (parquet, numbered as
    /// pandas numbers rows), when known.
    pub line: Option<usize>,
    /// Offending field (`<record>` for the record as a whole).
    pub field: String,
    /// What is wrong.
    pub problem: String,
}

fn location_suffix(source: &str, line: Option<usize>) -> String {
    let sep = if source.ends_with(" row") || source.ends_with(" record") { " " } else { ":" };
    line.map(|l| format!("{sep}{l}")).unwrap_or_default()
}

const KNOWN_FIELDS: &[&str] = &[
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "hints_text",
    "created_at",
    "version",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "environment_setup_commit",
    "image",
    "eval_script",
    "log_parser",
    "eval_type",
    "repo_path",
    "test_cmd",
    "setup_commands",
];

impl SweInstance {
    /// Builds an instance from one JSON object; `err` builds the located error.
    pub fn from_json(value: Value, err: &dyn Fn(&str, String) -> InstanceError) -> Result<SweInstance, InstanceError> {
        let Value::Object(mut obj) = value else {
            return Err(err("<record>", "expected a JSON object".into()));
        };
        let mut take_str = |name: &str, required: bool| -> Result<Option<String>, InstanceError> {
            match obj.shift_remove(name) {
                None | Some(Value::Null) if required => Err(err(name, "missing".into())),
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s)),
                // `version` is sometimes written as a number; keep its text.
                Some(Value::Number(n)) if name == "version" => Ok(Some(n.to_string())),
                Some(other) => Err(err(name, format!("expected a string, found {}", kind(&other)))),
            }
        };
        let instance_id = take_str("instance_id", true)?.unwrap_or_default();
        let repo = take_str("repo", true)?.unwrap_or_default();
        let base_commit = take_str("base_commit", true)?.unwrap_or_default();
        let patch = take_str("patch", false)?.unwrap_or_default();
        let test_patch = take_str("test_patch", false)?.unwrap_or_default();
        let problem_statement = take_str("problem_statement", false)?.unwrap_or_default();
        let hints_text = take_str("hints_text", false)?.unwrap_or_default();
        let created_at = take_str("created_at", false)?.unwrap_or_default();
        let version = take_str("version", false)?.unwrap_or_default();
        let environment_setup_commit = take_str("environment_setup_commit", false)?.unwrap_or_default();
        let image = take_str("image", false)?;
        let eval_script = take_str("eval_script", false)?;
        let log_parser = take_str("log_parser", false)?;
        let eval_type = take_str("eval_type", false)?;
        let repo_path = take_str("repo_path", false)?;
        let test_cmd = take_str("test_cmd", false)?;
        if let Some(t) = &eval_type {
            if EvalType::parse(t).is_none() {
                return Err(err("eval_type", format!("{t:?} is not `pass_and_fail` or `fail_only`")));
            }
        }
        let fail_to_pass = test_list(obj.shift_remove("FAIL_TO_PASS"), "FAIL_TO_PASS", err)?;
        let pass_to_pass = test_list(obj.shift_remove("PASS_TO_PASS"), "PASS_TO_PASS", err)?;
        let setup_commands = match obj.shift_remove("setup_commands") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => string_list(v, "setup_commands", err)?,
        };
        Ok(SweInstance {
            instance_id,
            repo,
            base_commit,
            patch,
            test_patch,
            problem_statement,
            hints_text,
            created_at,
            version,
            fail_to_pass,
            pass_to_pass,
            environment_setup_commit,
            image,
            eval_script,
            log_parser,
            eval_type,
            repo_path,
            test_cmd,
            setup_commands,
            verification: Verification::SweBench,
            extra: obj,
        })
    }

    /// The instance as a JSON object: known fields first, then the kept unknown fields.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        let s = |v: &str| Value::String(v.to_string());
        m.insert("instance_id".into(), s(&self.instance_id));
        m.insert("repo".into(), s(&self.repo));
        m.insert("base_commit".into(), s(&self.base_commit));
        m.insert("patch".into(), s(&self.patch));
        m.insert("test_patch".into(), s(&self.test_patch));
        m.insert("problem_statement".into(), s(&self.problem_statement));
        m.insert("hints_text".into(), s(&self.hints_text));
        m.insert("created_at".into(), s(&self.created_at));
        m.insert("version".into(), s(&self.version));
        m.insert("FAIL_TO_PASS".into(), self.fail_to_pass.clone().into());
        m.insert("PASS_TO_PASS".into(), self.pass_to_pass.clone().into());
        m.insert("environment_setup_commit".into(), s(&self.environment_setup_commit));
        for (k, v) in [
            ("image", &self.image),
            ("eval_script", &self.eval_script),
            ("log_parser", &self.log_parser),
            ("eval_type", &self.eval_type),
            ("repo_path", &self.repo_path),
            ("test_cmd", &self.test_cmd),
        ] {
            if let Some(v) = v {
                m.insert(k.into(), s(v));
            }
        }
        if !self.setup_commands.is_empty() {
            m.insert("setup_commands".into(), self.setup_commands.clone().into());
        }
        for (k, v) in &self.extra {
            if !KNOWN_FIELDS.contains(&k.as_str()) {
                m.insert(k.clone(), v.clone());
            }
        }
        Value::Object(m)
    }

    /// The log parser: `log_parser` (v5), else swebench 4.x's per-repository table.
    pub fn parser_name(&self) -> anyhow::Result<String> {
        if let Some(p) = &self.log_parser {
            return Ok(p.clone());
        }
        crate::parsers::parser_for_repo(&self.repo).map(str::to_string).ok_or_else(|| {
            anyhow::anyhow!(
                "instance {}: field `log_parser` is missing and repo {:?} has no default parser",
                self.instance_id,
                self.repo
            )
        })
    }

    /// The eval type: `eval_type` (v5), else `fail_only` for swebench 4.x's fail-only repos.
    pub fn eval_type(&self) -> EvalType {
        match self.eval_type.as_deref().and_then(EvalType::parse) {
            Some(t) => t,
            None if FAIL_ONLY_REPOS.contains(&self.repo.as_str()) => EvalType::FailOnly,
            None => EvalType::PassAndFail,
        }
    }

    /// What the grader needs from this instance.
    pub fn grading_spec(&self) -> anyhow::Result<GradingSpec> {
        Ok(GradingSpec {
            instance_id: self.instance_id.clone(),
            fail_to_pass: self.fail_to_pass.clone(),
            pass_to_pass: self.pass_to_pass.clone(),
            log_parser: self.parser_name()?,
            eval_type: self.eval_type(),
            context: crate::parsers::ParseContext {
                instance_id: Some(self.instance_id.clone()),
                version: Some(self.version.clone()),
            },
        })
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn string_list(
    v: Value,
    field: &str,
    err: &dyn Fn(&str, String) -> InstanceError,
) -> Result<Vec<String>, InstanceError> {
    let Value::Array(items) = v else {
        return Err(err(field, format!("expected a list, found {}", kind(&v))));
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(s),
            other => Err(err(field, format!("item {i} is {}, expected a string", kind(&other)))),
        })
        .collect()
}

/// FAIL_TO_PASS / PASS_TO_PASS: a list, or a JSON-encoded list (the HF parquet form).
fn test_list(
    v: Option<Value>,
    field: &str,
    err: &dyn Fn(&str, String) -> InstanceError,
) -> Result<Vec<String>, InstanceError> {
    match v {
        None | Some(Value::Null) => Err(err(field, "missing".into())),
        Some(Value::String(s)) => {
            let parsed: Value =
                serde_json::from_str(&s).map_err(|e| err(field, format!("JSON-encoded string does not parse: {e}")))?;
            string_list(parsed, field, err)
        }
        Some(v) => string_list(v, field, err),
    }
}

/// Parses JSONL instances; a malformed line names its 1-based line number and field.
pub fn parse_jsonl_instances(text: &str, source: &str) -> Result<Vec<SweInstance>, InstanceError> {
    let mut out = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let err = |field: &str, problem: String| InstanceError {
            source_name: source.to_string(),
            line: Some(i + 1),
            field: field.to_string(),
            problem,
        };
        let value: Value = serde_json::from_str(line).map_err(|e| err("<record>", format!("invalid JSON: {e}")))?;
        out.push(SweInstance::from_json(value, &err)?);
    }
    Ok(out)
}

/// Parses instances from a parquet file (the Hugging Face form: string columns, test lists
/// as JSON strings or real lists, nullable v5 fields). A malformed row names its 0-based row
/// index and field.
pub fn parse_parquet_instances(bytes: &[u8], source: &str) -> Result<Vec<SweInstance>, InstanceError> {
    use crate::parquet::ReadError;
    let rows = crate::parquet::read_rows(bytes).map_err(|e| match e {
        ReadError::Value(v) => InstanceError {
            source_name: format!("{source} row"),
            line: Some(v.row),
            field: v.field,
            problem: v.problem,
        },
        ReadError::File(f) => {
            InstanceError { source_name: source.to_string(), line: None, field: "<file>".into(), problem: f.0 }
        }
    })?;
    rows.into_iter()
        .enumerate()
        .map(|(i, row)| {
            let err = |field: &str, problem: String| InstanceError {
                source_name: format!("{source} row"),
                line: Some(i),
                field: field.to_string(),
                problem,
            };
            SweInstance::from_json(Value::Object(row), &err)
        })
        .collect()
}

/// Parses a JSON list of instances (or a single instance object).
pub fn parse_json_instances(text: &str, source: &str) -> Result<Vec<SweInstance>, InstanceError> {
    let top_err = |problem: String| InstanceError {
        source_name: source.to_string(),
        line: None,
        field: "<file>".into(),
        problem,
    };
    let value: Value = serde_json::from_str(text).map_err(|e| top_err(format!("invalid JSON: {e}")))?;
    let items = match value {
        Value::Array(items) => items,
        obj @ Value::Object(_) => vec![obj],
        other => return Err(top_err(format!("expected a list of instances, found {}", kind(&other)))),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let err = |field: &str, problem: String| InstanceError {
                source_name: format!("{source} record"),
                line: Some(i + 1),
                field: field.to_string(),
                problem,
            };
            SweInstance::from_json(v, &err)
        })
        .collect()
}

/// One prediction: `instance_id`, `model_name_or_path`, `model_patch` (`None` = `null`).
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// Instance this prediction is for.
    pub instance_id: String,
    /// Model name; `/` becomes `__` in log paths.
    pub model_name_or_path: String,
    /// The diff; `None` when `null`.
    pub model_patch: Option<String>,
    /// Other fields, kept.
    pub extra: Map<String, Value>,
}

impl Prediction {
    /// The model name as used in log directories.
    pub fn model_dir_name(&self) -> String {
        self.model_name_or_path.replace('/', "__")
    }

    /// `""` or `null`: not run, counted as an empty patch.
    pub fn is_empty_patch(&self) -> bool {
        self.model_patch.as_deref().is_none_or(str::is_empty)
    }

    /// As a JSON object (one JSONL line of `preds.jsonl`).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("instance_id".into(), self.instance_id.clone().into());
        m.insert("model_name_or_path".into(), self.model_name_or_path.clone().into());
        m.insert("model_patch".into(), self.model_patch.clone().map_or(Value::Null, Value::String));
        for (k, v) in &self.extra {
            m.insert(k.clone(), v.clone());
        }
        Value::Object(m)
    }

    fn from_json(v: Value, location: &str) -> anyhow::Result<Prediction> {
        let Value::Object(mut obj) = v else {
            anyhow::bail!("{location}: each prediction must be a JSON object");
        };
        let instance_id = match obj.shift_remove("instance_id") {
            Some(Value::String(s)) => s,
            Some(other) => anyhow::bail!("{location}: field `instance_id` must be a string, found {}", kind(&other)),
            None => anyhow::bail!("{location}: each prediction must contain `instance_id`"),
        };
        let model_name_or_path = match obj.shift_remove("model_name_or_path") {
            Some(Value::String(s)) => s,
            None | Some(Value::Null) => String::new(),
            Some(other) => {
                anyhow::bail!("{location}: field `model_name_or_path` must be a string, found {}", kind(&other))
            }
        };
        let model_patch = match obj.shift_remove("model_patch") {
            Some(Value::String(s)) => Some(s),
            None | Some(Value::Null) => None,
            Some(other) => {
                anyhow::bail!("{location}: field `model_patch` must be a string or null, found {}", kind(&other))
            }
        };
        Ok(Prediction { instance_id, model_name_or_path, model_patch, extra: obj })
    }
}

/// `get_predictions_from_file`: `.jsonl`, `.json` list, or `.json` dict keyed by id (keys
/// ignored). The literal `gold` builds gold predictions from `instances`.
pub fn load_predictions(path: &Path, instances: &[SweInstance]) -> anyhow::Result<Vec<Prediction>> {
    if path == Path::new("gold") {
        return Ok(gold_predictions(instances));
    }
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read predictions {name}: {e}"))?;
    parse_predictions(&text, &name)
}

/// Parses predictions text; the format is chosen by `name`'s extension.
pub fn parse_predictions(text: &str, name: &str) -> anyhow::Result<Vec<Prediction>> {
    if name.ends_with(".jsonl") {
        let mut out = Vec::new();
        for (i, line) in text.split('\n').enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let loc = format!("{name}:{}", i + 1);
            let v: Value = serde_json::from_str(line).map_err(|e| anyhow::anyhow!("{loc}: invalid JSON: {e}"))?;
            out.push(Prediction::from_json(v, &loc)?);
        }
        Ok(out)
    } else if name.ends_with(".json") {
        let v: Value = serde_json::from_str(text).map_err(|e| anyhow::anyhow!("{name}: invalid JSON: {e}"))?;
        let items: Vec<Value> = match v {
            Value::Array(items) => items,
            Value::Object(map) => map.into_iter().map(|(_, v)| v).collect(),
            _ => {
                anyhow::bail!("{name}: predictions must be a list[prediction] or a dictionary[instance_id: prediction]")
            }
        };
        items
            .into_iter()
            .enumerate()
            .map(|(i, v)| Prediction::from_json(v, &format!("{name} entry {}", i + 1)))
            .collect()
    } else {
        anyhow::bail!("{name}: predictions path must be .json or .jsonl (or the word `gold`)")
    }
}

/// Gold predictions: each instance's `patch` under the model name `gold`.
pub fn gold_predictions(instances: &[SweInstance]) -> Vec<Prediction> {
    instances
        .iter()
        .map(|i| Prediction {
            instance_id: i.instance_id.clone(),
            model_name_or_path: "gold".into(),
            model_patch: Some(i.patch.clone()),
            extra: Map::new(),
        })
        .collect()
}

/// Where a repository clone for `instance` is: its `repo_path`, else `<repos>/<owner>__<name>`
/// or `<repos>/<name>` (first that exists).
pub fn repo_source(instance: &SweInstance, repos: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = &instance.repo_path {
        let p = PathBuf::from(p);
        anyhow::ensure!(
            p.exists(),
            "repository for {} not found: repo_path {} does not exist",
            instance.instance_id,
            p.display()
        );
        return Ok(p);
    }
    let Some(dir) = repos else {
        anyhow::bail!(
            "repository for {} not found: the instance has no `repo_path` and no --repos directory was given",
            instance.instance_id
        );
    };
    let flat = instance.repo.replace('/', "__");
    let short = instance.repo.rsplit('/').next().unwrap_or(&instance.repo);
    for cand in [dir.join(&flat), dir.join(short), dir.join(&instance.repo)] {
        if cand.exists() {
            return Ok(cand);
        }
    }
    anyhow::bail!(
        "repository {} for {} not found under {} (looked for {flat}, {short}, {})",
        instance.repo,
        instance.instance_id,
        dir.display(),
        instance.repo
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_line_names_line_and_field() {
        let good = r#"{"instance_id":"a__b-1","repo":"a/b","base_commit":"x","FAIL_TO_PASS":[],"PASS_TO_PASS":"[]"}"#;
        let bad = r#"{"instance_id":"a__b-2","repo":"a/b","base_commit":"x","FAIL_TO_PASS":"[oops","PASS_TO_PASS":[]}"#;
        let e = parse_jsonl_instances(&format!("{good}\n\n{bad}\n"), "set.jsonl").unwrap_err();
        assert_eq!(e.line, Some(3));
        assert_eq!(e.field, "FAIL_TO_PASS");
        assert!(e.to_string().starts_with("set.jsonl:3: field `FAIL_TO_PASS`"));
    }

    #[test]
    fn string_lists_and_numeric_versions_are_accepted_and_extras_kept() {
        let line = r#"{"instance_id":"a__b-1","repo":"a/b","base_commit":"x","version":3.0,"FAIL_TO_PASS":"[\"t1\"]","PASS_TO_PASS":["t2"],"difficulty":"<15 min fix"}"#;
        let inst = &parse_jsonl_instances(line, "x.jsonl").unwrap()[0];
        assert_eq!(inst.version, "3.0");
        assert_eq!(inst.fail_to_pass, vec!["t1"]);
        assert_eq!(inst.to_json()["difficulty"], "<15 min fix");
    }

    #[test]
    fn predictions_dict_form_ignores_keys() {
        let text = r#"{"k": {"instance_id": "a", "model_name_or_path": "m/x", "model_patch": null}}"#;
        let p = parse_predictions(text, "preds.json").unwrap();
        assert_eq!(p[0].instance_id, "a");
        assert!(p[0].is_empty_patch());
        assert_eq!(p[0].model_dir_name(), "m__x");
    }
}
