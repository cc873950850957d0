//! Rollout groups as units of a cluster run (`frognano train … --ray`; docs/scale-out.md).
//!
//! A unit is one group: the G attempts on one task of one step. Its worker (`frognano unit`
//! on a Ray node) builds the policy the way the trainer built it ([`WorkerRecipe`]: the toy's
//! random init from the run seed, or the checkpoint folder, with the same LoRA settings),
//! loads the trainable weights of the current policy version from the file the trainer wrote
//! for it under the run folder (`OUT/ray/policy-vN.safetensors`, on a path every node sees),
//! and runs the attempts with the seeds the trainer chose — the same seeds a local step uses.
//! It answers with the rollouts (token ids, sampling logprobs, loss masks, outcomes) as JSON;
//! the trainer puts them where its own rollout code puts them, so the update is unchanged.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use frognano_sandbox::Isolation;
use frognano_swe::remote::UnitRunner;
use rayon::prelude::*;
use serde_json::{json, Value};

use crate::env::{Environment, RolloutConfig, SweEnv, TaskHarness};
use crate::policy::{LlamaSpec, LoraConfig, Policy, PolicyOptions};
use crate::rollout::Rollout;
use frognano_swe::localization::HintLevel;

/// How a worker builds the policy and the environment of a run.
#[derive(Debug, Clone, PartialEq)]
pub enum RecipeTarget {
    /// The built-in toy: a random-init tiny llama on [`crate::toy::ToyEnv`].
    Toy,
    /// A checkpoint on SWE-bench-format tasks.
    Tasks {
        /// The policy's checkpoint folder or GGUF file, as `--model` gave it.
        model: String,
        /// The task file or folder (a synth-grown pool: its `synth --out` folder).
        tasks: PathBuf,
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

/// Everything a worker needs to rebuild the run's policy (before its weights are loaded) and
/// environment.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerRecipe {
    /// Policy and tasks.
    pub target: RecipeTarget,
    /// LoRA settings (the trainable weights are then the adapters only).
    pub lora: Option<LoraConfig>,
    /// Base weights kept in bf16.
    pub bf16: bool,
    /// The run seed (random inits).
    pub seed: u64,
}

impl WorkerRecipe {
    /// As a unit carries it.
    pub fn to_json(&self) -> Value {
        let target = match &self.target {
            RecipeTarget::Toy => json!("toy"),
            RecipeTarget::Tasks { model, tasks, repos, isolation, enable_thinking, harness } => json!({
                "model": model,
                "tasks": tasks,
                "repos": repos,
                "unconfined": *isolation == Isolation::Unconfined,
                "enable_thinking": enable_thinking,
                "small_model_harness": harness.small_model,
                "hints": harness.hints.as_str(),
            }),
        };
        let lora = self.lora.as_ref().map(|l| json!({"rank": l.rank, "alpha": l.alpha, "targets": l.targets}));
        json!({"target": target, "lora": lora, "bf16": self.bf16, "seed": self.seed})
    }

    /// The inverse of [`WorkerRecipe::to_json`]; errors name the field.
    pub fn from_json(v: &Value) -> anyhow::Result<WorkerRecipe> {
        fn field<T: serde::de::DeserializeOwned>(v: &Value, name: &str) -> anyhow::Result<T> {
            serde_json::from_value(v[name].clone()).map_err(|e| anyhow::anyhow!("unit field `recipe.{name}`: {e}"))
        }
        let t = &v["target"];
        let target = if t == "toy" {
            RecipeTarget::Toy
        } else {
            let unconfined: bool = field(t, "unconfined")?;
            RecipeTarget::Tasks {
                model: field(t, "model")?,
                tasks: field(t, "tasks")?,
                repos: field(t, "repos")?,
                isolation: if unconfined { Isolation::Unconfined } else { Isolation::Bubblewrap },
                enable_thinking: field(t, "enable_thinking")?,
                // Recipes written before the options existed ran the Leaf harness, no hints.
                harness: TaskHarness {
                    small_model: t["small_model_harness"].as_bool().unwrap_or(false),
                    hints: match t["hints"].as_str() {
                        None => HintLevel::None,
                        Some(h) => h.parse().map_err(|e| anyhow::anyhow!("unit field `recipe.target.hints`: {e}"))?,
                    },
                },
            }
        };
        let lora = match &v["lora"] {
            Value::Null => None,
            l => Some(LoraConfig { rank: field(l, "rank")?, alpha: field(l, "alpha")?, targets: field(l, "targets")? }),
        };
        Ok(WorkerRecipe { target, lora, bf16: field(v, "bf16")?, seed: field(v, "seed")? })
    }

