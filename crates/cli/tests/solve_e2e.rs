//! `frognano solve` end to end with the real demo model (SmolLM2-135M, Q4_1), in process and
//! through `frognano serve`. A 135M model will rarely fix anything; these check the
//! machinery: several steps run, a valid trajectory and a patch file are written, and the run
//! ends with a documented exit reason.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const EXIT_REASONS: [&str; 8] = [
    "agent",
    "max_tokens_per_turn",
    "max_context_len",
    "max_turns",
    "max_time",
    "llm_query_error",
    "cancelled",
    "error",
];

fn check_run(out: &Path) {
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("trajectory.json")).unwrap()).unwrap();
    assert_eq!(t["trajectory_format"], "leaf-function-calling");
    let reason = t["exit_reason"].as_str().unwrap();
    assert!(EXIT_REASONS.contains(&reason), "undocumented exit reason {reason}");
    assert!(t["n_steps"].as_u64().unwrap() >= 2, "only {} steps", t["n_steps"]);
    let msgs = t["messages"].as_array().unwrap();
    assert_eq!(msgs[0]["role"], "system");
    assert_eq!(msgs[1]["role"], "user");
    assert!(msgs.iter().skip(2).any(|m| m["role"] == "assistant"));
    assert_eq!(t["tools"].as_array().unwrap().len(), 5);
    assert!(out.join("patch.diff").exists());
    assert_eq!(std::fs::read_to_string(out.join("patch.diff")).unwrap(), t["output_patch"].as_str().unwrap());
}

