//! Runs over many instances: `grade` (predictions → reports) and `run` (solve with an agent,
//! then grade), with workers, sharding, progress reports, resumable JSONL results and metrics.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use serde_json::{json, Value};

use crate::executor::{create_workspace, run_instance, ExecOptions, InstanceResult, Outcome};
use crate::instance::{repo_source, Prediction, SweInstance};
use crate::progress::{NoProgress, Progress};
use crate::remote::{
    collect_files, exec_from_json, exec_to_json, failed_result, instance_from_json, instance_to_json,
    prediction_from_json, result_from_json, result_to_json, write_files, UnitAnswer, UnitRunner,
};
use crate::report::{instance_dir, make_run_report, predictions_by_id, run_dir, run_report_text};
use frognano_sandbox::{scratch, Isolation};

/// `--shard i/N`: this process takes the instances whose position modulo `N` is `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// 0-based shard index.
    pub index: usize,
    /// Number of shards.
    pub count: usize,
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Shard, String> {
        let (i, n) = s.split_once('/').ok_or_else(|| format!("shard {s:?} must look like i/N, e.g. 0/4"))?;
        let index: usize = i.trim().parse().map_err(|_| format!("shard index {i:?} is not a number"))?;
        let count: usize = n.trim().parse().map_err(|_| format!("shard count {n:?} is not a number"))?;
        if count == 0 || index >= count {
            return Err(format!("shard {s:?}: need 0 <= i < N"));
        }
        Ok(Shard { index, count })
    }
}

/// Keeps the instances of one shard, in dataset order.
pub fn select_shard(instances: Vec<SweInstance>, shard: Option<Shard>) -> Vec<SweInstance> {
    match shard {
        None => instances,
        Some(s) => instances.into_iter().enumerate().filter(|(i, _)| i % s.count == s.index).map(|(_, x)| x).collect(),
    }
}

/// Reads a JSONL results file (missing file = no rows; unparsable lines are skipped with a
/// warning so a crash mid-write never blocks a rerun).
pub fn read_results(path: &Path) -> Vec<Value> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.split('\n')
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .filter_map(|(i, l)| match serde_json::from_str(l) {
            Ok(v) => Some(v),
            Err(e) => {
                eprintln!("warning: {}:{}: ignoring unreadable result line: {e}", path.display(), i + 1);
                None
            }
        })
        .collect()
}

fn append_line(path: &Path, value: &Value) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot append to {}: {e}", path.display()))?;
    writeln!(f, "{}", serde_json::to_string(value)?)?;
    Ok(())
}

/// Appends where a remote unit ran to the run's [`PLACEMENTS_FILE`] (best effort: it is a
/// record of the run, not a result).
fn record_placement(path: &Path, instance_id: &str, attempt: usize, placement: Value) {
    let mut row = json!({"instance_id": instance_id, "attempt": attempt});
    if let Value::Object(m) = placement {
        row.as_object_mut().expect("an object").extend(m);
    }
    if let Err(e) = append_line(path, &row) {
        eprintln!("warning: {e}");
    }
}

/// A worker's side of a `grade` unit (`frognano unit`): runs the prediction into a
/// private folder and answers with the result and the text of every file written there.
pub fn grade_unit(unit: &Value) -> anyhow::Result<Value> {
    let inst = instance_from_json(&unit["instance"])?;
    let pred = prediction_from_json(&unit["prediction"])?;
    let exec = exec_from_json(&unit["exec"])?;
    let tmp = tempfile::tempdir()?;
    let log_dir = tmp.path().join("log");
    let r = run_instance(&inst, &pred, &exec, &log_dir);
    Ok(json!({"result": result_to_json(&r), "files": collect_files(&log_dir)?}))
}

