//! Frontier calibration (docs/synthesis.md §10.1): per-task pass-rate estimates from agent
//! attempts, decayed across policy versions, a learnability band, PLR-style sampling, and a
//! controller that turns the out-of-band mass into harder or easier synthesis knobs.

use std::collections::BTreeMap;
use std::path::Path;

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::mutate::OperatorId;

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lifecycle {
    /// Never attempted.
    New,
    /// Attempted; in the pool.
    Active,
    /// Solved nearly always: kept only for a replay slice.
    RetiredSolved,
    /// Never solved after many attempts: source for easier variants.
    RetiredUnsolvable,
    /// Verifier gave different results for identical reruns.
    Quarantined,
}

/// The pass-rate estimate of one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskEstimate {
    /// Decayed successes.
    pub successes: f64,
    /// Decayed failures.
    pub failures: f64,
    /// Policy version of the last update.
    pub version: u64,
    /// Lifecycle state.
    pub state: Lifecycle,
    /// Knob level ([`Knobs::level`]) the task was generated at, when known.
    #[serde(default)]
    pub level: Option<usize>,
}

impl Default for TaskEstimate {
    fn default() -> Self {
        TaskEstimate { successes: 0.0, failures: 0.0, version: 0, state: Lifecycle::New, level: None }
    }
}

impl TaskEstimate {
    /// Beta(1,1) posterior mean of the pass rate.
    pub fn p_hat(&self) -> f64 {
        (self.successes + 1.0) / (self.successes + self.failures + 2.0)
    }

    /// Effective number of attempts.
    pub fn n(&self) -> f64 {
        self.successes + self.failures
    }

    /// Learnability p(1−p).
    pub fn learnability(&self) -> f64 {
        let p = self.p_hat();
        p * (1.0 - p)
    }
}

/// Controller parameters (defaults from the design doc; the band from issue 7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrontierConfig {
    /// Lower band edge.
    pub band_low: f64,
    /// Upper band edge.
    pub band_high: f64,
    /// Decay per policy version.
    pub gamma: f64,
    /// Attempts before a task counts toward band mass.
    pub min_attempts: f64,
    /// Batch size B.
    pub batch: usize,
    /// Share of a batch reserved for new tasks.
    pub new_share: f64,
    /// Staleness mixing weight λ.
    pub staleness_mix: f64,
    /// Retire as solved at p̂ ≥ this …
    pub solved_p: f64,
    /// … with at least this many attempts.
    pub solved_n: f64,
    /// Retire as unsolvable at p̂ ≤ this …
    pub unsolvable_p: f64,
    /// … with at least this many attempts.
    pub unsolvable_n: f64,
    /// Sharpness of the learnability weighting: active tasks are drawn in proportion to
    /// (p̂(1−p̂))^focus. 1 (the default) is PLR's soft weighting, under which tasks far from
    /// the band still take a large share of a batch (the tasks below and above it
    /// outnumber those inside); higher values concentrate the batch inside the band.
    #[serde(default = "FrontierConfig::default_focus")]
    pub focus: f64,
}

impl FrontierConfig {
    fn default_focus() -> f64 {
        1.0
    }
}

impl Default for FrontierConfig {
    fn default() -> Self {
        FrontierConfig {
            band_low: 0.2,
            band_high: 0.8,
            gamma: 0.7,
            min_attempts: 4.0,
            batch: 8,
            new_share: 0.25,
            staleness_mix: 0.1,
            solved_p: 0.95,
            solved_n: 16.0,
            unsolvable_p: 0.02,
            unsolvable_n: 32.0,
            focus: 1.0,
        }
    }
}

/// Estimates for every task, keyed by instance id; saved as JSON and reused online.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EstimateStore {
    /// Per-task estimates.
    pub tasks: BTreeMap<String, TaskEstimate>,
}

impl EstimateStore {
    /// Loads `path`, or an empty store when it does not exist.
    pub fn load(path: &Path) -> anyhow::Result<EstimateStore> {
        if !path.exists() {
            return Ok(EstimateStore::default());
        }
        let text = std::fs::read_to_string(path)?;
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: not an estimate store: {e}", path.display()))
    }

