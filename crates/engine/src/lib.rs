//! Prompts → tokens: sampling, stop rules, logprobs, sessions.
