//! The training loop: sample tasks, roll out, score, advantages, clipped loss, backward,
//! AdamW, new sampler weights — with checkpoints that resume exactly.
//!
//! Determinism: every random choice of step `k` comes from a generator seeded by
//! `(seed, k)` (task sampling) or `(seed, k, group, attempt)` (rollout sampling), and every
//! piece of state a step reads (trainable weights, optimizer moments, curriculum counts,
//! step and policy version) is in the checkpoint. A run killed after step `k` and resumed
//! from its checkpoint therefore computes the same step `k + 1` as a run that never stopped.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use candle_core::Tensor;
use frognano_engine::{Scheduler, SchedulerConfig};
use frognano_model::CausalLm;
use rand::SeedableRng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::curriculum::Curriculum;
use crate::env::{Environment, RolloutConfig};
use crate::loss::{group_advantages, sequence_loss, set_scales, AdvantageConfig, Datum, LossConfig, LossStats};
use crate::metrics::{self, StepMetrics};
use crate::optim::{AdamW, AdamWConfig, GradSum};
use crate::policy::{Policy, SaveFormat};
use crate::rollout::{Outcome, Rollout};
use crate::store::RolloutStore;
use crate::tinker::TinkerClient;

/// Gradient work on a Tinker-compatible server instead of in this process.
pub struct RemoteTrainer {
    /// The connected client.
    pub client: TinkerClient,
    /// Loss name sent with `forward_backward` ([`crate::tinker::choose_loss`]).
    pub loss_fn: String,
    /// Its `loss_fn_config`.
    pub loss_config: Option<serde_json::Value>,
}

/// Everything that shapes a run. Saved with every checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Steps to run (the run ends at this step number).
    pub steps: u64,
    /// Tasks sampled per step (B).
    pub tasks_per_step: usize,
    /// Attempts per task (G).
    pub group_size: usize,
    /// Optimizer steps per rollout batch (the batch's usable sequences are split evenly).
    pub mini_batches: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// Advantage settings.
    pub advantage: AdvantageConfig,
    /// Loss settings.
    pub loss: LossConfig,
    /// Optimizer settings.
    pub optim: AdamWConfig,
    /// Save a checkpoint every this many steps (and after the last one).
    pub save_every: u64,
    /// How the model inside a checkpoint is written.
    pub save_format: SaveFormatConfig,
    /// Rollouts run at once (each one's model calls are themselves multi-threaded).
    pub parallel_rollouts: usize,
    /// DAPO dynamic sampling: when fewer than `tasks_per_step` groups carry gradient (the
    /// others had all-equal rewards), draw another `tasks_per_step` tasks and roll them out,
    /// up to this many extra rounds per step, and train on the first `tasks_per_step` usable
    /// groups. 0 (the default) turns it off. Every extra rollout counts in the step's tokens.
    #[serde(default)]
    pub dynamic_sampling_rounds: usize,
}

/// [`SaveFormat`] in the config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SaveFormatConfig {
    /// Full HF checkpoint with LoRA merged in.
    Merged,
    /// PEFT adapter only (LoRA runs).
    Adapter,
}

impl From<SaveFormatConfig> for SaveFormat {
    fn from(f: SaveFormatConfig) -> Self {
        match f {
            SaveFormatConfig::Merged => SaveFormat::Merged,
            SaveFormatConfig::Adapter => SaveFormat::Adapter,
        }
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            steps: 100,
            tasks_per_step: 8,
            group_size: 8,
            mini_batches: 1,
            seed: 0,
            advantage: AdvantageConfig::default(),
            loss: LossConfig::default(),
            optim: AdamWConfig::default(),
            save_every: 10,
            save_format: SaveFormatConfig::Merged,
            parallel_rollouts: 1,
            dynamic_sampling_rounds: 0,
        }
    }
}

