//! A toy environment with a verifiable reward, small enough for a random-init model to learn
//! in seconds: the learning test of `frognano train` and a smoke test of the whole loop.
//!
//! Each task is a two-line function with one wrong operator, written in a word-level
//! vocabulary of [`VOCAB`]:
//!
//! ```text
//! def add ( a , b ) :
//! return a - b
//! fix
//! ```
//!
//! The policy answers with one token: the operator to put in place of the wrong one. The
//! environment applies that edit to the function's text and runs its tests (pairs of inputs
//! with expected outputs); the reward is 1 iff every test passes. Sampling goes through the
//! real engine ([`frognano_engine::Session`]) with the policy's current inference weights,
//! so the recorded logprobs are the sampler's own, exactly as in agent rollouts.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use frognano_engine::{GenerateRequest, SamplingParams, Scheduler};

use crate::env::{Environment, RolloutConfig};
use crate::rollout::{Outcome, Rollout};

/// The word-level vocabulary; a token id is an index into it.
pub const VOCAB: [&str; 24] = [
    "<eos>", "def", "return", "(", ")", ",", ":", "a", "b", "+", "-", "*", "//", "%", "add", "sub", "mul", "mod",
    "fix", "\n", "max", "min", "x", "y",
];

/// Id of `<eos>`.
pub const EOS: u32 = 0;

/// One toy task: a function whose operator is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct ToyTask {
    /// Function name (a vocabulary word) and task id.
    pub name: &'static str,
    /// The operator the file has.
    pub wrong: &'static str,
    /// `(a, b, expected)` tests.
    pub tests: &'static [(i64, i64, i64)],
}

/// The built-in tasks. Tests are chosen so that exactly one operator passes each task.
pub const TASKS: [ToyTask; 4] = [
    ToyTask { name: "add", wrong: "-", tests: &[(2, 3, 5), (7, 4, 11)] },
    ToyTask { name: "sub", wrong: "+", tests: &[(5, 3, 2), (9, 4, 5)] },
    ToyTask { name: "mul", wrong: "+", tests: &[(3, 4, 12), (5, 6, 30)] },
    ToyTask { name: "mod", wrong: "//", tests: &[(7, 3, 1), (9, 4, 1)] },
];

fn id(word: &str) -> u32 {
    VOCAB.iter().position(|w| *w == word).expect("toy words are in the vocabulary") as u32
}

impl ToyTask {
    /// The function's source text.
    pub fn source(&self) -> String {
        format!("def {} ( a , b ) :\nreturn a {} b\n", self.name, self.wrong)
    }

    /// The prompt: the source's words, then `fix`.
    pub fn prompt(&self) -> Vec<u32> {
        let words = ["def", self.name, "(", "a", ",", "b", ")", ":", "\n", "return", "a", self.wrong, "b", "\n", "fix"];
        words.iter().map(|w| id(w)).collect()
    }

    /// Applies the edit `a WRONG b` → `a ANSWER b` and runs the tests on the edited source.
    pub fn verify(&self, answer: &str) -> bool {
        let edited = self.source().replacen(&format!("a {} b", self.wrong), &format!("a {answer} b"), 1);
        run_tests(&edited, self.tests)
    }
}

/// Interprets `def NAME ( a , b ) :\nreturn a OP b\n` and checks every test; anything that
/// is not such a function (an answer that is not an operator) fails, as a syntax error would.
fn run_tests(source: &str, tests: &[(i64, i64, i64)]) -> bool {
    let Some(body) = source.lines().nth(1) else { return false };
    let words: Vec<&str> = body.split(' ').collect();
    let ["return", "a", op, "b"] = words.as_slice() else { return false };
    tests.iter().all(|&(a, b, want)| {
        let got = match *op {
            "+" => a.checked_add(b),
            "-" => a.checked_sub(b),
            "*" => a.checked_mul(b),
            "//" => (b != 0).then(|| a.div_euclid(b)),
            "%" => (b != 0).then(|| a.rem_euclid(b)),
            _ => None,
        };
        got == Some(want)
    })
}