/// A worker's side of a `run` unit: solves and grades one attempt with `solver` into a
/// private folder; answers with the prediction, the result, the trajectory and the files.
pub fn solve_unit(unit: &Value, solver: &dyn Solver) -> anyhow::Result<Value> {
    let inst = instance_from_json(&unit["instance"])?;
    let exec = exec_from_json(&unit["exec"])?;
    let attempt = unit["attempt"].as_u64().ok_or_else(|| anyhow::anyhow!("unit field `attempt` missing"))? as usize;
    let run_id = unit["run_id"].as_str().ok_or_else(|| anyhow::anyhow!("unit field `run_id` missing"))?;
    let model = unit["model"].as_str().map_or_else(|| solver.model_name(), str::to_string);
    let tmp = tempfile::tempdir()?;
    let opts = SolveRunOptions {
        run_id: run_id.to_string(),
        output: tmp.path().to_path_buf(),
        workers: 1,
        attempts: 1,
        shard: None,
        exec,
    };
    let (pred, result, trajectory) = solve_one(&inst, attempt, solver, &model, &opts);
    let log_dir = instance_dir(tmp.path(), &format!("{run_id}/attempt-{attempt}"), &pred);
    Ok(json!({
        "prediction": pred.to_json(),
        "result": result_to_json(&result),
        "trajectory": trajectory,
        "files": collect_files(&log_dir)?,
    }))
}

fn result_row(r: &InstanceResult, attempt: usize, model: &str) -> Value {
    json!({
        "instance_id": r.instance_id,
        "attempt": attempt,
        "model_name_or_path": model,
        "status": r.outcome.label(),
        "resolved": r.outcome == Outcome::Resolved,
        "patch_applied": r.patch_applied,
        "error": r.outcome.detail(),
        "seconds": (r.seconds * 1000.0).round() / 1000.0,
        "test_seconds": (r.test_seconds * 1000.0).round() / 1000.0,
        "report": r.report,
    })
}

/// Runs `work` over `jobs` on `workers` threads; `on_done` sees each result on the calling
/// thread as soon as it finishes (so it can append it to disk).
fn parallel<J: Sync, R: Send>(
    jobs: &[J],
    workers: usize,
    work: impl Fn(&J) -> R + Sync,
    mut on_done: impl FnMut(&J, R),
) {
    let next = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<(usize, R)>();
    std::thread::scope(|s| {
        for _ in 0..workers.max(1).min(jobs.len().max(1)) {
            let tx = tx.clone();
            let (next, work) = (&next, &work);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= jobs.len() {
                    break;
                }
                if tx.send((i, work(&jobs[i]))).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        for (i, r) in rx {
            on_done(&jobs[i], r);
        }
    });
}

/// Options of a `grade` run.
#[derive(Debug, Clone)]
pub struct GradeOptions {
    /// Run id (log directory name).
    pub run_id: String,
    /// Root under which `logs/run_evaluation/<run_id>` and the run report go.
    pub output: PathBuf,
    /// Worker threads.
    pub workers: usize,
    /// Shard of the instances to take.
    pub shard: Option<Shard>,
    /// Execution settings.
    pub exec: ExecOptions,
}

/// Summary of a finished run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// Instances considered (after sharding).
    pub instances: usize,
    /// Resolved instances (any attempt for `run`).
    pub resolved: usize,
    /// Error instances (no report).
    pub errors: usize,
    /// Path of the results JSONL.
    pub results_path: PathBuf,
    /// Path of the swebench run report (grade only).
    pub report_path: Option<PathBuf>,
}

/// `frognano eval grade`: runs every prediction of the (sharded) instance set, appending one
/// result line per instance to `<run dir>/results.jsonl`; a rerun skips instances already
/// graded (errors are retried, as swebench retries instances without a report). Ends with
/// swebench's run report `<model>.<run_id>.json` in `output`.
pub fn grade(
    instances: Vec<SweInstance>,
    predictions: Vec<Prediction>,
    opts: &GradeOptions,
) -> anyhow::Result<RunSummary> {
    grade_with_progress(instances, predictions, opts, &NoProgress)
}

/// [`grade`], reporting each graded instance to `progress`.
pub fn grade_with_progress(
    instances: Vec<SweInstance>,
    predictions: Vec<Prediction>,
    opts: &GradeOptions,
    progress: &dyn Progress,
) -> anyhow::Result<RunSummary> {
    grade_at(instances, predictions, opts, progress, Place::Threads(opts.workers))
}

/// Where the units (instance attempts) of a run execute.
#[derive(Clone, Copy)]
pub enum Place<'a> {
    /// Worker threads in this process.
    Threads(usize),
    /// Elsewhere (a Ray cluster), through a [`UnitRunner`]; the answers are written here,
    /// exactly as a local run writes its results.
    Remote(&'a dyn UnitRunner),
}

