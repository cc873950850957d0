//! `frognano eval …` as a library: one typed config per subcommand ([`GradeJob`], [`RunJob`],
//! [`ParseLogJob`], [`GradeLogJob`]), each with a `validate()` and a function that does the
//! work and returns what the command prints. The flags live in `crates/cli`.
//!
//! Errors of `validate()` name a field by its `frognano eval` flag (the field's name in
//! kebab case), say what was expected and what was found.

use std::path::PathBuf;
use std::time::Duration;

use frognano_sandbox::Isolation;
use serde_json::Value;

use crate::executor::ExecOptions;
use crate::localization::HintLevel;
use crate::parsers::StatusMap;
use crate::progress::Progress;
use crate::ray::{RayConfig, RayRunner};
use crate::runs::{
    AgentCliSolver, AttemptMetrics, CommandSolver, GradeOptions, Place, RunSummary, Shard, SolvePlace, SolveRunOptions,
    Solver,
};
use crate::SweInstance;

/// What `grade` and `run` share: the instances, where their repositories and logs are, and
/// how instances are executed.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// Instances: .json, .jsonl or Hugging Face .parquet, or a Harbor dataset folder (or one
    /// task directory).
    pub instances: PathBuf,
    /// Directory with one clone per repository (`owner__name` or `name`).
    pub repos: Option<PathBuf>,
    /// Run id: logs go to `<output>/logs/run_evaluation/<run_id>/`.
    pub run_id: String,
    /// Root directory for logs and reports.
    pub output: PathBuf,
    /// Parallel instances (0 counts as 1).
    pub workers: usize,
    /// Run only this shard of the instances.
    pub shard: Option<Shard>,
    /// Limit of the eval script.
    pub timeout: Duration,
    /// Where per-instance workspaces are created (default: the system temp dir).
    pub work_dir: Option<PathBuf>,
    /// Confinement of the tests.
    pub isolation: Isolation,
    /// Run the units on a Ray cluster instead of `workers` threads here.
    pub ray: Option<RayConfig>,
}

impl ExecConfig {
    /// `instances` with every other setting at the default of `frognano eval`.
    pub fn new(instances: impl Into<PathBuf>) -> Self {
        ExecConfig {
            instances: instances.into(),
            repos: None,
            run_id: "frognano".into(),
            output: PathBuf::from("."),
            workers: 1,
            shard: None,
            timeout: Duration::from_secs(1800),
            work_dir: None,
            isolation: Isolation::Bubblewrap,
            ray: None,
        }
    }

    /// Checks the settings without side effects.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.timeout.is_zero(), "--timeout must be at least 1 second, got 0");
        anyhow::ensure!(!self.run_id.trim().is_empty(), "--run-id must not be empty");
        if let Some(ray) = &self.ray {
            ray.validate()?;
        }
        Ok(())
    }

    fn exec_options(&self) -> ExecOptions {
        ExecOptions {
            repos: self.repos.clone(),
            timeout: self.timeout,
            isolation: self.isolation,
            work_root: self.work_dir.clone().unwrap_or_else(std::env::temp_dir),
        }
    }
}

/// `frognano eval grade`: grade predictions against instances.
#[derive(Debug, Clone)]
pub struct GradeJob {
    /// Instances, repositories, run id, workers, shard, timeout.
    pub exec: ExecConfig,
    /// Predictions: .jsonl, .json (list or dict keyed by id), or the word `gold`.
    pub predictions: PathBuf,
}

impl GradeJob {
    /// Checks the settings without side effects.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.exec.validate()
    }
}

/// Runs [`GradeJob`]: loads instances and predictions and grades them.
pub fn grade(job: &GradeJob, progress: &dyn Progress) -> anyhow::Result<RunSummary> {
    job.validate()?;
    let instances = crate::load_instances(&job.exec.instances)?;
    let preds = crate::instance::load_predictions(&job.predictions, &instances)?;
    let opts = GradeOptions {
        run_id: job.exec.run_id.clone(),
        output: job.exec.output.clone(),
        workers: job.exec.workers,
        shard: job.exec.shard,
        exec: job.exec.exec_options(),
    };
    match &job.exec.ray {
        None => crate::runs::grade_with_progress(instances, preds, &opts, progress),
        Some(ray) => {
            let runner = RayRunner { config: ray.clone() };
            crate::runs::grade_at(instances, preds, &opts, progress, Place::Remote(&runner))
        }
    }
}

