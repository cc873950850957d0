//! `frognano solve`: the flags, turned into `frognano_agent::solve::SolveConfig`; Ctrl-C and
//! the printed summary. The work and its errors are the library's.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use frognano_agent::agent::{AgentEvent, Guards};
use frognano_agent::solve::{changed_files, ModelChoice, SandboxLimits, SolveConfig, TaskInput};
use frognano_protocol::codec::ToolParser;
use frognano_protocol::Sampling;
use frognano_sandbox::Isolation;

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
    /// Go on with a finished run (its output directory): the agent gets the run's whole
    /// conversation, then --comment as the next user message, in a workspace at the run's
    /// base commit that holds its patch; the new run records the one it continues. The
    /// repository is the run's own (its run.json).
    #[arg(long, value_name = "RUN_DIR", requires = "comment", conflicts_with_all = ["issue", "task", "demo", "replay"])]
    pub continue_from: Option<PathBuf>,
    /// With --continue-from: what the agent should do next (a reviewer's comment).
    #[arg(long, requires = "continue_from")]
    pub comment: Option<String>,
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
    /// The tool-call format the model writes: qwen_xml, hermes, llama3_json or mistral
    /// (default: detected from the chat template; with --endpoint, from the markers of
    /// calls a server leaves in the content).
    #[arg(long, value_name = "NAME", conflicts_with = "replay")]
    pub tool_parser: Option<ToolParser>,
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
    #[arg(short = 'c', long, visible_alias = "ctx-size", default_value_t = 65536)]
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
    /// Drift guard off: the notice that answers a reply without a tool call while no file in
    /// the repository has changed yet.
    #[arg(long)]
    pub no_act_notice: bool,
    /// Drift guard off: Edit and Write refusing an existing file the run has not Read yet.
    #[arg(long)]
    pub no_read_before_edit: bool,
    /// Do not show the agent's steps as it works (each model reply, tool call and a one-line
    /// summary of its result, on stderr). stdout carries only the final summary either way.
    #[arg(long, short)]
    pub quiet: bool,
    /// Tool calls under a grammar.
    #[command(flatten)]
    pub constrain: crate::constrain::ConstrainToolsArgs,
    /// Threads of the in-process model (`-t/--threads`).
    #[command(flatten)]
    pub threads: crate::threads::ThreadArgs,
    /// How the in-process model stores attention keys and values: f16 (default), q8_0 or
    /// q4_0 (53 % / 28 % of f16's memory), as `run --kv-cache` (llama.cpp's -ctk/-ctv).
    #[arg(long = "kv-cache", value_name = "TYPE", value_parser = crate::run::parse_kv_cache, conflicts_with_all = ["endpoint", "replay"])]
    pub kv_cache: Option<frognano_model::KvType>,
}