/// Name of the file in the run folder that records where each remote unit ran.
pub const PLACEMENTS_FILE: &str = "placements.jsonl";

/// [`grade_with_progress`] with the instances executed at `place` (`opts.workers` is ignored
/// for a remote place: the cluster decides how many run at once).
pub fn grade_at(
    instances: Vec<SweInstance>,
    predictions: Vec<Prediction>,
    opts: &GradeOptions,
    progress: &dyn Progress,
    place: Place,
) -> anyhow::Result<RunSummary> {
    let dataset_ids: Vec<String> = instances.iter().map(|i| i.instance_id.clone()).collect();
    let by_id = predictions_by_id(&predictions);
    let known: HashSet<&str> = dataset_ids.iter().map(String::as_str).collect();
    if let Some(bad) = by_id.keys().find(|k| !known.contains(k.as_str())) {
        anyhow::bail!("prediction for {bad:?}, which is not in the instance set");
    }
    let instances = select_shard(instances, opts.shard);
    let dir = run_dir(&opts.output, &opts.run_id);
    std::fs::create_dir_all(&dir)?;
    let results_path = dir.join("results.jsonl");
    let done: HashSet<String> = read_results(&results_path)
        .iter()
        .filter(|r| !r["status"].as_str().unwrap_or("error").starts_with("error"))
        .filter_map(|r| r["instance_id"].as_str().map(str::to_string))
        .collect();
    let jobs: Vec<(&SweInstance, &Prediction)> = instances
        .iter()
        .filter(|i| !done.contains(&i.instance_id))
        .filter_map(|i| by_id.get(&i.instance_id).map(|p| (i, p)))
        .collect();
    progress.start("grade", jobs.len() as u64, 0);
    let (mut resolved, mut errors) = (0usize, 0usize);
    let mut write_err = None;
    let mut on_done = |pred: &Prediction, r: InstanceResult| {
        match &r.outcome {
            Outcome::Resolved => resolved += 1,
            Outcome::Error(_) => errors += 1,
            _ => {}
        }
        if let Err(e) = append_line(&results_path, &result_row(&r, 0, &pred.model_name_or_path)) {
            write_err = Some(e);
        }
        progress.message(&format!("resolved {resolved}, errors {errors}"));
        progress.inc(1);
    };
    let mut runner_err = None;
    match place {
        Place::Threads(workers) => parallel(
            &jobs,
            workers,
            |(inst, pred)| {
                let log_dir = instance_dir(&opts.output, &opts.run_id, pred);
                run_instance(inst, pred, &opts.exec, &log_dir)
            },
            |(_, pred), r| on_done(pred, r),
        ),
        Place::Remote(runner) => {
            let units: Vec<Value> = jobs
                .iter()
                .map(|(inst, pred)| {
                    json!({
                        "kind": "grade",
                        "label": inst.instance_id,
                        "instance": instance_to_json(inst),
                        "prediction": pred.to_json(),
                        "exec": exec_to_json(&opts.exec),
                    })
                })
                .collect();
            let placements = dir.join(PLACEMENTS_FILE);
            let res = runner.run_units(&units, progress, &mut |i, answer: UnitAnswer| {
                let (inst, pred) = jobs[i];
                let log_dir = instance_dir(&opts.output, &opts.run_id, pred);
                let r = match answer.outcome.map_err(anyhow::Error::msg).and_then(|v| {
                    write_files(&log_dir, &v["files"])?;
                    result_from_json(&v["result"])
                }) {
                    Ok(r) => r,
                    Err(e) => failed_result(&inst.instance_id, &format!("{e:#}")),
                };
                record_placement(&placements, &inst.instance_id, 0, answer.placement);
                on_done(pred, r);
            });
            runner_err = res.err();
        }
    }
    progress.finish();
    if let Some(e) = write_err.or(runner_err) {
        return Err(e);
    }
    let (report, file) = make_run_report(&by_id, &dataset_ids, &opts.run_id, &opts.output);
    let report_path = opts.output.join(file);
    std::fs::write(&report_path, run_report_text(&report))?;
    let rows = read_results(&results_path);
    Ok(RunSummary {
        instances: instances.len(),
        resolved: rows.iter().filter(|r| r["resolved"] == true).count(),
        errors: report["error_instances"].as_u64().unwrap_or(0) as usize,
        results_path,
        report_path: Some(report_path),
    })
}

