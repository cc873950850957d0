//! Go and JavaScript/TypeScript environments: everything a test run needs is fetched here,
//! outside the sandbox, into the environment folder, and the recorded test command points at
//! it, because the sandbox (synthesis and `eval grade` alike) has no network.
//!
//! - **Go**: the module's dependencies go into a module cache of its own (`env/gomodcache`,
//!   `go mod download`); when `go.mod` asks for a newer Go than the installed one, that
//!   toolchain is fetched through the same module proxy (`golang.org/toolchain`, what
//!   `GOTOOLCHAIN=auto` does in Go ≥ 1.21) and called by its path. A build cache warmed once
//!   (`env/gocache`) is copied into the sandbox's private `/tmp` before each run, since Go
//!   needs a writable cache. Runs are offline: `GOPROXY=off GOFLAGS=-mod=mod GOSUMDB=off`.
//!   For `--go MODULE@debian` the requirements come from Debian's packages instead
//!   ([`crate::debian`], unpacked into `env/debian-go`), and each run writes a `go.work` in
//!   its private `/tmp` that replaces every such module by its folder (`GOWORK=…`): nothing
//!   is fetched, the tree's `go.sum` is not consulted for them, nothing is written into the
//!   tree. The installed Go is used as is (toolchains come only from the proxy), and tests
//!   run with `-vet=off`, as Debian's builds run them.
//! - **npm**: `package.json` (and its lock file) is installed with `npm install
//!   --ignore-scripts` into `env/npm`; the test command links `node_modules` to it when the
//!   tree has none, so the project's imports and its test runner resolve as after an
//!   ordinary install.

use std::path::{Path, PathBuf};
use std::process::Command as HostCommand;

use crate::mutate::Language;
use crate::project::{ensure_tests, run_host, shell_quote, EnvOptions, TestRunner, TestSetup};

/// A Go release number (`go1.22.3` → 1.22.3; a missing patch is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoVersion(pub u32, pub u32, pub u32);

impl GoVersion {
    /// Parses `go1.22.3`, `1.22`, `1.21rc1` (pre-releases count as the release before).
    pub fn parse(s: &str) -> Option<GoVersion> {
        let s = s.trim().trim_start_matches("go");
        let mut nums = s.split('.').map(|p| {
            let digits: String = p.chars().take_while(|c| c.is_ascii_digit()).collect();
            digits.parse::<u32>().ok()
        });
        let major = nums.next()??;
        let minor = nums.next().flatten().unwrap_or(0);
        let patch = nums.next().flatten().unwrap_or(0);
        Some(GoVersion(major, minor, patch))
    }

    /// The toolchain name the module proxy knows (`go1.22.0`; before 1.21 releases had no
    /// `.0`: `go1.20`).
    pub fn toolchain_name(self) -> String {
        if self.2 == 0 && (self.0, self.1) < (1, 21) {
            format!("go{}.{}", self.0, self.1)
        } else {
            format!("go{}.{}.{}", self.0, self.1, self.2)
        }
    }
}

/// The Go release a `go.mod` asks for: its `toolchain` line, else its `go` line.
pub fn go_mod_wants(go_mod: &str) -> Option<GoVersion> {
    let mut go = None;
    let mut toolchain = None;
    for line in go_mod.lines() {
        let mut words = line.split("//").next().unwrap_or("").split_whitespace();
        match (words.next(), words.next()) {
            (Some("go"), Some(v)) => go = GoVersion::parse(v),
            (Some("toolchain"), Some(v)) if v != "default" => toolchain = GoVersion::parse(v),
            _ => {}
        }
    }
    match (go, toolchain) {
        (Some(g), Some(t)) => Some(g.max(t)),
        (g, t) => g.or(t),
    }
}

fn go_output(go: &Path, args: &[&str], dir: &Path, env: &[(&str, &Path)]) -> anyhow::Result<String> {
    let mut cmd = HostCommand::new(go);
    cmd.args(args).current_dir(dir).env("GOTOOLCHAIN", "local").env("GOFLAGS", "-mod=mod");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().map_err(|e| anyhow::anyhow!("cannot run {}: {e} (is Go installed?)", go.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "`go {}` in {} failed: {}",
        args.join(" "),
        dir.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The installed Go's version (`go env GOVERSION`, run in `scratch`).
fn installed_go(scratch: &Path) -> anyhow::Result<GoVersion> {
    let version = go_output(Path::new("go"), &["env", "GOVERSION"], scratch, &[])?;
    GoVersion::parse(&version).ok_or_else(|| anyhow::anyhow!("cannot read the installed Go version from {version:?}"))
}

impl GoVersion {
    /// The release as a `go.mod`'s `go` line writes it (1.19.8 → `1.19`).
    pub fn go_mod_release(self) -> String {
        format!("{}.{}", self.0, self.1)
    }
}

/// The installed Go's release as a `go.mod` writes it (`go1.19.8` → `1.19`), run in `scratch`.
pub fn installed_go_release(scratch: &Path) -> anyhow::Result<String> {
    installed_go(scratch).map(GoVersion::go_mod_release)
}

/// The `go` binary for a module that wants `want`: the installed one when it is new enough,
/// else the toolchain module `golang.org/toolchain@v0.0.1-<name>.<os>-<arch>` downloaded
/// into `modcache` (its executables made executable again: module zips keep no modes).
fn go_binary(want: Option<GoVersion>, modcache: &Path, scratch: &Path) -> anyhow::Result<PathBuf> {
    let local = PathBuf::from("go");
    let have = installed_go(scratch)?;
    let Some(want) = want.filter(|w| *w > have) else { return Ok(local) };
    let goos = go_output(&local, &["env", "GOOS"], scratch, &[])?;
    let goarch = go_output(&local, &["env", "GOARCH"], scratch, &[])?;
    let module = format!("golang.org/toolchain@v0.0.1-{}.{goos}-{goarch}", want.toolchain_name());
    let json = go_output(&local, &["mod", "download", "-json", &module], scratch, &[("GOMODCACHE", modcache)])
        .map_err(|e| {
            anyhow::anyhow!(
                "the module asks for Go {}, newer than {}: {e}",
                want.toolchain_name(),
                have.toolchain_name()
            )
        })?;
    let info: serde_json::Value = serde_json::from_str(&json)?;
    let dir =
        PathBuf::from(info["Dir"].as_str().ok_or_else(|| anyhow::anyhow!("`go mod download {module}` gave no Dir"))?);
    use std::os::unix::fs::PermissionsExt;
    for sub in ["bin", "pkg/tool"] {
        let mut stack = vec![dir.join(sub)];
        while let Some(d) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else { continue };
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o555))?;
                }
            }
        }
    }
    Ok(dir.join("bin/go"))
}

