//! The integration tests of this crate, built as one test binary: each file beside this one
//! is a module here. A binary per file linked the crate and all its dependencies once per
//! file, about 4 s of a clean build each (a quarter of CI's build, session 31). A file that
//! sets environment variables or runs its own binary again keeps a binary of its own
//! (Cargo.toml). Run one file's tests with `cargo test -p CRATE --test integration FILE::`.

#[path = "e2e.rs"]
mod e2e;
#[path = "harbor.rs"]
mod harbor;
#[path = "parquet.rs"]
mod parquet;
#[path = "scaleout_manifests.rs"]
mod scaleout_manifests;
