//! End to end over fixture projects turned into git repositories at test time: synthesis
//! yields validated tasks, seeded runs are reproducible, every gold patch resolves its task
//! under frognano-swe's grader and an empty patch resolves none, issue text leaks no diff
//! line; bad inputs give clear errors.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use frognano_sandbox::Isolation;
use frognano_swe::executor::ExecOptions;
use frognano_swe::instance::{gold_predictions, Prediction};
use frognano_swe::runs::{grade, GradeOptions};
use frognano_swe::SweInstance;
use frognano_synth::intake::Source;
use frognano_synth::pipeline::{synthesize, GenOptions, SynthOptions};
use frognano_testkit::{copy_fixture_dir as copy_dir, git};

/// The fixture `name` as a fresh git repository with one commit.
fn fixture_repo(name: &str, root: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let dest = root.join(name);
    copy_dir(&src, &dest);
    std::fs::write(dest.join(".gitignore"), "__pycache__/\ntarget/\n").unwrap();
    git(&dest, &["init", "-q"]);
    git(&dest, &["add", "-A"]);
    git(&dest, &["commit", "-q", "-m", "fixture"]);
    dest
}

fn options(repo: &Path, out: &Path, seed: u64, max_candidates: usize) -> SynthOptions {
    SynthOptions {
        source: Source::Local { path: repo.to_path_buf(), commit: None },
        out: out.to_path_buf(),
        gen: GenOptions { seed, min_complexity: 3, operators: None, max_candidates },
        workers: 2,
        max_tasks: None,
        combine: 0,
        max_combos: 10,
        min_timeout: Duration::from_secs(120),
        max_f2p_fraction: 0.5,
        isolation: Isolation::Bubblewrap,
        // The system interpreter: unittest when pytest is absent (no network needed).
        python: Some(PathBuf::from("python3")),
        harbor: None,
        issue_model: None,
    }
}

fn load(out: &Path) -> Vec<SweInstance> {
    frognano_swe::load_instances(&out.join("tasks.jsonl")).unwrap()
}

fn grade_all(instances: &[SweInstance], preds: Vec<Prediction>, out: &Path, run_id: &str) -> usize {
    let opts = GradeOptions {
        run_id: run_id.into(),
        output: out.to_path_buf(),
        workers: 2,
        shard: None,
        exec: ExecOptions {
            repos: None,
            timeout: Duration::from_secs(600),
            isolation: Isolation::Bubblewrap,
            work_root: out.to_path_buf(),
        },
    };
    grade(instances.to_vec(), preds, &opts).unwrap().resolved
}

fn changed_lines(patch: &str) -> Vec<String> {
    patch
        .lines()
        .filter(|l| (l.starts_with('+') && !l.starts_with("+++")) || (l.starts_with('-') && !l.starts_with("---")))
        .map(|l| l[1..].split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| l.len() >= 8)
        .collect()
}

fn check_tasks_grade_and_issue_text(instances: &[SweInstance], out: &Path) {
    // Gold patches resolve every task; empty patches resolve none.
    assert_eq!(grade_all(instances, gold_predictions(instances), out, "gold"), instances.len());
    let empty: Vec<Prediction> = instances
        .iter()
        .map(|i| Prediction {
            instance_id: i.instance_id.clone(),
            model_name_or_path: "empty".into(),
            model_patch: Some(String::new()),
            extra: Default::default(),
        })
        .collect();
    assert_eq!(grade_all(instances, empty, out, "empty"), 0);
    for inst in instances {
        assert!(!inst.fail_to_pass.is_empty() && !inst.pass_to_pass.is_empty(), "{}", inst.instance_id);
        let text = inst.problem_statement.split_whitespace().collect::<Vec<_>>().join(" ");
        for line in changed_lines(&inst.patch) {
            assert!(!text.contains(&line), "{}: issue leaks {line:?}:\n{}", inst.instance_id, inst.problem_statement);
        }
        let lower = text.to_lowercase();
        for word in lower.split(|c: char| !c.is_alphanumeric() && c != '_') {
            assert!(!matches!(word, "test" | "tests" | "pytest" | "unittest"), "{}: {text}", inst.instance_id);
        }
        let synth = &inst.extra["synth"];
        assert!(synth["difficulty"]["f2p_count"].as_u64().unwrap() >= 1);
        assert_eq!(inst.log_parser.as_deref(), Some("parse_log_django"));
    }
}

