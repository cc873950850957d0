//! `frognano synth …`: the flags, turned into `frognano_synth`'s configs; the work and its
//! errors are the library's.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use frognano_sandbox::Isolation;
use frognano_synth::intake::Source;
use frognano_synth::issue_model::IssueModel;
use frognano_synth::jobs::{CalibrateConfig, IssueModelConfig};
use frognano_synth::mutate::parse_operator_names;
use frognano_synth::pipeline::{GenOptions, SynthOptions};

use crate::progress::Bar;

/// `frognano synth`: `frognano synth [REPO] [--pypi N==V|FILE | --crate N@V|FILE | --npm N@V |
/// --go M@V] --out DIR`, or
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
    /// Many packages from a manifest, in parallel, resumable, one merged tasks.jsonl and a
    /// yield report.
    Batch(BatchArgs),
}

/// `frognano synth batch MANIFEST`.
#[derive(Debug, Clone, clap::Args)]
pub struct BatchArgs {
    /// One package per line: `pypi:NAME==VER`, `crate:NAME@VER`, `npm:NAME@VER`,
    /// `go:MODULE@VER`, `go:MODULE@debian` or a local git repository path, optionally followed by a time budget
    /// (`600`, `600s`, `10m`); `#` starts a comment.
    pub manifest: PathBuf,
    /// Output folder: tasks.jsonl (merged), batch.jsonl (finished packages), yield.json,
    /// packages/ (one synth output per package). Rerun with the same folder to resume.
    #[arg(long, default_value = "synth-batch")]
    pub out: PathBuf,
    /// Packages run at once.
    #[arg(long, default_value_t = 2)]
    pub jobs: usize,
    /// Validation workers per package.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Time budget of a package whose manifest line gives none (seconds, or with s/m/h).
    #[arg(long, default_value = "10m")]
    pub budget: String,
    /// Time limit of a package's clean-tree suite run in seconds (slower: suite_too_slow).
    #[arg(long, default_value_t = 300)]
    pub suite_limit: u64,
    /// Stop each package after this many accepted tasks.
    #[arg(long, default_value_t = 3)]
    pub max_tasks: usize,
    /// Cap on single-bug candidates per package.
    #[arg(long, default_value_t = 200)]
    pub max_candidates: usize,
    /// Seed of candidate generation.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Entities simpler than this are not mutated.
    #[arg(long, default_value_t = 3)]
    pub min_complexity: u32,
    /// Minimum per-run timeout in seconds (actual: max(this, 3 × reference suite time)).
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Largest share of tests one bug may fail.
    #[arg(long, default_value_t = 0.5)]
    pub max_f2p_fraction: f64,
    /// Run tests without confinement.
    #[arg(long)]
    pub no_sandbox: bool,
    /// Each package as a task on a Ray cluster (--out on a path every node sees; --jobs is
    /// then the cluster's to decide).
    #[command(flatten)]
    pub ray: crate::ray::RayArgs,
}

impl BatchArgs {
    /// The batch these arguments ask for (reads and checks the manifest).
    pub fn options(&self) -> anyhow::Result<frognano_synth::batch::BatchOptions> {
        let budget = frognano_synth::batch::parse_budget(&self.budget).ok_or_else(|| {
            anyhow::anyhow!("--budget: expected a duration such as 600, 600s or 10m, found {:?}", self.budget)
        })?;
        let entries = frognano_synth::batch::parse_manifest(&self.manifest, budget)?;
        let template = SynthOptions {
            source: Source::Local { path: PathBuf::from("."), commit: None },
            out: self.out.clone(),
            gen: GenOptions {
                seed: self.seed,
                min_complexity: self.min_complexity,
                operators: None,
                max_candidates: self.max_candidates,
            },
            workers: self.workers.max(1),
            max_tasks: Some(self.max_tasks),
            combine: 0,
            max_combos: 0,
            min_timeout: Duration::from_secs(self.timeout),
            max_f2p_fraction: self.max_f2p_fraction,
            isolation: if self.no_sandbox { Isolation::Unconfined } else { Isolation::Bubblewrap },
            python: None,
            harbor: None,
            issue_model: None,
        };
        template.validate()?;
        Ok(frognano_synth::batch::BatchOptions {
            entries,
            out: self.out.clone(),
            jobs: self.jobs,
            template,
            suite_limit: Duration::from_secs(self.suite_limit),
        })
    }
}