/// What a solver hands back for one attempt.
#[derive(Debug, Clone, Default)]
pub struct Solution {
    /// The patch (a `git diff` against the base commit); empty when nothing changed.
    pub patch: String,
    /// The trajectory, stored next to the result.
    pub trajectory: Option<Value>,
    /// Why the agent stopped (e.g. `submitted`, `max_steps`).
    pub exit_reason: String,
}

/// Something that resolves an instance in a workspace: the FrogNano agent, an external
/// command, or a test double. Called from worker threads.
pub trait Solver: Sync {
    /// Model name recorded in predictions.
    fn model_name(&self) -> String;
    /// Works in `workspace` (a checkout at the base commit) on `instance`; returns the patch.
    fn solve(&self, instance: &SweInstance, workspace: &Path, attempt: usize) -> anyhow::Result<Solution>;
}

/// The changes of the solver's workspace `ws` against `base_commit`, taken by git running in
/// a sandbox of `isolation` (a clean or smudge filter, textconv or fsmonitor the solver planted
/// in the workspace's git config never runs on the host). Files over the patch limits are
/// left out.
pub fn workspace_patch(ws: &Path, base_commit: &str, isolation: Isolation) -> anyhow::Result<String> {
    let patch = frognano_sandbox::patch::workspace_patch(ws, base_commit, isolation, Default::default())?;
    Ok(patch.text())
}

/// Options of a `run`.
#[derive(Debug, Clone)]
pub struct SolveRunOptions {
    /// Run id.
    pub run_id: String,
    /// Output root.
    pub output: PathBuf,
    /// Worker threads.
    pub workers: usize,
    /// Attempts per instance (for pass@k).
    pub attempts: usize,
    /// Shard.
    pub shard: Option<Shard>,
    /// Execution settings (grading).
    pub exec: ExecOptions,
}

/// Metrics over attempts: resolve rate, pass@k (unbiased estimator) and Avg@k.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptMetrics {
    /// Instances with at least one attempt.
    pub instances: usize,
    /// Attempts per instance used (k).
    pub k: usize,
    /// Share of instances resolved by at least one attempt (pass@k).
    pub pass_at_k: f64,
    /// Mean resolve rate over attempts (Avg@k).
    pub avg_at_k: f64,
    /// pass@1 (unbiased, from all attempts).
    pub pass_at_1: f64,
}

/// Unbiased pass@k for one instance: `1 - C(n-c, k) / C(n, k)`.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if n == 0 || k == 0 {
        return 0.0;
    }
    if n - c < k {
        return 1.0;
    }
    let mut prod = 1.0;
    for i in (n - c + 1)..=n {
        prod *= 1.0 - k as f64 / i as f64;
    }
    1.0 - prod
}

/// Metrics from result rows (`instance_id`, `attempt`, `resolved`); the last row per
/// (instance, attempt) wins.
pub fn attempt_metrics(rows: &[Value], k: usize) -> AttemptMetrics {
    let mut per: HashMap<String, HashMap<u64, bool>> = HashMap::new();
    for r in rows {
        if let (Some(id), Some(a)) = (r["instance_id"].as_str(), r["attempt"].as_u64()) {
            per.entry(id.to_string()).or_default().insert(a, r["resolved"] == true);
        }
    }
    let n_inst = per.len();
    if n_inst == 0 {
        return AttemptMetrics { instances: 0, k, pass_at_k: 0.0, avg_at_k: 0.0, pass_at_1: 0.0 };
    }
    let (mut pk, mut avg, mut p1) = (0.0, 0.0, 0.0);
    for attempts in per.values() {
        let n = attempts.len();
        let c = attempts.values().filter(|r| **r).count();
        pk += pass_at_k(n, c, k.min(n));
        p1 += pass_at_k(n, c, 1);
        avg += c as f64 / n as f64;
    }
    let d = n_inst as f64;
    AttemptMetrics { instances: n_inst, k, pass_at_k: pk / d, avg_at_k: avg / d, pass_at_1: p1 / d }
}