/// Prepares a Go module: dependencies (and, if needed, the toolchain) into `env/gomodcache`,
/// a warm build cache in `env/gocache`, and the offline `go test -v` command.
pub fn prepare_go(tree: &Path, files: &[String], opts: &EnvOptions) -> anyhow::Result<TestSetup> {
    ensure_tests(files.iter().any(|f| f.ends_with("_test.go")), || {
        format!("{}: Go module without any _test.go file: no tests to validate tasks with", tree.display())
    })?;
    let env_dir = std::path::absolute(&opts.env_dir)?;
    let modcache = env_dir.join("gomodcache");
    let gocache = env_dir.join("gocache");
    std::fs::create_dir_all(&modcache)?;
    std::fs::create_dir_all(&gocache)?;
    let go_mod_path = tree.join("go.mod");
    let go_mod = std::fs::read_to_string(&go_mod_path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", go_mod_path.display()))?;
    if opts.dependencies == crate::intake::DependencySource::Debian {
        return prepare_go_from_debian(tree, &go_mod, &env_dir);
    }
    let go = go_binary(go_mod_wants(&go_mod), &modcache, tree)?;
    let cache_env = [("GOMODCACHE", modcache.as_path()), ("GOCACHE", gocache.as_path())];
    go_output(&go, &["mod", "download"], tree, &cache_env)?;
    // Compiles every package and its tests once (running none) so the sandboxed runs start
    // from a warm cache; a package that does not build shows up in the baseline instead.
    if let Err(e) = go_output(&go, &["test", "-count=1", "-run", "^$", "./..."], tree, &cache_env) {
        tracing::warn!("warming the Go build cache: {e}");
    }
    let go_str = if go.is_absolute() { shell_quote(&go.to_string_lossy()) } else { "go".to_string() };
    let run = format!(
        "env GOMODCACHE={modcache} GOCACHE=/tmp/frognano-gocache GOPROXY=off GOSUMDB=off GOFLAGS=-mod=mod \
         GOTOOLCHAIN=local GOENV=off GOTELEMETRY=off CGO_ENABLED=0 {go_str} test -v -count=1 ./...",
        modcache = shell_quote(&modcache.to_string_lossy()),
    );
    Ok(go_test_setup(&gocache, &run, vec![modcache.clone(), gocache.clone()]))
}

/// The Go runner's setup: `run` (a `go test -v` command line reading its build cache from
/// `/tmp/frognano-gocache`) after the warm cache `gocache` is copied there, since Go needs a
/// writable cache and the environment folder is read-only in the sandbox.
fn go_test_setup(gocache: &Path, run: &str, readable_paths: Vec<PathBuf>) -> TestSetup {
    let test_cmd = format!(
        "rm -rf /tmp/frognano-gocache && cp -r {cache} /tmp/frognano-gocache 2>/dev/null; {run} 2>&1",
        cache = shell_quote(&gocache.to_string_lossy()),
    );
    TestSetup {
        language: Some(Language::Go),
        runner: TestRunner::GoTest,
        test_cmd,
        log_parser: "parse_log_gotest".into(),
        readable_paths,
        python: None,
    }
}

/// Where [`prepare_go_from_debian`] keeps the Debian packages and what it served.
pub const DEBIAN_GO_DIR: &str = "debian-go";
/// The record of the modules served from Debian, in [`DEBIAN_GO_DIR`].
pub const DEBIAN_GO_RECORD: &str = "frognano-debian.json";
/// The `replace` lines each test run appends to its `go.work`, in [`DEBIAN_GO_DIR`].
const DEBIAN_GO_REPLACE: &str = "go.work.replace";

/// [`prepare_go`] for a module taken from Debian: its requirements (transitively) served
/// from Debian's packages into `env/debian-go`, a `go.work` that replaces each by its folder,
/// a warm build cache, and the offline `go test -vet=off -v` command, which writes that
/// `go.work` into its private `/tmp` with `use` naming the tree it runs in. `-vet=off` as
/// Debian's own builds test these packages (dh-golang: "go vet … breaks tests of many
/// not-yet-fixed upstream packages"): pflag's tests fail Go 1.19's printf check, which would
/// fail the whole package as `[build failed]`.
fn prepare_go_from_debian(tree: &Path, go_mod: &str, env_dir: &Path) -> anyhow::Result<TestSetup> {
    let modcache = env_dir.join("gomodcache");
    let gocache = env_dir.join("gocache");
    let have = installed_go(tree)?;
    let release = have.go_mod_release();
    if let Some(want) = go_mod_wants(go_mod).filter(|w| *w > have) {
        tracing::warn!(
            "{}/go.mod asks for Go {}, newer than the installed {release}; Debian's route uses the installed Go \
             (newer toolchains come only from the module proxy)",
            tree.display(),
            want.toolchain_name()
        );
    }
    let debian_dir = env_dir.join(DEBIAN_GO_DIR);
    std::fs::create_dir_all(&debian_dir)?;
    let deps = crate::debian::resolve_go_dependencies(go_mod, &debian_dir, &release)?;
    let record = debian_dir.join(DEBIAN_GO_RECORD);
    std::fs::write(&record, serde_json::to_string_pretty(&deps)?)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", record.display()))?;
    let replace = debian_dir.join(DEBIAN_GO_REPLACE);
    std::fs::write(&replace, deps.replace_lines())
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", replace.display()))?;
    let warm_work = debian_dir.join("warm.go.work");
    std::fs::write(
        &warm_work,
        format!("go {release}\n\nuse {:?}\n\n{}", tree.to_string_lossy(), deps.replace_lines()),
    )?;
    let offline = Path::new("off");
    let no_flags = Path::new("");
    let env = [
        ("GOMODCACHE", modcache.as_path()),
        ("GOCACHE", gocache.as_path()),
        ("GOWORK", warm_work.as_path()),
        ("GOFLAGS", no_flags),
        ("GOPROXY", offline),
        ("GOSUMDB", offline),
    ];
    if let Err(e) = go_output(Path::new("go"), &["test", "-vet=off", "-count=1", "-run", "^$", "./..."], tree, &env) {
        tracing::warn!("warming the Go build cache: {e}");
    }
    let run = format!(
        "{{ printf 'go {release}\\n\\nuse \"%s\"\\n\\n' \"$(pwd)\"; cat {replace}; }} > /tmp/frognano-go.work && \
         env GOWORK=/tmp/frognano-go.work GOMODCACHE={modcache} GOCACHE=/tmp/frognano-gocache GOPROXY=off GOSUMDB=off \
         GOFLAGS= GOTOOLCHAIN=local GOENV=off GOTELEMETRY=off CGO_ENABLED=0 go test -vet=off -v -count=1 ./...",
        replace = shell_quote(&replace.to_string_lossy()),
        modcache = shell_quote(&modcache.to_string_lossy()),
    );
    Ok(go_test_setup(&gocache, &run, vec![modcache.clone(), gocache.clone(), debian_dir]))
}

/// The `test` script with the scripts it runs through `npm run NAME` (or `npm run-script`,
/// `npm test`) spliced in, a few levels deep: many packages keep the runner in a `tests-only`
/// script that `test` calls after a linter.
fn expanded_test_script(package: &serde_json::Value) -> String {
    fn expand(package: &serde_json::Value, script: &str, depth: usize) -> String {
        let words: Vec<&str> = script.split_whitespace().collect();
        let mut out = Vec::new();
        let mut i = 0;
        while i < words.len() {
            let named = match (words[i], words.get(i + 1), words.get(i + 2)) {
                ("npm", Some(&("run" | "run-script")), Some(&"--silent")) => words.get(i + 3).map(|n| (*n, 4)),
                ("npm", Some(&("run" | "run-script")), Some(&name)) => Some((name, 3)),
                ("npm", Some(&("test" | "t")), _) => Some(("test", 2)),
                _ => None,
            };
            match named.and_then(|(n, k)| package["scripts"][n].as_str().map(|s| (s, k))) {
                Some((inner, k)) if depth < 4 => {
                    out.push(format!("( {} )", expand(package, inner, depth + 1)));
                    i += k;
                }
                _ => {
                    out.push(words[i].to_string());
                    i += 1;
                }
            }
        }
        out.join(" ")
    }
    expand(package, package["scripts"]["test"].as_str().unwrap_or(""), 0)
}

/// The test runner an npm project uses, from its `test` script (and the scripts it runs)
/// and its dependencies.
pub fn detect_node_runner(package: &serde_json::Value) -> Option<TestRunner> {
    let script = expanded_test_script(package);
    let has_dep = |name: &str| ["devDependencies", "dependencies"].iter().any(|k| package[*k].get(name).is_some());
    let words: Vec<&str> =
        script.split(|c: char| c.is_whitespace() || c == '&' || c == ';' || c == '(' || c == ')').collect();
    if words.contains(&"vitest") {
        Some(TestRunner::Vitest)
    } else if words.contains(&"jest") {
        Some(TestRunner::Jest)
    } else if words.contains(&"mocha") {
        Some(TestRunner::Mocha)
    } else if words.contains(&"tape") {
        Some(TestRunner::Tape)
    } else if script.contains("node --test") {
        Some(TestRunner::NodeTest)
    } else if has_dep("vitest") {
        Some(TestRunner::Vitest)
    } else if has_dep("jest") {
        Some(TestRunner::Jest)
    } else if has_dep("mocha") {
        Some(TestRunner::Mocha)
    } else if has_dep("tape") {
        Some(TestRunner::Tape)
    } else {
        None
    }
}

/// The files tape is given in the project's scripts (`tape 'test/**/*.js'` → `'test/**/*.js'`,
/// with coverage wrappers such as `nyc` left out), else ljharb's usual `'test/**/*.js'`.
pub fn tape_arguments(package: &serde_json::Value) -> String {
    let script = expanded_test_script(package);
    for part in script.split(['&', ';', '|', '(', ')']) {
        let words: Vec<&str> = part.split_whitespace().collect();
        if let Some(at) = words.iter().position(|w| *w == "tape") {
            let args: Vec<&str> = words[at + 1..].iter().copied().take_while(|w| !w.starts_with('>')).collect();
            if !args.is_empty() {
                return args.join(" ");
            }
        }
    }
    "'test/**/*.js'".to_string()
}

/// tape run once per test file (`parse_log_tape` reads the runs one after another), so that a
/// file that crashes while loading, or a bug that kills the process, loses only that file's
/// tests: resolve 1.22.8's `test/symlinks.js` dies creating symlinks outside the tree and,
/// in one process, took every other file's tests with it. The script's globs are expanded
/// by bash with `globstar` as tape expands them; arguments that are options (`-r setup.js`)
/// keep the single run.
pub fn tape_command(arguments: &str) -> String {
    let words = crate::declared::shell_words(arguments);
    if words.is_empty() || words.iter().any(|w| w.starts_with('-')) {
        return format!("node_modules/.bin/tape {arguments}");
    }
    let globs = words.iter().map(|w| shell_quote(w).replace('*', "'*'")).collect::<Vec<_>>().join(" ");
    // `'test/'*'.js'`: the quotes keep the folder literal and leave the stars to the glob.
    let script = format!("for f in {globs}; do node_modules/.bin/tape \"$f\"; done");
    format!("bash -O globstar -O nullglob -c {}", shell_quote(&script))
}

/// The language an npm project's code is in: TypeScript when its non-test sources are mostly
/// `.ts`, else JavaScript.
fn node_language(files: &[String]) -> Option<Language> {
    let (mut js, mut ts) = (0, 0);
    for f in files.iter().filter(|f| !crate::project::is_test_path(f)) {
        match Language::of_path(f) {
            Some(Language::JavaScript) => js += 1,
            Some(Language::TypeScript) => ts += 1,
            _ => {}
        }
    }
    match (js, ts) {
        (0, 0) => None,
        (js, ts) if ts > js => Some(Language::TypeScript),
        _ => Some(Language::JavaScript),
    }
}

/// Prepares an npm project: its dependencies installed into `env/npm` (network, outside the
/// sandbox), and the test command of its runner.
pub fn prepare_node(tree: &Path, files: &[String], opts: &EnvOptions) -> anyhow::Result<TestSetup> {
    let manifest = tree.join("package.json");
    let text = std::fs::read_to_string(&manifest)?;
    let package: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: not valid JSON: {e}", manifest.display()))?;
    let has_tests = files.iter().any(|f| crate::project::is_test_path(f) && is_code(f));
    ensure_tests(has_tests, || {
        format!("{}: npm project without test files: no tests to validate tasks with", tree.display())
    })?;
    let runner = detect_node_runner(&package).ok_or_else(|| {
        anyhow::anyhow!(
            "{}: no supported test runner (the `test` script or the dependencies name none of vitest, jest, mocha, tape, `node --test`; found {:?})",
            manifest.display(),
            package["scripts"]["test"].as_str().unwrap_or("no test script")
        )
    })?;
    let language = node_language(files)
        .ok_or_else(|| anyhow::anyhow!("{}: npm project without JavaScript or TypeScript sources", tree.display()))?;
    let needs_install =
        ["dependencies", "devDependencies"].iter().any(|k| package[*k].as_object().is_some_and(|o| !o.is_empty()))
            && !tree.join("node_modules").is_dir();
    let mut readable_paths = Vec::new();
    let mut link = String::new();
    if needs_install {
        let npm_dir = std::path::absolute(opts.env_dir.join("npm"))?;
        let installed = npm_dir.join("node_modules");
        let stamp = npm_dir.join(MANIFEST_STAMP);
        // Reinstalled only when the manifest changed (an environment reused across runs).
        if !installed.is_dir() || std::fs::read_to_string(&stamp).ok().as_deref() != Some(text.as_str()) {
            std::fs::create_dir_all(&npm_dir)?;
            let _ = std::fs::remove_file(&stamp);
            let imported = test_imports(tree, files);
            let typescript_tests = files.iter().any(|f| {
                crate::project::is_test_path(f) && [".ts", ".tsx", ".mts", ".cts"].iter().any(|e| f.ends_with(e))
            });
            let outcome = install_npm_ladder(
                &npm_dir,
                tree,
                &package,
                runner,
                &imported,
                typescript_tests,
                opts.released.as_deref(),
            )?;
            std::fs::write(npm_dir.join(INSTALL_RECORD), serde_json::to_string_pretty(&outcome)?)?;
            std::fs::write(&stamp, &text)?;
        }
        link = format!("[ -e node_modules ] || ln -s {} node_modules; ", shell_quote(&installed.to_string_lossy()));
        readable_paths.push(npm_dir);
    }
    let env = "CI=1 NO_COLOR=1 FORCE_COLOR=0 TZ=UTC LC_ALL=C.UTF-8";
    let (cmd, parser) = match runner {
        TestRunner::NodeTest => ("node --test --test-reporter=tap".to_string(), "parse_log_tap"),
        TestRunner::Mocha => ("node_modules/.bin/mocha --reporter tap".to_string(), "parse_log_tap"),
        TestRunner::Jest => {
            ("node_modules/.bin/jest --verbose --ci --no-cache --watchAll=false".to_string(), "parse_log_jest")
        }
        TestRunner::Vitest => ("node_modules/.bin/vitest run --reporter=verbose".to_string(), "parse_log_vitest"),
        TestRunner::Tape => (tape_command(&tape_arguments(&package)), "parse_log_tape"),
        _ => unreachable!("detect_node_runner gives JavaScript runners only"),
    };
    Ok(TestSetup {
        language: Some(language),
        runner,
        test_cmd: format!("{link}{env} {cmd} 2>&1"),
        log_parser: parser.into(),
        readable_paths,
        python: None,
    })
}

/// The project's own `package.json` as last installed into `env/npm` (the installed one may be
/// a pruned copy).
const MANIFEST_STAMP: &str = "frognano-manifest.json";
/// How `env/npm` was installed ([`NpmInstall`]), for the task's environment record.
pub const INSTALL_RECORD: &str = "frognano-install.json";

/// Which rung of the install ladder gave `env/npm` its packages.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NpmInstall {
    /// `full` (the manifest as published), `pruned` (runtime dependencies, the test runner
    /// and the devDependencies the tests import) or `relaxed` (pruned, with the ranges that
    /// nothing in the registry matched widened to `*`).
    pub rung: String,
    /// devDependencies left out by the pruned rungs (linters, bundlers, coverage tools).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
    /// `name → range` the relaxed rung widened.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub relaxed: std::collections::BTreeMap<String, String>,
    /// The release-era cutoff (`npm install --before`) was dropped: some package the tests
    /// need had no version published before it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub era_given_up: bool,
    /// Why each earlier rung failed (npm's first error lines).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
}

