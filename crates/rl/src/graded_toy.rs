//! A graded toy environment: bug-fix tasks with a difficulty knob, hundreds of them, from
//! easy to impossible for a briefly warm-started tiny policy. It is what the curriculum
//! experiment (docs/train.md, "What the frontier curriculum buys") trains on.
//!
//! A task of **level k** is a session over k files, each a two-line function whose operator
//! is wrong, in the word-level vocabulary [`VOCAB`]:
//!
//! ```text
//! def times ( a , b ) :
//! return a + b
//! fix times
//! ```
//!
//! The files are shown one at a time; after each `fix NAME` the policy answers one token, the
//! operator to put in place of the wrong one, and the next file follows. When all k answers
//! are in, every edit is applied and every function's tests run; the reward is 1 iff all of
//! them pass. The operator a function needs follows from its name, through one of three
//! synonyms per operator (`add`, `plus`, `sum` → `+`, …), so the skill transfers between
//! tasks while a whole level-k task is only solved when all k fixes are right: a policy that
//! gets a single fix right with probability p solves level k with about p^k.
//!
//! Tasks are generated deterministically from [`GradedConfig`]; a fixed, stratified share of
//! every level is held out ([`GradedSplit`]). [`expected_solve_rate`] measures a policy on a
//! task set exactly: the one passing answer sequence is unique, so the solve probability at
//! temperature 1 is the product of the probabilities of its tokens, read off one forward pass.

use std::collections::{BTreeMap, HashSet};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use frognano_engine::{GenerateRequest, SamplingParams, Scheduler};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::env::{Environment, RolloutConfig};
use crate::policy::Policy;
use crate::rollout::{Outcome, Rollout};

/// The operators a fix can put in (`max`/`min` are binary operators in this language).
pub const OPS: [&str; 7] = ["+", "-", "*", "//", "%", "max", "min"];

/// Function names, three synonyms per operator of [`OPS`] (same order).
pub const NAMES: [[&str; 3]; 7] = [
    ["add", "plus", "sum"],
    ["sub", "minus", "diff"],
    ["mul", "times", "prod"],
    ["div", "quot", "ratio"],
    ["mod", "rem", "modulo"],
    ["most", "larger", "upper"],
    ["least", "smaller", "lower"],
];

/// Words of the function template.
const STRUCTURE: [&str; 11] = ["<eos>", "def", "return", "(", ")", ",", ":", "a", "b", "\n", "fix"];

/// The vocabulary size: structure words, then [`OPS`], then [`NAMES`] row by row.
pub const VOCAB_SIZE: usize = STRUCTURE.len() + OPS.len() + 3 * NAMES.len();

/// The word of token id `id` (`None` outside the vocabulary).
pub fn word(id: u32) -> Option<&'static str> {
    let i = id as usize;
    let (s, o) = (STRUCTURE.len(), OPS.len());
    if i < s {
        Some(STRUCTURE[i])
    } else if i < s + o {
        Some(OPS[i - s])
    } else if i < VOCAB_SIZE {
        let n = i - s - o;
        Some(NAMES[n / 3][n % 3])
    } else {
        None
    }
}

fn structure_id(w: &str) -> u32 {
    STRUCTURE.iter().position(|s| *s == w).expect("template words are in the vocabulary") as u32
}

fn op_id(op: usize) -> u32 {
    (STRUCTURE.len() + op) as u32
}

fn name_id(op: usize, synonym: usize) -> u32 {
    (STRUCTURE.len() + OPS.len() + 3 * op + synonym) as u32
}

/// `a OP b` in the toy language; `None` where it is undefined (division by zero, overflow,
/// an unknown operator), which fails a test as an exception would.
pub fn apply_op(op: &str, a: i64, b: i64) -> Option<i64> {
    match op {
        "+" => a.checked_add(b),
        "-" => a.checked_sub(b),
        "*" => a.checked_mul(b),
        "//" => (b != 0).then(|| a.div_euclid(b)),
        "%" => (b != 0).then(|| a.rem_euclid(b)),
        "max" => Some(a.max(b)),
        "min" => Some(a.min(b)),
        _ => None,
    }
}

/// One file of a task: a function whose operator is wrong, and its tests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixSite {
    /// Operator the function should have (index into [`OPS`]).
    pub op: usize,
    /// Which of the operator's three names the function has.
    pub synonym: usize,
    /// The operator the file has (index into [`OPS`], never `op`).
    pub wrong: usize,
    /// `(a, b, expected)` tests; exactly one operator of [`OPS`] passes them all.
    pub tests: Vec<(i64, i64, i64)>,
}

