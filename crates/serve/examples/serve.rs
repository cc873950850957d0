//! `frognano serve` as a standalone program, for benches run before the CLI wires it in:
//! `cargo run --release -p frognano-serve --example serve -- MODEL --port 8000`.

use clap::Parser;

/// Command line: the same arguments as `frognano serve`.
#[derive(Parser)]
#[command(name = "frognano-serve", about = "OpenAI-compatible server over a local model")]
struct Cli {
    #[command(flatten)]
    serve: frognano_serve::ServeArgs,
}

fn main() -> anyhow::Result<()> {
    frognano_serve::run_serve(Cli::parse().serve)
}