/// The worker's side of one unit of a run on a cluster (`frognano unit`): `unit` is
/// what the driver sent (`kind` `grade` or `run`); the answer goes back to the driver, which
/// writes it as a local run would.
pub fn run_unit(unit: &Value) -> anyhow::Result<Value> {
    match unit["kind"].as_str() {
        Some("grade") => crate::runs::grade_unit(unit),
        Some("run") => {
            let config: SolverConfig = serde_json::from_value(unit["solver"].clone())
                .map_err(|e| anyhow::anyhow!("unit field `solver`: {e}"))?;
            config.validate()?;
            crate::runs::solve_unit(unit, config.solver()?.as_ref())
        }
        other => anyhow::bail!("unit field `kind`: expected \"grade\" or \"run\", found {other:?}"),
    }
}

/// Who solves the instances of `eval run` (and `synth calibrate`). As JSON (serde) it travels
/// with each unit of a run on a cluster.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SolverConfig {
    /// A shell command run in each workspace (gets `FROGNANO_ISSUE_FILE`,
    /// `FROGNANO_INSTANCE_ID`, `FROGNANO_ATTEMPT`); its edits are the patch.
    Command(String),
    /// The FrogNano agent, run as `frognano solve`.
    Agent {
        /// The `frognano` executable (`None`: this executable).
        frognano: Option<PathBuf>,
        /// Model name (at `endpoint`, or a model to run in process).
        model: String,
        /// OpenAI-compatible endpoint, if any.
        endpoint: Option<String>,
        /// Run the agent's commands unconfined.
        no_sandbox: bool,
        /// The tool-call format the model writes (a `--tool-parser` name; `None`: detected).
        tool_parser: Option<String>,
        /// Steps and tokens per turn of each attempt.
        limits: AgentLimits,
        /// Grammar-constrained tool calls (`--constrain-tools` / `--no-constrain-tools`;
        /// `None`: on unless the model is a Qwen3.5/FrogNano one). Needs a model run in
        /// process, not an endpoint.
        constrain_tools: Option<bool>,
        /// How the in-process model stores attention keys and values (a `--kv-cache` name:
        /// `f16`, `q8_0`, `q4_0`; `None`: the model's default). Ignored at an endpoint.
        kv_cache: Option<String>,
    },
}

/// How far one agent attempt may go: `frognano solve --max-steps` and
/// `--max-tokens-per-turn`, with the same defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AgentLimits {
    /// Steps (model calls) at most.
    pub max_steps: usize,
    /// Tokens generated per turn at most.
    pub max_tokens_per_turn: u32,
}

impl Default for AgentLimits {
    fn default() -> Self {
        AgentLimits { max_steps: 100, max_tokens_per_turn: 8192 }
    }
}

impl SolverConfig {
    /// Checks the settings without side effects.
    pub fn validate(&self) -> anyhow::Result<()> {
        match self {
            SolverConfig::Command(c) => anyhow::ensure!(!c.trim().is_empty(), "--solver-cmd must not be empty"),
            SolverConfig::Agent { model, limits, endpoint, constrain_tools, .. } => {
                anyhow::ensure!(!model.trim().is_empty(), "--model must not be empty");
                anyhow::ensure!(
                    !(endpoint.is_some() && *constrain_tools == Some(true)),
                    "--constrain-tools needs a model run in this process, not --endpoint (the server constrains \
                     its own replies: `frognano serve --constrain-tools`)"
                );
                anyhow::ensure!(limits.max_steps >= 1, "--max-steps must be at least 1, got 0");
                anyhow::ensure!(limits.max_tokens_per_turn >= 1, "--max-tokens-per-turn must be at least 1, got 0");
            }
        }
        Ok(())
    }

    /// The solver these settings describe.
    pub fn solver(&self) -> anyhow::Result<Box<dyn Solver>> {
        Ok(match self {
            SolverConfig::Command(cmd) => Box::new(CommandSolver { command: cmd.clone(), name: "command".into() }),
            SolverConfig::Agent {
                frognano,
                model,
                endpoint,
                no_sandbox,
                tool_parser,
                limits,
                constrain_tools,
                kv_cache,
            } => Box::new(AgentCliSolver {
                frognano: match frognano {
                    Some(p) => p.clone(),
                    None => std::env::current_exe()?,
                },
                model: model.clone(),
                endpoint: endpoint.clone(),
                no_sandbox: *no_sandbox,
                tool_parser: tool_parser.clone(),
                limits: *limits,
                constrain_tools: *constrain_tools,
                kv_cache: kv_cache.clone(),
            }),
        })
    }
}