impl FixSite {
    /// The function's name.
    pub fn name(&self) -> &'static str {
        NAMES[self.op][self.synonym]
    }

    /// The file's source text.
    pub fn source(&self) -> String {
        format!("def {} ( a , b ) :\nreturn a {} b\n", self.name(), OPS[self.wrong])
    }

    /// The file shown to the policy, in tokens: the source's words, then `fix NAME` (the
    /// request to fix that function, as an agent's tool call would name it).
    pub fn prompt(&self) -> Vec<u32> {
        let s = structure_id;
        vec![
            s("def"),
            name_id(self.op, self.synonym),
            s("("),
            s("a"),
            s(","),
            s("b"),
            s(")"),
            s(":"),
            s("\n"),
            s("return"),
            s("a"),
            op_id(self.wrong),
            s("b"),
            s("\n"),
            s("fix"),
            name_id(self.op, self.synonym),
        ]
    }

    /// Applies the edit `a WRONG b` → `a ANSWER b` to the source and runs the tests on the
    /// edited function.
    pub fn verify(&self, answer: &str) -> bool {
        let edited = self.source().replacen(&format!("a {} b", OPS[self.wrong]), &format!("a {answer} b"), 1);
        run_function(&edited, &self.tests)
    }
}

/// Interprets `def NAME ( a , b ) :\nreturn a OP b\n` and checks every test; anything else
/// fails, as a syntax error would.
fn run_function(source: &str, tests: &[(i64, i64, i64)]) -> bool {
    let Some(body) = source.lines().nth(1) else { return false };
    let words: Vec<&str> = body.split(' ').collect();
    let ["return", "a", op, "b"] = words.as_slice() else { return false };
    tests.iter().all(|&(a, b, want)| apply_op(op, a, b) == Some(want))
}

/// A graded task: `level` files to fix in one session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GradedTask {
    /// Task id, `lv{level}-{index}`.
    pub id: String,
    /// The difficulty knob: how many fixes the task needs (= `sites.len()`).
    pub level: usize,
    /// The files, in the order they are shown.
    pub sites: Vec<FixSite>,
}

impl GradedTask {
    /// The one answer sequence that passes (the correct operator per file).
    pub fn solution(&self) -> Vec<u32> {
        self.sites.iter().map(|s| op_id(s.op)).collect()
    }

    /// The whole session in tokens with the given answers: file 1, answer 1, file 2, … .
    /// Also returns the positions of the answers.
    pub fn transcript(&self, answers: &[u32]) -> (Vec<u32>, Vec<usize>) {
        let mut tokens = Vec::new();
        let mut at = Vec::new();
        for (site, &ans) in self.sites.iter().zip(answers) {
            tokens.extend(site.prompt());
            at.push(tokens.len());
            tokens.push(ans);
        }
        (tokens, at)
    }

    /// Applies the answers (token ids, one per file) and runs every test; true iff all pass.
    pub fn verify(&self, answers: &[u32]) -> bool {
        answers.len() == self.sites.len()
            && self.sites.iter().zip(answers).all(|(s, &a)| s.verify(word(a).unwrap_or("<unk>")))
    }
}

/// How the task family is generated and split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GradedConfig {
    /// Levels 1..=`max_level` (fixes per task).
    pub max_level: usize,
    /// Tasks generated per level.
    pub tasks_per_level: usize,
    /// Every `held_out_every`-th task of each level (index ≡ −1 mod this) is held out.
    pub held_out_every: usize,
    /// Generator seed.
    pub seed: u64,
}

impl Default for GradedConfig {
    fn default() -> Self {
        GradedConfig { max_level: 6, tasks_per_level: 60, held_out_every: 5, seed: 7 }
    }
}

