//! `frognano`: the binary. One module per subcommand, wiring only; the work is in the crates.

mod eval;
mod progress;
mod pull;
mod run;
mod serve;
mod solve;
mod synth;
mod train;

use clap::{Parser, Subcommand};

/// FrogNano: run, serve, evaluate and train a compact coding agent.
#[derive(Parser)]
#[command(name = "frognano", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streamed to stdout.
    Run(run::RunArgs),
    /// Talk with a model on the terminal (chat template applied, state kept across turns).
    Chat(run::ChatArgs),
    /// Print the logits of every position for a list of token ids, as JSON.
    Logits(run::LogitsArgs),
    /// Download a checkpoint from the Hugging Face hub into the local cache.
    Pull(pull::PullArgs),
    /// OpenAI-compatible HTTP server (chat, tools, streaming, logprobs).
    Serve(serve::ServeArgs),
    /// The coding agent: resolve an issue in a repository and hand back a patch for review.
    Solve(solve::SolveArgs),
    /// Task synthesis: validated bug-fix tasks from a repository (`frognano synth REPO |
    /// --pypi N==V | --crate N@V`), and `synth calibrate`.
    Synth(Box<synth::SynthCommand>),
    /// SWE-bench-compatible evaluation (grade, run, parse-log, grade-log).
    #[command(subcommand)]
    Eval(eval::EvalCommand),
    /// Online RL of the agent on synthesized tasks (rollouts, clipped policy loss, frontier
    /// curriculum, checkpoints that resume exactly); `--toy` shows the loop in a minute.
    Train(Box<train::TrainArgs>),
}

fn main() {
    // Rust ignores SIGPIPE, so printing to a closed pipe (`frognano eval … | grep -q`) panics;
    // restore the default so the process ends quietly, as other command-line tools do.
    #[cfg(unix)]
    // SAFETY: setting a signal disposition to the default before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Library warnings (a chat template without tool support, a malformed tool call, …) go to
    // stderr; RUST_LOG picks other levels.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter).without_time().init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => run::run(a),
        Command::Chat(a) => run::chat(a),
        Command::Logits(a) => run::logits(a),
        Command::Pull(a) => pull::pull(a),
        Command::Serve(a) => serve::run(a),
        Command::Solve(a) => solve::run(a),
        Command::Synth(cmd) => synth::run(*cmd),
        Command::Eval(cmd) => eval::run(cmd),
        Command::Train(a) => train::run(*a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
