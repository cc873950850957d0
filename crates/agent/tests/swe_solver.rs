//! The in-process agent solver end to end: `frognano eval run`'s library path
//! (`frognano_swe::runs::solve_and_grade`) over a fixture task made at test time (a bash
//! project graded with the go-test parser), two attempts on two workers sharing one scheduler
//! with the demo model. Predictions and results are written, each with the exit reason of its
//! trajectory. Skipped with a message when the demo model is absent, unless
//! FROGNANO_REQUIRE_FIXTURES is set.

use std::sync::atomic::Ordering;
use std::time::Duration;

use frognano_agent::agent::AgentConfig;
use frognano_agent::swe_solver::AgentSolver;
use frognano_protocol::codec::ToolParser;
use frognano_protocol::Sampling;
use frognano_sandbox::{Isolation, Sandbox};
use frognano_swe::executor::ExecOptions;
use frognano_swe::instance::parse_jsonl_instances;
use frognano_swe::runs::{read_results, solve_and_grade, SolveRunOptions, Solver};
use frognano_testkit::{bash_project, diff_for};
use serde_json::{json, Value};

const LIB_BUGGY: &str = "greet() { echo \"Helo, $1\"; }\n";
const LIB_FIXED: &str = "greet() { echo \"Hello, $1\"; }\n";
const NEW_TESTS: &str = "TestGreet() { [ \"$(greet Bob)\" = \"Hello, Bob\" ]; }\n";

/// Bubblewrap where it runs; without it a SKIPPED (needs bubblewrap) line and unconfined runs,
/// or a failure under FROGNANO_REQUIRE_FIXTURES (CI), so the sandboxed path is not dropped silently.
fn isolation() -> Isolation {
    let bwrap = Sandbox::bubblewrap_available();
    if frognano_testkit::available_or_skip("bubblewrap", "the in-process agent solver", bwrap) {
        Isolation::Bubblewrap
    } else {
        Isolation::Unconfined
    }
}

#[test]
fn eval_run_with_the_in_process_agent_writes_predictions_and_results_with_exit_reasons() {
    let Some(model) = frognano_testkit::demo_model() else { return };
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("greet");
    let base = bash_project(&repo, LIB_BUGGY);
    let line = json!({
        "instance_id": "sh__greet-1", "repo": "sh/greet", "base_commit": base,
        "repo_path": repo.to_string_lossy(),
        "patch": diff_for(&repo, "lib.sh", LIB_FIXED),
        "test_patch": diff_for(&repo, "tests/greet.t.sh", NEW_TESTS),
        // The demo model cannot fix anything; a short reply ends the attempt quickly.
        "problem_statement": "Reply with the single word OK.",
        "version": "0.1", "log_parser": "gotest", "test_cmd": "bash run_tests.sh",
        "FAIL_TO_PASS": ["TestGreet"], "PASS_TO_PASS": ["TestTrue"],
    });
    let instances = parse_jsonl_instances(&format!("{line}\n"), "fixture.jsonl").unwrap();

    let isolation = isolation();
    let config = AgentConfig {
        sampling: Sampling { temperature: 0.0, max_tokens: 24, enable_thinking: false, ..Sampling::default() },
        max_steps: 2,
        max_context_tokens: 4096,
        max_time: Some(Duration::from_secs(120)),
        ..AgentConfig::default()
    };
    let solver =
        AgentSolver::load(model.to_str().unwrap(), 2, None).unwrap().with_config(config).with_isolation(isolation);
    let opts = SolveRunOptions {
        run_id: "inproc".into(),
        output: dir.path().join("out"),
        workers: 2,
        attempts: 2,
        shard: None,
        exec: ExecOptions {
            repos: None,
            timeout: Duration::from_secs(60),
            isolation,
            work_root: dir.path().join("work"),
        },
    };
    std::fs::create_dir_all(&opts.exec.work_root).unwrap();
    let (summary, metrics) = solve_and_grade(instances, &solver, &opts).unwrap();
    assert_eq!((summary.instances, summary.resolved, summary.errors), (1, 0, 0), "{summary:?}");
    assert_eq!((metrics.instances, metrics.k), (1, 2));

    let run = opts.output.join("logs/run_evaluation/inproc");
    let rows = read_results(&summary.results_path);
    let preds = read_results(&run.join("preds.jsonl"));
    assert_eq!((rows.len(), preds.len()), (2, 2), "{rows:?}");
    for pred in &preds {
        assert_eq!(pred["model_name_or_path"], json!(solver.model_name()));
        let attempt = pred["attempt"].as_u64().unwrap();
        let row = rows.iter().find(|r| r["attempt"] == json!(attempt)).expect("a result per attempt");
        // The demo model cannot fix the bug: graded, not an error.
        assert!(matches!(row["status"].as_str(), Some("empty_patch" | "unresolved")), "{row}");
        let traj_path = run.join(row["trajectory"].as_str().expect("the trajectory is stored"));
        let traj: Value = serde_json::from_str(&std::fs::read_to_string(traj_path).unwrap()).unwrap();
        assert_eq!(traj["instance_id"], json!(format!("sh__greet-1.{attempt}")));
        let exit = traj["exit_reason"].as_str().unwrap();
        assert!(!exit.is_empty() && exit != "llm_query_error", "{traj}");
        assert_eq!(pred["exit_reason"], json!(exit), "the prediction carries the trajectory's exit reason");
        assert_eq!(pred["model_patch"], traj["output_patch"]);
    }
    // Both attempts ran on the one shared scheduler.
    let stats = solver.scheduler().stats();
    assert!(stats.completed.load(Ordering::Relaxed) >= 2, "{stats:?}");
}

