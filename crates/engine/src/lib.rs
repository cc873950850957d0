//! # frognano-engine
//!
//! Prompts in, tokens out: [`sampler`] (temperature, top-k, top-p, min-p, repetition
//! penalty, seeds, log-probabilities) and [`session`] (state kept across calls so a
//! conversation only runs its new tokens; recurrent-state snapshots for hybrid models;
//! [`Session::start`] + [`decode_step`] to decode many sessions in one batched forward) and
//! [`scheduler`] (one thread per model that batches every caller's decode steps, routes
//! requests to the session holding their prefix and forks shared prefixes).

pub mod sampler;
pub mod scheduler;
pub mod session;

pub use sampler::{SamplingParams, TokenChoice};
pub use scheduler::{Flow, Job, QueueFull, Scheduler, SchedulerConfig, SchedulerStats, TokenSink};
pub use session::{decode_step, Decoding, EngineError, FinishReason, GenerateRequest, Generation, Session};
