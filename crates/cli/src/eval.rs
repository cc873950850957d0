//! `frognano eval …`: the flags, turned into `frognano_swe::eval`'s configs; the work and
//! its errors are the library's.

use std::path::PathBuf;
use std::time::Duration;

use frognano_agent::swe_solver::AgentSolver;
use frognano_protocol::codec::ToolParser;
use frognano_sandbox::Isolation;
use frognano_swe::eval::{AgentLimits, ExecConfig, GradeJob, GradeLogJob, ParseLogJob, RunJob, SolverConfig};
use frognano_swe::runs::Shard;

use crate::progress::Bar;

/// `frognano eval` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum EvalCommand {
    /// Grade predictions (JSONL, list or dict JSON, or `gold`) against instances, exactly as
    /// swebench 5.0.2 grades; writes logs/run_evaluation/<run-id>/ and <model>.<run-id>.json.
    Grade(GradeArgs),
    /// Solve each instance with an agent, then grade; pass@k and Avg@k over --attempts.
    Run(RunArgs),
    /// Parse a test log with one of swebench's parsers; prints the test → status map as JSON.
    ParseLog(ParseLogArgs),
    /// Grade one log for one instance; prints swebench's per-instance report JSON.
    GradeLog(GradeLogArgs),
}

/// Options shared by `grade` and `run`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExecArgs {
    /// Instances: .json, .jsonl or Hugging Face .parquet (SWE-bench v4 or v5 fields), or a
    /// Harbor dataset folder (or one task directory), verified by its tests/test.sh.
    #[arg(long)]
    pub instances: PathBuf,
    /// Directory with one clone per repository (`owner__name` or `name`); instances may
    /// instead carry `repo_path`.
    #[arg(long)]
    pub repos: Option<PathBuf>,
    /// Run id: logs go to <output>/logs/run_evaluation/<run-id>/.
    #[arg(long, default_value = "frognano")]
    pub run_id: String,
    /// Root directory for logs and reports.
    #[arg(long, default_value = ".")]
    pub output: PathBuf,
    /// Parallel instances.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Run only shard i of N (0-based), e.g. 2/8, for Kubernetes Indexed Jobs / Slurm arrays.
    #[arg(long)]
    pub shard: Option<Shard>,
    /// Seconds the eval script may run (swebench's default is 1800).
    #[arg(long, default_value_t = 1800)]
    pub timeout: u64,
    /// Where per-instance workspaces are created (default: the system temp dir).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Run tests without confinement (no network or write protection).
    #[arg(long)]
    pub no_sandbox: bool,
    /// Every instance attempt as a task on a Ray cluster.
    #[command(flatten)]
    pub ray: crate::ray::RayArgs,
}

impl ExecArgs {
    fn config(&self) -> anyhow::Result<ExecConfig> {
        let ray = self.ray.config()?;
        Ok(ExecConfig {
            instances: self.instances.clone(),
            repos: self.repos.clone(),
            run_id: self.run_id.clone(),
            output: self.output.clone(),
            workers: self.workers,
            shard: self.shard,
            timeout: Duration::from_secs(self.timeout),
            work_dir: self.work_dir.clone(),
            isolation: if self.no_sandbox { Isolation::Unconfined } else { Isolation::Bubblewrap },
            ray,
        })
    }
}

/// `frognano eval grade`.
#[derive(Debug, Clone, clap::Args)]
pub struct GradeArgs {
    #[command(flatten)]
    /// Instances, repositories, run id, workers, shard, timeout.
    pub exec: ExecArgs,
    /// Predictions: .jsonl, .json (list or dict keyed by id), or the word `gold`.
    #[arg(long)]
    pub predictions: PathBuf,
}

/// `frognano eval run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    /// Instances, repositories, run id, workers, shard, timeout.
    pub exec: ExecArgs,
    #[command(flatten)]
    /// Who solves each attempt.
    pub solver: SolverArgs,
    /// Attempts per instance (pass@k, Avg@k).
    #[arg(long, default_value_t = 1)]
    pub attempts: usize,
    /// Append where the fix goes to every issue text, read from the gold patch ("oracle
    /// localization"): `file`, `function` (and file) or `line` (and function and file).
    #[arg(long, value_name = "LEVEL", default_value = "none", value_parser = crate::train::parse_hint_level)]
    pub hints: frognano_swe::localization::HintLevel,
}

