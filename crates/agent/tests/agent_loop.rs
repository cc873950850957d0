//! The loop with a scripted model: exit reasons, limits and drift guards.

use crate::common;

use common::{Reply, ScriptedLlm};
use frognano_agent::agent::{self, AgentConfig, Guards, ACT_NOTICE, CUT_NOTICE, MALFORMED_NOTICE, REPEAT_NOTICE};
use frognano_agent::tools::ToolBox;
use frognano_agent::trajectory::{ExitReason, Trajectory};
use frognano_protocol::ToolChoice;
use frognano_sandbox::{Sandbox, SandboxSpec};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

const ECHO: &str = "Let me look.\n</think>\n\n<tool_call>\n<function=Bash>\n<parameter=command>\necho hi\n</parameter>\n</function>\n</tool_call>";
const DONE: &str = "All good.\n</think>\n\nDone: nothing to change.";
const MALFORMED: &str =
    "Let me look.\n</think>\n\n<tool_call>\n<function=Bash>\ncommand: echo hi\n</function>\n</tool_call>";

/// An empty git repository with one commit (the act notice reads `git status`).
fn git_repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap()
            .status
            .success();
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q"]);
    git(&["commit", "-q", "--allow-empty", "-m", "start"]);
    dir
}

fn run_with(replies: Vec<Reply>, config: AgentConfig) -> (Trajectory, ScriptedLlm, tempfile::TempDir) {
    let dir = git_repo();
    let mut tools = ToolBox::new(Sandbox::new(SandboxSpec::new(dir.path())).unwrap());
    let mut llm = ScriptedLlm::new(replies);
    let mut checkpoints = 0;
    let t = agent::run(&mut llm, &mut tools, "Fix it.", &config, &AtomicBool::new(false), &mut |t| {
        assert!(t.partial);
        checkpoints += 1;
    });
    assert_eq!(checkpoints, t.steps.iter().filter(|s| !s.observations.is_empty()).count());
    (t, llm, dir)
}

/// The default guards without the act notice, for runs that answer after a Bash call only.
fn config() -> AgentConfig {
    AgentConfig { guards: Guards { act_notice: false, ..Guards::default() }, ..AgentConfig::default() }
}

fn history_text(t: &Trajectory) -> String {
    serde_json::to_string(&t.messages).unwrap()
}

#[test]
fn a_plain_run_records_a_leaf_trajectory() {
    let (t, _, _) = run_with(vec![Reply::Text(ECHO), Reply::Text(DONE)], config());
    assert_eq!(t.trajectory_format, "leaf-function-calling");
    assert_eq!(t.exit_reason, ExitReason::Agent);
    assert_eq!(t.n_steps, 2);
    assert_eq!(t.final_message, "Done: nothing to change.");
    assert!(!t.partial);
    let roles: Vec<&str> = t.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant"]);
    assert_eq!(t.messages[2].reasoning_content.as_deref(), Some("Let me look."));
    assert_eq!(t.messages[3].tool_call_id.as_deref(), Some(t.messages[2].calls()[0].id.as_str()));
    assert_eq!(t.messages[3].text(), "Exit code: 0\nSTDOUT:\nhi\n\nSTDERR:\n");
    assert_eq!(t.steps[0].observations[0].tool, "Bash");
    assert!(t.messages[0].text().starts_with("You are a software-engineering agent"));
    // The JSON has the Leaf field names.
    let v = serde_json::to_value(&t).unwrap();
    for key in [
        "trajectory_id",
        "instance_id",
        "seed",
        "messages",
        "tools",
        "steps",
        "n_steps",
        "exit_reason",
        "error",
        "final_message",
        "context_tokens",
        "elapsed_sec",
        "output_patch",
        "partial",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["exit_reason"], "agent");
}

