//! What a `frognano solve` output directory holds, by name, and `run.json`: where the run
//! started (repository, base commit), who answered, and the run it continues, so that
//! `frognano review` can apply the patch to the right repository and send a run back to the
//! same model. `docs/review.md` §1 lists the files.

use crate::solve::ModelChoice;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The trajectory (`leaf-function-calling`; a partial checkpoint while the run goes on).
pub const TRAJECTORY: &str = "trajectory.json";
/// The patch, exact bytes (empty when nothing changed).
pub const PATCH: &str = "patch.diff";
/// The human summary.
pub const SUMMARY: &str = "summary.md";
/// [`RunInfo`].
pub const RUN_INFO: &str = "run.json";
/// The review decisions, one JSON object a line (written by `frognano review`).
pub const REVIEW_LOG: &str = "review.jsonl";
/// The in-process model's conversation states (`frognano_engine::persist`): a run continued
/// later (`solve --continue-from`) starts from them instead of prefilling its history again.
pub const STATE_DIR: &str = "state";
/// The most bytes of states a run keeps in [`STATE_DIR`] (older turns' recurrent states go
/// first; the keys and values of the conversation are kept once).
pub const STATE_BUDGET: u64 = 2 << 30;

/// The format name written into every `run.json`.
pub const RUN_INFO_FORMAT: &str = "frognano-run";

/// `run.json`: the facts about a run that the trajectory (Leaf's shape) has no field for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Always [`RUN_INFO_FORMAT`].
    pub format: String,
    /// The task's id.
    pub instance_id: String,
    /// The user's repository (canonical path); the patch applies here.
    pub repo: PathBuf,
    /// The commit the workspace was cloned at.
    pub base_commit: String,
    /// Who answered, in words (`EngineLlm(…)`, `http://…`, `replay of …`).
    pub model: String,
    /// Who answered, as `frognano solve` chose it (a run sent back goes to the same one).
    pub model_choice: ModelChoice,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix: u64,
    /// The run this one continues (`frognano solve --continue-from`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentRun>,
    /// How the in-process model stored attention keys and values (`--kv-cache`: `f16`,
    /// `q8_0`, `q4_0`), when it was not the default; a continued run uses the same type, so
    /// the states in [`STATE_DIR`] apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<String>,
}

/// The run a continued run goes on from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentRun {
    /// The parent's output directory, as given.
    pub dir: PathBuf,
    /// The parent's trajectory id.
    pub trajectory_id: String,
    /// Steps taken over from the parent (the new run's own steps come after them).
    pub steps: usize,
    /// The reviewer's comment: the user message the new run starts with.
    pub comment: String,
}

impl RunInfo {
    /// Reads `dir/run.json`; errors name the file and the problem.
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join(RUN_INFO);
        let text =
            std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let info: RunInfo = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} is not a frognano run.json: {e}", path.display()))?;
        if info.format != RUN_INFO_FORMAT {
            anyhow::bail!("{} has format {:?}, expected {RUN_INFO_FORMAT:?}", path.display(), info.format);
        }
        Ok(info)
    }

    /// Writes `dir/run.json` (through a temporary file, so a reader never sees half of it).
    pub fn save(&self, dir: &Path) -> anyhow::Result<()> {
        let path = dir.join(RUN_INFO);
        let tmp = dir.join(format!("{RUN_INFO}.tmp"));
        std::fs::write(&tmp, serde_json::to_string_pretty(self)?)?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
