//! `frognano solve` end to end without a real model: bad input, the user's tree left alone,
//! `--apply`, and a run against an OpenAI-compatible HTTP endpoint served by a scripted
//! server (the wire format is the thing under test here).

use frognano_agent::demo;
use frognano_agent::solve::{solve, ModelChoice, SolveConfig, TaskInput};
use frognano_agent::trajectory::{ExitReason, Trajectory};
use frognano_protocol::codec::{QwenXml, ToolCallFormat};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn demo_trajectory() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("demo/fix-median.trajectory.json")
}

/// A demo repository as the user's checkout, plus an output path that does not exist yet.
fn user_repo() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let repo = demo::materialize(&root.path().join("user-repo")).unwrap();
    let output = root.path().join("out");
    (root, repo, output)
}

fn replay_args(repo: &Path, output: &Path) -> SolveConfig {
    SolveConfig {
        model: ModelChoice::Replay(demo_trajectory()),
        output: Some(output.to_path_buf()),
        ..SolveConfig::for_repo(repo)
    }
}

#[test]
fn the_users_checkout_is_never_touched_without_apply() {
    let (_root, repo, output) = user_repo();
    let before = std::fs::read_to_string(repo.join("stats.py")).unwrap();
    let report = solve(&replay_args(&repo, &output)).unwrap();
    assert_eq!(report.trajectory.exit_reason, ExitReason::Agent);
    assert!(report.trajectory.output_patch.contains("stats.py"));
    assert_eq!(std::fs::read_to_string(repo.join("stats.py")).unwrap(), before);
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
    for f in ["trajectory.json", "patch.diff", "summary.md"] {
        assert!(output.join(f).is_file(), "{f} missing");
    }
}

#[test]
fn apply_with_yes_applies_the_patch_to_the_users_tree() {
    let (_root, repo, output) = user_repo();
    let args = SolveConfig { apply: true, yes: true, ..replay_args(&repo, &output) };
    solve(&args).unwrap();
    assert!(std::fs::read_to_string(repo.join("stats.py")).unwrap().contains("ordered[middle - 1]"));
    assert!(Command::new("bash")
        .args(["-c", demo::DEMO_TEST_COMMAND])
        .current_dir(&repo)
        .output()
        .unwrap()
        .status
        .success());
}

#[test]
fn bad_input_is_a_clear_error_with_no_output_written() {
    let (root, repo, output) = user_repo();
    let plain_dir = root.path().join("not-a-repo");
    std::fs::create_dir(&plain_dir).unwrap();

    let err = solve(&replay_args(&plain_dir, &output)).unwrap_err().to_string();
    assert!(err.ends_with("not-a-repo is not a git repository"), "{err}");

    std::fs::write(repo.join("stats.py"), "# local edit\n").unwrap();
    let err = solve(&replay_args(&repo, &output)).unwrap_err().to_string();
    assert!(err.contains("has uncommitted changes (M stats.py)") && err.contains("--allow-dirty"), "{err}");
    assert_eq!(std::fs::read_to_string(repo.join("stats.py")).unwrap(), "# local edit\n");
    git(&repo, &["checkout", "stats.py"]);

    let no_model = SolveConfig {
        task: TaskInput::Text("fix it".into()),
        output: Some(output.clone()),
        model: ModelChoice::InProcess(Some("/nonexistent/model.gguf".into())),
        ..SolveConfig::for_repo(&repo)
    };
    let err = format!("{:#}", solve(&no_model).unwrap_err());
    assert!(err.starts_with("no model to ask: loading /nonexistent/model.gguf in this process failed"), "{err}");
    assert!(err.contains("--endpoint URL --model NAME"), "{err}");

    let unreachable = SolveConfig {
        model: ModelChoice::Endpoint { url: "http://127.0.0.1:9".into(), model: "frog".into() },
        ..no_model.clone()
    };
    let err = solve(&unreachable).unwrap_err().to_string();
    assert!(err.contains("cannot reach the model endpoint http://127.0.0.1:9/v1/chat/completions"), "{err}");

    let missing_issue = SolveConfig { task: TaskInput::IssueFile(root.path().join("nope.md")), ..unreachable.clone() };
    let err = solve(&missing_issue).unwrap_err().to_string();
    assert!(err.starts_with("cannot read issue file"), "{err}");

    let bad_replay = SolveConfig { model: ModelChoice::Replay(repo.join("stats.py")), ..replay_args(&repo, &output) };
    let err = solve(&bad_replay).unwrap_err().to_string();
    assert!(err.contains("is not a leaf-function-calling trajectory"), "{err}");

    assert!(!output.exists(), "no output may be written for bad input");
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");

    std::fs::create_dir(&output).unwrap();
    std::fs::write(output.join("old"), "").unwrap();
    let err = solve(&replay_args(&repo, &output)).unwrap_err().to_string();
    assert!(err.ends_with("already exists and is not empty"), "{err}");
}

