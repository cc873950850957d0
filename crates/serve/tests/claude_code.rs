//! The real Claude Code CLI (`claude -p`, npm `@anthropic-ai/claude-code`, installed into
//! target/npm-warm/claude-code by scripts/ci-setup.sh) pointed at `frognano serve` through
//! Anthropic's Messages API, as docs/serve.md §8 tells a user to: Claude Code sends its own
//! requests (a session-title request under a JSON schema, then its turn: 25 tools, one with a
//! schema the grammar cannot take, a system message among the messages, `max_tokens` past the
//! context, adaptive thinking) and prints the scripted model's reply; and a conversation that
//! outgrows the context is compacted and goes on. Without the binary the tests are skipped,
//! except under `FROGNANO_REQUIRE_FIXTURES` (CI), where they fail.

use crate::common;

use std::process::Command;

use common::*;
use frognano_serve::ServerHandle;

/// One script for every request: the title request's prompt already closes the thinking
/// block, so the model goes on from `{`, which its JSON schema wants; a turn's prompt opens
/// one, which the script closes before the same JSON, Claude Code's answer.
const SCRIPT: &str = "</think>\n\n{\"title\": \"Hello from frognano\"}";

/// Claude Code, with its own home and working folder.
struct ClaudeCode(AgentCli);

impl ClaudeCode {
    /// The installed client, or `None` (the test skipped) where it is not installed.
    fn installed(test: &str) -> Option<ClaudeCode> {
        AgentCli::installed("target/npm-warm/claude-code/node_modules/.bin/claude", test).map(ClaudeCode)
    }

    /// `claude ARGS` against `server`: whether it succeeded, and what it printed (stdout, then
    /// the whole of both for a failure message).
    fn run(&self, server: &ServerHandle, args: &[&str]) -> (bool, String, String) {
        let out = Command::new("timeout")
            .arg("300")
            .arg(&self.0.bin)
            .args(args)
            .current_dir(self.0.work.path())
            .env("HOME", self.0.home.path())
            .env("ANTHROPIC_BASE_URL", server.url())
            .env("ANTHROPIC_API_KEY", "not-needed")
            .env("ANTHROPIC_MODEL", "qwen35-tiny")
            .env("ANTHROPIC_DEFAULT_HAIKU_MODEL", "qwen35-tiny")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("claude runs");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let said = format!("claude {args:?} ({}):\n{stdout}\n{stderr}", out.status);
        (out.status.success(), stdout.into_owned(), said)
    }

    /// [`ClaudeCode::run`], which must succeed and print the script's answer.
    fn answers(&self, server: &ServerHandle, args: &[&str]) {
        let (ok, stdout, said) = self.run(server, args);
        assert!(ok && stdout.contains("Hello from frognano"), "{said}");
    }
}

#[test]
fn claude_code_talks_to_the_server_through_the_messages_api() {
    let Some(claude) = ClaudeCode::installed("claude_code_talks_to_the_server_through_the_messages_api") else {
        return;
    };
    claude.answers(&qwen_server(Some(SCRIPT)), &["-p", "Say hello."]);
}

/// Claude Code's turn (~44K tokens of system prompt and tools in the fixtures' tokenizer)
/// against a context of 4,096: the 400 is worded as Anthropic's (`prompt is too long: N
/// tokens > M maximum`), which Claude Code recognises: it says "Prompt is too long" with the
/// two sizes it read, instead of a server error; a single exchange cannot be compacted.
#[test]
fn claude_code_recognises_a_prompt_too_long_for_the_context() {
    let Some(claude) = ClaudeCode::installed("claude_code_recognises_a_prompt_too_long_for_the_context") else {
        return;
    };
    let (_, stdout, said) = claude.run(&qwen_server_with_context(Some(SCRIPT), Some(4_096)), &["-p", "Say hello."]);
    assert!(stdout.contains("Prompt is too long"), "claude recognised the overflow: {said}");
    assert!(stdout.contains("(limit 4096)"), "claude read the context size from the error: {said}");
}

/// A conversation that outgrew the context: five turns of `claude -p` / `claude -p --continue`
/// (~3K tokens each, on top of ~44K of system prompt and tools) against a context of 65,536,
/// then one more against a server restarted with 54,000. Its turn is refused as too long;
/// Claude Code compacts the conversation (its summary request is itself too long, so it drops
/// as many of the oldest turns as the gap in our numbers says and asks again), retries the
/// turn on the summary, and prints the answer. Without Anthropic's wording it stops at
/// "API Error: 400".
#[test]
fn claude_code_compacts_a_conversation_that_outgrew_the_context() {
    let Some(claude) = ClaudeCode::installed("claude_code_compacts_a_conversation_that_outgrew_the_context") else {
        return;
    };
    let long = format!("Remember this text: {}", "lorem ipsum ".repeat(500));
    let roomy = qwen_server_with_context(Some(SCRIPT), Some(65_536));
    claude.answers(&roomy, &["-p", &long]);
    for _ in 0..4 {
        claude.answers(&roomy, &["-p", "--continue", &long]);
    }
    drop(roomy);
    claude.answers(&qwen_server_with_context(Some(SCRIPT), Some(54_000)), &["-p", "--continue", "Say hello."]);
}
