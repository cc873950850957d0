//! Benchmark (not CI): frontier curriculum vs uniform sampling, same budget.
//!
//! `cargo run --release -p frognano-rl --example curriculum_bench -- MODEL TASKS OUT [STEPS]`
//!
//! Splits the tasks (every 4th held out), measures the held-out solve rate of the base
//! model, trains two LoRA runs from the same start — `--curriculum frontier` and `uniform` —
//! for STEPS steps each, and measures the held-out solve rate after each. Driven by
//! `bench/train_curriculum.sh`; prints a Markdown table.

use frognano_engine::ChatParts;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use frognano_model::CausalLm;
use frognano_rl::curriculum::Curriculum;
use frognano_rl::env::{load_tasks, Environment, RolloutConfig, SweEnv, SweEnvOptions};
use frognano_rl::optim::AdamWConfig;
use frognano_rl::policy::{LoraConfig, Policy, PolicyOptions};
use frognano_rl::rollout::Outcome;
use frognano_rl::trainer::{TrainConfig, Trainer};
use frognano_synth::calibrate::FrontierConfig;

fn env_num<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Held-out solve rate: `attempts` attempts per task; (solved, scored, attempts).
fn solve_rate(
    model: &Arc<frognano_engine::Scheduler>,
    env: &SweEnv,
    attempts: usize,
    cfg: &RolloutConfig,
) -> anyhow::Result<(usize, usize, usize)> {
    let (mut solved, mut scored, mut total) = (0, 0, 0);
    for id in env.task_ids() {
        for a in 0..attempts {
            let r = env.rollout(model, &id, cfg, 1_000_003 * a as u64 + 17)?;
            total += 1;
            if let Outcome::Scored { reward } = r.outcome {
                scored += 1;
                solved += (reward >= 1.0) as usize;
            }
            eprintln!("  held-out {id} #{a}: {} ({})", r.exit, serde_json::to_string(&r.outcome)?);
        }
    }
    Ok((solved, scored, total))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() >= 4, "usage: curriculum_bench MODEL TASKS OUT [STEPS]");
    let (model, tasks, out) = (&args[1], PathBuf::from(&args[2]), PathBuf::from(&args[3]));
    let steps: u64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(4);
    let (b, g, attempts) = (env_num("B", 2usize), env_num("G", 4usize), env_num("EVAL_ATTEMPTS", 2usize));
    let rollout = RolloutConfig {
        temperature: 1.0,
        max_tokens_per_turn: env_num("MAX_TOKENS_PER_TURN", 256),
        max_steps: env_num("MAX_STEPS", 6),
        max_context_tokens: env_num("MAX_CONTEXT", 4096),
        max_time: Some(Duration::from_secs(env_num("ATTEMPT_TIMEOUT", 300))),
        partial_credit: false,
    };
    let all = load_tasks(&tasks)?;
    let (held, train): (Vec<_>, Vec<_>) = all.into_iter().enumerate().partition(|(i, _)| i % 4 == 0);
    let held: Vec<_> = held.into_iter().map(|(_, t)| t).collect();
    let train: Vec<_> = train.into_iter().map(|(_, t)| t).collect();
    eprintln!("{} training tasks, {} held out; B={b} G={g}, {steps} steps per arm", train.len(), held.len());
    let (base, chat) = ChatParts::split(frognano_model::load(model)?)?;
    let env_opts = SweEnvOptions { enable_thinking: false, ..SweEnvOptions::default() };
    let held_env = SweEnv::new("held-out", held, chat.clone(), env_opts.clone())?;

    let t0 = Instant::now();
    let on_scheduler = |m: Arc<dyn CausalLm>| -> anyhow::Result<Arc<frognano_engine::Scheduler>> {
        Ok(Arc::new(frognano_engine::Scheduler::start(m, frognano_engine::SchedulerConfig::default())?))
    };
    let before = solve_rate(&on_scheduler(base)?, &held_env, attempts, &rollout)?;
    eprintln!("before: {before:?} ({:.0} s)", t0.elapsed().as_secs_f64());
    let mut rows = Vec::new();
    for arm in ["frontier", "uniform"] {
        let opts =
            PolicyOptions { lora: Some(LoraConfig { rank: 8, ..LoraConfig::default() }), ..PolicyOptions::default() };
        let policy = Policy::load(Path::new(&frognano_model::load::resolve_path(model)?), &opts)?;
        let env = SweEnv::new(arm, train.clone(), chat.clone(), env_opts.clone())?;
        let curriculum = match arm {
            "frontier" => Curriculum::frontier(FrontierConfig { batch: b, ..FrontierConfig::default() }),
            _ => Curriculum::uniform(),
        };
        let cfg = TrainConfig {
            steps,
            tasks_per_step: b,
            group_size: g,
            seed: 1,
            optim: AdamWConfig { lr: env_num("LR", 1e-4), ..AdamWConfig::default() },
            save_every: steps,
            ..TrainConfig::default()
        };
        let t = Instant::now();
        let mut trainer = Trainer::open(policy, Box::new(env), curriculum, cfg, rollout.clone(), &out.join(arm))?;
        let mut reward = Vec::new();
        trainer.run(|m| {
            eprintln!("[{arm}] {}", m.summary());
            reward.push(m.reward_mean);
        })?;
        let train_s = t.elapsed().as_secs_f64();
        let after_model: Arc<dyn CausalLm> = Arc::from(trainer.policy().inference_model()?);
        let after = solve_rate(&on_scheduler(after_model)?, &held_env, attempts, &rollout)?;
        rows.push((arm, after, reward, train_s));
    }
    println!("| arm | held-out solved before | after | training reward per step | training wall |");
    println!("|---|---|---|---|---|");
    for (arm, after, reward, s) in rows {
        println!(
            "| {arm} | {}/{} ({} scored) | {}/{} ({} scored) | {:?} | {:.0} s |",
            before.0, before.2, before.1, after.0, after.2, after.1, reward, s
        );
    }
    Ok(())
}
