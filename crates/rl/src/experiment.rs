//! The curriculum experiment on the graded toy ([`crate::graded_toy`]): does sampling tasks
//! at the edge of what the policy can do (the frontier curriculum) reach a held-out solve
//! rate with less rollout compute than uniform sampling, or than uniform sampling with DAPO's
//! dynamic sampling (all-equal groups dropped and refilled)?
//!
//! Every arm starts from the same warm-started policy ([`warm_start`]: a few supervised
//! steps on low-level training tasks whose function names use the first synonyms, so some
//! tasks are easy and others impossible at the start), trains with the real
//! [`Trainer`] on the training split until it has sampled the same number of rollout tokens,
//! and is measured on the held-out split after every step with [`expected_solve_rate`].
//! [`run_arm`] writes a resumable run folder; [`summarize`] turns the runs of several seeds
//! into curves (mean and spread at equal tokens), the compute ratio, a Markdown table and an
//! SVG plot.

use std::path::{Path, PathBuf};

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use crate::curriculum::Curriculum;
use crate::env::RolloutConfig;
use crate::graded_toy::{expected_solve_rate, GradedConfig, GradedSplit, GradedTask, GradedToyEnv, VOCAB_SIZE};
use crate::metrics::{self, Band, BandPanel};
use crate::optim::{AdamW, AdamWConfig, GradSum};
use crate::policy::{LlamaSpec, Policy, PolicyOptions};
use crate::trainer::{TrainConfig, Trainer};
use frognano_synth::calibrate::FrontierConfig;

/// One arm of the comparison. All arms share the policy, tasks, batch, group size, optimizer
/// and token budget; they differ only in which tasks a step trains on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arm {
    /// `--curriculum frontier`: tasks drawn by p̂(1−p̂).
    Frontier,
    /// `--curriculum uniform`.
    Uniform,
    /// Uniform, with DAPO dynamic sampling (`--dynamic-sampling`).
    DynamicSampling,
}

impl Arm {
    /// Every arm, in report order.
    pub const ALL: [Arm; 3] = [Arm::Frontier, Arm::Uniform, Arm::DynamicSampling];

    /// Short name (run folder and table row).
    pub fn name(self) -> &'static str {
        match self {
            Arm::Frontier => "frontier",
            Arm::Uniform => "uniform",
            Arm::DynamicSampling => "uniform+dynamic-sampling",
        }
    }

    fn color(self) -> &'static str {
        match self {
            Arm::Frontier => "#d62728",
            Arm::Uniform => "#1f77b4",
            Arm::DynamicSampling => "#2ca02c",
        }
    }
}

/// Everything the experiment's runs share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExperimentConfig {
    /// The task family and its split.
    pub tasks: GradedConfig,
    /// Seed of the tiny model's random init (the same for every arm and seed).
    pub model_seed: u64,
    /// Supervised warm-start steps (each one pass over the warm-start tasks).
    pub warm_steps: usize,
    /// Warm-start learning rate.
    pub warm_lr: f64,
    /// The warm start sees training tasks of levels 1..=this …
    pub warm_max_level: usize,
    /// … whose functions' names are all among the first this-many synonyms of their
    /// operators; the other names start unknown.
    pub warm_synonyms: usize,
    /// Tasks per step (B).
    pub tasks_per_step: usize,
    /// Attempts per task (G).
    pub group_size: usize,
    /// RL learning rate.
    pub lr: f64,
    /// Rollout tokens (tokens the policy sampled) each run may spend.
    pub token_budget: usize,
    /// The frontier arm's controller (its `batch` is set to `tasks_per_step`).
    pub frontier: FrontierConfig,
    /// Extra rounds per step of the dynamic-sampling arm.
    pub dynamic_sampling_rounds: usize,
    /// Attempts run at once (they share the engine's batched decode steps).
    pub parallel_rollouts: usize,
    /// Checkpoint every this many steps (a killed run resumes from the last one).
    pub save_every: u64,
}

