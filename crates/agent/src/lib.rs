//! # frognano-agent
//!
//! The coding agent behind `frognano solve`: the five Leaf [`tools`], the [`agent`] loop with
//! its limits and drift guards, the [`workspace`] the agent edits, [`trajectory`] records,
//! [`replay`] of recorded runs, [`run_dir`] (what a run's output directory holds), the [`demo`] run, [`solve`] (`frognano solve` as a typed
//! config and its run; the flags are in `crates/cli`), and [`swe_solver`] (the agent as an
//! in-process `frognano_swe::runs::Solver` on a shared scheduler, for `eval run` and
//! `synth calibrate`).
//!
//! The loop talks to a model through `frognano_protocol::Llm` (messages, tool calls and the
//! tool-call codec live in `frognano-protocol`): `frognano_protocol::HttpLlm` for an
//! OpenAI-compatible endpoint, `frognano_engine::EngineLlm` for a model in this process.

pub mod agent;
pub mod demo;
pub mod replay;
pub mod run_dir;
pub mod solve;
pub mod swe_solver;
pub mod tools;
pub mod trajectory;
pub mod workspace;
