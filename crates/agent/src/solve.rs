//! `frognano solve` as a library: a typed config ([`SolveConfig`]) with a `validate()`, and
//! [`solve`] / [`solve_with_cancel`], which do the work and return what they wrote. The
//! flags, Ctrl-C handling and the printed summary live in `crates/cli`.
//!
//! Errors of `validate()` name a field by its `frognano solve` flag, say what was expected and
//! what was found.
//!
//! Order of work, so that bad input never leaves half-written output or touches the user's
//! tree: check arguments, issue, repository, output directory and sandbox first; then clone
//! the workspace and run; the output directory is created only once the model has answered
//! at least once (an unreachable endpoint or a model that refuses tools fails before).

use crate::agent::{self, AgentConfig, AgentEvent, Guards};
use crate::demo;
use crate::replay::ReplayLlm;
use crate::run_dir::{self, ParentRun, RunInfo};
use crate::tools::ToolBox;
use crate::trajectory::{ExitReason, Trajectory};
use crate::workspace::{self, Workspace};
use anyhow::{bail, Context};
use frognano_engine::EngineLlm;
use frognano_protocol::codec::ToolParser;
use frognano_protocol::{HttpLlm, Llm, Sampling};
use frognano_sandbox::patch::{human_bytes, Patch};
use frognano_sandbox::{Isolation, Sandbox, SandboxSpec};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// What `--no-sandbox` gives up, printed when it is used.
pub const NO_SANDBOX_WARNING: &str = "warning: --no-sandbox: the agent's Bash commands run directly on this \
machine as your user, not in a sandbox. They can read and change any file you can (outside the \
workspace too, your repository included), reach the network and local services, and see your \
environment variables and home directory (tokens and keys included). Only the time, output, \
process, memory, file-size and disk limits and the kill of leftover processes still apply. \
Write, Edit and Glob stay confined to the workspace; Read reads any file you can.";

/// Where the task text comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskInput {
    /// A file with the issue text; the instance id defaults to its stem.
    IssueFile(PathBuf),
    /// The text itself.
    Text(String),
    /// The bundled demo repository and its issue; the repository is created in a scratch
    /// folder.
    Demo,
    /// The first user message of the replayed trajectory (only with [`ModelChoice::Replay`]).
    Recorded,
    /// Go on with a finished run (`--continue-from RUN --comment TEXT`): its conversation,
    /// then `comment` as the next user message, in a workspace at the run's base commit that
    /// already holds its patch. The repository and base commit are the run's (`run.json`,
    /// [`crate::run_dir::RunInfo`]); the new run records the one it continues.
    Continue {
        /// The output directory of the run to continue.
        run: PathBuf,
        /// The reviewer's comment.
        comment: String,
    },
}

/// Who answers the agent (recorded in `run.json`, so a run sent back goes to the same model).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelChoice {
    /// A model run in this process: a checkpoint folder, .gguf file or cached hub id (`None`:
    /// the demo model).
    InProcess(Option<String>),
    /// A model at an OpenAI-compatible endpoint (Ollama, llama.cpp server, vLLM,
    /// `frognano serve`).
    Endpoint {
        /// Base URL, e.g. http://127.0.0.1:8080.
        url: String,
        /// Model name at the endpoint.
        model: String,
    },
    /// Re-execute the tool calls of a recorded trajectory instead of asking a model.
    Replay(PathBuf),
}