impl Default for ExperimentConfig {
    fn default() -> Self {
        ExperimentConfig {
            tasks: GradedConfig::default(),
            model_seed: 3,
            warm_steps: 14,
            warm_lr: 1e-2,
            warm_max_level: 2,
            warm_synonyms: 2,
            tasks_per_step: 8,
            group_size: 8,
            lr: 2e-3,
            token_budget: 20_000,
            frontier: FrontierConfig::default(),
            dynamic_sampling_rounds: 3,
            parallel_rollouts: 1,
            save_every: 10,
        }
    }
}

impl ExperimentConfig {
    fn spec(&self) -> LlamaSpec {
        LlamaSpec::tiny(VOCAB_SIZE)
    }

    /// The random-init policy every arm's warm start begins from.
    fn fresh_policy(&self) -> anyhow::Result<Policy> {
        Policy::random_llama(&self.spec(), &PolicyOptions { seed: self.model_seed, ..PolicyOptions::default() })
    }
}

/// What the warm start depends on (the tasks, the model's init and the warm-start settings):
/// a run with another RL setting or budget may share it, one with another of these may not.
fn warm_start_key(cfg: &ExperimentConfig) -> serde_json::Value {
    serde_json::json!({
        "tasks": cfg.tasks,
        "model_seed": cfg.model_seed,
        "warm_steps": cfg.warm_steps,
        "warm_lr": cfg.warm_lr,
        "warm_max_level": cfg.warm_max_level,
        "warm_synonyms": cfg.warm_synonyms,
    })
}

/// The warm-started policy's weights, computed once and kept in `dir` (`warm-start.safetensors`,
/// with the settings it was made with in `warm-start.json`); a later call with the same
/// warm-start settings loads them, with other ones it refuses rather than mix starting points.
pub fn warm_start(cfg: &ExperimentConfig, split: &GradedSplit, dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    let (weights, meta) = (dir.join("warm-start.safetensors"), dir.join("warm-start.json"));
    let key = warm_start_key(cfg);
    if weights.is_file() && meta.is_file() {
        let text =
            std::fs::read_to_string(&meta).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", meta.display()))?;
        let saved: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: not JSON: {e}", meta.display()))?;
        anyhow::ensure!(
            saved == key,
            "{} was made with other warm-start settings ({saved}, now {key}); remove {} to start over",
            meta.display(),
            dir.display()
        );
        return Ok(weights);
    }
    let policy = cfg.fresh_policy()?;
    let data: Vec<&GradedTask> = split
        .train
        .iter()
        .filter(|t| t.level <= cfg.warm_max_level && t.sites.iter().all(|s| s.synonym < cfg.warm_synonyms))
        .collect();
    anyhow::ensure!(!data.is_empty(), "no training task qualifies for the warm start");
    let params = policy.params();
    let mut opt = AdamW::new(AdamWConfig { lr: cfg.warm_lr, ..AdamWConfig::default() }, &params)?;
    for _ in 0..cfg.warm_steps {
        let mut acc = GradSum::new(&params);
        for t in &data {
            let (tokens, at) = t.transcript(&t.solution());
            let lp = policy.token_logprobs(&tokens[..tokens.len() - 1], &tokens[1..])?;
            // Cross-entropy of the answer tokens, averaged over the batch's answers.
            let answers: usize = data.iter().map(|t| t.level).sum();
            let idx = Tensor::new(at.iter().map(|&i| (i - 1) as u32).collect::<Vec<_>>(), lp.device())?;
            let loss = (lp.index_select(&idx, 0)?.sum_all()?.neg()? / answers as f64)?;
            let grads = loss.backward()?;
            acc.add(&grads)?;
        }
        let grads = acc.into_grads()?;
        opt.step(&params, &grads)?;
    }
    policy.save_params(&weights)?;
    std::fs::write(&meta, serde_json::to_string_pretty(&key)?)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", meta.display()))?;
    Ok(weights)
}

/// The policy at the warm start.
pub fn load_warm(cfg: &ExperimentConfig, weights: &Path) -> anyhow::Result<Policy> {
    let mut policy = cfg.fresh_policy()?;
    policy.load_params(weights)?;
    Ok(policy)
}

