//! Rollouts: one agent attempt on one task, recorded token by token.

use serde::{Deserialize, Serialize};

/// How an attempt counts for training and for the curriculum (rl-recipe.md §3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// The agent submitted and the verifier scored it: in the loss and in the estimate.
    Scored {
        /// 1.0 iff the task's tests resolve (partial credit, when enabled, in between).
        reward: f32,
    },
    /// Cut by an agent-side limit (steps, context, time, tokens per turn): out of the loss,
    /// counted as a failure in the pass-rate estimate.
    Limit {
        /// The exit reason (`max_turns`, `max_time`, …).
        reason: String,
    },
    /// Infrastructure trouble (model query, tool, sandbox, verifier) or cancellation: out of
    /// the loss and out of the estimate.
    Infra {
        /// What went wrong.
        reason: String,
    },
}

impl Outcome {
    /// The reward, when the attempt is scored.
    pub fn reward(&self) -> Option<f32> {
        match self {
            Outcome::Scored { reward } => Some(*reward),
            _ => None,
        }
    }
}

/// One attempt as a single training sequence S = prompt₀ ‖ sampled₀ ‖ obs₁ ‖ sampled₁ ‖ …
/// (rl-recipe.md §4). `logprobs` and `weights` are aligned with `tokens`: weight 1 marks a
/// token the policy sampled (its sampling logprob is kept), weight 0 everything the harness
/// wrote (prompt, observations, template glue; logprob 0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rollout {
    /// Task id.
    pub task_id: String,
    /// Group id (one group = the G attempts on one task in one step).
    pub group: u64,
    /// Attempt index within the group.
    pub attempt: u32,
    /// Policy version that sampled it.
    pub policy_version: u64,
    /// Sampling seed.
    pub seed: u64,
    /// The whole token sequence.
    pub tokens: Vec<u32>,
    /// Sampling logprob per token (0 where the weight is 0).
    pub logprobs: Vec<f32>,
    /// Loss mask per token (1 = sampled by the policy).
    pub weights: Vec<u8>,
    /// Start offset of each assistant turn in `tokens`.
    pub turn_starts: Vec<usize>,
    /// The agent's exit reason (`agent`, `max_turns`, …).
    pub exit: String,
    /// How the attempt counts.
    pub outcome: Outcome,
    /// Wall-clock seconds of the attempt (agent + verifier).
    pub wall_s: f64,
}

impl Rollout {
    /// Tokens the policy sampled.
    pub fn sampled_tokens(&self) -> usize {
        self.weights.iter().filter(|&&w| w != 0).count()
    }
}
