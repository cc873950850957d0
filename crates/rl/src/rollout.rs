//! Rollouts: one agent attempt on one task, recorded token by token.

use frognano_engine::TurnRecord;
use serde::{Deserialize, Serialize};

/// How an attempt counts for training and for the curriculum (docs/rl.md §3).
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
/// (docs/rl.md §4). `logprobs` and `weights` are aligned with `tokens`: weight 1 marks a
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

/// The training sequence of one attempt, built from the engine's turn records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sequence {
    /// S = prompt₀ ‖ sampled₀ ‖ obs₁ ‖ sampled₁ ‖ …
    pub tokens: Vec<u32>,
    /// Sampling logprob per token (0 where the weight is 0).
    pub logprobs: Vec<f32>,
    /// 1 on sampled tokens (the closing end-of-turn token included), 0 elsewhere.
    pub weights: Vec<u8>,
    /// Start offset of each turn's sampled tokens.
    pub turn_starts: Vec<usize>,
}

/// The reason given when a turn's prompt does not extend everything before it.
pub const PREFIX_BROKEN: &str = "prefix property broken";

/// Builds S from `turns`, checking the prefix property per turn: turn k's prompt must start
/// with everything before it (the previous prompts, the sampled tokens and observations).
/// On a break the error names the turn and the first differing position, and the sequence
/// built so far (a valid prefix) comes with it.
///
/// **Design:** a broken prefix is not repaired into per-turn data (SkyRL's step-wise
/// training); the rollout is reported as [`Outcome::Infra`] with [`PREFIX_BROKEN`], so it is
/// visible in the store and the metrics and stays out of the loss and the estimates. With the
/// recording engine's token continuation the property holds by construction for append-only
/// templates, so a break signals template drift worth looking at rather than routine data.
pub fn build_sequence(turns: &[TurnRecord]) -> Result<Sequence, (String, Sequence)> {
    let mut s = Sequence::default();
    for (k, turn) in turns.iter().enumerate() {
        if turn.sampled_ids.len() != turn.logprobs.len() {
            let why = format!("turn {k}: {} sampled ids but {} logprobs", turn.sampled_ids.len(), turn.logprobs.len());
            return Err((why, s));
        }
        if !turn.prompt_ids.starts_with(&s.tokens) {
            let at = s.tokens.iter().zip(&turn.prompt_ids).take_while(|(a, b)| a == b).count();
            let why = format!(
                "{PREFIX_BROKEN} at turn {k}: its prompt ({} tokens) departs from the {} tokens before it at position {at}",
                turn.prompt_ids.len(),
                s.tokens.len()
            );
            return Err((why, s));
        }
        let new = &turn.prompt_ids[s.tokens.len()..];
        s.tokens.extend_from_slice(new);
        s.logprobs.extend(std::iter::repeat_n(0.0, new.len()));
        s.weights.extend(std::iter::repeat_n(0, new.len()));
        s.turn_starts.push(s.tokens.len());
        s.tokens.extend_from_slice(&turn.sampled_ids);
        s.logprobs.extend_from_slice(&turn.logprobs);
        s.weights.extend(std::iter::repeat_n(1, turn.sampled_ids.len()));
    }
    Ok(s)
}

/// How an agent exit reason counts (docs/rl.md §3): `agent` goes to the verifier (`None`),
/// limit exits are [`Outcome::Limit`], everything else is [`Outcome::Infra`].
pub fn outcome_of_exit(exit: &str, error: Option<&str>) -> Option<Outcome> {
    match exit {
        "agent" => None,
        "max_turns" | "max_time" | "max_context_len" | "max_tokens_per_turn" => {
            Some(Outcome::Limit { reason: exit.to_string() })
        }
        other => Some(Outcome::Infra {
            reason: match error {
                Some(e) if !e.is_empty() => format!("{other}: {e}"),
                _ => other.to_string(),
            },
        }),
    }
}

impl Rollout {
    /// A rollout of `task_id` from recorded `turns`: S is built with [`build_sequence`]; a
    /// broken prefix overrides `outcome` with [`Outcome::Infra`] (the tokens then hold the
    /// valid prefix). `group`, `attempt` and `policy_version` are left 0 for the caller.
    pub fn from_turns(
        task_id: &str,
        seed: u64,
        turns: &[TurnRecord],
        exit: &str,
        outcome: Outcome,
        wall_s: f64,
    ) -> Rollout {
        let (seq, outcome) = match build_sequence(turns) {
            Ok(seq) => (seq, outcome),
            Err((reason, seq)) => (seq, Outcome::Infra { reason }),
        };
        Rollout {
            task_id: task_id.to_string(),
            group: 0,
            attempt: 0,
            policy_version: 0,
            seed,
            tokens: seq.tokens,
            logprobs: seq.logprobs,
            weights: seq.weights,
            turn_starts: seq.turn_starts,
            exit: exit.to_string(),
            outcome,
            wall_s,
        }
    }

    /// Whether the rollout goes into the loss (scored; limit and infra exits are masked).
    pub fn trainable(&self) -> bool {
        matches!(self.outcome, Outcome::Scored { .. })
    }
}
