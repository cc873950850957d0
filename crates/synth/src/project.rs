//! Project detection, environment set-up and sandboxed test runs: which language, which test
//! command and log parser, a Python virtualenv or fetched Cargo dependencies, and the
//! two-run baseline.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command as HostCommand;
use std::time::{Duration, Instant};

use frognano_sandbox::{Command, Isolation, Sandbox, SandboxSpec};

use crate::mutate::Language;

/// The test framework a project is run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TestRunner {
    /// `python -m pytest -rA`.
    Pytest,
    /// `python -m unittest -v` (when pytest is not installed).
    Unittest,
    /// `cargo test`.
    Cargo,
    /// `go test -v ./...`.
    GoTest,
    /// Node's built-in runner, `node --test` with the TAP reporter.
    #[serde(rename = "node_test")]
    NodeTest,
    /// jest, `--verbose` (its ✓ / ✕ lines).
    Jest,
    /// vitest, `run --reporter=verbose`.
    Vitest,
    /// mocha with the TAP reporter.
    Mocha,
}

/// The project ships no tests (no test files, no `#[test]`): nothing to validate tasks with.
/// A distinct error type so that a batch can count such packages apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoTests(pub String);

impl std::fmt::Display for NoTests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NoTests {}

/// The clean tree's suite ran past its time limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuiteTooSlow(pub String);

impl std::fmt::Display for SuiteTooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SuiteTooSlow {}

/// Fails with [`NoTests`] unless `cond`.
pub(crate) fn ensure_tests(cond: bool, message: impl FnOnce() -> String) -> anyhow::Result<()> {
    if cond {
        Ok(())
    } else {
        Err(NoTests(message()).into())
    }
}

/// How a project's tests are run and read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestSetup {
    /// Language the bug operators work on; `None` when no operator set exists.
    pub language: Option<Language>,
    /// The framework.
    pub runner: TestRunner,
    /// Shell command run at the repository root.
    pub test_cmd: String,
    /// frognano-swe parser name for the log.
    pub log_parser: String,
    /// Host folders the test command needs to read (the virtualenv), shown read-only in the
    /// sandbox even where it would hide them (under `/tmp`, in a masked home).
    pub readable_paths: Vec<PathBuf>,
    /// Python only: the interpreter and whether its virtualenv is synth's own (so that the
    /// retry ladder may install another pytest into it).
    pub python: Option<(PathBuf, bool)>,
}

/// One step down the retry ladder tried when a Python suite fails on the clean tree (finds
/// no tests, or none passes): an older pytest major version, then the standard library's
/// unittest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LadderStep {
    /// Install `pytest<N` into synth's own virtualenv and run pytest again.
    PytestBelow(u32),
    /// `python -m unittest -v` with the same interpreter.
    Unittest,
}

/// The steps tried after `setup`'s baseline failed, in order (empty when none applies: not
/// pytest). Older pytest versions are tried only in a virtualenv synth created.
pub fn python_ladder(setup: &TestSetup) -> Vec<LadderStep> {
    match (&setup.runner, &setup.python) {
        (TestRunner::Pytest, Some((_, true))) => {
            vec![LadderStep::PytestBelow(8), LadderStep::PytestBelow(7), LadderStep::Unittest]
        }
        (TestRunner::Pytest, Some((_, false))) => vec![LadderStep::Unittest],
        _ => Vec::new(),
    }
}

/// `setup` after one ladder step (installing an older pytest needs PyPI).
pub fn apply_ladder_step(setup: &TestSetup, step: LadderStep) -> anyhow::Result<TestSetup> {
    let (python, _) = setup.python.clone().ok_or_else(|| anyhow::anyhow!("not a Python setup"))?;
    match step {
        LadderStep::PytestBelow(major) => {
            run_host(
                HostCommand::new(&python).args(["-m", "pip", "install", "--quiet", &format!("pytest<{major}")]),
                &format!("pip install pytest<{major}"),
            )?;
            Ok(setup.clone())
        }
        LadderStep::Unittest => {
            let env = setup.test_cmd.split(" -m pytest").next().unwrap_or_default();
            Ok(TestSetup {
                runner: TestRunner::Unittest,
                test_cmd: format!("{env} -m unittest -v 2>&1"),
                log_parser: "parse_log_django".into(),
                ..setup.clone()
            })
        }
    }
}

