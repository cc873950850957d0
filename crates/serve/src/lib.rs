//! HTTP: the OpenAI-compatible API over the engine.
