//! Environments: where tasks come from and how one attempt is run and scored.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use frognano_agent::agent::{self, AgentConfig, Guards};
use frognano_agent::tools::ToolBox;
use frognano_agent::workspace::diff_in_sandbox;
use frognano_engine::{ChatParts, EngineLlm, Scheduler};
use frognano_protocol::Sampling;
use frognano_sandbox::{Isolation, Sandbox, SandboxSpec};
use frognano_swe::executor::{create_workspace, run_instance, ErrorKind, ExecOptions, Outcome as ExecOutcome};
use frognano_swe::instance::{repo_source, Prediction};
use frognano_swe::localization::{self, HintLevel};
use frognano_swe::SweInstance;
use frognano_synth::calibrate::{self, Knobs};
use frognano_synth::intake::Source;
use frognano_synth::pipeline::{synthesize, GenOptions, SynthOptions};
use frognano_synth::task_meta::SynthMeta;

use crate::rollout::{build_sequence, outcome_of_exit, Outcome, Rollout};

/// Limits and sampling of training rollouts. Sampling is raw (temperature 1, no top-p/top-k/
/// min-p by default) so the recorded logprobs are the policy's own (docs/rl.md §4).
#[derive(Debug, Clone)]
pub struct RolloutConfig {
    /// Sampling temperature (1.0 for training).
    pub temperature: f32,
    /// Tokens per assistant turn at most.
    pub max_tokens_per_turn: usize,
    /// Agent steps at most.
    pub max_steps: usize,
    /// Context limit in tokens.
    pub max_context_tokens: usize,
    /// Wall-clock budget of one attempt.
    pub max_time: Option<Duration>,
    /// Give partial credit (fraction of FAIL_TO_PASS tests passing) instead of 0/1.
    pub partial_credit: bool,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            temperature: 1.0,
            max_tokens_per_turn: 1024,
            max_steps: 30,
            max_context_tokens: 16_384,
            max_time: Some(Duration::from_secs(600)),
            partial_credit: false,
        }
    }
}

/// Which way the task pool should move when the learnability band runs dry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Most tasks are solved: make harder ones.
    Harder,
    /// Most tasks are failed: make easier ones.
    Easier,
}

/// A source of tasks and a way to attempt them.
pub trait Environment: Send + Sync {
    /// Short name for logs.
    fn name(&self) -> String;
    /// Ids of every task currently in the pool.
    fn task_ids(&self) -> Vec<String>;
    /// Runs one attempt of `task_id` on `sampler` (the policy's scheduler for this step,
    /// shared by every attempt running at the same time, so their decode steps are batched
    /// and a group's common prompt is prefilled once) drawing from `seed`, scores it, and
    /// returns the recorded rollout. The caller fills in `group`, `attempt` and
    /// `policy_version`. Infrastructure trouble is reported in the rollout's outcome
    /// ([`crate::rollout::Outcome::Infra`]); `Err` is for bad input (unknown task id).
    fn rollout(
        &self,
        sampler: &Arc<Scheduler>,
        task_id: &str,
        cfg: &RolloutConfig,
        seed: u64,
    ) -> anyhow::Result<Rollout>;
    /// Asks the task source for about `n` new tasks in `direction`; returns the new ids.
    /// Sources that cannot grow return an empty list.
    fn request_tasks(&mut self, direction: Direction, n: usize) -> anyhow::Result<Vec<String>> {
        let _ = (direction, n);
        Ok(Vec::new())
    }
}

// ------------------------------------------------------------------------------------------
// SWE tasks
// ------------------------------------------------------------------------------------------

/// A recording in-process LLM for one attempt on `sampler` (the step's scheduler over the
/// current weights), its context capped at `max_context` tokens.
pub fn recording_llm(chat: &ChatParts, sampler: &Arc<Scheduler>, max_context: usize) -> EngineLlm {
    EngineLlm::on_scheduler("policy", Arc::clone(sampler), chat.clone()).with_max_context(max_context).recording()
}