/// `frognano eval run`: for each (instance, attempt), a fresh workspace at the base commit,
/// the solver, the patch taken from the workspace, then grading as in [`grade`]. Each finished
/// attempt appends a prediction to `preds.jsonl` and a row to `results.jsonl` (with the
/// trajectory under `trajectories/`); a rerun skips attempts already recorded.
pub fn solve_and_grade(
    instances: Vec<SweInstance>,
    solver: &dyn Solver,
    opts: &SolveRunOptions,
) -> anyhow::Result<(RunSummary, AttemptMetrics)> {
    solve_and_grade_with_progress(instances, solver, opts, &NoProgress)
}

/// [`solve_and_grade`], reporting each graded attempt to `progress`.
pub fn solve_and_grade_with_progress(
    instances: Vec<SweInstance>,
    solver: &dyn Solver,
    opts: &SolveRunOptions,
    progress: &dyn Progress,
) -> anyhow::Result<(RunSummary, AttemptMetrics)> {
    solve_and_grade_at(instances, SolvePlace::Local(solver), opts, progress)
}

/// Who solves the attempts of a `run`, and where.
#[derive(Clone, Copy)]
pub enum SolvePlace<'a> {
    /// `solver`, on `opts.workers` threads of this process.
    Local(&'a dyn Solver),
    /// Workers of a [`UnitRunner`], each building the solver `solver` describes (a JSON value
    /// the worker understands, `frognano_swe::eval::SolverConfig`); `model` is the name
    /// recorded in the predictions.
    Remote {
        /// The cluster.
        runner: &'a dyn UnitRunner,
        /// `model_name_or_path` of the predictions.
        model: &'a str,
        /// The solver's description, sent with each unit.
        solver: &'a Value,
    },
}

