//! `frognano train`: the flags, turned into `frognano_rl::train::TrainJob`; the work and its
//! errors are the library's.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use frognano_rl::env::{RolloutConfig, TaskHarness};
use frognano_rl::loss::{self, AdvantageConfig, LossConfig};
use frognano_rl::optim::AdamWConfig;
use frognano_rl::policy::LoraConfig;
use frognano_rl::train::{default_lr, GradientBackend, TrainJob, TrainTarget};
use frognano_rl::trainer::{self, TrainConfig};
use frognano_sandbox::Isolation;
use frognano_swe::localization::HintLevel;

use crate::progress::Bar;

/// Defines a flag enum mirroring a library enum (clap stays out of the libraries): the same
/// variants, so the same value names, with the help texts the flags show.
macro_rules! flag_enum {
    ($(#[$meta:meta])* $name:ident => $lib:path { $($(#[$vmeta:meta])* $variant:ident),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl From<$name> for $lib {
            fn from(v: $name) -> Self {
                use $lib as Lib;
                match v {
                    $($name::$variant => Lib::$variant),+
                }
            }
        }
    };
}

flag_enum! {
    /// Which tasks to sample.
    CurriculumChoice => frognano_rl::train::CurriculumChoice {
        /// By learnability p̂(1−p̂), with new-task and staleness shares (docs/synthesis.md §10.1).
        Frontier,
        /// Uniformly (the baseline to compare the frontier against).
        Uniform,
    }
}

flag_enum! {
    /// How rewards become advantages within a group.
    AdvantageEstimator => loss::AdvantageEstimator {
        /// Leave-one-out (RLOO / LOOP): `A_j = r_j − mean_{k≠j} r_k`.
        Loo,
        /// Group mean baseline (GRPO): `A_j = r_j − mean(r)`, divided by the group std when
        /// `norm_by_std` is set.
        Grpo,
    }
}

flag_enum! {
    /// How per-token losses are reduced over a mini-batch (docs/rl.md §2, "Aggregation").
    Aggregation => loss::Aggregation {
        /// Σ m·ℓ / Σ m over the whole mini-batch (DAPO).
        TokenMean,
        /// Mean over sequences of each sequence's token mean (original GRPO; length-biased).
        SequenceMean,
        /// Σ m·ℓ / (N · L_max) with a constant `L_max` (Dr. GRPO).
        SeqMeanTokenSumNorm,
        /// Mean over groups of each group's token mean: every task weighs the same.
        PromptMean,
    }
}

flag_enum! {
    /// Which policy-gradient objective.
    PolicyLoss => loss::PolicyLoss {
        /// PPO-style clipped ratio with asymmetric clipping (and optional dual clip).
        Ppo,
        /// Plain importance sampling `−ρ·A` (what a server without clipping offers).
        ImportanceSampling,
    }
}

flag_enum! {
    /// [`trainer::SaveFormat`] in the config file.
    SaveFormatConfig => trainer::SaveFormatConfig {
        /// Full HF checkpoint with LoRA merged in.
        Merged,
        /// PEFT adapter only (LoRA runs).
        Adapter,
    }
}

/// Where gradients are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TrainerChoice {
    /// In this process, through FrogNano's own model code (candle autograd).
    Local,
    /// On a Tinker-compatible server (SkyRL `skyrl.tinker.api`), LoRA only; see docs/train.md.
    Tinker,
}

