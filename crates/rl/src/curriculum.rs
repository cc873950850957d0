//! Which tasks a training step attempts: a thin layer over `frognano-synth`'s frontier
//! controller ([`frognano_synth::calibrate`]: decayed counts, p̂, band, PLR sampling,
//! retire/quarantine; docs/synthesis.md §10.1), plus a uniform baseline that samples without
//! looking at p̂ but keeps the same estimates, so both runs report the same metrics.
//!
//! Accounting (docs/rl.md §3): a scored attempt counts as a success iff its reward is 1
//! (resolved; partial credit below 1 is a failure for the estimate), a limit exit counts as a
//! failure, an infrastructure exit is not counted at all.

use std::path::Path;

use anyhow::Context;
use frognano_synth::calibrate::{self, BandReport, EstimateStore, FrontierConfig, Lifecycle, TaskEstimate};
use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::env::Direction;
use crate::rollout::Outcome;

/// How tasks are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SamplingMode {
    /// By learnability p̂(1−p̂) with a reserved share for new tasks and a staleness mix.
    Frontier,
    /// Uniformly among the tasks not quarantined.
    Uniform,
}

/// The curriculum: estimates per task and how to draw from them. Saved as JSON for resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Curriculum {
    /// Sampling mode.
    pub mode: SamplingMode,
    /// Controller parameters (band, decay, shares, retire thresholds).
    pub config: FrontierConfig,
    /// Per-task estimates.
    pub estimates: EstimateStore,
}

/// One step's curriculum figures for the metrics log.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CurriculumMetrics {
    /// The pool relative to the band (band mass = `in_band`).
    pub band: BandReport,
    /// Counts of attempted tasks by p̂ in ten bins [0, 0.1), …, [0.9, 1].
    pub histogram: [usize; 10],
    /// Tasks known.
    pub tasks: usize,
}

impl Curriculum {
    /// Frontier sampling with `config`.
    pub fn frontier(config: FrontierConfig) -> Curriculum {
        Curriculum { mode: SamplingMode::Frontier, config, estimates: EstimateStore::default() }
    }

    /// Uniform sampling (estimates still kept with the default parameters).
    pub fn uniform() -> Curriculum {
        Curriculum {
            mode: SamplingMode::Uniform,
            config: FrontierConfig::default(),
            estimates: EstimateStore::default(),
        }
    }

    /// Starts from existing estimates (`frognano synth calibrate`'s `estimates.json`).
    pub fn with_estimates(mut self, estimates: EstimateStore) -> Curriculum {
        self.estimates = estimates;
        self
    }

    /// Registers tasks not seen before as `new`.
    pub fn add_tasks<S: AsRef<str>>(&mut self, ids: &[S]) {
        for id in ids {
            self.estimates.add_task(id.as_ref());
        }
    }

    /// Registers a task generated at knob level `level` (see [`calibrate::Knobs::level`]).
    pub fn add_task_at_level(&mut self, id: &str, level: usize) {
        self.estimates.add_task_at_level(id, level);
    }

    /// The estimate of one task.
    pub fn estimate(&self, id: &str) -> Option<&TaskEstimate> {
        self.estimates.tasks.get(id)
    }

    /// Up to `batch` distinct task ids for policy `version`.
    pub fn sample(&self, batch: usize, version: u64, rng: &mut impl Rng) -> Vec<String> {
        match self.mode {
            SamplingMode::Frontier => {
                let cfg = FrontierConfig { batch, ..self.config.clone() };
                self.estimates.sample_batch(&cfg, version, rng)
            }
            SamplingMode::Uniform => {
                let mut pool: Vec<&String> = self
                    .estimates
                    .tasks
                    .iter()
                    .filter(|(_, e)| e.state != Lifecycle::Quarantined)
                    .map(|(id, _)| id)
                    .collect();
                pool.shuffle(rng);
                pool.into_iter().take(batch).cloned().collect()
            }
        }
    }

    /// Adds one group's outcomes for `task_id` at policy `version`: reward 1 is a success,
    /// a lower reward or a limit exit a failure, infrastructure exits are skipped (a group of
    /// only those leaves the estimate untouched).
    pub fn record(&mut self, task_id: &str, outcomes: &[Outcome], version: u64) {
        let rewards: Vec<bool> = outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Scored { reward } => Some(*reward >= 1.0),
                Outcome::Limit { .. } => Some(false),
                Outcome::Infra { .. } => None,
            })
            .collect();
        if rewards.is_empty() {
            self.estimates.add_task(task_id);
            return;
        }
        self.estimates.update(task_id, &rewards, version, &self.config);
    }

    /// Takes a task out of sampling (its verifier disagreed with itself).
    pub fn quarantine(&mut self, task_id: &str) {
        self.estimates.quarantine(task_id);
    }

    /// Where the pool stands relative to the band.
    pub fn band_report(&self) -> BandReport {
        self.estimates.band_report(&self.config)
    }

    /// Counts of attempted (n > 0), not quarantined tasks by p̂ in ten bins.
    pub fn histogram(&self) -> [usize; 10] {
        let mut h = [0usize; 10];
        for e in self.estimates.tasks.values().filter(|e| e.n() > 0.0 && e.state != Lifecycle::Quarantined) {
            h[((e.p_hat() * 10.0) as usize).min(9)] += 1;
        }
        h
    }

    /// Mean p̂ of `ids` (e.g. the tasks of a batch); `None` for none known.
    pub fn mean_p_hat<S: AsRef<str>>(&self, ids: &[S]) -> Option<f64> {
        let ps: Vec<f64> = ids.iter().filter_map(|id| self.estimate(id.as_ref())).map(TaskEstimate::p_hat).collect();
        (!ps.is_empty()).then(|| ps.iter().sum::<f64>() / ps.len() as f64)
    }

    /// The figures for one step's metrics.
    pub fn metrics(&self) -> CurriculumMetrics {
        CurriculumMetrics { band: self.band_report(), histogram: self.histogram(), tasks: self.estimates.tasks.len() }
    }

    /// Whether to ask the environment for more tasks, which way and how many: when the
    /// band mass is below 4·B and the out-of-band mass leans one way (frontier mode only;
    /// the uniform baseline keeps its pool fixed). Not while the tasks of an earlier request
    /// are still being measured (at least as many `new` or calibrating tasks as would be
    /// asked for), so one shortage does not turn the synthesis knobs several steps at once.
    pub fn needs_tasks(&self) -> Option<(Direction, usize)> {
        if self.mode == SamplingMode::Uniform {
            return None;
        }
        let r = self.band_report();
        match r.direction {
            _ if r.request == 0 || r.new + r.calibrating >= r.request => None,
            calibrate::Direction::Harder => Some((Direction::Harder, r.request)),
            calibrate::Direction::Easier => Some((Direction::Easier, r.request)),
            calibrate::Direction::Hold => None,
        }
    }

    /// Writes the curriculum as JSON (atomically).
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(())
    }

    /// Reads a curriculum written by [`Curriculum::save`].
    pub fn load(path: &Path) -> anyhow::Result<Curriculum> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{} is not a saved curriculum: {e}", path.display()))
    }
}
