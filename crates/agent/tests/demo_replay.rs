//! The bundled demo: replaying its recorded trajectory through `frognano solve --replay`
//! yields a patch that makes the failing test pass.
//!
//! The recorded trajectory (`demo/fix-median.trajectory.json`) was made by our own loop with
//! the scripted replies in `record_demo_trajectory`; regenerate it with
//! `cargo test -p frognano-agent --test integration demo_replay:: -- --ignored`.

use crate::common;

use common::{Reply, ScriptedLlm};
use frognano_agent::agent::{self, AgentConfig};
use frognano_agent::demo;
use frognano_agent::solve::{solve, ModelChoice, SolveConfig, TaskInput};
use frognano_agent::tools::ToolBox;
use frognano_agent::trajectory::{ExitReason, Trajectory};
use frognano_agent::workspace::{apply_patch, Workspace};
use frognano_sandbox::{Isolation, Sandbox, SandboxSpec};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;

fn demo_tests_pass(repo: &Path) -> bool {
    Command::new("bash").args(["-c", demo::DEMO_TEST_COMMAND]).current_dir(repo).output().unwrap().status.success()
}

fn trajectory_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("demo/fix-median.trajectory.json")
}

const SCRIPT: [&str; 5] = [
    "The issue is about median(). Let me read stats.py.\n</think>\n\n<tool_call>\n<function=Read>\n<parameter=file_path>\nstats.py\n</parameter>\n</function>\n</tool_call>",
    "median() returns the upper middle element for even lengths. Let me confirm with the tests.\n</think>\n\n<tool_call>\n<function=Bash>\n<parameter=command>\npython3 -m unittest test_stats 2>&1 | tail -5\n</parameter>\n<parameter=description>\nRun the tests\n</parameter>\n</function>\n</tool_call>",
    "test_median_even fails as described. Average the two middle values for even lengths.\n</think>\n\n<tool_call>\n<function=Edit>\n<parameter=file_path>\nstats.py\n</parameter>\n<parameter=old_string>\n    return ordered[middle]\n</parameter>\n<parameter=new_string>\n    if len(ordered) % 2 == 0:\n        return (ordered[middle - 1] + ordered[middle]) / 2\n    return ordered[middle]\n</parameter>\n</function>\n</tool_call>",
    "Now run the tests again.\n</think>\n\n<tool_call>\n<function=Bash>\n<parameter=command>\npython3 -m unittest test_stats 2>&1 | tail -3\n</parameter>\n</function>\n</tool_call>",
    "All four tests pass.\n</think>\n\nFixed `median()` for even-length lists: it now returns the mean of the two middle values. All tests in test_stats pass.",
];

#[test]
#[ignore = "regenerates demo/fix-median.trajectory.json"]
fn record_demo_trajectory() {
    let root = tempfile::tempdir().unwrap();
    let repo = demo::materialize(&root.path().join("demo-repo")).unwrap();
    let ws = Workspace::create(&repo, false).unwrap();
    let mut tools = ToolBox::new(Sandbox::new(SandboxSpec::new(ws.path())).unwrap());
    let mut llm = ScriptedLlm::new(SCRIPT.iter().map(|t| Reply::Text(t)).collect());
    let config = AgentConfig { instance_id: "demo".into(), ..AgentConfig::default() };
    let mut t = agent::run(&mut llm, &mut tools, demo::DEMO_ISSUE, &config, &AtomicBool::new(false), &mut |_| {});
    assert_eq!(t.exit_reason, ExitReason::Agent);
    t.output_patch = ws.diff(Isolation::Bubblewrap).unwrap().text();
    assert!(t.steps[3].observations[0].observation.contains("OK"), "{:?}", t.steps[3]);
    t.save(&trajectory_path()).unwrap();
}

#[test]
fn the_recorded_demo_trajectory_is_valid() {
    let t = Trajectory::load(&trajectory_path()).unwrap();
    assert_eq!(t.exit_reason, ExitReason::Agent);
    assert_eq!(t.n_steps, 5);
    assert!(t.output_patch.contains("+    if len(ordered) % 2 == 0:"));
    assert_eq!(serde_json::from_str::<Trajectory>(demo::DEMO_TRAJECTORY).unwrap(), t);
}

#[test]
fn replaying_the_demo_trajectory_fixes_the_failing_test() {
    let out = tempfile::tempdir().unwrap();
    let output = out.path().join("run");
    let args = SolveConfig {
        task: TaskInput::Demo,
        model: ModelChoice::Replay(trajectory_path()),
        output: Some(output.clone()),
        ..SolveConfig::for_repo(".")
    };
    let report = solve(&args).unwrap();
    let t = &report.trajectory;
    assert_eq!(t.exit_reason, ExitReason::Agent);
    assert_eq!(t.n_steps, 5);
    // The replay really ran the tools: the second test run passes.
    assert!(t.steps[1].observations[0].observation.contains("FAILED (failures=1)"));
    assert!(t.steps[3].observations[0].observation.contains("\nOK\n"));

    // Output: trajectory, patch, summary.
    let patch = std::fs::read_to_string(output.join("patch.diff")).unwrap();
    assert_eq!(patch, t.output_patch);
    assert!(patch.starts_with("diff --git a/stats.py b/stats.py"), "{patch}");
    assert_eq!(Trajectory::load(&output.join("trajectory.json")).unwrap(), *t);
    let summary = std::fs::read_to_string(output.join("summary.md")).unwrap();
    assert!(summary.contains("- exit reason: agent") && summary.contains("- stats.py"));

    // The patch turns the failing test green on a fresh copy of the demo repository.
    let fresh = demo::materialize(&out.path().join("fresh")).unwrap();
    assert!(!demo_tests_pass(&fresh));
    apply_patch(&fresh, patch.as_bytes()).unwrap();
    assert!(demo_tests_pass(&fresh));
}

#[test]
fn replaying_past_the_recording_is_a_clear_error() {
    let mut t = Trajectory::load(&trajectory_path()).unwrap();
    t.messages.truncate(4); // system, user, first assistant call, its result
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.json");
    t.save(&short).unwrap();
    let args = SolveConfig {
        task: TaskInput::Demo,
        model: ModelChoice::Replay(short),
        output: Some(dir.path().join("run")),
        ..SolveConfig::for_repo(".")
    };
    let report = solve(&args).unwrap();
    assert_eq!(report.trajectory.exit_reason, ExitReason::LlmQueryError);
    assert!(report.trajectory.error.as_deref().unwrap().contains("no more assistant messages"));
}
