//! Task synthesis for FrogNano: a repository in, validated SWE-bench-format bug-fix tasks
//! out, calibrated to the policy's learnability frontier (docs/synthesis.md).
//!
//! Layers: [`intake`] (local repo, PyPI sdist, crates.io crate → git commit), [`era`]
//! (dependency cutoffs that fit a release's time), [`project`]
//! (language, test command, environment, sandboxed runs, two-run baseline), [`mutate`]
//! (tree-sitter bug operators), [`first_pass`] (the tests that import a mutated module),
//! [`pipeline`] (candidates, validation, orphan buggy commits,
//! JSONL instances, combinations, resume), [`issue`] (issue text and leak check),
//! [`issue_model`] (model-written issue text through `frognano_protocol::Llm`: an HTTP
//! endpoint or the in-process `frognano_engine::EngineLlm`), [`harbor`] (Harbor task dirs),
//! [`calibrate`] (pass-rate estimates and the frontier controller), [`task_meta`] (the
//! `synth` record of each task), [`jobs`] (the issue model and `synth calibrate` as configs
//! with `validate()`; the flags are in `crates/cli`), [`remote`] (candidates and batch
//! packages as units of a Ray cluster run).

pub mod batch;
pub mod calibrate;
pub mod debian;
pub mod declared;
pub mod era;
pub mod first_pass;
pub mod harbor;
pub mod intake;
pub mod issue;
pub mod issue_model;
pub mod jobs;
pub mod langs;
pub mod mutate;
pub mod pipeline;
pub mod project;
pub mod remote;
pub mod task_meta;
