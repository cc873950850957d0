//! The real Claude Code CLI (`claude -p`, npm `@anthropic-ai/claude-code`, installed into
//! target/npm-warm/claude-code by scripts/ci-setup.sh) pointed at `frognano serve` through
//! Anthropic's Messages API, as docs/serve.md §8 tells a user to: Claude Code sends its own
//! requests (a session-title request under a JSON schema, then its turn: 25 tools, one with a
//! schema the grammar cannot take, a system message among the messages, `max_tokens` past the
//! context, adaptive thinking) and prints the scripted model's reply. Without the binary the
//! test is skipped, except under `FROGNANO_REQUIRE_FIXTURES` (CI), where it fails.

mod common;

use std::process::Command;

use common::*;

#[test]
fn claude_code_talks_to_the_server_through_the_messages_api() {
    let claude = root().join("target/npm-warm/claude-code/node_modules/.bin/claude");
    if !installed_or_skip(&claude, "claude_code_talks_to_the_server_through_the_messages_api") {
        return;
    }
    // One script for both requests: the title request's prompt already closes the thinking
    // block, so the model goes on from `{`, which its JSON schema wants; the turn's prompt
    // opens one, which the script closes before the same JSON, Claude Code's answer.
    let server = qwen_server(Some("</think>\n\n{\"title\": \"Hello from frognano\"}"));
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let out = Command::new("timeout")
        .arg("300")
        .arg(&claude)
        .args(["-p", "Say hello."])
        .current_dir(work.path())
        .env("HOME", home.path())
        .env("ANTHROPIC_BASE_URL", server.url())
        .env("ANTHROPIC_API_KEY", "not-needed")
        .env("ANTHROPIC_MODEL", "qwen35-tiny")
        .env("ANTHROPIC_DEFAULT_HAIKU_MODEL", "qwen35-tiny")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("claude runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "claude -p failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("Hello from frognano"), "claude printed the model's reply:\n{stdout}\n{stderr}");
}
