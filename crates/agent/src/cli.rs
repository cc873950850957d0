//! `frognano solve`: arguments ([`SolveArgs`]) and the command ([`run_solve`]).
//!
//! Order of work, so that bad input never leaves half-written output or touches the user's
//! tree: check arguments, issue, repository, output directory and sandbox first; then clone
//! the workspace and run; the output directory is created only once the model has answered
//! at least once (an unreachable endpoint or a model that refuses tools fails before).

use crate::agent::{self, AgentConfig, Guards};
use crate::demo;
use crate::replay::ReplayLlm;
use crate::tools::ToolBox;
use crate::trajectory::{ExitReason, Trajectory};
use crate::workspace::{self, Workspace};
use anyhow::{bail, Context};
use frognano_engine::EngineLlm;
use frognano_protocol::{HttpLlm, Llm, Sampling};
use frognano_sandbox::patch::{human_bytes, Patch};
use frognano_sandbox::{Isolation, Sandbox, SandboxSpec};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// What `--no-sandbox` gives up, printed when it is used.
pub const NO_SANDBOX_WARNING: &str = "warning: --no-sandbox: the agent's Bash commands run directly on this \
machine as your user, not in a sandbox. They can read and change any file you can (outside the \
workspace too, your repository included), reach the network and local services, and see your \
environment variables and home directory (tokens and keys included). Only the time, output, \
process, memory, file-size and disk limits and the kill of leftover processes still apply. \
Write, Edit and Glob stay confined to the workspace; Read reads any file you can.";

/// Arguments of `frognano solve`.
#[derive(Debug, Clone, clap::Args)]
pub struct SolveArgs {
    /// The git repository to work on (never modified unless --apply).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// File with the issue / task text.
    #[arg(long, conflicts_with = "task")]
    pub issue: Option<PathBuf>,
    /// The task text itself, instead of --issue.
    #[arg(long)]
    pub task: Option<String>,
    /// Run on the bundled demo repository (a failing test in a tiny Python project) with its
    /// issue; the repository is created inside the output directory.
    #[arg(long, conflicts_with_all = ["issue", "task"])]
    pub demo: bool,
    /// OpenAI-compatible endpoint (Ollama, llama.cpp server, vLLM, `frognano serve`), e.g.
    /// http://127.0.0.1:8080
    #[arg(long, requires = "model")]
    pub endpoint: Option<String>,
    /// Model name at the endpoint; without --endpoint, a model to run in this process
    /// (checkpoint folder, .gguf file or cached hub id; default: the demo model).
    #[arg(long)]
    pub model: Option<String>,
    /// Re-execute the tool calls of a recorded trajectory instead of asking a model.
    #[arg(long, conflicts_with = "endpoint")]
    pub replay: Option<PathBuf>,
    /// Directory for trajectory.json, patch.diff and summary.md (must not exist or be
    /// empty). Default: ./frognano-runs/<instance>-<time>.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Id recorded in the trajectory (default: the issue file's stem).
    #[arg(long)]
    pub instance_id: Option<String>,
    /// Apply the patch to --repo after showing it and asking.
    #[arg(long)]
    pub apply: bool,
    /// With --apply: do not ask.
    #[arg(long, requires = "apply")]
    pub yes: bool,
    /// Ask on the terminal before each Bash command.
    #[arg(long)]
    pub confirm: bool,
    /// Run commands without confinement (no network or write protection). Only when
    /// bubblewrap is unavailable and you trust the repository and the model.
    #[arg(long)]
    pub no_sandbox: bool,
    /// Limits and environment of the sandboxed commands.
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// Start from HEAD even if the repository has uncommitted changes.
    #[arg(long)]
    pub allow_dirty: bool,
    /// Steps (model calls) at most.
    #[arg(long, default_value_t = 100)]
    pub max_steps: usize,
    /// Tokens generated per turn at most.
    #[arg(long, default_value_t = 8192)]
    pub max_tokens_per_turn: u32,
    /// Context limit in tokens (0: none).
    #[arg(long, default_value_t = 65536)]
    pub max_context: u64,
    /// Time budget in seconds.
    #[arg(long)]
    pub max_time: Option<u64>,
    /// Sampling temperature.
    #[arg(long, default_value_t = 0.6)]
    pub temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Top-k sampling.
    #[arg(long, default_value_t = 20)]
    pub top_k: u32,
    /// Min-p sampling.
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Sampling seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Turn the thinking block off.
    #[arg(long)]
    pub no_thinking: bool,
    /// Seconds to wait for one model reply.
    #[arg(long, default_value_t = 600)]
    pub request_timeout: u64,
    /// Reproduce the Leaf harness exactly: all drift guards off.
    #[arg(long)]
    pub leaf_exact: bool,
    /// Drift guard off: retrying malformed tool calls.
    #[arg(long)]
    pub no_retry_malformed: bool,
    /// Drift guard off: the notice after a reply cut by the token limit.
    #[arg(long)]
    pub no_cut_notice: bool,
    /// Drift guard off: the notice on repeated identical actions.
    #[arg(long)]
    pub no_repeat_notice: bool,
    /// Drift guard off: head+tail truncation of long observations.
    #[arg(long)]
    pub no_head_tail: bool,
    /// Drift guard off: the remaining-steps notice near the end.
    #[arg(long)]
    pub no_steps_left: bool,
}