    /// Writes the store atomically.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(self)?)?;
        std::fs::rename(tmp, path)?;
        Ok(())
    }

    /// Registers a task as `new` if unknown.
    pub fn add_task(&mut self, id: &str) {
        self.tasks.entry(id.to_string()).or_default();
    }

    /// Adds one group of attempt rewards for `id` at policy `version`: old counts decay by
    /// γ^(version − last version) first; lifecycle transitions follow.
    pub fn update(&mut self, id: &str, rewards: &[bool], version: u64, cfg: &FrontierConfig) {
        let e = self.tasks.entry(id.to_string()).or_default();
        let age = version.saturating_sub(e.version) as i32;
        let decay = cfg.gamma.powi(age);
        e.successes *= decay;
        e.failures *= decay;
        e.version = version;
        for &r in rewards {
            if r {
                e.successes += 1.0;
            } else {
                e.failures += 1.0;
            }
        }
        if e.state == Lifecycle::Quarantined {
            return;
        }
        let (p, n) = (e.p_hat(), e.n());
        e.state = if p >= cfg.solved_p && n >= cfg.solved_n {
            Lifecycle::RetiredSolved
        } else if p <= cfg.unsolvable_p && n >= cfg.unsolvable_n {
            Lifecycle::RetiredUnsolvable
        } else {
            Lifecycle::Active
        };
    }

    /// Registers a task generated at knob `level` (as `new` if unknown).
    pub fn add_task_at_level(&mut self, id: &str, level: usize) {
        self.tasks.entry(id.to_string()).or_default().level = Some(level);
    }

    /// Mean p̂ and count of the calibrated (n ≥ min_attempts, not quarantined) tasks
    /// generated at `level`.
    pub fn level_pass_rate(&self, level: usize, cfg: &FrontierConfig) -> Option<(f64, usize)> {
        let ps: Vec<f64> = self
            .tasks
            .values()
            .filter(|e| e.level == Some(level) && e.n() >= cfg.min_attempts && e.state != Lifecycle::Quarantined)
            .map(TaskEstimate::p_hat)
            .collect();
        (!ps.is_empty()).then(|| (ps.iter().sum::<f64>() / ps.len() as f64, ps.len()))
    }

    /// The controller: the knobs to generate with next. Tasks made at the current knobs
    /// that are mostly too easy (mean p̂ above the band) → one step harder; too hard → one
    /// step easier; in the band or not yet measured → unchanged.
    pub fn next_knobs(&self, current: Knobs, cfg: &FrontierConfig) -> Knobs {
        match self.level_pass_rate(current.level(), cfg) {
            Some((p, _)) if p > cfg.band_high => current.step(Direction::Harder),
            Some((p, _)) if p < cfg.band_low => current.step(Direction::Easier),
            _ => current,
        }
    }

    /// Marks a task whose verifier disagreed with itself.
    pub fn quarantine(&mut self, id: &str) {
        self.tasks.entry(id.to_string()).or_default().state = Lifecycle::Quarantined;
    }

    /// Where the active pool stands relative to the band.
    pub fn band_report(&self, cfg: &FrontierConfig) -> BandReport {
        let mut r = BandReport::default();
        for e in self.tasks.values() {
            match e.state {
                Lifecycle::New => r.new += 1,
                Lifecycle::Active if e.n() >= cfg.min_attempts => {
                    let p = e.p_hat();
                    if p < cfg.band_low {
                        r.below += 1;
                    } else if p > cfg.band_high {
                        r.above += 1;
                    } else {
                        r.in_band += 1;
                    }
                }
                Lifecycle::Active => r.calibrating += 1,
                Lifecycle::RetiredSolved => r.above += 1,
                Lifecycle::RetiredUnsolvable => r.below += 1,
                Lifecycle::Quarantined => r.quarantined += 1,
            }
        }
        let target = 4 * cfg.batch;
        r.direction = if r.in_band >= target {
            Direction::Hold
        } else if r.above > r.below {
            Direction::Harder
        } else if r.below > r.above {
            Direction::Easier
        } else {
            Direction::Hold
        };
        r.request = if r.in_band >= target { 0 } else { 2 * cfg.batch };
        r
    }

    /// Samples up to `cfg.batch` task ids without replacement: a reserved share of `new`
    /// tasks, the rest weighted by p(1−p) mixed with staleness (PLR).
    pub fn sample_batch(&self, cfg: &FrontierConfig, version: u64, rng: &mut impl Rng) -> Vec<String> {
        let mut out = Vec::new();
        let new: Vec<&String> = self.tasks.iter().filter(|(_, e)| e.state == Lifecycle::New).map(|(k, _)| k).collect();
        let n_new = ((cfg.batch as f64 * cfg.new_share).round() as usize).min(new.len());
        let mut new_pool = new.clone();
        for _ in 0..n_new {
            let i = rng.random_range(0..new_pool.len());
            out.push(new_pool.swap_remove(i).clone());
        }
        let mut pool: Vec<(&String, &TaskEstimate)> =
            self.tasks.iter().filter(|(_, e)| e.state == Lifecycle::Active).collect();
        while out.len() < cfg.batch && !pool.is_empty() {
            let learn = |e: &TaskEstimate| e.learnability().powf(cfg.focus);
            let lsum: f64 = pool.iter().map(|(_, e)| learn(e)).sum::<f64>().max(1e-12);
            let ssum: f64 = pool.iter().map(|(_, e)| version.saturating_sub(e.version) as f64).sum();
            let weights: Vec<f64> = pool
                .iter()
                .map(|(_, e)| {
                    let stale = if ssum > 0.0 { version.saturating_sub(e.version) as f64 / ssum } else { 0.0 };
                    (1.0 - cfg.staleness_mix) * learn(e) / lsum + cfg.staleness_mix * stale
                })
                .collect();
            let total: f64 = weights.iter().sum();
            let mut x = rng.random::<f64>() * total;
            let mut pick = pool.len() - 1;
            for (i, w) in weights.iter().enumerate() {
                if x < *w {
                    pick = i;
                    break;
                }
                x -= w;
            }
            out.push(pool.swap_remove(pick).0.clone());
        }
        // Fill with remaining new tasks when the active pool is small.
        for id in new_pool {
            if out.len() >= cfg.batch {
                break;
            }
            out.push(id.clone());
        }
        out
    }
}