/// [`solve_and_grade_with_progress`] with the attempts executed as `place` says.
pub fn solve_and_grade_at(
    instances: Vec<SweInstance>,
    place: SolvePlace,
    opts: &SolveRunOptions,
    progress: &dyn Progress,
) -> anyhow::Result<(RunSummary, AttemptMetrics)> {
    let instances = select_shard(instances, opts.shard);
    let dir = run_dir(&opts.output, &opts.run_id);
    std::fs::create_dir_all(dir.join("trajectories"))?;
    let results_path = dir.join("results.jsonl");
    let preds_path = dir.join("preds.jsonl");
    let done: HashSet<(String, u64)> = read_results(&results_path)
        .iter()
        .filter_map(|r| Some((r["instance_id"].as_str()?.to_string(), r["attempt"].as_u64()?)))
        .collect();
    let jobs: Vec<(&SweInstance, usize)> = instances
        .iter()
        .flat_map(|i| (0..opts.attempts.max(1)).map(move |a| (i, a)))
        .filter(|(i, a)| !done.contains(&(i.instance_id.clone(), *a as u64)))
        .collect();
    let model = match place {
        SolvePlace::Local(solver) => solver.model_name(),
        SolvePlace::Remote { model, .. } => model.to_string(),
    };
    progress.start("solve+grade", jobs.len() as u64, 0);
    let mut write_err = None;
    let (mut resolved, mut errors) = (0usize, 0usize);
    let mut on_done = |inst: &SweInstance, attempt: usize, (pred, result, trajectory): Solved| {
        match &result.outcome {
            Outcome::Resolved => resolved += 1,
            Outcome::Error(_) => errors += 1,
            _ => {}
        }
        let mut row = result_row(&result, attempt, &model);
        let traj_rel = format!("trajectories/{}.{attempt}.json", inst.instance_id);
        if let Some(t) = trajectory {
            if let Err(e) = std::fs::write(dir.join(&traj_rel), serde_json::to_string_pretty(&t).unwrap_or_default()) {
                write_err = Some(e.into());
            }
            row["trajectory"] = json!(traj_rel);
        }
        let mut p = pred.to_json();
        p["attempt"] = json!(attempt);
        if let Err(e) = append_line(&preds_path, &p).and_then(|_| append_line(&results_path, &row)) {
            write_err = Some(e);
        }
        progress.message(&format!("resolved {resolved}, errors {errors}"));
        progress.inc(1);
    };
    let mut runner_err = None;
    match place {
        SolvePlace::Local(solver) => parallel(
            &jobs,
            opts.workers,
            |(inst, attempt)| solve_one(inst, *attempt, solver, &model, opts),
            |(inst, attempt), solved| on_done(inst, *attempt, solved),
        ),
        SolvePlace::Remote { runner, solver, .. } => {
            let units: Vec<Value> = jobs
                .iter()
                .map(|(inst, attempt)| {
                    json!({
                        "kind": "run",
                        "label": format!("{}#{attempt}", inst.instance_id),
                        "instance": instance_to_json(inst),
                        "attempt": attempt,
                        "run_id": opts.run_id,
                        "model": model,
                        "solver": solver,
                        "exec": exec_to_json(&opts.exec),
                    })
                })
                .collect();
            let placements = dir.join(PLACEMENTS_FILE);
            let res = runner.run_units(&units, progress, &mut |i, answer: UnitAnswer| {
                let (inst, attempt) = jobs[i];
                let solved = answer.outcome.map_err(anyhow::Error::msg).and_then(|v| {
                    let pred = prediction_from_json(&v["prediction"])?;
                    let result = result_from_json(&v["result"])?;
                    let log_dir = instance_dir(&opts.output, &format!("{}/attempt-{attempt}", opts.run_id), &pred);
                    write_files(&log_dir, &v["files"])?;
                    let trajectory = Some(v["trajectory"].clone()).filter(|t| !t.is_null());
                    Ok((pred, result, trajectory))
                });
                let solved = solved.unwrap_or_else(|e| {
                    let pred = Prediction {
                        instance_id: inst.instance_id.clone(),
                        model_name_or_path: model.clone(),
                        model_patch: None,
                        extra: Default::default(),
                    };
                    (pred, failed_result(&inst.instance_id, &format!("{e:#}")), None)
                });
                record_placement(&placements, &inst.instance_id, attempt, answer.placement);
                on_done(inst, attempt, solved);
            });
            runner_err = res.err();
        }
    }
    progress.finish();
    if let Some(e) = write_err.or(runner_err) {
        return Err(e);
    }
    let ids: HashSet<&str> = instances.iter().map(|i| i.instance_id.as_str()).collect();
    let rows: Vec<Value> = read_results(&results_path)
        .into_iter()
        .filter(|r| r["instance_id"].as_str().is_some_and(|id| ids.contains(id)))
        .collect();
    let metrics = attempt_metrics(&rows, opts.attempts.max(1));
    let resolved_ids: HashSet<&str> =
        rows.iter().filter(|r| r["resolved"] == true).filter_map(|r| r["instance_id"].as_str()).collect();
    let summary = RunSummary {
        instances: instances.len(),
        resolved: resolved_ids.len(),
        errors: rows.iter().filter(|r| r["status"].as_str().is_some_and(|s| s.starts_with("error"))).count(),
        results_path,
        report_path: None,
    };
    Ok((summary, metrics))
}

/// One attempt's prediction, graded result and trajectory.
type Solved = (Prediction, InstanceResult, Option<Value>);

fn solve_one(inst: &SweInstance, attempt: usize, solver: &dyn Solver, model: &str, opts: &SolveRunOptions) -> Solved {
    let mut pred = Prediction {
        instance_id: inst.instance_id.clone(),
        model_name_or_path: model.to_string(),
        model_patch: None,
        extra: Default::default(),
    };
    let failed = |msg: String| InstanceResult {
        instance_id: inst.instance_id.clone(),
        outcome: Outcome::Error(crate::executor::ErrorKind::Infra(msg)),
        report: None,
        patch_applied: false,
        seconds: 0.0,
        test_seconds: 0.0,
    };
    let solved = (|| -> anyhow::Result<Solution> {
        let source = repo_source(inst, opts.exec.repos.as_deref())?;
        let holder = scratch::scratch_dir(&opts.exec.work_root, &format!("{}_solve", inst.instance_id))?;
        let ws = holder.path().join("repo");
        create_workspace(&source, &inst.base_commit, &ws)?;
        let mut sol = solver.solve(inst, &ws, attempt)?;
        let from_ws = workspace_patch(&ws, &inst.base_commit, opts.exec.isolation)?;
        // The patch comes from the workspace, not from the model, when the agent edited it.
        if !from_ws.is_empty() {
            sol.patch = from_ws;
        }
        Ok(sol)
    })();
    match solved {
        Err(e) => (pred, failed(format!("solver failed: {e:#}")), None),
        Ok(sol) => {
            pred.model_patch = Some(sol.patch);
            pred.extra.insert("exit_reason".into(), json!(sol.exit_reason));
            let run_id = format!("{}/attempt-{attempt}", opts.run_id);
            let log_dir = instance_dir(&opts.output, &run_id, &pred);
            let result = run_instance(inst, &pred, &opts.exec, &log_dir);
            (pred, result, sol.trajectory)
        }
    }
}

