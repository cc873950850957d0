//! `frognano pull REPO_ID`.

use clap::Args;

/// Arguments of `frognano pull`.
#[derive(Args)]
pub struct PullArgs {
    /// Hub repository id, e.g. `microsoft/FrogNano-4B-2609`.
    pub repo_id: String,
    /// Branch, tag or commit.
    #[arg(long, default_value = "main")]
    pub revision: String,
}

/// Downloads into the standard Hugging Face cache (`$HF_HUB_CACHE`, `$HF_HOME/hub` or
/// `~/.cache/huggingface/hub`); the endpoint follows `$HF_ENDPOINT`.
pub fn pull(a: PullArgs) -> anyhow::Result<()> {
    let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
    let snap = frognano_model::hub::pull(&a.repo_id, &a.revision, &endpoint, |file, bytes| {
        eprintln!("  {file} ({bytes} bytes)");
    })?;
    println!("{}", snap.display());
    Ok(())
}
