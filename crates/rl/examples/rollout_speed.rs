//! Rollout throughput, side by side in one run: G attempts of one task (a training group)
//! with P running at once, each attempt on a scheduler of its own (one session per attempt,
//! as rollouts ran before the scheduler moved into the engine) versus all attempts on one
//! shared scheduler (batched decode steps, the group's prompt prefilled once and forked).
//! The attempts draw from the same seeds in both arms, so they generate the same tokens.
//!
//! ```sh
//! cargo run --release -p frognano-rl --example rollout_speed            # demo model, G=8, P=4
//! MODEL=path.gguf G=8 P=8 MAX_TOKENS=96 STEPS=3 REPEATS=3 cargo run --release -p frognano-rl --example rollout_speed
//! ```
//! Prints one line per arm and repeat (wall seconds, sampled tokens/s, prompt tokens
//! computed vs reused) and the median ratio.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use frognano_engine::{ChatParts, Scheduler, SchedulerConfig};
use frognano_model::CausalLm;
use frognano_rl::env::{Environment, RolloutConfig, SweEnv, SweEnvOptions};
use frognano_sandbox::{Isolation, Sandbox};
use frognano_swe::instance::parse_jsonl_instances;
use rayon::prelude::*;
use serde_json::json;

fn env_num<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn git(dir: &std::path::Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git")
        .args(["-c", "user.name=b", "-c", "user.email=b@b", "-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .output()?;
    anyhow::ensure!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A one-file bash project with a failing test, as a SWE-bench instance.
fn task(root: &std::path::Path) -> anyhow::Result<Vec<frognano_swe::SweInstance>> {
    let repo = root.join("greet");
    std::fs::create_dir_all(repo.join("tests"))?;
    git(&repo, &["init", "-q"])?;
    std::fs::write(repo.join("lib.sh"), "greet() { echo \"Helo, $1\"; }\n")?;
    std::fs::write(
        repo.join("run_tests.sh"),
        "#!/bin/bash\n. ./lib.sh\nfor t in tests/*.t.sh; do . \"$t\"; done\nfor f in $(declare -F | awk '{print $3}' | grep '^Test'); do\n  if $f; then echo \"--- PASS: $f (0.00s)\"; else echo \"--- FAIL: $f (0.00s)\"; fi\ndone\n",
    )?;
    std::fs::write(repo.join("tests/other.t.sh"), "TestTrue() { true; }\n")?;
    git(&repo, &["add", "-A"])?;
    git(&repo, &["commit", "-qm", "initial"])?;
    let base = git(&repo, &["rev-parse", "HEAD"])?;
    let line = json!({
        "instance_id": "sh__greet-1", "repo": "sh/greet", "base_commit": base,
        "repo_path": repo.to_string_lossy(), "patch": "", "test_patch": "",
        "problem_statement": "`greet Bob` prints `Helo, Bob`; it should print `Hello, Bob`. Fix lib.sh.",
        "version": "0.1", "log_parser": "gotest", "test_cmd": "bash run_tests.sh",
        "FAIL_TO_PASS": ["TestTrue"], "PASS_TO_PASS": [],
    });
    Ok(parse_jsonl_instances(&format!("{line}\n"), "bench.jsonl")?)
}

struct Arm {
    wall: f64,
    sampled: usize,
    prompt: u64,
    cached: u64,
}

fn run_arm(
    env: &SweEnv,
    model: &Arc<dyn CausalLm>,
    shared: bool,
    g: usize,
    p: usize,
    cfg: &RolloutConfig,
) -> anyhow::Result<Arm> {
    let config = SchedulerConfig {
        max_batch: p,
        sessions: 2 * p + 2,
        prefix_reuse: true,
        max_waiting: usize::MAX,
        ..Default::default()
    };
    // One scheduler for the whole group, or one per attempt (a session of its own each).
    let schedulers = (0..if shared { 1 } else { g })
        .map(|_| Ok(Arc::new(Scheduler::start(Arc::clone(model), config.clone())?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(p).build()?;
    let t = Instant::now();
    let sampled: Vec<anyhow::Result<usize>> = pool.install(|| {
        (0..g)
            .into_par_iter()
            .map(|j| {
                let sampler = &schedulers[j % schedulers.len()];
                Ok(env.rollout(sampler, "sh__greet-1", cfg, 1000 + j as u64)?.sampled_tokens())
            })
            .collect()
    });
    let wall = t.elapsed().as_secs_f64();
    let count = |field: fn(&frognano_engine::SchedulerStats) -> &std::sync::atomic::AtomicU64| -> u64 {
        schedulers.iter().map(|s| field(s.stats()).load(std::sync::atomic::Ordering::Relaxed)).sum()
    };
    Ok(Arm {
        wall,
        sampled: sampled.into_iter().sum::<anyhow::Result<usize>>()?,
        prompt: count(|s| &s.prompt_tokens),
        cached: count(|s| &s.cached_tokens),
    })
}

fn main() -> anyhow::Result<()> {
    let model_path = std::env::var("MODEL").unwrap_or_else(|_| frognano_model::load::DEMO_MODEL.to_string());
    let (g, p) = (env_num("G", 8usize), env_num("P", 4usize));
    let repeats = env_num("REPEATS", 3usize);
    let cfg = RolloutConfig {
        temperature: 1.0,
        max_tokens_per_turn: env_num("MAX_TOKENS", 96usize),
        max_steps: env_num("STEPS", 3usize),
        max_context_tokens: 8192,
        max_time: Some(Duration::from_secs(600)),
        partial_credit: false,
    };
    let root = tempfile::tempdir()?;
    let (model, chat) = ChatParts::split(frognano_model::load(&model_path)?)?;
    let isolation = if Sandbox::bubblewrap_available().is_ok() { Isolation::Bubblewrap } else { Isolation::Unconfined };
    let opts = SweEnvOptions {
        enable_thinking: false,
        isolation,
        work_root: root.path().join("work"),
        ..SweEnvOptions::default()
    };
    let env = SweEnv::new("bench", task(root.path())?, chat, opts)?;
    println!(
        "model {model_path}; G={g} attempts, P={p} at once, ≤{} tokens × {} steps",
        cfg.max_tokens_per_turn, cfg.max_steps
    );
    let mut ratios = Vec::new();
    for rep in 0..repeats {
        // Alternate which arm goes first, so drift in machine load does not favour one.
        let order = if rep % 2 == 0 { [false, true] } else { [true, false] };
        let mut walls = [0.0; 2];
        for shared in order {
            let a = run_arm(&env, &model, shared, g, p, &cfg)?;
            let name = if shared { "shared scheduler" } else { "session per attempt" };
            println!(
                "rep {rep} {name:>20}: {:6.1} s, {:5} sampled tokens, {:6.1} tok/s, prompt tokens {} of which reused {}",
                a.wall,
                a.sampled,
                a.sampled as f64 / a.wall,
                a.prompt,
                a.cached
            );
            walls[shared as usize] = a.wall;
        }
        ratios.push(walls[0] / walls[1]);
    }
    ratios.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("median speed-up of the shared scheduler (same tokens): {:.2}x", ratios[ratios.len() / 2]);
    Ok(())
}