/// Which way the synthesiser should move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Enough tasks in the band.
    #[default]
    Hold,
    /// Too many easy tasks.
    Harder,
    /// Too many hard tasks.
    Easier,
}

/// The pool relative to the band.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BandReport {
    /// Active tasks with enough attempts and p̂ in the band (the band mass).
    pub in_band: usize,
    /// Above the band (or retired solved).
    pub above: usize,
    /// Below the band (or retired unsolvable).
    pub below: usize,
    /// Attempted too few times to count.
    pub calibrating: usize,
    /// Never attempted.
    pub new: usize,
    /// Quarantined.
    pub quarantined: usize,
    /// Where to move generation.
    pub direction: Direction,
    /// New tasks to ask for.
    pub request: usize,
}

/// The synthesis knobs the controller turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Knobs {
    /// Validated bugs combined per task (1 = single bug).
    pub combine: usize,
    /// Use the strong (removal / control-flow / class) operators.
    pub strong_operators: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs { combine: 1, strong_operators: false }
    }
}

impl Knobs {
    /// A difficulty level 0..=7 (for ordering and simulation).
    pub fn level(&self) -> usize {
        (self.combine.saturating_sub(1)) * 2 + usize::from(self.strong_operators)
    }

    /// From a level (inverse of [`Knobs::level`], clamped to combine ≤ 4).
    pub fn from_level(level: usize) -> Knobs {
        let level = level.min(7);
        Knobs { combine: level / 2 + 1, strong_operators: level % 2 == 1 }
    }

    /// One step in `direction`.
    pub fn step(&self, direction: Direction) -> Knobs {
        match direction {
            Direction::Hold => *self,
            Direction::Harder => Knobs::from_level(self.level() + 1),
            Direction::Easier => Knobs::from_level(self.level().saturating_sub(1)),
        }
    }

    /// The operators these knobs use: the strong (removal / control-flow / class) ones, or
    /// the operator-level ones.
    pub fn operators(&self) -> Vec<OperatorId> {
        use OperatorId::*;
        if self.strong_operators {
            vec![
                CtrlInvertIf,
                CtrlShuffle,
                RemoveLoop,
                RemoveCond,
                RemoveAssign,
                RemoveWrapper,
                ClassRmFuncs,
                ClassRmBase,
            ]
        } else {
            vec![OpChange, OpSwap, OpFlip, OpChangeConst, OpBreakChains]
        }
    }

    /// `SynthOptions::combine` for these knobs: the bugs combined per task, 0 for single bugs.
    pub fn combine_option(&self) -> usize {
        if self.combine >= 2 {
            self.combine
        } else {
            0
        }
    }

