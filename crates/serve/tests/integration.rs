//! The integration tests of this crate, built as one test binary: each file beside this one
//! is a module here. A binary per file linked the crate and all its dependencies once per
//! file, about 4 s of a clean build each (a quarter of CI's build, session 31). A file that
//! sets environment variables or runs its own binary again keeps a binary of its own
//! (Cargo.toml). Run one file's tests with `cargo test -p CRATE --test integration FILE::`.

mod common;

#[path = "batching.rs"]
mod batching;
#[path = "claude_code.rs"]
mod claude_code;
#[path = "codex.rs"]
mod codex;
#[path = "compat.rs"]
mod compat;
#[path = "compat_sdk.rs"]
mod compat_sdk;
#[path = "context_overflow.rs"]
mod context_overflow;
#[path = "http.rs"]
mod http;
#[path = "limits.rs"]
mod limits;
#[path = "load.rs"]
mod load;
#[path = "openai_compat.rs"]
mod openai_compat;
#[path = "openai_sdk.rs"]
mod openai_sdk;
#[path = "responses.rs"]
mod responses;
#[path = "sessions.rs"]
mod sessions;
#[path = "structured.rs"]
mod structured;
#[path = "tool_formats.rs"]
mod tool_formats;