#[test]
fn python_fixture_yields_gradable_tasks_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = fixture_repo("pyproj", tmp.path());
    let out = tmp.path().join("out");
    let summary = synthesize(&options(&repo, &out, 1, 40)).unwrap();
    let instances = load(&out);
    assert!(instances.len() >= 5, "only {} tasks: {summary:?}", instances.len());
    assert_eq!(summary.tasks_accepted, instances.len());
    check_tasks_grade_and_issue_text(&instances, &out);
    // At least one issue states observed-vs-expected behaviour.
    assert!(
        instances.iter().any(|i| i.problem_statement.contains("is expected")),
        "{:#?}",
        instances[0].problem_statement
    );
    // The buggy commit is an orphan: no history behind it.
    let parents = Command::new("git")
        .args(["rev-list", "--count", &instances[0].base_commit])
        .current_dir(instances[0].repo_path.as_ref().unwrap())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&parents.stdout).trim(), "1");
    // Resume: a second run decides nothing again and appends nothing.
    let again = synthesize(&options(&repo, &out, 1, 40)).unwrap();
    assert_eq!(again.candidates_tried, 0);
    assert_eq!(again.resumed_skipped, summary.candidates_tried);
    assert_eq!(load(&out).len(), instances.len());
}

#[test]
fn seeded_runs_are_reproducible_and_combinations_validate() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = fixture_repo("pyproj", tmp.path());
    let key = |out: &Path| {
        let mut v: Vec<(String, String, String)> =
            load(out).into_iter().map(|i| (i.instance_id, i.patch, i.problem_statement)).collect();
        v.sort();
        v
    };
    let mut a = options(&repo, &tmp.path().join("a"), 7, 16);
    a.combine = 2;
    a.max_combos = 3;
    synthesize(&a).unwrap();
    let mut b = options(&repo, &tmp.path().join("b"), 7, 16);
    b.combine = 2;
    b.max_combos = 3;
    b.workers = 1;
    synthesize(&b).unwrap();
    let (ka, kb) = (key(&tmp.path().join("a")), key(&tmp.path().join("b")));
    assert!(!ka.is_empty());
    assert_eq!(ka, kb);
    let combos: Vec<SweInstance> =
        load(&tmp.path().join("a")).into_iter().filter(|i| i.extra["synth"]["family"] == "combine").collect();
    for c in &combos {
        assert_eq!(c.extra["synth"]["parents"].as_array().unwrap().len(), 2);
        assert_eq!(c.extra["synth"]["difficulty"]["num_mutations"], 2);
    }
    let c = options(&repo, &tmp.path().join("c"), 8, 16);
    synthesize(&c).unwrap();
    assert_ne!(key(&tmp.path().join("c")), ka, "a different seed draws different bugs");
}

#[test]
fn rust_fixture_yields_gradable_tasks() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = fixture_repo("rustcrate", tmp.path());
    let out = tmp.path().join("out");
    let mut opts = options(&repo, &out, 3, 14);
    opts.python = None;
    // Two of these candidates loop forever, and each waits out the timeout (the fixture's own
    // runs take seconds, rebuild included; 120 s of the two cores otherwise).
    opts.min_timeout = Duration::from_secs(30);
    let summary = synthesize(&opts).unwrap();
    let instances = load(&out);
    assert!(instances.len() >= 3, "only {} tasks: {summary:?}", instances.len());
    for i in &instances {
        assert_eq!(i.log_parser.as_deref(), Some("parse_log_cargo"));
    }
    assert_eq!(grade_all(&instances, gold_predictions(&instances), &out, "gold"), instances.len());
    for inst in &instances {
        let text = inst.problem_statement.split_whitespace().collect::<Vec<_>>().join(" ");
        for line in changed_lines(&inst.patch) {
            assert!(!text.contains(&line), "{}: issue leaks {line:?}", inst.instance_id);
        }
    }
}

#[test]
fn bad_inputs_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    // Not a git repository.
    let plain = tmp.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let e = synthesize(&options(&plain, &tmp.path().join("o1"), 0, 5)).unwrap_err();
    assert!(format!("{e:#}").contains("not a git repository"), "{e:#}");
    // A Python project without tests.
    let notests = tmp.path().join("notests");
    std::fs::create_dir_all(&notests).unwrap();
    std::fs::write(notests.join("lib.py"), "def f(x):\n    return x\n").unwrap();
    git(&notests, &["init", "-q"]);
    git(&notests, &["add", "-A"]);
    git(&notests, &["commit", "-q", "-m", "x"]);
    let e = synthesize(&options(&notests, &tmp.path().join("o2"), 0, 5)).unwrap_err();
    assert!(format!("{e:#}").contains("without test files"), "{e:#}");
    // Every test fails on the clean tree.
    let failing = tmp.path().join("failing");
    std::fs::create_dir_all(failing.join("tests")).unwrap();
    std::fs::write(failing.join("lib.py"), "def f(x):\n    return x\n").unwrap();
    std::fs::write(failing.join("tests/__init__.py"), "").unwrap();
    std::fs::write(
        failing.join("tests/test_lib.py"),
        "import unittest\nfrom lib import f\n\nclass T(unittest.TestCase):\n    def test_f(self):\n        self.assertEqual(f(1), 2)\n",
    )
    .unwrap();
    git(&failing, &["init", "-q"]);
    git(&failing, &["add", "-A"]);
    git(&failing, &["commit", "-q", "-m", "x"]);
    let e = synthesize(&options(&failing, &tmp.path().join("o3"), 0, 5)).unwrap_err();
    assert!(format!("{e:#}").contains("no test passes on the clean tree"), "{e:#}");
    // A suite that cannot run at all (import error everywhere) finds no tests.
    let broken = tmp.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("test_x.py"), "import nonexistent_module_xyz\n").unwrap();
    git(&broken, &["init", "-q"]);
    git(&broken, &["add", "-A"]);
    git(&broken, &["commit", "-q", "-m", "x"]);
    let e = synthesize(&options(&broken, &tmp.path().join("o4"), 0, 5)).unwrap_err();
    let msg = format!("{e:#}");
    assert!(msg.contains("no test passes") || msg.contains("found no tests"), "{msg}");
}

