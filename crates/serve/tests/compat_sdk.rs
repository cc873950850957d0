//! Ollama's and Anthropic's APIs driven by their official Python clients
//! (scripts/serve_compat_sdk_test.py), from the git-ignored venv `.venv-compat` that
//! scripts/ci-setup.sh creates.

mod common;

use std::process::Command;

use common::*;

const TOOL_REPLY: &str = "Let me list the files.\n</think>\n\n<tool_call>\n<function=Bash>\n<parameter=command>\nls -la\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>";

#[test]
fn ollama_and_anthropic_python_clients() {
    let python = root().join(".venv-compat/bin/python");
    if !python.exists() {
        assert!(
            std::env::var_os("FROGNANO_REQUIRE_FIXTURES").is_none(),
            "{} is missing; run scripts/ci-setup.sh",
            python.display()
        );
        eprintln!("SKIPPED ollama_and_anthropic_python_clients: no {} (run scripts/ci-setup.sh)", python.display());
        return;
    }
    let plain = tiny_server();
    let tool = qwen_server(Some(TOOL_REPLY));
    let out = Command::new(&python)
        .arg(root().join("scripts/serve_compat_sdk_test.py"))
        .args(["--plain", &plain.url(), "--tool", &tool.url()])
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "the ollama / anthropic client checks failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"));
}