/// `frognano eval run`: solve each instance, then grade.
#[derive(Debug, Clone)]
pub struct RunJob {
    /// Instances, repositories, run id, workers, shard, timeout.
    pub exec: ExecConfig,
    /// Who solves.
    pub solver: SolverConfig,
    /// Attempts per instance (pass@k, Avg@k; 0 counts as 1).
    pub attempts: usize,
    /// Where the fix goes, appended to every issue text the solver is given
    /// ([`crate::localization`]); grading is unchanged.
    pub hints: HintLevel,
}

impl RunJob {
    /// Checks the settings without side effects.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.exec.validate()?;
        self.solver.validate()
    }

    /// The instances of the run, each issue text with its hint.
    fn instances(&self) -> anyhow::Result<Vec<SweInstance>> {
        let mut instances = crate::load_instances(&self.exec.instances)?;
        crate::localization::add_hints(&mut instances, self.hints);
        Ok(instances)
    }

    fn solve_options(&self) -> SolveRunOptions {
        SolveRunOptions {
            run_id: self.exec.run_id.clone(),
            output: self.exec.output.clone(),
            workers: self.exec.workers,
            attempts: self.attempts,
            shard: self.exec.shard,
            exec: self.exec.exec_options(),
        }
    }
}

/// Runs [`RunJob`]: solves and grades every (instance, attempt).
pub fn run(job: &RunJob, progress: &dyn Progress) -> anyhow::Result<(RunSummary, AttemptMetrics)> {
    job.validate()?;
    if let Some(ray) = &job.exec.ray {
        return run_on_ray(job, ray, progress);
    }
    run_with_solver(job, job.solver.solver()?.as_ref(), progress)
}

/// [`run`] on a Ray cluster: each attempt is a unit whose worker builds the solver that
/// `job.solver` describes (an agent with a local model loads it in each attempt's
/// `frognano solve`, on the worker's node).
fn run_on_ray(job: &RunJob, ray: &RayConfig, progress: &dyn Progress) -> anyhow::Result<(RunSummary, AttemptMetrics)> {
    let instances = job.instances()?;
    let model = job.solver.solver()?.model_name();
    let solver = serde_json::to_value(&job.solver)?;
    let runner = RayRunner { config: ray.clone() };
    let place = SolvePlace::Remote { runner: &runner, model: &model, solver: &solver };
    crate::runs::solve_and_grade_at(instances, place, &job.solve_options(), progress)
}

/// [`run`] with a ready `solver` in place of the one `job.solver` describes (the cli passes
/// the in-process agent, which this crate cannot build); `job.solver` is still validated.
pub fn run_with_solver(
    job: &RunJob,
    solver: &dyn Solver,
    progress: &dyn Progress,
) -> anyhow::Result<(RunSummary, AttemptMetrics)> {
    job.validate()?;
    let instances = job.instances()?;
    crate::runs::solve_and_grade_with_progress(instances, solver, &job.solve_options(), progress)
}

/// `frognano eval parse-log`: one log through one of swebench's parsers.
#[derive(Debug, Clone)]
pub struct ParseLogJob {
    /// Parser name: any of swebench 5.0.2's `PARSER_REGISTRY`.
    pub parser: String,
    /// `version` for the parsers that read it (next, lighthouse).
    pub version: Option<String>,
    /// Instance id for the parsers that read it (immutable_js, jekyll).
    pub instance_id: Option<String>,
    /// The log file.
    pub log: PathBuf,
}

