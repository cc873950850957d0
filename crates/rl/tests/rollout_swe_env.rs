//! `SweEnv` over a fixture repository task made at test time (a bash project graded with the
//! go-test parser, as in frognano-swe's end-to-end tests): the verifier gives the gold patch
//! reward 1 and an empty patch 0 (partial credit in between when asked), and a rollout of the
//! demo model is recorded and scored. The model part is skipped with a message when the demo
//! model is absent, unless FROGNANO_REQUIRE_FIXTURES is set.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use frognano_engine::{ChatParts, Scheduler, SchedulerConfig};
use frognano_model::CausalLm;
use frognano_rl::env::{load_tasks, Direction, Environment, RolloutConfig, SweEnv, SweEnvOptions, SynthSource};
use frognano_rl::rollout::Outcome;
use frognano_sandbox::{Isolation, Sandbox};
use frognano_swe::instance::{parse_jsonl_instances, SweInstance};
use frognano_swe::localization::HintLevel;
use frognano_synth::calibrate::Knobs;
use frognano_testkit::{bash_project, commit, diff_for, git, write};
use serde_json::json;

const LIB_BUGGY: &str = "greet() { echo \"Helo, $1\"; }\nfarewell() { echo \"Godbye, $1\"; }\n";
const LIB_HALF: &str = "greet() { echo \"Hello, $1\"; }\nfarewell() { echo \"Godbye, $1\"; }\n";
const LIB_FIXED: &str = "greet() { echo \"Hello, $1\"; }\nfarewell() { echo \"Goodbye, $1\"; }\n";
const NEW_TESTS: &str = "TestGreet() { [ \"$(greet Bob)\" = \"Hello, Bob\" ]; }\nTestFarewell() { [ \"$(farewell Bob)\" = \"Goodbye, Bob\" ]; }\n";

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    instances: Vec<SweInstance>,
    half_patch: String,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let repo = root.join("greet");
    let base = bash_project(&repo, LIB_BUGGY);
    let gold = diff_for(&repo, "lib.sh", LIB_FIXED);
    let half_patch = diff_for(&repo, "lib.sh", LIB_HALF);
    let test_patch = diff_for(&repo, "tests/greet.t.sh", NEW_TESTS);
    // Future history: the fix lands later; the agent's workspace must not contain it.
    write(&repo, "lib.sh", LIB_FIXED);
    commit(&repo, "fix greetings");
    let line = json!({
        "instance_id": "sh__greet-1", "repo": "sh/greet", "base_commit": base,
        "repo_path": repo.to_string_lossy(),
        "patch": gold, "test_patch": test_patch,
        // The demo model cannot fix anything; the text asks for a short reply so that the
        // rollout ends by itself (exit `agent`) and reaches the verifier.
        "problem_statement": "Reply with the single word OK.",
        "version": "0.1", "log_parser": "gotest", "test_cmd": "bash run_tests.sh",
        "FAIL_TO_PASS": ["TestGreet", "TestFarewell"], "PASS_TO_PASS": ["TestTrue"],
    });
    let instances = parse_jsonl_instances(&format!("{line}\n"), "fixture.jsonl").unwrap();
    Fixture { _dir: dir, root, instances, half_patch }
}

fn isolation() -> Isolation {
    if frognano_testkit::available_or_skip(
        "bubblewrap",
        "rl/tests/rollout_swe_env.rs runs its environment unconfined",
        Sandbox::bubblewrap_available(),
    ) {
        Isolation::Bubblewrap
    } else {
        Isolation::Unconfined
    }
}

fn options(fx: &Fixture) -> SweEnvOptions {
    SweEnvOptions {
        repos: None,
        isolation: isolation(),
        work_root: fx.root.join("work"),
        test_timeout: Duration::from_secs(60),
        enable_thinking: false,
        ..SweEnvOptions::default()
    }
}

fn demo() -> Option<(Arc<dyn CausalLm>, ChatParts)> {
    let path = frognano_testkit::demo_model()?;
    Some(ChatParts::split(frognano_model::load(path.to_str().unwrap()).unwrap()).unwrap())
}

/// Chat parts for the verifier-only checks: the Qwen3.5 tokenizer is not needed there, any
/// tokenizer and template do; the demo model's when present.
fn chat_parts() -> Option<ChatParts> {
    demo().map(|(_, c)| c)
}

/// Greedy attempts of at most `max_steps` steps and 160 tokens per turn.
fn greedy(max_steps: usize) -> RolloutConfig {
    RolloutConfig {
        temperature: 0.0,
        max_tokens_per_turn: 160,
        max_steps,
        max_context_tokens: 4096,
        max_time: Some(Duration::from_secs(120)),
        partial_credit: false,
    }
}

