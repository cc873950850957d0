//! `frognano train` as a library: one typed config ([`TrainJob`]) with a `validate()`, and
//! [`run_training`], which opens (or resumes) the run and trains. The flags live in
//! `crates/cli`.
//!
//! Errors of `validate()` name a field by its `frognano train` flag (the field's name in
//! kebab case), say what was expected and what was found.

use frognano_engine::ChatParts;
use std::path::PathBuf;

use frognano_sandbox::Isolation;
use frognano_swe::progress::Progress;

use crate::curriculum::Curriculum;
use crate::env::{Environment, RolloutConfig, SweEnv, SweEnvOptions, SynthSource, TaskHarness};
use crate::policy::{LlamaSpec, LoraConfig, Policy, PolicyOptions};
use crate::trainer::{SaveFormatConfig, TrainConfig, Trainer};

/// Which tasks to sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CurriculumChoice {
    /// By learnability p̂(1−p̂), with new-task and staleness shares (docs/synthesis.md §10.1).
    Frontier,
    /// Uniformly (the baseline to compare the frontier against).
    Uniform,
}

/// What is trained on what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrainTarget {
    /// A random-init tiny model on the built-in toy environment (a one-token bug fix with a
    /// verifiable reward): a quick look at the whole loop.
    Toy,
    /// A real policy on SWE-bench-format tasks.
    Tasks {
        /// The policy: a checkpoint folder (llama, qwen2, qwen3 or qwen3_5 safetensors) or a
        /// llama, mistral, qwen2 or qwen3 GGUF file (dequantized to f32).
        model: String,
        /// Tasks: SWE-bench JSONL/JSON, a `frognano synth --out` folder, or a Harbor dataset.
        tasks: Option<PathBuf>,
        /// Grow the pool by synthesizing tasks from this git repository when the band runs
        /// dry (written under `out`/synth unless `tasks` names a synth folder).
        synth_repo: Option<PathBuf>,
        /// One clone per repository, for tasks without `repo_path`.
        repos: Option<PathBuf>,
        /// Confinement of the agent's commands and the tests.
        isolation: Isolation,
        /// A thinking block in the generation prompt.
        enable_thinking: bool,
        /// The Leaf harness or a small model's, and location hints in the issue texts.
        harness: TaskHarness,
    },
}

/// Where gradients are computed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GradientBackend {
    /// In this process, through FrogNano's own model code (candle autograd).
    Local,
    /// On a Tinker-compatible server (SkyRL `skyrl.tinker.api`), LoRA only.
    Tinker {
        /// Base URL of the server, e.g. http://head:8000.
        url: String,
        /// The server's name of the base model (default: the model as given).
        base_model: Option<String>,
    },
}

/// Everything `frognano train` needs.
#[derive(Debug, Clone)]
pub struct TrainJob {
    /// What is trained on what.
    pub target: TrainTarget,
    /// Run folder: metrics, plot, rollouts, checkpoints. An existing run resumes.
    pub out: PathBuf,
    /// The loop: steps, batch, advantages, loss, optimizer, checkpoints.
    pub train: TrainConfig,
    /// One attempt: sampling and limits.
    pub rollout: RolloutConfig,
    /// Task sampling.
    pub curriculum: CurriculumChoice,
    /// Train LoRA adapters instead of every weight.
    pub lora: Option<LoraConfig>,
    /// Keep the weights in bf16 (computation stays f32).
    pub bf16: bool,
    /// Where gradients are computed.
    pub backend: GradientBackend,
    /// Roll the groups out on this Ray cluster (`--ray`) instead of in this process; the run
    /// folder must then be on a path every node sees.
    pub ray: Option<frognano_swe::ray::RayConfig>,
}

/// The learning rate when none is given: 1e-2 for the toy, 1e-4 with LoRA, 1e-6 for full
/// fine-tuning.
pub fn default_lr(toy: bool, lora: bool) -> f64 {
    if toy {
        1e-2
    } else if lora {
        1e-4
    } else {
        1e-6
    }
}