/// The small state a checkpoint holds next to the tensors.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CheckpointState {
    step: u64,
    policy_version: u64,
    config: TrainConfig,
    curriculum: Curriculum,
    /// With a remote trainer: its model id, the next `seq_id`, and the last `save_weights` path.
    #[serde(default)]
    remote: Option<RemoteState>,
}

/// What a resumed remote run needs to continue on the server.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RemoteState {
    model_id: String,
    seq_id: u64,
    weights_path: String,
}

/// A run: policy, optimizer, environment, curriculum and where it writes.
pub struct Trainer {
    /// Settings.
    pub cfg: TrainConfig,
    /// Rollout limits and sampling.
    pub rollout: RolloutConfig,
    policy: Policy,
    optimizer: AdamW,
    env: Box<dyn Environment>,
    curriculum: Curriculum,
    store: RolloutStore,
    sampler: Arc<dyn CausalLm>,
    out: PathBuf,
    step: u64,
    version: u64,
    remote: Option<RemoteTrainer>,
    remote_rollouts: Option<crate::remote::RemoteRollouts>,
}

/// The scheduler a step's rollouts share: decode batches of up to `parallel` attempts, and
/// prefix reuse so that a group's common prompt is prefilled once. A cluster worker rolls
/// its group out on the same kind of scheduler ([`crate::remote`]), and so do evaluations that
/// must see attempts as training does (`examples/curriculum_bench.rs`).
pub fn rollout_scheduler(model: Arc<dyn CausalLm>, parallel: usize) -> anyhow::Result<Arc<Scheduler>> {
    let parallel = parallel.max(1);
    let config = SchedulerConfig {
        max_batch: parallel,
        sessions: 2 * parallel + 2,
        prefix_reuse: true,
        max_waiting: usize::MAX,
        ..Default::default()
    };
    Ok(Arc::new(Scheduler::start(model, config).context("starting the rollout scheduler")?))
}

/// Seed for one rollout: a fixed mix of the run seed and its coordinates.
fn rollout_seed(seed: u64, step: u64, group: usize, attempt: usize) -> u64 {
    let mut x = seed ^ 0x9E37_79B9_7F4A_7C15;
    for v in [step, group as u64, attempt as u64] {
        x = (x ^ v).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 31;
    }
    x
}

impl Trainer {
    /// Starts a run in `out` (created), or resumes it from the latest checkpoint there when
    /// one exists. Tasks of `env` not yet known to `curriculum` are added to it.
    pub fn open(
        mut policy: Policy,
        env: Box<dyn Environment>,
        mut curriculum: Curriculum,
        cfg: TrainConfig,
        rollout: RolloutConfig,
        out: &Path,
    ) -> anyhow::Result<Trainer> {
        std::fs::create_dir_all(out).map_err(|e| anyhow::anyhow!("cannot create run folder {}: {e}", out.display()))?;
        let params = policy.params();
        let mut optimizer = AdamW::new(cfg.optim, &params)?;
        let (mut step, mut version) = (0, 0);
        if let Some(ckpt) = latest_checkpoint(out)? {
            let state: CheckpointState = read_json(&ckpt.join("state.json"))?;
            let tensors = load_tensors(&ckpt.join("trainer_state.safetensors"))?;
            policy.set_params(&tensors)?;
            optimizer.load_state(&params, &tensors)?;
            // `steps` may grow on a resume; any other change makes the continuation a different run.
            let (mut saved, mut given) = (serde_json::to_value(&state.config)?, serde_json::to_value(&cfg)?);
            saved["steps"] = serde_json::Value::Null;
            given["steps"] = serde_json::Value::Null;
            if saved != given {
                eprintln!(
                    "warning: resuming {} with settings that differ from its checkpoint's ({}); the run continues with the new ones",
                    out.display(),
                    ckpt.join("state.json").display()
                );
            }
            curriculum = state.curriculum;
            step = state.step;
            version = state.policy_version;
            metrics::truncate_after(&out.join("metrics.jsonl"), step)?;
            tracing::info!("resumed {} at step {step}", out.display());
        }
        curriculum.add_tasks(&env.task_ids());
        let store = RolloutStore::open(&out.join("rollouts"))?;
        let sampler: Arc<dyn CausalLm> = Arc::from(policy.inference_model()?);
        Ok(Trainer {
            cfg,
            rollout,
            policy,
            optimizer,
            env,
            curriculum,
            store,
            sampler,
            out: out.to_path_buf(),
            step,
            version,
            remote: None,
            remote_rollouts: None,
        })
    }

