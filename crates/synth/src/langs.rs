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

/// The installed Go's release as a `go.mod` writes it (`go1.19.8` → `1.19`), run in `scratch`.
pub fn installed_go_release(scratch: &Path) -> anyhow::Result<String> {
    let version = go_output(Path::new("go"), &["env", "GOVERSION"], scratch, &[])?;
    let GoVersion(major, minor, _) = GoVersion::parse(&version)
        .ok_or_else(|| anyhow::anyhow!("cannot read the installed Go version from {version:?}"))?;
    Ok(format!("{major}.{minor}"))
}

/// The `go` binary for a module that wants `want`: the installed one when it is new enough,
/// else the toolchain module `golang.org/toolchain@v0.0.1-<name>.<os>-<arch>` downloaded
/// into `modcache` (its executables made executable again: module zips keep no modes).
fn go_binary(want: Option<GoVersion>, modcache: &Path, scratch: &Path) -> anyhow::Result<PathBuf> {
    let local = PathBuf::from("go");
    let version = go_output(&local, &["env", "GOVERSION"], scratch, &[])?;
    let have = GoVersion::parse(&version)
        .ok_or_else(|| anyhow::anyhow!("cannot read the installed Go version from {version:?}"))?;
    let Some(want) = want.filter(|w| *w > have) else { return Ok(local) };
    let goos = go_output(&local, &["env", "GOOS"], scratch, &[])?;
    let goarch = go_output(&local, &["env", "GOARCH"], scratch, &[])?;
    let module = format!("golang.org/toolchain@v0.0.1-{}.{goos}-{goarch}", want.toolchain_name());
    let json = go_output(&local, &["mod", "download", "-json", &module], scratch, &[("GOMODCACHE", modcache)])
        .map_err(|e| anyhow::anyhow!("the module asks for Go {}, newer than {version}: {e}", want.toolchain_name()))?;
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
    let test_cmd = format!(
        "rm -rf /tmp/frognano-gocache && cp -r {cache} /tmp/frognano-gocache 2>/dev/null; \
         env GOMODCACHE={modcache} GOCACHE=/tmp/frognano-gocache GOPROXY=off GOSUMDB=off GOFLAGS=-mod=mod \
         GOTOOLCHAIN=local GOENV=off GOTELEMETRY=off CGO_ENABLED=0 {go_str} test -v -count=1 ./... 2>&1",
        cache = shell_quote(&gocache.to_string_lossy()),
        modcache = shell_quote(&modcache.to_string_lossy()),
    );
    Ok(TestSetup {
        language: Some(Language::Go),
        runner: TestRunner::GoTest,
        test_cmd,
        log_parser: "parse_log_gotest".into(),
        readable_paths: vec![modcache, gocache],
        python: None,
    })
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
    let release = installed_go_release(tree)?;
    if let Some(want) = go_mod_wants(go_mod).filter(|w| GoVersion::parse(&release).is_some_and(|have| *w > have)) {
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
    let test_cmd = format!(
        "rm -rf /tmp/frognano-gocache && cp -r {cache} /tmp/frognano-gocache 2>/dev/null; \
         {{ printf 'go {release}\\n\\nuse \"%s\"\\n\\n' \"$(pwd)\"; cat {replace}; }} > /tmp/frognano-go.work && \
         env GOWORK=/tmp/frognano-go.work GOMODCACHE={modcache} GOCACHE=/tmp/frognano-gocache GOPROXY=off GOSUMDB=off \
         GOFLAGS= GOTOOLCHAIN=local GOENV=off GOTELEMETRY=off CGO_ENABLED=0 go test -vet=off -v -count=1 ./... 2>&1",
        cache = shell_quote(&gocache.to_string_lossy()),
        replace = shell_quote(&replace.to_string_lossy()),
        modcache = shell_quote(&modcache.to_string_lossy()),
    );
    Ok(TestSetup {
        language: Some(Language::Go),
        runner: TestRunner::GoTest,
        test_cmd,
        log_parser: "parse_log_gotest".into(),
        readable_paths: vec![modcache, gocache, debian_dir],
        python: None,
    })
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
        let stamp = npm_dir.join("package.json");
        // Reinstalled only when the manifest changed (an environment reused across runs).
        if !installed.is_dir() || std::fs::read_to_string(&stamp).ok().as_deref() != Some(text.as_str()) {
            std::fs::create_dir_all(&npm_dir)?;
            std::fs::write(&stamp, &text)?;
            for lock in ["package-lock.json", "npm-shrinkwrap.json"] {
                if tree.join(lock).is_file() {
                    std::fs::copy(tree.join(lock), npm_dir.join(lock))?;
                }
            }
            let mut cmd = HostCommand::new("npm");
            cmd.args([
                "install",
                "--ignore-scripts",
                "--no-audit",
                "--no-fund",
                "--prefer-offline",
                "--loglevel=error",
            ])
            .current_dir(&npm_dir);
            if let Some(before) = &opts.released {
                cmd.arg(format!("--before={before}"));
            }
            run_host(&mut cmd, "npm install (is the npm registry reachable?)")?;
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
        TestRunner::Tape => (format!("node_modules/.bin/tape {}", tape_arguments(&package)), "parse_log_tape"),
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
}