impl GradedConfig {
    /// Checks the settings; errors name the field.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.max_level >= 1, "max_level must be at least 1, got {}", self.max_level);
        anyhow::ensure!(
            self.held_out_every >= 2,
            "held_out_every must be at least 2 (some tasks must be trained on), got {}",
            self.held_out_every
        );
        anyhow::ensure!(
            self.tasks_per_level >= self.held_out_every,
            "tasks_per_level ({}) must be at least held_out_every ({}) so every level has a held-out task",
            self.tasks_per_level,
            self.held_out_every
        );
        // Level 1 has only 21 names × 6 wrong operators = 126 distinct tasks.
        let distinct_level1 = 3 * NAMES.len() * (OPS.len() - 1);
        anyhow::ensure!(
            self.tasks_per_level <= distinct_level1,
            "tasks_per_level must be at most {distinct_level1} (the distinct level-1 tasks), got {}",
            self.tasks_per_level
        );
        Ok(())
    }

    /// Every task, level by level, deterministic in the config. No two tasks have the same
    /// functions with the same wrong operators in the same order.
    pub fn generate(&self) -> anyhow::Result<Vec<GradedTask>> {
        self.validate()?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(self.seed);
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for level in 1..=self.max_level {
            let mut made = 0;
            while made < self.tasks_per_level {
                let sites: Vec<FixSite> = (0..level).map(|_| random_site(&mut rng)).collect();
                let key: Vec<(usize, usize, usize)> = sites.iter().map(|s| (s.op, s.synonym, s.wrong)).collect();
                if !seen.insert(key) {
                    continue;
                }
                out.push(GradedTask { id: format!("lv{level}-{made:03}"), level, sites });
                made += 1;
            }
        }
        Ok(out)
    }

    /// Whether the task with index `index` within its level is held out.
    pub fn is_held_out(&self, index: usize) -> bool {
        index % self.held_out_every == self.held_out_every - 1
    }

    /// The tasks split into training and held-out sets.
    pub fn split(&self) -> anyhow::Result<GradedSplit> {
        let (mut train, mut held_out) = (Vec::new(), Vec::new());
        for t in self.generate()? {
            let index: usize = t.id.rsplit('-').next().and_then(|i| i.parse().ok()).expect("ids are lv{level}-{index}");
            if self.is_held_out(index) {
                held_out.push(t);
            } else {
                train.push(t);
            }
        }
        Ok(GradedSplit { train, held_out })
    }
}

/// A random function with a wrong operator and tests that only the right operator passes.
fn random_site(rng: &mut impl Rng) -> FixSite {
    let op = rng.random_range(0..OPS.len());
    let synonym = rng.random_range(0..3);
    let mut wrong = rng.random_range(0..OPS.len() - 1);
    if wrong >= op {
        wrong += 1;
    }
    loop {
        let tests: Vec<(i64, i64, i64)> = (0..2)
            .map(|_| {
                let (a, b) = (rng.random_range(6..=30), rng.random_range(2..=9));
                (a, b, apply_op(OPS[op], a, b).expect("the operators are defined on positive inputs"))
            })
            .collect();
        let passing = OPS.iter().filter(|o| tests.iter().all(|&(a, b, want)| apply_op(o, a, b) == Some(want))).count();
        if passing == 1 {
            return FixSite { op, synonym, wrong, tests };
        }
    }
}

/// Training and held-out tasks: disjoint, every level in both.
#[derive(Debug, Clone, PartialEq)]
pub struct GradedSplit {
    /// Tasks the policy trains on.
    pub train: Vec<GradedTask>,
    /// Tasks only measured.
    pub held_out: Vec<GradedTask>,
}

/// The graded toy environment over a set of tasks.
#[derive(Debug, Clone)]
pub struct GradedToyEnv {
    name: String,
    tasks: BTreeMap<String, GradedTask>,
}

impl GradedToyEnv {
    /// An environment over `tasks`, called `name` in logs.
    pub fn new(name: &str, tasks: Vec<GradedTask>) -> GradedToyEnv {
        GradedToyEnv { name: name.to_string(), tasks: tasks.into_iter().map(|t| (t.id.clone(), t)).collect() }
    }

    /// A task by id; the error names it and the id scheme.
    pub fn task(&self, id: &str) -> anyhow::Result<&GradedTask> {
        self.tasks.get(id).ok_or_else(|| {
            anyhow::anyhow!(
                "unknown graded toy task {id:?}: this environment has {} tasks (lv1-000 …)",
                self.tasks.len()
            )
        })
    }
}

/// The seed of turn `turn` of an attempt seeded `seed`.
fn turn_seed(seed: u64, turn: usize) -> u64 {
    let mut x = seed ^ (turn as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 31)
}

impl Environment for GradedToyEnv {
    fn name(&self) -> String {
        format!("graded toy ({})", self.name)
    }

    fn task_ids(&self) -> Vec<String> {
        self.tasks.keys().cloned().collect()
    }