/// `frognano synth [REPO]`: repository intake, bug injection, validation, tasks.
#[derive(Debug, Clone, clap::Args)]
pub struct GenerateArgs {
    /// A local git repository.
    #[arg(conflicts_with_all = ["pypi", "krate", "npm", "go"])]
    pub repo: Option<PathBuf>,
    /// Commit of the local repository (default HEAD).
    #[arg(long, requires = "repo")]
    pub commit: Option<String>,
    /// A PyPI source distribution: NAME==VERSION (fetched with pip), or a local sdist file
    /// (`.tar.gz`, `.tgz`, `.zip`).
    #[arg(long, conflicts_with_all = ["krate", "npm", "go"])]
    pub pypi: Option<String>,
    /// A crates.io crate: NAME@VERSION (downloaded from static.crates.io), or a local `.crate`
    /// file.
    #[arg(long = "crate", conflicts_with_all = ["npm", "go"])]
    pub krate: Option<String>,
    /// An npm package: NAME@VERSION (the published tarball, fetched with `npm pack`).
    #[arg(long, conflicts_with = "go")]
    pub npm: Option<String>,
    /// A Go module: MODULE@VERSION (fetched from the module proxy with `go mod download`), or
    /// MODULE@debian: the version Debian's golang-*-dev package ships (apt-get download; its
    /// requirements from Debian too), for machines that cannot reach the module proxy.
    #[arg(long)]
    pub go: Option<String>,
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
    #[arg(long, default_value_t = frognano_synth::issue_model::DEFAULT_ATTEMPTS)]
    pub issue_attempts: usize,
    /// Each candidate's validation as a task on a Ray cluster (--out on a path every node
    /// sees; with --max-tasks, --workers × 4 candidates go out at a time).
    #[command(flatten)]
    pub ray: crate::ray::RayArgs,
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
    #[command(flatten)]
    /// Who solves each attempt.
    pub solver: crate::eval::SolverArgs,
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
    /// Run without confinement.
    #[arg(long)]
    pub no_sandbox: bool,
    /// Append where the fix goes to every issue text (`file`, `function` or `line`, as `eval
    /// run --hints`): calibrates the tasks at that difficulty; give each level its own
    /// --estimates file.
    #[arg(long, value_name = "LEVEL", default_value = "none", value_parser = crate::train::parse_hint_level)]
    pub hints: frognano_swe::localization::HintLevel,
}

impl GenerateArgs {
    /// The issue-writing model these arguments ask for, if any.
    pub fn issue_model_config(&self) -> Option<IssueModelConfig> {
        let model = self.issue_model.clone()?;
        Some(IssueModelConfig {
            model,
            endpoint: self.issue_endpoint.clone(),
            timeout: Duration::from_secs(self.issue_timeout),
            attempts: self.issue_attempts,
        })
    }

    /// The issue-writing model these arguments ask for (loaded now), if any.
    pub fn issue_model(&self) -> anyhow::Result<Option<Arc<IssueModel>>> {
        self.issue_model_config().map(|c| c.load()).transpose()
    }