#[test]
fn a_malformed_reply_is_retried_and_never_enters_the_history() {
    let (t, llm, _) =
        run_with(vec![Reply::Text(MALFORMED), Reply::Text(MALFORMED), Reply::Text(ECHO), Reply::Text(DONE)], config());
    assert_eq!(t.exit_reason, ExitReason::Agent);
    assert_eq!(t.n_steps, 2);
    let history = history_text(&t);
    assert!(!history.contains("command: echo hi"), "malformed text leaked: {history}");
    assert!(!history.contains(MALFORMED_NOTICE));
    // The retries saw their broken reply and the notice, on a copy of the history.
    assert_eq!(llm.requests.len(), 4);
    let retry = &llm.requests[1];
    assert_eq!(retry.len(), 4);
    assert!(retry[2].text().contains("command: echo hi"));
    assert!(retry[3].text().starts_with(MALFORMED_NOTICE));
    // It shows the call written right, in the model's format.
    assert!(retry[3].text().ends_with("write each call exactly as <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>"), "{}", retry[3].text());
    // The retries must be one call (the grammar enforces it where calls are constrained); the
    // next real request is the clean history, calls optional again.
    assert_eq!(llm.tool_choices, [ToolChoice::Auto, ToolChoice::One, ToolChoice::One, ToolChoice::Auto]);
    assert_eq!(llm.requests[3].len(), 4);
    assert!(llm.requests[3].iter().all(|m| !m.text().contains(MALFORMED_NOTICE)));
}

#[test]
fn malformed_replies_past_the_retries_end_the_run_with_an_error() {
    let (t, llm, _) = run_with(vec![Reply::Text(MALFORMED); 4], AgentConfig::default());
    assert_eq!(llm.requests.len(), 4);
    assert_eq!(t.exit_reason, ExitReason::LlmQueryError);
    assert!(t.error.as_deref().unwrap().contains("malformed tool calls 4 times in a row"));
    assert!(!history_text(&t).contains("command: echo hi"));
    // The last broken reply is the run's one step, for whoever reviews it.
    assert_eq!(t.steps.len(), 1);
    assert_eq!((t.steps[0].assistant.text().as_ref(), t.steps[0].observations.len()), (MALFORMED, 0));
}

#[test]
fn leaf_exact_takes_a_malformed_reply_as_the_final_answer() {
    let config = AgentConfig { guards: Guards::leaf_exact(), ..AgentConfig::default() };
    let (t, llm, _) = run_with(vec![Reply::Text(MALFORMED)], config);
    assert_eq!(llm.requests.len(), 1);
    assert_eq!(t.exit_reason, ExitReason::Agent);
    assert!(t.final_message.contains("command: echo hi"));
}

/// A Bash call that changes the workspace.
const SED: &str = "Patching.\n</think>\n\n<tool_call>\n<function=Bash>\n<parameter=command>\necho fixed > notes.txt\n</parameter>\n</function>\n</tool_call>";

/// A Write that succeeds.
const WRITE: &str = "Writing it.\n</think>\n\n<tool_call>\n<function=Write>\n<parameter=file_path>\nnotes.txt\n</parameter>\n<parameter=content>\nfixed\n</parameter>\n</function>\n</tool_call>";

/// What a small instruction model writes first: the fix in a code block, nothing applied.
const ESSAY: &str = "To fix median, change it to:\n```python\ndef median(xs): ...\n```";