/// Who solves each attempt (`eval run`, `synth calibrate`): the FrogNano agent on a model, or
/// a shell command.
#[derive(Debug, Clone, clap::Args)]
pub struct SolverArgs {
    /// The agent's model: a local checkpoint, `.gguf` file or cached hub id (loaded once, in
    /// this process), or with --endpoint the model name the server knows.
    #[arg(long, required_unless_present = "solver_cmd")]
    pub model: Option<String>,
    /// OpenAI-compatible endpoint for the agent.
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Instead of the FrogNano agent, run this shell command in each workspace (gets
    /// FROGNANO_ISSUE_FILE, FROGNANO_INSTANCE_ID, FROGNANO_ATTEMPT); its edits are the patch.
    #[arg(long, conflicts_with_all = ["model", "endpoint"])]
    pub solver_cmd: Option<String>,
    /// Solve each attempt with `frognano solve` run from this executable, one process per
    /// attempt (default: a local --model runs in this process, on one scheduler shared by the
    /// workers; with --endpoint, this executable).
    #[arg(long)]
    pub frognano_bin: Option<PathBuf>,
    /// The tool-call format the agent's model writes: qwen_xml, hermes, llama3_json or
    /// mistral (default: detected from the chat template).
    #[arg(long, value_name = "NAME", conflicts_with = "solver_cmd")]
    pub tool_parser: Option<ToolParser>,
    /// Steps (model calls) of each agent attempt at most, as `frognano solve --max-steps`.
    #[arg(long, default_value_t = AgentLimits::default().max_steps, conflicts_with = "solver_cmd")]
    pub max_steps: usize,
    /// Tokens the agent generates per turn at most, as `frognano solve --max-tokens-per-turn`.
    #[arg(long, default_value_t = AgentLimits::default().max_tokens_per_turn, conflicts_with = "solver_cmd")]
    pub max_tokens_per_turn: u32,
    /// The agent's tool calls under a grammar, as `frognano solve --constrain-tools`.
    #[command(flatten)]
    pub constrain: crate::constrain::ConstrainToolsArgs,
    /// How the agent's in-process model stores attention keys and values: f16 (default),
    /// q8_0 or q4_0, as `frognano solve --kv-cache` (llama.cpp's -ctk/-ctv).
    #[arg(long = "kv-cache", value_name = "TYPE", value_parser = crate::run::parse_kv_cache, conflicts_with_all = ["solver_cmd", "endpoint"])]
    pub kv_cache: Option<frognano_model::KvType>,
    /// Threads of the agent's in-process model (`-t/--threads`).
    #[command(flatten)]
    pub threads: crate::threads::ThreadArgs,
}

impl SolverArgs {
    /// The solver these flags ask for; `no_sandbox` runs the agent's commands unconfined.
    pub fn config(&self, no_sandbox: bool) -> anyhow::Result<SolverConfig> {
        Ok(match (&self.solver_cmd, &self.model) {
            (Some(_), _) if self.constrain.choice().is_some() => {
                anyhow::bail!("--constrain-tools / --no-constrain-tools go with --model, not --solver-cmd")
            }
            (Some(cmd), _) => SolverConfig::Command(cmd.clone()),
            (None, Some(model)) => SolverConfig::Agent {
                frognano: self.frognano_bin.clone(),
                model: model.clone(),
                endpoint: self.endpoint.clone(),
                no_sandbox,
                tool_parser: self.tool_parser.map(|p| p.to_string()),
                limits: AgentLimits { max_steps: self.max_steps, max_tokens_per_turn: self.max_tokens_per_turn },
                constrain_tools: self.constrain.choice(),
                kv_cache: self.kv_cache.map(|kv| kv.to_string()),
            },
            (None, None) => anyhow::bail!("pass --model (with --endpoint) or --solver-cmd"),
        })
    }
}

/// `frognano eval parse-log`.
#[derive(Debug, Clone, clap::Args)]
pub struct ParseLogArgs {
    /// Parser name: any of swebench 5.0.2's PARSER_REGISTRY (`parse_log_pytest`, `django`,
    /// `jest`, `googletest`, `maven`, `phpunit`, `rspec_transformed_json`, …; see --list).
    #[arg(long, required_unless_present = "list")]
    pub parser: Option<String>,
    /// `version` for the parsers that read it (next, lighthouse).
    #[arg(long)]
    pub version: Option<String>,
    /// Instance id for the parsers that read it (immutable_js, jekyll).
    #[arg(long)]
    pub instance_id: Option<String>,
    /// Print the registry names of every parser and exit.
    #[arg(long)]
    pub list: bool,
    /// The log file.
    #[arg(required_unless_present = "list")]
    pub log: Option<PathBuf>,
}

/// `frognano eval grade-log`.
#[derive(Debug, Clone, clap::Args)]
pub struct GradeLogArgs {
    /// Instance file (.json with one instance, or .jsonl/.json list; the first is used
    /// unless --instance-id picks one).
    #[arg(long)]
    pub instance: PathBuf,
    /// Which instance of the file.
    #[arg(long)]
    pub instance_id: Option<String>,
    /// The test output log.
    #[arg(long)]
    pub log: PathBuf,
}

/// Runs `frognano eval`.
pub fn run(cmd: EvalCommand) -> anyhow::Result<()> {
    match cmd {
        EvalCommand::ParseLog(a) => {
            if a.list {
                for name in frognano_swe::parsers::implemented_parsers() {
                    println!("{name}");
                }
                return Ok(());
            }
            let (Some(parser), Some(log)) = (a.parser, a.log) else {
                anyhow::bail!("parse-log needs --parser NAME and a LOG file (or --list)");
            };
            let job = ParseLogJob { parser, version: a.version, instance_id: a.instance_id, log };
            let map = frognano_swe::eval::parse_log(&job)?;
            println!("{}", serde_json::to_string_pretty(&map)?);
            Ok(())
        }
        EvalCommand::GradeLog(a) => {
            let job = GradeLogJob { instance: a.instance, instance_id: a.instance_id, log: a.log };
            let report = frognano_swe::eval::grade_log(&job)?;
            println!("{}", frognano_swe::report::instance_report_text(&report));
            Ok(())
        }
        EvalCommand::Grade(a) => {
            let job = GradeJob { exec: a.exec.config()?, predictions: a.predictions };
            job.validate()?;
            let s = frognano_swe::eval::grade(&job, &Bar::counting())?;
            println!(
                "resolved {}/{} ({:.1}%), errors {}",
                s.resolved,
                s.instances,
                100.0 * s.resolved as f64 / s.instances.max(1) as f64,
                s.errors
            );
            println!("results: {}", s.results_path.display());
            if let Some(p) = s.report_path {
                println!("report: {}", p.display());
            }
            Ok(())
        }
        EvalCommand::Run(a) => {
            let job = RunJob {
                solver: a.solver.config(a.exec.no_sandbox)?,
                exec: a.exec.config()?,
                attempts: a.attempts,
                hints: a.hints,
            };
            job.validate()?;
            // On a cluster each worker builds its own solver; nothing is loaded here.
            let local = if job.exec.ray.is_none() { in_process_solver(&job.solver, job.exec.workers)? } else { None };
            let (s, m) = match local {
                Some(agent) => frognano_swe::eval::run_with_solver(&job, &agent, &Bar::counting())?,
                None => frognano_swe::eval::run(&job, &Bar::counting())?,
            };
            println!(
                "resolved {}/{} instances; pass@1 {:.3}, pass@{k} {:.3}, Avg@{k} {:.3}; errors {}",
                s.resolved,
                s.instances,
                m.pass_at_1,
                m.pass_at_k,
                m.avg_at_k,
                s.errors,
                k = m.k
            );
            println!("results: {}", s.results_path.display());
            Ok(())
        }
    }
}

/// The agent in this process when `solver` is a local model (`--model` without `--endpoint`
/// or `--frognano-bin`): the model is loaded once, on one scheduler whose decode batches hold
/// up to `workers` attempts, each held to the solver's limits. `None` for every other solver.
pub fn in_process_solver(solver: &SolverConfig, workers: usize) -> anyhow::Result<Option<AgentSolver>> {
    let SolverConfig::Agent {
        frognano: None,
        model,
        endpoint: None,
        no_sandbox,
        tool_parser,
        limits,
        constrain_tools,
        kv_cache,
    } = solver
    else {
        return Ok(None);
    };
    let isolation = if *no_sandbox { Isolation::Unconfined } else { Isolation::Bubblewrap };
    let tool_parser = tool_parser.as_deref().map(ToolParser::from_name).transpose()?;
    let kv_cache = kv_cache.as_deref().map(crate::run::parse_kv_cache).transpose().map_err(anyhow::Error::msg)?;
    let mut agent = AgentSolver::load(model, workers.max(1), kv_cache)?
        .with_isolation(isolation)
        .with_tool_parser(tool_parser)
        .with_constrained_tools(*constrain_tools);
    agent.config.max_steps = limits.max_steps;
    agent.config.sampling.max_tokens = limits.max_tokens_per_turn;
    Ok(Some(agent))
}