/// The toy environment over [`TASKS`].
#[derive(Debug, Default, Clone)]
pub struct ToyEnv;

impl ToyEnv {
    fn task(&self, task_id: &str) -> anyhow::Result<&'static ToyTask> {
        TASKS.iter().find(|t| t.name == task_id).ok_or_else(|| {
            anyhow::anyhow!(
                "unknown toy task {task_id:?}; the tasks are {}",
                TASKS.iter().map(|t| t.name).collect::<Vec<_>>().join(", ")
            )
        })
    }
}

impl Environment for ToyEnv {
    fn name(&self) -> String {
        "toy one-token fix".to_string()
    }

    fn task_ids(&self) -> Vec<String> {
        TASKS.iter().map(|t| t.name.to_string()).collect()
    }

    fn rollout(
        &self,
        sampler: &Arc<Scheduler>,
        task_id: &str,
        cfg: &RolloutConfig,
        seed: u64,
    ) -> anyhow::Result<Rollout> {
        let task = self.task(task_id)?;
        let model = sampler.model();
        anyhow::ensure!(
            model.vocab_size() >= VOCAB.len(),
            "the toy environment needs a model with at least {} tokens, this one has {}",
            VOCAB.len(),
            model.vocab_size()
        );
        let started = Instant::now();
        let prompt = task.prompt();
        let req = GenerateRequest {
            sampling: SamplingParams {
                temperature: cfg.temperature,
                top_p: 1.0,
                top_k: 0,
                min_p: 0.0,
                repetition_penalty: 1.0,
                seed: Some(seed),
                ..SamplingParams::default()
            },
            max_tokens: 1,
            stop_ids: vec![EOS],
            top_logprobs: 0,
            checkpoint: None,
        };
        let g = sampler.generate(prompt.clone(), req, |_| ControlFlow::Continue(()))?;
        let choice = g.tokens.first().ok_or_else(|| anyhow::anyhow!("the engine generated no token"))?;
        let answer = VOCAB.get(choice.id as usize).copied().unwrap_or("<unk>");
        let reward = if task.verify(answer) { 1.0 } else { 0.0 };
        let n = prompt.len();
        let mut tokens = prompt;
        tokens.push(choice.id);
        let mut logprobs = vec![0.0; n];
        logprobs.push(choice.logprob);
        let mut weights = vec![0u8; n];
        weights.push(1);
        Ok(Rollout {
            task_id: task_id.to_string(),
            group: 0,
            attempt: 0,
            policy_version: 0,
            seed,
            tokens,
            logprobs,
            weights,
            turn_starts: vec![n],
            exit: "agent".to_string(),
            outcome: Outcome::Scored { reward },
            wall_s: started.elapsed().as_secs_f64(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_one_operator_fixes_each_task() {
        for t in &TASKS {
            let passing: Vec<&str> = VOCAB.iter().copied().filter(|w| t.verify(w)).collect();
            assert_eq!(passing.len(), 1, "{}: {passing:?}", t.name);
            assert!(!t.verify(t.wrong), "{}: the wrong operator must fail", t.name);
        }
        assert!(TASKS[0].verify("+") && TASKS[3].verify("%"));
    }

    #[test]
    fn prompt_is_the_source_in_words() {
        let t = &TASKS[0];
        let text: Vec<&str> = t.prompt().iter().map(|&i| VOCAB[i as usize]).collect();
        assert_eq!(text.concat(), format!("{}fix", t.source().replace(' ', "")));
    }

    #[test]
    fn unknown_task_is_named() {
        let err = ToyEnv.task("div").unwrap_err().to_string();
        assert!(err.contains("\"div\"") && err.contains("add, sub, mul, mod"), "{err}");
    }
}
