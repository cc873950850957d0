//! The real Codex CLI (`codex exec`, npm `@openai/codex`, installed into
//! target/npm-warm/codex by scripts/ci-setup.sh) pointed at `frognano serve` through the
//! Responses API, as a user configures it (docs/serve.md §10): Codex sends its own request
//! (developer instructions, a namespace of tools, a hosted web search, reasoning settings) and
//! reads the streamed reply of a scripted model; a conversation that outgrows the context is
//! compacted and goes on. Without the binary the tests are skipped, except under
//! `FROGNANO_REQUIRE_FIXTURES` (CI), where they fail.

use crate::common;

use std::process::Command;

use common::*;
use frognano_serve::ServerHandle;

/// Codex, with its own home (its config and sessions) and working folder.
struct Codex(AgentCli);

impl Codex {
    /// The installed client, or `None` (the test skipped) where it is not installed.
    fn installed(test: &str) -> Option<Codex> {
        AgentCli::installed("target/npm-warm/codex/node_modules/.bin/codex", test).map(Codex)
    }

    /// `codex exec ARGS` against `server`, its config naming the server as a provider (and
    /// `model_context_window` where given): whether it succeeded, stdout, stderr.
    fn exec(&self, server: &ServerHandle, context_window: Option<usize>, args: &[&str]) -> (bool, String, String) {
        let window = context_window.map(|n| format!("model_context_window = {n}\n")).unwrap_or_default();
        let config = format!(
            "model = \"qwen35-tiny\"\nmodel_provider = \"frognano\"\n{window}\n[model_providers.frognano]\n\
             name = \"frognano serve\"\nbase_url = \"{}/v1\"\nwire_api = \"responses\"\n",
            server.url()
        );
        std::fs::write(self.0.home.path().join("config.toml"), config).unwrap();
        let out = Command::new("timeout")
            .arg("300")
            .arg(&self.0.bin)
            .args(["exec", "--skip-git-repo-check", "--color", "never", "-C"])
            .arg(self.0.work.path())
            .args(args)
            .env("CODEX_HOME", self.0.home.path())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("codex runs");
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    }
}

#[test]
fn codex_exec_talks_to_the_server_through_the_responses_api() {
    let Some(codex) = Codex::installed("codex_exec_talks_to_the_server_through_the_responses_api") else {
        return;
    };
    // Qwen3.5's template opens a thinking block: the script closes it, then answers.
    let server = qwen_server(Some("The user wants a greeting.\n</think>\n\nHello from the scripted model."));
    let (ok, stdout, stderr) = codex.exec(&server, None, &["Say hello."]);
    assert!(ok, "codex exec failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("Hello from the scripted model."),
        "codex printed the model's reply as its last message:\n{stdout}\n{stderr}"
    );
    assert!(!stderr.contains("ERROR"), "{stderr}");
}

/// Codex's first request (~9K tokens of instructions and tools) against a context of 2,048:
/// the 400's code, `context_length_exceeded`, is read as a context window Codex ran out of
/// (it marks the context full, so a turn compacts first where it knows the window), not as a
/// broken request.
#[test]
fn codex_exec_is_told_it_ran_out_of_context() {
    let Some(codex) = Codex::installed("codex_exec_is_told_it_ran_out_of_context") else {
        return;
    };
    let server = qwen_server_with_context(Some("</think>\n\nHello."), Some(2_048));
    let (_, stdout, stderr) = codex.exec(&server, None, &["Say hello."]);
    assert!(
        stderr.contains("ran out of room in the model's context window"),
        "codex reported a context window it ran out of:\n{stdout}\n{stderr}"
    );
}

/// A conversation that outgrows the context, with `model_context_window` set to the server's
/// context as docs/serve.md §10 says: five turns of `codex exec` / `codex exec resume --last`
/// (each reply ~1.5K tokens, on top of ~21K of instructions and tools) against a context of
/// 65,536, then two more against a server restarted with 28,000. Codex compacts the
/// conversation before the first of them and both turns are answered.
#[test]
fn codex_compacts_a_conversation_that_outgrew_the_context() {
    let Some(codex) = Codex::installed("codex_compacts_a_conversation_that_outgrew_the_context") else {
        return;
    };
    let reply = format!("</think>\n\nHello from the scripted model. {}", "lorem ipsum ".repeat(250));
    let answers = |server: &ServerHandle, window: usize, args: &[&str]| {
        let (ok, stdout, stderr) = codex.exec(server, Some(window), args);
        let said = format!("codex {args:?}:\n{stdout}\n{stderr}");
        assert!(ok && stdout.contains("Hello from the scripted model."), "{said}");
        said
    };
    let roomy = qwen_server_with_context(Some(&reply), Some(65_536));
    answers(&roomy, 65_536, &["Say hello."]);
    for _ in 0..4 {
        answers(&roomy, 65_536, &["resume", "--last", "Say hello."]);
    }
    drop(roomy);
    let tight = qwen_server_with_context(Some(&reply), Some(28_000));
    let said = answers(&tight, 28_000, &["resume", "--last", "Say hello."]);
    assert!(said.contains("context compacted"), "{said}");
    answers(&tight, 28_000, &["resume", "--last", "Say hello again."]);
}