/// The tiny Qwen3.5 checkpoint's tokenizer with the Qwen3.5 chat template (tools) over a
/// network that always writes a tool call the codec cannot read (the command straight inside
/// `<tool_call>`), on a scheduler of its own.
fn malformed_call_solver() -> AgentSolver {
    use frognano_engine::{ChatParts, Scheduler, SchedulerConfig};
    use std::sync::Arc;
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let loaded = frognano_model::load(root.join("fixtures/qwen35-tiny").to_str().unwrap()).unwrap();
    let vocab = loaded.model.vocab_size();
    let (_, mut chat) = ChatParts::split(loaded).unwrap();
    chat.template = Arc::new(
        frognano_model::chat::ChatTemplate::from_file(root.join("fixtures/tokenizer/qwen35/chat_template.jinja"))
            .unwrap(),
    );
    chat.tool_parser = chat.template.tool_parser();
    let reply = "Let me look.\n</think>\n\n<tool_call>\ncat lib.sh\n</tool_call>";
    let mut script = chat.tokenizer.encode_with(reply, false).unwrap();
    script.push(chat.eos_ids[0]);
    let model = Arc::new(frognano_testkit::ScriptedLm { vocab, script });
    let scheduler = Scheduler::start(model, SchedulerConfig::default()).unwrap();
    let config = AgentConfig {
        sampling: Sampling {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_tokens: 80,
            seed: Some(3),
            ..Sampling::default()
        },
        max_steps: 1,
        max_context_tokens: 4096,
        ..AgentConfig::default()
    };
    AgentSolver::on_scheduler("scripted", Arc::new(scheduler), chat).with_config(config)
}

/// `eval run` / `synth calibrate` with a local model sample the agent's tool calls under the
/// grammar, as `frognano solve` does (default on for a model that is not Qwen3.5): a model
/// that only writes malformed calls gets nothing done without it (its attempt ends with
/// `llm_query_error`, the broken reply recorded, an empty patch), and with it every attempt
/// runs.
#[test]
fn in_process_attempts_sample_tool_calls_under_the_grammar() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("greet");
    let base = bash_project(&repo, LIB_BUGGY);
    let line = json!({
        "instance_id": "sh__greet-2", "repo": "sh/greet", "base_commit": base,
        "patch": diff_for(&repo, "lib.sh", LIB_FIXED), "problem_statement": "greet misspells Hello.",
        "version": "0.1", "log_parser": "gotest", "test_cmd": "bash run_tests.sh",
        "FAIL_TO_PASS": ["TestGreet"], "PASS_TO_PASS": [],
    });
    let instance = parse_jsonl_instances(&format!("{line}\n"), "fixture.jsonl").unwrap().remove(0);
    let isolation = isolation();

    let free = malformed_call_solver().with_constrained_tools(Some(false)).with_isolation(isolation);
    assert!(!free.constrains_tools());
    let broken = free.solve(&instance, &repo, 0).unwrap();
    assert_eq!((broken.exit_reason.as_str(), broken.patch.as_str()), ("llm_query_error", ""));
    let traj = broken.trajectory.unwrap();
    assert!(traj["error"].as_str().unwrap().contains("malformed tool calls 4 times in a row"), "{traj}");
    let steps = traj["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "{traj}");
    assert!(steps[0]["assistant"]["content"].as_str().unwrap().contains("cat lib.sh"), "{traj}");

    // A format without a grammar (Mistral's, Granite's) samples freely by default: constraining
    // it would fail every turn.
    for parser in [ToolParser::Mistral(Default::default()), ToolParser::Granite] {
        let solver = malformed_call_solver().with_tool_parser(Some(parser)).with_constrained_tools(None);
        assert!(!solver.constrains_tools(), "{parser}");
    }
    // No architecture known (not Qwen3.5): constrained by default.
    let constrained = malformed_call_solver().with_constrained_tools(None).with_isolation(isolation);
    assert!(constrained.constrains_tools());
    for attempt in 0..3 {
        let solution =
            constrained.solve(&instance, &repo, attempt).unwrap_or_else(|e| panic!("attempt {attempt}: {e}"));
        assert_ne!(solution.exit_reason, "llm_query_error", "attempt {attempt}: {:?}", solution.trajectory);
    }
}
