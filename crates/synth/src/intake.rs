//! Repository intake: a local git repository, a PyPI source distribution, a crates.io
//! crate, an npm package tarball, a Go module from the module proxy or a Go module as Debian
//! packages it, turned into a git repository and a commit the pipeline works from.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the code comes from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Source {
    /// A local git repository (its committed tree at `commit`, default `HEAD`).
    Local {
        /// The repository directory.
        path: PathBuf,
        /// Commit-ish; `None` = `HEAD`.
        commit: Option<String>,
    },
    /// `NAME==VERSION` from PyPI (source distribution, fetched with pip).
    Pypi {
        /// Distribution name.
        name: String,
        /// Exact version.
        version: String,
    },
    /// `NAME@VERSION` from crates.io.
    Crate {
        /// Crate name.
        name: String,
        /// Exact version.
        version: String,
    },
    /// `NAME@VERSION` from the npm registry (the published tarball, fetched with `npm pack`).
    Npm {
        /// Package name (`@scope/name` included).
        name: String,
        /// Exact version.
        version: String,
    },
    /// `MODULE@VERSION` from the Go module proxy (`go mod download`).
    Go {
        /// Module path.
        module: String,
        /// Exact version (`v1.2.3`).
        version: String,
    },
    /// `MODULE@debian`: the Go module as Debian's `golang-*-dev` package ships it (sources
    /// and tests under `/usr/share/gocode/src`, fetched with `apt-get download`), at the
    /// version apt offers; its requirements are served from Debian too
    /// ([`crate::debian`]). For machines that cannot reach the Go module proxy.
    DebianGo {
        /// Module path (`github.com/google/uuid`; a `/vN` suffix is allowed).
        module: String,
    },
    /// A source archive already on disk (`--pypi FILE`: an sdist, `.tar.gz`/`.tgz`/`.zip`;
    /// `--crate FILE`: a `.crate`), unpacked and committed as a download would be, with no
    /// network.
    Archive {
        /// The archive file.
        path: PathBuf,
        /// `pypi/<file stem>` or `crates/<file stem>`, the instances' `repo` field.
        repo_name: String,
    },
}

/// File endings `--pypi FILE` takes as a local source distribution.
const SDIST_ENDINGS: [&str; 3] = [".tar.gz", ".tgz", ".zip"];
/// File ending `--crate FILE` takes as a local crate archive.
const CRATE_ENDINGS: [&str; 1] = [".crate"];

impl Source {
    /// Parses `--pypi NAME==VERSION`, or `--pypi FILE` for a local sdist.
    pub fn pypi(spec: &str) -> anyhow::Result<Source> {
        if let Some(archive) = Source::archive(spec, "--pypi", "pypi", &SDIST_ENDINGS)? {
            return Ok(archive);
        }
        let (name, version) =
            spec.split_once("==").filter(|(n, v)| !n.trim().is_empty() && !v.trim().is_empty()).ok_or_else(|| {
                anyhow::anyhow!("--pypi expects NAME==VERSION or a local sdist (.tar.gz, .tgz, .zip), got {spec:?}")
            })?;
        Ok(Source::Pypi { name: name.trim().to_string(), version: version.trim().to_string() })
    }

    /// Parses `--crate NAME@VERSION`, or `--crate FILE` for a local `.crate` archive.
    pub fn krate(spec: &str) -> anyhow::Result<Source> {
        if let Some(archive) = Source::archive(spec, "--crate", "crates", &CRATE_ENDINGS)? {
            return Ok(archive);
        }
        let (name, version) = spec
            .split_once('@')
            .filter(|(n, v)| !n.trim().is_empty() && !v.trim().is_empty())
            .ok_or_else(|| anyhow::anyhow!("--crate expects NAME@VERSION or a local .crate file, got {spec:?}"))?;
        Ok(Source::Crate { name: name.trim().to_string(), version: version.trim().to_string() })
    }

    /// `spec` as a local archive when it names a file with one of `endings` (`None` when it
    /// does not end so; an error when it does but the file is missing).
    fn archive(spec: &str, flag: &str, registry: &str, endings: &[&str]) -> anyhow::Result<Option<Source>> {
        let Some(ending) = endings.iter().find(|e| spec.ends_with(*e)) else { return Ok(None) };
        let path = PathBuf::from(spec);
        anyhow::ensure!(path.is_file(), "{flag} {spec}: no such file");
        let file = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let stem = file.strip_suffix(ending).unwrap_or(&file);
        anyhow::ensure!(!stem.is_empty(), "{flag} {spec}: the file name has no stem before {ending}");
        Ok(Some(Source::Archive { path, repo_name: format!("{registry}/{stem}") }))
    }

