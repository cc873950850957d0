//! End to end for the Go and JavaScript/TypeScript support: a fixture project (Go with
//! `go test`, JavaScript with `node --test`, TypeScript with vitest) turned into a git
//! repository yields validated tasks whose gold patches resolve under frognano-swe's grader
//! (the same sandbox, no network) and whose empty patches resolve none.

use std::path::{Path, PathBuf};
use std::time::Duration;

use frognano_sandbox::Isolation;
use frognano_swe::executor::ExecOptions;
use frognano_swe::instance::{gold_predictions, Prediction};
use frognano_swe::runs::{grade, GradeOptions};
use frognano_swe::SweInstance;
use frognano_synth::intake::Source;
use frognano_synth::pipeline::{synthesize, GenOptions, SynthOptions};
use frognano_testkit::{copy_fixture_dir as copy_dir, git};

fn fixture_repo(name: &str, root: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let dest = root.join(name);
    copy_dir(&src, &dest);
    std::fs::write(dest.join(".gitignore"), "node_modules\n").unwrap();
    git(&dest, &["init", "-q"]);
    git(&dest, &["add", "-A"]);
    git(&dest, &["commit", "-q", "-m", "fixture"]);
    dest
}

fn options(repo: &Path, out: &Path, max_candidates: usize, max_tasks: usize) -> SynthOptions {
    SynthOptions {
        source: Source::Local { path: repo.to_path_buf(), commit: None },
        out: out.to_path_buf(),
        gen: GenOptions { seed: 1, min_complexity: 3, operators: None, max_candidates },
        workers: 2,
        max_tasks: Some(max_tasks),
        combine: 0,
        max_combos: 0,
        min_timeout: Duration::from_secs(120),
        max_f2p_fraction: 0.5,
        isolation: Isolation::Bubblewrap,
        python: None,
        harbor: None,
        issue_model: None,
    }
}

fn grade_all(instances: &[SweInstance], preds: Vec<Prediction>, out: &Path, run_id: &str) -> usize {
    let opts = GradeOptions {
        run_id: run_id.into(),
        output: out.to_path_buf(),
        workers: 2,
        shard: None,
        exec: ExecOptions {
            repos: None,
            timeout: Duration::from_secs(300),
            isolation: Isolation::Bubblewrap,
            work_root: out.to_path_buf(),
        },
    };
    grade(instances.to_vec(), preds, &opts).unwrap().resolved
}

/// Synthesises up to `want` tasks from fixture `name` and checks them under the grader.
fn synth_and_grade(name: &str, parser: &str, want: usize, max_candidates: usize) -> Vec<SweInstance> {
    let tmp = tempfile::tempdir().unwrap();
    let repo = fixture_repo(name, tmp.path());
    let out = tmp.path().join("out");
    let summary = synthesize(&options(&repo, &out, max_candidates, want)).unwrap();
    let instances = frognano_swe::load_instances(&out.join("tasks.jsonl")).unwrap();
    assert_eq!(instances.len(), want, "{name}: {summary:?}");
    for inst in &instances {
        assert_eq!(inst.log_parser.as_deref(), Some(parser));
        assert!(!inst.fail_to_pass.is_empty() && !inst.pass_to_pass.is_empty(), "{}", inst.instance_id);
        // The bug lives in the code, never in a test file.
        for path in frognano_swe::eval_script::diff_paths(&inst.patch) {
            assert!(!frognano_synth::project::is_test_path(&path), "{}: mutated {path}", inst.instance_id);
        }
    }
    assert_eq!(grade_all(&instances, gold_predictions(&instances), &out, "gold"), instances.len());
    // A patch that applies and runs the suite but leaves the bug in place resolves nothing.
    let unrelated = "diff --git a/NOTES.md b/NOTES.md\nnew file mode 100644\n--- /dev/null\n+++ b/NOTES.md\n@@ -0,0 +1 @@\n+not a fix\n";
    let no_fix: Vec<Prediction> = instances
        .iter()
        .map(|i| Prediction {
            instance_id: i.instance_id.clone(),
            model_name_or_path: "no-fix".into(),
            model_patch: Some(unrelated.into()),
            extra: Default::default(),
        })
        .collect();
    assert_eq!(grade_all(&instances, no_fix, &out, "no-fix"), 0);
    instances
}

#[test]
fn go_module_yields_gradable_tasks() {
    let instances = synth_and_grade("gomod", "parse_log_gotest", 3, 40);
    let env = &instances[0].extra["synth"]["environment"];
    assert!(env["go"].as_str().unwrap().starts_with("go version go1."), "{env}");
    // go test -v names subtests Parent/child.
    assert!(instances.iter().flat_map(|i| i.fail_to_pass.iter().chain(&i.pass_to_pass)).any(|t| t.starts_with("Test")));
}

#[test]
fn javascript_node_test_project_yields_gradable_tasks() {
    synth_and_grade("jsnode", "parse_log_tap", 3, 40);
}

#[test]
fn typescript_vitest_project_yields_gradable_tasks() {
    // vitest comes from the npm registry (or npm's cache, which scripts/ci-setup.sh fills).
    let instances = synth_and_grade("tsvitest", "parse_log_vitest", 3, 40);
    for inst in &instances {
        assert!(inst.fail_to_pass.iter().all(|t| t.starts_with("test/money.test.ts > ")), "{:?}", inst.fail_to_pass);
    }
    // The task records the exact package set it was validated with.
    let env = &instances[0].extra["synth"]["environment"];
    assert_eq!(env["packages"]["vitest"], "3.2.4", "{env}");
    assert_eq!(env["runner"], "vitest");
    assert!(env["node"].as_str().unwrap().starts_with('v'), "{env}");
}

#[test]
fn javascript_tape_project_yields_gradable_tasks_after_a_pruned_install() {
    // ljharb's layout (most of npm's small utility packages): `test` runs `tests-only`, which
    // runs tape under nyc; a linter config that no registry has (as a release's pins often
    // are years later) and a tape range newer than any release. tape comes from npm's cache,
    // which scripts/ci-setup.sh fills.
    let instances = synth_and_grade("jstape", "parse_log_tape", 3, 40);
    for inst in &instances {
        // tape names tests by their `test('name', …)` title.
        for t in inst.fail_to_pass.iter().chain(&inst.pass_to_pass) {
            assert!(
                ["clamp", "range", "chunk", "sumOfMultiples", "overlaps"].contains(&t.as_str()),
                "{}: unexpected test id {t:?}",
                inst.instance_id
            );
        }
    }
    let env = &instances[0].extra["synth"]["environment"];
    assert_eq!(env["runner"], "tape", "{env}");
    // The full install failed on the linter config; the pruned one on tape's range; the
    // relaxed one installed tape's newest release and nothing for linting.
    let install = &env["npm_install"];
    assert_eq!(install["rung"], "relaxed", "{install}");
    assert_eq!(install["dropped"], serde_json::json!(["@ljharb/eslint-config"]), "{install}");
    assert_eq!(install["relaxed"]["tape"], "^5.99.0", "{install}");
    assert!(env["packages"]["tape"].as_str().is_some_and(|v| v.starts_with('5')), "{env}");
    assert!(env["packages"].get("@ljharb/eslint-config").is_none(), "{env}");
    // One tape process per test file.
    let cmd = env["test_cmd"].as_str().unwrap();
    assert!(cmd.contains("bash -O globstar -O nullglob -c") && cmd.contains("node_modules/.bin/tape"), "{cmd}");
}
