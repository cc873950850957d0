//! `frognano synth …`: argument structs and their entry point, wired into the binary by
//! `crates/cli`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use frognano_engine::EngineLlm;
use frognano_protocol::{HttpLlm, Llm};

use frognano_sandbox::Isolation;

use crate::calibrate::{EstimateStore, FrontierConfig, Knobs};
use crate::intake::Source;
use crate::issue_model::IssueModel;
use crate::mutate::OperatorId;
use crate::pipeline::{synthesize, GenOptions, SynthOptions};

/// `frognano synth`: `frognano synth [REPO] [--pypi N==V | --crate N@V] --out DIR`, or
/// `frognano synth calibrate …`.
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SynthCommand {
    /// `calibrate`: measure pass rates of synthesized tasks with an agent.
    #[command(subcommand)]
    pub sub: Option<SynthSub>,
    /// Generation options (when no subcommand is given).
    #[command(flatten)]
    pub generate: GenerateArgs,
}

/// Subcommands of `frognano synth`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SynthSub {
    /// K agent attempts per task → pass-rate estimates, band report, next knobs.
    Calibrate(CalibrateArgs),
}

/// `frognano synth [REPO]`: repository intake, bug injection, validation, tasks.
#[derive(Debug, Clone, clap::Args)]
pub struct GenerateArgs {
    /// A local git repository.
    #[arg(conflicts_with_all = ["pypi", "krate"])]
    pub repo: Option<PathBuf>,
    /// Commit of the local repository (default HEAD).
    #[arg(long, requires = "repo")]
    pub commit: Option<String>,
    /// A PyPI source distribution, NAME==VERSION.
    #[arg(long, conflicts_with = "krate")]
    pub pypi: Option<String>,
    /// A crates.io crate, NAME@VERSION.
    #[arg(long = "crate")]
    pub krate: Option<String>,
    /// Output directory: tasks.jsonl (SWE-bench instances), tasks.git, candidates.jsonl, summary.json.
    #[arg(long, default_value = "synth-out")]
    pub out: PathBuf,
    /// Seed of candidate generation.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Entities simpler than this are not mutated.
    #[arg(long, default_value_t = 3)]
    pub min_complexity: u32,
    /// Operators, comma-separated (`op_change,remove_loop,…`; default: all of the language).
    #[arg(long, value_delimiter = ',')]
    pub operators: Vec<String>,
    /// Cap on single-bug candidates validated.
    #[arg(long, default_value_t = 200)]
    pub max_candidates: usize,
    /// Stop after this many accepted tasks.
    #[arg(long)]
    pub max_tasks: Option<usize>,
    /// Combine this many validated bugs of one file into harder tasks (≥2 turns it on).
    #[arg(long, default_value_t = 0)]
    pub combine: usize,
    /// Cap on combination candidates.
    #[arg(long, default_value_t = 50)]
    pub max_combos: usize,
    /// Parallel validation workers.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Minimum per-run timeout in seconds (actual: max(this, 3 × reference suite time)).
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Largest share of tests one bug may fail.
    #[arg(long, default_value_t = 0.5)]
    pub max_f2p_fraction: f64,
    /// Python interpreter to use as is instead of creating a virtualenv.
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Also write Harbor task directories under this directory.
    #[arg(long)]
    pub harbor: Option<PathBuf>,
    /// Run tests without confinement.
    #[arg(long)]
    pub no_sandbox: bool,
    /// Write issue text with this model: in process (checkpoint folder, `.gguf` file or cached
    /// hub id), or the model name at `--issue-endpoint`. Replies that leak the fix are retried,
    /// then the template text is used. Default: template text only.
    #[arg(long)]
    pub issue_model: Option<String>,
    /// OpenAI-compatible endpoint serving `--issue-model`.
    #[arg(long, requires = "issue_model")]
    pub issue_endpoint: Option<String>,
    /// Seconds one issue request to `--issue-endpoint` may take.
    #[arg(long, default_value_t = 120)]
    pub issue_timeout: u64,
    /// Model replies tried per task before falling back to the template.
    #[arg(long, default_value_t = crate::issue_model::DEFAULT_ATTEMPTS)]
    pub issue_attempts: usize,
}

