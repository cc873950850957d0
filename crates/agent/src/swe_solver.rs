//! The FrogNano agent as a [`frognano_swe::runs::Solver`] in this process: `frognano eval run`
//! and `frognano synth calibrate` with a local model. One model is loaded once and runs on one
//! shared [`Scheduler`]; every instance attempt gets its own conversation on it
//! ([`EngineLlm::on_scheduler`]), so attempts running at once on `--workers` threads share
//! batched decode steps, and attempts on the same task start from a fork of the shared prompt.
//!
//! Each attempt runs the agent loop with the defaults of `frognano solve` (the model card's
//! sampling, 100 steps, a 65,536-token context, the drift guards) in the workspace the run
//! hands over, with the agent's commands sandboxed as `frognano solve` sandboxes them.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use frognano_engine::constraint::LazyConstraints;
use frognano_engine::{ChatParts, EngineLlm, Scheduler, SchedulerConfig};
use frognano_sandbox::Isolation;
use frognano_swe::runs::{Solution, Solver};
use frognano_swe::SweInstance;

use crate::agent::{self, AgentConfig};
use crate::solve::{agent_sandbox, require_sandbox, SandboxLimits};
use crate::tools::ToolBox;
use crate::trajectory::ExitReason;
use crate::workspace;

/// The agent on a shared in-process scheduler, solving SWE instances (see the module docs).
/// `Sync`: the run calls [`Solver::solve`] from several worker threads at once.
pub struct AgentSolver {
    name: String,
    scheduler: Arc<Scheduler>,
    chat: ChatParts,
    /// The checkpoint's architecture, when loaded by [`AgentSolver::load`].
    architecture: Option<String>,
    /// Tool calls sampled under a grammar ([`AgentSolver::with_constrained_tools`]): one
    /// factory for every attempt.
    tool_constraints: Option<Arc<LazyConstraints>>,
    /// Limits and sampling of each attempt (`instance_id` is set per attempt).
    pub config: AgentConfig,
    /// Confinement of the agent's commands.
    pub isolation: Isolation,
    /// Limits and environment of the sandboxed commands.
    pub sandbox: SandboxLimits,
}

impl AgentSolver {
    /// Loads `spec` (checkpoint folder, `.gguf` file or cached hub id; it needs a tokenizer
    /// and a chat template) and starts its scheduler with decode batches of up to
    /// `max_batch` sequences (the number of instances run at once is the useful value).
    /// Settings are the defaults of `frognano solve`, commands confined by bubblewrap.
    pub fn load(spec: &str, max_batch: usize, kv_cache: Option<frognano_model::KvType>) -> anyhow::Result<Self> {
        let mut loaded = frognano_model::load(spec).with_context(|| {
            format!("no model to ask: loading {spec} in this process failed (pass --model MODEL, or --endpoint URL --model NAME)")
        })?;
        if let Some(ty) = kv_cache {
            loaded.model.set_kv_type(ty).with_context(|| format!("--kv-cache {ty}"))?;
        }
        let architecture = loaded.architecture.clone();
        let (model, chat) =
            ChatParts::split(loaded).with_context(|| format!("{spec}: the model cannot be used by the agent"))?;
        let max_batch = max_batch.max(1);
        let defaults = SchedulerConfig::default();
        let config = SchedulerConfig { max_batch, sessions: defaults.sessions.max(max_batch), ..defaults };
        let scheduler = Scheduler::start(model, config).context("cannot start the model's scheduler")?;
        let mut solver = Self::on_scheduler(spec, Arc::new(scheduler), chat);
        solver.architecture = Some(architecture);
        Ok(solver)
    }

    /// A solver on an already-started scheduler; `name` is the model name recorded in the
    /// predictions. Settings are the defaults of `frognano solve`.
    pub fn on_scheduler(name: impl Into<String>, scheduler: Arc<Scheduler>, chat: ChatParts) -> Self {
        AgentSolver {
            name: name.into(),
            scheduler,
            chat,
            architecture: None,
            tool_constraints: None,
            config: AgentConfig::default(),
            isolation: Isolation::Bubblewrap,
            sandbox: SandboxLimits::default(),
        }
    }