/// Everything `frognano solve` needs.
#[derive(Debug, Clone)]
pub struct SolveConfig {
    /// The git repository to work on (never modified unless `apply`).
    pub repo: PathBuf,
    /// The task.
    pub task: TaskInput,
    /// Who answers.
    pub model: ModelChoice,
    /// Directory for trajectory.json, patch.diff and summary.md (must not exist or be
    /// empty). Default: ./frognano-runs/<instance>-<time>.
    pub output: Option<PathBuf>,
    /// Id recorded in the trajectory (default: the issue file's stem).
    pub instance_id: Option<String>,
    /// Apply the patch to `repo` after showing it and asking.
    pub apply: bool,
    /// With `apply`: do not ask.
    pub yes: bool,
    /// Ask on the terminal before each Bash command.
    pub confirm: bool,
    /// Confinement of the agent's commands ([`Isolation::Unconfined`] prints
    /// [`NO_SANDBOX_WARNING`]).
    pub isolation: Isolation,
    /// Limits and environment of the sandboxed commands.
    pub sandbox: SandboxLimits,
    /// Start from HEAD even if the repository has uncommitted changes.
    pub allow_dirty: bool,
    /// Steps (model calls) at most.
    pub max_steps: usize,
    /// Context limit in tokens (0: none).
    pub max_context: u64,
    /// Time budget.
    pub max_time: Option<Duration>,
    /// Sampling of each turn (`max_tokens` is the per-turn token limit).
    pub sampling: Sampling,
    /// How long to wait for one model reply.
    pub request_timeout: Duration,
    /// The drift guards.
    pub guards: Guards,
    /// Sample the in-process model's replies under a grammar of the tool calls, so a
    /// malformed call cannot be produced (`--constrain-tools` / `--no-constrain-tools`).
    /// `None`: on unless the model is Qwen3.5/FrogNano, which writes its calls as trained.
    pub constrain_tools: Option<bool>,
    /// The tool-call format the model writes (`None`: the chat template's for a model in
    /// this process; for an endpoint, the markers of calls a server leaves in the content).
    pub tool_parser: Option<ToolParser>,
    /// How the in-process model stores attention keys and values (`--kv-cache`; `None`: the
    /// model's default, f16). Its saved states in the run's `state/` folder are of this type.
    pub kv_cache: Option<frognano_model::KvType>,
}

impl SolveConfig {
    /// `repo` with everything else at the defaults of `frognano solve` (the model card's
    /// sampling, the in-process demo model, the task from a replay).
    pub fn for_repo(repo: impl Into<PathBuf>) -> Self {
        SolveConfig {
            repo: repo.into(),
            task: TaskInput::Recorded,
            model: ModelChoice::InProcess(None),
            output: None,
            instance_id: None,
            apply: false,
            yes: false,
            confirm: false,
            isolation: Isolation::Bubblewrap,
            sandbox: SandboxLimits::default(),
            allow_dirty: false,
            max_steps: 100,
            max_context: 65536,
            max_time: None,
            sampling: Sampling::default(),
            request_timeout: Duration::from_secs(600),
            guards: Guards::default(),
            constrain_tools: None,
            tool_parser: None,
            kv_cache: None,
        }
    }

    /// Checks the settings without side effects.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.task == TaskInput::Recorded && !matches!(self.model, ModelChoice::Replay(_)) {
            bail!("no task: pass --issue FILE, --task TEXT or --demo");
        }
        if let TaskInput::Text(text) = &self.task {
            if text.trim().is_empty() {
                bail!("the task text is empty");
            }
        }
        if let TaskInput::Continue { comment, .. } = &self.task {
            if comment.trim().is_empty() {
                bail!("--comment is empty: say what the agent should do next");
            }
            if matches!(self.model, ModelChoice::Replay(_)) {
                bail!("--continue-from needs a model to answer (--model or --endpoint), not --replay");
            }
        }
        let s = &self.sampling;
        if !(s.temperature.is_finite() && s.temperature >= 0.0) {
            bail!("--temperature must be a number ≥ 0, got {}", s.temperature);
        }
        if !(s.top_p > 0.0 && s.top_p <= 1.0) {
            bail!("--top-p must be in (0, 1], got {}", s.top_p);
        }
        if !(0.0..=1.0).contains(&s.min_p) {
            bail!("--min-p must be in [0, 1], got {}", s.min_p);
        }
        if self.request_timeout.is_zero() {
            bail!("--request-timeout must be at least 1 second, got 0");
        }
        if self.kv_cache.is_some() && !matches!(self.model, ModelChoice::InProcess(_)) {
            bail!("--kv-cache sets the in-process model's cache; it does nothing with --endpoint or --replay");
        }
        if self.constrain_tools == Some(true) && !matches!(self.model, ModelChoice::InProcess(_)) {
            bail!("--constrain-tools needs a model run in this process (not --endpoint or --replay)");
        }
        Ok(())
    }
}