#[test]
fn verifier_scores_gold_one_empty_zero_and_partial_credit_between() {
    let Some(chat) = chat_parts() else { return };
    let fx = fixture();
    let env = SweEnv::new("fixture", fx.instances.clone(), chat, options(&fx)).unwrap();
    assert_eq!(env.task_ids(), vec!["sh__greet-1".to_string()]);
    let id = "sh__greet-1";
    assert_eq!(env.verify(id, &fx.instances[0].patch).unwrap(), Outcome::Scored { reward: 1.0 });
    assert_eq!(env.verify(id, "").unwrap(), Outcome::Scored { reward: 0.0 });
    assert_eq!(env.verify(id, &fx.half_patch).unwrap(), Outcome::Scored { reward: 0.0 });
    let inst = env.task(id).unwrap();
    assert_eq!(env.grade(inst, &fx.half_patch, true), Outcome::Scored { reward: 0.5 });
    assert!(env.verify("nope", "").unwrap_err().to_string().contains("unknown task id"));
    // A patch that does not apply to the base commit is not the agent's reward 0.
    let bad = "diff --git a/nothere.sh b/nothere.sh\n--- a/nothere.sh\n+++ b/nothere.sh\n@@ -1 +1 @@\n-x\n+y\n";
    assert!(matches!(env.verify(id, bad).unwrap(), Outcome::Infra { .. }));
}

#[test]
fn tasks_load_from_files_and_harbor_dirs_and_bad_ones_are_refused() {
    let Some(chat) = chat_parts() else { return };
    let fx = fixture();
    let file = fx.root.join("tasks.jsonl");
    std::fs::write(&file, format!("{}\n", fx.instances[0].to_json())).unwrap();
    assert_eq!(load_tasks(&file).unwrap().len(), 1);
    let harbor = fx.root.join("harbor");
    write(&harbor, "sh__greet-1/tests/instance.json", &fx.instances[0].to_json().to_string());
    assert_eq!(load_tasks(&harbor).unwrap()[0].instance_id, "sh__greet-1");
    let twice = vec![fx.instances[0].clone(), fx.instances[0].clone()];
    let e = SweEnv::new("x", twice, chat.clone(), options(&fx)).err().unwrap();
    assert!(e.to_string().contains("appears twice"), "{e}");
    let mut no_cmd = fx.instances[0].clone();
    no_cmd.test_cmd = None;
    assert!(SweEnv::new("x", vec![no_cmd], chat, options(&fx)).is_err());
}

#[test]
fn a_rollout_on_the_fixture_task_is_recorded_and_scored() {
    let Some((model, chat)) = demo() else { return };
    let fx = fixture();
    let mut env = SweEnv::new("fixture", fx.instances.clone(), chat, options(&fx)).unwrap();
    let model = Arc::new(Scheduler::start(model, SchedulerConfig::default()).unwrap());
    let greedy = greedy(2);
    let check_shape = |r: &frognano_rl::rollout::Rollout, seed: u64| {
        assert_eq!((r.task_id.as_str(), r.seed), ("sh__greet-1", seed));
        assert!(!r.turn_starts.is_empty() && r.turn_starts.len() <= 2, "{r:?}");
        assert_eq!((r.logprobs.len(), r.weights.len()), (r.tokens.len(), r.tokens.len()));
        assert!(r.sampled_tokens() > 0 && r.weights[..r.turn_starts[0]].iter().all(|&w| w == 0));
        eprintln!("seed {seed}: exit {} outcome {:?} in {:.1}s", r.exit, r.outcome, r.wall_s);
    };
    // Either way a rollout ends, it is a limit exit (out of the loss, its reason the exit's)
    // or, when the reply stops by itself, graded: the demo model fixes nothing.
    let check_outcome = |r: &frognano_rl::rollout::Rollout| match &r.outcome {
        Outcome::Scored { reward } => assert_eq!((r.exit.as_str(), *reward), ("agent", 0.0)),
        Outcome::Limit { reason } => assert_eq!(reason, &r.exit),
        Outcome::Infra { reason } => panic!("infrastructure trouble on the fixture: {reason}"),
    };
    // Greedy, the demo model (which gets the tools described in its system prompt, its
    // template having no tool support: docs/agent.md §7.3) writes the same reply every time.
    // Whether that reply stops by itself before the per-turn limit turns on the last bits of
    // the attention sums, so both ends are accepted; the limit exit is held below.
    let r = env.rollout(&model, "sh__greet-1", &greedy, 7).unwrap();
    check_shape(&r, 7);
    check_outcome(&r);
    assert_eq!(env.rollout(&model, "sh__greet-1", &greedy, 7).unwrap().tokens, r.tokens);
    // A per-turn limit of one token cuts any reply: a limit exit, out of the loss, whose
    // last token is the policy's.
    let cut = RolloutConfig { max_tokens_per_turn: 1, ..greedy.clone() };
    let r = env.rollout(&model, "sh__greet-1", &cut, 7).unwrap();
    check_shape(&r, 7);
    assert_eq!(r.exit, "max_tokens_per_turn");
    assert_eq!(r.outcome, Outcome::Limit { reason: "max_tokens_per_turn".into() });
    assert_eq!((r.sampled_tokens(), *r.weights.last().unwrap()), (1, 1), "one token, the policy's");
    // Raw sampling (temperature 1) rambles: cut at the limit, or graded when it stops.
    let raw = RolloutConfig { temperature: 1.0, ..greedy.clone() };
    let r = env.rollout(&model, "sh__greet-1", &raw, 1).unwrap();
    check_shape(&r, 1);
    check_outcome(&r);
    assert!(env.request_tasks(Direction::Harder, 4).unwrap().is_empty());
    // Unknown ids are an error, not an outcome.
    assert!(env.rollout(&model, "nope", &greedy, 0).is_err());
}

