//! Go modules as Debian packages them: `golang-*-dev` binary packages ship a library's
//! sources, its `_test.go` files included, under `/usr/share/gocode/src/<import path>`.
//! Where the Go module proxy is unreachable, `--go MODULE@debian` takes the module (and
//! [`resolve_go_dependencies`] its requirements) from Debian's archive through apt instead:
//! `apt-get download` (no installation, no root beyond apt's lists) and `dpkg-deb -x`.
//!
//! The versions are Debian's, not the ones a `go.mod` asks for; every module served this way
//! is recorded with the Debian package and version it came from.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where a module's sources lie inside a `golang-*-dev` package.
const GOCODE: &str = "usr/share/gocode/src";

/// Hosts whose Debian name is not the host without its top-level domain (dh-make-golang's
/// table, `debianNameFromGopkg`).
const HOST_NAMES: [(&str, &str); 12] = [
    ("github.com", "github"),
    ("gitlab.com", "gitlab"),
    ("code.google.com", "googlecode"),
    ("cloud.google.com", "googlecloud"),
    ("gopkg.in", "gopkg"),
    ("golang.org", "golang"),
    ("google.golang.org", "google"),
    ("bitbucket.org", "bitbucket"),
    ("bazil.org", "bazil"),
    ("pault.ag", "pault"),
    ("howett.net", "howett"),
    ("go4.org", "go4"),
];

/// `path` without a trailing major-version element (`github.com/x/y/v3` → `github.com/x/y`);
/// `None` when it has none.
pub fn strip_major_suffix(path: &str) -> Option<&str> {
    let (head, last) = path.rsplit_once('/')?;
    let digits = last.strip_prefix('v')?;
    let major = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && digits != "0" && digits != "1";
    major.then_some(head)
}

/// The Debian binary package that ships Go module `module`, by the Debian Go team's naming
/// (dh-make-golang): the host shortened (`github.com` → `github`, `golang.org` → `golang`,
/// `gopkg.in` → `gopkg`, else the host without its top-level domain), a `/vN` suffix dropped,
/// the elements joined with `-`, lower-cased, `_` → `-`, then `golang-…-dev`.
/// `github.com/BurntSushi/toml` → `golang-github-burntsushi-toml-dev`.
pub fn go_package_name(module: &str) -> String {
    let path = strip_major_suffix(module).unwrap_or(module);
    let mut parts: Vec<String> = path.split('/').filter(|p| !p.is_empty()).map(str::to_string).collect();
    if let Some(host) = parts.first_mut() {
        *host = match HOST_NAMES.iter().find(|(h, _)| *h == host.as_str()) {
            Some((_, short)) => short.to_string(),
            None => host.rsplit_once('.').map_or(host.as_str(), |(name, _tld)| name).to_string(),
        };
    }
    format!("golang-{}-dev", parts.join("-").to_lowercase().replace('_', "-"))
}

/// A Debian package at the version apt offers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DebianPackage {
    /// Binary package name.
    pub name: String,
    /// Debian version (upstream version and revision, e.g. `1.3.0-1`).
    pub version: String,
}

/// Whether apt has any package lists (`apt-get update` has run).
fn apt_lists_present() -> bool {
    std::fs::read_dir("/var/lib/apt/lists")
        .map(|rd| rd.flatten().any(|e| e.file_name().to_string_lossy().contains("_Packages")))
        .unwrap_or(false)
}