/// `frognano train` arguments.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// The policy to train: a checkpoint folder (llama, qwen2, qwen3 or qwen3_5 safetensors) or a
    /// llama, mistral, qwen2 or qwen3 GGUF file (dequantized to f32).
    #[arg(long, required_unless_present_any = ["toy", "plot"])]
    pub model: Option<String>,
    /// Train a random-init tiny model on the built-in toy environment (a one-token bug fix
    /// with a verifiable reward): a quick look at the whole loop.
    #[arg(long, conflicts_with_all = ["model", "tasks", "synth_repo"])]
    pub toy: bool,
    /// Redraw `metrics.svg` of the run folder given and exit.
    #[arg(long, value_name = "RUN_DIR", conflicts_with_all = ["model", "toy"])]
    pub plot: Option<PathBuf>,
    /// Tasks: SWE-bench JSONL/JSON, a `frognano synth --out` folder, or a Harbor dataset.
    #[arg(long, required_unless_present_any = ["toy", "plot", "synth_repo"])]
    pub tasks: Option<PathBuf>,
    /// Grow the pool by synthesizing tasks from this git repository when the learnability
    /// band runs dry (written under `--out`/synth unless `--tasks` names a synth folder).
    #[arg(long)]
    pub synth_repo: Option<PathBuf>,
    /// One clone per repository, for tasks without `repo_path`.
    #[arg(long)]
    pub repos: Option<PathBuf>,
    /// Run folder: metrics, plot, rollouts, checkpoints. An existing run resumes.
    #[arg(long, default_value = "frognano-train")]
    pub out: PathBuf,
    /// Training steps.
    #[arg(long, default_value_t = 100)]
    pub steps: u64,
    /// Tasks per step (B).
    #[arg(long, default_value_t = 8)]
    pub tasks_per_step: usize,
    /// Attempts per task (G).
    #[arg(long, default_value_t = 8)]
    pub group_size: usize,
    /// Optimizer steps per rollout batch.
    #[arg(long, default_value_t = 1)]
    pub mini_batches: usize,
    /// Task sampling.
    #[arg(long, value_enum, default_value_t = CurriculumChoice::Frontier)]
    pub curriculum: CurriculumChoice,
    /// Learning rate (default 1e-6 for full fine-tuning, 1e-4 with LoRA, 1e-2 for --toy).
    #[arg(long)]
    pub lr: Option<f64>,
    /// AdamW β2.
    #[arg(long, default_value_t = 0.999)]
    pub beta2: f64,
    /// Decoupled weight decay.
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// Clip the global gradient norm (0 = off).
    #[arg(long, default_value_t = 1.0)]
    pub max_grad_norm: f64,
    /// Train LoRA adapters of this rank on the attention and MLP projections instead of
    /// every weight.
    #[arg(long)]
    pub lora_rank: Option<usize>,
    /// LoRA alpha (the update is scaled by alpha / rank).
    #[arg(long, default_value_t = 32.0)]
    pub lora_alpha: f32,
    /// Keep the weights in bf16 (computation stays f32).
    #[arg(long)]
    pub bf16: bool,
    /// Advantage estimator.
    #[arg(long, value_enum, default_value_t = AdvantageEstimator::Loo)]
    pub advantage: AdvantageEstimator,
    /// Divide advantages by the group's reward std.
    #[arg(long)]
    pub norm_by_std: bool,
    /// Policy loss.
    #[arg(long, value_enum, default_value_t = PolicyLoss::Ppo)]
    pub loss: PolicyLoss,
    /// ε_low of the clipped ratio.
    #[arg(long, default_value_t = 0.2)]
    pub clip_low: f32,
    /// ε_high of the clipped ratio (clip-higher).
    #[arg(long, default_value_t = 0.28)]
    pub clip_high: f32,
    /// Dual-clip constant c for negative advantages (off by default).
    #[arg(long)]
    pub dual_clip: Option<f32>,
    /// Truncated importance weighting against sampler/trainer numeric mismatch: weight each
    /// token by min(π_trainer/π_sampler, C) and take the ratio against the trainer (off by default).
    #[arg(long, value_name = "C")]
    pub tis_cap: Option<f32>,
    /// Length normalisation of the loss.
    #[arg(long, value_enum, default_value_t = Aggregation::TokenMean)]
    pub aggregation: Aggregation,
    /// L_max of `seq-mean-token-sum-norm`.
    #[arg(long, default_value_t = 40_768)]
    pub max_len: usize,
    /// Sampling temperature of rollouts (1.0: the recorded logprobs are the policy's own).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Agent steps per attempt at most.
    #[arg(long, default_value_t = 30)]
    pub max_steps: usize,
    /// Tokens per assistant turn at most.
    #[arg(long, default_value_t = 1024)]
    pub max_tokens_per_turn: usize,
    /// Context limit of an attempt, in tokens.
    #[arg(long, default_value_t = 16_384)]
    pub max_context: usize,
    /// Wall-clock limit of one attempt, in seconds.
    #[arg(long, default_value_t = 600)]
    pub attempt_timeout: u64,
    /// Partial credit: the share of FAIL_TO_PASS tests passing instead of 0/1.
    #[arg(long)]
    pub partial_credit: bool,
    /// No thinking block in the generation prompt.
    #[arg(long)]
    pub no_think: bool,
    /// Roll out in the harness `frognano solve` gives a small model instead of the Leaf
    /// harness FrogNano is trained in: tool calls sampled under a grammar of the tools,
    /// notices when a reply has no tool call before any change, is cut by the token limit,
    /// repeats the last calls, or is near the step limit, and Edit/Write refusing a file the
    /// attempt has not Read (no retries of malformed replies: every sampled token stays in the
    /// training sequence).
    #[arg(long)]
    pub small_model_harness: bool,
    /// Append where the fix goes to every issue text, read from the task's gold patch:
    /// `file`, `function` (and file), `line` (and function and file). A difficulty knob over
    /// the same tasks, for a policy that cannot yet find the faulty function by itself.
    #[arg(long, value_name = "LEVEL", default_value = "none", value_parser = parse_hint_level)]
    pub hints: HintLevel,
    /// Run the agent's commands and the tests without the bubblewrap sandbox.
    #[arg(long)]
    pub no_sandbox: bool,
    /// Save a checkpoint every N steps.
    #[arg(long, default_value_t = 10)]
    pub save_every: u64,
    /// Model format inside checkpoints.
    #[arg(long, value_enum, default_value_t = SaveFormatConfig::Merged)]
    pub save_format: SaveFormatConfig,
    /// Attempts run at once.
    #[arg(long, default_value_t = 1)]
    pub parallel_rollouts: usize,
    /// DAPO dynamic sampling: when fewer than --tasks-per-step groups carry gradient (all-equal
    /// rewards), draw and roll out more tasks, up to ROUNDS extra rounds per step (0 = off).
    #[arg(long, value_name = "ROUNDS", default_value_t = 0)]
    pub dynamic_sampling: usize,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where gradients are computed.
    #[arg(long, value_enum, default_value_t = TrainerChoice::Local)]
    pub trainer: TrainerChoice,
    /// Base URL of the Tinker-compatible server (`--trainer tinker`), e.g. http://head:8000.
    #[arg(long, required_if_eq("trainer", "tinker"))]
    pub trainer_url: Option<String>,
    /// The server's name of the base model (default: `--model` as given).
    #[arg(long)]
    pub base_model: Option<String>,
    /// Threads of the model's work outside the rollout workers, which run their own
    /// `--parallel-rollouts` threads (`-t/--threads`).
    #[command(flatten)]
    pub threads: crate::threads::ThreadArgs,
    /// Each rollout group (the G attempts on one task) as a task on a Ray cluster, its
    /// worker loading the step's policy weights from --out (on a path every node sees).
    #[command(flatten)]
    pub ray: crate::ray::RayArgs,
}