    /// Parses `--npm NAME@VERSION` (`@scope/name@1.2.3` included).
    pub fn npm(spec: &str) -> anyhow::Result<Source> {
        let (name, version) = spec
            .rsplit_once('@')
            .filter(|(n, v)| !n.trim().is_empty() && !n.ends_with('/') && !v.trim().is_empty())
            .ok_or_else(|| anyhow::anyhow!("--npm expects NAME@VERSION (e.g. left-pad@1.3.0), got {spec:?}"))?;
        Ok(Source::Npm { name: name.trim().to_string(), version: version.trim().to_string() })
    }

    /// Parses `--go MODULE@VERSION` (module proxy) or `--go MODULE@debian` (Debian's package).
    pub fn go(spec: &str) -> anyhow::Result<Source> {
        let (module, version) = spec
            .rsplit_once('@')
            .map(|(m, v)| (m.trim(), v.trim()))
            .filter(|(m, v)| !m.is_empty() && (v.starts_with('v') || *v == "debian"))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--go expects MODULE@VERSION with a v-version (e.g. github.com/pkg/errors@v0.9.1) or MODULE@debian \
                     (the version Debian packages), got {spec:?}"
                )
            })?;
        if version == "debian" {
            return Ok(Source::DebianGo { module: module.to_string() });
        }
        Ok(Source::Go { module: module.to_string(), version: version.to_string() })
    }

    /// `owner/name` used as the instances' `repo` field.
    pub fn repo_name(&self) -> String {
        match self {
            Source::Local { path, .. } => {
                let base = path
                    .canonicalize()
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_string_lossy().to_string()))
                    .unwrap_or_else(|| "repo".into());
                format!("local/{base}")
            }
            Source::Pypi { name, version } => format!("pypi/{name}-{version}"),
            Source::Crate { name, version } => format!("crates/{name}-{version}"),
            Source::Npm { name, version } => {
                format!("npm/{}-{version}", name.trim_start_matches('@').replace('/', "__"))
            }
            Source::Go { module, version } => format!("go/{}-{version}", module.replace('/', "__")),
            // Intake appends Debian's version once apt has said it (`…-debian-1.3.0-1`).
            Source::DebianGo { module } => format!("go/{}-debian", module.replace('/', "__")),
            Source::Archive { repo_name, .. } => repo_name.clone(),
        }
    }
}

/// A repository ready for synthesis.
#[derive(Debug, Clone)]
pub struct IntakeRepo {
    /// The git repository (the user's, or one created for a download).
    pub git_dir: PathBuf,
    /// Full hash of the commit tasks are built on.
    pub commit: String,
    /// `owner/name` for the instances.
    pub repo_name: String,
    /// When the release was published (ISO 8601), where the registry says: PyPI's upload
    /// time, npm's `time` field, the Go proxy's `.info` time; a local repository's commit
    /// time. Dependencies are resolved as of this time.
    pub released: Option<String>,
    /// `--go MODULE@debian`: the Debian package (and exact version) the code came from; its
    /// dependencies are then served from Debian as well ([`DependencySource::Debian`]).
    pub debian_package: Option<crate::debian::DebianPackage>,
}

impl IntakeRepo {
    /// Where the environment takes this repository's dependencies from.
    pub fn dependency_source(&self) -> DependencySource {
        if self.debian_package.is_some() {
            DependencySource::Debian
        } else {
            DependencySource::Registry
        }
    }
}

/// Where a project's dependencies come from when its environment is prepared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DependencySource {
    /// The language's own registry or proxy (PyPI, crates.io, npm, the Go module proxy).
    #[default]
    Registry,
    /// Debian's packages (`--go MODULE@debian`: each required Go module from its
    /// `golang-*-dev` package, [`crate::debian::resolve_go_dependencies`]).
    Debian,
}

/// Runs git in `dir` with a fixed identity and dates, so created commits are reproducible.
pub fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    git_with_input(dir, args, None, &[])
}

