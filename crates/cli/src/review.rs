//! `frognano review [DIR]`: the flags, turned into `frognano_review::ReviewConfig`; the server
//! and the pages are the library's (docs/review.md).

use std::path::PathBuf;

use frognano_agent::solve::ModelChoice;
use frognano_review::{ReviewConfig, ReviewServer};
use frognano_sandbox::Isolation;

/// `frognano review` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ReviewArgs {
    /// The folder with the runs: `frognano solve` outputs, `frognano eval` output roots,
    /// `frognano train` run folders.
    #[arg(value_name = "DIR", default_value = "frognano-runs")]
    pub dir: PathBuf,
    /// Address to listen on. Anything but loopback requires the token printed at start.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Do not open a browser.
    #[arg(long)]
    pub no_open: bool,
    /// Name the decisions are recorded under (default: the login name).
    #[arg(long)]
    pub reviewer: Option<String>,
    /// The model a run is sent back to (default: the one that made it). Without
    /// --endpoint: a model run in this process; with it, the model name at the endpoint.
    #[arg(long)]
    pub model: Option<String>,
    /// OpenAI-compatible endpoint a run is sent back to.
    #[arg(long, requires = "model")]
    pub endpoint: Option<String>,
    /// Steps a run sent back may take (on top of the ones it continues).
    #[arg(long, default_value_t = 100)]
    pub max_steps: usize,
    /// Run the agent's commands of a run sent back without the sandbox (as `frognano solve
    /// --no-sandbox`).
    #[arg(long)]
    pub no_sandbox: bool,
}

/// Serves the review page until Ctrl-C.
pub fn run(args: ReviewArgs) -> anyhow::Result<()> {
    let mut config = ReviewConfig::new(&args.dir);
    config.host = args.host.clone();
    config.port = args.port;
    if let Some(name) = &args.reviewer {
        config.reviewer = name.clone();
    }
    config.model = match (&args.endpoint, &args.model) {
        (Some(url), Some(model)) => Some(ModelChoice::Endpoint { url: url.clone(), model: model.clone() }),
        (None, Some(model)) => Some(ModelChoice::InProcess(Some(model.clone()))),
        _ => None,
    };
    config.continue_with.max_steps = args.max_steps;
    config.continue_with.isolation = if args.no_sandbox { Isolation::Unconfined } else { Isolation::Bubblewrap };
    let server = ReviewServer::bind(config)?;
    let url = server.url().to_string();
    println!("frognano review: {} at {url}", server.root().display());
    if args.host != "127.0.0.1" && args.host != "localhost" {
        println!("listening beyond loopback: the token in that URL is needed for every visit");
    }
    println!("Ctrl-C to stop.");
    if !args.no_open {
        open_browser(&url);
    }
    server.run()
}

/// Opens `url` in the desktop's browser when there is one (xdg-open, open); quiet otherwise.
fn open_browser(url: &str) {
    let has_display = std::env::var_os("DISPLAY").is_some() || std::env::var_os("WAYLAND_DISPLAY").is_some();
    let opener = if cfg!(target_os = "macos") { "open" } else { "xdg-open" };
    if !cfg!(target_os = "macos") && !has_display {
        return;
    }
    let _ = std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}