impl SolveArgs {
    /// Arguments for `--repo REPO`, everything else at its default (for library callers).
    pub fn for_repo(repo: impl Into<PathBuf>) -> Self {
        SolveArgs {
            repo: repo.into(),
            issue: None,
            task: None,
            demo: false,
            endpoint: None,
            model: None,
            replay: None,
            output: None,
            instance_id: None,
            apply: false,
            yes: false,
            confirm: false,
            no_sandbox: false,
            sandbox: SandboxArgs::default(),
            allow_dirty: false,
            max_steps: 100,
            max_tokens_per_turn: 8192,
            max_context: 65536,
            max_time: None,
            temperature: 0.6,
            top_p: 0.95,
            top_k: 20,
            min_p: 0.0,
            seed: None,
            no_thinking: false,
            request_timeout: 600,
            leaf_exact: false,
            no_retry_malformed: false,
            no_cut_notice: false,
            no_repeat_notice: false,
            no_head_tail: false,
            no_steps_left: false,
        }
    }

    /// The drift guards these flags select.
    pub fn guards(&self) -> Guards {
        if self.leaf_exact {
            return Guards::leaf_exact();
        }
        let d = Guards::default();
        Guards {
            malformed_retries: if self.no_retry_malformed { 0 } else { d.malformed_retries },
            cut_notice: !self.no_cut_notice,
            repeat_notice: !self.no_repeat_notice,
            head_tail_truncation: !self.no_head_tail,
            steps_left_notice: !self.no_steps_left,
        }
    }
}

/// The sandbox's limits and environment, as flags (`--sandbox-*`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SandboxArgs {
    /// Also pass this host environment variable to sandboxed commands (repeatable). By default
    /// they get only PATH, the locale, TERM and toolchain locations; HOME is the sandbox's /tmp.
    #[arg(long = "sandbox-env", value_name = "NAME")]
    pub env: Vec<String>,
    /// Memory of one command's processes together, e.g. 4G or 512M; 0 for no limit
    /// (default: the smaller of 8 GiB and half the RAM).
    #[arg(long = "sandbox-memory", value_name = "SIZE", value_parser = parse_size)]
    pub memory: Option<u64>,
    /// Largest file a command may write, e.g. 1G; 0 for no limit (default 4 GiB).
    #[arg(long = "sandbox-file-size", value_name = "SIZE", value_parser = parse_size)]
    pub file_size: Option<u64>,
    /// Disk space one command may take before it is stopped, e.g. 10G; 0 for no limit
    /// (default 16 GiB).
    #[arg(long = "sandbox-disk", value_name = "SIZE", value_parser = parse_size)]
    pub disk: Option<u64>,
}

impl SandboxArgs {
    /// `spec` with these flags applied.
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

/// A size like `512M`, `4G`, `1.5GiB`, `1000000` (bytes; K, M, G, T are powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a size (expected e.g. 512M, 4G or 0)"))?;
    let shift = match unit.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("{text:?} has an unknown unit {unit:?} (expected K, M, G or T)")),
    };
    Ok((value * (1u64 << shift) as f64) as u64)
}

/// What a finished `solve` produced.
#[derive(Debug)]
pub struct SolveReport {
    /// Where trajectory.json, patch.diff and summary.md were written.
    pub output_dir: PathBuf,
    /// The final trajectory (with the patch).
    pub trajectory: Trajectory,
}

/// Runs `frognano solve` and prints a short summary.
/// Ctrl-C once cancels the run after the current step (the trajectory is still written,
/// with exit reason `cancelled` and no patch); twice quits at once.
pub fn run_solve(args: SolveArgs) -> anyhow::Result<()> {
    static CANCEL: AtomicBool = AtomicBool::new(false);
    let _ = ctrlc::set_handler(|| {
        if CANCEL.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("\ncancelling after the current step; press Ctrl-C again to quit now");
    });
    let report = solve_with_cancel(&args, &CANCEL)?;
    let t = &report.trajectory;
    println!("exit reason: {}", t.exit_reason.as_str());
    if let Some(e) = &t.error {
        println!("error: {e}");
    }
    println!("steps: {}", t.n_steps);
    println!("files changed: {}", changed_files(&t.output_patch).join(", "));
    println!("output: {}", report.output_dir.display());
    Ok(())
}

/// Does the work of `frognano solve` and returns what it wrote.
pub fn solve(args: &SolveArgs) -> anyhow::Result<SolveReport> {
    solve_with_cancel(args, &AtomicBool::new(false))
}

