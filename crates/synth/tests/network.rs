//! Intake from PyPI and crates.io on small pinned real releases, through their normal clients
//! (pip, and curl from static.crates.io). These need the network and run by default, CI
//! included: a network failure fails them with pip's or curl's message. On a machine without
//! the network, `FROGNANO_OFFLINE=1` turns each into one `SKIPPED (needs the network)` line;
//! with `FROGNANO_REQUIRE_FIXTURES` set (CI) it is a failure instead, so CI cannot drop them.
//! The same unpack-and-synthesize path without the network is in `tests/archives.rs`.
//!
//! The release-era test also needs uv (`scripts/ci-setup.sh` installs it in `.venv-uv`).

use std::path::Path;
use std::time::Duration;

use frognano_sandbox::Isolation;
use frognano_synth::intake::Source;
use frognano_synth::pipeline::{synthesize, GenOptions, SynthOptions};

fn options(source: Source, out: &Path, max_candidates: usize, min_complexity: u32) -> SynthOptions {
    SynthOptions {
        source,
        out: out.to_path_buf(),
        gen: GenOptions { seed: 0, min_complexity, operators: None, max_candidates },
        workers: 2,
        max_tasks: None,
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

#[test]
fn pypi_sdist_with_pytest_suite_yields_tasks() {
    if !frognano_testkit::online_or_skip("synth --pypi six==1.16.0") {
        return;
    }
    // Outside /tmp: sandboxed runs get a private /tmp and must see the virtualenv.
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = tmp.path().join("out");
    // pip download of the sdist, a virtualenv with pytest from PyPI, the two-run baseline and
    // sandboxed validation; two tasks are enough to show each step worked.
    let opts = SynthOptions { max_tasks: Some(2), ..options(Source::pypi("six==1.16.0").unwrap(), &out, 40, 3) };
    let s = synthesize(&opts).unwrap();
    eprintln!("six: {s:?}");
    let insts = frognano_swe::load_instances(&out.join("tasks.jsonl")).unwrap();
    assert_eq!(insts.len(), 2, "{s:?}");
    for i in &insts {
        assert_eq!(i.repo, "pypi/six-1.16.0");
        assert_eq!(i.log_parser.as_deref(), Some("parse_log_pytest"));
        assert!(i.patch.contains("six.py"), "{}", i.patch);
        assert!(!i.fail_to_pass.is_empty() && !i.pass_to_pass.is_empty(), "{}", i.instance_id);
    }
}

#[test]
fn crates_io_crate_yields_tasks() {
    if !frognano_testkit::online_or_skip("synth --crate strsim@0.11.1") {
        return;
    }
    // Inside this workspace's target/ on purpose: an unpacked crate must not be taken for a
    // member of an enclosing cargo workspace (intake gives it a `[workspace]` of its own).
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = tmp.path().join("out");
    // strsim: no dependencies, 96 tests; its first 8 candidates give a few tasks.
    let s = synthesize(&options(Source::krate("strsim@0.11.1").unwrap(), &out, 8, 1)).unwrap();
    eprintln!("strsim: {s:?}");
    // Download, lockfile, `cargo fetch`, two-run baseline and sandboxed validation all ran.
    assert!(s.candidates_tried > 0 && s.reference_seconds > 0.0, "{s:?}");
    let decided = std::fs::read_to_string(out.join("candidates.jsonl")).unwrap();
    assert_eq!(decided.lines().count(), s.candidates_tried);
    let insts = frognano_swe::load_instances(&out.join("tasks.jsonl")).unwrap();
    assert!(!insts.is_empty(), "no task from strsim: {s:?}");
    for i in &insts {
        assert_eq!(i.repo, "crates/strsim-0.11.1");
        assert_eq!(i.log_parser.as_deref(), Some("parse_log_cargo"));
        assert!(!i.fail_to_pass.is_empty() && !i.pass_to_pass.is_empty(), "{}", i.instance_id);
    }
}

/// An old release whose tests cannot run on today's packages: Jinja2 2.11.3 (January 2021)
/// imports `markupsafe.soft_unicode`, which MarkupSafe 2.1 removed, and its era's pytest
/// (6.2) does not run on Python 3.11. Synthesis resolves its dependencies as of its upload
/// time and pytest as of the interpreter's release, pins the result in the task, and grading
/// rebuilds exactly that set after synthesis's own virtualenv is deleted.
#[test]
fn an_old_release_is_validated_and_graded_in_its_era_environment() {
    use frognano_swe::env_record::{find_uv, EnvironmentRecord};
    if !frognano_testkit::online_or_skip("synth --pypi Jinja2==2.11.3 (release era)") {
        return;
    }
    let uv = find_uv().ok_or_else(|| "uv not found (run scripts/ci-setup.sh: it installs .venv-uv)".to_string());
    if !frognano_testkit::available_or_skip("uv", "synth's release-era environments", uv.map(|_| ())) {
        return;
    }
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = tmp.path().join("out");
    let opts = SynthOptions { max_tasks: Some(1), ..options(Source::pypi("Jinja2==2.11.3").unwrap(), &out, 40, 3) };
    let s = synthesize(&opts).unwrap();
    eprintln!("Jinja2 2.11.3: {s:?}");
    let insts = frognano_swe::load_instances(&out.join("tasks.jsonl")).unwrap();
    assert_eq!(insts.len(), 1, "{s:?}");
    let EnvironmentRecord::PythonVenv(rec) = EnvironmentRecord::of(&insts[0]).unwrap().expect("an environment record");
    // The sdist's upload time, from PyPI's JSON API.
    assert_eq!(rec.exclude_newer.as_deref(), Some("2021-01-31T16:33:09.175429Z"));
    let tools = rec.tools_exclude_newer.clone().unwrap();
    assert!(tools.as_str() >= "2021-01-31", "{tools}");
    assert_eq!(rec.project.as_deref(), Some("Jinja2"));
    assert!(rec.packages.contains(&"MarkupSafe==1.1.1".to_string()), "{:?}", rec.packages);
    let pytest = rec.packages.iter().find(|p| p.starts_with("pytest==")).expect("pytest pinned");
    assert!(pytest.as_str() < "pytest==8", "{pytest}: pytest of the interpreter's era, not today's");
    let meta = &insts[0].extra["synth"]["environment"];
    assert_eq!(meta["resolution"]["plan"]["exclude_newer"], "2021-01-31T16:33:09.175429Z");

    // Grading: synthesis's virtualenv is gone; the gold patch resolves in the rebuild.
    std::fs::remove_dir_all(out.join("env")).unwrap();
    let grade_opts = frognano_swe::runs::GradeOptions {
        run_id: "gold".into(),
        output: tmp.path().join("grade"),
        workers: 1,
        shard: None,
        exec: frognano_swe::executor::ExecOptions {
            repos: None,
            timeout: Duration::from_secs(600),
            isolation: Isolation::Bubblewrap,
            work_root: tmp.path().to_path_buf(),
        },
    };
    let preds = frognano_swe::instance::gold_predictions(&insts);
    let summary = frognano_swe::runs::grade(insts.clone(), preds, &grade_opts).unwrap();
    assert_eq!((summary.resolved, summary.errors), (1, 0), "{summary:?}");
}