#[test]
fn an_output_folder_and_a_virtualenv_under_tmp_work() {
    // Sandboxed commands get a private /tmp: the virtualenv the task's tests run with must
    // still be visible there, in synthesis and in grading.
    let tmp = tempfile::Builder::new().prefix("frognano-synth-tmp-").tempdir_in("/tmp").unwrap();
    let repo = fixture_repo("pyproj", tmp.path());
    let venv = tmp.path().join("venv");
    let made = Command::new("python3").args(["-m", "venv", "--without-pip"]).arg(&venv).output().unwrap();
    assert!(made.status.success(), "python3 -m venv: {}", String::from_utf8_lossy(&made.stderr));
    let out = tmp.path().join("tasks");
    let opts = SynthOptions { python: Some(venv.join("bin/python")), ..options(&repo, &out, 1, 6) };
    let summary = synthesize(&opts).unwrap();
    let instances = load(&out);
    assert!(!instances.is_empty(), "no tasks with the output under /tmp: {summary:?}");
    assert!(instances[0].test_cmd.as_deref().unwrap_or("").contains(&venv.display().to_string()));
    assert_eq!(grade_all(&instances, gold_predictions(&instances), &out, "gold"), instances.len());
}

#[test]
fn tests_that_only_the_projects_tox_ini_finds_are_run_its_way() {
    // pytox's suites are tests/*_tests.py, which `python -m unittest` (and pytest) discovery
    // does not find; its tox.ini runs `unittest discover -p "*_tests.py"`. The retry ladder
    // ends at that command, and the tasks are validated and graded with it.
    let tmp = tempfile::tempdir().unwrap();
    let repo = fixture_repo("pytox", tmp.path());
    let out = tmp.path().join("out");
    let summary = synthesize(&SynthOptions { max_tasks: Some(3), ..options(&repo, &out, 1, 40) }).unwrap();
    let instances = load(&out);
    assert_eq!(instances.len(), 3, "{summary:?}");
    for inst in &instances {
        let cmd = inst.extra["synth"]["environment"]["test_cmd"].as_str().unwrap();
        assert!(cmd.contains("-m unittest discover -v '-s' 'tests' '-p' '*_tests.py' '-t' '.'"), "{cmd}");
        assert!(inst.fail_to_pass.iter().all(|t| t.contains("tests.")), "{:?}", inst.fail_to_pass);
    }
    let resolved = grade_all(&instances, gold_predictions(&instances), &out, "gold");
    assert_eq!(resolved, instances.len());
}

#[test]
fn small_projects_get_more_candidates_at_new_seeds_and_a_lower_floor() {
    use frognano_synth::mutate::Language;
    use frognano_synth::pipeline::{generate_candidates, more_candidates, SMALL_PROJECT_MIN_COMPLEXITY};
    let tmp = tempfile::tempdir().unwrap();
    let repo = fixture_repo("pyproj", tmp.path());
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    let commit = commit.trim();
    let gen = GenOptions { seed: 1, min_complexity: 3, operators: None, max_candidates: 500 };
    let first = generate_candidates(&repo, commit, Language::Python, &gen).unwrap();
    let more = more_candidates(&repo, commit, Language::Python, &gen, &first).unwrap();
    assert!(!first.is_empty() && !more.is_empty(), "{} then {}", first.len(), more.len());
    // Nothing the first round already has, nothing twice.
    let keys: std::collections::HashSet<&str> = first.iter().map(|c| c.key.as_str()).collect();
    assert!(more.iter().all(|c| !keys.contains(c.key.as_str())));
    let more_keys: std::collections::HashSet<&str> = more.iter().map(|c| c.key.as_str()).collect();
    assert_eq!(more_keys.len(), more.len());
    // The lower floor reaches functions the first round skipped; new seeds are recorded.
    assert!(first.iter().all(|c| c.complexity >= 3));
    assert!(more.iter().any(|c| c.complexity < 3 && c.complexity >= SMALL_PROJECT_MIN_COMPLEXITY));
    assert!(more.iter().all(|c| c.seed == 2 || c.seed == 3));
    // Deterministic, so a resumed run recognises what it decided.
    let again = more_candidates(&repo, commit, Language::Python, &gen, &first).unwrap();
    assert_eq!(again.iter().map(|c| &c.key).collect::<Vec<_>>(), more.iter().map(|c| &c.key).collect::<Vec<_>>());
}
