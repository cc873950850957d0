//! The model-written issue path with a real model in process: SmolLM2-135M-Instruct
//! (`models/SmolLM2-135M-Instruct.Q4_1.gguf`, repo-relative) writes the issue of one task
//! synthesized from the Python fixture. The task's text must be either model text that passes
//! the leak check or the template text with the recorded rejection reasons. Skipped (loudly)
//! when the model file is absent, unless `FROGNANO_REQUIRE_FIXTURES` is set.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use frognano_agent::engine_llm::EngineLlm;
use frognano_sandbox::Isolation;
use frognano_synth::intake::Source;
use frognano_synth::issue::{leak_problems, IssueContext};
use frognano_synth::issue_model::IssueModel;
use frognano_synth::pipeline::{synthesize, GenOptions, SynthOptions};
use frognano_synth::project::TestRunner;

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name().to_string_lossy().replace(".fixture", ""));
        if e.path().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

fn model_path() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var_os("FROGNANO_REQUIRE_FIXTURES").is_none(),
        "FROGNANO_REQUIRE_FIXTURES is set but {} is missing",
        p.display()
    );
    eprintln!("SKIPPED: {} not found; the real-model issue test did not run", p.display());
    None
}

#[test]
fn real_model_writes_or_falls_back_on_a_fixture_task() {
    let Some(model) = model_path() else { return };
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
        progress: false,
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