    fn rollout(
        &self,
        sampler: &Arc<Scheduler>,
        task_id: &str,
        cfg: &RolloutConfig,
        seed: u64,
    ) -> anyhow::Result<Rollout> {
        let task = self.task(task_id)?;
        anyhow::ensure!(
            sampler.model().vocab_size() >= VOCAB_SIZE,
            "the graded toy needs a model with at least {VOCAB_SIZE} tokens, this one has {}",
            sampler.model().vocab_size()
        );
        let started = Instant::now();
        let (mut tokens, mut logprobs, mut weights, mut turn_starts, mut answers) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (turn, site) in task.sites.iter().enumerate() {
            let file = site.prompt();
            logprobs.extend(std::iter::repeat_n(0.0, file.len()));
            weights.extend(std::iter::repeat_n(0u8, file.len()));
            tokens.extend(file);
            let req = GenerateRequest {
                sampling: SamplingParams {
                    temperature: cfg.temperature,
                    top_p: 1.0,
                    top_k: 0,
                    min_p: 0.0,
                    repetition_penalty: 1.0,
                    seed: Some(turn_seed(seed, turn)),
                    ..SamplingParams::default()
                },
                max_tokens: 1,
                stop_ids: Vec::new(),
                top_logprobs: 0,
                checkpoint: None,
            };
            // Each turn's prompt extends the previous one, so the scheduler reuses its state.
            let g = sampler.generate(tokens.clone(), req, |_| ControlFlow::Continue(()))?;
            let choice = g.tokens.first().ok_or_else(|| anyhow::anyhow!("the engine generated no token"))?;
            turn_starts.push(tokens.len());
            tokens.push(choice.id);
            logprobs.push(choice.logprob);
            weights.push(1);
            answers.push(choice.id);
        }
        let reward = if task.verify(&answers) { 1.0 } else { 0.0 };
        Ok(Rollout {
            task_id: task_id.to_string(),
            group: 0,
            attempt: 0,
            policy_version: 0,
            seed,
            tokens,
            logprobs,
            weights,
            turn_starts,
            exit: "agent".to_string(),
            outcome: Outcome::Scored { reward },
            wall_s: started.elapsed().as_secs_f64(),
        })
    }
}

/// A policy's exact solve rate at temperature 1 on a task set: overall and per level.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SolveRate {
    /// Mean over the tasks of P(solve).
    pub mean: f64,
    /// `(level, mean P(solve) of that level's tasks)`, levels ascending.
    pub per_level: Vec<(usize, f64)>,
}

