//! Benchmark (not CI): frontier curriculum vs uniform sampling vs uniform with DAPO dynamic
//! sampling on the graded toy, same warm start, same rollout-token budget, several seeds.
//!
//! `cargo run --release -p frognano-rl --example graded_curriculum -- OUT`
//! (env: SEEDS=5, ARMS=frontier,uniform,uniform+dynamic-sampling, BUDGET=rollout tokens per
//! run, B, G, LR, WARM_STEPS, WARM_LR, WARM_LEVELS, PARALLEL; the frontier arm's controller:
//! FRONTIER_GAMMA, FRONTIER_NEW_SHARE, FRONTIER_FOCUS)
//!
//! Resumable: finished runs are read back, a killed run resumes from its last checkpoint.
//! Writes `OUT/table.md` (Markdown) and `OUT/curves.svg`; driven by `bench/train_curriculum.sh`.

use std::path::PathBuf;
use std::time::Instant;

use frognano_rl::experiment::{run_arm, summarize, warm_start, Arm, ArmRuns, ExperimentConfig};
use frognano_rl::graded_toy::expected_solve_rate;
use indicatif::{ProgressBar, ProgressStyle};

fn env_num<T: std::str::FromStr>(key: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(key) {
        Err(_) => Ok(default),
        Ok(v) => v.parse().map_err(|_| anyhow::anyhow!("environment variable {key}: expected a number, found {v:?}")),
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() == 2, "usage: graded_curriculum OUT");
    let out = PathBuf::from(&args[1]);
    let d = ExperimentConfig::default();
    let cfg = ExperimentConfig {
        token_budget: env_num("BUDGET", d.token_budget)?,
        tasks_per_step: env_num("B", d.tasks_per_step)?,
        group_size: env_num("G", d.group_size)?,
        lr: env_num("LR", d.lr)?,
        warm_steps: env_num("WARM_STEPS", d.warm_steps)?,
        warm_lr: env_num("WARM_LR", d.warm_lr)?,
        warm_max_level: env_num("WARM_LEVELS", d.warm_max_level)?,
        parallel_rollouts: env_num("PARALLEL", d.parallel_rollouts)?,
        frontier: frognano_synth::calibrate::FrontierConfig {
            gamma: env_num("FRONTIER_GAMMA", d.frontier.gamma)?,
            new_share: env_num("FRONTIER_NEW_SHARE", d.frontier.new_share)?,
            focus: env_num("FRONTIER_FOCUS", d.frontier.focus)?,
            ..d.frontier.clone()
        },
        ..d
    };
    let seeds: u64 = env_num("SEEDS", 5)?;
    let chosen: Vec<Arm> = match std::env::var("ARMS") {
        Err(_) => Arm::ALL.to_vec(),
        Ok(list) => list
            .split(',')
            .map(|name| {
                Arm::ALL.into_iter().find(|a| a.name() == name.trim()).ok_or_else(|| {
                    anyhow::anyhow!(
                        "environment variable ARMS: unknown arm {name:?}; the arms are {}",
                        Arm::ALL.map(|a| a.name()).join(", ")
                    )
                })
            })
            .collect::<anyhow::Result<_>>()?,
    };
    let split = cfg.tasks.split()?;
    eprintln!(
        "graded toy: {} training tasks, {} held out, levels 1..={}; B={} G={} lr={} budget {} rollout tokens per run, {seeds} seeds",
        split.train.len(),
        split.held_out.len(),
        cfg.tasks.max_level,
        cfg.tasks_per_step,
        cfg.group_size,
        cfg.lr,
        cfg.token_budget
    );
    let t0 = Instant::now();
    let warm = warm_start(&cfg, &split, &out)?;
    let policy = frognano_rl::experiment::load_warm(&cfg, &warm)?;
    let on_train = expected_solve_rate(&policy, &split.train)?;
    let on_held = expected_solve_rate(&policy, &split.held_out)?;
    let fmt = |r: &frognano_rl::graded_toy::SolveRate| {
        r.per_level.iter().map(|(l, p)| format!("L{l} {p:.3}")).collect::<Vec<_>>().join(", ")
    };
    eprintln!("warm start ({:.1} s): training {:.3} ({})", t0.elapsed().as_secs_f64(), on_train.mean, fmt(&on_train));
    eprintln!("                     held-out {:.3} ({})", on_held.mean, fmt(&on_held));

    let bar = ProgressBar::new(chosen.len() as u64 * seeds * cfg.token_budget as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} rollout tokens  eta {eta}  {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let mut arms = Vec::new();
    for arm in chosen {
        let mut runs = Vec::new();
        for seed in 1..=seeds {
            let dir = out.join(arm.name()).join(format!("seed-{seed}"));
            let started = Instant::now();
            let mut last = 0;
            let points = run_arm(&cfg, arm, seed, &warm, &split, &dir, |p| {
                bar.inc(p.tokens.min(cfg.token_budget) as u64 - last);
                last = p.tokens.min(cfg.token_budget) as u64;
                bar.set_message(format!("{} seed {seed}: step {} held-out {:.3}", arm.name(), p.step, p.held_out));
            })?;
            // A run read back from disk reports nothing: count it whole.
            bar.inc(cfg.token_budget as u64 - last.min(cfg.token_budget as u64));
            let end = points.last().expect("a run has points");
            let line = format!(
                "{} seed {seed}: {} steps, {} tokens, held-out {:.3} -> {:.3} ({:.0} s)",
                arm.name(),
                end.step,
                end.tokens,
                points[0].held_out,
                end.held_out,
                started.elapsed().as_secs_f64()
            );
            // Without a terminal the bar is hidden; the log still gets one line per run.
            if bar.is_hidden() {
                eprintln!("{line}");
            } else {
                bar.println(line);
            }
            runs.push(points);
        }
        arms.push(ArmRuns { arm, runs });
    }
    bar.finish_and_clear();
    let s = summarize(
        &cfg,
        &arms,
        &format!("graded toy: frontier vs uniform vs dynamic sampling, {seeds} seeds, same warm start"),
    );
    let table = format!(
        "Config: {} training / {} held-out tasks, levels 1..={}, B={} G={} lr={} (AdamW), budget {} rollout tokens per run, warm start {} supervised steps (lr {}) on training tasks of levels 1..={} whose names are the first {} of 3 per operator; {:.0} s in this invocation (finished runs are read back, not retrained).\n\n{}",
        split.train.len(),
        split.held_out.len(),
        cfg.tasks.max_level,
        cfg.tasks_per_step,
        cfg.group_size,
        cfg.lr,
        cfg.token_budget,
        cfg.warm_steps,
        cfg.warm_lr,
        cfg.warm_max_level,
        cfg.warm_synonyms,
        t0.elapsed().as_secs_f64(),
        s.table
    );
    std::fs::write(out.join("table.md"), &table)?;
    std::fs::write(out.join("curves.svg"), &s.svg)?;
    std::fs::write(out.join("summary.json"), serde_json::to_string(&s)?)?;
    println!("{table}");
    Ok(())
}