/// How a [`SweEnv`] runs attempts and verifies them.
#[derive(Debug, Clone)]
pub struct SweEnvOptions {
    /// Directory with one clone per repository for instances without `repo_path`.
    pub repos: Option<PathBuf>,
    /// Confinement of the agent's commands and of the tests.
    pub isolation: Isolation,
    /// Where workspaces are created (each removed after its attempt).
    pub work_root: PathBuf,
    /// Limit of one verifier run.
    pub test_timeout: Duration,
    /// Ask for a thinking block (the Leaf default).
    pub enable_thinking: bool,
    /// The agent's drift guards. Default: none, exactly the Leaf harness FrogNano is trained
    /// in. [`SweEnvOptions::small_model`] gives the notices `frognano solve` gives a small
    /// model.
    pub guards: Guards,
    /// Sample tool calls under a grammar of the offered tools (as `frognano solve
    /// --constrain-tools`): a malformed call cannot be produced. The recorded logprobs stay the
    /// model's own, so the loss is the unconstrained policy's.
    pub constrain_tools: bool,
    /// How much of the fix's location is appended to each issue text
    /// ([`frognano_swe::localization`]): a difficulty knob over the same tasks, for a policy
    /// that cannot find the faulty function of an unknown package by itself.
    pub hints: HintLevel,
}

impl SweEnvOptions {
    /// The harness `frognano solve` gives a model that is not Qwen3.5/FrogNano: tool calls
    /// under a grammar, the act, cut, repeat and steps-left notices with head-and-tail
    /// truncation, and Edit/Write refusing a file not yet Read — but no retries of malformed
    /// replies, whose thrown-away turns would leave the training sequence (every sampled token
    /// must stay in it).
    pub fn small_model(self) -> Self {
        SweEnvOptions { guards: Guards { malformed_retries: 0, ..Guards::default() }, constrain_tools: true, ..self }
    }
}

/// The harness around a task policy's attempts, as `frognano train` and its cluster workers
/// are told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TaskHarness {
    /// The harness `frognano solve` gives a small model ([`SweEnvOptions::small_model`])
    /// instead of the Leaf harness.
    pub small_model: bool,
    /// How much of the fix's location each issue text carries ([`SweEnvOptions::hints`]).
    pub hints: HintLevel,
}

impl TaskHarness {
    /// `opts` set up as this harness says.
    pub fn apply(self, opts: SweEnvOptions) -> SweEnvOptions {
        let opts = SweEnvOptions { hints: self.hints, ..opts };
        if self.small_model {
            opts.small_model()
        } else {
            opts
        }
    }
}

impl Default for SweEnvOptions {
    fn default() -> Self {
        SweEnvOptions {
            repos: None,
            isolation: Isolation::Bubblewrap,
            work_root: std::env::temp_dir(),
            test_timeout: Duration::from_secs(1800),
            enable_thinking: true,
            guards: Guards::leaf_exact(),
            constrain_tools: false,
            hints: HintLevel::None,
        }
    }
}

/// A repository to synthesize more tasks from when the curriculum asks
/// ([`Environment::request_tasks`]), with `frognano synth`'s settings.
#[derive(Debug, Clone)]
pub struct SynthSource {
    /// The local git repository.
    pub repo: PathBuf,
    /// Its commit (default `HEAD`).
    pub commit: Option<String>,
    /// `frognano synth --out` directory (tasks.jsonl, tasks.git, …); tasks already there are
    /// in the pool from the start.
    pub out: PathBuf,
    /// The knobs the pool was generated at; each request moves them one step.
    pub knobs: Knobs,
    /// Seed of the first request (each later request adds one).
    pub seed: u64,
    /// Single-bug candidates validated per request at most.
    pub max_candidates: usize,
    /// Validation workers.
    pub workers: usize,
    /// Python interpreter used as is (instead of a virtualenv).
    pub python: Option<PathBuf>,
    /// Lower bound of the validation timeout.
    pub min_timeout: Duration,
}

impl SynthSource {
    /// Defaults of `frognano synth` for `repo`, writing to `out`.
    pub fn new(repo: impl Into<PathBuf>, out: impl Into<PathBuf>) -> SynthSource {
        SynthSource {
            repo: repo.into(),
            commit: None,
            out: out.into(),
            knobs: Knobs::default(),
            seed: 0,
            max_candidates: 200,
            workers: 2,
            python: None,
            min_timeout: Duration::from_secs(120),
        }
    }
}

/// An environment over SWE-bench-format tasks with local repositories: `frognano synth`
/// output or any instance file whose tasks the local executor can run (`test_cmd` or a v5
/// `eval_script`). One attempt = a workspace at the base commit (no later history), the
/// Leaf agent loop (no drift guards) on the recording engine, the patch taken from the
/// workspace, graded exactly as `frognano eval` grades.
pub struct SweEnv {
    name: String,
    tasks: BTreeMap<String, SweInstance>,
    chat: ChatParts,
    opts: SweEnvOptions,
    synth: Option<SynthSource>,
    requests: u64,
}