/// How the environment is prepared.
#[derive(Debug, Clone)]
pub struct EnvOptions {
    /// Use this Python interpreter as is (no virtualenv is created).
    pub python: Option<PathBuf>,
    /// Where a virtualenv is created when `python` is not given; also the home of a Go
    /// module cache and build cache, and of an npm project's installed dependencies.
    pub env_dir: PathBuf,
    /// npm only: resolve dependency ranges as of this time (`npm install --before`, an ISO
    /// date), so an old release gets the dependency versions of its era.
    pub npm_before: Option<String>,
}

pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

pub(crate) fn walk_files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() {
                if !matches!(name.as_str(), ".git" | "target" | "node_modules" | "__pycache__" | ".venv" | "venv") {
                    stack.push(p);
                }
            } else if let Ok(rel) = p.strip_prefix(root) {
                out.push(rel.to_string_lossy().to_string());
            }
        }
    }
    out.sort();
    out
}

/// Whether a path is test code (never mutated; its names never appear in issue text).
pub fn is_test_path(path: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    let in_test_dir = path.split('/').any(|c| matches!(c, "tests" | "test" | "testing" | "benches" | "examples"));
    in_test_dir
        || file.starts_with("test_")
        || file.ends_with("_test.py")
        || file.ends_with("_tests.py")
        || file == "conftest.py"
        || file.ends_with("_test.go")
        || path.split('/').any(|c| matches!(c, "__tests__" | "__mocks__" | "spec" | "fixtures" | "node_modules"))
        || [".test.", ".spec.", "-test.", "_test."].iter().any(|m| file.contains(m) && is_js_like(file))
}

fn is_js_like(file: &str) -> bool {
    [".js", ".mjs", ".cjs", ".jsx", ".ts", ".mts", ".cts", ".tsx"].iter().any(|e| file.ends_with(e))
}

/// Detects the project kind of the exported tree `tree` and prepares its environment
/// (network is used here, outside the sandbox; test runs later are offline).
pub fn prepare(tree: &Path, opts: &EnvOptions) -> anyhow::Result<TestSetup> {
    anyhow::ensure!(tree.is_dir(), "{} is not a directory", tree.display());
    let files = walk_files(tree);
    let has = |f: &str| tree.join(f).is_file();
    if has("Cargo.toml") {
        return prepare_rust(tree, &files);
    }
    if has("go.mod") {
        return crate::langs::prepare_go(tree, &files, opts);
    }
    let python_packaged = has("pyproject.toml") || has("setup.py") || has("setup.cfg");
    if has("package.json") && !python_packaged {
        return crate::langs::prepare_node(tree, &files, opts);
    }
    let py_files: Vec<&String> = files.iter().filter(|f| f.ends_with(".py")).collect();
    if !py_files.is_empty() || has("pyproject.toml") || has("setup.py") {
        return prepare_python(tree, &files, opts);
    }
    anyhow::bail!(
        "{}: no Python, Rust, Go or JavaScript/TypeScript project found (no .py files, Cargo.toml, go.mod or package.json)",
        tree.display()
    )
}