/// The sandbox's limits and environment (`--sandbox-*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Host environment variables also passed to sandboxed commands. By default they get
    /// only PATH, the locale, TERM and toolchain locations; HOME is the sandbox's /tmp.
    pub env: Vec<String>,
    /// Memory of one command's processes together, in bytes; 0 for no limit (default: the
    /// smaller of 8 GiB and half the RAM).
    pub memory: Option<u64>,
    /// Largest file a command may write, in bytes; 0 for no limit (default 4 GiB).
    pub file_size: Option<u64>,
    /// Disk space one command may take before it is stopped, in bytes; 0 for no limit
    /// (default 16 GiB).
    pub disk: Option<u64>,
}

impl SandboxLimits {
    /// `spec` with these limits applied.
    pub fn apply(&self, mut spec: SandboxSpec) -> SandboxSpec {
        for name in &self.env {
            spec = spec.pass_env(name.clone());
        }
        if let Some(bytes) = self.memory {
            spec = spec.memory_limit(bytes);
        }
        if let Some(bytes) = self.file_size {
            spec = spec.file_size_limit(bytes);
        }
        if let Some(bytes) = self.disk {
            spec = spec.disk_limit(bytes);
        }
        spec
    }
}

/// Refuses to go on when `isolation` asks for bubblewrap and the machine cannot run it,
/// saying how to install it or opt out.
pub(crate) fn require_sandbox(isolation: Isolation) -> anyhow::Result<()> {
    if isolation == Isolation::Bubblewrap {
        if let Err(reason) = Sandbox::bubblewrap_available() {
            bail!(
                "cannot confine the agent's commands: {reason}. Install bubblewrap (Debian/Ubuntu: \
                 `apt-get install bubblewrap`), or pass --no-sandbox to run them unconfined"
            );
        }
    }
    Ok(())
}

/// The sandbox the agent's tools run in over `workspace`, with `limits` applied.
pub(crate) fn agent_sandbox(workspace: &Path, isolation: Isolation, limits: &SandboxLimits) -> anyhow::Result<Sandbox> {
    // Python's bytecode caches would otherwise end up in the patch whenever the agent runs a
    // project's tests and the project does not ignore them.
    let spec = SandboxSpec::new(workspace).isolation(isolation).env("PYTHONDONTWRITEBYTECODE", "1");
    Ok(Sandbox::new(limits.apply(spec))?)
}

/// What a finished `solve` produced.
#[derive(Debug)]
pub struct SolveReport {
    /// Where trajectory.json, patch.diff and summary.md were written.
    pub output_dir: PathBuf,
    /// The final trajectory (with the patch).
    pub trajectory: Trajectory,
}

/// Does the work of `frognano solve` and returns what it wrote.
pub fn solve(args: &SolveConfig) -> anyhow::Result<SolveReport> {
    solve_with_cancel(args, &AtomicBool::new(false))
}

/// [`solve`], stopping before the next step once `cancel` is set (the trajectory is still
/// written, with exit reason `cancelled` and no patch).
pub fn solve_with_cancel(args: &SolveConfig, cancel: &AtomicBool) -> anyhow::Result<SolveReport> {
    solve_with_events(args, cancel, &mut |_| {})
}