/// Runs [`ParseLogJob`]: the test → status map.
pub fn parse_log(job: &ParseLogJob) -> anyhow::Result<StatusMap> {
    let log = &job.log;
    let bytes = std::fs::read(log).map_err(|e| anyhow::anyhow!("cannot read log {}: {e}", log.display()))?;
    let text = crate::pytext::read_text_strict(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: not valid UTF-8 at byte {}", log.display(), e.valid_up_to()))?;
    let ctx = crate::parsers::ParseContext { instance_id: job.instance_id.clone(), version: job.version.clone() };
    Ok(crate::parsers::parse_log_with(&job.parser, &text, &ctx)?)
}

/// `frognano eval grade-log`: one log graded for one instance.
#[derive(Debug, Clone)]
pub struct GradeLogJob {
    /// Instance file (.json with one instance, or .jsonl/.json list; the first is used unless
    /// `instance_id` picks one).
    pub instance: PathBuf,
    /// Which instance of the file.
    pub instance_id: Option<String>,
    /// The test output log.
    pub log: PathBuf,
}

/// Runs [`GradeLogJob`]: swebench's per-instance report (print it with
/// [`crate::report::instance_report_text`]).
pub fn grade_log(job: &GradeLogJob) -> anyhow::Result<Value> {
    let insts = crate::load_instances(&job.instance)?;
    let inst = match &job.instance_id {
        Some(id) => insts
            .iter()
            .find(|i| &i.instance_id == id)
            .ok_or_else(|| anyhow::anyhow!("{}: no instance {id:?}", job.instance.display()))?,
        None => insts.first().ok_or_else(|| anyhow::anyhow!("{}: no instances", job.instance.display()))?,
    };
    let bytes = std::fs::read(&job.log).map_err(|e| anyhow::anyhow!("cannot read log {}: {e}", job.log.display()))?;
    let grade = crate::grading::eval_report(&inst.grading_spec()?, Some(""), &bytes)
        .map_err(|e| anyhow::anyhow!("grader error (swebench writes no report): {e}"))?;
    Ok(grade.report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_name_the_field_and_what_was_found() {
        let mut exec = ExecConfig::new("set.jsonl");
        exec.validate().unwrap();
        exec.timeout = Duration::ZERO;
        assert_eq!(exec.validate().unwrap_err().to_string(), "--timeout must be at least 1 second, got 0");
        let job = RunJob {
            exec: ExecConfig::new("set.jsonl"),
            solver: SolverConfig::Command(" ".into()),
            attempts: 1,
            hints: HintLevel::None,
        };
        assert_eq!(job.validate().unwrap_err().to_string(), "--solver-cmd must not be empty");
        let agent = |endpoint: Option<&str>, constrain_tools| SolverConfig::Agent {
            frognano: None,
            model: "m".into(),
            endpoint: endpoint.map(String::from),
            no_sandbox: false,
            tool_parser: None,
            limits: AgentLimits::default(),
            constrain_tools,
            kv_cache: None,
        };
        agent(None, Some(true)).validate().unwrap();
        agent(Some("http://h:1/v1"), Some(false)).validate().unwrap();
        let err = agent(Some("http://h:1/v1"), Some(true)).validate().unwrap_err().to_string();
        assert!(err.contains("--constrain-tools") && err.contains("--endpoint"), "{err}");
    }

    #[test]
    fn the_cli_solver_passes_the_constraint_choice_on_to_frognano_solve() {
        // A fake `frognano` that records its arguments and leaves an empty patch.
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("frognano");
        let log = dir.path().join("args");
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\necho \"$@\" >> {}\nwhile [ $# -gt 0 ]; do [ \"$1\" = --output ] && mkdir -p \"$2\" && : > \"$2/patch.diff\"; shift; done\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let line = r#"{"instance_id": "a__b-1", "repo": "a/b", "base_commit": "0", "patch": "", "problem_statement": "x", "FAIL_TO_PASS": ["t"], "PASS_TO_PASS": [], "version": "1", "test_cmd": "true", "log_parser": "gotest"}"#;
        let inst = crate::instance::parse_jsonl_instances(line, "t.jsonl").unwrap().remove(0);
        for (choice, flag) in
            [(Some(true), Some("--constrain-tools")), (Some(false), Some("--no-constrain-tools")), (None, None)]
        {
            std::fs::write(&log, "").unwrap();
            let config = SolverConfig::Agent {
                frognano: Some(fake.clone()),
                model: "m".into(),
                endpoint: None,
                no_sandbox: true,
                tool_parser: None,
                limits: AgentLimits::default(),
                constrain_tools: choice,
                kv_cache: Some("q8_0".into()),
            };
            config.solver().unwrap().solve(&inst, dir.path(), 0).unwrap();
            let args = std::fs::read_to_string(&log).unwrap();
            let words: Vec<&str> = args.split_whitespace().collect();
            for f in ["--constrain-tools", "--no-constrain-tools"] {
                assert_eq!(words.contains(&f), flag == Some(f), "{choice:?}: {args}");
            }
            // The KV cache type goes on to the child as its own flag.
            let kv = words.iter().position(|w| *w == "--kv-cache").map(|i| words[i + 1]);
            assert_eq!(kv, Some("q8_0"), "{args}");
        }
    }
}