/// Serves one canned OpenAI chat-completion response per request, recording the bodies.
fn scripted_server(responses: Vec<serde_json::Value>) -> (String, std::thread::JoinHandle<Vec<serde_json::Value>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        let mut bodies = Vec::new();
        for response in responses {
            let (mut stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut length = 0;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line == "\r\n" || line.is_empty() {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            bodies.push(serde_json::from_slice(&body).unwrap());
            let text = response.to_string();
            write!(stream, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}", text.len()).unwrap();
        }
        bodies
    });
    (url, handle)
}

#[test]
fn runs_against_an_openai_compatible_endpoint() {
    let (_root, repo, output) = user_repo();
    let recorded = Trajectory::load(&demo_trajectory()).unwrap();
    // Replies as a server would send them: the first with OpenAI tool_calls, the others
    // with the Qwen XML left in the content (servers without a tool parser do that).
    let assistants: Vec<_> = recorded.messages.iter().filter(|m| m.role == "assistant").collect();
    let mut responses = Vec::new();
    for (i, m) in assistants.iter().enumerate() {
        let message = if i == 0 || m.calls().is_empty() {
            serde_json::json!({"role": "assistant", "content": m.content, "reasoning_content": m.reasoning_content, "tool_calls": m.tool_calls})
        } else {
            let xml = QwenXml.render_assistant_content(&m.text(), m.calls()).unwrap();
            serde_json::json!({"role": "assistant", "content": xml})
        };
        responses.push(serde_json::json!({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 500 + i * 100, "completion_tokens": 50}}));
    }
    let (url, server) = scripted_server(responses);
    let mut args = SolveConfig {
        model: ModelChoice::Endpoint { url, model: "frognano-demo".into() },
        task: TaskInput::Text(demo::DEMO_ISSUE.into()),
        output: Some(output.clone()),
        ..SolveConfig::for_repo(&repo)
    };
    args.sampling.seed = Some(7);
    let report = solve(&args).unwrap();
    let bodies = server.join().unwrap();
    let t = &report.trajectory;
    assert_eq!(t.exit_reason, ExitReason::Agent);
    assert_eq!(t.n_steps, 5);
    assert_eq!(t.context_tokens, 500 + 4 * 100 + 50);
    assert!(t.steps[3].observations[0].observation.contains("\nOK\n"));
    assert_eq!(t.output_patch, recorded.output_patch);
    // The wire format: the card's sampling defaults, the five tools, the growing history.
    assert_eq!(bodies.len(), 5);
    assert_eq!(bodies[0]["model"], "frognano-demo");
    assert_eq!(bodies[0]["top_k"], 20);
    assert_eq!(bodies[0]["seed"], 7);
    assert_eq!(bodies[0]["tools"].as_array().unwrap().len(), 5);
    assert_eq!(bodies[0]["messages"].as_array().unwrap().len(), 2);
    assert_eq!(bodies[4]["messages"].as_array().unwrap().len(), 10);
    assert_eq!(bodies[1]["messages"][3]["role"], "tool");
    let summary = std::fs::read_to_string(output.join("summary.md")).unwrap();
    assert!(summary.contains("- model: frognano-demo at http://127.0.0.1:"));
}

#[test]
fn a_cancelled_run_keeps_its_trajectory_and_has_no_patch() {
    let (_root, repo, output) = user_repo();
    let cancel = std::sync::atomic::AtomicBool::new(true);
    let report = frognano_agent::solve::solve_with_cancel(&replay_args(&repo, &output), &cancel).unwrap();
    assert_eq!(report.trajectory.exit_reason, ExitReason::Cancelled);
    assert_eq!(report.trajectory.output_patch, "");
    assert_eq!(Trajectory::load(&output.join("trajectory.json")).unwrap().exit_reason, ExitReason::Cancelled);
}
