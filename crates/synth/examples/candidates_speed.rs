//! How long candidate generation takes on a repository (every non-test source file's
//! functions × the language's operators, three seeds as a synth run's rounds draw them), and
//! a digest of what it produced, so that a faster version can be checked to produce the same
//! candidates.
//!
//! `cargo run --release -p frognano-synth --example candidates_speed -- REPO [LANGUAGE]`
//! (REPO: a git checkout; LANGUAGE: python (default), rust, go, javascript, typescript).

use frognano_synth::mutate::Language;
use frognano_synth::pipeline::{generate_candidates, more_candidates, GenOptions};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let repo = std::path::PathBuf::from(
        args.next().ok_or_else(|| anyhow::anyhow!("usage: candidates_speed REPO [LANGUAGE]"))?,
    );
    let lang: Language = serde_json::from_value(serde_json::Value::String(args.next().unwrap_or("python".into())))?;
    let commit = String::from_utf8(
        std::process::Command::new("git").arg("-C").arg(&repo).args(["rev-parse", "HEAD"]).output()?.stdout,
    )?;
    let commit = commit.trim();
    let gen = GenOptions { seed: 0, min_complexity: 3, operators: None, max_candidates: usize::MAX };
    let t = Instant::now();
    let first = generate_candidates(&repo, commit, lang, &gen)?;
    let more = more_candidates(&repo, commit, lang, &gen, &first)?;
    let seconds = t.elapsed().as_secs_f64();
    let keys: Vec<&str> = first.iter().chain(&more).map(|c| c.key.as_str()).collect();
    let digest = {
        use sha2::{Digest, Sha256};
        let d = Sha256::digest(keys.join("\n").as_bytes());
        d.iter().take(8).map(|b| format!("{b:02x}")).collect::<String>()
    };
    println!("{} candidates ({} first round) in {seconds:.2} s; keys digest {digest}", keys.len(), first.len());
    Ok(())
}
