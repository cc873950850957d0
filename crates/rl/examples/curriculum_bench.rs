//! Benchmark (not CI): frontier curriculum vs uniform sampling on a real model and real
//! synthesized tasks, same budget.
//!
//! `cargo run --release -p frognano-rl --example curriculum_bench -- MODEL TASKS OUT [STEPS]`
//!
//! 1. **Split.** Tasks whose `repo` contains one of the comma-separated `HELD_OUT` names are
//!    held out (split by package: no held-out task shares code with a training task); without
//!    `HELD_OUT`, every 4th task.
//! 2. **Calibrate.** The base model makes `G` attempts at every training task (the pass rate
//!    `synth calibrate` measures) and `EVAL_ATTEMPTS` at every held-out task. The per-task
//!    rates and the number of tasks in the learnability band (0 < p̂ < 1) are printed: an empty
//!    band means the tasks are too hard or too easy for this model, and nothing can be learnt.
//! 3. **Train.** Two LoRA runs from the same base, `--curriculum frontier` (seeded with the
//!    calibration's counts, as `frognano train` seeded by `synth calibrate` would be) and
//!    `uniform`, STEPS steps of B tasks × G attempts each.
//! 4. **Measure.** Held-out solve rate after each arm; rollout tokens spent and tokens/s.
//!
//! STEPS = 0 stops after the calibration.
//!
//! Attempts run `PARALLEL` at a time on one engine scheduler, so their decode steps are
//! batched. Prints a Markdown table and writes it to `OUT/table.md`, with `OUT/calibration.json`.
//! Driven by `bench/train_curriculum.sh coder` (and `smol`).
//!
//! env: HELD_OUT, TASKS_PER_REPO (all), TEMPERATURE (1.0), HARNESS (leaf | small-model),
//! HINTS (none | file | function | line), B (2),
//! G (4), EVAL_ATTEMPTS (2), PARALLEL (4), LORA_RANK (8), LR (1e-4),
//! MAX_STEPS (10), MAX_TOKENS_PER_TURN (512; at 6 and 256, 5 of a 1.5B model's first 7 attempts hit a limit),
//! MAX_CONTEXT (4096), ATTEMPT_TIMEOUT (300 s).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use frognano_engine::ChatParts;
use frognano_model::CausalLm;
use frognano_rl::curriculum::Curriculum;
use frognano_rl::env::{load_tasks, Environment, RolloutConfig, SweEnv, SweEnvOptions};
use frognano_rl::optim::AdamWConfig;
use frognano_rl::policy::{LoraConfig, Policy, PolicyOptions};
use frognano_rl::rollout::Outcome;
use frognano_rl::trainer::{rollout_scheduler, TrainConfig, Trainer};
use frognano_synth::calibrate::FrontierConfig;

fn env_num<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// What `attempts` attempts at each task of `env` gave: per task (id, outcomes), the sampled
/// tokens, and the wall time.
struct Sweep {
    per_task: Vec<(String, Vec<Outcome>)>,
    tokens: usize,
    seconds: f64,
}

impl Sweep {
    /// (solved, scored, attempts).
    fn totals(&self) -> (usize, usize, usize) {
        let all = self.per_task.iter().flat_map(|(_, o)| o);
        let (mut solved, mut scored, mut total) = (0, 0, 0);
        for o in all {
            total += 1;
            if let Outcome::Scored { reward } = o {
                scored += 1;
                solved += (*reward >= 1.0) as usize;
            }
        }
        (solved, scored, total)
    }

    fn cell(&self) -> String {
        let (solved, scored, total) = self.totals();
        format!("{solved}/{total} ({scored} scored)")
    }
}