/// A solver that runs a shell command in the workspace (any agent with a CLI). The command
/// gets `FROGNANO_ISSUE_FILE` (the problem statement), `FROGNANO_INSTANCE_ID` and
/// `FROGNANO_ATTEMPT`; its edits to the workspace are the patch.
#[derive(Debug, Clone)]
pub struct CommandSolver {
    /// Shell command line.
    pub command: String,
    /// Name recorded as `model_name_or_path`.
    pub name: String,
}

impl Solver for CommandSolver {
    fn model_name(&self) -> String {
        self.name.clone()
    }
    fn solve(&self, instance: &SweInstance, workspace: &Path, attempt: usize) -> anyhow::Result<Solution> {
        let issue = tempfile::NamedTempFile::new()?;
        std::fs::write(issue.path(), &instance.problem_statement)?;
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(&self.command)
            .current_dir(workspace)
            .env("FROGNANO_ISSUE_FILE", issue.path())
            .env("FROGNANO_INSTANCE_ID", &instance.instance_id)
            .env("FROGNANO_ATTEMPT", attempt.to_string())
            .output()?;
        Ok(Solution {
            patch: String::new(),
            trajectory: Some(json!({
                "command": self.command,
                "exit_code": out.status.code(),
                "stdout": String::from_utf8_lossy(&out.stdout),
                "stderr": String::from_utf8_lossy(&out.stderr),
            })),
            exit_reason: if out.status.success() { "submitted".into() } else { "command_failed".into() },
        })
    }
}

/// The FrogNano agent through its CLI: `frognano solve --repo WS --issue FILE --output DIR
/// --instance-id ID (--endpoint URL --model M)`; reads `patch.diff` and `trajectory.json`.
#[derive(Debug, Clone)]
pub struct AgentCliSolver {
    /// The `frognano` executable.
    pub frognano: PathBuf,
    /// Model name (at the endpoint, or a local model path).
    pub model: String,
    /// OpenAI-compatible endpoint, if any.
    pub endpoint: Option<String>,
    /// Run the agent's commands unconfined (`frognano solve --no-sandbox`).
    pub no_sandbox: bool,
    /// The tool-call format the model writes (`frognano solve --tool-parser NAME`).
    pub tool_parser: Option<String>,
    /// `--max-steps` and `--max-tokens-per-turn` of each `frognano solve`.
    pub limits: crate::eval::AgentLimits,
    /// `--constrain-tools` (`Some(true)`) or `--no-constrain-tools` (`Some(false)`); `None`
    /// leaves `frognano solve` its default.
    pub constrain_tools: Option<bool>,
    /// `frognano solve --kv-cache TYPE`, when given.
    pub kv_cache: Option<String>,
}

