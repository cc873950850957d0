//! The integration tests of this crate, built as one test binary: each file beside this one
//! is a module here. A binary per file linked the crate and all its dependencies once per
//! file, about 4 s of a clean build each (a quarter of CI's build, session 31). A file that
//! sets environment variables or runs its own binary again keeps a binary of its own
//! (Cargo.toml). Run one file's tests with `cargo test -p CRATE --test integration FILE::`.

#[path = "device.rs"]
mod device;
#[path = "eval.rs"]
mod eval;
#[path = "eval_ray.rs"]
mod eval_ray;
#[path = "eval_run.rs"]
mod eval_run;
#[path = "llama_cpp_flags.rs"]
mod llama_cpp_flags;
#[path = "run_logits.rs"]
mod run_logits;
#[path = "solve_e2e.rs"]
mod solve_e2e;
#[path = "synth_calibrate.rs"]
mod synth_calibrate;
#[path = "synth_ray.rs"]
mod synth_ray;
#[path = "train_ray.rs"]
mod train_ray;