    /// Sends the gradient work to a Tinker-compatible server from now on. The local policy
    /// must be a LoRA policy of the server model's rank: it only samples, and after every
    /// step it takes the adapter the server saved. On a resumed run, the server model is
    /// loaded from the weights the last checkpoint recorded.
    pub fn use_remote(&mut self, mut remote: RemoteTrainer) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.policy.lora().is_some(),
            "a remote (Tinker) trainer trains LoRA adapters: give --lora-rank"
        );
        if let Some(ckpt) = latest_checkpoint(&self.out)? {
            let state: CheckpointState = read_json(&ckpt.join("state.json"))?;
            if let Some(r) = state.remote {
                remote.client.load_weights(&r.weights_path)?;
                remote.client.seq_id = remote.client.seq_id.max(r.seq_id);
            }
        }
        self.remote = Some(remote);
        Ok(())
    }

    /// Rolls the groups of every step out on a cluster from now on (`frognano train --ray`):
    /// each group is one unit, run by a worker that loads this step's policy weights from the
    /// run folder. The rollouts come back in the form the local rollout code makes them, with
    /// the same seeds, so everything after the rollouts is unchanged.
    pub fn use_remote_rollouts(&mut self, remote: crate::remote::RemoteRollouts) {
        self.remote_rollouts = Some(remote);
    }

    /// Steps finished so far.
    pub fn step_number(&self) -> u64 {
        self.step
    }

    /// The policy being trained.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The curriculum state.
    pub fn curriculum(&self) -> &Curriculum {
        &self.curriculum
    }

    /// The run folder.
    pub fn out_dir(&self) -> &Path {
        &self.out
    }

    /// Runs `B·G` attempts on tasks drawn for step `step` with the current sampler, on one
    /// scheduler for the step: the attempts running at once share batched decode steps, and
    /// the attempts of a group start from a fork of the first one's prompt state. `first` is
    /// the index of `tasks[0]` among the step's groups (nonzero for dynamic-sampling rounds).
    fn collect(&self, tasks: &[String], first: usize) -> anyhow::Result<Vec<Vec<Rollout>>> {
        let g = self.cfg.group_size;
        // Group ids stay unique across steps however many rounds a step samples.
        let stride = (self.cfg.tasks_per_step * (1 + self.cfg.dynamic_sampling_rounds)) as u64;
        if let Some(remote) = &self.remote_rollouts {
            let jobs: Vec<crate::remote::GroupJob> = tasks
                .iter()
                .enumerate()
                .map(|(i, task)| crate::remote::GroupJob {
                    task_id: task.clone(),
                    seeds: (0..g).map(|j| rollout_seed(self.cfg.seed, self.step, first + i, j)).collect(),
                    label: format!("step {} group {}", self.step + 1, first + i),
                })
                .collect();
            let parallel = self.cfg.parallel_rollouts.max(1);
            let mut groups = remote.collect(&self.policy, self.version, &self.out, &self.rollout, parallel, &jobs)?;
            for (i, (group, job)) in groups.iter_mut().zip(&jobs).enumerate() {
                for (j, (r, seed)) in group.iter_mut().zip(&job.seeds).enumerate() {
                    r.group = self.step * stride + (first + i) as u64;
                    r.attempt = j as u32;
                    r.policy_version = self.version;
                    r.seed = *seed;
                }
            }
            return Ok(groups);
        }
        let jobs: Vec<(usize, usize)> = (0..tasks.len()).flat_map(|i| (0..g).map(move |j| (i, j))).collect();
        let sampler = rollout_scheduler(Arc::clone(&self.sampler), self.cfg.parallel_rollouts)?;
        let run = |&(i, j): &(usize, usize)| -> anyhow::Result<Rollout> {
            let seed = rollout_seed(self.cfg.seed, self.step, first + i, j);
            let mut r = self.env.rollout(&sampler, &tasks[i], &self.rollout, seed)?;
            r.group = self.step * stride + (first + i) as u64;
            r.attempt = j as u32;
            r.policy_version = self.version;
            r.seed = seed;
            Ok(r)
        };
        let results: Vec<anyhow::Result<Rollout>> = if self.cfg.parallel_rollouts > 1 {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(self.cfg.parallel_rollouts).build()?;
            pool.install(|| jobs.par_iter().map(run).collect())
        } else {
            jobs.iter().map(run).collect()
        };
        let mut groups: Vec<Vec<Rollout>> = vec![Vec::with_capacity(g); tasks.len()];
        for (r, &(i, _)) in results.into_iter().zip(&jobs) {
            groups[i].push(r?);
        }
        Ok(groups)
    }

    /// One training step; returns its metrics (also appended to `metrics.jsonl`).
    pub fn step(&mut self) -> anyhow::Result<StepMetrics> {
        let mut m = StepMetrics { step: self.step + 1, ..Default::default() };
        let mut rng = rand::rngs::StdRng::seed_from_u64(rollout_seed(self.cfg.seed, self.step, usize::MAX, 0));
        let mut tasks = self.curriculum.sample(self.cfg.tasks_per_step, self.version, &mut rng);
        anyhow::ensure!(!tasks.is_empty(), "the task pool is empty: nothing to train on");
        m.sampled_p_hat = self.curriculum.mean_p_hat(&tasks).unwrap_or(0.5);

        // 1. Rollouts (with dynamic sampling, more rounds until B groups carry gradient).
        let t0 = Instant::now();
        let mut groups = self.collect(&tasks, 0)?;
        let usable = |gs: &[Vec<Rollout>], adv: &AdvantageConfig| {
            gs.iter()
                .filter(|g| group_advantages(&g.iter().map(|r| r.outcome.clone()).collect::<Vec<_>>(), adv).usable)
                .count()
        };
        for _ in 0..self.cfg.dynamic_sampling_rounds {
            if usable(&groups, &self.cfg.advantage) >= self.cfg.tasks_per_step {
                break;
            }
            let more: Vec<String> = self
                .curriculum
                .sample(self.cfg.tasks_per_step, self.version, &mut rng)
                .into_iter()
                .filter(|t| !tasks.contains(t))
                .collect();
            if more.is_empty() {
                break;
            }
            groups.extend(self.collect(&more, tasks.len())?);
            tasks.extend(more);
        }
        m.rollout_s = t0.elapsed().as_secs_f64();
        for r in groups.iter().flatten() {
            self.store.append(r)?;
        }
        self.store.sync()?;

        // 2. Scores, advantages, curriculum counts.
        let mut data = Vec::new();
        let (mut reward_sum, mut solved) = (0.0f64, 0usize);
        for (gi, group) in groups.iter().enumerate() {
            let outcomes: Vec<Outcome> = group.iter().map(|r| r.outcome.clone()).collect();
            self.curriculum.record(&tasks[gi], &outcomes, self.version);
            for o in &outcomes {
                m.attempts += 1;
                match o {
                    Outcome::Scored { reward } => {
                        m.scored += 1;
                        reward_sum += *reward as f64;
                        solved += (*reward >= 1.0) as usize;
                    }
                    Outcome::Limit { .. } => m.limit_masked += 1,
                    Outcome::Infra { .. } => m.infra_masked += 1,
                }
            }
            m.sampled_tokens += group.iter().map(Rollout::sampled_tokens).sum::<usize>();
            let adv = group_advantages(&outcomes, &self.cfg.advantage);
            m.groups += 1;
            // Dynamic sampling trains on the first B usable groups (DAPO's batch stays B).
            let batch_full = self.cfg.dynamic_sampling_rounds > 0 && m.usable_groups >= self.cfg.tasks_per_step;
            if adv.usable && !batch_full {
                m.usable_groups += 1;
                for (r, a) in group.iter().zip(&adv.advantages) {
                    if let Some(d) = a.and_then(|a| Datum::from_rollout(r, a, gi)) {
                        data.push(d);
                    }
                }
            }
        }
        m.reward_mean = if m.scored > 0 { reward_sum / m.scored as f64 } else { 0.0 };
        m.solve_rate = if m.scored > 0 { solved as f64 / m.scored as f64 } else { 0.0 };
        m.usable_fraction = m.usable_groups as f64 / m.groups.max(1) as f64;
        m.rollout_tokens_per_s = m.sampled_tokens as f64 / m.rollout_s.max(1e-9);

        // 3. Updates.
        let t1 = Instant::now();
        if !data.is_empty() {
            let k = self.cfg.mini_batches.clamp(1, data.len());
            if self.cfg.loss.tis_cap.is_some() && k > 1 {
                // Later mini-batches must weigh against the trainer before this step's first update.
                for d in data.iter_mut() {
                    let lp = self.policy.token_logprobs(&d.input, &d.targets)?.detach();
                    d.trainer_logprobs = Some(lp.to_dtype(candle_core::DType::F32)?.to_vec1()?);
                }
            }
            let per = data.len().div_ceil(k);
            let (mut stats, mut loss_sum, mut norm_sum, mut updates) = (LossStats::default(), 0.0, 0.0, 0);
            let mut trained_tokens = 0usize;
            for (bi, chunk) in data.chunks_mut(per).enumerate() {
                set_scales(chunk, &self.cfg.loss);
                let (loss, s, norm) = match self.remote.is_some() {
                    true => self.update_remote(chunk)?,
                    false => self.update(chunk)?,
                };
                if bi == 0 {
                    m.logprob_gap = (s.abs_logprob_gap / s.tokens.max(1.0)) as f64;
                }
                trained_tokens += chunk.iter().map(|d| d.input.len()).sum::<usize>();
                stats += s;
                loss_sum += loss;
                norm_sum += norm;
                updates += 1;
            }
            m.loss = loss_sum;
            m.grad_norm = norm_sum / updates as f64;
            m.clip_fraction = (stats.clipped / stats.tokens.max(1.0)) as f64;
            self.version += 1;
            if self.remote.is_some() {
                self.pull_remote_weights()?;
            }
            self.sampler = Arc::from(self.policy.inference_model()?);
            m.train_tokens_per_s = trained_tokens as f64 / t1.elapsed().as_secs_f64().max(1e-9);
        }
        m.train_s = t1.elapsed().as_secs_f64();

        // 4. Keep the pool at the frontier.
        if let Some((direction, n)) = self.curriculum.needs_tasks() {
            // A failed synthesis round (no candidate survived validation, a tool missing) is
            // not a reason to stop training: the pool stays as it is and the next step asks again.
            match self.env.request_tasks(direction, n) {
                Ok(new) => {
                    m.new_tasks = new.len();
                    self.curriculum.add_tasks(&new);
                }
                Err(e) => eprintln!("warning: asking for {n} {direction:?} tasks failed: {e:#}"),
            }
        }
        let cm = self.curriculum.metrics();
        m.pool_size = cm.tasks;
        m.band_mass = cm.band.in_band;
        m.difficulty_hist = cm.histogram.to_vec();

        self.step += 1;
        m.policy_version = self.version;
        let log = self.out.join("metrics.jsonl");
        metrics::append(&log, &m)?;
        metrics::write_plot(&log, &self.out.join("metrics.svg"), &format!("frognano train — {}", self.env.name()))?;
        if self.step.is_multiple_of(self.cfg.save_every.max(1)) || self.step == self.cfg.steps {
            self.save_checkpoint()?;
        }
        Ok(m)
    }

    /// One optimizer step on a mini-batch: per-sequence forward and backward, one layer's
    /// activations at a time ([`Policy::backward`]), the head only at loss-bearing tokens;
    /// gradients summed, clipped, AdamW. Returns (loss, stats, grad norm).
    fn update(&mut self, batch: &[Datum]) -> anyhow::Result<(f64, LossStats, f64)> {
        let params = self.policy.params();
        let mut acc = GradSum::new(&params);
        let (mut total, mut stats) = (0.0f64, LossStats::default());
        for d in batch {
            let needed: Vec<bool> = d.weights.iter().map(|&w| w != 0.0).collect();
            let (loss, s) = self.policy.backward(
                &d.input,
                &d.targets,
                Some(&needed),
                |lp| sequence_loss(lp, d, &self.cfg.loss),
                &mut |g| acc.add(g),
            )?;
            total += loss;
            stats += s;
        }
        let grads = acc.into_grads()?;
        let st = self.optimizer.step(&params, &grads)?;
        Ok((total, stats, st.grad_norm))
    }

    /// One remote optimizer step on a mini-batch. The server reports its own loss figures
    /// and the logprobs of the targets (compared with the sampler's); the gradient norm is
    /// not reported back (0).
    fn update_remote(&mut self, batch: &[Datum]) -> anyhow::Result<(f64, LossStats, f64)> {
        let remote = self.remote.as_mut().expect("checked by the caller");
        let (results, _) =
            remote.client.train_step(batch, &remote.loss_fn, remote.loss_config.as_ref(), &self.cfg.optim)?;
        let loss = results.iter().map(remote_loss).sum::<f64>();
        let tokens = batch.iter().map(Datum::loss_tokens).sum::<f32>();
        // The server's logprobs of the targets against the sampler's: the same gap the local
        // update reports (a large one means the server's base model is not the sampler's).
        let outputs = results.iter().flat_map(|r| r["loss_fn_outputs"].as_array().cloned().unwrap_or_default());
        let mut abs_logprob_gap = 0.0f32;
        for (d, o) in batch.iter().zip(outputs) {
            let Some(lp) = o.pointer("/logprobs/data").and_then(serde_json::Value::as_array) else { continue };
            for ((w, old), new) in d.weights.iter().zip(&d.old_logprobs).zip(lp) {
                abs_logprob_gap += w * (new.as_f64().unwrap_or(f64::from(*old)) as f32 - old).abs();
            }
        }
        Ok((loss, LossStats { tokens, abs_logprob_gap, ..LossStats::default() }, 0.0))
    }

    /// Saves the server's adapter for sampling, downloads it and loads it into the local
    /// policy.
    fn pull_remote_weights(&mut self) -> anyhow::Result<()> {
        let remote = self.remote.as_mut().expect("checked by the caller");
        let name = format!("step-{:06}", self.step + 1);
        remote.client.save_for_sampler(&name)?;
        let dir = self.out.join("tinker");
        std::fs::create_dir_all(&dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
        let archive = dir.join(format!("{name}.tar.gz"));
        remote.client.download(&name, &archive)?;
        let unpacked = dir.join(&name);
        crate::tinker::unpack(&archive, &unpacked)?;
        let file = crate::tinker::find_file(&unpacked, "adapter_model.safetensors")?;
        let tensors = load_tensors(&file)?;
        self.policy.set_params(&crate::tinker::peft_names(tensors))
    }

    /// Writes `checkpoints/step-NNNNNN/` (model, trainer state, curriculum) atomically.
    pub fn save_checkpoint(&mut self) -> anyhow::Result<PathBuf> {
        let dir = self.out.join("checkpoints");
        let final_dir = dir.join(format!("step-{:06}", self.step));
        let tmp = dir.join(format!(".step-{:06}.partial", self.step));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", tmp.display()))?;
        let params = self.policy.params();
        let mut tensors = self.optimizer.state(&params)?;
        for (name, p) in &params {
            tensors.insert(name.clone(), p.as_tensor().clone());
        }
        candle_core::safetensors::save(&tensors, tmp.join("trainer_state.safetensors"))?;
        let remote = match self.remote.as_mut() {
            None => None,
            // The server keeps the optimizer moments: save its full training state too.
            Some(r) => {
                let weights_path = r.client.save_weights(&format!("step-{:06}", self.step))?;
                Some(RemoteState { model_id: r.client.model_id.clone(), seq_id: r.client.seq_id, weights_path })
            }
        };
        let state = CheckpointState {
            step: self.step,
            policy_version: self.version,
            config: self.cfg.clone(),
            curriculum: self.curriculum.clone(),
            remote,
        };
        std::fs::write(tmp.join("state.json"), serde_json::to_string_pretty(&state)?)?;
        self.policy.save(&tmp.join("model"), self.cfg.save_format.into())?;
        let _ = std::fs::remove_dir_all(&final_dir);
        std::fs::rename(&tmp, &final_dir)
            .map_err(|e| anyhow::anyhow!("cannot move checkpoint into {}: {e}", final_dir.display()))?;
        Ok(final_dir)
    }

    /// Runs steps until `cfg.steps`, calling `on_step` after each.
    pub fn run(&mut self, mut on_step: impl FnMut(&StepMetrics)) -> anyhow::Result<()> {
        while self.step < self.cfg.steps {
            let m = self.step()?;
            on_step(&m);
        }
        Ok(())
    }
}

