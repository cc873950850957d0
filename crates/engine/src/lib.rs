//! # frognano-engine
//!
//! Prompts in, tokens out: [`sampler`] (temperature, top-k, top-p, min-p, repetition
//! penalty, seeds, log-probabilities) and [`session`] (state kept across calls so a
//! conversation only runs its new tokens; recurrent-state snapshots for hybrid models).

pub mod sampler;
pub mod session;

pub use sampler::{SamplingParams, TokenChoice};
pub use session::{EngineError, FinishReason, GenerateRequest, Generation, Session};