/// The version of `package` apt would download (`apt-cache show --no-all-versions`).
pub fn candidate(package: &str, module: &str) -> anyhow::Result<DebianPackage> {
    anyhow::ensure!(
        apt_lists_present(),
        "apt has no package lists in /var/lib/apt/lists, so Debian's {package} (for Go module {module}) cannot be \
         found: run `apt-get update` (as root) first"
    );
    let out = Command::new("apt-cache")
        .args(["show", "--no-all-versions", package])
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run apt-cache: {e} (is this a Debian system?)"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text.lines().find_map(|l| l.strip_prefix("Version:")).map(|v| v.trim().to_string());
    match version {
        Some(version) if out.status.success() => Ok(DebianPackage { name: package.to_string(), version }),
        _ => anyhow::bail!(
            "Debian has no package {package} for Go module {module} (the name follows Debian's Go naming; \
             `apt-cache show {package}`: {})",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

/// Downloads `pkg` (exactly its version) into `download` with `apt-get download`, unless
/// the `.deb` is already there, and returns the file.
fn download(pkg: &DebianPackage, download: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(download)?;
    let find = || -> Option<PathBuf> {
        // apt writes an epoch's `:` as `%3a`.
        let version = pkg.version.replace(':', "%3a");
        let prefix = format!("{}_{version}_", pkg.name);
        std::fs::read_dir(download).ok()?.flatten().map(|e| e.path()).find(|p| {
            p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
                && p.extension().is_some_and(|e| e == "deb")
        })
    };
    if let Some(deb) = find() {
        return Ok(deb);
    }
    let spec = format!("{}={}", pkg.name, pkg.version);
    crate::project::run_host(
        Command::new("apt-get").args(["download", "-q", &spec]).current_dir(download),
        &format!("apt-get download {spec} (into {}; is this a Debian system?)", download.display()),
    )?;
    find()
        .ok_or_else(|| anyhow::anyhow!("apt-get download {spec} left no {}_*.deb in {}", pkg.name, download.display()))
}

/// Unpacks `deb` into `dest` (`dpkg-deb -x`), once: an existing `dest` is kept.
fn unpack(deb: &Path, dest: &Path) -> anyhow::Result<()> {
    if dest.is_dir() {
        return Ok(());
    }
    let partial = dest.with_extension("partial");
    if partial.exists() {
        std::fs::remove_dir_all(&partial)?;
    }
    std::fs::create_dir_all(&partial)?;
    crate::project::run_host(
        Command::new("dpkg-deb").arg("-x").arg(deb).arg(&partial),
        &format!("dpkg-deb -x {} (is this a Debian system?)", deb.display()),
    )?;
    std::fs::rename(&partial, dest)?;
    Ok(())
}

/// The folder of `module` inside an unpacked package `root`: `usr/share/gocode/src/<module>`,
/// else the path without its `/vN` suffix (Debian ships `github.com/x/y/v3` as `…/x/y`).
fn module_dir(root: &Path, module: &str, package: &str) -> anyhow::Result<PathBuf> {
    let src = root.join(GOCODE);
    let candidates = std::iter::once(module).chain(strip_major_suffix(module));
    if let Some(dir) = candidates.map(|m| src.join(m)).find(|d| d.is_dir()) {
        return Ok(dir);
    }
    let shipped = crate::project::walk_files(&src)
        .into_iter()
        .filter_map(|f| f.rsplit_once('/').map(|(d, _)| d.to_string()))
        .collect::<BTreeSet<_>>();
    anyhow::bail!(
        "Debian's {package} has no {GOCODE}/{module}{}; it ships: {}",
        strip_major_suffix(module).map(|m| format!(" (nor {GOCODE}/{m})")).unwrap_or_default(),
        shipped.into_iter().take(8).collect::<Vec<_>>().join(", ")
    )
}

/// A Go module's sources fetched from Debian.
#[derive(Debug, Clone)]
pub struct DebianGoSource {
    /// The package and version they came from.
    pub package: DebianPackage,
    /// The module's folder in the unpacked package.
    pub dir: PathBuf,
}

/// Downloads the package of `module` into `download` and unpacks it under `unpack_root`
/// (`<package>_<version>/`), returning the module's folder.
pub fn fetch_go_module(module: &str, download_dir: &Path, unpack_root: &Path) -> anyhow::Result<DebianGoSource> {
    let package = candidate(&go_package_name(module), module)?;
    let deb = download(&package, download_dir)?;
    let root = unpack_root.join(format!("{}_{}", package.name, package.version.replace(':', "%3a")));
    unpack(&deb, &root)?;
    let dir = module_dir(&root, module, &package.name)?;
    Ok(DebianGoSource { package, dir })
}

/// Gives `dir` a minimal `go.mod` (`module <module>` and a `go` line of `go_version`, e.g.
/// `1.19`) when it has none, as Debian ships pre-module libraries (pkg/errors 0.9.1). Returns
/// whether it wrote one.
pub fn ensure_go_mod(dir: &Path, module: &str, go_version: &str) -> anyhow::Result<bool> {
    let go_mod = dir.join("go.mod");
    if go_mod.is_file() {
        return Ok(false);
    }
    std::fs::write(&go_mod, format!("module {module}\n\ngo {go_version}\n"))
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", go_mod.display()))?;
    tracing::info!("{}: Debian ships {module} without a go.mod; wrote a minimal one (go {go_version})", dir.display());
    Ok(true)
}

/// The module path a `go.mod` declares.
pub fn go_mod_module(go_mod: &str) -> Option<String> {
    go_mod.lines().find_map(|l| {
        let mut words = l.split("//").next().unwrap_or("").split_whitespace();
        (words.next() == Some("module")).then(|| words.next().map(|m| m.trim_matches('"').to_string())).flatten()
    })
}

/// The `require` directives of a `go.mod` (single lines and blocks) as (module, version).
pub fn go_mod_requires(go_mod: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut in_block = false;
    for line in go_mod.lines() {
        let code = line.split("//").next().unwrap_or("").trim();
        let words: Vec<&str> = code.split_whitespace().collect();
        match words.as_slice() {
            ["require", "("] => in_block = true,
            [")"] if in_block => in_block = false,
            ["require", module, version] => out.push((module.to_string(), version.to_string())),
            [module, version] if in_block => out.push((module.to_string(), version.to_string())),
            _ => {}
        }
    }
    out.into_iter().map(|(m, v)| (m.trim_matches('"').to_string(), v.trim_matches('"').to_string())).collect()
}

/// A module version's release numbers (`v1.2.3`, `v0.0.0-2021…-abc` → 0.0.0), for picking
/// the highest of several requirements.
fn module_version(v: &str) -> Option<crate::langs::GoVersion> {
    crate::langs::GoVersion::parse(v.trim_start_matches('v'))
}

/// One required module served from a Debian package.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ServedModule {
    /// The module path.
    pub module: String,
    /// The version the requiring `go.mod` asked for (the highest, when several did).
    pub required: String,
    /// The package that served it (its version is what the tests ran with).
    pub package: DebianPackage,
    /// Its folder in the environment (the `replace` target).
    pub dir: PathBuf,
    /// Whether Debian shipped it without a `go.mod` and one was written.
    pub wrote_go_mod: bool,
}

/// A required module Debian could not serve, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MissingModule {
    /// The module path.
    pub module: String,
    /// The version asked for.
    pub required: String,
    /// The error.
    pub reason: String,
}

/// What [`resolve_go_dependencies`] found: written as `frognano-debian.json` beside the
/// unpacked packages and copied into each task's environment record.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GoDependencies {
    /// Modules served from Debian, by module path.
    pub served: Vec<ServedModule>,
    /// Modules no Debian package served (the build needs them only if a tested package
    /// imports them).
    pub missing: Vec<MissingModule>,
}

