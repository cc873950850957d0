//! Environments: where tasks come from and how one attempt is run and scored.

use std::sync::Arc;
use std::time::Duration;

use frognano_model::CausalLm;

use crate::rollout::Rollout;

/// Limits and sampling of training rollouts. Sampling is raw (temperature 1, no top-p/top-k/
/// min-p by default) so the recorded logprobs are the policy's own (rl-recipe.md §4).
#[derive(Debug, Clone)]
pub struct RolloutConfig {
    /// Sampling temperature (1.0 for training).
    pub temperature: f32,
    /// Tokens per assistant turn at most.
    pub max_tokens_per_turn: usize,
    /// Agent steps at most.
    pub max_steps: usize,
    /// Context limit in tokens.
    pub max_context_tokens: usize,
    /// Wall-clock budget of one attempt.
    pub max_time: Option<Duration>,
    /// Give partial credit (fraction of FAIL_TO_PASS tests passing) instead of 0/1.
    pub partial_credit: bool,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            temperature: 1.0,
            max_tokens_per_turn: 1024,
            max_steps: 30,
            max_context_tokens: 16_384,
            max_time: Some(Duration::from_secs(600)),
            partial_credit: false,
        }
    }
}

/// Which way the task pool should move when the learnability band runs dry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Most tasks are solved: make harder ones.
    Harder,
    /// Most tasks are failed: make easier ones.
    Easier,
}

/// A source of tasks and a way to attempt them.
pub trait Environment: Send + Sync {
    /// Short name for logs.
    fn name(&self) -> String;
    /// Ids of every task currently in the pool.
    fn task_ids(&self) -> Vec<String>;
    /// Runs one attempt of `task_id` with `model` sampling from `seed`, scores it, and
    /// returns the recorded rollout. The caller fills in `group`, `attempt` and
    /// `policy_version`. Infrastructure trouble is reported in the rollout's outcome
    /// ([`crate::rollout::Outcome::Infra`]); `Err` is for bad input (unknown task id).
    fn rollout(&self, model: &Arc<dyn CausalLm>, task_id: &str, cfg: &RolloutConfig, seed: u64)
        -> anyhow::Result<Rollout>;
    /// Asks the task source for about `n` new tasks in `direction`; returns the new ids.
    /// Sources that cannot grow return an empty list.
    fn request_tasks(&mut self, direction: Direction, n: usize) -> anyhow::Result<Vec<String>> {
        let _ = (direction, n);
        Ok(Vec::new())
    }
}