/// [`solve_with_cancel`], telling `on_event` what the agent does as it goes (each model
/// reply, tool call and observation; see [`AgentEvent`]) — what `frognano solve` shows.
pub fn solve_with_events(
    args: &SolveConfig,
    cancel: &AtomicBool,
    on_event: &mut dyn FnMut(AgentEvent<'_>),
) -> anyhow::Result<SolveReport> {
    solve_inner(args, None, cancel, on_event)
}

/// [`solve_with_events`] with `llm` answering instead of the model `args.model` names (which
/// is still what `run.json` records): for callers that hold a model already, such as
/// `frognano review` sending a run back, or a test's scripted model.
pub fn solve_with_llm(
    args: &SolveConfig,
    llm: Box<dyn Llm>,
    cancel: &AtomicBool,
    on_event: &mut dyn FnMut(AgentEvent<'_>),
) -> anyhow::Result<SolveReport> {
    solve_inner(args, Some(llm), cancel, on_event)
}

/// The run a [`TaskInput::Continue`] goes on from.
struct Parent {
    dir: PathBuf,
    trajectory: Trajectory,
    info: RunInfo,
    patch: Vec<u8>,
    comment: String,
}

/// Reads the run `dir` to continue, refusing one that is still going or cannot be continued.
fn load_parent(dir: &Path, comment: &str) -> anyhow::Result<Parent> {
    if !dir.is_dir() {
        bail!("--continue-from {}: no such run directory", dir.display());
    }
    let trajectory = Trajectory::load(&dir.join(run_dir::TRAJECTORY))?;
    if trajectory.partial || trajectory.exit_reason == ExitReason::Running {
        bail!(
            "--continue-from {}: the run is still going (its trajectory is a checkpoint); wait until it ends",
            dir.display()
        );
    }
    let info = RunInfo::load(dir).with_context(|| {
        format!("--continue-from {}: the run does not say which repository and commit it started from", dir.display())
    })?;
    let patch_path = dir.join(run_dir::PATCH);
    let patch = std::fs::read(&patch_path).with_context(|| format!("cannot read {}", patch_path.display()))?;
    // Canonical, so that a reader anywhere finds the parent (`frognano review` links them).
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    Ok(Parent { dir, trajectory, info, patch, comment: comment.to_string() })
}

/// Keeps the in-process model's conversation states in the run's folder
/// ([`run_dir::STATE_DIR`]). A continued run starts with its parent's states (hard-linked, or
/// copied across file systems), so its first turn does not prefill the parent's history.
fn keep_states(llm: EngineLlm, spec: &str, output_dir: &Path, parent: Option<&Parent>) -> anyhow::Result<EngineLlm> {
    let dir = output_dir.join(run_dir::STATE_DIR);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    if let Some(p) = parent {
        if let Ok(items) = std::fs::read_dir(p.dir.join(run_dir::STATE_DIR)) {
            for item in items.flatten() {
                let to = dir.join(item.file_name());
                if std::fs::hard_link(item.path(), &to).is_err() {
                    // Not fatal: without them the history is prefilled, as before.
                    let _ = std::fs::copy(item.path(), &to);
                }
            }
        }
    }
    let path = frognano_model::load::resolve_path(spec).unwrap_or_else(|_| PathBuf::from(spec));
    let id = frognano_engine::persist::model_identity(&path);
    let store = frognano_engine::SessionStore::open(&dir, &id, llm.model().as_ref(), run_dir::STATE_BUDGET)
        .with_context(|| format!("the run's state folder {}", dir.display()))?;
    Ok(llm.with_session_store(std::sync::Arc::new(store)))
}

fn solve_inner(
    args: &SolveConfig,
    given: Option<Box<dyn Llm>>,
    cancel: &AtomicBool,
    on_event: &mut dyn FnMut(AgentEvent<'_>),
) -> anyhow::Result<SolveReport> {
    // 1. Everything that can be checked without side effects.
    args.validate()?;
    let recorded = match &args.model {
        ModelChoice::Replay(p) => Some(Trajectory::load(p)?),
        _ => None,
    };
    let parent = match &args.task {
        TaskInput::Continue { run, comment } => Some(load_parent(run, comment)?),
        _ => None,
    };
    // A continued run keeps its parent's KV cache type unless told otherwise: the parent's
    // saved states are of that type, and only then does its history need no prefill.
    let kv_cache = match (args.kv_cache, &parent) {
        (Some(ty), _) => Some(ty),
        (None, Some(p)) => match p.info.kv_cache.as_deref() {
            Some(name) => Some(
                name.parse::<frognano_model::KvType>()
                    .map_err(|e| anyhow::anyhow!("{}: kv_cache: {e}", p.dir.join(run_dir::RUN_INFO).display()))?,
            ),
            None => None,
        },
        (None, None) => None,
    };
    // The in-process model is loaded before anything is written, so a bad model name
    // leaves no half-made output behind.
    let in_process = if let (ModelChoice::InProcess(model), None) = (&args.model, &given) {
        let spec = model.clone().unwrap_or_else(|| frognano_model::load::DEMO_MODEL.to_string());
        let llm = EngineLlm::load_with_kv_cache(&spec, kv_cache).with_context(|| {
            format!(
                "no model to ask: loading {spec} in this process failed (fetch the demo model with \
                 scripts/fetch-demo-model.sh, pass --model MODEL, or --endpoint URL --model NAME, \
                 or --replay TRAJECTORY.json)"
            )
        })?;
        let llm = llm.with_tool_parser(args.tool_parser);
        let constrain = args.constrain_tools.unwrap_or_else(|| {
            frognano_engine::tool_grammar::constrain_tools_by_default(llm.architecture(), llm.tool_parser())
        });
        Some(if constrain { llm.constrain_tools() } else { llm })
    } else {
        None
    };
    let recorded_kv_cache = in_process.as_ref().and(kv_cache).map(|ty| ty.to_string());
    let (task, default_id) = match (&args.task, &recorded) {
        (TaskInput::Demo, _) => (demo::DEMO_ISSUE.to_string(), "demo".to_string()),
        (TaskInput::IssueFile(path), _) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("cannot read issue file {}", path.display()))?;
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
            (text, stem.unwrap_or_else(|| "task".into()))
        }
        (TaskInput::Text(text), _) => (text.clone(), "task".to_string()),
        (TaskInput::Recorded, Some(t)) => {
            let user = t.messages.iter().find(|m| m.role == "user").map(|m| m.text().to_string());
            (user.unwrap_or_default(), t.instance_id.clone())
        }
        (TaskInput::Recorded, None) => bail!("no task: pass --issue FILE, --task TEXT or --demo"),
        (TaskInput::Continue { .. }, _) => {
            let p = parent.as_ref().context("the parent run was loaded above")?;
            let user = p.trajectory.messages.iter().find(|m| m.role == "user").map(|m| m.text().to_string());
            (user.unwrap_or_default(), p.trajectory.instance_id.clone())
        }
    };
    if task.trim().is_empty() {
        bail!("the task text is empty");
    }
    let instance_id = args.instance_id.clone().unwrap_or(default_id);
    let output_dir = match &args.output {
        Some(p) => p.clone(),
        None => {
            let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            PathBuf::from("frognano-runs").join(format!("{instance_id}-{secs}"))
        }
    };
    if output_dir.exists() && output_dir.read_dir().map_or(true, |mut d| d.next().is_some()) {
        bail!("output directory {} already exists and is not empty", output_dir.display());
    }
    let isolation = if args.isolation == Isolation::Unconfined {
        eprintln!("{NO_SANDBOX_WARNING}");
        Isolation::Unconfined
    } else {
        require_sandbox(Isolation::Bubblewrap)?;
        Isolation::Bubblewrap
    };
    let demo_dir = frognano_sandbox::scratch::scratch_dir(&std::env::temp_dir(), "demo")?;
    let repo = if args.task == TaskInput::Demo {
        demo::materialize(&demo_dir.path().join("demo-repo"))?
    } else if let Some(p) = &parent {
        // The clone is taken at the recorded commit, so the user's working tree may be dirty
        // (it is, once a run's patch was applied).
        workspace::check_repo(&p.info.repo, true)?
    } else {
        workspace::check_repo(&args.repo, args.allow_dirty)?
    };

    // 2. The run.
    let ws = match &parent {
        Some(p) => {
            let ws = Workspace::create_at(&repo, &p.info.base_commit)?;
            // The parent's changes, so the agent finds the workspace as it left it. Trusted git
            // on a fresh clone, before any tool ran in it.
            if !p.patch.iter().all(u8::is_ascii_whitespace) {
                workspace::apply_patch(ws.path(), &p.patch)
                    .with_context(|| format!("cannot restore the workspace of {}", p.dir.display()))?;
            }
            ws
        }
        None => Workspace::create(&repo, args.allow_dirty)?,
    };
    let mut tools = ToolBox::new(agent_sandbox(ws.path(), isolation, &args.sandbox)?);
    if args.confirm {
        tools.confirm = Some(Box::new(ask_before_running));
    }
    let mut llm: Box<dyn Llm> = match (given, &recorded, &args.model) {
        (Some(llm), _, _) => llm,
        (None, Some(t), ModelChoice::Replay(path)) => Box::new(ReplayLlm::new(t, path.display().to_string())),
        (None, _, ModelChoice::Endpoint { url, model }) => {
            Box::new(HttpLlm::new(url, model, args.request_timeout)?.with_tool_parser(args.tool_parser))
        }
        _ => {
            let llm = in_process.context("the in-process model was loaded above")?;
            let spec = match &args.model {
                ModelChoice::InProcess(Some(spec)) => spec.clone(),
                _ => frognano_model::load::DEMO_MODEL.to_string(),
            };
            Box::new(keep_states(llm, &spec, &output_dir, parent.as_ref())?)
        }
    };
    let config = AgentConfig {
        sampling: args.sampling.clone(),
        max_steps: args.max_steps,
        max_context_tokens: args.max_context,
        max_time: args.max_time,
        guards: args.guards.clone(),
        instance_id,
        ..AgentConfig::default()
    };
    let info = RunInfo {
        format: run_dir::RUN_INFO_FORMAT.to_string(),
        instance_id: config.instance_id.clone(),
        repo: ws.repo().to_path_buf(),
        base_commit: ws.base_commit().to_string(),
        model: llm.describe(),
        model_choice: args.model.clone(),
        started_unix: run_dir::unix_now(),
        kv_cache: recorded_kv_cache,
        parent: parent.as_ref().map(|p| ParentRun {
            dir: p.dir.clone(),
            trajectory_id: p.trajectory.trajectory_id.clone(),
            steps: p.trajectory.steps.len(),
            comment: p.comment.clone(),
        }),
    };
    let checkpoint_path = output_dir.join(run_dir::TRAJECTORY);
    let mut info_written = false;
    let mut checkpoint = |t: &Trajectory| {
        if std::fs::create_dir_all(&output_dir).is_ok() {
            // run.json first, so a reader that sees the checkpoint knows where the run started.
            if !info_written {
                info_written = info.save(&output_dir).is_ok();
            }
            let _ = t.save(&checkpoint_path);
        }
    };
    let mut t = match &parent {
        Some(p) => agent::continue_with_events(
            llm.as_mut(),
            &mut tools,
            &p.trajectory,
            &p.comment,
            &config,
            cancel,
            &mut checkpoint,
            on_event,
        ),
        None => agent::run_with_events(llm.as_mut(), &mut tools, &task, &config, cancel, &mut checkpoint, on_event),
    };
    if t.exit_reason == ExitReason::LlmQueryError && t.steps.is_empty() {
        // Nothing happened: a setup problem (endpoint, model), not a run worth recording. (A
        // model that kept writing malformed calls did reply: that run is recorded, the broken
        // reply its last step.)
        bail!(
            "the model could not be queried ({}): {}. If the server rejects the request, check \
             that the model supports tool calls",
            llm.describe(),
            t.error.unwrap_or_default()
        );
    }

    // 3. The result. Whatever happens from here on, all three outputs are written and the
    //    trajectory's exit reason is final: a patch that cannot be taken is reported, not
    //    fatal.
    let (patch, patch_error) = if t.exit_reason == ExitReason::Cancelled {
        (Patch::default(), None)
    } else {
        match ws.diff(isolation) {
            Ok(p) => (p, None),
            Err(e) => (Patch::default(), Some(format!("{e:#}"))),
        }
    };
    t.output_patch = patch.text();
    if let Some(e) = &patch_error {
        eprintln!("warning: {e}");
        if t.error.is_none() {
            t.error = Some(e.clone());
        }
    }
    for f in &patch.left_out {
        eprintln!("warning: {} ({}) is not in the patch: {}", f.path, human_bytes(f.bytes), f.reason);
    }
    std::fs::create_dir_all(&output_dir).with_context(|| format!("cannot create {}", output_dir.display()))?;
    info.save(&output_dir)?;
    t.save(&output_dir.join(run_dir::TRAJECTORY))?;
    std::fs::write(output_dir.join("patch.diff"), &patch.bytes)?;
    std::fs::write(
        output_dir.join("summary.md"),
        summary(&t, &patch, patch_error.as_deref(), llm.as_ref(), &ws, info.parent.as_ref()),
    )?;
    if args.apply {
        apply_to_user_tree(&repo, &patch.bytes, args.yes)?;
    }
    Ok(SolveReport { output_dir, trajectory: t })
}

fn ask_before_running(command: &str) -> bool {
    eprint!("\nThe agent wants to run (sandboxed):\n  {command}\nRun it? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).is_ok() && line.trim().eq_ignore_ascii_case("y")
}

fn apply_to_user_tree(repo: &Path, patch: &[u8], yes: bool) -> anyhow::Result<()> {
    if patch.iter().all(u8::is_ascii_whitespace) {
        eprintln!("The agent made no changes; nothing to apply.");
        return Ok(());
    }
    if !yes {
        eprintln!("{}", String::from_utf8_lossy(patch));
        eprint!("Apply this patch to {}? [y/N] ", repo.display());
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        if !line.trim().eq_ignore_ascii_case("y") {
            eprintln!("Not applied.");
            return Ok(());
        }
    }
    workspace::apply_patch(repo, patch)?;
    eprintln!("Applied to {}.", repo.display());
    Ok(())
}

/// File paths touched by a git diff.
pub fn changed_files(patch: &str) -> Vec<String> {
    frognano_sandbox::patch::changed_files(patch.as_bytes())
}

fn summary(
    t: &Trajectory,
    patch: &Patch,
    patch_error: Option<&str>,
    llm: &dyn Llm,
    ws: &Workspace,
    parent: Option<&ParentRun>,
) -> String {
    let files = patch.files();
    let mut s = format!(
        "# frognano solve: {}\n\n- model: {}\n- repository: {} (base {})\n- exit reason: {}\n- steps: {}\n- elapsed: {:.1} s\n- context tokens: {}\n",
        t.instance_id,
        llm.describe(),
        ws.repo().display(),
        ws.base_commit(),
        t.exit_reason.as_str(),
        t.n_steps,
        t.elapsed_sec,
        t.context_tokens,
    );
    if let Some(p) = parent {
        s.push_str(&format!("- continues: {} (its {} steps come first)\n", p.dir.display(), p.steps));
    }
    if let Some(e) = &t.error {
        s.push_str(&format!("- error: {e}\n"));
    }
    s.push_str(&format!("\n## Files changed ({})\n\n", files.len()));
    for f in &files {
        let binary = if patch.binary_files.contains(f) { " (binary)" } else { "" };
        s.push_str(&format!("- {f}{binary}\n"));
    }
    if let Some(e) = patch_error {
        s.push_str(&format!("\n## No patch\n\nThe workspace's changes could not be taken: {e}\n"));
    }
    if !patch.left_out.is_empty() {
        s.push_str(&format!(
            "\n## Left out of the patch ({})\n\nThese files changed in the workspace but are not in `patch.diff`:\n\n",
            patch.left_out.len()
        ));
        for f in &patch.left_out {
            s.push_str(&format!("- {} ({}): {}\n", f.path, human_bytes(f.bytes), f.reason));
        }
    }
    s.push_str(&format!(
        "\n## Final message\n\n{}\n\nReview `patch.diff` before applying it.\n",
        t.final_message.trim()
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_named_before_anything_runs() {
        let ok = SolveConfig { task: TaskInput::Text("fix it".into()), ..SolveConfig::for_repo(".") };
        ok.validate().unwrap();
        let e = SolveConfig::for_repo(".").validate().unwrap_err().to_string();
        assert_eq!(e, "no task: pass --issue FILE, --task TEXT or --demo");
        let blank = SolveConfig { task: TaskInput::Text(" \n".into()), ..ok.clone() };
        assert_eq!(blank.validate().unwrap_err().to_string(), "the task text is empty");
        let mut hot = ok.clone();
        hot.sampling.top_p = 1.5;
        assert_eq!(hot.validate().unwrap_err().to_string(), "--top-p must be in (0, 1], got 1.5");
        let replay = SolveConfig { model: ModelChoice::Replay("t.json".into()), ..SolveConfig::for_repo(".") };
        replay.validate().unwrap();
    }
}
