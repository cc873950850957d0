//! Shared test helpers: fixture paths, servers on ephemeral ports, plain-HTTP calls, SSE
//! reading, and a scripted model that always writes a given reply.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;

use frognano_model::chat::ChatTemplate;
use frognano_model::LoadedModel;
use frognano_serve::{spawn_server, spawn_server_with_model, ServeConfig, ServerHandle};
use serde_json::Value;

pub use frognano_testkit::ScriptedLm;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The tiny random Qwen3.5 checkpoint (ChatML template, eos id 2).
pub fn tiny() -> String {
    root().join("fixtures/qwen35-tiny").to_string_lossy().into_owned()
}

/// Server arguments for `model` on an ephemeral loopback port.
pub fn args(model: &str) -> ServeConfig {
    let mut a = ServeConfig::for_model(model);
    a.port = 0;
    a.max_concurrent = 2;
    a
}

/// The tiny checkpoint served on an ephemeral port.
pub fn tiny_server() -> ServerHandle {
    spawn_server(args(&tiny())).expect("server starts")
}

/// The Qwen3.5 chat template (tools, thinking), from the tokenizer fixtures.
pub fn qwen35_template() -> ChatTemplate {
    ChatTemplate::from_file(root().join("fixtures/tokenizer/qwen35/chat_template.jinja")).expect("qwen35 template")
}

/// The tiny checkpoint with the Qwen3.5 chat template; `script`, if given, replaces the
/// network by a model that always writes that text (then eos).
pub fn qwen_server(script: Option<&str>) -> ServerHandle {
    qwen_server_with_context(script, None)
}

/// [`qwen_server`] with a context of `ctx` tokens (`--ctx`) where given.
pub fn qwen_server_with_context(script: Option<&str>, ctx: Option<usize>) -> ServerHandle {
    let mut loaded = frognano_model::load(tiny()).expect("tiny model loads");
    loaded.chat_template = Some(qwen35_template());
    if let Some(text) = script {
        loaded = scripted(loaded, text);
    }
    let mut a = args("qwen35-tiny");
    a.model_name = Some("qwen35-tiny".into());
    a.ctx = ctx;
    spawn_server_with_model(loaded, a).expect("server starts")
}

/// Replaces the network of `loaded` by a [`ScriptedLm`] writing `text` then eos.
pub fn scripted(mut loaded: LoadedModel, text: &str) -> LoadedModel {
    let tok = loaded.tokenizer.as_ref().expect("tokenizer");
    let mut script = tok.encode_with(text, false).expect("encode");
    script.push(loaded.eos_ids[0]);
    loaded.model = Box::new(ScriptedLm { vocab: loaded.model.vocab_size(), script });
    loaded
}

/// POSTs JSON text; returns the status and the parsed body.
pub fn post_raw(url: &str, body: &str) -> (u16, Value) {
    let resp = match ureq::post(url).set("Content-Type", "application/json").send_string(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST {url}: {e}"),
    };
    let status = resp.status();
    let text = resp.into_string().expect("body");
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")))
}

/// POSTs a JSON value.
pub fn post(url: &str, body: &Value) -> (u16, Value) {
    post_raw(url, &body.to_string())
}

/// GETs a URL.
pub fn get(url: &str) -> (u16, Value) {
    let resp = match ureq::get(url).call() {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("GET {url}: {e}"),
    };
    let status = resp.status();
    (status, resp.into_json().expect("JSON body"))
}

/// POSTs a streaming request; returns every `data:` payload (the last is `[DONE]`).
pub fn stream(url: &str, body: &Value) -> Vec<String> {
    let resp = ureq::post(url).send_json(body.clone()).unwrap_or_else(|e| panic!("POST {url}: {e}"));
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let mut out = Vec::new();
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line.expect("line");
        if let Some(data) = line.strip_prefix("data: ") {
            out.push(data.to_string());
        }
    }
    out
}