impl GoDependencies {
    /// The environment record's `debian_modules`: per served module the version asked for
    /// and the Debian package and version that served it; the missing ones with the reason.
    pub fn record(&self) -> serde_json::Value {
        let served: Vec<serde_json::Value> = self
            .served
            .iter()
            .map(|s| {
                serde_json::json!({
                    "module": s.module,
                    "required": s.required,
                    "package": s.package.name,
                    "version": s.package.version,
                    "wrote_go_mod": s.wrote_go_mod,
                })
            })
            .collect();
        serde_json::json!({ "served": served, "missing": self.missing })
    }

    /// The `replace` lines of a `go.work` pointing every served module at its folder.
    pub fn replace_lines(&self) -> String {
        self.served.iter().map(|s| format!("replace {} => {:?}\n", s.module, s.dir.to_string_lossy())).collect()
    }
}

/// Resolves the requirements of the module whose `go.mod` is `main_go_mod`, transitively, from
/// Debian: each required module's package is downloaded into `env/download` and unpacked into
/// `env/pkgs`, given a `go.mod` when it lacks one. A module without a package is listed as
/// missing, not an error: Go needs it only when a tested package imports it.
pub fn resolve_go_dependencies(main_go_mod: &str, env: &Path, go_version: &str) -> anyhow::Result<GoDependencies> {
    let main = go_mod_module(main_go_mod).unwrap_or_default();
    let mut queue: VecDeque<(String, String)> = go_mod_requires(main_go_mod).into();
    let mut wanted: BTreeMap<String, String> = BTreeMap::new();
    let mut deps = GoDependencies::default();
    while let Some((module, required)) = queue.pop_front() {
        if module == main {
            continue;
        }
        if let Some(seen) = wanted.get_mut(&module) {
            // Keep the highest version asked for, as Go's minimal version selection would.
            if module_version(&required) > module_version(seen) {
                *seen = required;
            }
            continue;
        }
        wanted.insert(module.clone(), required.clone());
        match fetch_go_module(&module, &env.join("download"), &env.join("pkgs")) {
            Ok(src) => {
                let wrote_go_mod = ensure_go_mod(&src.dir, &module, go_version)?;
                let text = std::fs::read_to_string(src.dir.join("go.mod"))?;
                queue.extend(go_mod_requires(&text));
                tracing::info!(
                    "Go module {module} {required}: served by Debian's {} {}",
                    src.package.name,
                    src.package.version
                );
                deps.served.push(ServedModule { module, required, package: src.package, dir: src.dir, wrote_go_mod });
            }
            Err(e) => {
                tracing::warn!("Go module {module} {required}: {e:#}");
                deps.missing.push(MissingModule { module, required, reason: format!("{e:#}") });
            }
        }
    }
    for s in &mut deps.served {
        s.required = wanted.get(&s.module).cloned().unwrap_or_default();
    }
    Ok(deps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_package_names_follow_the_go_teams_convention() {
        let cases = [
            ("github.com/google/uuid", "golang-github-google-uuid-dev"),
            ("github.com/BurntSushi/toml", "golang-github-burntsushi-toml-dev"),
            ("golang.org/x/text", "golang-golang-x-text-dev"),
            ("gopkg.in/yaml.v3", "golang-gopkg-yaml.v3-dev"),
            ("github.com/Masterminds/semver/v3", "golang-github-masterminds-semver-dev"),
            ("github.com/cespare/xxhash/v2", "golang-github-cespare-xxhash-dev"),
            ("github.com/mattn/go-runewidth", "golang-github-mattn-go-runewidth-dev"),
            ("google.golang.org/protobuf", "golang-google-protobuf-dev"),
            ("go.uber.org/atomic", "golang-go.uber-atomic-dev"),
            ("github.com/some_org/a_b", "golang-github-some-org-a-b-dev"),
        ];
        for (module, package) in cases {
            assert_eq!(go_package_name(module), package, "{module}");
        }
        assert_eq!(strip_major_suffix("github.com/x/y/v3"), Some("github.com/x/y"));
        assert_eq!(strip_major_suffix("github.com/x/y"), None);
        assert_eq!(strip_major_suffix("github.com/x/v1"), None);
        assert_eq!(strip_major_suffix("github.com/x/vx"), None);
    }

    #[test]
    fn go_mod_requirements_single_lines_and_blocks() {
        let m = "module github.com/a/b // c\n\ngo 1.17\n\nrequire github.com/x/y v1.2.3\n\nrequire (\n\tgithub.com/p/q v0.1.0 // indirect\n\t\"gopkg.in/yaml.v3\" v3.0.1\n)\n\nreplace github.com/x/y => ../y\n";
        assert_eq!(go_mod_module(m).as_deref(), Some("github.com/a/b"));
        assert_eq!(
            go_mod_requires(m),
            vec![
                ("github.com/x/y".to_string(), "v1.2.3".to_string()),
                ("github.com/p/q".to_string(), "v0.1.0".to_string()),
                ("gopkg.in/yaml.v3".to_string(), "v3.0.1".to_string()),
            ]
        );
        assert!(go_mod_requires("module x\ngo 1.19\n").is_empty());
    }

    #[test]
    fn a_module_without_go_mod_gets_a_minimal_one_once() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ensure_go_mod(dir.path(), "github.com/pkg/errors", "1.19").unwrap());
        assert!(!ensure_go_mod(dir.path(), "github.com/pkg/errors", "1.19").unwrap());
        let text = std::fs::read_to_string(dir.path().join("go.mod")).unwrap();
        assert_eq!(text, "module github.com/pkg/errors\n\ngo 1.19\n");
    }

    #[test]
    fn a_missing_module_folder_names_the_package_and_what_it_ships() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(GOCODE).join("github.com/x/y")).unwrap();
        std::fs::write(dir.path().join(GOCODE).join("github.com/x/y/y.go"), "package y\n").unwrap();
        assert!(module_dir(dir.path(), "github.com/x/y/v2", "golang-github-x-y-dev")
            .unwrap()
            .ends_with("github.com/x/y"));
        let e = module_dir(dir.path(), "github.com/x/z", "golang-github-x-z-dev").unwrap_err().to_string();
        assert!(e.contains("golang-github-x-z-dev has no usr/share/gocode/src/github.com/x/z"), "{e}");
        assert!(e.contains("github.com/x/y"), "{e}");
    }
}
