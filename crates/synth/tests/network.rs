//! Intake from PyPI and crates.io on tiny real packages. Needs the network: runs only when
//! `FROGNANO_NETWORK_TESTS=1` (CI does not set it).

use std::path::Path;
use std::time::Duration;

use frognano_sandbox::Isolation;
use frognano_synth::intake::Source;
use frognano_synth::pipeline::{synthesize, GenOptions, SynthOptions};

fn enabled() -> bool {
    std::env::var("FROGNANO_NETWORK_TESTS").is_ok_and(|v| v == "1")
}

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
    if !enabled() {
        eprintln!("skipped: set FROGNANO_NETWORK_TESTS=1");
        return;
    }
    // Outside /tmp: sandboxed runs get a private /tmp and must see the virtualenv.
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = tmp.path().join("out");
    let s = synthesize(&options(Source::pypi("six==1.16.0").unwrap(), &out, 40, 3)).unwrap();
    eprintln!("six: {s:?}");
    let insts = frognano_swe::load_instances(&out.join("tasks.jsonl")).unwrap();
    assert!(insts.len() >= 5, "{} tasks: {s:?}", insts.len());
    assert!(insts.iter().all(|i| i.log_parser.as_deref() == Some("parse_log_pytest")));
}

#[test]
fn crates_io_crate_yields_tasks() {
    if !enabled() {
        eprintln!("skipped: set FROGNANO_NETWORK_TESTS=1");
        return;
    }
    // Outside /tmp: sandboxed runs get a private /tmp and must see the virtualenv.
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = tmp.path().join("out");
    let s = synthesize(&options(Source::krate("fnv@1.0.7").unwrap(), &out, 12, 1)).unwrap();
    eprintln!("fnv: {s:?}");
    // Download, lockfile, `cargo fetch`, two-run baseline and sandboxed validation all ran;
    // fnv is tiny (4 candidates), so it may yield no task.
    assert!(s.candidates_tried > 0 && s.reference_seconds > 0.0, "{s:?}");
    let decided = std::fs::read_to_string(out.join("candidates.jsonl")).unwrap();
    assert_eq!(decided.lines().count(), s.candidates_tried);
}