/// [`solve`], stopping before the next step once `cancel` is set.
pub fn solve_with_cancel(args: &SolveArgs, cancel: &AtomicBool) -> anyhow::Result<SolveReport> {
    // 1. Everything that can be checked without side effects.
    let recorded = match &args.replay {
        Some(p) => Some(Trajectory::load(p)?),
        None => None,
    };
    // The in-process model is loaded before anything is written, so a bad model name
    // leaves no half-made output behind.
    let in_process = if recorded.is_none() && args.endpoint.is_none() {
        let spec = args.model.clone().unwrap_or_else(|| frognano_model::load::DEMO_MODEL.to_string());
        Some(EngineLlm::load(&spec).with_context(|| {
            format!(
                "no model to ask: loading {spec} in this process failed (fetch the demo model with \
                 scripts/fetch-demo-model.sh, pass --model MODEL, or --endpoint URL --model NAME, \
                 or --replay TRAJECTORY.json)"
            )
        })?)
    } else {
        None
    };
    let (task, default_id) = if args.demo {
        (demo::DEMO_ISSUE.to_string(), "demo".to_string())
    } else if let Some(path) = &args.issue {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read issue file {}", path.display()))?;
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
        (text, stem.unwrap_or_else(|| "task".into()))
    } else if let Some(text) = &args.task {
        (text.clone(), "task".to_string())
    } else if let Some(t) = &recorded {
        let user = t.messages.iter().find(|m| m.role == "user").map(|m| m.text().to_string());
        (user.unwrap_or_default(), t.instance_id.clone())
    } else {
        bail!("no task: pass --issue FILE, --task TEXT or --demo");
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
    let isolation = if args.no_sandbox {
        eprintln!("{NO_SANDBOX_WARNING}");
        Isolation::Unconfined
    } else {
        if let Err(reason) = Sandbox::bubblewrap_available() {
            bail!(
                "cannot confine the agent's commands: {reason}. Install bubblewrap (Debian/Ubuntu: \
                 `apt-get install bubblewrap`), or pass --no-sandbox to run them unconfined"
            );
        }
        Isolation::Bubblewrap
    };
    let demo_dir = frognano_sandbox::scratch::scratch_dir(&std::env::temp_dir(), "demo")?;
    let repo = if args.demo {
        demo::materialize(&demo_dir.path().join("demo-repo"))?
    } else {
        workspace::check_repo(&args.repo, args.allow_dirty)?
    };

    // 2. The run.
    let ws = Workspace::create(&repo, args.allow_dirty)?;
    // Python's bytecode caches would otherwise end up in the patch whenever the agent runs a
    // project's tests and the project does not ignore them.
    let spec = SandboxSpec::new(ws.path()).isolation(isolation).env("PYTHONDONTWRITEBYTECODE", "1");
    let sandbox = Sandbox::new(args.sandbox.apply(spec))?;
    let mut tools = ToolBox::new(sandbox);
    if args.confirm {
        tools.confirm = Some(Box::new(ask_before_running));
    }
    let mut llm: Box<dyn Llm> = match (&recorded, &args.endpoint, &args.model) {
        (Some(t), _, _) => {
            let source = args.replay.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
            Box::new(ReplayLlm::new(t, source))
        }
        (None, Some(url), Some(model)) => {
            Box::new(HttpLlm::new(url, model, Duration::from_secs(args.request_timeout))?)
        }
        (None, Some(_), None) => bail!("--endpoint needs --model NAME"),
        (None, None, _) => Box::new(in_process.context("the in-process model was loaded above")?),
    };
    let config = AgentConfig {
        sampling: Sampling {
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            min_p: args.min_p,
            repetition_penalty: 1.0,
            max_tokens: args.max_tokens_per_turn,
            enable_thinking: !args.no_thinking,
            seed: args.seed,
        },
        max_steps: args.max_steps,
        max_context_tokens: args.max_context,
        max_time: args.max_time.map(Duration::from_secs),
        guards: args.guards(),
        instance_id,
        ..AgentConfig::default()
    };
    let checkpoint_path = output_dir.join("trajectory.json");
    let mut checkpoint = |t: &Trajectory| {
        if std::fs::create_dir_all(&output_dir).is_ok() {
            let _ = t.save(&checkpoint_path);
        }
    };
    let mut t = agent::run(llm.as_mut(), &mut tools, &task, &config, cancel, &mut checkpoint);
    if t.exit_reason == ExitReason::LlmQueryError && t.steps.is_empty() {
        // Nothing happened: a setup problem (endpoint, model), not a run worth recording.
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
    t.save(&output_dir.join("trajectory.json"))?;
    std::fs::write(output_dir.join("patch.diff"), &patch.bytes)?;
    std::fs::write(output_dir.join("summary.md"), summary(&t, &patch, patch_error.as_deref(), llm.as_ref(), &ws))?;
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

fn summary(t: &Trajectory, patch: &Patch, patch_error: Option<&str>, llm: &dyn Llm, ws: &Workspace) -> String {
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
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_units_and_bad_ones_are_named() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("2kb"), Ok(2048));
        assert_eq!(parse_size("4X").unwrap_err(), "\"4X\" has an unknown unit \"X\" (expected K, M, G or T)");
        assert!(parse_size("lots").unwrap_err().contains("is not a size"));
    }
}