    /// The `frognano synth` flags these knobs stand for (for people to read and paste).
    pub fn synth_flags(&self) -> String {
        let ops: Vec<&str> = self.operators().iter().map(|o| o.short_name()).collect();
        let mut s = format!("--operators {}", ops.join(","));
        if self.combine >= 2 {
            s.push_str(&format!(" --combine {}", self.combine));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knobs_name_operators_that_synth_accepts() {
        for level in 0..=7 {
            let k = Knobs::from_level(level);
            let flags = k.synth_flags();
            let names = flags.split_whitespace().nth(1).unwrap();
            let parsed: Vec<OperatorId> = names.split(',').filter_map(OperatorId::parse).collect();
            assert_eq!(parsed, k.operators(), "{flags}");
            assert_eq!(k.combine_option(), if k.combine >= 2 { k.combine } else { 0 });
        }
        assert!(Knobs::default().synth_flags().contains("flip_operators"));
    }
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn estimates_decay_with_policy_versions_and_retire() {
        let cfg = FrontierConfig::default();
        let mut s = EstimateStore::default();
        s.update("a", &[true, true, false, false], 0, &cfg);
        assert!((s.tasks["a"].p_hat() - 0.5).abs() < 1e-9);
        s.update("a", &[true; 4], 2, &cfg);
        let e = &s.tasks["a"];
        assert!((e.successes - (2.0 * 0.49 + 4.0)).abs() < 1e-9 && (e.failures - 0.98).abs() < 1e-9);
        s.update("b", &[true; 20], 0, &cfg);
        assert_eq!(s.tasks["b"].state, Lifecycle::RetiredSolved);
        s.update("c", &[false; 60], 0, &cfg);
        assert_eq!(s.tasks["c"].state, Lifecycle::RetiredUnsolvable);
    }

    #[test]
    fn sampling_prefers_learnable_tasks_and_reserves_new_ones() {
        let cfg = FrontierConfig { batch: 4, ..Default::default() };
        let mut s = EstimateStore::default();
        s.update("easy", &[true; 12], 1, &cfg);
        s.update("mid", &[true, false, true, false, true, false], 1, &cfg);
        s.update("hard", &[false; 12], 1, &cfg);
        s.add_task("fresh");
        let mut rng = StdRng::seed_from_u64(1);
        let mut mid_first = 0;
        for _ in 0..200 {
            let b = s.sample_batch(&FrontierConfig { batch: 2, ..cfg.clone() }, 1, &mut rng);
            assert!(b.contains(&"fresh".to_string()), "{b:?}");
            mid_first += usize::from(b.contains(&"mid".to_string()));
        }
        assert!(mid_first > 100, "mid sampled {mid_first}/200");
    }

    /// A simulated policy whose success probability falls with the knob level; the
    /// controller must move generation until the pool's mass lies in the band.
    #[test]
    fn controller_converges_into_the_band_against_a_simulated_policy() {
        for (start, skill) in [(0usize, 3.0f64), (7, 1.0), (0, 6.0)] {
            let cfg = FrontierConfig { batch: 4, ..Default::default() };
            let true_p = |level: usize| 1.0 / (1.0 + (level as f64 - skill).exp());
            let mut rng = StdRng::seed_from_u64(7);
            let mut store = EstimateStore::default();
            let mut levels: BTreeMap<String, usize> = BTreeMap::new();
            let mut knobs = Knobs::from_level(start);
            let mut next_id = 0;
            for version in 0..60u64 {
                let report = store.band_report(&cfg);
                knobs = store.next_knobs(knobs, &cfg);
                for _ in 0..report.request.min(8) {
                    let id = format!("t{next_id}");
                    next_id += 1;
                    // A generated task's true difficulty varies ±1 level around the knobs.
                    let lvl = (knobs.level() as i64 + rng.random_range(-1..=1)).clamp(0, 7) as usize;
                    levels.insert(id.clone(), lvl);
                    store.add_task_at_level(&id, knobs.level());
                }
                for id in store.sample_batch(&cfg, version, &mut rng) {
                    let p = true_p(levels[&id]);
                    let rewards: Vec<bool> = (0..8).map(|_| rng.random_bool(p)).collect();
                    store.update(&id, &rewards, version, &cfg);
                }
            }
            let report = store.band_report(&cfg);
            assert!(report.in_band >= 4 * cfg.batch, "start {start} skill {skill}: {report:?}");
            // Generation ends near the level whose true pass rate is in the band.
            let p = true_p(knobs.level());
            assert!((0.1..=0.9).contains(&p), "start {start} skill {skill}: knobs {knobs:?} p {p}");
        }
    }
}
