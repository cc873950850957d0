//! The model-written issue path with a real model in process: SmolLM2-135M-Instruct
//! (`models/SmolLM2-135M-Instruct.Q4_1.gguf`, repo-relative) writes the issue of one task
//! synthesized from the Python fixture. The task's text must be either model text that passes
//! the leak check or the template text with the recorded rejection reasons. Skipped (loudly)
//! when the model file is absent, unless `FROGNANO_REQUIRE_FIXTURES` is set.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use frognano_engine::EngineLlm;
use frognano_sandbox::Isolation;
use frognano_synth::intake::Source;
use frognano_synth::issue::{leak_problems, IssueContext};
use frognano_synth::issue_model::IssueModel;
use frognano_synth::pipeline::{synthesize, GenOptions, SynthOptions};
use frognano_synth::project::TestRunner;
use frognano_testkit::{copy_fixture_dir as copy_dir, git};

#[test]
fn real_model_writes_or_falls_back_on_a_fixture_task() {
    let Some(model) = frognano_testkit::demo_model() else { return };
    let llm = EngineLlm::load(model.to_str().unwrap()).unwrap();
    let issue_model = Arc::new(IssueModel::new(Box::new(llm), 3));

    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("pyproj");
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pyproj"), &repo);
    std::fs::write(repo.join(".gitignore"), "__pycache__/\n").unwrap();
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "fixture"]);
    let out = tmp.path().join("out");
    let opts = SynthOptions {
        source: Source::Local { path: repo.clone(), commit: None },
        out: out.clone(),
        gen: GenOptions { seed: 1, min_complexity: 3, operators: None, max_candidates: 20 },
        workers: 2,
        max_tasks: Some(1),
        combine: 0,
        max_combos: 0,
        min_timeout: Duration::from_secs(120),
        max_f2p_fraction: 0.5,
        isolation: Isolation::Bubblewrap,
        python: Some(PathBuf::from("python3")),
        harbor: None,
        issue_model: Some(issue_model.clone()),
    };
    let summary = synthesize(&opts).unwrap();
    assert_eq!(summary.tasks_accepted, 1, "{summary:?}");
    let tasks = frognano_swe::load_instances(&out.join("tasks.jsonl")).unwrap();
    let inst = &tasks[0];
    let issue = &inst.extra["synth"]["issue"];
    eprintln!("issue record: {issue}\n--- text ---\n{}", inst.problem_statement);
    assert_eq!(issue["model"].as_str(), Some(issue_model.description()));

    // Rebuild the leak check's context from what the task holds: the bug diff is the
    // reversed gold patch; the failing checks and operators come from the instance.
    let bug_diff: String = inst
        .patch
        .lines()
        .map(|l| match l.as_bytes().first() {
            Some(b'+') if !l.starts_with("+++") => format!("-{}", &l[1..]),
            Some(b'-') if !l.starts_with("---") => format!("+{}", &l[1..]),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let operators: Vec<String> = serde_json::from_value(inst.extra["synth"]["operators"].clone()).unwrap();
    let ctx = IssueContext {
        runner: TestRunner::Unittest,
        bug_log: "",
        fail_to_pass: &inst.fail_to_pass,
        pass_to_pass: &inst.pass_to_pass,
        tree: &repo,
        bug_diff: &bug_diff,
        entities: &[],
        operators: &operators,
    };
    match issue["generator"].as_str() {
        Some("model") => {
            let problems = leak_problems(&inst.problem_statement, &ctx);
            assert!(problems.is_empty(), "model text leaks: {problems:?}");
            assert!(!inst.problem_statement.trim().is_empty());
        }
        Some("template") => {
            let reasons = issue["rejections"].as_array().expect("rejection reasons recorded");
            assert_eq!(reasons.len(), 3, "{issue}");
            assert!(reasons.iter().all(|r| r.as_array().is_some_and(|a| !a.is_empty())), "{issue}");
            // The template writer's own output also passes the check.
            assert!(leak_problems(&inst.problem_statement, &ctx).is_empty());
        }
        other => panic!("unexpected generator {other:?}: {issue}"),
    }
}
