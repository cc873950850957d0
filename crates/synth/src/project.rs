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
    /// tape (its TAP output read test by test: `parse_log_tape`).
    Tape,
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
/// no tests, or none passes): today's dependencies instead of the release era's, an older
/// pytest major version, the standard library's unittest, then the command the project
/// declares in `tox.ini` or `noxfile.py`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LadderStep {
    /// Rebuild synth's virtualenv with the dependencies of today (no upload-time cutoff).
    TodaysDependencies,
    /// Install `pytest<N` into synth's own virtualenv and run pytest again.
    PytestBelow(u32),
    /// `python -m unittest -v` with the same interpreter.
    Unittest,
    /// The project's own test command ([`crate::declared`]), run with the same interpreter.
    Declared(crate::declared::DeclaredCommand),
}

/// The steps tried after `setup`'s baseline failed, in order (empty when none applies: not
/// pytest). Older pytest versions are tried only in a virtualenv synth created.
pub fn python_ladder(setup: &TestSetup, tree: &Path) -> Vec<LadderStep> {
    let Some((python, own)) = &setup.python else { return Vec::new() };
    let mut steps = match (&setup.runner, own) {
        (TestRunner::Pytest, true) => {
            let era = venv_resolution(python).is_some_and(|r| r.plan.is_era());
            let today = era.then_some(LadderStep::TodaysDependencies);
            today
                .into_iter()
                .chain([LadderStep::PytestBelow(8), LadderStep::PytestBelow(7), LadderStep::Unittest])
                .collect()
        }
        (TestRunner::Pytest, false) => vec![LadderStep::Unittest],
        (TestRunner::Unittest, _) => Vec::new(),
        _ => return Vec::new(),
    };
    // The project's own command needs pytest when it names pytest; unittest is always there.
    let has_pytest = setup.runner == TestRunner::Pytest;
    if let Some(cmd) = crate::declared::declared_command(tree)
        .filter(|c| c.runner == crate::declared::DeclaredRunner::Unittest || has_pytest)
    {
        steps.push(LadderStep::Declared(cmd));
    }
    steps
}