    fn policy_options(&self) -> PolicyOptions {
        PolicyOptions {
            lora: self.lora.clone(),
            dtype: if self.bf16 { candle_core::DType::BF16 } else { candle_core::DType::F32 },
            seed: self.seed,
        }
    }
}

fn rollout_config_to_json(c: &RolloutConfig) -> Value {
    json!({
        "temperature": c.temperature,
        "max_tokens_per_turn": c.max_tokens_per_turn,
        "max_steps": c.max_steps,
        "max_context_tokens": c.max_context_tokens,
        "max_time_s": c.max_time.map(|d| d.as_secs_f64()),
        "partial_credit": c.partial_credit,
    })
}

fn rollout_config_from_json(v: &Value) -> anyhow::Result<RolloutConfig> {
    fn field<T: serde::de::DeserializeOwned>(v: &Value, name: &str) -> anyhow::Result<T> {
        serde_json::from_value(v[name].clone()).map_err(|e| anyhow::anyhow!("unit field `rollout.{name}`: {e}"))
    }
    let max_time: Option<f64> = field(v, "max_time_s")?;
    Ok(RolloutConfig {
        temperature: field(v, "temperature")?,
        max_tokens_per_turn: field(v, "max_tokens_per_turn")?,
        max_steps: field(v, "max_steps")?,
        max_context_tokens: field(v, "max_context_tokens")?,
        max_time: max_time.map(Duration::from_secs_f64),
        partial_credit: field(v, "partial_credit")?,
    })
}

/// The trainer's side: a runner for the groups and the recipe its workers follow.
pub struct RemoteRollouts {
    /// Where the groups run (a Ray cluster).
    pub runner: Box<dyn UnitRunner + Send>,
    /// How the workers build the policy and the environment.
    pub recipe: WorkerRecipe,
    /// The policy version whose weights file is written (`None`: none yet in this process).
    written: Mutex<Option<u64>>,
}

/// One group of a step, as the trainer hands it to [`RemoteRollouts::collect`].
#[derive(Debug, Clone)]
pub struct GroupJob {
    /// The task.
    pub task_id: String,
    /// One sampling seed per attempt (the group size is their number).
    pub seeds: Vec<u64>,
    /// A label for logs and the placements record (`step S group I`).
    pub label: String,
}

impl RemoteRollouts {
    /// Rollout groups through `runner`, built by workers from `recipe`.
    pub fn new(runner: Box<dyn UnitRunner + Send>, recipe: WorkerRecipe) -> RemoteRollouts {
        RemoteRollouts { runner, recipe, written: Mutex::new(None) }
    }