/// [`git`] with stdin and extra environment variables.
pub fn git_with_input(dir: &Path, args: &[&str], input: Option<&[u8]>, env: &[(&str, &str)]) -> anyhow::Result<String> {
    use std::io::Write;
    let mut cmd = Command::new("git");
    cmd.args(["-c", "safe.directory=*", "-c", "core.autocrlf=false", "-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "frognano-synth")
        .env("GIT_AUTHOR_EMAIL", "synth@frognano.invalid")
        .env("GIT_COMMITTER_NAME", "frognano-synth")
        .env("GIT_COMMITTER_EMAIL", "synth@frognano.invalid")
        .env("GIT_AUTHOR_DATE", "2000-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2000-01-01T00:00:00Z")
        .stdin(if input.is_some() { std::process::Stdio::piped() } else { std::process::Stdio::null() })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().map_err(|e| anyhow::anyhow!("cannot run git: {e}"))?;
    if let Some(data) = input {
        child.stdin.take().expect("stdin piped").write_all(data)?;
    }
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "git {} (in {}) failed: {}",
        args.join(" "),
        dir.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
}

/// Materialises `source` under `work` (downloads go to `work/download`, the created
/// repository to `work/source`) and resolves the commit.
pub fn intake(source: &Source, work: &Path) -> anyhow::Result<IntakeRepo> {
    let repo_name = source.repo_name();
    match source {
        Source::Local { path, commit } => {
            anyhow::ensure!(path.is_dir(), "{} is not a directory", path.display());
            let top = git(path, &["rev-parse", "--show-toplevel"]).map_err(|_| {
                anyhow::anyhow!("{} is not a git repository (run `git init` and commit first)", path.display())
            })?;
            let rev = commit.as_deref().unwrap_or("HEAD");
            let full =
                git(Path::new(&top), &["rev-parse", "--verify", &format!("{rev}^{{commit}}")]).map_err(|_| {
                    anyhow::anyhow!("{}: commit {rev:?} not found (is anything committed?)", path.display())
                })?;
            // A local repository's era is its commit's.
            let released = crate::era::commit_time(Path::new(&top), &full).ok();
            Ok(IntakeRepo { git_dir: PathBuf::from(top), commit: full, repo_name, released, debian_package: None })
        }
        Source::Pypi { name, version } => {
            let dl = work.join("download");
            std::fs::create_dir_all(&dl)?;
            let out = Command::new("python3")
                .args(["-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet", "-d"])
                .arg(&dl)
                .arg(format!("{name}=={version}"))
                .output()
                .map_err(|e| anyhow::anyhow!("cannot run pip: {e}"))?;
            anyhow::ensure!(
                out.status.success(),
                "pip download {name}=={version} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            let archive = std::fs::read_dir(&dl)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| {
                    let n = p.to_string_lossy();
                    n.ends_with(".tar.gz") || n.ends_with(".zip") || n.ends_with(".tgz")
                })
                .ok_or_else(|| anyhow::anyhow!("pip download {name}=={version} produced no source distribution"))?;
            let mut repo = commit_archive(&archive, &work.join("source"), &repo_name)?;
            repo.released = Some(crate::era::pypi_release_time(name, version)?);
            Ok(repo)
        }
        Source::Crate { name, version } => {
            let dl = work.join("download");
            std::fs::create_dir_all(&dl)?;
            let file = dl.join(format!("{name}-{version}.crate"));
            let url = format!("https://static.crates.io/crates/{name}/{name}-{version}.crate");
            let out = Command::new("curl")
                .args(["-sSfL", "--retry", "2", "-o"])
                .arg(&file)
                .arg(&url)
                .output()
                .map_err(|e| anyhow::anyhow!("cannot run curl: {e}"))?;
            anyhow::ensure!(
                out.status.success(),
                "downloading {url} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            commit_archive(&file, &work.join("source"), &repo_name)
        }
        Source::Npm { name, version } => {
            let dl = work.join("download");
            std::fs::create_dir_all(&dl)?;
            let spec = format!("{name}@{version}");
            let out = Command::new("npm")
                .args(["pack", "--json", "--silent", "--pack-destination"])
                .arg(&dl)
                .arg(&spec)
                .current_dir(&dl)
                .output()
                .map_err(|e| anyhow::anyhow!("cannot run npm: {e} (is npm installed?)"))?;
            anyhow::ensure!(
                out.status.success(),
                "npm pack {spec} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            let packed: serde_json::Value = serde_json::from_slice(&out.stdout)
                .map_err(|e| anyhow::anyhow!("npm pack {spec}: unreadable --json output: {e}"))?;
            let file = packed[0]["filename"]
                .as_str()
                .ok_or_else(|| anyhow::anyhow!("npm pack {spec} named no tarball"))?
                // Scoped packages: `@scope/name` packs to `scope-name-1.0.0.tgz`.
                .trim_start_matches('@')
                .replace('/', "-");
            let released = Command::new("npm")
                .args(["view", &spec, "time", "--json"])
                .current_dir(&dl)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
                .and_then(|t| t[version.as_str()].as_str().map(str::to_string));
            let mut repo = commit_archive(&dl.join(file), &work.join("source"), &repo_name)?;
            repo.released = released;
            Ok(repo)
        }
        Source::Go { module, version } => {
            let dl = work.join("download");
            let modcache = std::path::absolute(dl.join("gomodcache"))?;
            std::fs::create_dir_all(&modcache)?;
            let spec = format!("{module}@{version}");
            let out = Command::new("go")
                .args(["mod", "download", "-json", &spec])
                .current_dir(&dl)
                .env("GOMODCACHE", &modcache)
                .env("GOFLAGS", "-mod=mod")
                .env("GOTOOLCHAIN", "local")
                .output()
                .map_err(|e| anyhow::anyhow!("cannot run go: {e} (is Go installed?)"))?;
            let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            anyhow::ensure!(
                out.status.success() && info["Error"].is_null(),
                "go mod download {spec} failed: {}{}{}",
                info["Error"].as_str().unwrap_or(""),
                String::from_utf8_lossy(&out.stderr).trim(),
                proxy_hint(module)
            );
            let dir = info["Dir"].as_str().ok_or_else(|| anyhow::anyhow!("go mod download {spec} gave no Dir"))?;
            let released = info["Info"]
                .as_str()
                .and_then(|p| std::fs::read_to_string(p).ok())
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .and_then(|i| i["Time"].as_str().map(str::to_string));
            let dest = work.join("source");
            copy_writable(Path::new(dir), &dest)?;
            let mut repo = commit_dir(&dest, &repo_name)?;
            repo.released = released;
            Ok(repo)
        }
        Source::DebianGo { module } => intake_debian_go(module, work),
        Source::Archive { path, .. } => commit_archive(path, &work.join("source"), &repo_name),
    }
}

/// Copies the folder `from` to `dest` (replacing it) and makes the copy writable: Go's module
/// cache and an unpacked Debian package are read-only, the imported tree must not be.
fn copy_writable(from: &Path, dest: &Path) -> anyhow::Result<()> {
    if dest.exists() {
        std::fs::remove_dir_all(dest)?;
    }
    let cp = Command::new("cp").arg("-r").arg(from).arg(dest).output()?;
    anyhow::ensure!(
        cp.status.success(),
        "copying {} failed: {}",
        from.display(),
        String::from_utf8_lossy(&cp.stderr).trim()
    );
    let chmod = Command::new("chmod").args(["-R", "u+w"]).arg(dest).output()?;
    anyhow::ensure!(chmod.status.success(), "chmod of {} failed", dest.display());
    Ok(())
}

/// What a failed module-proxy download adds to its error: the Debian route.
fn proxy_hint(module: &str) -> String {
    format!(
        " (if the Go module proxy is unreachable from this machine, `--go {module}@debian` (manifest: \
         `go:{module}@debian`) takes the version Debian packages, through apt)"
    )
}

/// `--go MODULE@debian`: Debian's package of `module` downloaded into `work/download`,
/// unpacked, and its module folder committed; the repository name carries Debian's version.
fn intake_debian_go(module: &str, work: &Path) -> anyhow::Result<IntakeRepo> {
    let dl = work.join("download");
    let src = crate::debian::fetch_go_module(module, &dl, &dl.join("unpacked"))?;
    let dest = work.join("source");
    copy_writable(&src.dir, &dest)?;
    let go_version = crate::langs::installed_go_release(&dest)?;
    if crate::debian::ensure_go_mod(&dest, module, &go_version)? {
        tracing::warn!(
            "Debian's {} {} ships {module} without a go.mod: wrote `module {module}` / `go {go_version}` into the imported tree",
            src.package.name,
            src.package.version
        );
    }
    // Git refs (`task/<instance id>`) allow neither `~` nor `:`: `1.0.6~git2021-1` is named
    // `1.0.6_git2021-1`; the exact version is in the task's environment record.
    let ref_safe: String = src.package.version.chars().map(|c| if c == '~' || c == ':' { '_' } else { c }).collect();
    let repo_name = format!("{}-{ref_safe}", Source::DebianGo { module: module.to_string() }.repo_name());
    tracing::info!("Go module {module}: Debian's {} {} ({repo_name})", src.package.name, src.package.version);
    let mut repo = commit_dir(&dest, &repo_name)?;
    repo.debian_package = Some(src.package);
    Ok(repo)
}

/// Unpacks a `.tar.gz`/`.crate`/`.zip` archive with one top directory into `dest` and
/// commits it as the only commit of a fresh repository.
fn commit_archive(archive: &Path, dest: &Path, repo_name: &str) -> anyhow::Result<IntakeRepo> {
    if dest.exists() {
        std::fs::remove_dir_all(dest)?;
    }
    let unpack = dest.with_extension("unpack");
    if unpack.exists() {
        std::fs::remove_dir_all(&unpack)?;
    }
    std::fs::create_dir_all(&unpack)?;
    let is_zip = archive.extension().is_some_and(|e| e == "zip");
    let out = if is_zip {
        Command::new("unzip").arg("-q").arg(archive).arg("-d").arg(&unpack).output()
    } else {
        Command::new("tar").arg("-xzf").arg(archive).arg("-C").arg(&unpack).output()
    }
    .map_err(|e| anyhow::anyhow!("cannot unpack {}: {e}", archive.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "unpacking {} failed: {}",
        archive.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let entries: Vec<PathBuf> = std::fs::read_dir(&unpack)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    let top = match entries.as_slice() {
        [only] if only.is_dir() => only.clone(),
        _ => unpack.clone(),
    };
    std::fs::rename(&top, dest)?;
    std::fs::remove_dir_all(&unpack).ok();
    commit_dir(dest, repo_name)
}

/// Makes the folder `dest` a fresh repository whose only commit holds all of it.
fn commit_dir(dest: &Path, repo_name: &str) -> anyhow::Result<IntakeRepo> {
    git(dest, &["init", "-q"])?;
    // Ignore Python and Rust build outputs so test runs leave the tree clean.
    let exclude = dest.join(".git/info/exclude");
    std::fs::write(exclude, "__pycache__/\n*.pyc\n/target/\n*.egg-info/\n/node_modules\n")?;
    let manifest = dest.join("Cargo.toml");
    if manifest.is_file() {
        own_workspace(&manifest)?;
    }
    if manifest.is_file() && !dest.join("Cargo.lock").is_file() {
        // Pin dependency versions in the commit so every later offline build resolves alike.
        let out = Command::new("cargo").arg("generate-lockfile").current_dir(dest).output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            tracing::warn!("cargo generate-lockfile failed in {}", dest.display());
        }
    }
    git(dest, &["add", "-A"])?;
    git(dest, &["commit", "-q", "--allow-empty", "-m", &format!("import {repo_name}")])?;
    let commit = git(dest, &["rev-parse", "HEAD"])?;
    Ok(IntakeRepo {
        git_dir: dest.to_path_buf(),
        commit,
        repo_name: repo_name.to_string(),
        released: None,
        debian_package: None,
    })
}

/// Gives an unpacked crate a workspace of its own (an empty `[workspace]` table) unless its
/// manifest has one: without it, cargo run anywhere under an enclosing cargo workspace (an
/// `--out` inside the user's project, as in a checkout of this repository) takes the crate
/// for a member of that workspace and refuses to build it. crates.io archives never carry a
/// `[workspace]` table, since `cargo package` strips it.
fn own_workspace(manifest: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(manifest).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", manifest.display()))?;
    if text.lines().any(|l| l.trim_start().starts_with("[workspace")) {
        return Ok(());
    }
    let sep = if text.ends_with('\n') || text.is_empty() { "" } else { "\n" };
    std::fs::write(
        manifest,
        format!("{text}{sep}\n# Added by frognano synth: this crate is its own workspace.\n[workspace]\n"),
    )
    .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", manifest.display()))
}

/// Exports the tree of `commit` into `dest` (no `.git`).
pub fn export_tree(repo: &Path, commit: &str, dest: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dest)?;
    let archive = Command::new("git")
        .args(["-c", "safe.directory=*", "archive", "--format=tar", commit])
        .current_dir(repo)
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run git archive: {e}"))?;
    anyhow::ensure!(
        archive.status.success(),
        "git archive {commit} failed: {}",
        String::from_utf8_lossy(&archive.stderr).trim()
    );
    use std::io::Write;
    let mut tar = Command::new("tar")
        .arg("-xf")
        .arg("-")
        .arg("-C")
        .arg(dest)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    tar.stdin.take().expect("stdin piped").write_all(&archive.stdout)?;
    let out = tar.wait_with_output()?;
    anyhow::ensure!(out.status.success(), "unpacking the tree failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    Ok(())
}

/// Files of `commit` (paths relative to the repository root).
pub fn list_files(repo: &Path, commit: &str) -> anyhow::Result<Vec<String>> {
    Ok(git(repo, &["ls-tree", "-r", "--name-only", commit])?.lines().map(str::to_string).collect())
}

/// Contents of one file at `commit`.
pub fn read_file_at(repo: &Path, commit: &str, path: &str) -> anyhow::Result<String> {
    let out = Command::new("git")
        .args(["-c", "safe.directory=*", "show", &format!("{commit}:{path}")])
        .current_dir(repo)
        .output()?;
    anyhow::ensure!(out.status.success(), "cannot read {path} at {commit}");
    String::from_utf8(out.stdout).map_err(|_| anyhow::anyhow!("{path} is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_specs_and_local_archives_parse_and_bad_ones_are_named() {
        assert_eq!(Source::pypi("six==1.16.0").unwrap(), Source::Pypi { name: "six".into(), version: "1.16.0".into() });
        assert_eq!(Source::krate("fnv@1.0.7").unwrap(), Source::Crate { name: "fnv".into(), version: "1.0.7".into() });
        let dir = tempfile::tempdir().unwrap();
        let sdist = dir.path().join("tiny-0.1.0.tar.gz");
        let krate = dir.path().join("tally-0.1.0.crate");
        std::fs::write(&sdist, b"").unwrap();
        std::fs::write(&krate, b"").unwrap();
        let s = Source::pypi(sdist.to_str().unwrap()).unwrap();
        assert_eq!(s, Source::Archive { path: sdist.clone(), repo_name: "pypi/tiny-0.1.0".into() });
        assert_eq!(s.repo_name(), "pypi/tiny-0.1.0");
        let c = Source::krate(krate.to_str().unwrap()).unwrap();
        assert_eq!(c.repo_name(), "crates/tally-0.1.0");
        let missing = dir.path().join("gone-1.0.zip");
        let e = Source::pypi(missing.to_str().unwrap()).unwrap_err().to_string();
        assert_eq!(e, format!("--pypi {}: no such file", missing.display()));
        let e = Source::pypi("six").unwrap_err().to_string();
        assert!(e.starts_with("--pypi expects NAME==VERSION or a local sdist"), "{e}");
        // A .crate is not an sdist, nor an sdist a crate.
        assert!(Source::pypi(krate.to_str().unwrap()).is_err());
        assert!(Source::krate(sdist.to_str().unwrap()).is_err());
    }

    #[test]
    fn go_specs_take_a_v_version_or_debian() {
        let proxy = Source::go("github.com/pkg/errors@v0.9.1").unwrap();
        assert_eq!(proxy, Source::Go { module: "github.com/pkg/errors".into(), version: "v0.9.1".into() });
        assert_eq!(proxy.repo_name(), "go/github.com__pkg__errors-v0.9.1");
        let debian = Source::go("github.com/Masterminds/semver/v3@debian").unwrap();
        assert_eq!(debian, Source::DebianGo { module: "github.com/Masterminds/semver/v3".into() });
        assert_eq!(debian.repo_name(), "go/github.com__Masterminds__semver__v3-debian");
        for bad in ["github.com/pkg/errors@latest", "github.com/pkg/errors", "@debian"] {
            let e = Source::go(bad).unwrap_err().to_string();
            assert!(e.contains("MODULE@debian") && e.contains(&format!("{bad:?}")), "{e}");
        }
        // A failed proxy download points at the Debian route, spelled for both the CLI and a manifest.
        let hint = proxy_hint("github.com/pkg/errors");
        assert!(hint.contains("`--go github.com/pkg/errors@debian`"), "{hint}");
        assert!(hint.contains("`go:github.com/pkg/errors@debian`"), "{hint}");
    }

    #[test]
    fn an_unpacked_crate_gets_a_workspace_of_its_own_once() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("Cargo.toml");
        std::fs::write(&manifest, "[package]\nname = \"t\"\nversion = \"0.1.0\"").unwrap();
        own_workspace(&manifest).unwrap();
        own_workspace(&manifest).unwrap();
        let text = std::fs::read_to_string(&manifest).unwrap();
        assert_eq!(text.matches("[workspace]").count(), 1, "{text}");
        assert!(text.starts_with("[package]\nname = \"t\"\nversion = \"0.1.0\"\n"), "{text}");
    }
}