    /// This solver with `config` for every attempt (its `instance_id` is replaced).
    pub fn with_config(mut self, config: AgentConfig) -> Self {
        self.config = config;
        self
    }

    /// This solver with the model's replies read in `parser` instead of its chat template's
    /// format (`None` keeps that).
    pub fn with_tool_parser(mut self, parser: Option<frognano_protocol::codec::ToolParser>) -> Self {
        self.chat = self.chat.with_tool_parser(parser);
        self
    }

    /// This solver with every attempt's replies sampled under a grammar of the tool calls
    /// (`Some(true)`), free (`Some(false)`), or — `None`, as `frognano solve` decides —
    /// constrained unless the model is a Qwen3.5/FrogNano one (whose own format it was
    /// trained on) or its format has no grammar. See `EngineLlm::constrain_tools`.
    pub fn with_constrained_tools(mut self, constrain: Option<bool>) -> Self {
        let by_default = || {
            frognano_engine::tool_grammar::constrain_tools_by_default(
                self.architecture.as_deref(),
                self.chat.tool_parser,
            )
        };
        self.tool_constraints = constrain
            .unwrap_or_else(by_default)
            .then(|| Arc::new(self.chat.lazy_constraints(self.scheduler.model().vocab_size())));
        self
    }

    /// Whether attempts sample tool calls under a grammar.
    pub fn constrains_tools(&self) -> bool {
        self.tool_constraints.is_some()
    }

    /// This solver with the agent's commands confined by `isolation`.
    pub fn with_isolation(mut self, isolation: Isolation) -> Self {
        self.isolation = isolation;
        self
    }

    /// The scheduler the attempts run on (its stats show the batching).
    pub fn scheduler(&self) -> &Arc<Scheduler> {
        &self.scheduler
    }
}

impl Solver for AgentSolver {
    fn model_name(&self) -> String {
        self.name.clone()
    }

    fn solve(&self, instance: &SweInstance, workspace: &Path, attempt: usize) -> anyhow::Result<Solution> {
        require_sandbox(self.isolation)?;
        let mut tools = ToolBox::new(agent_sandbox(workspace, self.isolation, &self.sandbox)?);
        let mut llm = EngineLlm::on_scheduler(self.name.clone(), Arc::clone(&self.scheduler), self.chat.clone());
        if let Some(c) = &self.tool_constraints {
            llm = llm.constrain_tools_with(Arc::clone(c));
        }
        let config = AgentConfig { instance_id: format!("{}.{attempt}", instance.instance_id), ..self.config.clone() };
        let mut no_checkpoint = |_: &crate::trajectory::Trajectory| {};
        let mut t = agent::run(
            &mut llm,
            &mut tools,
            &instance.problem_statement,
            &config,
            &AtomicBool::new(false),
            &mut no_checkpoint,
        );
        if t.exit_reason == ExitReason::LlmQueryError && t.steps.is_empty() {
            // Nothing happened: the model could not be asked at all, not an attempt to grade.
            // (A model that kept writing malformed calls did reply: its attempt is graded, the
            // broken reply its last step.)
            anyhow::bail!("the model could not be queried ({}): {}", self.name, t.error.unwrap_or_default());
        }
        // A patch that cannot be taken is an error of the attempt, never an empty patch.
        let patch = workspace::diff_in_sandbox(workspace, &instance.base_commit, self.isolation)
            .context("cannot take the workspace's changes")?;
        t.output_patch = patch.text();
        Ok(Solution {
            patch: t.output_patch.clone(),
            exit_reason: t.exit_reason.as_str().to_string(),
            trajectory: Some(serde_json::to_value(&t)?),
        })
    }
}