/// Installs the project's dependencies into `npm_dir` down a short ladder, because a
/// release's full `devDependencies` often cannot be installed years later (or from a
/// registry mirror that lags): linters and bundlers pinned to versions that are gone, peer
/// conflicts between them. None of those is needed to run the tests, so the second rung
/// keeps only the runtime dependencies, the test runner and the modules the test files
/// import; the third widens any range that nothing matched (`ETARGET`) to the newest
/// version of its era, and gives the era up (today's registry) when a package has no
/// version before it (`ENOVERSIONS`). Each rung starts from an empty `node_modules`.
fn install_npm_ladder(
    npm_dir: &Path,
    tree: &Path,
    package: &serde_json::Value,
    runner: TestRunner,
    imported: &std::collections::BTreeSet<String>,
    typescript_tests: bool,
    released: Option<&str>,
) -> anyhow::Result<NpmInstall> {
    let mut out = NpmInstall {
        rung: "full".into(),
        dropped: vec![],
        relaxed: Default::default(),
        era_given_up: false,
        failures: vec![],
    };
    match npm_install(npm_dir, package, Some(tree), released) {
        Ok(()) => return Ok(out),
        Err(e) => out.failures.push(format!("full: {}", first_lines(&e.to_string(), 3))),
    }
    let (mut manifest, dropped) = prune_dev_dependencies(package, runner, imported, typescript_tests);
    out.dropped = dropped;
    // Whether installs still pass `--before=<release time>`.
    let mut era = released.is_some();
    // npm names one unmatched range per failure; each retry widens what the last one named.
    // A package with no version at all before the release time (a registry whose publish
    // times are later than the real ones, or a test helper first published after the
    // release) gives up the era cutoff: today's registry, recorded.
    for _ in 0..8 {
        out.rung = if out.relaxed.is_empty() { "pruned" } else { "relaxed" }.into();
        let message = match npm_install(npm_dir, &manifest, None, released.filter(|_| era)) {
            Ok(()) => return Ok(out),
            Err(e) => e.to_string(),
        };
        out.failures.push(format!("{}: {}", out.rung, first_lines(&message, 3)));
        let changed = widen_after_failure(&message, &mut manifest, &mut out.relaxed, &mut era);
        out.era_given_up = released.is_some() && !era;
        if !changed {
            break;
        }
    }
    anyhow::bail!("npm install failed on every rung (is the npm registry reachable?):\n  {}", out.failures.join("\n  "))
}

