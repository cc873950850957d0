//! Go modules as Debian packages them (`--go MODULE@debian`): the package name derived from
//! the module path exists in apt, and real packages (one without dependencies, one whose
//! `go.mod` requires another module) yield validated tasks whose gold patches resolve under
//! the grader, offline, with the Debian versions recorded. These download from Debian's
//! archive through apt (`apt-get download`, no installation) and need apt's package lists
//! (`scripts/ci-setup.sh` runs `apt-get update`); on a machine without the network,
//! `FROGNANO_OFFLINE=1` turns each download test into one `SKIPPED (needs the network)` line
//! (a failure under `FROGNANO_REQUIRE_FIXTURES`, as in `tests/network.rs`).

use std::path::Path;
use std::time::Duration;

use frognano_sandbox::Isolation;
use frognano_swe::SweInstance;
use frognano_synth::debian::{candidate, go_package_name};
use frognano_synth::intake::Source;
use frognano_synth::pipeline::{synthesize, GenOptions, SynthOptions};

fn options(source: Source, out: &Path, min_complexity: u32, max_tasks: usize) -> SynthOptions {
    SynthOptions {
        source,
        out: out.to_path_buf(),
        gen: GenOptions { seed: 0, min_complexity, operators: None, max_candidates: 40 },
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

/// Grades each instance's own fix; returns how many resolved (errors fail the test).
fn grade_gold(instances: &[SweInstance], out: &Path) -> usize {
    let opts = frognano_swe::runs::GradeOptions {
        run_id: "gold".into(),
        output: out.join("grade"),
        workers: 2,
        shard: None,
        exec: frognano_swe::executor::ExecOptions {
            repos: None,
            timeout: Duration::from_secs(600),
            isolation: Isolation::Bubblewrap,
            work_root: out.to_path_buf(),
        },
    };
    let preds = frognano_swe::instance::gold_predictions(instances);
    let summary = frognano_swe::runs::grade(instances.to_vec(), preds, &opts).unwrap();
    assert_eq!(summary.errors, 0, "{summary:?}");
    summary.resolved
}

#[test]
fn derived_package_names_are_in_apt() {
    // The modules of bench/synth_yield_manifest.txt and the spellings docs/synthesis.md names.
    let modules = [
        ("github.com/pkg/errors", "golang-github-pkg-errors-dev"),
        ("github.com/google/uuid", "golang-github-google-uuid-dev"),
        ("github.com/davecgh/go-spew", "golang-github-davecgh-go-spew-dev"),
        ("github.com/pmezard/go-difflib", "golang-github-pmezard-go-difflib-dev"),
        ("github.com/spf13/pflag", "golang-github-spf13-pflag-dev"),
        ("github.com/hashicorp/go-version", "golang-github-hashicorp-go-version-dev"),
        ("github.com/Masterminds/semver/v3", "golang-github-masterminds-semver-dev"),
        ("github.com/cespare/xxhash/v2", "golang-github-cespare-xxhash-dev"),
        ("github.com/mattn/go-runewidth", "golang-github-mattn-go-runewidth-dev"),
        ("github.com/BurntSushi/toml", "golang-github-burntsushi-toml-dev"),
        ("github.com/kr/text", "golang-github-kr-text-dev"),
        ("golang.org/x/text", "golang-golang-x-text-dev"),
        ("gopkg.in/yaml.v3", "golang-gopkg-yaml.v3-dev"),
    ];
    for (module, package) in modules {
        assert_eq!(go_package_name(module), package);
        let found = candidate(package, module).unwrap_or_else(|e| panic!("{module}: {e:#}"));
        assert!(found.version.chars().next().is_some_and(|c| c.is_ascii_digit()), "{found:?}");
    }
    let e = candidate(&go_package_name("example.com/no/such-module"), "example.com/no/such-module").unwrap_err();
    assert!(e.to_string().contains("Debian has no package golang-example-no-such-module-dev"), "{e}");
}

#[test]
fn debian_go_module_without_dependencies_yields_gradable_tasks() {
    if !frognano_testkit::online_or_skip("synth --go github.com/pkg/errors@debian") {
        return;
    }
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = tmp.path().join("out");
    let source = Source::go("github.com/pkg/errors@debian").unwrap();
    let debian = candidate("golang-github-pkg-errors-dev", "github.com/pkg/errors").unwrap();
    // pkg/errors is small: its functions of complexity 1 and up give enough candidates.
    let s = synthesize(&options(source, &out, 1, 2)).unwrap();
    eprintln!("pkg/errors from Debian {}: {s:?}", debian.version);
    let insts = frognano_swe::load_instances(&out.join("tasks.jsonl")).unwrap();
    assert_eq!(insts.len(), 2, "{s:?}");
    // Debian ships pkg/errors 0.9.1 without a go.mod: intake wrote one into the imported tree.
    let go_mod = std::fs::read_to_string(out.join("work/source/go.mod")).unwrap();
    assert!(go_mod.starts_with("module github.com/pkg/errors\n\ngo 1."), "{go_mod}");
    for i in &insts {
        assert_eq!(i.repo, format!("go/github.com__pkg__errors-debian-{}", debian.version));
        assert_eq!(i.log_parser.as_deref(), Some("parse_log_gotest"));
        assert!(!i.fail_to_pass.is_empty() && !i.pass_to_pass.is_empty(), "{}", i.instance_id);
        let env = &i.extra["synth"]["environment"];
        assert_eq!(env["debian_source"]["name"], "golang-github-pkg-errors-dev", "{env}");
        assert_eq!(env["debian_source"]["version"], debian.version.as_str(), "{env}");
        assert_eq!(env["debian_modules"]["served"], serde_json::json!([]), "{env}");
        assert_eq!(i.extra["synth"]["source_repo"], i.repo.as_str());
    }
    assert_eq!(grade_gold(&insts, tmp.path()), insts.len());
}

#[test]
fn debian_go_module_requirements_are_served_from_debian() {
    if !frognano_testkit::online_or_skip("synth --go github.com/mattn/go-runewidth@debian (requires rivo/uniseg)") {
        return;
    }
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = tmp.path().join("out");
    let source = Source::go("github.com/mattn/go-runewidth@debian").unwrap();
    let s = synthesize(&options(source, &out, 3, 1)).unwrap();
    eprintln!("go-runewidth from Debian: {s:?}");
    let insts = frognano_swe::load_instances(&out.join("tasks.jsonl")).unwrap();
    assert_eq!(insts.len(), 1, "{s:?}");
    let env = &insts[0].extra["synth"]["environment"];
    let uniseg = candidate("golang-github-rivo-uniseg-dev", "github.com/rivo/uniseg").unwrap();
    let served = env["debian_modules"]["served"].as_array().expect("served modules recorded");
    let rec = served.iter().find(|m| m["module"] == "github.com/rivo/uniseg").unwrap_or_else(|| panic!("{env}"));
    // go-runewidth 0.0.14's go.mod asks for v0.2.0; Debian's package is what the tests ran with.
    assert_eq!(rec["required"], "v0.2.0", "{env}");
    assert_eq!(rec["package"], "golang-github-rivo-uniseg-dev", "{env}");
    assert_eq!(rec["version"], uniseg.version.as_str(), "{env}");
    // The test command runs offline through a go.work of its own, never the proxy.
    let cmd = insts[0].test_cmd.as_deref().unwrap();
    assert!(cmd.contains("GOWORK=/tmp/frognano-go.work") && cmd.contains("GOPROXY=off"), "{cmd}");
    assert_eq!(grade_gold(&insts, tmp.path()), 1);
}