impl SolveArgs {
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
            act_notice: !self.no_act_notice,
            read_before_edit: !self.no_read_before_edit,
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
    /// The limits these flags set.
    pub fn limits(&self) -> SandboxLimits {
        SandboxLimits { env: self.env.clone(), memory: self.memory, file_size: self.file_size, disk: self.disk }
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

impl SolveArgs {
    /// The config these flags describe.
    pub fn config(&self) -> anyhow::Result<SolveConfig> {
        let task = if let Some(run) = &self.continue_from {
            TaskInput::Continue { run: run.clone(), comment: self.comment.clone().unwrap_or_default() }
        } else if self.demo {
            TaskInput::Demo
        } else if let Some(path) = &self.issue {
            TaskInput::IssueFile(path.clone())
        } else if let Some(text) = &self.task {
            TaskInput::Text(text.clone())
        } else {
            TaskInput::Recorded
        };
        let model = match (&self.replay, &self.endpoint, &self.model) {
            (Some(path), _, _) => ModelChoice::Replay(path.clone()),
            (None, Some(url), Some(model)) => ModelChoice::Endpoint { url: url.clone(), model: model.clone() },
            (None, Some(_), None) => bail!("--endpoint needs --model NAME"),
            (None, None, model) => ModelChoice::InProcess(model.clone()),
        };
        Ok(SolveConfig {
            repo: self.repo.clone(),
            task,
            model,
            output: self.output.clone(),
            instance_id: self.instance_id.clone(),
            apply: self.apply,
            yes: self.yes,
            confirm: self.confirm,
            isolation: if self.no_sandbox { Isolation::Unconfined } else { Isolation::Bubblewrap },
            sandbox: self.sandbox.limits(),
            allow_dirty: self.allow_dirty,
            max_steps: self.max_steps,
            max_context: self.max_context,
            max_time: self.max_time.map(Duration::from_secs),
            sampling: Sampling {
                temperature: self.temperature,
                top_p: self.top_p,
                top_k: self.top_k,
                min_p: self.min_p,
                repetition_penalty: 1.0,
                max_tokens: self.max_tokens_per_turn,
                enable_thinking: !self.no_thinking,
                seed: self.seed,
                ..Sampling::default()
            },
            request_timeout: Duration::from_secs(self.request_timeout),
            guards: self.guards(),
            constrain_tools: self.constrain.choice(),
            tool_parser: self.tool_parser,
            kv_cache: self.kv_cache,
        })
    }
}

/// Runs `frognano solve` and prints a short summary.
/// Ctrl-C once cancels the run after the current step (the trajectory is still written,
/// with exit reason `cancelled` and no patch); twice quits at once.
pub fn run(args: SolveArgs) -> anyhow::Result<()> {
    let config = args.config()?;
    config.validate()?;
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    let _ = ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("\ncancelling after the current step; press Ctrl-C again to quit now");
    });
    let max_steps = config.max_steps;
    let mut show = |event: AgentEvent<'_>| {
        if let Some(text) = describe_event(&event, max_steps) {
            eprintln!("{text}");
        }
    };
    let mut silent = |_: AgentEvent<'_>| {};
    let on_event: &mut dyn FnMut(AgentEvent<'_>) = if args.quiet { &mut silent } else { &mut show };
    let report = frognano_agent::solve::solve_with_events(&config, &cancel, on_event)?;
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

/// Longest text shown for one call or observation in the live display.
const SHOWN_CHARS: usize = 120;

/// The live display's lines for `event`: the step and how long the model took, each tool
/// call by its main argument, and a one-line summary of each result.
pub fn describe_event(event: &AgentEvent<'_>, max_steps: usize) -> Option<String> {
    Some(match event {
        AgentEvent::Asking { step } => format!("step {}/{max_steps}: asking the model", step + 1),
        AgentEvent::Replied { message, cut, took, .. } => {
            let took = took.as_secs_f64();
            let said = one_line(&message.text());
            let thought = message.reasoning_content.as_deref().map(one_line).unwrap_or_default();
            let calls = message.calls().len();
            if *cut {
                format!("  reply cut at the per-turn token limit ({took:.1} s)")
            } else if calls == 0 {
                format!("  answer ({took:.1} s): {said}")
            } else if !said.is_empty() {
                format!("  {said} ({took:.1} s)")
            } else if !thought.is_empty() {
                format!("  thinking: {thought} ({took:.1} s)")
            } else {
                format!("  {calls} tool call{} ({took:.1} s)", if calls == 1 { "" } else { "s" })
            }
        }
        AgentEvent::ToolCall { call, .. } => {
            format!("  → {}: {}", call.function.name, call_summary(&call.function.arguments))
        }
        AgentEvent::Observation { tool, observation, took, .. } => {
            let secs = took.as_secs_f64();
            let took = if secs >= 1.0 { format!(" ({secs:.1} s)") } else { String::new() };
            format!("  ← {}{took}", observation_summary(tool, observation))
        }
        AgentEvent::Notice { notice, .. } => format!("  ! {}", one_line(notice)),
        _ => return None,
    })
}

/// The first non-blank line of `text`, cut to [`SHOWN_CHARS`] (with `…` when there is more).
fn one_line(text: &str) -> String {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("");
    let more = lines.next().is_some();
    let mut out: String = first.chars().take(SHOWN_CHARS).collect();
    if more || first.chars().count() > SHOWN_CHARS {
        out.push('…');
    }
    out
}

/// A call by its main argument (the command, the file or the pattern), else its arguments.
fn call_summary(arguments: &str) -> String {
    let parsed: Option<serde_json::Map<String, serde_json::Value>> = serde_json::from_str(arguments).ok();
    let main = parsed.as_ref().and_then(|args| {
        ["command", "file_path", "pattern", "path"].iter().find_map(|k| args.get(*k)?.as_str().map(str::to_string))
    });
    one_line(&main.unwrap_or_else(|| arguments.to_string()))
}

/// One line for a tool's result: a Bash result by its exit code and last line of output,
/// anything else by its first line and how many lines follow.
fn observation_summary(tool: &str, text: &str) -> String {
    if tool == "Bash" {
        if let Some(rest) = text.strip_prefix("Exit code: ") {
            let code = rest.lines().next().unwrap_or("").trim();
            let last = text
                .lines()
                .skip(1)
                .map(str::trim)
                .filter(|l| !l.is_empty() && *l != "STDOUT:" && *l != "STDERR:")
                .last()
                .map(one_line);
            return match last {
                Some(l) => format!("exit {code}: {l}"),
                None => format!("exit {code}, no output"),
            };
        }
    }
    let lines = text.lines().count();
    match lines {
        0 => "(empty)".to_string(),
        1 => one_line(text),
        n => format!("{} (+{} lines)", one_line(text.lines().find(|l| !l.trim().is_empty()).unwrap_or("")), n - 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_display_shows_calls_by_their_main_argument_and_results_in_one_line() {
        use frognano_protocol::{Message, ToolCall};
        use std::time::Duration;
        let call = ToolCall::new("Bash", r#"{"command":"python3 -m unittest test_stats 2>&1 | tail -3","timeout":30}"#);
        let shown = describe_event(&AgentEvent::ToolCall { step: 1, call: &call }, 100).unwrap();
        assert_eq!(shown, "  → Bash: python3 -m unittest test_stats 2>&1 | tail -3");
        let read = ToolCall::new("Read", r#"{"file_path":"stats.py","limit":5}"#);
        assert_eq!(describe_event(&AgentEvent::ToolCall { step: 0, call: &read }, 100).unwrap(), "  → Read: stats.py");
        let odd = ToolCall::new("Custom", r#"{"x":1}"#);
        assert_eq!(
            describe_event(&AgentEvent::ToolCall { step: 0, call: &odd }, 100).unwrap(),
            r#"  → Custom: {"x":1}"#
        );
        let long = ToolCall::new("Bash", serde_json::json!({"command": "x".repeat(300)}).to_string());
        let shown = describe_event(&AgentEvent::ToolCall { step: 0, call: &long }, 100).unwrap();
        assert_eq!(shown.chars().count(), "  → Bash: ".chars().count() + SHOWN_CHARS + 1);
        assert!(shown.ends_with('…'));

        let observe = |tool: &str, text: &str| {
            describe_event(
                &AgentEvent::Observation { step: 0, tool, observation: text, took: Duration::from_millis(20) },
                100,
            )
            .unwrap()
        };
        assert_eq!(
            observe("Bash", "Exit code: 1\nSTDOUT:\nRan 4 tests in 0.003s\n\nFAILED (failures=1)\n\nSTDERR:\n"),
            "  ← exit 1: FAILED (failures=1)"
        );
        assert_eq!(observe("Bash", "Exit code: 0\nSTDOUT:\n\nSTDERR:\n"), "  ← exit 0, no output");
        assert_eq!(observe("Read", "stats.py\n1. import os\n2. \n"), "  ← stats.py (+2 lines)");
        assert_eq!(observe("Edit", "Edited stats.py (1 replacement)."), "  ← Edited stats.py (1 replacement).");
        let slow = AgentEvent::Observation {
            step: 0,
            tool: "Bash",
            observation: "Exit code: 0\nSTDOUT:\nok\n",
            took: Duration::from_secs(3),
        };
        assert_eq!(describe_event(&slow, 100).unwrap(), "  ← exit 0: ok (3.0 s)");

        assert_eq!(describe_event(&AgentEvent::Asking { step: 0 }, 100).unwrap(), "step 1/100: asking the model");
        let took = Duration::from_millis(2500);
        let answer = Message::assistant("Fixed median().\nAll tests pass.");
        let replied = AgentEvent::Replied { step: 4, message: &answer, cut: false, took };
        assert_eq!(describe_event(&replied, 100).unwrap(), "  answer (2.5 s): Fixed median().…");
        let calls = Message::assistant_reply(None, None, vec![call.clone(), read.clone()]);
        let replied = AgentEvent::Replied { step: 0, message: &calls, cut: false, took };
        assert_eq!(describe_event(&replied, 100).unwrap(), "  2 tool calls (2.5 s)");
        let thinking = Message::assistant_reply(None, Some("\nThe test fails on even lengths.\n".into()), vec![call]);
        let replied = AgentEvent::Replied { step: 0, message: &thinking, cut: false, took };
        assert_eq!(describe_event(&replied, 100).unwrap(), "  thinking: The test fails on even lengths. (2.5 s)");
        let cut = AgentEvent::Replied { step: 0, message: &answer, cut: true, took };
        assert_eq!(describe_event(&cut, 100).unwrap(), "  reply cut at the per-turn token limit (2.5 s)");
    }

    #[test]
    fn sizes_parse_with_binary_units_and_bad_ones_are_named() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("2kb"), Ok(2048));
        assert_eq!(parse_size("1.5k"), Ok(1536));
        assert_eq!(parse_size("4X").unwrap_err(), "\"4X\" has an unknown unit \"X\" (expected K, M, G or T)");
        assert!(parse_size("lots").unwrap_err().contains("is not a size"));
    }

    #[derive(clap::Parser)]
    struct TestCli {
        #[command(flatten)]
        solve: SolveArgs,
    }

    #[test]
    fn solve_args_parse_with_the_model_card_defaults() {
        use clap::{CommandFactory, Parser};
        TestCli::command().debug_assert();
        let cli = TestCli::try_parse_from([
            "solve",
            "--repo",
            "r",
            "--issue",
            "i.md",
            "--endpoint",
            "http://h:1",
            "--model",
            "m",
        ])
        .unwrap();
        let a = cli.solve;
        assert_eq!((a.temperature, a.top_p, a.top_k, a.min_p), (0.6, 0.95, 20, 0.0));
        assert_eq!((a.max_tokens_per_turn, a.max_steps, a.max_context), (8192, 100, 65536));
        assert!(!a.no_thinking && !a.leaf_exact && !a.no_sandbox);
        assert_eq!(a.guards(), Guards::default());
        let exact = TestCli::try_parse_from(["solve", "--replay", "t.json", "--leaf-exact"]).unwrap();
        assert_eq!(exact.solve.guards(), Guards::leaf_exact());
        // --endpoint without --model, --replay with --endpoint, --yes without --apply: refused.
        assert!(TestCli::try_parse_from(["solve", "--endpoint", "http://h:1"]).is_err());
        assert!(
            TestCli::try_parse_from(["solve", "--replay", "t", "--endpoint", "http://h:1", "--model", "m"]).is_err()
        );
        assert!(TestCli::try_parse_from(["solve", "--replay", "t", "--yes"]).is_err());
    }

    #[test]
    fn flags_become_the_config() {
        use clap::Parser;
        let c = TestCli::try_parse_from(["solve", "--repo", "r", "--task", "fix", "--sandbox-memory", "1G"])
            .unwrap()
            .solve
            .config()
            .unwrap();
        assert_eq!(c.task, TaskInput::Text("fix".into()));
        assert_eq!(c.model, ModelChoice::InProcess(None));
        assert_eq!(c.sandbox.memory, Some(1 << 30));
        assert_eq!(c.sampling, Sampling::default());
        assert_eq!(c.tool_parser, None);
        let c = TestCli::try_parse_from(["solve", "--task", "fix", "--tool-parser", "mistral"]).unwrap().solve;
        assert_eq!(c.config().unwrap().tool_parser, Some(ToolParser::Mistral(Default::default())));
        let err = TestCli::try_parse_from(["solve", "--task", "fix", "--tool-parser", "json"]).err().unwrap();
        assert!(err.to_string().contains("the known ones are qwen_xml, hermes, llama3_json, mistral"), "{err}");
        let c =
            TestCli::try_parse_from(["solve", "--replay", "t.json", "--no-sandbox"]).unwrap().solve.config().unwrap();
        assert_eq!((c.task, c.model), (TaskInput::Recorded, ModelChoice::Replay("t.json".into())));
        assert_eq!(c.isolation, Isolation::Unconfined);
        let c = TestCli::try_parse_from(["solve", "--continue-from", "runs/a", "--comment", "also b", "--model", "m"])
            .unwrap()
            .solve
            .config()
            .unwrap();
        assert_eq!(c.task, TaskInput::Continue { run: "runs/a".into(), comment: "also b".into() });
        assert!(TestCli::try_parse_from(["solve", "--continue-from", "runs/a"]).is_err(), "--comment is required");
        assert!(TestCli::try_parse_from(["solve", "--continue-from", "a", "--comment", "b", "--task", "c"]).is_err());
        let c = TestCli::try_parse_from(["solve", "--task", "fix", "--kv-cache", "q8_0"]).unwrap().solve;
        assert_eq!(c.config().unwrap().kv_cache, Some(frognano_model::KvType::Q8_0));
        let err = TestCli::try_parse_from(["solve", "--task", "fix", "--kv-cache", "q3"]).err().unwrap().to_string();
        assert!(err.contains("--kv-cache") && err.contains("q3"), "{err}");
        let with_endpoint = ["solve", "--task", "f", "--endpoint", "http://h:1", "--model", "m", "--kv-cache", "q8_0"];
        assert!(TestCli::try_parse_from(with_endpoint).is_err(), "the cache type is the in-process model's");
    }
}
