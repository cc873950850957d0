//! # frognano-engine
//!
//! Prompts in, tokens out: [`sampler`] (temperature, top-k, top-p, min-p, repetition
//! penalty, seeds, log-probabilities) and [`session`] (state kept across calls so a
//! conversation only runs its new tokens; recurrent-state snapshots for hybrid models;
//! [`Session::start`] + [`decode_step`] to decode many sessions in one batched forward),
//! [`scheduler`] (one thread per model that batches every caller's decode steps, routes
//! requests to the session holding their prefix and forks shared prefixes), and [`llm`]:
//! [`EngineLlm`], the in-process implementation of `frognano_protocol::Llm` (chat template
//! in, tool calls out through the protocol's codec; one session across a whole
//! conversation; optional token-level recording of each turn for RL, [`TurnRecord`]).
//! [`constraint`] and [`tool_grammar`]: grammar-constrained decoding with llguidance (JSON
//! schemas, any JSON object, Lark grammars, tool calls in a model's own format), its masks
//! computed on a helper thread while the forward pass runs. [`persist`]: conversation states on
//! disk (`serve --session-dir`, `chat --session`), restored on a matching prefix.
//! [`speculative`]: prompt-lookup drafts checked in one forward ([`Session::generate`]), exact
//! for greedy and sampled decoding.

pub mod constraint;
pub mod llm;
pub mod persist;
pub mod sampler;
pub mod scheduler;
pub mod session;
pub mod speculative;
pub mod tool_grammar;

pub use constraint::{
    CompiledGrammar, Constraint, ConstraintError, ConstraintFactory, ConstraintStats, Grammar, LazyConstraints,
};
pub use llm::{ChatParts, EngineLlm, TurnRecord};
pub use persist::{PersistError, SessionStore};

pub use sampler::{SamplingParams, TokenChoice};
pub use scheduler::{Flow, Job, QueueFull, Scheduler, SchedulerConfig, SchedulerStats, TokenSink};
pub use session::{
    decode_step, runs_in_pieces, speculative_decode_step, speculative_decode_step_with_prompt, ChunkOutcome, Decoding,
    EngineError, FinishReason, GenerateRequest, Generation, PromptChunk, Session, PROGRESS_PIECE, ROW_STATE_BUDGET,
};
pub use speculative::{LookupDrafter, MtpDrafter, SpeculationStats, SpeculativeMode};
