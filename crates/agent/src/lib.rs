//! # frognano-agent
//!
//! The coding agent behind `frognano solve`: the [`llm::Llm`] trait with an OpenAI-compatible
//! HTTP backend and an in-process one ([`engine_llm`]), the Qwen XML ⇄ OpenAI [`codec`], the five Leaf [`tools`], the [`agent`] loop
//! with its limits and drift guards, the [`workspace`] the agent edits, [`trajectory`]
//! records, [`replay`] of recorded runs, and [`solve`] (`frognano solve` as a typed config and its run).

pub mod agent;
pub mod codec;
pub mod demo;
pub mod engine_llm;
pub mod llm;
pub mod replay;
pub mod solve;
pub mod tools;
pub mod trajectory;
pub mod workspace;
