//! Tokenizer: Hugging Face tokenizer.json through the `tokenizers` crate.
