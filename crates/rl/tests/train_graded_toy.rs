//! The training loop learns on the graded toy (issue 22, CI size): from a shared warm start,
//! the frontier arm's held-out expected solve rate rises by a stated margin within a small
//! rollout-token budget, so a broken gradient cannot land. Dynamic sampling draws extra
//! groups and trains on at most B, and a finished run folder is read back, not retrained.

use frognano_rl::experiment::{run_arm, warm_start, Arm, ExperimentConfig};
use frognano_rl::graded_toy::GradedConfig;
use frognano_rl::metrics;

/// Levels 1..=3, 90 tasks (72 to train on, 18 held out), B = 8, G = 8, 4,000 rollout
/// tokens: well under a minute in a debug test build.
fn ci_config() -> ExperimentConfig {
    ExperimentConfig {
        tasks: GradedConfig { max_level: 3, tasks_per_level: 30, held_out_every: 5, seed: 7 },
        tasks_per_step: 8,
        group_size: 8,
        token_budget: 4_000,
        save_every: 5,
        ..ExperimentConfig::default()
    }
}

/// The rise the frontier arm must show on the held-out tasks (absolute solve rate).
const MARGIN: f64 = 0.10;

#[test]
fn frontier_training_raises_the_held_out_solve_rate() {
    let cfg = ci_config();
    let split = cfg.tasks.split().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let warm = warm_start(&cfg, &split, dir.path()).unwrap();
    let run = dir.path().join("frontier");
    let points = run_arm(&cfg, Arm::Frontier, 1, &warm, &split, &run, |_| {}).unwrap();
    let (start, end) = (&points[0], points.last().unwrap());
    let curve: Vec<String> = points.iter().map(|p| format!("{}:{:.3}", p.tokens, p.held_out)).collect();
    eprintln!("held-out solve rate by rollout tokens: {}", curve.join(" "));
    eprintln!("per level at start {:?}, at end {:?}", start.per_level, end.per_level);
    // The warm start leaves room: some tasks easy, the hardest level far from solved.
    assert!(start.held_out > 0.02 && start.held_out < 0.7, "warm start held-out {:.3}", start.held_out);
    let hardest = start.per_level.last().unwrap().1;
    assert!(hardest < start.per_level[0].1, "level 3 should start harder than level 1: {:?}", start.per_level);
    assert!(end.tokens >= cfg.token_budget, "the run stopped at {} tokens", end.tokens);
    assert!(
        end.held_out >= start.held_out + MARGIN,
        "held-out solve rate did not rise by {MARGIN}: {:.3} -> {:.3}",
        start.held_out,
        end.held_out
    );

    // Finished: opening the folder again reads the curve back without training.
    let again = run_arm(&cfg, Arm::Frontier, 1, &warm, &split, &run, |_| panic!("no new point expected")).unwrap();
    assert_eq!(again.len(), points.len());
    for (a, p) in again.iter().zip(&points) {
        // JSON keeps the values to the last bit or one ulp off.
        assert!(a.step == p.step && a.tokens == p.tokens && (a.held_out - p.held_out).abs() < 1e-12, "{a:?} vs {p:?}");
    }
    // A larger budget continues the run from its last checkpoint: same curve so far, more after.
    let longer = ExperimentConfig { token_budget: cfg.token_budget + 400, ..cfg.clone() };
    let more = run_arm(&longer, Arm::Frontier, 1, &warm, &split, &run, |_| {}).unwrap();
    assert!(more.len() > points.len() && more.last().unwrap().tokens >= longer.token_budget);
    assert_eq!(more[points.len() - 1].step, points.last().unwrap().step);
    // Other RL settings share the warm start; other warm-start settings are refused, naming the file.
    assert_eq!(warm_start(&ExperimentConfig { lr: 1.0, ..cfg.clone() }, &split, dir.path()).unwrap(), warm);
    let other = ExperimentConfig { warm_lr: 1.0, ..cfg.clone() };
    let err = warm_start(&other, &split, dir.path()).unwrap_err().to_string();
    assert!(err.contains("warm-start.json") && err.contains("other warm-start settings"), "{err}");
}

#[test]
fn dynamic_sampling_refills_and_trains_on_at_most_b_groups() {
    let cfg = ExperimentConfig { token_budget: 600, ..ci_config() };
    let split = cfg.tasks.split().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let warm = warm_start(&cfg, &split, dir.path()).unwrap();
    let run = dir.path().join("ds");
    let points = run_arm(&cfg, Arm::DynamicSampling, 2, &warm, &split, &run, |_| {}).unwrap();
    let steps = metrics::read(&run.join("metrics.jsonl")).unwrap();
    assert_eq!(steps.len() as u64, points.last().unwrap().step);
    let b = cfg.tasks_per_step;
    for m in &steps {
        assert!(m.usable_groups <= b, "step {} trained on {} groups", m.step, m.usable_groups);
        assert!(m.groups >= b && m.groups <= b * (1 + cfg.dynamic_sampling_rounds), "step {}: {}", m.step, m.groups);
        assert_eq!(m.attempts, m.groups * cfg.group_size, "every sampled group is counted");
    }
    // Some step had all-equal groups and drew more (the warm start fails most level-3 tasks).
    assert!(
        steps.iter().any(|m| m.groups > b),
        "no step refilled: {:?}",
        steps.iter().map(|m| m.groups).collect::<Vec<_>>()
    );
    // The budget counts the extra rounds' tokens too.
    let sampled: usize = steps.iter().map(|m| m.sampled_tokens).sum();
    assert_eq!(points.last().unwrap().tokens, sampled);
}