impl TrainArgs {
    /// The job these flags describe.
    pub fn job(&self) -> anyhow::Result<TrainJob> {
        let a = self;
        let lora = a.lora_rank.map(|rank| LoraConfig { rank, alpha: a.lora_alpha, ..LoraConfig::default() });
        let target = if a.toy {
            TrainTarget::Toy
        } else {
            let Some(model) = a.model.clone() else { anyhow::bail!("give --model (the policy to train) or --toy") };
            TrainTarget::Tasks {
                model,
                tasks: a.tasks.clone(),
                synth_repo: a.synth_repo.clone(),
                repos: a.repos.clone(),
                isolation: if a.no_sandbox { Isolation::Unconfined } else { Isolation::Bubblewrap },
                enable_thinking: !a.no_think,
                harness: TaskHarness { small_model: a.small_model_harness, hints: a.hints },
            }
        };
        let train = TrainConfig {
            steps: a.steps,
            tasks_per_step: a.tasks_per_step,
            group_size: a.group_size,
            mini_batches: a.mini_batches,
            seed: a.seed,
            advantage: AdvantageConfig { estimator: a.advantage.into(), norm_by_std: a.norm_by_std },
            loss: LossConfig {
                kind: a.loss.into(),
                clip_low: a.clip_low,
                clip_high: a.clip_high,
                dual_clip: a.dual_clip,
                aggregation: a.aggregation.into(),
                max_len: a.max_len,
                tis_cap: a.tis_cap,
            },
            optim: AdamWConfig {
                lr: a.lr.unwrap_or(default_lr(a.toy, lora.is_some())),
                beta2: a.beta2,
                weight_decay: a.weight_decay,
                max_grad_norm: (a.max_grad_norm > 0.0).then_some(a.max_grad_norm),
                ..AdamWConfig::default()
            },
            save_every: a.save_every,
            save_format: a.save_format.into(),
            parallel_rollouts: a.parallel_rollouts,
            dynamic_sampling_rounds: a.dynamic_sampling,
        };
        let rollout = RolloutConfig {
            temperature: a.temperature,
            max_tokens_per_turn: a.max_tokens_per_turn,
            max_steps: a.max_steps,
            max_context_tokens: a.max_context,
            max_time: Some(Duration::from_secs(a.attempt_timeout)),
            partial_credit: a.partial_credit,
        };
        let backend = match a.trainer {
            TrainerChoice::Local => GradientBackend::Local,
            TrainerChoice::Tinker => GradientBackend::Tinker {
                url: a.trainer_url.clone().ok_or_else(|| anyhow::anyhow!("--trainer tinker needs --trainer-url"))?,
                base_model: a.base_model.clone(),
            },
        };
        Ok(TrainJob {
            target,
            out: a.out.clone(),
            train,
            rollout,
            curriculum: a.curriculum.into(),
            lora,
            bf16: a.bf16,
            backend,
            ray: a.ray.config()?,
        })
    }
}

