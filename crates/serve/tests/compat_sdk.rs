//! Ollama's and Anthropic's APIs driven by their official Python clients
//! (scripts/serve_compat_sdk_test.py), from the git-ignored venv `.venv-compat` that
//! scripts/ci-setup.sh creates.

use crate::common;

#[test]
fn ollama_and_anthropic_python_clients() {
    common::run_python_client_checks(
        ".venv-compat",
        "serve_compat_sdk_test.py",
        "ollama_and_anthropic_python_clients",
        "ollama / anthropic client",
    );
}