/// The loss of one `forward_backward` answer: its `loss:sum` metric, or where the server
/// reports none (SkyRL tx 0.3.0 answers `metrics: {}`), the sum of its per-token losses.
fn remote_loss(result: &serde_json::Value) -> f64 {
    if let Some(sum) = result.pointer("/metrics/loss:sum").and_then(serde_json::Value::as_f64) {
        return sum;
    }
    let outputs = result["loss_fn_outputs"].as_array().map(Vec::as_slice).unwrap_or_default();
    outputs
        .iter()
        .filter_map(|o| o.pointer("/elementwise_loss/data").and_then(serde_json::Value::as_array))
        .flatten()
        .filter_map(serde_json::Value::as_f64)
        .sum()
}

/// The newest complete checkpoint folder under `out/checkpoints`, if any.
pub fn latest_checkpoint(out: &Path) -> anyhow::Result<Option<PathBuf>> {
    let dir = out.join("checkpoints");
    let Ok(entries) = std::fs::read_dir(&dir) else { return Ok(None) };
    let mut best: Option<(u64, PathBuf)> = None;
    for e in entries {
        let e = e.map_err(|e| anyhow::anyhow!("cannot list {}: {e}", dir.display()))?;
        let name = e.file_name().to_string_lossy().to_string();
        let Some(n) = name.strip_prefix("step-").and_then(|s| s.parse::<u64>().ok()) else { continue };
        if e.path().join("state.json").is_file() && best.as_ref().is_none_or(|(b, _)| n > *b) {
            best = Some((n, e.path()));
        }
    }
    Ok(best.map(|(_, p)| p))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

fn load_tensors(path: &Path) -> anyhow::Result<std::collections::HashMap<String, Tensor>> {
    candle_core::safetensors::load(path, &candle_core::Device::Cpu)
        .map_err(|e| anyhow::anyhow!("cannot read checkpoint tensors {}: {e}", path.display()))
}