#[test]
fn an_answer_before_any_work_gets_a_notice_to_use_the_tools() {
    // Essay, notice, then the model works and finishes.
    let (t, llm, _) = run_with(vec![Reply::Text(ESSAY), Reply::Text(WRITE), Reply::Text(DONE)], AgentConfig::default());
    assert_eq!((t.exit_reason, t.n_steps), (ExitReason::Agent, 3));
    assert_eq!(t.final_message, "Done: nothing to change.");
    let notice = llm.requests[1].last().unwrap();
    assert_eq!(notice.role, "user");
    assert!(notice.text().starts_with(ACT_NOTICE), "{}", notice.text());
    let essay = |m: &frognano_protocol::Message| {
        format!("{}{}", m.text(), m.reasoning_content.as_deref().unwrap_or("")).contains("def median")
    };
    assert!(llm.requests[1].iter().any(essay), "the essay stays in the history");
    // The reply to the notice must be one tool call; the others may answer.
    use frognano_protocol::ToolChoice::{Auto, One};
    assert_eq!(llm.tool_choices, [Auto, One, Auto]);
    // At most twice a run: the third essay is the final answer.
    let (t, llm, _) = run_with(vec![Reply::Text(ESSAY); 4], AgentConfig::default());
    assert_eq!((t.exit_reason, t.n_steps, llm.requests.len()), (ExitReason::Agent, 3, 3));
    // Once a Write (or Edit) has changed a file, an answer ends the run at once; a Bash
    // call that changed nothing does not count.
    let (t, _, _) = run_with(vec![Reply::Text(WRITE), Reply::Text(ESSAY)], AgentConfig::default());
    assert_eq!((t.exit_reason, t.n_steps), (ExitReason::Agent, 2));
    let (t, llm, _) = run_with(
        vec![Reply::Text(ECHO), Reply::Text(ESSAY), Reply::Text(ESSAY), Reply::Text(DONE)],
        AgentConfig::default(),
    );
    assert_eq!((t.exit_reason, t.n_steps, llm.requests.len()), (ExitReason::Agent, 4, 4));
    // A file changed through Bash counts too (git status sees it).
    let (t, _, _) = run_with(vec![Reply::Text(SED), Reply::Text(ESSAY)], AgentConfig::default());
    assert_eq!((t.exit_reason, t.n_steps), (ExitReason::Agent, 2));
    // Leaf rules: the first answer ends the run.
    let config = AgentConfig { guards: Guards::leaf_exact(), ..AgentConfig::default() };
    let (t, _, _) = run_with(vec![Reply::Text(ESSAY), Reply::Text(DONE)], config);
    assert_eq!((t.exit_reason, t.n_steps), (ExitReason::Agent, 1));
}

#[test]
fn a_cut_reply_ends_a_leaf_run() {
    let config = AgentConfig { guards: Guards::leaf_exact(), ..AgentConfig::default() };
    let (t, _, _) = run_with(vec![Reply::Cut("thinking forever")], config);
    assert_eq!(t.exit_reason, ExitReason::MaxTokensPerTurn);
}

#[test]
fn a_cut_reply_gets_a_notice_with_guards_on() {
    let (t, llm, _) = run_with(vec![Reply::Cut("thinking forever"), Reply::Text(ECHO), Reply::Text(DONE)], config());
    assert_eq!(t.exit_reason, ExitReason::Agent);
    assert_eq!(t.n_steps, 3);
    assert!(llm.requests[1].last().unwrap().text().starts_with(CUT_NOTICE));
    // Cut three times in a row: give up as Leaf would.
    let (t, _, _) = run_with(vec![Reply::Cut("a"), Reply::Cut("b"), Reply::Cut("c")], config());
    assert_eq!(t.exit_reason, ExitReason::MaxTokensPerTurn);
    assert_eq!(t.n_steps, 3);
}

#[test]
fn step_limit_time_limit_context_limit_and_query_errors() {
    let config = AgentConfig { max_steps: 2, ..AgentConfig::default() };
    let (t, _, _) = run_with(vec![Reply::Text(ECHO), Reply::Text(ECHO), Reply::Text(ECHO)], config);
    assert_eq!((t.exit_reason, t.n_steps), (ExitReason::MaxTurns, 2));

    let config = AgentConfig { max_time: Some(Duration::ZERO), ..AgentConfig::default() };
    let (t, _, _) = run_with(vec![Reply::Text(ECHO)], config);
    assert_eq!((t.exit_reason, t.n_steps), (ExitReason::MaxTime, 0));

    let config = AgentConfig { max_context_tokens: 100, ..AgentConfig::default() };
    let (t, _, _) = run_with(vec![Reply::Text(ECHO), Reply::Text(ECHO)], config);
    assert_eq!((t.exit_reason, t.n_steps), (ExitReason::MaxContextLen, 1));
    assert!(t.context_tokens >= 100);

    let (t, _, _) = run_with(vec![Reply::Text(ECHO), Reply::Fail("connection reset")], AgentConfig::default());
    assert_eq!(t.exit_reason, ExitReason::LlmQueryError);
    assert_eq!(t.error.as_deref(), Some("connection reset"));
}