fn solve(extra: &[&str], out: &Path) {
    let mut args = vec!["solve", "--demo", "--max-steps", "3", "--max-tokens-per-turn", "48", "--seed", "7"];
    args.extend_from_slice(extra);
    args.extend(["--output", out.to_str().unwrap()]);
    let o = Command::new(env!("CARGO_BIN_EXE_frognano")).args(&args).current_dir(root()).output().unwrap();
    assert!(o.status.success(), "solve failed: {}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn solve_with_the_demo_model_in_process() {
    if frognano_testkit::demo_model().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    solve(&[], &out);
    check_run(&out);
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn solve_with_the_demo_model_through_frognano_serve() {
    let Some(model) = frognano_testkit::demo_model() else { return };
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _server = Server(
        Command::new(env!("CARGO_BIN_EXE_frognano"))
            .args(["serve", model.to_str().unwrap(), "--port", &port.to_string(), "--model-name", "demo"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(60), "server did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let url = format!("http://127.0.0.1:{port}");
    solve(&["--endpoint", &url, "--model", "demo"], &out);
    check_run(&out);
}

#[test]
fn no_sandbox_says_what_it_gives_up_and_still_works() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let replay = root().join("crates/agent/demo/fix-median.trajectory.json");
    let o = Command::new(env!("CARGO_BIN_EXE_frognano"))
        .args(["solve", "--demo", "--no-sandbox", "--replay", replay.to_str().unwrap(), "--output"])
        .arg(&out)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(o.status.success(), "solve failed: {}", String::from_utf8_lossy(&o.stderr));
    let stderr = String::from_utf8_lossy(&o.stderr);
    for gives_up in ["not in a sandbox", "any file you can", "reach the network", "environment variables"] {
        assert!(stderr.contains(gives_up), "the warning does not say {gives_up:?}: {stderr}");
    }
    let patch = std::fs::read_to_string(out.join("patch.diff")).unwrap();
    assert!(patch.contains("+    if len(ordered) % 2 == 0:"), "{patch}");
}

/// A newcomer sees the agent work: each step, tool call and a one-line result on stderr as
/// the run goes, while stdout keeps only the final summary; `--quiet` turns the display off.
#[test]
fn solve_shows_each_tool_call_and_its_result_as_it_goes() {
    let dir = tempfile::tempdir().unwrap();
    let replay = root().join("crates/agent/demo/fix-median.trajectory.json");
    let run = |out: &str, extra: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_frognano"))
            .args(["solve", "--demo", "--replay", replay.to_str().unwrap(), "--output"])
            .arg(dir.path().join(out))
            .args(extra)
            .current_dir(root())
            .output()
            .unwrap();
        assert!(o.status.success(), "solve failed: {}", String::from_utf8_lossy(&o.stderr));
        (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (stdout, stderr) = run("shown", &[]);
    // The recorded run: Read, run the tests (one fails), Edit, run them again (OK), answer.
    let expected = [
        "step 1/100: asking the model",
        "  → Read: stats.py",
        "  ← stats.py (+",
        "step 2/100: asking the model",
        "  → Bash: python3 -m unittest test_stats 2>&1 | tail -5",
        "  ← exit 0: FAILED (failures=1)",
        "  → Edit: stats.py",
        "  ← Edited stats.py (1 replacement).",
        "  ← exit 0: OK",
        "step 5/100: asking the model",
        "  answer (",
    ];
    let mut at = 0;
    for line in expected {
        let found = stderr[at..].find(line).unwrap_or_else(|| panic!("{line:?} missing (in order) from:\n{stderr}"));
        at += found + line.len();
    }
    for line in ["→", "←", "asking the model"] {
        assert!(!stdout.contains(line), "the live display went to stdout:\n{stdout}");
    }
    assert!(stdout.contains("exit reason: agent"), "{stdout}");

    let (quiet_out, quiet_err) = run("quiet", &["--quiet"]);
    assert!(!quiet_err.contains("→") && !quiet_err.contains("asking the model"), "--quiet still shows:\n{quiet_err}");
    assert_eq!(quiet_out.lines().next(), stdout.lines().next());
}

/// A run continued later (`--continue-from`, in a new process) starts from the conversation
/// states its parent saved in `state/`, not from a prefill of the parent's whole history.
#[test]
fn a_continued_run_starts_from_its_parents_saved_state() {
    if frognano_testkit::demo_model().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    frognano_testkit::git(&repo, &["init", "-q"]);
    frognano_testkit::write(&repo, "calc.py", "def add(a, b):\n    return a - b\n");
    frognano_testkit::commit(&repo, "calc");
    let issue = dir.path().join("issue.md");
    std::fs::write(&issue, "add(2, 3) returns -1 instead of 5. Fix calc.py.\n").unwrap();
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_frognano"))
            .args(["solve", "--max-tokens-per-turn", "48", "--seed", "7"])
            .args(args)
            .current_dir(root())
            .output()
            .unwrap();
        assert!(o.status.success(), "solve failed: {}", String::from_utf8_lossy(&o.stderr));
    };
    let (repo_s, issue_s) = (repo.to_str().unwrap(), issue.to_str().unwrap());
    // The first run stores keys and values as q8_0; the continued one is not told, and
    // reuses the saved states only if it takes the type over from run.json (the store never
    // loads a state of another cache type).
    let first_args = ["--repo", repo_s, "--issue", issue_s, "--max-steps", "2", "--kv-cache", "q8_0"];
    run(&[&first_args[..], &["--output", first.to_str().unwrap()]].concat());
    let saved = std::fs::read_dir(first.join("state")).unwrap().count();
    assert!(saved >= 2, "the run keeps its conversation states ({saved} files)");
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(first.join("run.json")).unwrap()).unwrap();
    assert_eq!(info["kv_cache"], "q8_0", "run.json records the cache type: {info}");
    run(&[
        "--continue-from",
        first.to_str().unwrap(),
        "--comment",
        "Look at calc.py again.",
        "--max-steps",
        "1",
        "--output",
        second.to_str().unwrap(),
    ]);
    let steps = |dir: &Path| -> Vec<serde_json::Value> {
        let t: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("trajectory.json")).unwrap()).unwrap();
        t["steps"].as_array().unwrap().iter().filter(|s| s.get("usage").is_some()).cloned().collect()
    };
    let parent = steps(&first);
    let parent_prompt = parent.last().unwrap()["usage"]["prompt_tokens"].as_u64().unwrap();
    // The continued trajectory keeps the parent's steps first.
    let usage = &steps(&second)[parent.len()]["usage"];
    let cached = usage["cached_tokens"].as_u64().unwrap();
    assert!(
        cached >= parent_prompt,
        "the continued run's first turn reuses at least the parent's last prompt ({parent_prompt} tokens): {usage}"
    );
}