/// `frognano synth calibrate`.
#[derive(Debug, Clone, clap::Args)]
pub struct CalibrateArgs {
    /// Synthesized tasks (tasks.jsonl).
    #[arg(long)]
    pub tasks: PathBuf,
    /// Estimate store (JSON), created or updated.
    #[arg(long, default_value = "estimates.json")]
    pub estimates: PathBuf,
    /// Attempts per task (K).
    #[arg(long, default_value_t = 4)]
    pub attempts: usize,
    /// Policy version the attempts belong to (older counts decay by γ per version).
    #[arg(long, default_value_t = 0)]
    pub policy_version: u64,
    /// Model name (at --endpoint), solved with `frognano solve`.
    #[arg(long, required_unless_present = "solver_cmd")]
    pub model: Option<String>,
    /// OpenAI-compatible endpoint for the agent.
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Instead of the agent, this shell command edits each workspace.
    #[arg(long, conflicts_with_all = ["model", "endpoint"])]
    pub solver_cmd: Option<String>,
    /// Lower band edge.
    #[arg(long, default_value_t = 0.2)]
    pub band_low: f64,
    /// Upper band edge.
    #[arg(long, default_value_t = 0.8)]
    pub band_high: f64,
    /// Parallel instances.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Root for logs and results.
    #[arg(long, default_value = "calibrate-out")]
    pub output: PathBuf,
    /// Seconds the tests may run per attempt.
    #[arg(long, default_value_t = 1800)]
    pub timeout: u64,
    /// The `frognano` executable used for `solve` (default: this executable).
    #[arg(long)]
    pub frognano_bin: Option<PathBuf>,
    /// Run without confinement.
    #[arg(long)]
    pub no_sandbox: bool,
}

