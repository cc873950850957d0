//! The integration tests of this crate, built as one test binary: each file beside this one
//! is a module here. A binary per file linked the crate and all its dependencies once per
//! file, about 4 s of a clean build each (a quarter of CI's build, session 31). A file that
//! sets environment variables or runs its own binary again keeps a binary of its own
//! (Cargo.toml). Run one file's tests with `cargo test -p CRATE --test integration FILE::`.

#[path = "archives.rs"]
mod archives;
#[path = "debian_go.rs"]
mod debian_go;
#[path = "issue_model.rs"]
mod issue_model;
#[path = "langs.rs"]
mod langs;
#[path = "network.rs"]
mod network;
#[path = "pipeline.rs"]
mod pipeline;