/// `setup` after one ladder step (the tree `tree` and `opts` rebuild the virtualenv;
/// installing needs PyPI).
pub fn apply_ladder_step(
    setup: &TestSetup,
    step: LadderStep,
    tree: &Path,
    opts: &EnvOptions,
) -> anyhow::Result<TestSetup> {
    let (python, _) = setup.python.clone().ok_or_else(|| anyhow::anyhow!("not a Python setup"))?;
    match step {
        LadderStep::TodaysDependencies => {
            let venv = python.parent().and_then(Path::parent).ok_or_else(|| anyhow::anyhow!("no virtualenv"))?;
            std::fs::remove_dir_all(venv).map_err(|e| anyhow::anyhow!("cannot remove {}: {e}", venv.display()))?;
            create_venv(tree, &EnvOptions { released: None, ..opts.clone() })?;
            Ok(setup.clone())
        }
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
        LadderStep::Declared(cmd) => {
            use crate::declared::DeclaredRunner;
            // The environment and interpreter of the current command, whichever runner it has.
            let env = setup.test_cmd.split(" -m pytest").next().unwrap_or_default();
            let env = env.split(" -m unittest").next().unwrap_or_default();
            let args: Vec<String> = cmd.args.iter().map(|a| shell_quote(a)).collect();
            let (runner, test_cmd, parser) = match cmd.runner {
                DeclaredRunner::Pytest => (
                    TestRunner::Pytest,
                    format!(
                        "{env} -m pytest -rA --tb=long -p no:cacheprovider -p no:randomly --continue-on-collection-errors {} 2>&1",
                        args.join(" ")
                    ),
                    "parse_log_pytest",
                ),
                // `-v` goes after `discover`: unittest reads discovery only as its first word.
                DeclaredRunner::Unittest => match cmd.args.first().map(String::as_str) {
                    Some("discover") => (
                        TestRunner::Unittest,
                        format!("{env} -m unittest discover -v {} 2>&1", args[1..].join(" ")),
                        "parse_log_django",
                    ),
                    _ => (TestRunner::Unittest, format!("{env} -m unittest -v {} 2>&1", args.join(" ")), "parse_log_django"),
                },
            };
            Ok(TestSetup { runner, test_cmd: test_cmd.replace("  ", " "), log_parser: parser.into(), ..setup.clone() })
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
    /// When the release was published (ISO 8601 UTC): dependencies are resolved as of this
    /// time (npm `install --before`; Python with uv's `--exclude-newer`, [`crate::era`]), so
    /// an old release gets the dependency versions of its era.
    pub released: Option<String>,
    /// Where dependencies come from: the language's registry, or Debian's packages
    /// (`--go MODULE@debian`).
    pub dependencies: crate::intake::DependencySource,
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
        f.ends_with(".py")
            && (file.starts_with("test_")
                || file.ends_with("_test.py")
                || file.ends_with("_tests.py")
                || file == "tests.py")
    });
    ensure_tests(has_tests, || {
        format!(
            "{}: Python project without test files (test_*.py, *_test.py, *_tests.py or tests.py): no tests to validate tasks with",
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
            test_cmd: format!("{env} {py} -m pytest -rA --tb=long -p no:cacheprovider -p no:randomly -o addopts= --continue-on-collection-errors 2>&1"),
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

/// File in synth's virtualenv recording how its packages were resolved.
const RESOLUTION_FILE: &str = "frognano-resolution.json";

/// How synth's virtualenv was resolved (written beside it when it is made).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Resolution {
    /// `uv X.Y.Z` or `pip`.
    pub resolver: String,
    /// The cutoffs used (none: today's packages).
    pub plan: crate::era::EraPlan,
    /// Why the era's resolution was not used, when it failed and today's was.
    pub era_error: Option<String>,
    /// What was installed beyond pytest and the project: requirement files (`-r FILE`) and
    /// distributions the test files import.
    #[serde(default)]
    pub installed: Vec<String>,
}

/// The [`Resolution`] of the virtualenv whose interpreter is `python` (`None`: not one synth
/// made, or made before resolutions were recorded).
pub fn venv_resolution(python: &Path) -> Option<Resolution> {
    let venv = python.parent()?.parent()?;
    serde_json::from_str(&std::fs::read_to_string(venv.join(RESOLUTION_FILE)).ok()?).ok()
}

/// What synth installs into its virtualenv first: pytest and, when the tree is packaged, the
/// project with its test extras (for its dependencies and metadata: tests import the
/// workspace copy first).
fn python_core_requirements(tree: &Path) -> Vec<String> {
    let mut reqs = vec!["pytest".to_string()];
    if ["pyproject.toml", "setup.py", "setup.cfg"].iter().any(|f| tree.join(f).is_file()) {
        reqs.push(format!("{}[test,tests,testing]", tree.display()));
    }
    reqs
}

/// Test requirement files a project may ship, installed each on its own (one that fails to
/// resolve or build is skipped with a warning).
const TEST_REQUIREMENT_FILES: [&str; 9] = [
    "requirements-test.txt",
    "requirements-tests.txt",
    "requirements_test.txt",
    "test-requirements.txt",
    "test_requirements.txt",
    "requirements/test.txt",
    "requirements/tests.txt",
    "tests/requirements.txt",
    "requirements-dev.txt",
];

/// Distributions whose import name differs from the name they are published under.
const IMPORT_ALIASES: [(&str, &str); 14] = [
    ("yaml", "PyYAML"),
    ("dateutil", "python-dateutil"),
    ("PIL", "Pillow"),
    ("attr", "attrs"),
    ("bs4", "beautifulsoup4"),
    ("sklearn", "scikit-learn"),
    ("pkg_resources", "setuptools"),
    ("Crypto", "pycryptodome"),
    ("jwt", "PyJWT"),
    ("dns", "dnspython"),
    ("OpenSSL", "pyOpenSSL"),
    ("git", "GitPython"),
    ("serial", "pyserial"),
    ("zmq", "pyzmq"),
];

/// Top-level names the test files (and conftests) import unconditionally — module-level
/// `import x` / `from x import …`, not inside `try`, `if` or a function — that are neither
/// the project's own (a file `x.py` or folder `x/` anywhere in the tree) nor relative.
pub fn test_import_names(tree: &Path, files: &[String]) -> BTreeSet<String> {
    let local: BTreeSet<String> = files
        .iter()
        .flat_map(|f| {
            let parts: Vec<&str> = f.split('/').collect();
            let (file, dirs) = parts.split_last().map(|(f, d)| (*f, d.to_vec())).unwrap_or_default();
            let stem = file.strip_suffix(".py").map(str::to_string);
            dirs.into_iter().map(str::to_string).chain(stem)
        })
        .collect();
    let mut names = BTreeSet::new();
    for f in files.iter().filter(|f| f.ends_with(".py") && is_test_path(f)) {
        let Ok(source) = std::fs::read_to_string(tree.join(f)) else { continue };
        let Some(parsed) = Language::Python.parse(&source) else { continue };
        let root = parsed.root_node();
        let mut cursor = root.walk();
        for stmt in root.children(&mut cursor) {
            let targets: Vec<tree_sitter::Node<'_>> = match stmt.kind() {
                "import_statement" => {
                    let mut c = stmt.walk();
                    stmt.children_by_field_name("name", &mut c)
                        .map(
                            |n| {
                                if n.kind() == "aliased_import" {
                                    n.child_by_field_name("name").unwrap_or(n)
                                } else {
                                    n
                                }
                            },
                        )
                        .collect()
                }
                "import_from_statement" => {
                    stmt.child_by_field_name("module_name").filter(|m| m.kind() == "dotted_name").into_iter().collect()
                }
                _ => Vec::new(),
            };
            for t in targets {
                let top = source[t.byte_range()].split('.').next().unwrap_or_default().trim().to_string();
                if !top.is_empty() && !local.contains(&top) {
                    names.insert(top);
                }
            }
        }
    }
    names
}

/// Of `names`, those `python` can import neither from its standard library nor from what is
/// installed, as distribution names to install ([`IMPORT_ALIASES`] applied).
fn missing_distributions(python: &Path, names: &BTreeSet<String>) -> Vec<String> {
    if names.is_empty() {
        return Vec::new();
    }
    let script = "import sys, importlib.util\nstd = getattr(sys, 'stdlib_module_names', ())\nfor n in sys.argv[1:]:\n    if n not in std and n not in sys.builtin_module_names and importlib.util.find_spec(n) is None:\n        print(n)\n";
    let out = HostCommand::new(python).arg("-c").arg(script).args(names).current_dir(std::env::temp_dir()).output();
    let Some(out) = out.ok().filter(|o| o.status.success()) else { return Vec::new() };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|n| IMPORT_ALIASES.iter().find(|(i, _)| *i == n).map_or(n.to_string(), |(_, d)| d.to_string()))
        .collect()
}

fn first_error_line(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let line = lines.iter().find(|l| l.contains("error") || l.contains("No solution")).or(lines.first());
    line.map(|l| l.chars().take(300).collect()).unwrap_or_default()
}

/// Creates `env_dir/venv` with pytest, the project and its test extras, the test
/// requirement files it ships, and the third-party modules its test files import that are
/// still missing then ([`test_import_names`]: `freezegun`, `pretend`, `yaml` …). With uv
/// (`frognano_swe::env_record::find_uv`) and a release time, everything is resolved as of the
/// release ([`crate::era::plan`]); when that resolution fails, as of today; without uv, with
/// pip as of today. The resolution used is recorded beside the virtualenv.
fn create_venv(tree: &Path, opts: &EnvOptions) -> anyhow::Result<PathBuf> {
    let venv = std::path::absolute(opts.env_dir.join("venv"))?;
    let python = venv.join("bin/python");
    if python.exists() {
        return Ok(python);
    }
    std::fs::create_dir_all(&opts.env_dir)?;
    run_host(HostCommand::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv")?;
    let unreachable = "(is PyPI reachable? pass --python to use an existing interpreter)";
    let mut resolution = match frognano_swe::env_record::find_uv() {
        Some(uv) => {
            let version = frognano_swe::env_record::python_version(&python)?;
            let plan = crate::era::plan(opts.released.as_deref(), &version);
            let resolver = first_line_of(&uv.to_string_lossy(), &["--version"]).unwrap_or_else(|| "uv".into());
            // The tree is no git checkout, but the output folder may lie inside one (this
            // repository's, say): setuptools-scm and hatch-vcs would read that one's tags
            // instead of the sdist's PKG-INFO and fail the build.
            let ceiling = tree.parent().unwrap_or(tree).to_path_buf();
            let install = |plan: &crate::era::EraPlan, reqs: &[String]| {
                run_host(
                    HostCommand::new(&uv)
                        .args(["pip", "install", "--quiet", "--python"])
                        .arg(&python)
                        .args(plan.uv_args())
                        .args(reqs)
                        .env("GIT_CEILING_DIRECTORIES", &ceiling),
                    "uv pip install",
                )
            };
            let core = python_core_requirements(tree);
            let today = crate::era::EraPlan::default();
            let mut resolution = match install(&plan, &core) {
                Ok(()) => Resolution { resolver, plan, ..Default::default() },
                Err(era) => {
                    if plan.is_era() {
                        tracing::warn!("resolving as of {:?} failed, so as of today: {era:#}", plan.exclude_newer);
                    }
                    let era_error = plan.is_era().then(|| first_error_line(&era));
                    if let Err(e) = install(&today, &core) {
                        // The project itself does not install: pytest alone, as pip did.
                        tracing::warn!("installing the project failed; tests may not import: {e:#}");
                        install(&today, &core[..1]).map_err(|e| anyhow::anyhow!("{e:#} {unreachable}"))?;
                    }
                    Resolution { resolver, plan: today.clone(), era_error, ..Default::default() }
                }
            };
            for req in TEST_REQUIREMENT_FILES.iter().filter(|r| tree.join(r).is_file()) {
                let args = ["-r".to_string(), tree.join(req).to_string_lossy().into()];
                match install(&resolution.plan, &args) {
                    Ok(()) => resolution.installed.push(format!("-r {req}")),
                    Err(e) => tracing::warn!("installing {req} failed: {e:#}"),
                }
            }
            let wanted = test_import_names(tree, &walk_files(tree));
            for dist in missing_distributions(&python, &wanted) {
                match install(&resolution.plan, std::slice::from_ref(&dist)) {
                    Ok(()) => resolution.installed.push(dist),
                    Err(e) => tracing::warn!("installing {dist}, which the tests import, failed: {e:#}"),
                }
            }
            resolution
        }
        None => {
            tracing::warn!("uv not found ($FROGNANO_UV, PATH, .venv-uv/bin/uv): dependencies of today, with pip");
            install_with_pip(tree, &python)?;
            Resolution { resolver: "pip".into(), ..Default::default() }
        }
    };
    resolution.installed.sort();
    std::fs::write(venv.join(RESOLUTION_FILE), serde_json::to_string_pretty(&resolution)?)?;
    Ok(python)
}

/// pip's install, one piece at a time (only pytest must succeed).
fn install_with_pip(tree: &Path, python: &Path) -> anyhow::Result<()> {
    run_host(
        HostCommand::new(python).args(["-m", "pip", "install", "--quiet", "pytest"]),
        "pip install pytest (is PyPI reachable? pass --python to use an existing interpreter)",
    )?;
    let packaged = ["pyproject.toml", "setup.py", "setup.cfg"].iter().any(|f| tree.join(f).is_file());
    if packaged {
        let with_extras = format!("{}[test,tests,testing]", tree.display());
        let ok = HostCommand::new(python)
            .args(["-m", "pip", "install", "--quiet", &with_extras])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            let out = HostCommand::new(python).args(["-m", "pip", "install", "--quiet"]).arg(tree).output();
            if !out.as_ref().is_ok_and(|o| o.status.success()) {
                tracing::warn!("installing {} into the virtualenv failed; tests may not import", tree.display());
            }
        }
    }
    for req in TEST_REQUIREMENT_FILES {
        if tree.join(req).is_file() {
            let out =
                HostCommand::new(python).args(["-m", "pip", "install", "--quiet", "-r"]).arg(tree.join(req)).output();
            if !out.as_ref().is_ok_and(|o| o.status.success()) {
                tracing::warn!("pip install -r {req} failed");
            }
        }
    }
    Ok(())
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
                if let Some(pins) = pip_freeze(python) {
                    rec["packages"] = pins.into();
                }
                if let Some(resolution) = venv_resolution(python) {
                    rec["resolution"] = serde_json::to_value(resolution).unwrap_or_default();
                }
            }
        }
        TestRunner::Cargo => rec["cargo"] = first_line_of("cargo", &["--version"]).into(),
        TestRunner::GoTest => {
            // The toolchain the command names (a fetched one is called by its path).
            let go = setup.test_cmd.split_whitespace().find(|w| w.ends_with("/bin/go'") || *w == "go");
            let go = go.map(|g| g.trim_matches('\'').to_string()).unwrap_or_else(|| "go".into());
            rec["go"] = first_line_of(&go, &["version"]).into();
            // Modules served from Debian's packages (`--go MODULE@debian`), with their versions.
            let debian = env_dir.join(crate::langs::DEBIAN_GO_DIR).join(crate::langs::DEBIAN_GO_RECORD);
            if let Some(deps) = std::fs::read_to_string(debian)
                .ok()
                .and_then(|t| serde_json::from_str::<crate::debian::GoDependencies>(&t).ok())
            {
                rec["debian_modules"] = deps.record();
            }
        }
        TestRunner::NodeTest | TestRunner::Jest | TestRunner::Vitest | TestRunner::Mocha | TestRunner::Tape => {
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
            // Which install rung gave those packages, and what it left out or widened.
            if let Some(install) = std::fs::read_to_string(env_dir.join("npm").join(crate::langs::INSTALL_RECORD))
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            {
                rec["npm_install"] = install;
            }
        }
    }
    rec
}

