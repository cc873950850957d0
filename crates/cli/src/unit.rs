//! `frognano unit` (hidden): a Ray worker's side of one unit of work. The unit comes as one
//! JSON object on stdin; its `kind` says whose it is (`grade`/`run`: an eval instance
//! attempt, `synth_candidate`/`synth_package`: synthesis, `train_group`: a rollout group);
//! the answer goes to stdout as one JSON object, which the driver writes as a local run would.

/// Runs the unit read from stdin and prints its answer.
pub fn run() -> anyhow::Result<()> {
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)?;
    let unit: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("frognano unit: stdin is not a JSON unit: {e}"))?;
    let answer = match unit["kind"].as_str().unwrap_or_default() {
        "grade" | "run" => frognano_swe::eval::run_unit(&unit)?,
        "synth_candidate" | "synth_package" => frognano_synth::remote::run_unit(&unit)?,
        "train_group" => frognano_rl::remote::run_unit(&unit)?,
        other => anyhow::bail!(
            "unit field `kind`: expected grade, run, synth_candidate, synth_package or train_group, found {other:?}"
        ),
    };
    println!("{answer}");
    Ok(())
}
