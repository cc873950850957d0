//! `frognano train`: the command line of the trainer.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::curriculum::Curriculum;
use crate::env::{ChatParts, Environment, RolloutConfig, SweEnv, SweEnvOptions, SynthSource};
use crate::loss::{AdvantageConfig, AdvantageEstimator, Aggregation, LossConfig, PolicyLoss};
use crate::optim::AdamWConfig;
use crate::policy::{LlamaSpec, LoraConfig, Policy, PolicyOptions};
use crate::trainer::{SaveFormatConfig, TrainConfig, Trainer};

/// Which tasks to sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CurriculumChoice {
    /// By learnability p̂(1−p̂), with new-task and staleness shares (task-synthesis.md §10.1).
    Frontier,
    /// Uniformly (the baseline to compare the frontier against).
    Uniform,
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
    /// The policy to train: a checkpoint folder (llama or qwen3_5 safetensors) or a
    /// llama-architecture GGUF file (dequantized to f32).
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
}

/// Runs `frognano train`.
pub fn run_train(a: TrainArgs) -> anyhow::Result<()> {
    if let Some(run) = &a.plot {
        let svg = run.join("metrics.svg");
        crate::metrics::write_plot(&run.join("metrics.jsonl"), &svg, &format!("frognano train — {}", run.display()))?;
        println!("{}", svg.display());
        return Ok(());
    }
    let lora = a.lora_rank.map(|rank| LoraConfig { rank, alpha: a.lora_alpha, ..LoraConfig::default() });
    let opts = PolicyOptions {
        lora: lora.clone(),
        dtype: if a.bf16 { candle_core::DType::BF16 } else { candle_core::DType::F32 },
        seed: a.seed,
    };
    let lr = a.lr.unwrap_or(if a.toy {
        1e-2
    } else if lora.is_some() {
        1e-4
    } else {
        1e-6
    });
    let cfg = TrainConfig {
        steps: a.steps,
        tasks_per_step: a.tasks_per_step,
        group_size: a.group_size,
        mini_batches: a.mini_batches,
        seed: a.seed,
        advantage: AdvantageConfig { estimator: a.advantage, norm_by_std: a.norm_by_std },
        loss: LossConfig {
            kind: a.loss,
            clip_low: a.clip_low,
            clip_high: a.clip_high,
            dual_clip: a.dual_clip,
            aggregation: a.aggregation,
            max_len: a.max_len,
            tis_cap: a.tis_cap,
        },
        optim: AdamWConfig {
            lr,
            beta2: a.beta2,
            weight_decay: a.weight_decay,
            max_grad_norm: (a.max_grad_norm > 0.0).then_some(a.max_grad_norm),
            ..AdamWConfig::default()
        },
        save_every: a.save_every,
        save_format: a.save_format,
        parallel_rollouts: a.parallel_rollouts,
    };
    anyhow::ensure!(
        cfg.group_size >= 2,
        "--group-size must be at least 2 (advantages compare attempts), got {}",
        cfg.group_size
    );
    anyhow::ensure!(cfg.tasks_per_step >= 1, "--tasks-per-step must be at least 1");
    anyhow::ensure!(
        a.save_format == SaveFormatConfig::Merged || lora.is_some(),
        "--save-format adapter needs --lora-rank (a full fine-tune has no adapter)"
    );
    let rollout = RolloutConfig {
        temperature: a.temperature,
        max_tokens_per_turn: a.max_tokens_per_turn,
        max_steps: a.max_steps,
        max_context_tokens: a.max_context,
        max_time: Some(Duration::from_secs(a.attempt_timeout)),
        partial_credit: a.partial_credit,
    };
    let frontier =
        |batch| Curriculum::frontier(frognano_synth::calibrate::FrontierConfig { batch, ..Default::default() });
    let curriculum = match a.curriculum {
        CurriculumChoice::Frontier => frontier(a.tasks_per_step),
        CurriculumChoice::Uniform => Curriculum::uniform(),
    };

    let (policy, env): (Policy, Box<dyn Environment>) = if a.toy {
        let spec = LlamaSpec::tiny(crate::toy::VOCAB.len());
        (Policy::random_llama(&spec, &opts)?, Box::new(crate::toy::ToyEnv))
    } else {
        let model = a.model.as_deref().expect("clap requires --model without --toy");
        eprintln!("loading the policy from {model} …");
        let path = frognano_model::load::resolve_path(model)?;
        let policy = Policy::load(&path, &opts)?;
        let (_, chat) = ChatParts::split(frognano_model::load(model)?)?;
        let env_opts = SweEnvOptions {
            repos: a.repos.clone(),
            isolation: if a.no_sandbox {
                frognano_sandbox::Isolation::Unconfined
            } else {
                frognano_sandbox::Isolation::Bubblewrap
            },
            enable_thinking: !a.no_think,
            ..SweEnvOptions::default()
        };
        let env = match (&a.synth_repo, &a.tasks) {
            (Some(repo), tasks) => {
                let out = tasks.clone().unwrap_or_else(|| a.out.join("synth"));
                SweEnv::from_synth(SynthSource { seed: a.seed, ..SynthSource::new(repo, out) }, chat, env_opts)?
            }
            (None, Some(tasks)) => SweEnv::load(tasks, chat, env_opts)?,
            (None, None) => {
                anyhow::bail!("give --tasks (a task file or folder) or --synth-repo (a repository to synthesize from)")
            }
        };
        (policy, Box::new(env))
    };
    let resuming = crate::trainer::latest_checkpoint(&a.out)?;
    let mut trainer = Trainer::open(policy, env, curriculum, cfg, rollout, &a.out)?;
    if a.trainer == TrainerChoice::Tinker {
        let url = a.trainer_url.as_deref().expect("clap requires --trainer-url with --trainer tinker");
        let rank = lora.as_ref().map(|l| l.rank).ok_or_else(|| {
            anyhow::anyhow!("--trainer tinker trains LoRA adapters: give --lora-rank (the server's LoRA rank)")
        })?;
        let base = a.base_model.clone().or_else(|| a.model.clone()).unwrap_or_default();
        let mut client = crate::tinker::TinkerClient::connect(url, &base, rank, a.seed)?;
        let caps = client.capabilities()?;
        let (loss_fn, loss_config) = crate::tinker::choose_loss(&caps, &trainer.cfg.loss).ok_or_else(|| {
            anyhow::anyhow!("the Tinker server at {url} offers neither `ppo` nor `importance_sampling`: {caps}")
        })?;
        eprintln!("gradients on {url} (model {}, loss {loss_fn})", client.model_id);
        trainer.use_remote(crate::trainer::RemoteTrainer { client, loss_fn, loss_config })?;
    }
    match resuming {
        Some(c) => eprintln!("resuming {} from {}", a.out.display(), c.display()),
        None => eprintln!("training into {}", a.out.display()),
    }
    let total = trainer.cfg.steps;
    let bar = indicatif::ProgressBar::new(total).with_position(trainer.step_number());
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {elapsed} elapsed, {eta} left")
            .expect("valid template"),
    );
    trainer.run(|m| {
        // A hidden bar (no terminal) drops println: write the line to stderr ourselves.
        if bar.is_hidden() {
            eprintln!("{}", m.summary());
        } else {
            bar.println(m.summary());
        }
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    eprintln!(
        "done: {} steps; metrics {}, plot {}, checkpoints {}",
        trainer.step_number(),
        a.out.join("metrics.jsonl").display(),
        a.out.join("metrics.svg").display(),
        a.out.join("checkpoints").display()
    );
    Ok(())
}