#[test]
fn cancelling_stops_before_the_next_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut tools = ToolBox::new(Sandbox::new(SandboxSpec::new(dir.path())).unwrap());
    let mut llm = ScriptedLlm::new(vec![Reply::Text(ECHO), Reply::Text(ECHO)]);
    let cancel = AtomicBool::new(false);
    let t = agent::run(&mut llm, &mut tools, "x", &AgentConfig::default(), &cancel, &mut |_| {
        cancel.store(true, std::sync::atomic::Ordering::Relaxed)
    });
    assert_eq!((t.exit_reason, t.n_steps), (ExitReason::Cancelled, 1));
}

#[test]
fn repeated_identical_actions_are_pointed_out() {
    let script = || vec![Reply::Text(ECHO), Reply::Text(ECHO), Reply::Text(ECHO), Reply::Text(DONE)];
    let (t, _, _) = run_with(script(), AgentConfig::default());
    let obs: Vec<&str> = t.steps.iter().flat_map(|s| &s.observations).map(|o| o.observation.as_str()).collect();
    assert!(!obs[1].contains(REPEAT_NOTICE));
    assert!(obs[2].contains(&format!("{REPEAT_NOTICE} 3 times in a row")), "{}", obs[2]);
    // The model sees it too.
    assert!(t.messages[7].text().contains(REPEAT_NOTICE));

    let config = AgentConfig { guards: Guards::leaf_exact(), ..AgentConfig::default() };
    let (t, _, _) = run_with(script(), config);
    assert!(!history_text(&t).contains(REPEAT_NOTICE));
}

#[test]
fn the_last_steps_are_announced() {
    let config = AgentConfig { max_steps: 3, ..AgentConfig::default() };
    let (t, _, _) = run_with(vec![Reply::Text(ECHO), Reply::Text(ECHO), Reply::Text(ECHO)], config);
    assert!(t.steps[0].observations[0]
        .observation
        .ends_with("[2 step(s) left: finish the work and give your final answer.]"));
    assert!(t.steps[1].observations[0]
        .observation
        .ends_with("[1 step(s) left: finish the work and give your final answer.]"));
    let config = AgentConfig { max_steps: 3, guards: Guards::leaf_exact(), ..AgentConfig::default() };
    let (t, _, _) = run_with(vec![Reply::Text(ECHO), Reply::Text(ECHO), Reply::Text(ECHO)], config);
    assert!(!history_text(&t).contains("step(s) left"));
}

#[test]
fn parallel_calls_run_in_order_with_their_ids() {
    const TWO: &str = "</think>\n\n<tool_call>\n<function=Write>\n<parameter=file_path>\nnote.txt\n</parameter>\n<parameter=content>\nfirst\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=Read>\n<parameter=file_path>\nnote.txt\n</parameter>\n</function>\n</tool_call>";
    let (t, _, _) = run_with(vec![Reply::Text(TWO), Reply::Text(DONE)], AgentConfig::default());
    assert_eq!(t.messages[3].text(), "Wrote note.txt (5 bytes).");
    assert_eq!(t.messages[4].text(), "note.txt\n1. first");
    let calls = t.messages[2].calls();
    assert_eq!(t.messages[3].tool_call_id.as_deref(), Some(calls[0].id.as_str()));
    assert_eq!(t.messages[4].tool_call_id.as_deref(), Some(calls[1].id.as_str()));
}