fn pip_freeze(python: &Path) -> Option<Vec<String>> {
    let out = HostCommand::new(python).args(["-m", "pip", "freeze", "--all"]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect())
}

/// The record `eval grade` rebuilds the environment from (`frognano_swe::env_record`):
/// `Some` for synth's own virtualenv, whose every package is pinned `name==version` except
/// the project itself, installed from `tree` (rebuilt from the task's clean commit). `None`
/// for a `--python` interpreter or another runner; an error when a package cannot be pinned
/// (installed from a URL or a folder other than the project's).
pub fn rebuild_record(
    setup: &TestSetup,
    tree: &Path,
) -> anyhow::Result<Option<frognano_swe::env_record::EnvironmentRecord>> {
    use frognano_swe::env_record::{pin_name, python_version, EnvironmentRecord, PythonVenv};
    let Some((python, true)) = &setup.python else { return Ok(None) };
    let venv =
        python.parent().and_then(Path::parent).ok_or_else(|| anyhow::anyhow!("{}: no virtualenv", python.display()))?;
    let freeze = pip_freeze(python).ok_or_else(|| anyhow::anyhow!("pip freeze failed in {}", venv.display()))?;
    let tree_url = format!("file://{}", std::path::absolute(tree)?.display());
    let mut packages = Vec::new();
    let mut project = None;
    for line in freeze.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
        match line.split_once(" @ ") {
            Some((name, url)) if url.trim_end_matches('/') == tree_url => project = Some(name.trim().to_string()),
            _ if pin_name(line).is_some() => packages.push(line.to_string()),
            _ => anyhow::bail!(
                "{}: package {line:?} is not pinned by version; the environment cannot be rebuilt",
                venv.display()
            ),
        }
    }
    let resolution = venv_resolution(python).unwrap_or_default();
    Ok(Some(EnvironmentRecord::PythonVenv(PythonVenv {
        python: python_version(python)?,
        venv: venv.to_path_buf(),
        packages,
        project,
        exclude_newer: resolution.plan.exclude_newer,
        tools_exclude_newer: resolution.plan.tools_exclude_newer,
    })))
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
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
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
    if first.statuses.is_empty() {
        return Err(BaselineFailed {
            message: format!(
                "the test command found no tests or could not run (`{}`); last output:\n{}",
                setup.test_cmd,
                last_lines(&first.log, 15)
            ),
            missing_modules: missing_modules_in(&first.log),
        }
        .into());
    }
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
    if b.passing.is_empty() {
        return Err(BaselineFailed {
            message: format!(
                "no test passes on the clean tree ({} failing, {} flaky): fix the environment first; last output:\n{}",
                b.not_passing.len(),
                b.flaky.len(),
                last_lines(&first.log, 15)
            ),
            missing_modules: missing_modules_in(&first.log),
        }
        .into());
    }
    Ok(b)
}

