//! The jobs of `frognano synth` as a library: the issue-writing model a run asks for
//! ([`IssueModelConfig`]) and `synth calibrate` ([`CalibrateConfig`], [`calibrate`]). Task
//! generation itself is [`crate::pipeline::synthesize`] over [`crate::pipeline::SynthOptions`].
//! The flags live in `crates/cli`.
//!
//! Errors of `validate()` name a field by its `frognano synth` flag (the field's name in
//! kebab case), say what was expected and what was found.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use frognano_engine::EngineLlm;
use frognano_protocol::{HttpLlm, Llm};

use frognano_sandbox::Isolation;
use frognano_swe::eval::SolverConfig;
use frognano_swe::progress::Progress;
use frognano_swe::runs::Solver;

use crate::calibrate::{BandReport, EstimateStore, FrontierConfig, Knobs};
use crate::issue_model::IssueModel;
use crate::task_meta::SynthMeta;

/// The model that writes issue text: in process (checkpoint folder, `.gguf` file or cached
/// hub id), or the model name at an OpenAI-compatible endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueModelConfig {
    /// The model.
    pub model: String,
    /// Endpoint serving `model`; `None`: load it in this process.
    pub endpoint: Option<String>,
    /// How long one request to the endpoint may take.
    pub timeout: Duration,
    /// Model replies tried per task before falling back to the template.
    pub attempts: usize,
}

impl IssueModelConfig {
    /// `model` in process, with the default timeout and attempts.
    pub fn new(model: impl Into<String>) -> Self {
        IssueModelConfig {
            model: model.into(),
            endpoint: None,
            timeout: Duration::from_secs(120),
            attempts: crate::issue_model::DEFAULT_ATTEMPTS,
        }
    }

    /// Loads the model (or connects to the endpoint).
    pub fn load(&self) -> anyhow::Result<Arc<IssueModel>> {
        let model = &self.model;
        let llm: Box<dyn Llm + Send> = match &self.endpoint {
            Some(url) => Box::new(HttpLlm::new(url, model, self.timeout.max(Duration::from_secs(1)))?),
            None => Box::new(EngineLlm::load(model).with_context(|| format!("--issue-model {model}"))?),
        };
        Ok(Arc::new(IssueModel::new(llm, self.attempts)))
    }
}

/// `frognano synth calibrate`: K agent attempts per task → pass-rate estimates, band report,
/// next knobs.
#[derive(Debug, Clone)]
pub struct CalibrateConfig {
    /// Synthesized tasks (tasks.jsonl).
    pub tasks: PathBuf,
    /// Estimate store (JSON), created or updated.
    pub estimates: PathBuf,
    /// Attempts per task (K, at least 1).
    pub attempts: usize,
    /// Policy version the attempts belong to (older counts decay by γ per version).
    pub policy_version: u64,
    /// Who attempts the tasks.
    pub solver: SolverConfig,
    /// Lower band edge.
    pub band_low: f64,
    /// Upper band edge.
    pub band_high: f64,
    /// Parallel instances (0 counts as 1).
    pub workers: usize,
    /// Root for logs and results.
    pub output: PathBuf,
    /// How long the tests may run per attempt.
    pub timeout: Duration,
    /// Confinement of the tests.
    pub isolation: Isolation,
    /// Where the fix goes, appended to every issue text ([`frognano_swe::localization`]).
    /// The estimates are those of the tasks at this level: keep one store per level.
    pub hints: frognano_swe::localization::HintLevel,
}

impl CalibrateConfig {
    /// Checks the settings without side effects.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.attempts >= 1, "--attempts must be at least 1");
        anyhow::ensure!(
            0.0 <= self.band_low && self.band_low < self.band_high && self.band_high <= 1.0,
            "band must satisfy 0 ≤ low < high ≤ 1"
        );
        self.solver.validate()
    }

    fn frontier(&self) -> FrontierConfig {
        FrontierConfig { band_low: self.band_low, band_high: self.band_high, ..Default::default() }
    }
}

/// What a calibration found.
#[derive(Debug, Clone)]
pub struct Calibration {
    /// The calibrated tasks, in file order.
    pub task_ids: Vec<String>,
    /// The updated estimates (saved to [`CalibrateConfig::estimates`]).
    pub store: EstimateStore,
    /// The band the report is about.
    pub frontier: FrontierConfig,
    /// Where the tasks lie against the band, and how many new ones to ask for.
    pub band: BandReport,
    /// The knobs most tasks were generated with.
    pub current: Knobs,
    /// Mean pass rate and number of calibrated tasks at the current knobs, when known.
    pub current_pass_rate: Option<(f64, usize)>,
    /// Where the controller moves the knobs.
    pub next: Knobs,
}

/// Per-task rewards from `frognano eval run` result rows; infrastructure errors are masked.
pub fn rewards_from_results(rows: &[serde_json::Value]) -> BTreeMap<String, Vec<bool>> {
    let mut out: BTreeMap<String, Vec<bool>> = BTreeMap::new();
    for r in rows {
        let Some(id) = r["instance_id"].as_str() else { continue };
        let status = r["status"].as_str().unwrap_or("");
        if status.starts_with("error") {
            continue;
        }
        out.entry(id.to_string()).or_default().push(r["resolved"] == true);
    }
    out
}