#[test]
fn the_small_model_harness_keeps_notices_and_constrained_calls_in_one_training_sequence() {
    let Some((model, chat)) = demo() else { return };
    let fx = fixture();
    let tokenizer = Arc::clone(&chat.tokenizer);
    let opts = SweEnvOptions { hints: HintLevel::Line, ..options(&fx).small_model() };
    let env = SweEnv::new("fixture", fx.instances.clone(), chat, opts).unwrap();
    let model = Arc::new(Scheduler::start(model, SchedulerConfig::default()).unwrap());
    let greedy = greedy(3);
    // Under the Leaf harness a reply cut by the per-turn limit ends the attempt (see above);
    // here the cut earns a notice, or the constrained reply is a tool call, and the
    // run goes on: more than one turn, all of them in one sequence whose harness text
    // (notices, observations) carries no loss.
    let r = env.rollout(&model, "sh__greet-1", &greedy, 7).unwrap();
    eprintln!("exit {} outcome {:?}, {} turns", r.exit, r.outcome, r.turn_starts.len());
    assert!(!matches!(r.outcome, Outcome::Infra { .. }), "{:?}", r.outcome);
    assert!(r.turn_starts.len() >= 2, "the harness kept the run going: {} turns, exit {}", r.turn_starts.len(), r.exit);
    let between = &r.weights[r.turn_starts[0]..r.turn_starts[1]];
    assert!(between.contains(&1) && between.contains(&0), "a sampled turn, then harness text");
    // The issue the policy was given says where the fix goes (`--hints line`).
    let prompt = tokenizer.decode(&r.tokens[..r.turn_starts[0]], false).unwrap();
    assert!(prompt.contains("Reply with the single word OK.\n\nHint: the code to fix is `lib.sh`, line"), "{prompt}");
}

/// The synth fixture project (crates/synth/tests/fixtures/pyproj) as a git repository.
fn pyproj_repo(root: &Path) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../synth/tests/fixtures/pyproj");
    let dest = root.join("pyproj");
    frognano_testkit::copy_fixture_dir(&src, &dest);
    std::fs::write(dest.join(".gitignore"), "__pycache__/\n").unwrap();
    git(&dest, &["init", "-q"]);
    commit(&dest, "fixture");
    dest
}

#[test]
fn request_tasks_synthesizes_more_from_the_source_repository() {
    let Some(chat) = chat_parts() else { return };
    let fx = fixture();
    let repo = pyproj_repo(&fx.root);
    let mut source = SynthSource::new(&repo, fx.root.join("synth-out"));
    source.max_candidates = 6;
    source.workers = 1;
    source.python = Some(PathBuf::from("python3"));
    let mut env = SweEnv::from_synth(source, chat, options(&fx)).unwrap();
    assert!(env.task_ids().is_empty());
    let new = env.request_tasks(Direction::Easier, 2).unwrap();
    assert!(!new.is_empty() && new.len() <= 2, "{new:?}");
    assert_eq!(env.task_ids().len(), new.len());
    assert_eq!(env.knobs(), Some(Knobs::default()), "easier than the easiest knobs stays there");
    assert!(env.levels().values().all(|&l| l == 0));
    // Each new task is gradable: its gold patch resolves it.
    let id = &new[0];
    let gold = env.task(id).unwrap().patch.clone();
    assert_eq!(env.verify(id, &gold).unwrap(), Outcome::Scored { reward: 1.0 });
}