/// `attempts` attempts at every task of `env`, `parallel` at a time on `model`; each
/// attempt's transcript (its whole token sequence, decoded) goes to
/// `OUT/transcripts/LABEL/TASK.A.txt`.
#[allow(clippy::too_many_arguments)]
fn sweep(
    model: &Arc<frognano_engine::Scheduler>,
    env: &SweEnv,
    attempts: usize,
    parallel: usize,
    cfg: &RolloutConfig,
    label: &str,
    out: &Path,
    chat: &ChatParts,
) -> anyhow::Result<Sweep> {
    let dir = out.join("transcripts").join(label);
    std::fs::create_dir_all(&dir)?;
    let mut ids = env.task_ids();
    ids.sort();
    let jobs: Vec<(usize, usize)> = (0..ids.len()).flat_map(|t| (0..attempts).map(move |a| (t, a))).collect();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Vec<Option<Outcome>>>> = Mutex::new(vec![vec![None; attempts]; ids.len()]);
    let tokens = AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let workers: Vec<_> = (0..parallel.max(1))
            .map(|_| {
                s.spawn(|| -> anyhow::Result<()> {
                    loop {
                        let j = next.fetch_add(1, Ordering::SeqCst);
                        let Some(&(t, a)) = jobs.get(j) else { return Ok(()) };
                        let r = env.rollout(model, &ids[t], cfg, 1_000_003 * a as u64 + 17)?;
                        tokens.fetch_add(r.sampled_tokens(), Ordering::SeqCst);
                        let text = chat.tokenizer.decode(&r.tokens, false).unwrap_or_default();
                        std::fs::write(dir.join(format!("{}.{a}.txt", ids[t])), text)?;
                        eprintln!(
                            "  {label} {} #{a}: {} ({}, {} tokens, {:.0} s)",
                            ids[t],
                            r.exit,
                            serde_json::to_string(&r.outcome)?,
                            r.sampled_tokens(),
                            r.wall_s
                        );
                        results.lock().expect("no worker panicked")[t][a] = Some(r.outcome);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| anyhow::anyhow!("an attempt thread panicked"))??;
        }
        Ok(())
    })?;
    let per_task = ids
        .into_iter()
        .zip(results.into_inner().expect("no worker panicked"))
        .map(|(id, o)| (id, o.into_iter().map(|x| x.expect("every attempt ran")).collect()))
        .collect();
    Ok(Sweep { per_task, tokens: tokens.into_inner(), seconds: started.elapsed().as_secs_f64() })
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() >= 4, "usage: curriculum_bench MODEL TASKS OUT [STEPS]");
    let (model, tasks, out) = (&args[1], PathBuf::from(&args[2]), PathBuf::from(&args[3]));
    let steps: u64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(4);
    let (b, g, attempts) = (env_num("B", 2usize), env_num("G", 4usize), env_num("EVAL_ATTEMPTS", 2usize));
    let parallel = env_num("PARALLEL", 4usize);
    let rank = env_num("LORA_RANK", 8usize);
    let rollout = RolloutConfig {
        // Below 1, attempts are drawn from a sharper distribution; the recorded logprobs (and
        // so the loss) stay the model's own.
        temperature: env_num("TEMPERATURE", 1.0f32),
        max_tokens_per_turn: env_num("MAX_TOKENS_PER_TURN", 512),
        max_steps: env_num("MAX_STEPS", 10),
        max_context_tokens: env_num("MAX_CONTEXT", 4096),
        max_time: Some(Duration::from_secs(env_num("ATTEMPT_TIMEOUT", 300))),
        partial_credit: false,
    };
    std::fs::create_dir_all(&out)?;
    let all = load_tasks(&tasks)?;
    let held_out: Vec<String> = std::env::var("HELD_OUT")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let (held, train): (Vec<_>, Vec<_>) = all.into_iter().enumerate().partition(|(i, t)| match held_out.is_empty() {
        true => i % 4 == 0,
        false => held_out.iter().any(|h| t.repo.contains(h.as_str())),
    });
    // At most TASKS_PER_REPO tasks of each package (in file order), to size a run.
    let per_repo = env_num("TASKS_PER_REPO", usize::MAX);
    let take = |ts: Vec<(usize, frognano_swe::SweInstance)>| -> Vec<frognano_swe::SweInstance> {
        let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        ts.into_iter()
            .map(|(_, t)| t)
            .filter(|t| {
                let n = seen.entry(t.repo.clone()).or_default();
                *n += 1;
                *n <= per_repo
            })
            .collect()
    };
    let (held, train) = (take(held), take(train));
    anyhow::ensure!(
        !held.is_empty() && !train.is_empty(),
        "{} training and {} held-out tasks: need both",
        train.len(),
        held.len()
    );
    let repos = |ts: &[frognano_swe::SweInstance]| {
        let mut r: Vec<&str> = ts.iter().map(|t| t.repo.as_str()).collect();
        r.sort();
        r.dedup();
        r.join(", ")
    };
    eprintln!(
        "{} training tasks ({}), {} held out ({}); B={b} G={g} PARALLEL={parallel}, {steps} steps per arm",
        train.len(),
        repos(&train),
        held.len(),
        repos(&held)
    );
    let (base, chat) = ChatParts::split(frognano_model::load(model)?)?;
    let env_opts = SweEnvOptions { enable_thinking: false, ..SweEnvOptions::default() };
    // HARNESS=small-model: the notices and constrained tool calls `frognano solve` gives a
    // small model (default: the Leaf harness, no guards).
    let env_opts = match std::env::var("HARNESS").as_deref() {
        Ok("small-model") => env_opts.small_model(),
        Ok("leaf") | Err(_) => env_opts,
        Ok(other) => anyhow::bail!("HARNESS={other:?}: expected leaf or small-model"),
    };
    // HINTS=file|function|line: where the fix goes, appended to every issue text.
    let hints = match std::env::var("HINTS") {
        Ok(h) => h.parse().map_err(|e| anyhow::anyhow!("HINTS: {e}"))?,
        Err(_) => frognano_swe::localization::HintLevel::None,
    };
    let env_opts = SweEnvOptions { hints, ..env_opts };
    let held_env = SweEnv::new("held-out", held, chat.clone(), env_opts.clone())?;
    let train_env = SweEnv::new("train", train.clone(), chat.clone(), env_opts.clone())?;
    // Calibration and held-out attempts run on the scheduler training rollouts run on.
    let on_scheduler = |m: Arc<dyn CausalLm>| rollout_scheduler(m, parallel);

    // Calibration of the base model.
    let base_sched = on_scheduler(base)?;
    let calib = sweep(&base_sched, &train_env, g, parallel, &rollout, "calibrate", &out, &chat)?;
    let before = sweep(&base_sched, &held_env, attempts, parallel, &rollout, "held-out", &out, &chat)?;
    drop(base_sched);
    let rate = |o: &[Outcome]| o.iter().filter(|x| matches!(x, Outcome::Scored { reward } if *reward >= 1.0)).count();
    let band = calib.per_task.iter().filter(|(_, o)| (1..o.len()).contains(&rate(o))).count();
    let calibration = serde_json::json!({
        "model": model,
        "train": calib.per_task.iter().map(|(id, o)| (id.clone(), serde_json::json!({"solved": rate(o), "attempts": o.len()}))).collect::<serde_json::Map<_, _>>(),
        "held_out": before.per_task.iter().map(|(id, o)| (id.clone(), serde_json::json!({"solved": rate(o), "attempts": o.len()}))).collect::<serde_json::Map<_, _>>(),
        "in_band": band,
        "rollout_tokens_per_s": (calib.tokens + before.tokens) as f64 / (calib.seconds + before.seconds).max(1e-9),
    });
    std::fs::write(out.join("calibration.json"), serde_json::to_string_pretty(&calibration)?)?;
    eprintln!(
        "base: training tasks {} with {band}/{} in the band; held-out {}; {:.1} rollout tokens/s",
        calib.cell(),
        calib.per_task.len(),
        before.cell(),
        calibration["rollout_tokens_per_s"]
    );

    let mut rows = Vec::new();
    // STEPS = 0: the calibration alone.
    let arms: &[&str] = if steps == 0 { &[] } else { &["frontier", "uniform"] };
    for &arm in arms {
        let opts = PolicyOptions {
            lora: Some(LoraConfig { rank, alpha: 2.0 * rank as f32, ..LoraConfig::default() }),
            ..PolicyOptions::default()
        };
        let policy = Policy::load(Path::new(&frognano_model::load::resolve_path(model)?), &opts)?;
        let env = SweEnv::new(arm, train.clone(), chat.clone(), env_opts.clone())?;
        let curriculum = match arm {
            "frontier" => {
                let mut c = Curriculum::frontier(FrontierConfig { batch: b, ..FrontierConfig::default() });
                c.add_tasks(&env.task_ids());
                for (id, o) in &calib.per_task {
                    c.record(id, o, 0);
                }
                c
            }
            _ => Curriculum::uniform(),
        };
        let cfg = TrainConfig {
            steps,
            tasks_per_step: b,
            group_size: g,
            seed: 1,
            parallel_rollouts: parallel,
            optim: AdamWConfig { lr: env_num("LR", 1e-4), ..AdamWConfig::default() },
            save_every: steps,
            ..TrainConfig::default()
        };
        let t = Instant::now();
        let mut trainer = Trainer::open(policy, Box::new(env), curriculum, cfg, rollout.clone(), &out.join(arm))?;
        let (mut reward, mut tokens, mut rollout_s, mut train_s, mut usable) = (Vec::new(), 0, 0.0, 0.0, 0);
        trainer.run(|m| {
            eprintln!("[{arm}] {}", m.summary());
            reward.push((m.reward_mean * 100.0).round() / 100.0);
            tokens += m.sampled_tokens;
            rollout_s += m.rollout_s;
            train_s += m.train_s;
            usable += m.usable_groups;
        })?;
        let wall = t.elapsed().as_secs_f64();
        let after_model: Arc<dyn CausalLm> = Arc::from(trainer.policy().inference_model()?);
        let after = sweep(
            &on_scheduler(after_model)?,
            &held_env,
            attempts,
            parallel,
            &rollout,
            &format!("held-out-{arm}"),
            &out,
            &chat,
        )?;
        rows.push((arm, after.cell(), reward, tokens, usable, rollout_s, train_s, wall));
    }
    let mut table = String::new();
    table.push_str(&format!(
        "Base model on the training tasks: {} ({band}/{} tasks in the band 0 < p̂ < 1); held out before training: {}.\n\n",
        calib.cell(),
        calib.per_task.len(),
        before.cell()
    ));
    table.push_str("| arm | held-out solved after | training reward per step | rollout tokens | usable groups | rollout tok/s | train s | wall |\n");
    table.push_str("|---|---|---|---:|---:|---:|---:|---:|\n");
    for (arm, after, reward, tokens, usable, rollout_s, train_s, wall) in rows {
        table.push_str(&format!(
            "| {arm} | {after} | {reward:?} | {tokens} | {usable}/{} | {:.1} | {train_s:.0} | {wall:.0} s |\n",
            steps as usize * b,
            tokens as f64 / f64::max(rollout_s, 1e-9)
        ));
    }
    print!("{table}");
    std::fs::write(out.join("table.md"), &table)?;
    Ok(())
}