impl Solver for AgentCliSolver {
    fn model_name(&self) -> String {
        self.model.clone()
    }
    fn solve(&self, instance: &SweInstance, workspace: &Path, attempt: usize) -> anyhow::Result<Solution> {
        let tmp = tempfile::tempdir()?;
        let issue = tmp.path().join("issue.md");
        std::fs::write(&issue, &instance.problem_statement)?;
        let out_dir = tmp.path().join("out");
        let mut cmd = std::process::Command::new(&self.frognano);
        cmd.arg("solve")
            .arg("--repo")
            .arg(workspace)
            .arg("--issue")
            .arg(&issue)
            .arg("--output")
            .arg(&out_dir)
            .arg("--instance-id")
            .arg(format!("{}.{attempt}", instance.instance_id))
            .arg("--model")
            .arg(&self.model)
            .arg("--max-steps")
            .arg(self.limits.max_steps.to_string())
            .arg("--max-tokens-per-turn")
            .arg(self.limits.max_tokens_per_turn.to_string());
        if let Some(e) = &self.endpoint {
            cmd.arg("--endpoint").arg(e);
        }
        if self.no_sandbox {
            cmd.arg("--no-sandbox");
        }
        if let Some(p) = &self.tool_parser {
            cmd.arg("--tool-parser").arg(p);
        }
        if let Some(kv) = &self.kv_cache {
            cmd.arg("--kv-cache").arg(kv);
        }
        match self.constrain_tools {
            Some(true) => {
                cmd.arg("--constrain-tools");
            }
            Some(false) => {
                cmd.arg("--no-constrain-tools");
            }
            None => {}
        }
        let out = cmd.output().map_err(|e| anyhow::anyhow!("cannot run {}: {e}", self.frognano.display()))?;
        anyhow::ensure!(out.status.success(), "frognano solve failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        // `frognano solve` always writes patch.diff (empty when nothing changed): a missing or
        // unreadable one is an error of this attempt, never an empty patch.
        let patch_path = out_dir.join("patch.diff");
        let bytes = std::fs::read(&patch_path).map_err(|e| {
            anyhow::anyhow!(
                "frognano solve left no readable {} ({e}): {}",
                patch_path.display(),
                stderr_tail(&out.stderr)
            )
        })?;
        let patch = String::from_utf8(bytes).map_err(|_| {
            anyhow::anyhow!("{} is not UTF-8 text; the prediction cannot hold it", patch_path.display())
        })?;
        let trajectory: Option<Value> =
            std::fs::read_to_string(out_dir.join("trajectory.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
        let exit_reason = trajectory.as_ref().and_then(|t| t["exit_reason"].as_str()).unwrap_or("unknown").to_string();
        Ok(Solution { patch, trajectory, exit_reason })
    }
}

/// The last lines of a child's stderr, for an error message.
fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.trim().lines().collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_solve_that_writes_no_patch_is_an_error_not_an_empty_patch() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("frognano");
        std::fs::write(&fake, "#!/bin/sh\necho 'model exploded' >&2\nexit 0\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let solver = AgentCliSolver {
            frognano: fake,
            model: "m".into(),
            endpoint: None,
            no_sandbox: true,
            tool_parser: None,
            limits: Default::default(),
            constrain_tools: None,
            kv_cache: None,
        };
        let line = r#"{"instance_id": "a__b-1", "repo": "a/b", "base_commit": "0", "patch": "", "problem_statement": "x", "FAIL_TO_PASS": ["t"], "PASS_TO_PASS": [], "version": "1", "test_cmd": "true", "log_parser": "gotest"}"#;
        let inst = crate::instance::parse_jsonl_instances(line, "t.jsonl").unwrap().remove(0);
        let err = solver.solve(&inst, dir.path(), 0).unwrap_err().to_string();
        assert!(err.contains("patch.diff") && err.contains("model exploded"), "{err}");
    }

    #[test]
    fn pass_at_k_matches_the_unbiased_estimator() {
        assert_eq!(pass_at_k(4, 0, 2), 0.0);
        assert_eq!(pass_at_k(4, 4, 1), 1.0);
        assert!((pass_at_k(4, 1, 1) - 0.25).abs() < 1e-12);
        assert!((pass_at_k(4, 1, 2) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn shard_parses_and_splits_round_robin() {
        assert!("3/3".parse::<Shard>().is_err());
        assert!("x/3".parse::<Shard>().is_err());
        let s: Shard = "1/2".parse().unwrap();
        let insts: Vec<SweInstance> =
            (0..5).map(|i| SweInstance { instance_id: format!("i{i}"), ..Default::default() }).collect();
        let ids: Vec<String> = select_shard(insts, Some(s)).into_iter().map(|i| i.instance_id).collect();
        assert_eq!(ids, vec!["i1", "i3"]);
    }
}