    /// The pipeline options these arguments stand for (loads `--issue-model`).
    pub fn options(&self) -> anyhow::Result<SynthOptions> {
        let source = match (&self.repo, &self.pypi, &self.krate, &self.npm, &self.go) {
            (Some(p), None, None, None, None) => Source::Local { path: p.clone(), commit: self.commit.clone() },
            (None, Some(s), None, None, None) => Source::pypi(s)?,
            (None, None, Some(s), None, None) => Source::krate(s)?,
            (None, None, None, Some(s), None) => Source::npm(s)?,
            (None, None, None, None, Some(s)) => Source::go(s)?,
            _ => anyhow::bail!(
                "give one source: a repository path, --pypi NAME==VERSION, --crate NAME@VERSION, --npm NAME@VERSION or --go MODULE@VERSION"
            ),
        };
        let mut opts = SynthOptions {
            source,
            out: self.out.clone(),
            gen: GenOptions {
                seed: self.seed,
                min_complexity: self.min_complexity,
                operators: parse_operator_names(&self.operators)?,
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
            issue_model: None,
        };
        // Checked before the issue model loads: a bad flag should not wait for a model.
        opts.validate()?;
        opts.issue_model = self.issue_model()?;
        Ok(opts)
    }
}

impl CalibrateArgs {
    /// The calibration these arguments ask for.
    pub fn config(&self) -> anyhow::Result<CalibrateConfig> {
        Ok(CalibrateConfig {
            tasks: self.tasks.clone(),
            estimates: self.estimates.clone(),
            attempts: self.attempts,
            policy_version: self.policy_version,
            solver: self.solver.config(self.no_sandbox)?,
            band_low: self.band_low,
            band_high: self.band_high,
            workers: self.workers,
            output: self.output.clone(),
            timeout: Duration::from_secs(self.timeout),
            isolation: if self.no_sandbox { Isolation::Unconfined } else { Isolation::Bubblewrap },
            hints: self.hints,
        })
    }
}

/// Runs `frognano synth`.
pub fn run(cmd: SynthCommand) -> anyhow::Result<()> {
    match cmd.sub {
        Some(SynthSub::Calibrate(a)) => run_calibrate(&a),
        Some(SynthSub::Batch(a)) => run_batch(&a),
        None => {
            let runner = cmd.generate.ray.runner()?;
            let runner = runner.as_ref().map(|r| r as &dyn frognano_swe::remote::UnitRunner);
            let limits = frognano_synth::pipeline::RunLimits::default();
            let opts = cmd.generate.options()?;
            let s = frognano_synth::pipeline::synthesize_at(&opts, &Bar::candidates(), &limits, runner)?;
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

fn run_batch(a: &BatchArgs) -> anyhow::Result<()> {
    let opts = a.options()?;
    let runner = a.ray.runner()?;
    let runner = runner.as_ref().map(|r| r as &dyn frognano_swe::remote::UnitRunner);
    let r = frognano_synth::batch::run_batch_at(&opts, &Bar::counting(), runner)?;
    println!("{:<50} {:>5} {:>6} {:>7}  outcome", "package", "tasks", "tried", "seconds");
    for p in &r.packages {
        println!("{:<50} {:>5} {:>6} {:>7.0}  {}", p.spec, p.tasks, p.candidates_tried, p.seconds, p.outcome);
    }
    let outcomes: Vec<String> = r.outcomes.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!(
        "{} tasks from {} packages ({}); {:.1} tasks per CPU-minute this run ({:.0} CPU s, {:.0} wall s)",
        r.tasks,
        r.packages.len(),
        outcomes.join(", "),
        r.tasks_per_cpu_minute,
        r.cpu_seconds,
        r.wall_seconds
    );
    if !r.unfinished.is_empty() {
        println!("unfinished: {}", r.unfinished.join(" "));
    }
    println!("tasks: {}", opts.out.join("tasks.jsonl").display());
    println!("report: {}", opts.out.join("yield.json").display());
    Ok(())
}

fn run_calibrate(a: &CalibrateArgs) -> anyhow::Result<()> {
    let config = a.config()?;
    config.validate()?;
    let c = match crate::eval::in_process_solver(&config.solver, config.workers)? {
        Some(agent) => frognano_synth::jobs::calibrate_with_solver(&config, &agent, &Bar::counting())?,
        None => frognano_synth::jobs::calibrate(&config, &Bar::counting())?,
    };
    println!("{:<60} {:>6} {:>6}  state", "task", "p_hat", "n");
    for id in &c.task_ids {
        let e = &c.store.tasks[id];
        println!("{id:<60} {:>6.2} {:>6.1}  {:?}", e.p_hat(), e.n(), e.state);
    }
    let report = &c.band;
    println!(
        "band [{}, {}]: {} in band, {} above, {} below, {} calibrating, {} new; direction {:?}; request {} tasks",
        c.frontier.band_low,
        c.frontier.band_high,
        report.in_band,
        report.above,
        report.below,
        report.calibrating,
        report.new,
        report.direction,
        report.request
    );
    if let Some((p, n)) = c.current_pass_rate {
        println!("tasks at the current knobs ({}): mean pass rate {p:.2} over {n} calibrated", c.current.synth_flags());
    }
    if report.request > 0 {
        println!("next synthesis: frognano synth … {} --max-tasks {}", c.next.synth_flags(), report.request);
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
        <Top as clap::CommandFactory>::command().debug_assert();
        let t =
            Top::try_parse_from(["x", "repo", "--issue-endpoint", "http://127.0.0.1:1", "--issue-model", "m"]).unwrap();
        let g = &t.synth.generate;
        assert_eq!(g.issue_model.as_deref(), Some("m"));
        assert_eq!(g.issue_attempts, frognano_synth::issue_model::DEFAULT_ATTEMPTS);
        let m = g.issue_model().unwrap().expect("an endpoint model");
        assert!(m.description().contains('m'));
        assert!(Top::try_parse_from(["x", "repo", "--issue-endpoint", "http://127.0.0.1:1"]).is_err());
        assert!(Top::try_parse_from(["x", "repo"]).unwrap().synth.generate.issue_model().unwrap().is_none());
    }

    #[test]
    fn flags_become_options_and_bad_ones_are_named() {
        let t = Top::try_parse_from(["x", "repo", "--operators", "op_swap,remove_loop", "--combine", "2"]).unwrap();
        let o = t.synth.generate.options().unwrap();
        assert_eq!(o.gen.operators.as_ref().map(Vec::len), Some(2));
        assert_eq!(o.combine, 2);
        let t = Top::try_parse_from(["x", "repo", "--operators", "nope"]).unwrap();
        let e = t.synth.generate.options().unwrap_err().to_string();
        assert!(e.starts_with("unknown operator \"nope\"; known: op_change"), "{e}");
        let t = Top::try_parse_from(["x", "repo", "--max-f2p-fraction", "0"]).unwrap();
        assert_eq!(t.synth.generate.options().unwrap_err().to_string(), "--max-f2p-fraction must be in (0, 1]");
    }
}
