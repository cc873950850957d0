//! `frognano`: the binary. One module per subcommand, wiring only; the work is in the crates.

mod constrain;
mod eval;
mod progress;
mod pull;
mod ray;
mod review;
mod run;
mod serve;
mod solve;
mod synth;
mod threads;
mod train;
mod unit;

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
    /// --pypi N==V | --crate N@V | --npm N@V | --go M@V`), `synth batch` and `synth calibrate`.
    Synth(Box<synth::SynthCommand>),
    /// SWE-bench-compatible evaluation (grade, run, parse-log, grade-log).
    #[command(subcommand)]
    Eval(eval::EvalCommand),
    /// Online RL of the agent on synthesized tasks (rollouts, clipped policy loss, frontier
    /// curriculum, checkpoints that resume exactly); `--toy` shows the loop in a minute.
    Train(Box<train::TrainArgs>),
    /// A local web page to review runs (solve, eval, train) and apply, reject or send back.
    Review(review::ReviewArgs),
    /// Internal: a `--ray` worker runs one unit of work (JSON on stdin) and prints its answer.
    #[command(hide = true)]
    Unit,
}

impl Command {
    /// The `-t/--threads` count of a command that runs a model, if given.
    fn threads(&self) -> Option<usize> {
        self.model_flags().and_then(|f| f.threads)
    }

    /// The `--device` of a command that runs a model, if given.
    fn device(&self) -> Option<frognano_gpu::DeviceSpec> {
        self.model_flags().and_then(|f| f.device)
    }

    /// The flags of a command that runs a model in this process.
    fn model_flags(&self) -> Option<threads::ThreadArgs> {
        let flags = match self {
            Command::Run(a) => a.gen.threads,
            Command::Chat(a) => a.gen.threads,
            Command::Serve(a) => a.threads,
            Command::Solve(a) => a.threads,
            Command::Eval(eval::EvalCommand::Run(a)) => a.solver.threads,
            Command::Synth(s) => match &s.sub {
                Some(synth::SynthSub::Calibrate(a)) => a.solver.threads,
                Some(synth::SynthSub::Batch(_)) | None => return None,
            },
            Command::Train(a) => a.threads,
            Command::Logits(a) => a.threads,
            Command::Pull(_) | Command::Eval(_) | Command::Review(_) | Command::Unit => return None,
        };
        Some(flags)
    }
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
    if let Err(e) = threads::size_pool(cli.command.threads()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
    // Only commands that run a model here place it; `eval run` passes the choice on to the
    // `frognano solve` processes it starts through FROGNANO_DEVICE.
    if cli.command.model_flags().is_some() {
        if let Err(e) = threads::place_models(cli.command.device()) {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
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
        Command::Review(a) => review::run(a),
        Command::Unit => unit::run(),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::Cli;

    /// `-t N` reaches the pool sizing from every command that runs a model.
    #[test]
    fn every_model_command_hands_its_thread_count_to_the_pool() {
        for line in [
            "run m -t 3",
            "chat m --threads 3",
            "logits m --ids 1 -t 3",
            "serve m -t 3",
            "solve --model m -t 3",
            "eval run --instances i.jsonl --run-id r --model m -t 3",
            "synth calibrate --tasks t.jsonl --model m -t 3",
            "train --toy -t 3",
        ] {
            let cli = Cli::try_parse_from(std::iter::once("frognano").chain(line.split(' ')))
                .unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(cli.command.threads(), Some(3), "{line}");
        }
        let cli = Cli::try_parse_from(["frognano", "run", "m"]).unwrap();
        assert_eq!(cli.command.threads(), None, "no -t: rayon's default (RAYON_NUM_THREADS or one per core)");
    }
}