impl TrainJob {
    /// Checks the settings without side effects.
    pub fn validate(&self) -> anyhow::Result<()> {
        let cfg = &self.train;
        anyhow::ensure!(
            cfg.group_size >= 2,
            "--group-size must be at least 2 (advantages compare attempts), got {}",
            cfg.group_size
        );
        anyhow::ensure!(cfg.tasks_per_step >= 1, "--tasks-per-step must be at least 1");
        anyhow::ensure!(
            cfg.save_format == SaveFormatConfig::Merged || self.lora.is_some(),
            "--save-format adapter needs --lora-rank (a full fine-tune has no adapter)"
        );
        if let TrainTarget::Tasks { tasks: None, synth_repo: None, .. } = &self.target {
            anyhow::bail!("give --tasks (a task file or folder) or --synth-repo (a repository to synthesize from)");
        }
        if matches!(self.backend, GradientBackend::Tinker { .. }) && self.lora.is_none() {
            anyhow::bail!("--trainer tinker trains LoRA adapters: give --lora-rank (the server's LoRA rank)");
        }
        Ok(())
    }
}

/// What a finished training run left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainSummary {
    /// Steps done (all of them, across resumes).
    pub steps: u64,
    /// The run folder.
    pub out: PathBuf,
}

/// The policy of `--model` (built with `opts`), its chat template, and the options of the
/// task environment around it: what the trainer and a cluster worker ([`crate::remote`])
/// both start from.
pub(crate) fn load_task_policy(
    model: &str,
    opts: &PolicyOptions,
    repos: Option<PathBuf>,
    isolation: Isolation,
    enable_thinking: bool,
    harness: TaskHarness,
) -> anyhow::Result<(Policy, ChatParts, SweEnvOptions)> {
    let path = frognano_model::load::resolve_path(model)?;
    let policy = Policy::load(&path, opts)?;
    let (_, chat) = ChatParts::split(frognano_model::load(model)?)?;
    let env_opts = harness.apply(SweEnvOptions { repos, isolation, enable_thinking, ..SweEnvOptions::default() });
    Ok((policy, chat, env_opts))
}