/// The knobs a synthesized task was generated with (from its `synth` record; a task without
/// one counts as single-bug, weak operators).
pub fn knobs_of(inst: &frognano_swe::SweInstance) -> anyhow::Result<Knobs> {
    Ok(SynthMeta::of(inst)?.map(|m| m.knobs()).unwrap_or_default())
}

/// Runs [`CalibrateConfig`]: attempts every task, updates and saves the estimate store.
pub fn calibrate(a: &CalibrateConfig, progress: &dyn Progress) -> anyhow::Result<Calibration> {
    a.validate()?;
    calibrate_with_solver(a, a.solver.solver()?.as_ref(), progress)
}

/// [`calibrate`] with a ready `solver` in place of the one `a.solver` describes (the cli
/// passes the in-process agent, which this crate does not depend on); `a.solver` is still
/// validated.
pub fn calibrate_with_solver(
    a: &CalibrateConfig,
    solver: &dyn Solver,
    progress: &dyn Progress,
) -> anyhow::Result<Calibration> {
    use frognano_swe::runs::SolveRunOptions;
    a.validate()?;
    let mut instances = frognano_swe::load_instances(&a.tasks)?;
    anyhow::ensure!(!instances.is_empty(), "{}: no tasks", a.tasks.display());
    frognano_swe::localization::add_hints(&mut instances, a.hints);
    let cfg = a.frontier();
    let run_id = format!("calibrate-v{}", a.policy_version);
    let opts = SolveRunOptions {
        run_id: run_id.clone(),
        output: a.output.clone(),
        workers: a.workers.max(1),
        attempts: a.attempts,
        shard: None,
        exec: frognano_swe::executor::ExecOptions {
            repos: None,
            timeout: a.timeout,
            isolation: a.isolation,
            work_root: std::env::temp_dir(),
        },
    };
    let ids: Vec<String> = instances.iter().map(|i| i.instance_id.clone()).collect();
    let mut levels: BTreeMap<String, usize> = BTreeMap::new();
    for i in &instances {
        levels.insert(i.instance_id.clone(), knobs_of(i)?.level());
    }
    let (summary, _) = frognano_swe::runs::solve_and_grade_with_progress(instances, solver, &opts, progress)?;
    let rows = frognano_swe::runs::read_results(&summary.results_path);
    let rewards = rewards_from_results(&rows);
    let mut store = EstimateStore::load(&a.estimates)?;
    // Re-running the same version re-reads all its rows: rebuild this version's counts from
    // the results file rather than adding them twice.
    let applied_path = a.estimates.with_extension("applied.json");
    let mut applied: BTreeMap<String, usize> =
        std::fs::read_to_string(&applied_path).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
    for id in &ids {
        store.add_task_at_level(id, levels[id]);
        let key = format!("{run_id}/{id}");
        let all = rewards.get(id).cloned().unwrap_or_default();
        let seen = applied.get(&key).copied().unwrap_or(0);
        if all.len() > seen {
            store.update(id, &all[seen..], a.policy_version, &cfg);
            applied.insert(key, all.len());
        }
    }
    store.save(&a.estimates)?;
    std::fs::write(&applied_path, serde_json::to_string_pretty(&applied)?)?;
    let band = store.band_report(&cfg);
    // The knobs most tasks were generated with, and where the controller moves them.
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    for l in levels.values() {
        *counts.entry(*l).or_default() += 1;
    }
    let current = Knobs::from_level(counts.iter().max_by_key(|(_, n)| **n).map_or(0, |(l, _)| *l));
    let next = store.next_knobs(current, &cfg);
    let current_pass_rate = store.level_pass_rate(current.level(), &cfg);
    Ok(Calibration { task_ids: ids, store, frontier: cfg, band, current, current_pass_rate, next })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_issue_model_connects_without_loading() {
        let cfg = IssueModelConfig { endpoint: Some("http://127.0.0.1:1".into()), ..IssueModelConfig::new("m") };
        assert_eq!(cfg.attempts, crate::issue_model::DEFAULT_ATTEMPTS);
        let m = cfg.load().expect("an endpoint model");
        assert!(m.description().contains('m'));
    }

    #[test]
    fn bad_calibration_settings_are_named() {
        let cfg = CalibrateConfig {
            tasks: "tasks.jsonl".into(),
            estimates: "estimates.json".into(),
            attempts: 4,
            policy_version: 0,
            solver: SolverConfig::Command("true".into()),
            band_low: 0.8,
            band_high: 0.2,
            workers: 1,
            output: "out".into(),
            timeout: Duration::from_secs(1800),
            isolation: Isolation::Unconfined,
            hints: frognano_swe::localization::HintLevel::None,
        };
        assert_eq!(cfg.validate().unwrap_err().to_string(), "band must satisfy 0 ≤ low < high ≤ 1");
        let cfg = CalibrateConfig { attempts: 0, band_low: 0.2, band_high: 0.8, ..cfg };
        assert_eq!(cfg.validate().unwrap_err().to_string(), "--attempts must be at least 1");
    }
}