/// What the next install try changes after npm failed with `message`: each range npm found
/// nothing for is widened to `*` (recorded in `relaxed`); failing that, a package with no
/// version at all under the era cutoff turns `era` off. False when nothing is left to change.
fn widen_after_failure(
    message: &str,
    manifest: &mut serde_json::Value,
    relaxed: &mut std::collections::BTreeMap<String, String>,
    era: &mut bool,
) -> bool {
    let mut changed = false;
    let unmatched = unmatched_ranges(message);
    for name in &unmatched {
        for section in ["dependencies", "devDependencies"] {
            if let Some(range) = manifest[section].get_mut(name).filter(|r| r.as_str() != Some("*")) {
                relaxed.insert(name.clone(), range.as_str().unwrap_or_default().to_string());
                *range = "*".into();
                changed = true;
            }
        }
    }
    // A range that only the cutoff leaves unmatched deep in the tree (`undici-types@~6.20.0`
    // under `@types/node@*`: the registry's publish time is later than the real one) cannot be
    // widened from here: the era goes too.
    let era_blocks = message.contains("No versions available for")
        || (!unmatched.is_empty() && message.contains("with a date before"));
    if !changed && *era && era_blocks {
        *era = false;
        changed = true;
    }
    changed
}

fn first_lines(text: &str, n: usize) -> String {
    // npm's pointer to its debug log names a file that is gone with the machine.
    let useful = |l: &&str| !l.trim().is_empty() && !l.contains("A complete log of this run");
    text.lines().filter(useful).take(n).collect::<Vec<_>>().join(" | ")
}