/// The `synth` knob level of a synthesized task, when it has a (readable) `synth` record.
pub fn task_level(inst: &SweInstance) -> Option<usize> {
    SynthMeta::of(inst).ok().flatten().map(|m| m.knobs().level())
}

/// Loads tasks from `path`: an instance file (`.jsonl`, `.json`), a `frognano synth` output
/// directory (its `tasks.jsonl`), or a Harbor dataset written by `frognano synth --harbor`
/// (each task's `tests/instance.json`).
pub fn load_tasks(path: &Path) -> anyhow::Result<Vec<SweInstance>> {
    if !path.is_dir() {
        return frognano_swe::load_instances(path);
    }
    let tasks = path.join("tasks.jsonl");
    if tasks.is_file() {
        return frognano_swe::load_instances(&tasks);
    }
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("tests/instance.json").is_file())
        .collect();
    dirs.sort();
    for d in dirs {
        let file = d.join("tests/instance.json");
        let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        out.extend(frognano_swe::instance::parse_json_instances(&text, &file.display().to_string())?);
    }
    anyhow::ensure!(
        !out.is_empty(),
        "{}: no tasks (expected tasks.jsonl or Harbor task directories with tests/instance.json)",
        path.display()
    );
    Ok(out)
}

impl SweEnv {
    /// An environment over `instances`. Duplicate ids, and instances the local executor
    /// cannot run (neither `test_cmd` nor `eval_script`), are errors.
    pub fn new(
        name: impl Into<String>,
        instances: Vec<SweInstance>,
        chat: ChatParts,
        opts: SweEnvOptions,
    ) -> anyhow::Result<SweEnv> {
        let mut env = SweEnv { name: name.into(), tasks: BTreeMap::new(), chat, opts, synth: None, requests: 0 };
        env.insert(instances)?;
        Ok(env)
    }

    /// An environment over the tasks at `path` (see [`load_tasks`]).
    pub fn load(path: &Path, chat: ChatParts, opts: SweEnvOptions) -> anyhow::Result<SweEnv> {
        let instances = load_tasks(path)?;
        SweEnv::new(format!("swe:{}", path.display()), instances, chat, opts)
    }

    /// An environment that grows by synthesis from `source` (starting with the tasks already
    /// in its output directory, possibly none).
    pub fn from_synth(source: SynthSource, chat: ChatParts, opts: SweEnvOptions) -> anyhow::Result<SweEnv> {
        let tasks = source.out.join("tasks.jsonl");
        let instances = if tasks.is_file() { frognano_swe::load_instances(&tasks)? } else { Vec::new() };
        let mut env = SweEnv::new(format!("synth:{}", source.repo.display()), instances, chat, opts)?;
        env.synth = Some(source);
        Ok(env)
    }

    fn insert(&mut self, instances: Vec<SweInstance>) -> anyhow::Result<Vec<String>> {
        let mut ids = Vec::new();
        for inst in instances {
            anyhow::ensure!(
                inst.test_cmd.is_some() || inst.eval_script.is_some(),
                "task {}: needs `test_cmd` or `eval_script` to be verified locally",
                inst.instance_id
            );
            anyhow::ensure!(!self.tasks.contains_key(&inst.instance_id), "task {} appears twice", inst.instance_id);
            ids.push(inst.instance_id.clone());
            self.tasks.insert(inst.instance_id.clone(), inst);
        }
        Ok(ids)
    }

    /// The task `id`.
    pub fn task(&self, id: &str) -> Option<&SweInstance> {
        self.tasks.get(id)
    }

    /// Knob levels of the synthesized tasks (for [`crate::curriculum::Curriculum::add_task_at_level`]).
    pub fn levels(&self) -> BTreeMap<String, usize> {
        self.tasks.iter().filter_map(|(id, inst)| Some((id.clone(), task_level(inst)?))).collect()
    }

    /// The synthesis knobs in use, when the environment grows by synthesis.
    pub fn knobs(&self) -> Option<Knobs> {
        self.synth.as_ref().map(|s| s.knobs)
    }

    fn task_or_err(&self, id: &str) -> anyhow::Result<&SweInstance> {
        self.tasks.get(id).ok_or_else(|| anyhow::anyhow!("unknown task id {id:?} (not in {})", self.name))
    }

    /// Grades `patch` on task `task_id` with the task's tests (binary reward): the gold patch
    /// scores 1, an empty patch 0.
    pub fn verify(&self, task_id: &str, patch: &str) -> anyhow::Result<Outcome> {
        Ok(self.grade(self.task_or_err(task_id)?, patch, false))
    }