/// The probability that one attempt at temperature 1 solves each task, averaged: the
/// passing answer sequence is unique, so P(solve) is the product of the policy's
/// probabilities of the correct answers, each given the files and the correct answers
/// before it, read off one forward pass over the solved transcript.
pub fn expected_solve_rate(policy: &Policy, tasks: &[GradedTask]) -> anyhow::Result<SolveRate> {
    let mut by_level: BTreeMap<usize, (f64, usize)> = BTreeMap::new();
    for t in tasks {
        let (tokens, at) = t.transcript(&t.solution());
        let n = tokens.len();
        let lp: Vec<f32> =
            policy.token_logprobs(&tokens[..n - 1], &tokens[1..])?.to_dtype(candle_core::DType::F32)?.to_vec1()?;
        // Target j is token j + 1.
        let log_p: f64 = at.iter().map(|&i| lp[i - 1] as f64).sum();
        let e = by_level.entry(t.level).or_default();
        e.0 += log_p.exp();
        e.1 += 1;
    }
    let total: f64 = by_level.values().map(|v| v.0).sum();
    let count: usize = by_level.values().map(|v| v.1).sum();
    Ok(SolveRate {
        mean: if count > 0 { total / count as f64 } else { 0.0 },
        per_level: by_level.into_iter().map(|(l, (s, c))| (l, s / c as f64)).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_round_trips() {
        for (op, names) in NAMES.iter().enumerate() {
            assert_eq!(word(op_id(op)), Some(OPS[op]));
            for (s, name) in names.iter().enumerate() {
                assert_eq!(word(name_id(op, s)), Some(*name));
            }
        }
        assert_eq!(word(VOCAB_SIZE as u32), None);
        let all: HashSet<&str> = (0..VOCAB_SIZE as u32).filter_map(word).collect();
        assert_eq!(all.len(), VOCAB_SIZE, "every word is distinct");
    }

    #[test]
    fn the_difficulty_knob_sets_the_number_of_fixes() {
        let cfg = GradedConfig::default();
        let tasks = cfg.generate().unwrap();
        assert_eq!(tasks.len(), cfg.max_level * cfg.tasks_per_level);
        for t in &tasks {
            assert_eq!(t.sites.len(), t.level, "{}", t.id);
            assert!(t.id.starts_with(&format!("lv{}-", t.level)));
            // Exactly one operator passes each file, and the file's own operator fails.
            for s in &t.sites {
                let passing: Vec<&str> = OPS.iter().copied().filter(|o| s.verify(o)).collect();
                assert_eq!(passing, vec![OPS[s.op]], "{}: {}", t.id, s.source());
                assert!(!s.verify(OPS[s.wrong]) && !s.verify("a") && !s.verify(s.name()));
            }
            // The task is solved by its solution and by nothing that differs in one answer.
            let sol = t.solution();
            assert!(t.verify(&sol));
            for i in 0..sol.len() {
                let mut off = sol.clone();
                off[i] = op_id(t.sites[i].wrong);
                assert!(!t.verify(&off), "{}: a wrong answer at file {i} passed", t.id);
            }
            assert!(!t.verify(&sol[..sol.len() - 1]), "too few answers must fail");
        }
        // Same config → same tasks; another seed → other tasks.
        assert_eq!(cfg.generate().unwrap(), tasks);
        assert_ne!(GradedConfig { seed: 8, ..cfg.clone() }.generate().unwrap(), tasks);
    }

    #[test]
    fn transcript_shows_files_one_at_a_time() {
        let t = &GradedConfig::default().generate().unwrap()[GradedConfig::default().tasks_per_level * 2];
        assert_eq!(t.level, 3);
        let (tokens, at) = t.transcript(&t.solution());
        assert_eq!(at, vec![16, 33, 50]);
        let text: Vec<&str> = tokens.iter().map(|&i| word(i).unwrap()).collect();
        let first = text[..17].concat();
        let s = &t.sites[0];
        assert_eq!(first, format!("{}fix{}{}", s.source().replace(' ', ""), s.name(), OPS[s.op]));
    }

    #[test]
    fn held_out_split_is_disjoint_stratified_and_deterministic() {
        let cfg = GradedConfig::default();
        let split = cfg.split().unwrap();
        assert_eq!(split.held_out.len(), cfg.max_level * cfg.tasks_per_level / cfg.held_out_every);
        assert_eq!(split.train.len() + split.held_out.len(), cfg.max_level * cfg.tasks_per_level);
        let train_ids: HashSet<&str> = split.train.iter().map(|t| t.id.as_str()).collect();
        let content = |t: &GradedTask| t.sites.iter().map(|s| (s.op, s.synonym, s.wrong)).collect::<Vec<_>>();
        let train_content: HashSet<Vec<_>> = split.train.iter().map(content).collect();
        for t in &split.held_out {
            assert!(!train_ids.contains(t.id.as_str()), "{} in both", t.id);
            assert!(!train_content.contains(&content(t)), "{} repeats a training task", t.id);
        }
        for level in 1..=cfg.max_level {
            let held = split.held_out.iter().filter(|t| t.level == level).count();
            assert_eq!(held, cfg.tasks_per_level / cfg.held_out_every, "level {level}");
        }
        assert!(split.held_out.iter().all(|t| t.id.ends_with('4') || t.id.ends_with('9')));
        assert_eq!(cfg.split().unwrap(), split);
    }

    #[test]
    fn bad_configs_are_named() {
        let err = |c: GradedConfig| c.generate().unwrap_err().to_string();
        assert!(err(GradedConfig { max_level: 0, ..GradedConfig::default() }).starts_with("max_level"));
        assert!(err(GradedConfig { held_out_every: 1, ..GradedConfig::default() }).starts_with("held_out_every"));
        let e = err(GradedConfig { tasks_per_level: 500, ..GradedConfig::default() });
        assert!(e.contains("at most 126") && e.contains("500"), "{e}");
        let e = err(GradedConfig { tasks_per_level: 3, ..GradedConfig::default() });
        assert!(e.starts_with("tasks_per_level (3)"), "{e}");
        let env = GradedToyEnv::new("t", Vec::new());
        assert!(env.task("lv9-000").unwrap_err().to_string().contains("\"lv9-000\""));
    }
}
