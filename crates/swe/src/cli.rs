//! `frognano eval …`: argument structs and their entry point, wired into the binary by
//! `crates/cli`.

use std::path::PathBuf;
use std::time::Duration;

use frognano_sandbox::Isolation;

use crate::executor::ExecOptions;
use crate::runs::{AgentCliSolver, CommandSolver, GradeOptions, Shard, SolveRunOptions, Solver};

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
}

impl ExecArgs {
    fn exec_options(&self) -> ExecOptions {
        ExecOptions {
            repos: self.repos.clone(),
            timeout: Duration::from_secs(self.timeout),
            isolation: if self.no_sandbox { Isolation::Unconfined } else { Isolation::Bubblewrap },
            work_root: self.work_dir.clone().unwrap_or_else(std::env::temp_dir),
        }
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
    /// Model name (at --endpoint), solved with `frognano solve`.
    #[arg(long, required_unless_present = "solver_cmd")]
    pub model: Option<String>,
    /// OpenAI-compatible endpoint for the agent.
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Instead of the FrogNano agent, run this shell command in each workspace (gets
    /// FROGNANO_ISSUE_FILE, FROGNANO_INSTANCE_ID, FROGNANO_ATTEMPT); its edits are the patch.
    #[arg(long, conflicts_with_all = ["model", "endpoint"])]
    pub solver_cmd: Option<String>,
    /// Attempts per instance (pass@k, Avg@k).
    #[arg(long, default_value_t = 1)]
    pub attempts: usize,
    /// The `frognano` executable used for `solve` (default: this executable).
    #[arg(long)]
    pub frognano_bin: Option<PathBuf>,
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

/// Entry point of `frognano eval`.
pub fn run_eval(cmd: EvalCommand) -> anyhow::Result<()> {
    match cmd {
        EvalCommand::ParseLog(a) => {
            if a.list {
                for name in crate::parsers::implemented_parsers() {
                    println!("{name}");
                }
                return Ok(());
            }
            let (Some(parser), Some(log)) = (&a.parser, &a.log) else {
                anyhow::bail!("parse-log needs --parser NAME and a LOG file (or --list)");
            };
            let bytes = std::fs::read(log).map_err(|e| anyhow::anyhow!("cannot read log {}: {e}", log.display()))?;
            let text = crate::pytext::read_text_strict(&bytes)
                .map_err(|e| anyhow::anyhow!("{}: not valid UTF-8 at byte {}", log.display(), e.valid_up_to()))?;
            let ctx = crate::parsers::ParseContext { instance_id: a.instance_id.clone(), version: a.version.clone() };
            let map = crate::parsers::parse_log_with(parser, &text, &ctx)?;
            println!("{}", serde_json::to_string_pretty(&map)?);
            Ok(())
        }
        EvalCommand::GradeLog(a) => {
            let insts = crate::instance::load_instances(&a.instance)?;
            let inst = match &a.instance_id {
                Some(id) => insts
                    .iter()
                    .find(|i| &i.instance_id == id)
                    .ok_or_else(|| anyhow::anyhow!("{}: no instance {id:?}", a.instance.display()))?,
                None => insts.first().ok_or_else(|| anyhow::anyhow!("{}: no instances", a.instance.display()))?,
            };
            let bytes =
                std::fs::read(&a.log).map_err(|e| anyhow::anyhow!("cannot read log {}: {e}", a.log.display()))?;
            let grade = crate::grading::eval_report(&inst.grading_spec()?, Some(""), &bytes)
                .map_err(|e| anyhow::anyhow!("grader error (swebench writes no report): {e}"))?;
            println!("{}", crate::report::instance_report_text(&grade.report));
            Ok(())
        }
        EvalCommand::Grade(a) => {
            let instances = crate::instance::load_instances(&a.exec.instances)?;
            let preds = crate::instance::load_predictions(&a.predictions, &instances)?;
            let opts = GradeOptions {
                run_id: a.exec.run_id.clone(),
                output: a.exec.output.clone(),
                workers: a.exec.workers,
                shard: a.exec.shard,
                exec: a.exec.exec_options(),
            };
            let s = crate::runs::grade(instances, preds, &opts)?;
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
            let instances = crate::instance::load_instances(&a.exec.instances)?;
            let solver: Box<dyn Solver> = match (&a.solver_cmd, &a.model) {
                (Some(cmd), _) => Box::new(CommandSolver { command: cmd.clone(), name: "command".into() }),
                (None, Some(model)) => Box::new(AgentCliSolver {
                    frognano: match &a.frognano_bin {
                        Some(p) => p.clone(),
                        None => std::env::current_exe()?,
                    },
                    model: model.clone(),
                    endpoint: a.endpoint.clone(),
                    extra_args: if a.exec.no_sandbox { vec!["--no-sandbox".into()] } else { vec![] },
                }),
                (None, None) => anyhow::bail!("pass --model (with --endpoint) or --solver-cmd"),
            };
            let opts = SolveRunOptions {
                run_id: a.exec.run_id.clone(),
                output: a.exec.output.clone(),
                workers: a.exec.workers,
                attempts: a.attempts,
                shard: a.exec.shard,
                exec: a.exec.exec_options(),
            };
            let (s, m) = crate::runs::solve_and_grade(instances, solver.as_ref(), &opts)?;
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