    /// Grades `patch` exactly as `frognano eval` grades (workspace at the base commit, the
    /// swebench apply chain, the eval script in the sandbox, the v5 report):
    /// resolved → reward 1; not resolved → 0, or with `partial_credit` the share of
    /// FAIL_TO_PASS tests passing; an empty patch → 0; tests past the timeout → 0 (a hung
    /// test is the patch's doing: the task was validated well within it). A repository that
    /// cannot be found, a patch taken from our own workspace that does not apply, a grader
    /// error or a log flagged as an environment failure → [`Outcome::Infra`].
    pub fn grade(&self, inst: &SweInstance, patch: &str, partial_credit: bool) -> Outcome {
        if patch.trim().is_empty() {
            return Outcome::Scored { reward: 0.0 };
        }
        let infra = |reason: String| Outcome::Infra { reason };
        if let Err(e) = std::fs::create_dir_all(&self.opts.work_root) {
            return infra(format!("cannot create {}: {e}", self.opts.work_root.display()));
        }
        let logs = match frognano_sandbox::scratch::scratch_dir(&self.opts.work_root, "rl_grade") {
            Ok(d) => d,
            Err(e) => return infra(format!("cannot create a log directory: {e}")),
        };
        let pred = Prediction {
            instance_id: inst.instance_id.clone(),
            model_name_or_path: "frognano-rl".into(),
            model_patch: Some(patch.to_string()),
            extra: Default::default(),
        };
        let exec = ExecOptions {
            repos: self.opts.repos.clone(),
            timeout: self.opts.test_timeout,
            isolation: self.opts.isolation,
            work_root: self.opts.work_root.clone(),
        };
        let result = run_instance(inst, &pred, &exec, logs.path());
        let entry = result.report.as_ref().map(|r| r[&inst.instance_id].clone()).unwrap_or_default();
        match result.outcome {
            ExecOutcome::Resolved => Outcome::Scored { reward: 1.0 },
            ExecOutcome::EmptyPatch => Outcome::Scored { reward: 0.0 },
            ExecOutcome::Unresolved if entry["infra_failure"] == true => infra(format!(
                "verifier: environment failure ({})",
                entry["infra_failure_reason"].as_str().unwrap_or("unknown")
            )),
            ExecOutcome::Unresolved => {
                let f2p = &entry["tests_status"]["FAIL_TO_PASS"];
                let count = |k: &str| f2p[k].as_array().map_or(0, Vec::len);
                let (ok, total) = (count("success"), count("success") + count("failure"));
                let reward = if partial_credit && total > 0 { ok as f32 / total as f32 } else { 0.0 };
                Outcome::Scored { reward }
            }
            ExecOutcome::Error(ErrorKind::TestTimeout(_)) => Outcome::Scored { reward: 0.0 },
            ExecOutcome::Error(e) => infra(format!("verifier: {}", ExecOutcome::Error(e).detail().unwrap_or_default())),
        }
    }

    /// The text the agent is given for `inst`: its issue, with the location hint the options
    /// ask for ([`localization::instance_text`]).
    pub fn task_text(&self, inst: &SweInstance) -> String {
        localization::instance_text(inst, self.opts.hints)
    }

