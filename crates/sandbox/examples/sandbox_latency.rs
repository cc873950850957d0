//! What confinement costs per command: the wall time of a trivial command (`true`) and of a
//! short shell pipeline run confined (bubblewrap, seccomp, masks, cgroups) and unconfined
//! (a plain spawn with the same limits), side by side. The agent pays this once per Bash call.
//!
//! `cargo run --release -p frognano-sandbox --example sandbox_latency [RUNS]`

use frognano_sandbox::{Command, Isolation, Sandbox, SandboxSpec};
use std::time::{Duration, Instant};

fn median_ms(sb: &Sandbox, cmd: &Command, runs: usize) -> f64 {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let out = sb.run(cmd).expect("the command runs");
            assert!(out.success(), "{out:?}");
            t.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2].as_secs_f64() * 1e3
}

fn main() {
    let runs: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(50);
    let ws = tempfile::tempdir().expect("a temporary workspace");
    let confined = Sandbox::new(SandboxSpec::new(ws.path())).expect("bubblewrap works here");
    let plain = Sandbox::new(SandboxSpec::new(ws.path()).isolation(Isolation::Unconfined)).expect("a plain sandbox");
    println!(
        "process limit enforced: {}, memory limit enforced: {}",
        confined.process_limit_enforced(),
        confined.memory_limit_enforced()
    );
    println!("{:<34} {:>12} {:>12} {:>7}", "command (median of runs)", "confined ms", "plain ms", "ratio");
    for (name, cmd) in [
        ("true", Command::new("true")),
        // `bash -c`, not the agent's `bash -lc`: a login shell unconfined reads the user's
        // profile (pyenv, nvm...), confined it does not (HOME is masked), which is no overhead.
        ("bash -c 'ls | wc -l; git --version'", Command::new("bash").args(["-c", "ls | wc -l; git --version"])),
    ] {
        let c = median_ms(&confined, &cmd, runs);
        let p = median_ms(&plain, &cmd, runs);
        println!("{name:<34} {c:>12.1} {p:>12.1} {:>7.2}", c / p);
    }
}