    /// Writes the trainable weights of policy `version` to `out/ray/policy-vN.safetensors`
    /// (once per version; written aside and renamed, so a worker never reads half a file;
    /// older versions' files are removed) and returns its path.
    fn weights_file(&self, policy: &Policy, version: u64, out: &Path) -> anyhow::Result<PathBuf> {
        // Absolute: the workers run in folders of their own.
        let dir = std::path::absolute(out)?.join("ray");
        let path = dir.join(format!("policy-v{version}.safetensors"));
        let mut written = self.written.lock().expect("weights lock");
        if *written == Some(version) {
            return Ok(path);
        }
        std::fs::create_dir_all(&dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
        let tensors: std::collections::HashMap<String, candle_core::Tensor> =
            policy.params().into_iter().map(|(name, var)| (name, var.as_tensor().clone())).collect();
        let tmp = dir.join(format!(".policy-v{version}.partial"));
        candle_core::safetensors::save(&tensors, &tmp)
            .map_err(|e| anyhow::anyhow!("cannot write the policy weights {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        if let Some(old) = written.replace(version).filter(|v| *v != version) {
            let _ = std::fs::remove_file(dir.join(format!("policy-v{old}.safetensors")));
        }
        Ok(path)
    }

    /// Rolls out `groups` on the cluster with the weights of `policy` at `version`; returns
    /// each group's attempts in seed order. Any group the cluster could not roll out (its
    /// worker failed, or retries ran out) fails the step: the trainer's state is unchanged and
    /// a rerun resumes from the last checkpoint.
    pub fn collect(
        &self,
        policy: &Policy,
        version: u64,
        out: &Path,
        rollout: &RolloutConfig,
        parallel: usize,
        groups: &[GroupJob],
    ) -> anyhow::Result<Vec<Vec<Rollout>>> {
        let weights = self.weights_file(policy, version, out)?;
        let recipe = self.recipe.to_json();
        let rollout = rollout_config_to_json(rollout);
        let units: Vec<Value> = groups
            .iter()
            .map(|g| {
                json!({
                    "kind": "train_group",
                    "label": g.label,
                    "recipe": recipe,
                    "weights": weights,
                    "task_id": g.task_id,
                    "seeds": g.seeds,
                    "rollout": rollout,
                    "parallel": parallel,
                })
            })
            .collect();
        let mut answers: Vec<Option<Vec<Rollout>>> = vec![None; groups.len()];
        let mut failed: Vec<String> = Vec::new();
        let placements = out.join("ray").join("placements.jsonl");
        let res = self.runner.run_units(&units, &frognano_swe::progress::NoProgress, &mut |i, answer| {
            let mut row = json!({"group": groups[i].label, "task_id": groups[i].task_id});
            if let Value::Object(m) = answer.placement {
                row.as_object_mut().expect("an object").extend(m);
            }
            let _ = append_line(&placements, &row);
            let parsed = answer.outcome.map_err(anyhow::Error::msg).and_then(|v| {
                let rs: Vec<Rollout> = serde_json::from_value(v["rollouts"].clone())
                    .map_err(|e| anyhow::anyhow!("unreadable rollouts: {e}"))?;
                anyhow::ensure!(
                    rs.len() == groups[i].seeds.len(),
                    "{} rollouts for {} attempts",
                    rs.len(),
                    groups[i].seeds.len()
                );
                Ok(rs)
            });
            match parsed {
                Ok(rs) => answers[i] = Some(rs),
                Err(e) => failed.push(format!("{} ({}): {e:#}", groups[i].label, groups[i].task_id)),
            }
        });
        res.context("rolling out on the cluster")?;
        anyhow::ensure!(
            failed.is_empty(),
            "{} rollout group(s) failed on the cluster: {}",
            failed.len(),
            failed.join("; ")
        );
        Ok(answers.into_iter().map(|a| a.expect("every group answered or failed")).collect())
    }
}

fn append_line(path: &Path, row: &Value) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    writeln!(f, "{row}")
}

/// A worker's side of one `train_group` unit: rebuilds the policy from the recipe, loads the
/// version's weights, rolls out every attempt of the group on one scheduler (as a local step
/// does) and answers `{"rollouts": [...]}`.
pub fn run_unit(unit: &Value) -> anyhow::Result<Value> {
    anyhow::ensure!(
        unit["kind"] == "train_group",
        "unit field `kind`: expected \"train_group\", found {}",
        unit["kind"]
    );
    let recipe = WorkerRecipe::from_json(&unit["recipe"])?;
    let weights = unit["weights"].as_str().ok_or_else(|| anyhow::anyhow!("unit field `weights` missing"))?;
    let task_id = unit["task_id"].as_str().ok_or_else(|| anyhow::anyhow!("unit field `task_id` missing"))?;
    let seeds: Vec<u64> =
        serde_json::from_value(unit["seeds"].clone()).map_err(|e| anyhow::anyhow!("unit field `seeds`: {e}"))?;
    let cfg = rollout_config_from_json(&unit["rollout"])?;
    let parallel = unit["parallel"].as_u64().unwrap_or(1).max(1) as usize;
    let opts = recipe.policy_options();
    let (mut policy, env): (Policy, Box<dyn Environment>) = match &recipe.target {
        RecipeTarget::Toy => {
            (Policy::random_llama(&LlamaSpec::tiny(crate::toy::VOCAB.len()), &opts)?, Box::new(crate::toy::ToyEnv))
        }
        RecipeTarget::Tasks { model, tasks, repos, isolation, enable_thinking, harness } => {
            let (policy, chat, env_opts) =
                crate::train::load_task_policy(model, &opts, repos.clone(), *isolation, *enable_thinking, *harness)?;
            (policy, Box::new(SweEnv::load(tasks, chat, env_opts)?))
        }
    };
    let tensors = candle_core::safetensors::load(weights, &candle_core::Device::Cpu).map_err(|e| {
        anyhow::anyhow!(
            "cannot read the policy weights {weights} ({e}): the run folder must be on a path every node sees"
        )
    })?;
    policy.set_params(&tensors)?;
    let model: Arc<dyn frognano_model::CausalLm> = Arc::from(policy.inference_model()?);
    let sampler = crate::trainer::rollout_scheduler(model, parallel)?;
    let run = |(j, seed): (usize, &u64)| -> anyhow::Result<Rollout> {
        let mut r = env.rollout(&sampler, task_id, &cfg, *seed)?;
        r.attempt = j as u32;
        r.seed = *seed;
        Ok(r)
    };
    let rollouts: Vec<Rollout> = if parallel > 1 {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(parallel).build()?;
        pool.install(|| seeds.par_iter().enumerate().map(run).collect::<anyhow::Result<_>>())?
    } else {
        seeds.iter().enumerate().map(run).collect::<anyhow::Result<_>>()?
    };
    Ok(json!({"rollouts": rollouts}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipes_and_rollout_settings_survive_the_trip() {
        let recipe = WorkerRecipe {
            target: RecipeTarget::Tasks {
                model: "m".into(),
                tasks: "/t".into(),
                repos: None,
                isolation: Isolation::Unconfined,
                enable_thinking: false,
                harness: TaskHarness { small_model: true, hints: HintLevel::Function },
            },
            lora: Some(LoraConfig::default()),
            bf16: true,
            seed: u64::MAX,
        };
        assert_eq!(WorkerRecipe::from_json(&recipe.to_json()).unwrap(), recipe);
        let toy = WorkerRecipe { target: RecipeTarget::Toy, lora: None, bf16: false, seed: 3 };
        assert_eq!(WorkerRecipe::from_json(&toy.to_json()).unwrap(), toy);
        let c = RolloutConfig { max_time: None, temperature: 0.7, ..RolloutConfig::default() };
        let back = rollout_config_from_json(&rollout_config_to_json(&c)).unwrap();
        assert_eq!((back.max_time, back.temperature, back.max_steps), (None, 0.7, c.max_steps));
        let e = WorkerRecipe::from_json(&json!({"target": {"model": 1}})).unwrap_err().to_string();
        assert!(e.contains("recipe.unconfined"), "{e}");
    }
}