    /// Runs the agent on `inst` in a fresh workspace; returns the exit reason and, when the
    /// run decides the outcome by itself (limit, infrastructure, broken prefix), the outcome;
    /// else the patch to grade.
    fn attempt(
        &self,
        inst: &SweInstance,
        llm: &mut EngineLlm,
        cfg: &RolloutConfig,
        seed: u64,
    ) -> (String, Result<String, Outcome>) {
        let infra = |reason: String| ("infra".to_string(), Err(Outcome::Infra { reason }));
        if let Err(e) = std::fs::create_dir_all(&self.opts.work_root) {
            return infra(format!("cannot create {}: {e}", self.opts.work_root.display()));
        }
        let holder = match frognano_sandbox::scratch::scratch_dir(
            &self.opts.work_root,
            &format!("{}_rollout", inst.instance_id),
        ) {
            Ok(d) => d,
            Err(e) => return infra(format!("cannot create a workspace: {e}")),
        };
        let ws = holder.path().join("repo");
        let prepared = repo_source(inst, self.opts.repos.as_deref())
            .and_then(|source| create_workspace(&source, &inst.base_commit, &ws))
            .and_then(|()| Ok(Sandbox::new(SandboxSpec::new(&ws).isolation(self.opts.isolation))?));
        let sandbox = match prepared {
            Ok(s) => s,
            Err(e) => return infra(format!("workspace: {e:#}")),
        };
        let mut tools = ToolBox::new(sandbox);
        let config = AgentConfig {
            sampling: Sampling {
                temperature: cfg.temperature,
                top_p: 1.0,
                top_k: 0,
                min_p: 0.0,
                repetition_penalty: 1.0,
                max_tokens: cfg.max_tokens_per_turn.min(u32::MAX as usize) as u32,
                enable_thinking: self.opts.enable_thinking,
                seed: Some(seed),
                ..Sampling::default()
            },
            max_steps: cfg.max_steps,
            max_context_tokens: cfg.max_context_tokens as u64,
            max_time: cfg.max_time,
            guards: self.opts.guards.clone(),
            instance_id: inst.instance_id.clone(),
            ..AgentConfig::default()
        };
        let cancel = AtomicBool::new(false);
        let task = self.task_text(inst);
        let t = agent::run(llm, &mut tools, &task, &config, &cancel, &mut |_| {});
        let exit = t.exit_reason.as_str().to_string();
        if let Some(outcome) = outcome_of_exit(&exit, t.error.as_deref()) {
            return (exit, Err(outcome));
        }
        if let Err((reason, _)) = build_sequence(llm.turns()) {
            return (exit, Err(Outcome::Infra { reason }));
        }
        match diff_in_sandbox(&ws, &inst.base_commit, self.opts.isolation) {
            Ok(patch) => (exit, Ok(patch.text())),
            Err(e) => (exit, Err(Outcome::Infra { reason: format!("cannot take the patch: {e:#}") })),
        }
    }
}

impl Environment for SweEnv {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn task_ids(&self) -> Vec<String> {
        self.tasks.keys().cloned().collect()
    }

    fn rollout(
        &self,
        sampler: &Arc<Scheduler>,
        task_id: &str,
        cfg: &RolloutConfig,
        seed: u64,
    ) -> anyhow::Result<Rollout> {
        let inst = self.task_or_err(task_id)?;
        let started = Instant::now();
        let mut llm = recording_llm(&self.chat, sampler, cfg.max_context_tokens);
        if self.opts.constrain_tools {
            llm = llm.constrain_tools();
        }
        let (exit, result) = self.attempt(inst, &mut llm, cfg, seed);
        let outcome = match result {
            Ok(patch) => self.grade(inst, &patch, cfg.partial_credit),
            Err(outcome) => outcome,
        };
        let turns = llm.take_turns();
        Ok(Rollout::from_turns(task_id, seed, &turns, &exit, outcome, started.elapsed().as_secs_f64()))
    }

    /// Runs `frognano synth` on the source repository with the knobs moved one step in
    /// `direction` and a fresh seed, until about `n` more tasks are accepted; returns their
    /// ids. Without a synthesis source: none.
    fn request_tasks(&mut self, direction: Direction, n: usize) -> anyhow::Result<Vec<String>> {
        let Some(src) = &mut self.synth else { return Ok(Vec::new()) };
        if n == 0 {
            return Ok(Vec::new());
        }
        src.knobs = src.knobs.step(match direction {
            Direction::Harder => calibrate::Direction::Harder,
            Direction::Easier => calibrate::Direction::Easier,
        });
        let tasks_path = src.out.join("tasks.jsonl");
        let existing = if tasks_path.is_file() { frognano_swe::load_instances(&tasks_path)?.len() } else { 0 };
        let flags = src.knobs.synth_flags();
        let opts = SynthOptions {
            source: Source::Local { path: src.repo.clone(), commit: src.commit.clone() },
            out: src.out.clone(),
            gen: GenOptions {
                seed: src.seed + self.requests,
                min_complexity: 3,
                operators: Some(src.knobs.operators()),
                max_candidates: src.max_candidates,
            },
            workers: src.workers.max(1),
            max_tasks: Some(existing + n),
            combine: src.knobs.combine_option(),
            max_combos: 2 * n,
            min_timeout: src.min_timeout,
            max_f2p_fraction: 0.5,
            isolation: self.opts.isolation,
            python: src.python.clone(),
            harbor: None,
            issue_model: None,
        };
        self.requests += 1;
        let summary = synthesize(&opts).with_context(|| format!("synthesizing tasks ({flags})"))?;
        tracing::info!(
            "synth ({flags}): {} new tasks of {} candidates",
            summary.tasks_accepted,
            summary.candidates_tried
        );
        let fresh: Vec<SweInstance> = frognano_swe::load_instances(&tasks_path)?
            .into_iter()
            .filter(|i| !self.tasks.contains_key(&i.instance_id))
            .collect();
        self.insert(fresh)
    }
}