fn prepare_rust(tree: &Path, files: &[String]) -> anyhow::Result<TestSetup> {
    let has_tests = files.iter().any(|f| {
        f.ends_with(".rs")
            && (f.starts_with("tests/") || std::fs::read_to_string(tree.join(f)).is_ok_and(|t| t.contains("#[test]")))
    });
    ensure_tests(has_tests, || {
        format!("{}: Rust crate without any #[test] function or tests/ file: no tests", tree.display())
    })?;
    let out = HostCommand::new("cargo")
        .arg("fetch")
        .current_dir(tree)
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run cargo: {e}"))?;
    anyhow::ensure!(
        out.status.success(),
        "cargo fetch failed in {}: {}",
        tree.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(TestSetup {
        language: Some(Language::Rust),
        runner: TestRunner::Cargo,
        test_cmd:
            "CARGO_TARGET_DIR=target CARGO_TERM_COLOR=never RUST_BACKTRACE=0 cargo test --offline --no-fail-fast 2>&1"
                .into(),
        log_parser: "parse_log_cargo".into(),
        readable_paths: Vec::new(),
        python: None,
    })
}

pub(crate) fn run_host(cmd: &mut HostCommand, what: &str) -> anyhow::Result<()> {
    let out = cmd.output().map_err(|e| anyhow::anyhow!("cannot run {what}: {e}"))?;
    anyhow::ensure!(out.status.success(), "{what} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    Ok(())
}

fn prepare_python(tree: &Path, files: &[String], opts: &EnvOptions) -> anyhow::Result<TestSetup> {
    let has_tests = files.iter().any(|f| {
        let file = f.rsplit('/').next().unwrap_or(f);
        f.ends_with(".py") && (file.starts_with("test_") || file.ends_with("_test.py") || file == "tests.py")
    });
    ensure_tests(has_tests, || {
        format!(
            "{}: Python project without test files (test_*.py, *_test.py or tests.py): no tests to validate tasks with",
            tree.display()
        )
    })?;
    let python = match &opts.python {
        Some(p) => {
            let out = HostCommand::new(p).arg("--version").output();
            anyhow::ensure!(
                out.is_ok_and(|o| o.status.success()),
                "--python {}: not a working Python interpreter",
                p.display()
            );
            p.clone()
        }
        None => create_venv(tree, opts)?,
    };
    // Absolute but not symlink-resolved: a venv interpreter resolves to its base Python.
    let python = if python.components().count() > 1 { std::path::absolute(&python)? } else { python };
    let has_pytest = HostCommand::new(&python).args(["-c", "import pytest"]).output().is_ok_and(|o| o.status.success());
    let own_venv = opts.python.is_none();
    let mut env = "PYTHONDONTWRITEBYTECODE=1 PYTHONHASHSEED=0 TZ=UTC LC_ALL=C.UTF-8".to_string();
    if tree.join("src").is_dir() {
        env.push_str(" PYTHONPATH=src");
    }
    let py = shell_quote(&python.to_string_lossy());
    // The interpreter's environment (a virtualenv's root, found by its pyvenv.cfg) must be
    // visible in the sandbox wherever the user put it, /tmp included.
    let readable_paths: Vec<PathBuf> = python
        .parent()
        .and_then(Path::parent)
        .filter(|root| python.is_absolute() && root.join("pyvenv.cfg").is_file())
        .map(|root| vec![root.to_path_buf()])
        .unwrap_or_default();
    Ok(if has_pytest {
        TestSetup {
            language: Some(Language::Python),
            runner: TestRunner::Pytest,
            test_cmd: format!("{env} {py} -m pytest -rA --tb=long -p no:cacheprovider -p no:randomly -o addopts= 2>&1"),
            log_parser: "parse_log_pytest".into(),
            readable_paths,
            python: Some((python.clone(), own_venv)),
        }
    } else {
        TestSetup {
            language: Some(Language::Python),
            runner: TestRunner::Unittest,
            test_cmd: format!("{env} {py} -m unittest -v 2>&1"),
            log_parser: "parse_log_django".into(),
            readable_paths,
            python: Some((python.clone(), own_venv)),
        }
    })
}

/// Creates `env_dir/venv` with pytest, the project and its test extras / requirement files.
fn create_venv(tree: &Path, opts: &EnvOptions) -> anyhow::Result<PathBuf> {
    let venv = std::path::absolute(opts.env_dir.join("venv"))?;
    let python = venv.join("bin/python");
    if !python.exists() {
        std::fs::create_dir_all(&opts.env_dir)?;
        run_host(HostCommand::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv")?;
        run_host(
            HostCommand::new(&python).args(["-m", "pip", "install", "--quiet", "pytest"]),
            "pip install pytest (is PyPI reachable? pass --python to use an existing interpreter)",
        )?;
        let packaged = ["pyproject.toml", "setup.py", "setup.cfg"].iter().any(|f| tree.join(f).is_file());
        if packaged {
            // The package itself is installed only for its dependencies: tests import the
            // workspace copy first (cwd / src on sys.path).
            let with_extras = format!("{}[test,tests,testing]", tree.display());
            let ok = HostCommand::new(&python)
                .args(["-m", "pip", "install", "--quiet", &with_extras])
                .output()
                .is_ok_and(|o| o.status.success());
            if !ok {
                let out = HostCommand::new(&python).args(["-m", "pip", "install", "--quiet"]).arg(tree).output();
                if !out.as_ref().is_ok_and(|o| o.status.success()) {
                    tracing::warn!("installing {} into the virtualenv failed; tests may not import", tree.display());
                }
            }
        }
        for req in ["requirements-test.txt", "test-requirements.txt", "requirements/test.txt", "requirements-dev.txt"] {
            if tree.join(req).is_file() {
                let out = HostCommand::new(&python)
                    .args(["-m", "pip", "install", "--quiet", "-r"])
                    .arg(tree.join(req))
                    .output();
                if !out.as_ref().is_ok_and(|o| o.status.success()) {
                    tracing::warn!("pip install -r {req} failed");
                }
            }
        }
    }
    Ok(python)
}

fn first_line_of(program: &str, args: &[&str]) -> Option<String> {
    let out = HostCommand::new(program).args(args).output().ok().filter(|o| o.status.success())?;
    let text = if out.stdout.is_empty() { out.stderr } else { out.stdout };
    String::from_utf8_lossy(&text).lines().next().map(|l| l.trim().to_string())
}

/// What a task was validated with, for its record: runner, test command, log parser, the
/// tool versions, and the exact package set — `pip freeze` of the interpreter, the npm
/// lock file of the installed dependencies (`env/npm/node_modules/.package-lock.json`:
/// name → version), the Go toolchain (the module's `go.sum` is in the task's tree).
pub fn environment_record(setup: &TestSetup, env_dir: &Path) -> serde_json::Value {
    let mut rec = serde_json::json!({
        "runner": setup.runner,
        "test_cmd": setup.test_cmd,
        "log_parser": setup.log_parser,
    });
    match setup.runner {
        TestRunner::Pytest | TestRunner::Unittest => {
            if let Some((python, _)) = &setup.python {
                let py = python.to_string_lossy().to_string();
                rec["python"] = first_line_of(&py, &["--version"]).into();
                let freeze = HostCommand::new(python).args(["-m", "pip", "freeze", "--all"]).output();
                if let Some(out) = freeze.ok().filter(|o| o.status.success()) {
                    let pins: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
                    rec["packages"] = pins.into();
                }
            }
        }
        TestRunner::Cargo => rec["cargo"] = first_line_of("cargo", &["--version"]).into(),
        TestRunner::GoTest => {
            // The toolchain the command names (a fetched one is called by its path).
            let go = setup.test_cmd.split_whitespace().find(|w| w.ends_with("/bin/go'") || *w == "go");
            let go = go.map(|g| g.trim_matches('\'').to_string()).unwrap_or_else(|| "go".into());
            rec["go"] = first_line_of(&go, &["version"]).into();
        }
        TestRunner::NodeTest | TestRunner::Jest | TestRunner::Vitest | TestRunner::Mocha => {
            rec["node"] = first_line_of("node", &["--version"]).into();
            let lock = env_dir.join("npm/node_modules/.package-lock.json");
            if let Some(packages) = std::fs::read_to_string(lock)
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .and_then(|v| v["packages"].as_object().cloned())
            {
                let pins: serde_json::Map<String, serde_json::Value> = packages
                    .iter()
                    .filter_map(|(path, p)| {
                        let name = path.rsplit("node_modules/").next().filter(|n| !n.is_empty())?;
                        Some((name.to_string(), p["version"].clone()))
                    })
                    .collect();
                rec["packages"] = pins.into();
            }
        }
    }
    rec
}

/// The result of one sandboxed test run.
#[derive(Debug, Clone)]
pub struct TestRun {
    /// Test id → PASSED / FAILED / ERROR / SKIPPED …, in log order.
    pub statuses: frognano_swe::StatusMap,
    /// The merged stdout+stderr.
    pub log: String,
    /// Killed at the timeout.
    pub timed_out: bool,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// Runs the test command in `dir` inside the sandbox.
pub fn run_tests(dir: &Path, setup: &TestSetup, timeout: Duration, isolation: Isolation) -> anyhow::Result<TestRun> {
    let mut spec = SandboxSpec::new(dir)
        .isolation(isolation)
        .timeout(timeout)
        .output_limit(32 << 20)
        .flood_limit(128 << 20)
        .env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "safe.directory")
        .env("GIT_CONFIG_VALUE_0", "*");
    for path in &setup.readable_paths {
        spec = spec.readable_path(path);
    }
    let sandbox = Sandbox::new(spec).map_err(|e| anyhow::anyhow!("sandbox: {e}"))?;
    let started = Instant::now();
    let out = sandbox
        .run(&Command::new("bash").arg("-c").arg(format!("exec 2>&1\n{}", setup.test_cmd)).timeout(timeout))
        .map_err(|e| anyhow::anyhow!("sandbox: {e}"))?;
    let log = out.stdout;
    let statuses = frognano_swe::parse_log(&setup.log_parser, &log).map_err(|e| anyhow::anyhow!("log parser: {e}"))?;
    Ok(TestRun { statuses, log, timed_out: out.timed_out, seconds: started.elapsed().as_secs_f64() })
}

/// The clean tree's reference: tests that passed in both runs.
#[derive(Debug, Clone)]
pub struct Baseline {
    /// Passed in both reference runs.
    pub passing: BTreeSet<String>,
    /// Status differed between the runs: excluded everywhere.
    pub flaky: BTreeSet<String>,
    /// Failed (or were skipped) in both runs: grade nothing.
    pub not_passing: BTreeSet<String>,
    /// The slower of the two run times.
    pub seconds: f64,
}

fn last_lines(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs the suite twice on the clean tree in `dir`; errors when the suite cannot run, finds
/// no tests, times out, or has no test passing.
pub fn baseline(dir: &Path, setup: &TestSetup, timeout: Duration, isolation: Isolation) -> anyhow::Result<Baseline> {
    let first = run_tests(dir, setup, timeout, isolation)?;
    if first.timed_out {
        return Err(SuiteTooSlow(format!(
            "the test suite ran past the {} s timeout on the clean tree (`{}`)",
            timeout.as_secs(),
            setup.test_cmd
        ))
        .into());
    }
    anyhow::ensure!(
        !first.statuses.is_empty(),
        "the test command found no tests or could not run (`{}`); last output:\n{}",
        setup.test_cmd,
        last_lines(&first.log, 15)
    );
    let second = run_tests(dir, setup, timeout, isolation)?;
    if second.timed_out {
        return Err(SuiteTooSlow(format!(
            "the test suite ran past the {} s timeout on its second run",
            timeout.as_secs()
        ))
        .into());
    }
    let mut b = Baseline {
        passing: BTreeSet::new(),
        flaky: BTreeSet::new(),
        not_passing: BTreeSet::new(),
        seconds: first.seconds.max(second.seconds),
    };
    for (id, s1) in &first.statuses {
        match second.statuses.get(id) {
            Some(s2) if s1 == s2 && s1 == "PASSED" => {
                b.passing.insert(id.clone());
            }
            Some(s2) if s1 == s2 => {
                b.not_passing.insert(id.clone());
            }
            _ => {
                b.flaky.insert(id.clone());
            }
        }
    }
    for id in second.statuses.keys() {
        if !first.statuses.contains_key(id) {
            b.flaky.insert(id.clone());
        }
    }
    anyhow::ensure!(
        !b.passing.is_empty(),
        "no test passes on the clean tree ({} failing, {} flaky): fix the environment first; last output:\n{}",
        b.not_passing.len(),
        b.flaky.len(),
        last_lines(&first.log, 15)
    );
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pytest_setup(own_venv: bool) -> TestSetup {
        TestSetup {
            language: Some(Language::Python),
            runner: TestRunner::Pytest,
            test_cmd: "PYTHONHASHSEED=0 TZ=UTC '/env/venv/bin/python' -m pytest -rA --tb=long -p no:cacheprovider 2>&1"
                .into(),
            log_parser: "parse_log_pytest".into(),
            readable_paths: vec![PathBuf::from("/env/venv")],
            python: Some((PathBuf::from("/env/venv/bin/python"), own_venv)),
        }
    }

    #[test]
    fn the_retry_ladder_goes_to_older_pytest_then_unittest() {
        assert_eq!(
            python_ladder(&pytest_setup(true)),
            [LadderStep::PytestBelow(8), LadderStep::PytestBelow(7), LadderStep::Unittest]
        );
        // A user's interpreter is never changed: straight to unittest.
        assert_eq!(python_ladder(&pytest_setup(false)), [LadderStep::Unittest]);
        let unittest = apply_ladder_step(&pytest_setup(false), LadderStep::Unittest).unwrap();
        assert_eq!(unittest.test_cmd, "PYTHONHASHSEED=0 TZ=UTC '/env/venv/bin/python' -m unittest -v 2>&1");
        assert_eq!((unittest.runner, unittest.log_parser.as_str()), (TestRunner::Unittest, "parse_log_django"));
        assert_eq!(unittest.readable_paths, [PathBuf::from("/env/venv")]);
        // Nothing below unittest, and nothing for other runners.
        assert!(python_ladder(&unittest).is_empty());
        let go = TestSetup { runner: TestRunner::GoTest, python: None, ..unittest };
        assert!(python_ladder(&go).is_empty());
    }
}
