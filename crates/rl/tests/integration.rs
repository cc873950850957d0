//! The integration tests of this crate, built as one test binary: each file beside this one
//! is a module here. A binary per file linked the crate and all its dependencies once per
//! file, about 4 s of a clean build each (a quarter of CI's build, session 31). A file that
//! sets environment variables or runs its own binary again keeps a binary of its own
//! (Cargo.toml). Run one file's tests with `cargo test -p CRATE --test integration FILE::`.

mod common;

#[path = "policy_bad_input.rs"]
mod policy_bad_input;
#[path = "policy_llama.rs"]
mod policy_llama;
#[path = "policy_lora.rs"]
mod policy_lora;
#[path = "policy_ops.rs"]
mod policy_ops;
#[path = "policy_qwen2.rs"]
mod policy_qwen2;
#[path = "policy_qwen35.rs"]
mod policy_qwen35;
#[path = "rollout_curriculum.rs"]
mod rollout_curriculum;
#[path = "rollout_recording.rs"]
mod rollout_recording;
#[path = "rollout_store.rs"]
mod rollout_store;
#[path = "rollout_swe_env.rs"]
mod rollout_swe_env;
#[path = "tinker_protocol.rs"]
mod tinker_protocol;
#[path = "train_graded_toy.rs"]
mod train_graded_toy;
#[path = "train_toy.rs"]
mod train_toy;
