//! The integration tests of this crate, built as one test binary: each file beside this one
//! is a module here. A binary per file linked the crate and all its dependencies once per
//! file, about 4 s of a clean build each (a quarter of CI's build, session 31). A file that
//! sets environment variables or runs its own binary again keeps a binary of its own
//! (Cargo.toml). Run one file's tests with `cargo test -p CRATE --test integration FILE::`.

mod common;

#[path = "agent_loop.rs"]
mod agent_loop;
#[path = "coder_tool_call.rs"]
mod coder_tool_call;
#[path = "constrain_tools.rs"]
mod constrain_tools;
#[path = "demo_replay.rs"]
mod demo_replay;
#[path = "solve_cli.rs"]
mod solve_cli;
#[path = "swe_solver.rs"]
mod swe_solver;
#[path = "tool_escapes.rs"]
mod tool_escapes;
#[path = "tools_golden.rs"]
mod tools_golden;