/// The JSON chunks of a stream, checking it ends with `[DONE]`.
pub fn chunks(events: &[String]) -> Vec<Value> {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "stream must end with [DONE]: {events:?}");
    events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).expect("chunk JSON")).collect()
}

/// The Bash tool of the Leaf harness (as an OpenAI tool).
pub fn bash_tool() -> Value {
    serde_json::json!({"type": "function", "function": {
        "name": "Bash", "description": "Run a shell command in the repository workdir.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "description": "Command to run."},
            "timeout": {"type": "integer", "description": "Seconds."}},
        "required": ["command"]}}})
}

/// The reply of the scripted tool-calling server the Python client checks talk to: a Qwen3.5
/// XML call of `Bash`.
pub const TOOL_REPLY: &str = "Let me list the files.\n</think>\n\n<tool_call>\n<function=Bash>\n<parameter=command>\nls -la\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>";

/// Runs `scripts/SCRIPT` with the python of the git-ignored venv `VENV` (made by
/// scripts/ci-setup.sh) against a plain tiny server (`--plain`) and one that always writes
/// [`TOOL_REPLY`] (`--tool`); the script must end with `all checks passed`. Without the venv
/// the check is skipped, except under `FROGNANO_REQUIRE_FIXTURES` (CI), where it fails.
pub fn run_python_client_checks(venv: &str, script: &str, test: &str, what: &str) {
    let python = root().join(venv).join("bin/python");
    if !installed_or_skip(&python, test) {
        return;
    }
    let plain = tiny_server();
    let tool = qwen_server(Some(TOOL_REPLY));
    let out = std::process::Command::new(&python)
        .arg(root().join("scripts").join(script))
        .args(["--plain", &plain.url(), "--tool", &tool.url()])
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "the {what} checks failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"));
}

/// Whether the client program `path` (installed by scripts/ci-setup.sh) is there; without
/// it `test` is skipped with a note, except under `FROGNANO_REQUIRE_FIXTURES` (CI), where it
/// fails.
pub fn installed_or_skip(path: &std::path::Path, test: &str) -> bool {
    if path.exists() {
        return true;
    }
    assert!(
        std::env::var_os("FROGNANO_REQUIRE_FIXTURES").is_none(),
        "{} is missing; run scripts/ci-setup.sh",
        path.display()
    );
    eprintln!("SKIPPED {test}: no {} (run scripts/ci-setup.sh)", path.display());
    false
}

/// An agent's command-line client (installed by scripts/ci-setup.sh) with a fresh home and
/// working folder of its own, so that a conversation there can be continued run after run.
pub struct AgentCli {
    /// The program.
    pub bin: PathBuf,
    /// Its home (settings, sessions).
    pub home: tempfile::TempDir,
    /// The folder it works in.
    pub work: tempfile::TempDir,
}

impl AgentCli {
    /// The client at `bin` (from the workspace root), or `None` where it is not installed
    /// ([`installed_or_skip`]: `test` is skipped, or fails under CI).
    pub fn installed(bin: &str, test: &str) -> Option<AgentCli> {
        let bin = root().join(bin);
        installed_or_skip(&bin, test).then(|| AgentCli {
            bin,
            home: tempfile::tempdir().unwrap(),
            work: tempfile::tempdir().unwrap(),
        })
    }
}

/// A server-sent event stream as `(event name, data)` pairs, in order (every data line is
/// JSON and follows an `event:` line).
pub fn sse_events(resp: ureq::Response) -> Vec<(String, Value)> {
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let mut events = Vec::new();
    let mut name = None;
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line.expect("line");
        if let Some(n) = line.strip_prefix("event: ") {
            name = Some(n.to_string());
        } else if let Some(d) = line.strip_prefix("data: ") {
            let data: Value = serde_json::from_str(d).expect("event data is JSON");
            events.push((name.take().expect("every data line has an event name"), data));
        }
    }
    events
}