/// Runs [`TrainJob`]: opens (or resumes) the run in `job.out` and trains to the last step,
/// reporting each step to `progress` (its summary line through [`Progress::println`]).
pub fn run_training(a: &TrainJob, progress: &dyn Progress) -> anyhow::Result<TrainSummary> {
    a.validate()?;
    let lora = a.lora.clone();
    let seed = a.train.seed;
    let opts = PolicyOptions {
        lora: lora.clone(),
        dtype: if a.bf16 { candle_core::DType::BF16 } else { candle_core::DType::F32 },
        seed,
    };
    let cfg = a.train.clone();
    let frontier =
        |batch| Curriculum::frontier(frognano_synth::calibrate::FrontierConfig { batch, ..Default::default() });
    let curriculum = match a.curriculum {
        CurriculumChoice::Frontier => frontier(cfg.tasks_per_step),
        CurriculumChoice::Uniform => Curriculum::uniform(),
    };

    let (policy, env): (Policy, Box<dyn Environment>) = match &a.target {
        TrainTarget::Toy => {
            let spec = LlamaSpec::tiny(crate::toy::VOCAB.len());
            (Policy::random_llama(&spec, &opts)?, Box::new(crate::toy::ToyEnv))
        }
        TrainTarget::Tasks { model, tasks, synth_repo, repos, isolation, enable_thinking, harness } => {
            eprintln!("loading the policy from {model} …");
            let (policy, chat, env_opts) =
                load_task_policy(model, &opts, repos.clone(), *isolation, *enable_thinking, *harness)?;
            let env = match (synth_repo, tasks) {
                (Some(repo), tasks) => {
                    let out = tasks.clone().unwrap_or_else(|| a.out.join("synth"));
                    SweEnv::from_synth(SynthSource { seed, ..SynthSource::new(repo, out) }, chat, env_opts)?
                }
                (None, Some(tasks)) => SweEnv::load(tasks, chat, env_opts)?,
                (None, None) => {
                    anyhow::bail!(
                        "give --tasks (a task file or folder) or --synth-repo (a repository to synthesize from)"
                    )
                }
            };
            (policy, Box::new(env))
        }
    };
    let resuming = crate::trainer::latest_checkpoint(&a.out)?;
    let mut trainer = Trainer::open(policy, env, curriculum, cfg, a.rollout.clone(), &a.out)?;
    if let GradientBackend::Tinker { url, base_model } = &a.backend {
        let rank = lora.as_ref().map(|l| l.rank).ok_or_else(|| {
            anyhow::anyhow!("--trainer tinker trains LoRA adapters: give --lora-rank (the server's LoRA rank)")
        })?;
        let model = match &a.target {
            TrainTarget::Tasks { model, .. } => Some(model.clone()),
            TrainTarget::Toy => None,
        };
        let base = base_model.clone().or(model).unwrap_or_default();
        let mut client = crate::tinker::TinkerClient::connect(url, &base, rank, seed)?;
        let caps = client.capabilities()?;
        let (loss_fn, loss_config) = crate::tinker::choose_loss(&caps, &trainer.cfg.loss).ok_or_else(|| {
            anyhow::anyhow!("the Tinker server at {url} offers neither `ppo` nor `importance_sampling`: {caps}")
        })?;
        eprintln!("gradients on {url} (model {}, loss {loss_fn})", client.model_id);
        trainer.use_remote(crate::trainer::RemoteTrainer { client, loss_fn, loss_config })?;
    }
    if let Some(config) = &a.ray {
        let target = match &a.target {
            TrainTarget::Toy => crate::remote::RecipeTarget::Toy,
            TrainTarget::Tasks { model, tasks, synth_repo, repos, isolation, enable_thinking, harness } => {
                // A synth-grown pool lives in its synth folder; workers load it from there.
                let tasks = match (synth_repo, tasks) {
                    (Some(_), t) => t.clone().unwrap_or_else(|| a.out.join("synth")),
                    (None, Some(t)) => t.clone(),
                    (None, None) => unreachable!("checked by validate()"),
                };
                // A model given as a path is handed on absolute (the workers run elsewhere).
                let model = match std::path::Path::new(model).exists() {
                    true => std::path::absolute(model)?.to_string_lossy().into_owned(),
                    false => model.clone(),
                };
                crate::remote::RecipeTarget::Tasks {
                    model,
                    tasks: std::path::absolute(&tasks)?,
                    repos: repos.as_ref().map(std::path::absolute).transpose()?,
                    isolation: *isolation,
                    enable_thinking: *enable_thinking,
                    harness: *harness,
                }
            }
        };
        let recipe = crate::remote::WorkerRecipe { target, lora: lora.clone(), bf16: a.bf16, seed };
        let runner = frognano_swe::ray::RayRunner { config: config.clone() };
        eprintln!("rollout groups on the Ray cluster at {}", config.address);
        trainer.use_remote_rollouts(crate::remote::RemoteRollouts::new(Box::new(runner), recipe));
    }
    match resuming {
        Some(c) => eprintln!("resuming {} from {}", a.out.display(), c.display()),
        None => eprintln!("training into {}", a.out.display()),
    }
    progress.start("train", trainer.cfg.steps, trainer.step_number());
    let result = trainer.run(|m| {
        progress.println(&m.summary());
        progress.inc(1);
    });
    progress.finish();
    result?;
    Ok(TrainSummary { steps: trainer.step_number(), out: a.out.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy_job() -> TrainJob {
        TrainJob {
            target: TrainTarget::Toy,
            out: "run".into(),
            train: TrainConfig::default(),
            rollout: RolloutConfig::default(),
            curriculum: CurriculumChoice::Frontier,
            lora: None,
            bf16: false,
            backend: GradientBackend::Local,
            ray: None,
        }
    }

    #[test]
    fn bad_settings_are_named_with_what_was_found() {
        toy_job().validate().unwrap();
        let mut job = toy_job();
        job.train.group_size = 1;
        assert_eq!(
            job.validate().unwrap_err().to_string(),
            "--group-size must be at least 2 (advantages compare attempts), got 1"
        );
        let mut job = toy_job();
        job.train.save_format = SaveFormatConfig::Adapter;
        assert!(job.validate().unwrap_err().to_string().starts_with("--save-format adapter needs --lora-rank"));
        let job =
            TrainJob { backend: GradientBackend::Tinker { url: "http://h:1".into(), base_model: None }, ..toy_job() };
        assert!(job.validate().unwrap_err().to_string().starts_with("--trainer tinker trains LoRA adapters"));
        let job = TrainJob {
            target: TrainTarget::Tasks {
                model: "m".into(),
                tasks: None,
                synth_repo: None,
                repos: None,
                isolation: Isolation::Unconfined,
                enable_thinking: true,
                harness: TaskHarness::default(),
            },
            ..toy_job()
        };
        assert!(job.validate().unwrap_err().to_string().starts_with("give --tasks"));
    }
}
