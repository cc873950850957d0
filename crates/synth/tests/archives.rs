//! `synth --pypi FILE` and `--crate FILE` without the network: a tiny source distribution
//! and a tiny `.crate` archive, packed by the test from the fixture projects the way pip and
//! crates.io ship them (one top folder `NAME-VERSION/`, a `PKG-INFO` / a normalized
//! `Cargo.toml` without `[workspace]`), go through the same unpack, commit, baseline and
//! validation as a download (`intake::commit_archive`). The downloads themselves are
//! `tests/network.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use frognano_sandbox::Isolation;
use frognano_swe::executor::ExecOptions;
use frognano_swe::instance::gold_predictions;
use frognano_swe::runs::{grade, GradeOptions};
use frognano_swe::SweInstance;
use frognano_synth::intake::Source;
use frognano_synth::pipeline::{synthesize, GenOptions, SynthOptions};
use frognano_testkit::copy_fixture_dir;

/// Packs the fixture project `fixture` as `dir/TOP.SUFFIX` with the single top folder `TOP`
/// (plus `extra` files at its root), as `tar czf` does for sdists and crates.
fn pack(dir: &Path, fixture: &str, top: &str, suffix: &str, extra: &[(&str, &str)]) -> PathBuf {
    let staging = dir.join("staging");
    let root = staging.join(top);
    copy_fixture_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(fixture), &root);
    for (name, text) in extra {
        std::fs::write(root.join(name), text).unwrap();
    }
    let archive = dir.join(format!("{top}{suffix}"));
    let out = Command::new("tar").arg("-czf").arg(&archive).arg("-C").arg(&staging).arg(top).output().unwrap();
    assert!(out.status.success(), "tar: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_dir_all(&staging).unwrap();
    archive
}

fn options(source: Source, out: &Path, python: Option<PathBuf>) -> SynthOptions {
    SynthOptions {
        source,
        out: out.to_path_buf(),
        gen: GenOptions { seed: 0, min_complexity: 3, operators: None, max_candidates: 8 },
        workers: 2,
        max_tasks: Some(2),
        combine: 0,
        max_combos: 0,
        min_timeout: Duration::from_secs(120),
        max_f2p_fraction: 0.5,
        isolation: Isolation::Bubblewrap,
        python,
        harbor: None,
        issue_model: None,
    }
}

/// The tasks written to `out`, after checking that each gold patch resolves its task.
fn tasks_resolved_by_gold(out: &Path) -> Vec<SweInstance> {
    let instances = frognano_swe::load_instances(&out.join("tasks.jsonl")).unwrap();
    let opts = GradeOptions {
        run_id: "gold".into(),
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
    let resolved = grade(instances.clone(), gold_predictions(&instances), &opts).unwrap().resolved;
    assert_eq!(resolved, instances.len(), "a gold patch does not resolve its task");
    instances
}

#[test]
fn a_local_sdist_is_unpacked_committed_and_yields_tasks() {
    let tmp = tempfile::tempdir().unwrap();
    let pkg_info = "Metadata-Version: 2.1\nName: tinyinv\nVersion: 0.1.0\n";
    let pyproject = "[project]\nname = \"tinyinv\"\nversion = \"0.1.0\"\n";
    let sdist = pack(
        tmp.path(),
        "pyproj",
        "tinyinv-0.1.0",
        ".tar.gz",
        &[("PKG-INFO", pkg_info), ("pyproject.toml", pyproject)],
    );
    let source = Source::pypi(sdist.to_str().unwrap()).unwrap();
    let out = tmp.path().join("out");
    // The system interpreter as is: no virtualenv, so nothing is fetched from PyPI.
    let s = synthesize(&options(source, &out, Some(PathBuf::from("python3")))).unwrap();
    let instances = tasks_resolved_by_gold(&out);
    assert_eq!(instances.len(), 2, "{s:?}");
    for i in &instances {
        assert_eq!(i.repo, "pypi/tinyinv-0.1.0");
        // The archive's top folder is the repository root: paths have no `tinyinv-0.1.0/`.
        assert!(i.patch.contains("--- a/inventory/core.py"), "{}", i.patch);
        assert_eq!(i.log_parser.as_deref(), Some("parse_log_django"));
        assert_eq!(i.extra["synth"]["source_repo"], "pypi/tinyinv-0.1.0", "{}", i.extra["synth"]);
    }
}

#[test]
fn a_local_crate_inside_a_cargo_workspace_is_its_own_workspace_and_yields_tasks() {
    // Under this repository's target/: cargo would take an unpacked crate without a
    // `[workspace]` table for a member of this workspace and refuse to build it.
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let manifest = "[package]\nname = \"tally\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\n";
    let krate = pack(tmp.path(), "rustcrate", "tally-0.1.0", ".crate", &[("Cargo.toml", manifest)]);
    let source = Source::krate(krate.to_str().unwrap()).unwrap();
    let out = tmp.path().join("out");
    // One task is enough here: every cargo test run builds the crate (slow); the cargo
    // pipeline and its grading are pipeline.rs's rust_fixture_yields_gradable_tasks.
    let opts = SynthOptions {
        max_tasks: Some(1),
        gen: GenOptions { max_candidates: 4, ..options(source.clone(), &out, None).gen },
        ..options(source, &out, None)
    };
    let s = synthesize(&opts).unwrap();
    let instances = frognano_swe::load_instances(&out.join("tasks.jsonl")).unwrap();
    assert_eq!(instances.len(), 1, "{s:?}");
    for i in &instances {
        assert_eq!(i.repo, "crates/tally-0.1.0");
        assert!(i.patch.contains("--- a/src/lib.rs"), "{}", i.patch);
        assert_eq!(i.log_parser.as_deref(), Some("parse_log_cargo"));
        assert!(!i.fail_to_pass.is_empty() && !i.pass_to_pass.is_empty(), "{}", i.instance_id);
    }
}