#[test]
fn every_notice_to_the_model_is_reported_as_an_event() {
    let dir = git_repo();
    let mut tools = ToolBox::new(Sandbox::new(SandboxSpec::new(dir.path())).unwrap());
    let mut llm = ScriptedLlm::new(vec![
        Reply::Text(ESSAY),
        Reply::Text(MALFORMED),
        Reply::Cut("long"),
        Reply::Text(ECHO),
        Reply::Text(DONE),
        Reply::Text(DONE),
    ]);
    let mut notices = Vec::new();
    let t = agent::run_with_events(
        &mut llm,
        &mut tools,
        "Fix it.",
        &AgentConfig::default(),
        &AtomicBool::new(false),
        &mut |_| {},
        &mut |e| {
            if let agent::AgentEvent::Notice { step, notice } = e {
                notices.push((step, notice.to_string()));
            }
        },
    );
    assert_eq!(t.exit_reason, ExitReason::Agent);
    let got: Vec<(usize, &str)> = notices.iter().map(|(s, n)| (*s, &n[..12])).collect();
    // The answer after a Bash call that changed nothing gets the second act notice.
    let expected =
        [(0, &ACT_NOTICE[..12]), (1, &MALFORMED_NOTICE[..12]), (1, &CUT_NOTICE[..12]), (3, &ACT_NOTICE[..12])];
    assert_eq!(got, expected, "{notices:?}");
}

/// A reply calling `tool` with `params`, in the Qwen XML the scripted model writes.
fn call(tool: &str, params: &[(&str, &str)]) -> Reply {
    let body: String = params.iter().map(|(k, v)| format!("<parameter={k}>\n{v}\n</parameter>\n")).collect();
    let text = format!("Next.\n</think>\n\n<tool_call>\n<function={tool}>\n{body}</function>\n</tool_call>");
    Reply::Text(Box::leak(text.into_boxed_str()))
}

#[test]
fn edits_of_a_file_the_run_has_not_read_are_refused_until_it_reads_it() {
    let run = |guards: Guards| {
        let dir = git_repo();
        std::fs::write(dir.path().join("notes.txt"), "alpha\n").unwrap();
        let edit = || call("Edit", &[("file_path", "notes.txt"), ("old_string", "alpha"), ("new_string", "beta")]);
        let absolute = dir.path().join("notes.txt").to_string_lossy().into_owned();
        let replies = vec![
            edit(),
            call("Read", &[("file_path", &absolute)]),
            edit(),
            call("Write", &[("file_path", "new.txt"), ("content", "fresh")]),
            call("Edit", &[("file_path", "new.txt"), ("old_string", "fresh"), ("new_string", "newer")]),
            Reply::Text(DONE),
        ];
        let mut tools = ToolBox::new(Sandbox::new(SandboxSpec::new(dir.path())).unwrap());
        let config = AgentConfig { guards, ..AgentConfig::default() };
        let t = agent::run(
            &mut ScriptedLlm::new(replies),
            &mut tools,
            "Fix it.",
            &config,
            &AtomicBool::new(false),
            &mut |_| {},
        );
        assert_eq!(t.exit_reason, ExitReason::Agent);
        let observations: Vec<String> =
            t.steps.iter().flat_map(|s| s.observations.iter().map(|o| o.observation.clone())).collect();
        (
            observations,
            std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
            std::fs::read_to_string(dir.path().join("new.txt")).unwrap(),
        )
    };
    let (obs, notes, new) = run(Guards::default());
    assert_eq!(
        obs[0],
        "PermissionError: notes.txt has not been read in this session: Read it first, then Edit its current text (or Write it whole)"
    );
    // A Read by absolute path counts for the relative one; the refused edit changed nothing
    // and the one after the Read went through; a file the run wrote needs no Read.
    assert!(obs[1].contains("alpha"), "{}", obs[1]);
    assert!(obs[2].starts_with("Edited notes.txt"), "{}", obs[2]);
    assert!(obs[4].starts_with("Edited new.txt"), "{}", obs[4]);
    assert_eq!((notes.as_str(), new.as_str()), ("beta\n", "newer"));
    // The Leaf harness has no such guard: the first, blind edit goes through.
    let (obs, notes, _) = run(Guards::leaf_exact());
    assert!(obs[0].starts_with("Edited notes.txt"), "{}", obs[0]);
    assert!(obs[2].starts_with("ValueError"), "the second edit finds no alpha: {}", obs[2]);
    assert_eq!(notes, "beta\n");
}
