//! The integration tests of this crate, built as one test binary: each file beside this one
//! is a module here. A binary per file linked the crate and all its dependencies once per
//! file, about 4 s of a clean build each (a quarter of CI's build, session 31). A file that
//! sets environment variables or runs its own binary again keeps a binary of its own
//! (Cargo.toml). Run one file's tests with `cargo test -p CRATE --test integration FILE::`.

#[path = "constrained.rs"]
mod constrained;
#[path = "llm_tool_calls.rs"]
mod llm_tool_calls;
#[path = "persist.rs"]
mod persist;
#[path = "scheduler.rs"]
mod scheduler;
#[path = "session.rs"]
mod session;
#[path = "speculative.rs"]
mod speculative;