/// One measurement of a run: after `step` steps and `tokens` rollout tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    /// Steps done.
    pub step: u64,
    /// Rollout tokens spent so far (every sampled token, dropped groups included).
    pub tokens: usize,
    /// Held-out expected solve rate.
    pub held_out: f64,
    /// Held-out expected solve rate per level.
    pub per_level: Vec<(usize, f64)>,
    /// This step's training solve rate.
    pub train_solve_rate: f64,
    /// This step's share of sampled groups that carried gradient.
    pub usable_fraction: f64,
    /// Mean level of this step's attempts (sampled tokens per attempt).
    pub mean_level: f64,
}

fn read_points(path: &Path) -> anyhow::Result<Vec<CurvePoint>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| anyhow::anyhow!("{}:{}: not a curve point: {e}", path.display(), i + 1))
        })
        .collect()
}

fn write_points(path: &Path, points: &[CurvePoint]) -> anyhow::Result<()> {
    let mut text = String::new();
    for p in points {
        text.push_str(&serde_json::to_string(p)?);
        text.push('\n');
    }
    std::fs::write(path, text).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

/// Trains one arm with training seed `seed` from the warm start into `out` until
/// `cfg.token_budget` rollout tokens are spent, measuring the held-out solve rate before the
/// first step and after every step (`out/heldout.jsonl`, one [`CurvePoint`] per line).
/// A folder with a checkpoint resumes from it; a finished one is read back. `on_point` sees
/// every new point.
pub fn run_arm(
    cfg: &ExperimentConfig,
    arm: Arm,
    seed: u64,
    warm: &Path,
    split: &GradedSplit,
    out: &Path,
    mut on_point: impl FnMut(&CurvePoint),
) -> anyhow::Result<Vec<CurvePoint>> {
    let curriculum = match arm {
        Arm::Frontier => Curriculum::frontier(FrontierConfig { batch: cfg.tasks_per_step, ..cfg.frontier.clone() }),
        Arm::Uniform | Arm::DynamicSampling => Curriculum::uniform(),
    };
    let train = TrainConfig {
        // The run ends on its token budget, not a step count.
        steps: u64::MAX,
        tasks_per_step: cfg.tasks_per_step,
        group_size: cfg.group_size,
        seed,
        optim: AdamWConfig { lr: cfg.lr, ..AdamWConfig::default() },
        save_every: cfg.save_every,
        parallel_rollouts: cfg.parallel_rollouts,
        dynamic_sampling_rounds: if arm == Arm::DynamicSampling { cfg.dynamic_sampling_rounds } else { 0 },
        ..TrainConfig::default()
    };
    let env = GradedToyEnv::new(arm.name(), split.train.clone());
    let rollout = RolloutConfig { temperature: 1.0, ..RolloutConfig::default() };
    let mut trainer = Trainer::open(load_warm(cfg, warm)?, Box::new(env), curriculum, train, rollout, out)?;
    let log = out.join("heldout.jsonl");
    let mut points: Vec<CurvePoint> =
        read_points(&log)?.into_iter().filter(|p| p.step <= trainer.step_number()).collect();
    if points.last().map(|p| p.step) != Some(trainer.step_number()) {
        anyhow::ensure!(
            trainer.step_number() == 0,
            "{}: no held-out point for checkpoint step {}; remove the folder to start over",
            log.display(),
            trainer.step_number()
        );
        let r = expected_solve_rate(trainer.policy(), &split.held_out)?;
        points = vec![CurvePoint { held_out: r.mean, per_level: r.per_level, ..CurvePoint::default() }];
        on_point(&points[0]);
    }
    write_points(&log, &points)?;
    let mut tokens = points.last().map_or(0, |p| p.tokens);
    while tokens < cfg.token_budget {
        let m = trainer.step()?;
        tokens += m.sampled_tokens;
        let r = expected_solve_rate(trainer.policy(), &split.held_out)?;
        let p = CurvePoint {
            step: m.step,
            tokens,
            held_out: r.mean,
            per_level: r.per_level,
            train_solve_rate: m.solve_rate,
            usable_fraction: m.usable_fraction,
            mean_level: m.sampled_tokens as f64 / m.attempts.max(1) as f64,
        };
        on_point(&p);
        points.push(p);
        write_points(&log, &points)?;
    }
    if crate::trainer::latest_checkpoint(out)?
        .is_none_or(|c| !c.ends_with(format!("step-{:06}", trainer.step_number())))
    {
        trainer.save_checkpoint()?;
    }
    Ok(points)
}

/// The value of a run's curve at `tokens`: the last measurement at or before it (the policy
/// only changes at steps).
pub fn value_at(points: &[CurvePoint], tokens: f64, f: impl Fn(&CurvePoint) -> f64) -> f64 {
    points.iter().take_while(|p| p.tokens as f64 <= tokens).last().map_or(f64::NAN, f)
}

/// Mean and sample standard deviation (0 for one value).
pub fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 { xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

/// One arm's runs (one per seed).
pub struct ArmRuns {
    /// The arm.
    pub arm: Arm,
    /// Curve of each seed.
    pub runs: Vec<Vec<CurvePoint>>,
}

/// Curves on a common token grid, and the figures of the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The token grid.
    pub grid: Vec<f64>,
    /// Per arm: name, mean and std of the held-out solve rate over seeds at each grid point.
    pub curves: Vec<(String, Vec<f64>, Vec<f64>)>,
    /// The Markdown report.
    pub table: String,
    /// The SVG plot.
    pub svg: String,
}

/// First grid point where `curve` reaches `target`.
fn tokens_to_reach(grid: &[f64], curve: &[f64], target: f64) -> Option<f64> {
    grid.iter().zip(curve).find(|(_, v)| **v >= target).map(|(t, _)| *t)
}

/// Aggregates the arms over seeds at equal rollout tokens: held-out solve rate (mean ± std),
/// the tokens each arm needs to reach uniform's final mean, the ratio of gains over the start
/// at equal compute, and the plot.
pub fn summarize(cfg: &ExperimentConfig, arms: &[ArmRuns], title: &str) -> Summary {
    let budget = cfg.token_budget as f64;
    let n = 100;
    let grid: Vec<f64> = (0..=n).map(|i| budget * i as f64 / n as f64).collect();
    let at = |runs: &[Vec<CurvePoint>], t: f64, f: &dyn Fn(&CurvePoint) -> f64| {
        mean_std(&runs.iter().map(|r| value_at(r, t, f)).collect::<Vec<_>>())
    };
    let held = |p: &CurvePoint| p.held_out;
    let mut curves = Vec::new();
    for a in arms {
        let (m, s): (Vec<f64>, Vec<f64>) = grid.iter().map(|&t| at(&a.runs, t, &held)).unzip();
        curves.push((a.arm.name().to_string(), m, s));
    }
    let start = curves.first().map_or(0.0, |c| c.1[0]);
    let uniform = arms.iter().position(|a| a.arm == Arm::Uniform);
    let uniform_final = uniform.map(|u| curves[u].1[n]);

    let mut t = String::new();
    t.push_str(&format!(
        "Held-out expected solve rate (temperature 1) at equal rollout tokens, mean ± std over {} seeds; start {:.3}.\n\n",
        arms.first().map_or(0, |a| a.runs.len()),
        start
    ));
    t.push_str("| arm | 25 % budget | 50 % budget | 100 % budget | gain at 100 % | tokens to reach uniform's final | compute ratio vs uniform | steps | usable groups | mean level sampled |\n");
    t.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    for (a, (name, m, s)) in arms.iter().zip(&curves) {
        let cell = |i: usize| format!("{:.3} ± {:.3}", m[i], s[i]);
        let reach = uniform_final.and_then(|u| tokens_to_reach(&grid, m, u - 1e-9));
        let steps = mean_std(&a.runs.iter().map(|r| r.last().map_or(0.0, |p| p.step as f64)).collect::<Vec<_>>()).0;
        let after: Vec<&CurvePoint> = a.runs.iter().flat_map(|r| r.iter().skip(1)).collect();
        let avg = |f: &dyn Fn(&CurvePoint) -> f64| after.iter().map(|p| f(p)).sum::<f64>() / after.len().max(1) as f64;
        t.push_str(&format!(
            "| {name} | {} | {} | {} | {:+.3} | {} | {} | {steps:.0} | {:.0} % | {:.2} |\n",
            cell(n / 4),
            cell(n / 2),
            cell(n),
            m[n] - start,
            reach.map_or("not reached".into(), |r| format!("{r:.0}")),
            reach.map_or("—".into(), |r| format!("{:.2}×", budget / r.max(1.0))),
            100.0 * avg(&|p| p.usable_fraction),
            avg(&|p| p.mean_level),
        ));
    }
    if let Some(u) = uniform {
        t.push_str("\nRatio of held-out gains over the start at equal compute (arm gain / uniform gain):\n\n");
        t.push_str("| arm | 25 % | 50 % | 75 % | 100 % |\n|---|---|---|---|---|\n");
        for (name, m, _) in &curves {
            let r = |i: usize| {
                let ug = curves[u].1[i] - start;
                if ug.abs() < 1e-9 {
                    "—".to_string()
                } else {
                    format!("{:.2}", (m[i] - start) / ug)
                }
            };
            t.push_str(&format!("| {name} | {} | {} | {} | {} |\n", r(n / 4), r(n / 2), r(3 * n / 4), r(n)));
        }
        // Compute to reach what uniform reaches at a quarter, half, three quarters and all of
        // the budget (mean curves): the arm's tokens, and uniform's tokens over the arm's.
        t.push_str("\nRollout tokens to reach uniform's mean held-out rate at 25/50/75/100 % of the budget (compute ratio = uniform's tokens / the arm's):\n\n");
        t.push_str("| arm | 25 % | 50 % | 75 % | 100 % |\n|---|---|---|---|---|\n");
        for (name, m, _) in &curves {
            let cells: Vec<String> = [n / 4, n / 2, 3 * n / 4, n]
                .iter()
                .map(|&i| {
                    let target = curves[u].1[i] - 1e-9;
                    match (tokens_to_reach(&grid, m, target), tokens_to_reach(&grid, &curves[u].1, target)) {
                        (Some(a), Some(b)) => format!("{a:.0} ({:.2}×)", b / a.max(1.0)),
                        _ => "not reached".to_string(),
                    }
                })
                .collect();
            t.push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
        }
        // Per-seed spread of the compute ratio for each arm: tokens each seed needs to reach
        // uniform's final mean.
        if let Some(uf) = uniform_final {
            t.push_str("\nTokens each seed needs to reach uniform's final mean held-out rate:\n\n");
            for a in arms {
                let per: Vec<String> = a
                    .runs
                    .iter()
                    .map(|r| {
                        r.iter()
                            .find(|p| p.held_out >= uf - 1e-9)
                            .map_or("not reached".to_string(), |p| p.tokens.to_string())
                    })
                    .collect();
                t.push_str(&format!("- {}: {}\n", a.arm.name(), per.join(", ")));
            }
        }
    }
    // Per-level held-out rates at the end.
    t.push_str("\nHeld-out expected solve rate per level at the end (mean over seeds):\n\n");
    let levels: Vec<usize> =
        arms.first().and_then(|a| a.runs.first()).map_or(Vec::new(), |r| r[0].per_level.iter().map(|l| l.0).collect());
    t.push_str(&format!(
        "| | {} |\n|---|{}\n",
        levels.iter().map(|l| format!("level {l}")).collect::<Vec<_>>().join(" | "),
        "---|".repeat(levels.len())
    ));
    let row = |label: &str, runs: &[Vec<CurvePoint>], pick: &dyn Fn(&[CurvePoint]) -> &CurvePoint| {
        let cells: Vec<String> = (0..levels.len())
            .map(|li| format!("{:.3}", mean_std(&runs.iter().map(|r| pick(r).per_level[li].1).collect::<Vec<_>>()).0))
            .collect();
        format!("| {label} | {} |\n", cells.join(" | "))
    };
    if let Some(a) = arms.first() {
        t.push_str(&row("start (every arm)", &a.runs, &|r| &r[0]));
    }
    for a in arms {
        t.push_str(&row(a.arm.name(), &a.runs, &|r| r.last().expect("a run has points")));
    }

    let bands = |f: &dyn Fn(&CurvePoint) -> f64| -> Vec<Band> {
        arms.iter()
            .map(|a| {
                let (m, s): (Vec<f64>, Vec<f64>) = grid.iter().map(|&x| at(&a.runs, x, f)).unzip();
                Band {
                    label: a.arm.name().to_string(),
                    color: a.arm.color().to_string(),
                    x: grid.clone(),
                    mean: m,
                    std: s,
                }
            })
            .collect()
    };
    let svg = metrics::bands_svg(
        title,
        "rollout tokens",
        &[
            BandPanel {
                title: "held-out expected solve rate (mean ± std over seeds)".into(),
                y: (0.0, 1.0),
                bands: bands(&held),
            },
            BandPanel {
                title: "share of sampled groups with gradient".into(),
                y: (0.0, 1.0),
                bands: bands(&|p: &CurvePoint| p.usable_fraction),
            },
            BandPanel {
                title: "mean level of the attempted tasks".into(),
                y: (1.0, cfg.tasks.max_level as f64),
                bands: bands(&|p: &CurvePoint| p.mean_level),
            },
        ],
    );
    Summary { grid, curves, table: t, svg }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run whose held-out rate rises linearly to `end` at `reach` tokens, then stays.
    fn run(budget: usize, reach: usize, end: f64) -> Vec<CurvePoint> {
        (0..=budget / 100)
            .map(|i| {
                let tokens = i * 100;
                CurvePoint {
                    step: i as u64,
                    tokens,
                    held_out: 0.1 + (end - 0.1) * (tokens.min(reach) as f64 / reach as f64),
                    per_level: vec![(1, 0.5)],
                    ..CurvePoint::default()
                }
            })
            .collect()
    }

    #[test]
    fn curves_are_read_at_equal_tokens() {
        let pts = run(1000, 1000, 0.6);
        assert_eq!(value_at(&pts, 250.0, |p| p.held_out), pts[2].held_out, "the last point at or before 250");
        assert!(value_at(&pts, -1.0, |p| p.held_out).is_nan());
        assert_eq!(mean_std(&[1.0, 3.0]), (2.0, 2f64.sqrt()));
        assert_eq!(mean_std(&[4.0]), (4.0, 0.0));
    }

    #[test]
    fn summary_reports_the_compute_ratio_to_reach_uniforms_final_rate() {
        let cfg = ExperimentConfig { token_budget: 1000, ..ExperimentConfig::default() };
        // Uniform ends at 0.6 at the full budget; frontier gets there at 600 tokens.
        let arms = [
            ArmRuns { arm: Arm::Frontier, runs: vec![run(1000, 600, 0.7), run(1000, 600, 0.7)] },
            ArmRuns { arm: Arm::Uniform, runs: vec![run(1000, 1000, 0.6), run(1000, 1000, 0.6)] },
        ];
        let s = summarize(&cfg, &arms, "t");
        let frontier = s.table.lines().find(|l| l.starts_with("| frontier | 0.")).unwrap();
        // 0.1 + 0.6·t/600 ≥ 0.6 first at t = 500 on the 10-token grid → 1000/500 = 2×.
        assert!(frontier.contains("| 500 | 2.00× |"), "{frontier}");
        assert!(s.table.contains("- frontier: 500, 500"), "{}", s.table);
        assert_eq!(s.curves.len(), 2);
        assert!(s.svg.contains("<polygon") && s.svg.contains("frontier"));
    }
}