/// One `npm install --ignore-scripts` of `manifest` into `npm_dir` (the tree's lock file
/// with it when `lock_from` is given), from a clean `node_modules`.
fn npm_install(
    npm_dir: &Path,
    manifest: &serde_json::Value,
    lock_from: Option<&Path>,
    released: Option<&str>,
) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(npm_dir.join("node_modules"));
    for lock in ["package-lock.json", "npm-shrinkwrap.json"] {
        let _ = std::fs::remove_file(npm_dir.join(lock));
        if let Some(tree) = lock_from.filter(|t| t.join(lock).is_file()) {
            std::fs::copy(tree.join(lock), npm_dir.join(lock))?;
        }
    }
    std::fs::write(npm_dir.join("package.json"), serde_json::to_string_pretty(manifest)?)?;
    let mut cmd = HostCommand::new("npm");
    cmd.args(["install", "--ignore-scripts", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error"])
        .current_dir(npm_dir);
    if let Some(before) = released {
        cmd.arg(format!("--before={before}"));
    }
    run_host(&mut cmd, "npm install")
}

/// The names npm reports as having no version in the registry that matches the range
/// (`No matching version found for tape@^5.10.3.`).
fn unmatched_ranges(npm_error: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in npm_error.lines() {
        let Some(at) = line.find("No matching version found for ") else { continue };
        let spec = line[at + "No matching version found for ".len()..].trim().trim_end_matches('.');
        // `@scope/name@range` or `name@range`: the name ends at the last `@` past the first byte.
        if let Some(split) = spec[1..].rfind('@').map(|i| i + 1) {
            let name = spec[..split].to_string();
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

/// The manifest with only the devDependencies a test run needs: the runner's packages
/// (`tape`, `mocha`, `jest`/`ts-jest`/`babel-jest`, `vitest`/`@vitest/*`), TypeScript
/// tooling when some test file is TypeScript, and what the test files import; everything else
/// (linters, bundlers, coverage, release tools) is dropped and named.
fn prune_dev_dependencies(
    package: &serde_json::Value,
    runner: TestRunner,
    imported: &std::collections::BTreeSet<String>,
    typescript_tests: bool,
) -> (serde_json::Value, Vec<String>) {
    let runner_name = match runner {
        TestRunner::Tape => "tape",
        TestRunner::Mocha => "mocha",
        TestRunner::Jest => "jest",
        TestRunner::Vitest => "vitest",
        _ => "",
    };
    let keep = |name: &str| {
        imported.contains(name)
            || (!runner_name.is_empty() && name.contains(runner_name))
            || (typescript_tests && matches!(name, "typescript" | "ts-node" | "tsx" | "esbuild" | "@swc/core"))
            || (runner == TestRunner::Jest && name.starts_with("@babel/"))
    };
    let mut out = package.clone();
    let mut dropped = Vec::new();
    if let Some(dev) = out.get_mut("devDependencies").and_then(|d| d.as_object_mut()) {
        dev.retain(|name, _| {
            let k = keep(name);
            if !k {
                dropped.push(name.clone());
            }
            k
        });
    }
    // Scripts are never run (--ignore-scripts) and peer metadata of dropped tools only adds
    // conflicts.
    if let Some(obj) = out.as_object_mut() {
        for key in ["scripts", "peerDependencies", "peerDependenciesMeta", "overrides", "workspaces"] {
            obj.remove(key);
        }
    }
    (out, dropped)
}

/// The npm package names the test files import or require (`require('tape')`,
/// `import x from '@scope/pkg/sub'`, `import('x')`): the first path segment (two for a
/// scope), relative paths and `node:` builtins left out.
pub fn test_imports(tree: &Path, files: &[String]) -> std::collections::BTreeSet<String> {
    let re = regex::Regex::new(r#"(?:\brequire\s*\(\s*|\bimport\s*\(\s*|\bfrom\s+|\bimport\s+)['"]([^'"\s]+)['"]"#)
        .expect("static regex");
    let mut names = std::collections::BTreeSet::new();
    for f in files.iter().filter(|f| crate::project::is_test_path(f) && is_code(f)) {
        let Ok(text) = std::fs::read_to_string(tree.join(f)) else { continue };
        for cap in re.captures_iter(&text) {
            if let Some(name) = package_of_specifier(&cap[1]) {
                names.insert(name);
            }
        }
    }
    names
}

fn package_of_specifier(spec: &str) -> Option<String> {
    if spec.starts_with('.') || spec.starts_with('/') || spec.starts_with("node:") || spec.starts_with('#') {
        return None;
    }
    let mut parts = spec.split('/');
    let first = parts.next()?;
    if first.starts_with('@') {
        Some(format!("{first}/{}", parts.next()?))
    } else {
        Some(first.to_string())
    }
}

fn is_code(f: &str) -> bool {
    Language::of_path(f).is_some_and(|l| l.is_js_family()) || f.ends_with(".tsx")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_versions_and_toolchain_names() {
        assert_eq!(GoVersion::parse("go1.22.3"), Some(GoVersion(1, 22, 3)));
        assert_eq!(GoVersion::parse("1.21"), Some(GoVersion(1, 21, 0)));
        assert_eq!(GoVersion::parse("1.21rc2"), Some(GoVersion(1, 21, 0)));
        assert_eq!(GoVersion(1, 22, 0).toolchain_name(), "go1.22.0");
        assert_eq!(GoVersion(1, 20, 0).toolchain_name(), "go1.20");
        let m = "module x\n\ngo 1.21 // comment\n\ntoolchain go1.22.4\n";
        assert_eq!(go_mod_wants(m), Some(GoVersion(1, 22, 4)));
        assert_eq!(go_mod_wants("module x\ngo 1.19\n"), Some(GoVersion(1, 19, 0)));
        assert_eq!(go_mod_wants("module x\n"), None);
    }

    #[test]
    fn node_runner_from_script_then_dependencies() {
        let p = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        assert_eq!(detect_node_runner(&p(r#"{"scripts":{"test":"vitest run"}}"#)), Some(TestRunner::Vitest));
        assert_eq!(detect_node_runner(&p(r#"{"scripts":{"test":"tsc && jest --coverage"}}"#)), Some(TestRunner::Jest));
        assert_eq!(detect_node_runner(&p(r#"{"scripts":{"test":"node --test test/"}}"#)), Some(TestRunner::NodeTest));
        assert_eq!(
            detect_node_runner(&p(r#"{"scripts":{"test":"npm run lint"},"devDependencies":{"mocha":"^10"}}"#)),
            Some(TestRunner::Mocha)
        );
        assert_eq!(detect_node_runner(&p(r#"{"scripts":{"test":"echo none"}}"#)), None);
    }

    #[test]
    fn tape_is_found_through_the_scripts_test_runs() {
        let p = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        // qs 6.17: `test` runs a linter hook and `tests-only`, which runs tape under nyc.
        let qs =
            p(r#"{"scripts":{"test":"npm run tests-only","tests-only":"nyc tape 'test/**/*.js'","lint":"eslint ."}}"#);
        assert_eq!(detect_node_runner(&qs), Some(TestRunner::Tape));
        assert_eq!(tape_arguments(&qs), "'test/**/*.js'");
        assert_eq!(tape_command("-r ./setup.js test/*.js"), "node_modules/.bin/tape -r ./setup.js test/*.js");
        let resolve = p(r#"{"scripts":{"test":"npm run --silent tests-only","tests-only":"tape test/*.js"}}"#);
        assert_eq!(tape_arguments(&resolve), "test/*.js");
        // A runner named only by the dependencies, and no files given anywhere.
        let keys = p(r#"{"scripts":{"test":"node test/index.js"},"devDependencies":{"tape":"^5"}}"#);
        assert_eq!(detect_node_runner(&keys), Some(TestRunner::Tape));
        assert_eq!(tape_arguments(&keys), "'test/**/*.js'");
        // A script that calls itself does not loop.
        let looped = p(r#"{"scripts":{"test":"npm run a","a":"npm run a"}}"#);
        assert_eq!(detect_node_runner(&looped), None);
    }

    #[test]
    fn tape_runs_once_per_file_the_glob_expanded_as_tape_would() {
        // A stand-in tape that prints the file it was given, in a tree with nested tests.
        let dir = tempfile::tempdir().unwrap();
        for f in ["test/a.js", "test/b.js", "test/sub/c.js", "test/sub/data.json", "test dir/d.js"] {
            std::fs::create_dir_all(dir.path().join(f).parent().unwrap()).unwrap();
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        let bin = dir.path().join("node_modules/.bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("tape"), "#!/bin/sh\necho \"run $1\"\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(bin.join("tape"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let run = |args: &str| {
            let out =
                HostCommand::new("sh").arg("-c").arg(tape_command(args)).current_dir(dir.path()).output().unwrap();
            String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect::<Vec<_>>()
        };
        assert_eq!(run("'test/**/*.js'"), ["run test/a.js", "run test/b.js", "run test/sub/c.js"]);
        assert_eq!(run("test/*.js"), ["run test/a.js", "run test/b.js"]);
        assert_eq!(run("'test dir/*.js'"), ["run test dir/d.js"]);
        assert!(run("'nothing/*.js'").is_empty());
        // Options keep tape's own single run.
        assert_eq!(tape_command("-r ./setup.js test/*.js"), "node_modules/.bin/tape -r ./setup.js test/*.js");
    }

    #[test]
    fn test_imports_name_packages_not_paths_or_builtins() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("test")).unwrap();
        std::fs::create_dir_all(dir.path().join("src")).unwrap();
        std::fs::write(
            dir.path().join("test/index.js"),
            "'use strict';\nvar test = require('tape');\nvar v = require(\"es-value-fixtures\");\n\
             var forEach = require('for-each/index.js');\nvar qs = require('../');\nvar u = require('./utils');\n\
             var fs = require('node:fs');\nimport mock from '@ljharb/mock-property/helper';\nimport 'side-effect-pkg';\n\
             const lazy = await import('lazy-pkg');\n",
        )
        .unwrap();
        // Imports in the code under test are not the tests' own.
        std::fs::write(dir.path().join("src/index.js"), "require('not-a-test-import');\n").unwrap();
        let files: Vec<String> = vec!["test/index.js".into(), "src/index.js".into()];
        let got: Vec<String> = test_imports(dir.path(), &files).into_iter().collect();
        assert_eq!(
            got,
            ["@ljharb/mock-property", "es-value-fixtures", "for-each", "lazy-pkg", "side-effect-pkg", "tape"]
        );
    }

    #[test]
    fn pruning_keeps_runner_runtime_and_imported_dev_dependencies() {
        // qs 6.12.0's manifest, shortened: linters, bundlers and coverage tools go; the runner,
        // what the tests require and every runtime dependency stay.
        let qs: serde_json::Value = serde_json::from_str(
            r#"{"name":"qs","scripts":{"test":"npm run tests-only"},
                "dependencies":{"side-channel":"^1.0.6"},
                "devDependencies":{"@ljharb/eslint-config":"^21.1.0","browserify":"^16.5.2","eslint":"=8.8.0",
                  "for-each":"^0.3.3","nyc":"^10.3.2","tape":"^5.7.5","es-value-fixtures":"^1.4.2"}}"#,
        )
        .unwrap();
        let imported: std::collections::BTreeSet<String> =
            ["tape", "for-each", "es-value-fixtures", "iconv-lite"].iter().map(|s| s.to_string()).collect();
        let (pruned, dropped) = prune_dev_dependencies(&qs, TestRunner::Tape, &imported, false);
        let mut kept: Vec<&String> = pruned["devDependencies"].as_object().unwrap().keys().collect();
        kept.sort();
        assert_eq!(kept, ["es-value-fixtures", "for-each", "tape"]);
        assert_eq!(dropped, ["@ljharb/eslint-config", "browserify", "eslint", "nyc"]);
        assert_eq!(pruned["dependencies"]["side-channel"], "^1.0.6");
        assert!(pruned.get("scripts").is_none());
        // A jest project keeps its transformers.
        let jest: serde_json::Value = serde_json::from_str(
            r#"{"devDependencies":{"jest":"^29","ts-jest":"^29","@babel/preset-env":"^7","prettier":"^3"}}"#,
        )
        .unwrap();
        let (pruned, dropped) = prune_dev_dependencies(&jest, TestRunner::Jest, &Default::default(), false);
        assert_eq!(pruned["devDependencies"].as_object().unwrap().len(), 3);
        assert_eq!(dropped, ["prettier"]);
        // TypeScript tooling only for TypeScript tests (has-symbols asks for `typescript@next`
        // to type-check, which a tape run never needs).
        let ts: serde_json::Value =
            serde_json::from_str(r#"{"devDependencies":{"tape":"^5","typescript":"next"}}"#).unwrap();
        let (_, dropped) = prune_dev_dependencies(&ts, TestRunner::Tape, &Default::default(), false);
        assert_eq!(dropped, ["typescript"]);
        let (_, dropped) = prune_dev_dependencies(&ts, TestRunner::Tape, &Default::default(), true);
        assert!(dropped.is_empty());
    }

    #[test]
    fn unmatched_ranges_are_read_from_npm_errors() {
        let err = "npm install failed: npm error code ETARGET\n\
                   npm error notarget No matching version found for tape@^5.10.3.\n\
                   npm error notarget No matching version found for @ljharb/eslint-config@^22.2.5.\n\
                   npm error notarget In most cases you or one of your dependencies are requesting";
        assert_eq!(unmatched_ranges(err), ["tape", "@ljharb/eslint-config"]);
        assert!(unmatched_ranges("npm error code E404").is_empty());
    }

    #[test]
    fn failures_widen_ranges_then_give_up_the_era() {
        let mut manifest: serde_json::Value =
            serde_json::from_str(r#"{"dependencies":{"side-channel":"^1.0.6"},"devDependencies":{"tape":"^5.10.3"}}"#)
                .unwrap();
        let mut relaxed = Default::default();
        let mut era = true;
        let etarget = "npm error notarget No matching version found for tape@^5.10.3.";
        assert!(widen_after_failure(etarget, &mut manifest, &mut relaxed, &mut era));
        assert_eq!(manifest["devDependencies"]["tape"], "*");
        assert_eq!(relaxed.get("tape").map(String::as_str), Some("^5.10.3"));
        assert!(era);
        // Already widened: nothing left to change for that name.
        let etarget_star = "npm error notarget No matching version found for tape@*.";
        assert!(!widen_after_failure(etarget_star, &mut manifest, &mut relaxed, &mut era));
        // A package with no version before the cutoff: the era goes, once.
        let none = "npm error code ENOVERSIONS\nnpm error No versions available for has-override-mistake";
        assert!(widen_after_failure(none, &mut manifest, &mut relaxed, &mut era));
        assert!(!era);
        assert!(!widen_after_failure(none, &mut manifest, &mut relaxed, &mut era));
        // An unmatched range deep in the tree under the cutoff: the era goes.
        let mut era = true;
        let deep =
            "npm error notarget No matching version found for undici-types@~6.20.0 with a date before 12/6/2024.";
        assert!(widen_after_failure(deep, &mut manifest, &mut relaxed, &mut era));
        assert!(!era);
        // Anything else (a network error, a peer conflict) ends the ladder.
        let mut era = true;
        assert!(!widen_after_failure("npm error code ECONNREFUSED", &mut manifest, &mut relaxed, &mut era));
    }
}