/// Runs `frognano train`.
pub fn run(a: TrainArgs) -> anyhow::Result<()> {
    if let Some(run) = &a.plot {
        let svg = run.join("metrics.svg");
        frognano_rl::metrics::write_plot(
            &run.join("metrics.jsonl"),
            &svg,
            &format!("frognano train — {}", run.display()),
        )?;
        println!("{}", svg.display());
        return Ok(());
    }
    let job = a.job()?;
    job.validate()?;
    let done = frognano_rl::train::run_training(&job, &Bar::steps())?;
    eprintln!(
        "done: {} steps; metrics {}, plot {}, checkpoints {}",
        done.steps,
        done.out.join("metrics.jsonl").display(),
        done.out.join("metrics.svg").display(),
        done.out.join("checkpoints").display()
    );
    Ok(())
}

/// `--hints`: a [`HintLevel`] by name.
pub fn parse_hint_level(s: &str) -> Result<HintLevel, String> {
    s.parse()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Top {
        #[command(flatten)]
        train: TrainArgs,
    }

    #[test]
    fn flags_become_the_job_with_the_documented_defaults() {
        <Top as clap::CommandFactory>::command().debug_assert();
        let job = Top::try_parse_from(["x", "--toy"]).unwrap().train.job().unwrap();
        assert_eq!(job.target, TrainTarget::Toy);
        assert_eq!(job.train.optim.lr, 1e-2);
        assert_eq!((job.train.group_size, job.train.tasks_per_step), (8, 8));
        assert_eq!(job.train.loss.aggregation, loss::Aggregation::TokenMean);
        let t = Top::try_parse_from([
            "x",
            "--model",
            "m",
            "--tasks",
            "t",
            "--lora-rank",
            "8",
            "--loss",
            "importance-sampling",
        ])
        .unwrap();
        let job = t.train.job().unwrap();
        assert_eq!(job.train.optim.lr, 1e-4);
        assert_eq!(job.train.loss.kind, loss::PolicyLoss::ImportanceSampling);
        let t = Top::try_parse_from(["x", "--toy", "--group-size", "1"]).unwrap();
        let e = t.train.job().unwrap().validate().unwrap_err().to_string();
        assert_eq!(e, "--group-size must be at least 2 (advantages compare attempts), got 1");
        assert!(Top::try_parse_from(["x", "--trainer", "tinker", "--toy"]).is_err(), "--trainer-url is required");
    }

    #[test]
    fn the_harness_flags_reach_the_task_target() {
        let t = Top::try_parse_from(["x", "--model", "m", "--tasks", "t", "--small-model-harness", "--hints", "line"]);
        let TrainTarget::Tasks { harness, .. } = t.unwrap().train.job().unwrap().target else {
            panic!("a task target")
        };
        assert_eq!(harness, TaskHarness { small_model: true, hints: HintLevel::Line });
        let t = Top::try_parse_from(["x", "--model", "m", "--tasks", "t"]).unwrap();
        let TrainTarget::Tasks { harness, .. } = t.train.job().unwrap().target else { panic!("a task target") };
        assert_eq!(harness, TaskHarness::default(), "the Leaf harness, no hints");
        let e = Top::try_parse_from(["x", "--model", "m", "--hints", "lines"]).unwrap_err().to_string();
        assert!(e.contains("unknown hint level \"lines\": expected one of none, file, function, line"), "{e}");
    }
}
