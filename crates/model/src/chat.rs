//! Chat templates rendered with minijinja to the bytes transformers renders.
