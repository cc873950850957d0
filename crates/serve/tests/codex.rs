//! The real Codex CLI (`codex exec`, npm `@openai/codex`, installed into
//! target/npm-warm/codex by scripts/ci-setup.sh) pointed at `frognano serve` through the
//! Responses API, as a user configures it (docs/serve.md §10): Codex sends its own request
//! (developer instructions, a namespace of tools, a hosted web search, reasoning settings) and
//! reads the streamed reply of a scripted model. Without the binary the test is skipped,
//! except under `FROGNANO_REQUIRE_FIXTURES` (CI), where it fails.

mod common;

use std::process::Command;

use common::*;

#[test]
fn codex_exec_talks_to_the_server_through_the_responses_api() {
    let codex = root().join("target/npm-warm/codex/node_modules/.bin/codex");
    if !installed_or_skip(&codex, "codex_exec_talks_to_the_server_through_the_responses_api") {
        return;
    }
    // Qwen3.5's template opens a thinking block: the script closes it, then answers.
    let server = qwen_server(Some("The user wants a greeting.\n</think>\n\nHello from the scripted model."));
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "model = \"qwen35-tiny\"\nmodel_provider = \"frognano\"\n\n[model_providers.frognano]\n\
             name = \"frognano serve\"\nbase_url = \"{}/v1\"\nwire_api = \"responses\"\n",
            server.url()
        ),
    )
    .unwrap();
    let out = Command::new("timeout")
        .arg("300")
        .arg(&codex)
        .args(["exec", "--skip-git-repo-check", "--color", "never", "-C"])
        .arg(work.path())
        .arg("Say hello.")
        .env("CODEX_HOME", home.path())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("codex runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "codex exec failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(
        stdout.contains("Hello from the scripted model."),
        "codex printed the model's reply as its last message:\n{stdout}\n{stderr}"
    );
    assert!(!stderr.contains("ERROR"), "{stderr}");
}