/// The clean tree's suite found no tests or none passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaselineFailed {
    /// What happened, with the end of the output.
    pub message: String,
    /// Modules the output says are missing (`No module named 'x'`), as distribution names.
    pub missing_modules: Vec<String>,
}

impl std::fmt::Display for BaselineFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BaselineFailed {}

/// The top-level modules a Python run's output says are missing (`ModuleNotFoundError: No
/// module named 'x.y'` → `x`), as distribution names ([`IMPORT_ALIASES`]), each once.
pub fn missing_modules_in(log: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for rest in log.split("No module named ").skip(1) {
        let name: String = rest
            .trim_start_matches(['\'', '"'])
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.')
            .collect();
        let top = name.split('.').next().unwrap_or_default();
        if top.is_empty() {
            continue;
        }
        let dist = IMPORT_ALIASES.iter().find(|(i, _)| *i == top).map_or(top.to_string(), |(_, d)| d.to_string());
        if !out.contains(&dist) {
            out.push(dist);
        }
    }
    out
}

/// Installs `dists` into synth's own virtualenv of `setup`, with the cutoffs it was resolved
/// with (uv), and records them in its resolution. An error for a `--python` interpreter.
pub fn install_missing(setup: &TestSetup, dists: &[String]) -> anyhow::Result<()> {
    let Some((python, true)) = &setup.python else { anyhow::bail!("not synth's own virtualenv") };
    let mut resolution = venv_resolution(python).unwrap_or_default();
    match frognano_swe::env_record::find_uv() {
        Some(uv) => run_host(
            HostCommand::new(uv)
                .args(["pip", "install", "--quiet", "--python"])
                .arg(python)
                .args(resolution.plan.uv_args())
                .args(dists),
            "uv pip install",
        )?,
        None => {
            run_host(HostCommand::new(python).args(["-m", "pip", "install", "--quiet"]).args(dists), "pip install")?
        }
    }
    resolution.installed.extend(dists.iter().cloned());
    resolution.installed.sort();
    let venv = python.parent().and_then(Path::parent).ok_or_else(|| anyhow::anyhow!("no virtualenv"))?;
    std::fs::write(venv.join(RESOLUTION_FILE), serde_json::to_string_pretty(&resolution)?)?;
    Ok(())
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
            python_ladder(&pytest_setup(true), Path::new("/nonexistent")),
            [LadderStep::PytestBelow(8), LadderStep::PytestBelow(7), LadderStep::Unittest]
        );
        // A user's interpreter is never changed: straight to unittest.
        assert_eq!(python_ladder(&pytest_setup(false), Path::new("/nonexistent")), [LadderStep::Unittest]);
        let opts = EnvOptions {
            python: None,
            env_dir: PathBuf::from("/env"),
            released: None,
            dependencies: crate::intake::DependencySource::Registry,
        };
        let unittest =
            apply_ladder_step(&pytest_setup(false), LadderStep::Unittest, Path::new("/tree"), &opts).unwrap();
        assert_eq!(unittest.test_cmd, "PYTHONHASHSEED=0 TZ=UTC '/env/venv/bin/python' -m unittest -v 2>&1");
        assert_eq!((unittest.runner, unittest.log_parser.as_str()), (TestRunner::Unittest, "parse_log_django"));
        assert_eq!(unittest.readable_paths, [PathBuf::from("/env/venv")]);
        // Nothing below unittest, and nothing for other runners.
        assert!(python_ladder(&unittest, Path::new("/nonexistent")).is_empty());
        let go = TestSetup { runner: TestRunner::GoTest, python: None, ..unittest };
        assert!(python_ladder(&go, Path::new("/nonexistent")).is_empty());

        // A project's tox.ini command is the last rung, run with the same interpreter.
        let tree = tempfile::tempdir().unwrap();
        std::fs::write(tree.path().join("tox.ini"), "[testenv]\ncommands = pytest --cov=pkg tests {posargs}\n")
            .unwrap();
        let ladder = python_ladder(&pytest_setup(false), tree.path());
        assert!(matches!(ladder.as_slice(), [LadderStep::Unittest, LadderStep::Declared(_)]), "{ladder:?}");
        let declared = apply_ladder_step(&pytest_setup(false), ladder[1].clone(), tree.path(), &opts).unwrap();
        assert_eq!(
            declared.test_cmd,
            "PYTHONHASHSEED=0 TZ=UTC '/env/venv/bin/python' -m pytest -rA --tb=long -p no:cacheprovider -p no:randomly --continue-on-collection-errors 'tests' 2>&1"
        );
        // A declared pytest command needs pytest; a unittest runner gets only unittest ones.
        let unittest_only = TestSetup { runner: TestRunner::Unittest, ..pytest_setup(false) };
        assert!(python_ladder(&unittest_only, tree.path()).is_empty());

        // A virtualenv resolved as of its release's era first retries with today's packages.
        let dir = tempfile::tempdir().unwrap();
        let python = dir.path().join("venv/bin/python");
        std::fs::create_dir_all(python.parent().unwrap()).unwrap();
        let era = Resolution {
            resolver: "uv 0.13.9".into(),
            plan: crate::era::plan(Some("2021-01-31T19:03:35Z"), "3.11.7"),
            era_error: None,
            installed: vec![],
        };
        std::fs::write(dir.path().join("venv").join(RESOLUTION_FILE), serde_json::to_string(&era).unwrap()).unwrap();
        let setup = TestSetup { python: Some((python.clone(), true)), ..pytest_setup(true) };
        assert_eq!(venv_resolution(&python), Some(era));
        assert_eq!(
            python_ladder(&setup, Path::new("/nonexistent"))[..2],
            [LadderStep::TodaysDependencies, LadderStep::PytestBelow(8)]
        );
        let today = Resolution { resolver: "uv 0.13.9".into(), ..Resolution::default() };
        std::fs::write(dir.path().join("venv").join(RESOLUTION_FILE), serde_json::to_string(&today).unwrap()).unwrap();
        assert_eq!(python_ladder(&setup, Path::new("/nonexistent"))[0], LadderStep::PytestBelow(8));
    }

    #[test]
    fn test_imports_name_the_third_party_modules_the_tests_need() {
        let dir = tempfile::tempdir().unwrap();
        let files = [
            ("src/pkg/__init__.py", "import requests\n"),
            ("tests/conftest.py", "import pytest\nfrom freezegun import freeze_time\n"),
            (
                "tests/test_a.py",
                "import os, yaml as y\nimport pretend.sub\nfrom pkg import x\nfrom . import helpers\nfrom util import f\ntry:\n    import numpy\nexcept ImportError:\n    numpy = None\ndef test_x():\n    import hypothesis\n",
            ),
            ("tests/util.py", ""),
            ("tests/helpers.py", ""),
        ];
        for (f, text) in files {
            let p = dir.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let names = test_import_names(dir.path(), &walk_files(dir.path()));
        // Not the project's own (pkg, util), not relative, not conditional or in a function;
        // not src/ code's imports either (the project's dependencies install those).
        let want = ["freezegun", "os", "pretend", "pytest", "yaml"];
        assert_eq!(names, want.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>());
        // Missing from the interpreter: not the standard library, and by published name.
        let probe: BTreeSet<String> = ["os", "yaml", "frognano_no_such_module"].iter().map(|s| s.to_string()).collect();
        let missing = missing_distributions(Path::new("python3"), &probe);
        assert!(missing.contains(&"frognano_no_such_module".to_string()), "{missing:?}");
        assert!(!missing.iter().any(|m| m == "os" || m == "yaml"), "{missing:?}");
    }

    #[test]
    fn missing_modules_are_read_from_the_output_by_published_name() {
        let log = "E   ModuleNotFoundError: No module named 'pytz'\nE   ModuleNotFoundError: No module named 'yaml.constructor'\nImportError: No module named \"pytz\"\nNo module named 'a_b.c'\n";
        assert_eq!(missing_modules_in(log), ["pytz", "PyYAML", "a_b"]);
        assert!(missing_modules_in("12 passed").is_empty());
    }

    #[test]
    fn the_rebuild_record_pins_every_package_and_names_the_project() {
        // A real virtualenv (python3 -m venv, no network): pip and setuptools pinned, and
        // a project installed from the tree recognised by its file URL.
        let dir = tempfile::tempdir().unwrap();
        let venv = dir.path().join("venv");
        run_host(HostCommand::new("python3").args(["-m", "venv", "--without-pip"]).arg(&venv), "venv").unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(&tree).unwrap();
        // Fake `pip freeze` through a `pip` module shadowing the real one in the virtualenv.
        let site = std::fs::read_dir(venv.join("lib")).unwrap().next().unwrap().unwrap().path().join("site-packages");
        let freeze = format!("Jinja2 @ file://{}\nMarkupSafe==1.1.1\npytest==7.2.0\n", tree.display());
        std::fs::write(site.join("pip.py"), format!("import sys\nsys.stdout.write({freeze:?})\n")).unwrap();
        let python = venv.join("bin/python");
        let setup = TestSetup { python: Some((python.clone(), true)), ..pytest_setup(true) };
        let plan = crate::era::plan(Some("2021-01-31T19:03:35Z"), "3.11.7");
        let era = Resolution { resolver: "uv".into(), plan: plan.clone(), ..Resolution::default() };
        std::fs::write(venv.join(RESOLUTION_FILE), serde_json::to_string(&era).unwrap()).unwrap();
        let frognano_swe::env_record::EnvironmentRecord::PythonVenv(rec) =
            rebuild_record(&setup, &tree).unwrap().unwrap();
        assert_eq!(rec.packages, ["MarkupSafe==1.1.1", "pytest==7.2.0"]);
        assert_eq!(rec.project.as_deref(), Some("Jinja2"));
        assert_eq!(rec.venv, venv);
        assert_eq!((rec.exclude_newer, rec.tools_exclude_newer), (plan.exclude_newer, plan.tools_exclude_newer));
        // A package from elsewhere cannot be pinned: an error naming it.
        let freeze = "other @ file:///somewhere/else\n";
        std::fs::write(site.join("pip.py"), format!("import sys\nsys.stdout.write({freeze:?})\n")).unwrap();
        let e = rebuild_record(&setup, &tree).unwrap_err().to_string();
        assert!(e.ends_with("package \"other @ file:///somewhere/else\" is not pinned by version; the environment cannot be rebuilt"), "{e}");
        // A user's interpreter is not rebuilt.
        assert!(rebuild_record(&pytest_setup(false), &tree).unwrap().is_none());
    }
}
