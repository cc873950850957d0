//! Repository intake: a local git repository, a PyPI source distribution or a crates.io
//! crate, turned into a git repository and a commit the pipeline works from.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the code comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

impl Source {
    /// Parses `--pypi NAME==VERSION`.
    pub fn pypi(spec: &str) -> anyhow::Result<Source> {
        let (name, version) = spec
            .split_once("==")
            .filter(|(n, v)| !n.trim().is_empty() && !v.trim().is_empty())
            .ok_or_else(|| anyhow::anyhow!("--pypi expects NAME==VERSION, got {spec:?}"))?;
        Ok(Source::Pypi { name: name.trim().to_string(), version: version.trim().to_string() })
    }

    /// Parses `--crate NAME@VERSION`.
    pub fn krate(spec: &str) -> anyhow::Result<Source> {
        let (name, version) = spec
            .split_once('@')
            .filter(|(n, v)| !n.trim().is_empty() && !v.trim().is_empty())
            .ok_or_else(|| anyhow::anyhow!("--crate expects NAME@VERSION, got {spec:?}"))?;
        Ok(Source::Crate { name: name.trim().to_string(), version: version.trim().to_string() })
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
            Ok(IntakeRepo { git_dir: PathBuf::from(top), commit: full, repo_name })
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
            commit_archive(&archive, &work.join("source"), &repo_name)
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
    }
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
    git(dest, &["init", "-q"])?;
    // Ignore Python and Rust build outputs so test runs leave the tree clean.
    let exclude = dest.join(".git/info/exclude");
    std::fs::write(exclude, "__pycache__/\n*.pyc\n/target/\n*.egg-info/\n")?;
    if dest.join("Cargo.toml").is_file() && !dest.join("Cargo.lock").is_file() {
        // Pin dependency versions in the commit so every later offline build resolves alike.
        let out = Command::new("cargo").arg("generate-lockfile").current_dir(dest).output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            tracing::warn!("cargo generate-lockfile failed in {}", dest.display());
        }
    }
    git(dest, &["add", "-A"])?;
    git(dest, &["commit", "-q", "--allow-empty", "-m", &format!("import {repo_name}")])?;
    let commit = git(dest, &["rev-parse", "HEAD"])?;
    Ok(IntakeRepo { git_dir: dest.to_path_buf(), commit, repo_name: repo_name.to_string() })
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
