//! The `leaf-function-calling` trajectory record: everything a run did, in the Leaf
//! harness's JSON shape, so the ecosystem's tools read ours and we read theirs.

use frognano_protocol::Message;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;

/// The format name written into every trajectory.
pub const FORMAT: &str = "leaf-function-calling";

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitReason {
    /// The model answered without a tool call.
    Agent,
    /// A reply was cut by the per-turn token limit.
    MaxTokensPerTurn,
    /// The context reached its limit.
    MaxContextLen,
    /// `max_steps` steps were used.
    MaxTurns,
    /// The time budget ran out.
    MaxTime,
    /// The model could not be queried (or kept replying malformed tool calls).
    LlmQueryError,
    /// The run was cancelled.
    Cancelled,
    /// Written into checkpoints while the run is still going.
    Running,
}

impl ExitReason {
    /// The snake_case name used in trajectories and summaries.
    pub fn as_str(self) -> &'static str {
        match self {
            ExitReason::Agent => "agent",
            ExitReason::MaxTokensPerTurn => "max_tokens_per_turn",
            ExitReason::MaxContextLen => "max_context_len",
            ExitReason::MaxTurns => "max_turns",
            ExitReason::MaxTime => "max_time",
            ExitReason::LlmQueryError => "llm_query_error",
            ExitReason::Cancelled => "cancelled",
            ExitReason::Running => "running",
        }
    }
}

/// One tool result within a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Tool name.
    pub tool: String,
    /// What the tool returned (as the model saw it).
    pub observation: String,
}

/// One step: the assistant message and the observations its calls produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// 0-based step number.
    pub step: usize,
    /// The assistant message of this step.
    pub assistant: Message,
    /// Tool results, in call order.
    pub observations: Vec<Observation>,
    /// What the step cost (a FrogNano addition, absent in records of other tools and of
    /// older runs; Leaf's readers ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<StepUsage>,
}

/// Tokens and time of one step (`frognano review` shows them per step).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepUsage {
    /// Prompt tokens the model server reported for this step's request (`None`: not reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    /// Tokens generated in this step's reply (`None`: not reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<u64>,
    /// Of the prompt tokens, those whose state was reused instead of computed again (the
    /// conversation so far, in memory or restored from the run's saved states).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    /// Seconds the model took to reply (retries of malformed replies included).
    pub model_sec: f64,
    /// Seconds the step's tool calls ran, together.
    pub tools_sec: f64,
}

/// A whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    /// Always [`FORMAT`].
    pub trajectory_format: String,
    /// Random id of this run.
    pub trajectory_id: String,
    /// The task's id (issue file name, SWE-bench instance id...).
    pub instance_id: String,
    /// Sampling seed.
    pub seed: u64,
    /// Every message, in order (assistant messages keep `reasoning_content`).
    pub messages: Vec<Message>,
    /// The OpenAI tool list offered.
    pub tools: Vec<Value>,
    /// Per-step records.
    pub steps: Vec<Step>,
    /// Steps taken.
    pub n_steps: usize,
    /// Why the run ended.
    pub exit_reason: ExitReason,
    /// Error text for `llm_query_error` and the like.
    pub error: Option<String>,
    /// The last assistant content.
    pub final_message: String,
    /// Context size at the end, in tokens (reported by the model, else estimated).
    pub context_tokens: u64,
    /// Wall-clock seconds.
    pub elapsed_sec: f64,
    /// The workspace diff against the base commit.
    pub output_patch: String,
    /// True for checkpoints written during the run.
    pub partial: bool,
}

impl Trajectory {
    /// Reads a trajectory file; errors name the file and the problem.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read trajectory {}: {e}", path.display()))?;
        let t: Trajectory = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} is not a leaf-function-calling trajectory: {e}", path.display()))?;
        if t.trajectory_format != FORMAT {
            anyhow::bail!("{} has trajectory_format {:?}, expected {FORMAT:?}", path.display(), t.trajectory_format);
        }
        Ok(t)
    }

    /// Writes the trajectory as pretty JSON (via a temporary file, so a reader never sees
    /// half a file).
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(self)?)?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    }
}