fn parse_operators(names: &[String]) -> anyhow::Result<Option<Vec<OperatorId>>> {
    if names.is_empty() {
        return Ok(None);
    }
    names
        .iter()
        .map(|n| {
            OperatorId::parse(n.trim()).ok_or_else(|| {
                let known: Vec<&str> =
                    crate::mutate::ALL_OPERATORS.iter().map(|o| o.strategy().trim_start_matches("func_pm_")).collect();
                anyhow::anyhow!("unknown operator {n:?}; known: {}", known.join(", "))
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()
        .map(Some)
}

impl GenerateArgs {
    /// The issue-writing model these arguments ask for (loaded now), if any.
    pub fn issue_model(&self) -> anyhow::Result<Option<Arc<IssueModel>>> {
        let Some(model) = &self.issue_model else { return Ok(None) };
        let llm: Box<dyn Llm + Send> = match &self.issue_endpoint {
            Some(url) => Box::new(HttpLlm::new(url, model, Duration::from_secs(self.issue_timeout.max(1)))?),
            None => Box::new(EngineLlm::load(model).with_context(|| format!("--issue-model {model}"))?),
        };
        Ok(Some(Arc::new(IssueModel::new(llm, self.issue_attempts))))
    }

    /// The pipeline options these arguments stand for (loads `--issue-model`).
    pub fn options(&self) -> anyhow::Result<SynthOptions> {
        let source = match (&self.repo, &self.pypi, &self.krate) {
            (Some(p), None, None) => Source::Local { path: p.clone(), commit: self.commit.clone() },
            (None, Some(s), None) => Source::pypi(s)?,
            (None, None, Some(s)) => Source::krate(s)?,
            _ => anyhow::bail!("give one source: a repository path, --pypi NAME==VERSION or --crate NAME@VERSION"),
        };
        anyhow::ensure!(
            self.max_f2p_fraction > 0.0 && self.max_f2p_fraction <= 1.0,
            "--max-f2p-fraction must be in (0, 1]"
        );
        Ok(SynthOptions {
            source,
            out: self.out.clone(),
            gen: GenOptions {
                seed: self.seed,
                min_complexity: self.min_complexity,
                operators: parse_operators(&self.operators)?,
                max_candidates: self.max_candidates,
            },
            workers: self.workers.max(1),
            max_tasks: self.max_tasks,
            combine: self.combine,
            max_combos: self.max_combos,
            min_timeout: Duration::from_secs(self.timeout),
            max_f2p_fraction: self.max_f2p_fraction,
            isolation: if self.no_sandbox { Isolation::Unconfined } else { Isolation::Bubblewrap },
            python: self.python.clone(),
            harbor: self.harbor.clone(),
            progress: true,
            issue_model: self.issue_model()?,
        })
    }
}

/// Entry point of `frognano synth`.
pub fn run_synth(cmd: SynthCommand) -> anyhow::Result<()> {
    match cmd.sub {
        Some(SynthSub::Calibrate(a)) => run_calibrate(&a),
        None => {
            let s = synthesize(&cmd.generate.options()?)?;
            let rate = if s.seconds > 0.0 { 60.0 * s.tasks_accepted as f64 / s.seconds } else { 0.0 };
            println!(
                "accepted {} of {} candidates ({} skipped as done); {:.1} tasks/min; {:.0}% of worker time in test runs",
                s.tasks_accepted,
                s.candidates_tried,
                s.resumed_skipped,
                rate,
                100.0 * s.test_seconds / (s.seconds * cmd.generate.workers.max(1) as f64).max(1e-9)
            );
            for (reason, n) in &s.rejections {
                println!("  rejected {reason}: {n}");
            }
            println!("tasks: {}", s.tasks_path.display());
            Ok(())
        }
    }
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

/// The knobs a synthesized task was generated with (from its `synth` metadata).
pub fn knobs_of(inst: &frognano_swe::SweInstance) -> Knobs {
    let d = inst.extra.get("synth").map(|s| s["difficulty"].clone()).unwrap_or_default();
    Knobs {
        combine: d["num_mutations"].as_u64().unwrap_or(1).max(1) as usize,
        strong_operators: d["strong_operators"].as_u64().unwrap_or(0) > 0,
    }
}

fn run_calibrate(a: &CalibrateArgs) -> anyhow::Result<()> {
    use frognano_swe::runs::{AgentCliSolver, CommandSolver, SolveRunOptions, Solver};
    let instances = frognano_swe::load_instances(&a.tasks)?;
    anyhow::ensure!(!instances.is_empty(), "{}: no tasks", a.tasks.display());
    anyhow::ensure!(a.attempts >= 1, "--attempts must be at least 1");
    let cfg = FrontierConfig { band_low: a.band_low, band_high: a.band_high, ..Default::default() };
    anyhow::ensure!(
        0.0 <= cfg.band_low && cfg.band_low < cfg.band_high && cfg.band_high <= 1.0,
        "band must satisfy 0 ≤ low < high ≤ 1"
    );
    let solver: Box<dyn Solver> = match (&a.solver_cmd, &a.model) {
        (Some(cmd), _) => Box::new(CommandSolver { command: cmd.clone(), name: "command".into() }),
        (None, Some(model)) => Box::new(AgentCliSolver {
            frognano: match &a.frognano_bin {
                Some(p) => p.clone(),
                None => std::env::current_exe()?,
            },
            model: model.clone(),
            endpoint: a.endpoint.clone(),
            extra_args: if a.no_sandbox { vec!["--no-sandbox".into()] } else { vec![] },
        }),
        (None, None) => anyhow::bail!("pass --model (with --endpoint) or --solver-cmd"),
    };
    let run_id = format!("calibrate-v{}", a.policy_version);
    let opts = SolveRunOptions {
        run_id: run_id.clone(),
        output: a.output.clone(),
        workers: a.workers.max(1),
        attempts: a.attempts,
        shard: None,
        exec: frognano_swe::executor::ExecOptions {
            repos: None,
            timeout: Duration::from_secs(a.timeout),
            isolation: if a.no_sandbox { Isolation::Unconfined } else { Isolation::Bubblewrap },
            work_root: std::env::temp_dir(),
        },
    };
    let ids: Vec<String> = instances.iter().map(|i| i.instance_id.clone()).collect();
    let levels: BTreeMap<String, usize> =
        instances.iter().map(|i| (i.instance_id.clone(), knobs_of(i).level())).collect();
    let (summary, _) = frognano_swe::runs::solve_and_grade(instances, solver.as_ref(), &opts)?;
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
    println!("{:<60} {:>6} {:>6}  state", "task", "p_hat", "n");
    for id in &ids {
        let e = &store.tasks[id];
        println!("{id:<60} {:>6.2} {:>6.1}  {:?}", e.p_hat(), e.n(), e.state);
    }
    let report = store.band_report(&cfg);
    println!(
        "band [{}, {}]: {} in band, {} above, {} below, {} calibrating, {} new; direction {:?}; request {} tasks",
        cfg.band_low,
        cfg.band_high,
        report.in_band,
        report.above,
        report.below,
        report.calibrating,
        report.new,
        report.direction,
        report.request
    );
    // The knobs most tasks were generated with, and where the controller moves them.
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    for l in levels.values() {
        *counts.entry(*l).or_default() += 1;
    }
    let current = Knobs::from_level(counts.iter().max_by_key(|(_, n)| **n).map_or(0, |(l, _)| *l));
    let next = store.next_knobs(current, &cfg);
    if let Some((p, n)) = store.level_pass_rate(current.level(), &cfg) {
        println!("tasks at the current knobs ({}): mean pass rate {p:.2} over {n} calibrated", current.synth_flags());
    }
    if report.request > 0 {
        println!("next synthesis: frognano synth … {} --max-tasks {}", next.synth_flags(), report.request);
    }
    println!("estimates: {}", a.estimates.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Top {
        #[command(flatten)]
        synth: SynthCommand,
    }

    #[test]
    fn issue_model_flags_parse_and_endpoint_needs_a_model() {
        Top::command_for_checks().debug_assert();
        let t =
            Top::try_parse_from(["x", "repo", "--issue-endpoint", "http://127.0.0.1:1", "--issue-model", "m"]).unwrap();
        let g = &t.synth.generate;
        assert_eq!(g.issue_model.as_deref(), Some("m"));
        assert_eq!(g.issue_attempts, crate::issue_model::DEFAULT_ATTEMPTS);
        let m = g.issue_model().unwrap().expect("an endpoint model");
        assert!(m.description().contains('m'));
        assert!(Top::try_parse_from(["x", "repo", "--issue-endpoint", "http://127.0.0.1:1"]).is_err());
        assert!(Top::try_parse_from(["x", "repo"]).unwrap().synth.generate.issue_model().unwrap().is_none());
    }

    impl Top {
        fn command_for_checks() -> clap::Command {
            <Top as clap::CommandFactory>::command()
        }
    }
}
