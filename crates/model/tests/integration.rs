//! The integration tests of this crate, built as one test binary: each file beside this one
//! is a module here. A binary per file linked the crate and all its dependencies once per
//! file, about 4 s of a clean build each (a quarter of CI's build, session 31). A file that
//! sets environment variables, runs its own binary again or counts the process's allocations
//! (`prompt_memory.rs`, whose global allocator would count every test of a shared binary)
//! keeps a binary of its own (Cargo.toml). Run one file's tests with
//! `cargo test -p CRATE --test integration FILE::`.

mod smollm2_fixture;

#[path = "arch_llama_cpp.rs"]
mod arch_llama_cpp;
#[path = "bad_input.rs"]
mod bad_input;
#[path = "chat_template.rs"]
mod chat_template;
#[path = "forward_batch.rs"]
mod forward_batch;
#[path = "gguf.rs"]
mod gguf;
#[path = "gguf_models.rs"]
mod gguf_models;
#[path = "gguf_mutation.rs"]
mod gguf_mutation;
#[path = "kv_cache.rs"]
mod kv_cache;
#[path = "llama_cpp_templates.rs"]
mod llama_cpp_templates;
#[path = "llama_cpp_vocabs.rs"]
mod llama_cpp_vocabs;
#[path = "llama_safetensors.rs"]
mod llama_safetensors;
#[path = "quant_tiles.rs"]
mod quant_tiles;
#[path = "qwen35.rs"]
mod qwen35;
#[path = "smollm2_gguf.rs"]
mod smollm2_gguf;
#[path = "tokenizer.rs"]
mod tokenizer;
#[path = "tool_templates.rs"]
mod tool_templates;
