//! The environment an instance was validated in, and its rebuild at grading time.
//!
//! `frognano synth` validates a Python task in a virtualenv it built; the instance's test
//! command names that virtualenv's interpreter by absolute path. Grading must not depend on
//! that folder still existing (or on what was installed into it since), so each such task
//! carries an [`EnvironmentRecord`] under [`ENVIRONMENT_KEY`]: the interpreter version, the
//! exact package set (`name==version` for every distribution, pip and setuptools included),
//! the project itself (installed without dependencies from the task's clean commit), and the
//! upload-time cutoff its dependencies were resolved with. [`rebuilt_instance`] builds a
//! virtualenv with exactly that set — cached by the record's content, checked with
//! `pip freeze` after the install — and returns the instance with its test command and
//! readable paths pointing at it.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::instance::{repo_source, SweInstance};
use crate::workspace::READABLE_PATHS_KEY;

/// Key of an instance's `extra` field holding its [`EnvironmentRecord`].
pub const ENVIRONMENT_KEY: &str = "frognano_environment";

/// How to rebuild the environment an instance was validated in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum EnvironmentRecord {
    /// A Python virtualenv.
    PythonVenv(PythonVenv),
}

/// A Python virtualenv: interpreter version, exact packages, the project, the cutoff.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonVenv {
    /// `major.minor.micro` of the interpreter the virtualenv was made with (`python3 -m venv`).
    pub python: String,
    /// The virtualenv's folder as the instance's test command and readable paths name it;
    /// replaced by the rebuilt one's.
    pub venv: PathBuf,
    /// Every installed distribution but the project, `name==version` (`pip freeze --all`).
    pub packages: Vec<String>,
    /// The project's own distribution name when it was installed into the virtualenv (from
    /// the clean tree, without dependencies): rebuilt from the instance's
    /// `environment_setup_commit`.
    pub project: Option<String>,
    /// Dependencies were resolved with packages uploaded before this time (ISO 8601), the
    /// release's upload time; `None` when they were resolved as of the day of synthesis.
    pub exclude_newer: Option<String>,
    /// Test tools (pytest and its own dependencies) were resolved as of this later time, the
    /// first one whose versions run on the interpreter.
    pub tools_exclude_newer: Option<String>,
}

impl EnvironmentRecord {
    /// The record of `inst`: `None` when it has none; an error naming the instance, the field
    /// and what is wrong when it does not parse.
    pub fn of(inst: &SweInstance) -> anyhow::Result<Option<EnvironmentRecord>> {
        let Some(v) = inst.extra.get(ENVIRONMENT_KEY) else { return Ok(None) };
        let rec = EnvironmentRecord::deserialize(v).map_err(|e| {
            anyhow::anyhow!(
                "instance {}: field `{ENVIRONMENT_KEY}` is not a valid environment record ({e}); expected \
                 {{\"kind\": \"python_venv\", \"python\", \"venv\", \"packages\", \"project\", \"exclude_newer\", \
                 \"tools_exclude_newer\"}}",
                inst.instance_id
            )
        })?;
        let EnvironmentRecord::PythonVenv(py) = &rec;
        let version_ok = py.python.split('.').take(2).filter(|p| p.parse::<u32>().is_ok()).count() == 2;
        anyhow::ensure!(
            version_ok,
            "instance {}: field `{ENVIRONMENT_KEY}.python`: expected a version like 3.11.7, found {:?}",
            inst.instance_id,
            py.python
        );
        if let Some(bad) = py.packages.iter().find(|p| pin_name(p).is_none()) {
            anyhow::bail!(
                "instance {}: field `{ENVIRONMENT_KEY}.packages`: expected `name==version` pins, found {bad:?}",
                inst.instance_id
            );
        }
        Ok(Some(rec))
    }

    /// The record as the JSON value stored under [`ENVIRONMENT_KEY`].
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("an environment record always serializes")
    }
}

/// The normalized distribution name of a `name==version` pin (PEP 503: lower case, runs of
/// `-_.` as one `-`), `None` for anything else.
pub fn pin_name(pin: &str) -> Option<String> {
    let (name, version) = pin.split_once("==")?;
    let ok = !name.is_empty()
        && !version.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && !version.contains(char::is_whitespace);
    ok.then(|| normalize_name(name))
}

/// PEP 503 normalization of a distribution name.
pub fn normalize_name(name: &str) -> String {
    let mut out = String::new();
    for c in name.trim().chars() {
        if "-_.".contains(c) {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// `name==version` with the name normalized, for comparing package sets.
fn normalize_pin(pin: &str) -> String {
    match pin.split_once("==") {
        Some((n, v)) => format!("{}=={}", normalize_name(n), v.trim()),
        None => pin.trim().to_string(),
    }
}

/// The `uv` binary: `$FROGNANO_UV`, else `uv` on `PATH`, else `.venv-uv/bin/uv` in the
/// current folder or one above it (where `scripts/ci-setup.sh` installs it).
pub fn find_uv() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FROGNANO_UV").map(PathBuf::from) {
        return p.is_file().then_some(p);
    }
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(p) = std::env::split_paths(&path).map(|d| d.join("uv")).find(|p| p.is_file()) {
            return Some(p);
        }
    }
    let cwd = std::env::current_dir().ok()?;
    cwd.ancestors().map(|d| d.join(".venv-uv/bin/uv")).find(|p| p.is_file())
}

/// Where rebuilt environments are kept: `$FROGNANO_ENV_CACHE`, else
/// `$XDG_CACHE_HOME/frognano/envs`, else `~/.cache/frognano/envs`.
pub fn env_cache_root() -> PathBuf {
    if let Some(p) = std::env::var_os("FROGNANO_ENV_CACHE") {
        return PathBuf::from(p);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("frognano/envs")
}

/// `major.minor.micro` of a Python interpreter.
pub fn python_version(python: &Path) -> anyhow::Result<String> {
    let out = Command::new(python)
        .args(["-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"])
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", python.display()))?;
    anyhow::ensure!(out.status.success(), "{} --version failed", python.display());
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn minor(version: &str) -> &str {
    match version.match_indices('.').nth(1) {
        Some((i, _)) => &version[..i],
        None => version,
    }
}

/// `inst` ready to run in the environment its record describes: `Ok(None)` when it has no
/// record (nothing to rebuild; its test command runs as written — an error when a folder it
/// reads is gone), else a copy whose test
/// command and readable paths name the rebuilt virtualenv (built once per record, cached in
/// [`env_cache_root`]). Errors say what does not match: a corrupt record, another Python,
/// a package that cannot be installed, an installed set that differs from the record.
pub fn rebuilt_instance(inst: &SweInstance) -> anyhow::Result<Option<SweInstance>> {
    let Some(EnvironmentRecord::PythonVenv(rec)) = EnvironmentRecord::of(inst)? else {
        // No record: the folders the test command reads must still be where it says.
        if let Some(gone) = crate::workspace::instance_readable_paths(inst).into_iter().find(|p| !p.exists()) {
            anyhow::bail!(
                "instance {}: its test command reads {}, which does not exist, and the instance has no \
                 `{ENVIRONMENT_KEY}` record to rebuild it from (synthesize the task again to record one)",
                inst.instance_id,
                gone.display()
            );
        }
        return Ok(None);
    };
    let venv = ensure_python_venv(inst, &rec, &env_cache_root())
        .map_err(|e| e.context(format!("instance {}: rebuilding its Python environment", inst.instance_id)))?;
    Ok(Some(point_at(inst, &rec.venv, &venv)))
}

/// `inst` with every mention of the recorded virtualenv `from` in its test command and
/// readable paths replaced by `to`.
pub fn point_at(inst: &SweInstance, from: &Path, to: &Path) -> SweInstance {
    let (from_s, to_s) = (from.to_string_lossy(), to.to_string_lossy());
    let mut out = inst.clone();
    out.test_cmd = inst.test_cmd.as_ref().map(|c| c.replace(from_s.as_ref(), &to_s));
    let mut paths: Vec<Value> = crate::workspace::instance_readable_paths(inst)
        .into_iter()
        .map(|p| match p.strip_prefix(from) {
            Ok(rest) => Value::from(to.join(rest).to_string_lossy().trim_end_matches('/').to_string()),
            Err(_) => Value::from(p.to_string_lossy().to_string()),
        })
        .collect();
    if !paths.iter().any(|p| p.as_str() == Some(&to_s)) {
        paths.push(Value::from(to_s.to_string()));
    }
    out.extra.insert(READABLE_PATHS_KEY.into(), Value::Array(paths));
    out
}

/// The cache key of a record for `inst`: everything that decides the installed files.
fn cache_key(inst: &SweInstance, rec: &PythonVenv) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut packages: Vec<String> = rec.packages.iter().map(|p| normalize_pin(p)).collect();
    packages.sort();
    let project_src = rec.project.as_ref().map(|_| (inst.repo.as_str(), inst.environment_setup_commit.as_str()));
    let body = serde_json::json!([minor(&rec.python), packages, rec.project, project_src, rec.exclude_newer]);
    h.update(body.to_string().as_bytes());
    h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// One lock per cache key, so parallel graders of one package build its environment once.
fn key_lock(key: &str) -> Arc<Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<String, Arc<Mutex<()>>>>> = OnceLock::new();
    let mut map = LOCKS.get_or_init(Default::default).lock().expect("env lock map");
    map.entry(key.to_string()).or_default().clone()
}

const DONE_MARKER: &str = "frognano-environment.json";

/// The virtualenv of `rec` under `cache`, built when missing.
pub fn ensure_python_venv(inst: &SweInstance, rec: &PythonVenv, cache: &Path) -> anyhow::Result<PathBuf> {
    let key = cache_key(inst, rec);
    let lock = key_lock(&key);
    let _held = lock.lock().expect("env lock");
    let dir = cache.join(format!("py{}-{key}", minor(&rec.python)));
    let venv = dir.join("venv");
    if dir.join(DONE_MARKER).is_file() {
        return Ok(venv);
    }
    std::fs::create_dir_all(cache).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", cache.display()))?;
    // Built beside its final place and renamed into it, so that another process never sees a
    // half-built environment (a virtualenv only names its base interpreter, not its folder).
    let building = tempfile::Builder::new()
        .prefix(&format!(".build-{key}-"))
        .tempdir_in(cache)
        .map_err(|e| anyhow::anyhow!("cannot create a folder in {}: {e}", cache.display()))?;
    build_python_venv(inst, rec, building.path())?;
    std::fs::write(
        building.path().join(DONE_MARKER),
        serde_json::to_string_pretty(&EnvironmentRecord::PythonVenv(rec.clone()).to_value())?,
    )?;
    let built = building.keep();
    if std::fs::rename(&built, &dir).is_err() {
        // Another process finished first: keep its copy.
        std::fs::remove_dir_all(&built).ok();
        anyhow::ensure!(dir.join(DONE_MARKER).is_file(), "cannot move the environment into {}", dir.display());
    }
    Ok(venv)
}

fn run(cmd: &mut Command, what: &str) -> anyhow::Result<String> {
    let out = cmd.output().map_err(|e| anyhow::anyhow!("cannot run {what}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    anyhow::ensure!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stderr).trim(),
        text.trim()
    );
    Ok(text)
}

/// Installs `packages` (requirement lines) into the interpreter `python`, without their
/// dependencies when `no_deps`: with uv when there is one, else with the interpreter's pip.
fn install(
    python: &Path,
    args: &[String],
    no_deps: bool,
    exclude_newer: Option<&str>,
    what: &str,
) -> anyhow::Result<()> {
    let mut cmd = match find_uv() {
        Some(uv) => {
            let mut c = Command::new(uv);
            c.args(["pip", "install", "--quiet", "--python"]).arg(python);
            if let Some(t) = exclude_newer {
                c.args(["--exclude-newer", t]);
            }
            c
        }
        None => {
            let mut c = Command::new(python);
            c.args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"]);
            c
        }
    };
    if no_deps {
        cmd.arg("--no-deps");
    }
    // A project built from a folder inside some other git checkout must not take that
    // checkout's tags for its version (setuptools-scm, hatch-vcs).
    if let Some(dir) = args.last().map(Path::new).filter(|p| p.is_dir()) {
        cmd.env("GIT_CEILING_DIRECTORIES", dir.parent().unwrap_or(dir));
    }
    run(cmd.args(args), what).map(|_| ())
}

fn build_python_venv(inst: &SweInstance, rec: &PythonVenv, dir: &Path) -> anyhow::Result<()> {
    let base = PathBuf::from("python3");
    let have = python_version(&base)?;
    anyhow::ensure!(
        minor(&have) == minor(&rec.python),
        "the record asks for Python {}, but python3 here is {have}: install Python {} as python3",
        rec.python,
        minor(&rec.python)
    );
    let venv = dir.join("venv");
    run(Command::new(&base).args(["-m", "venv"]).arg(&venv), "python3 -m venv")?;
    let python = venv.join("bin/python");
    let pins = dir.join("pins.txt");
    std::fs::write(&pins, rec.packages.join("\n") + "\n")?;
    install(
        &python,
        &["-r".into(), pins.to_string_lossy().into()],
        true,
        None,
        &format!("installing the {} recorded packages", rec.packages.len()),
    )?;
    if let Some(project) = &rec.project {
        // The project from the task's clean commit, as synthesis installed it.
        let repo = repo_source(inst, None)?;
        let src = dir.join("project");
        std::fs::create_dir_all(&src)?;
        let archive = Command::new("git")
            .args(["-c", "safe.directory=*", "archive", "--format=tar", "-o"])
            .arg(dir.join("project.tar"))
            .arg(&inst.environment_setup_commit)
            .current_dir(&repo)
            .output()
            .map_err(|e| anyhow::anyhow!("cannot run git archive: {e}"))?;
        anyhow::ensure!(
            archive.status.success(),
            "git archive {} in {} failed: {}",
            inst.environment_setup_commit,
            repo.display(),
            String::from_utf8_lossy(&archive.stderr).trim()
        );
        run(Command::new("tar").arg("-xf").arg(dir.join("project.tar")).arg("-C").arg(&src), "tar -xf")?;
        install(
            &python,
            &[src.to_string_lossy().into()],
            true,
            rec.exclude_newer.as_deref(),
            &format!("installing the project {project} from commit {}", inst.environment_setup_commit),
        )?;
        std::fs::remove_dir_all(&src).ok();
        std::fs::remove_file(dir.join("project.tar")).ok();
    }
    // Exactly the recorded set: nothing missing, nothing else, no other version.
    let freeze = run(Command::new(&python).args(["-m", "pip", "freeze", "--all"]), "pip freeze")?;
    let project = rec.project.as_deref().map(normalize_name);
    let installed: BTreeSet<String> = freeze
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| {
            let name = l.split(['=', ' ', '@']).next().unwrap_or_default();
            project.as_deref() != Some(normalize_name(name).as_str())
        })
        .map(normalize_pin)
        .collect();
    let wanted: BTreeSet<String> = rec.packages.iter().map(|p| normalize_pin(p)).collect();
    let missing: Vec<&String> = wanted.difference(&installed).collect();
    let extra: Vec<&String> = installed.difference(&wanted).collect();
    anyhow::ensure!(
        missing.is_empty() && extra.is_empty(),
        "the installed packages differ from the record: missing {missing:?}, not recorded {extra:?}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval_script::shell_quote;

    fn inst_with(record: Value) -> SweInstance {
        let mut inst = SweInstance { instance_id: "pkg.op__1".into(), ..SweInstance::default() };
        inst.extra.insert(ENVIRONMENT_KEY.into(), record);
        inst
    }

    fn good() -> Value {
        serde_json::json!({
            "kind": "python_venv", "python": "3.11.7", "venv": "/synth/env/venv",
            "packages": ["MarkupSafe==1.1.1", "pytest==7.2.0"], "project": "Jinja2",
            "exclude_newer": "2021-01-31T19:00:00Z", "tools_exclude_newer": "2022-10-24T00:00:00Z"
        })
    }

    #[test]
    fn records_parse_and_bad_ones_name_the_instance_field_and_expectation() {
        let rec = EnvironmentRecord::of(&inst_with(good())).unwrap().unwrap();
        let EnvironmentRecord::PythonVenv(py) = &rec;
        assert_eq!(py.project.as_deref(), Some("Jinja2"));
        assert_eq!(rec.to_value(), good());
        assert!(EnvironmentRecord::of(&SweInstance::default()).unwrap().is_none());

        let mut missing = good();
        missing.as_object_mut().unwrap().remove("packages");
        let e = EnvironmentRecord::of(&inst_with(missing)).unwrap_err().to_string();
        assert!(e.starts_with("instance pkg.op__1: field `frognano_environment` is not a valid environment record (missing field `packages`"), "{e}");
        let e = EnvironmentRecord::of(&inst_with(serde_json::json!({"kind": "conda"}))).unwrap_err().to_string();
        assert!(e.contains("unknown variant `conda`"), "{e}");
        let e = EnvironmentRecord::of(&inst_with(serde_json::json!("venv"))).unwrap_err().to_string();
        assert!(e.contains("field `frognano_environment`"), "{e}");
        let mut bad_pin = good();
        bad_pin["packages"] = serde_json::json!(["pytest>=7"]);
        let e = EnvironmentRecord::of(&inst_with(bad_pin)).unwrap_err().to_string();
        assert_eq!(
            e,
            "instance pkg.op__1: field `frognano_environment.packages`: expected `name==version` pins, found \"pytest>=7\""
        );
        let mut bad_py = good();
        bad_py["python"] = serde_json::json!("three");
        let e = EnvironmentRecord::of(&inst_with(bad_py)).unwrap_err().to_string();
        assert!(e.ends_with("expected a version like 3.11.7, found \"three\""), "{e}");
    }

    #[test]
    fn pins_normalize_and_a_rebuilt_venv_replaces_the_recorded_one() {
        assert_eq!(pin_name("Zope.Interface==5.0").as_deref(), Some("zope-interface"));
        assert_eq!(normalize_pin("MarkupSafe==1.1.1"), "markupsafe==1.1.1");
        assert!(pin_name("jinja2 @ file:///x").is_none());
        let mut inst = inst_with(good());
        inst.test_cmd = Some(format!("TZ=UTC {} -m pytest -rA 2>&1", shell_quote("/synth/env/venv/bin/python")));
        inst.extra.insert(READABLE_PATHS_KEY.into(), serde_json::json!(["/synth/env/venv", "/other"]));
        let moved = point_at(&inst, Path::new("/synth/env/venv"), Path::new("/cache/py3.11-ab/venv"));
        assert_eq!(moved.test_cmd.as_deref(), Some("TZ=UTC '/cache/py3.11-ab/venv/bin/python' -m pytest -rA 2>&1"));
        assert_eq!(moved.extra[READABLE_PATHS_KEY], serde_json::json!(["/cache/py3.11-ab/venv", "/other"]));
        // The cache key ignores pin order and name spelling, not versions.
        let EnvironmentRecord::PythonVenv(a) = EnvironmentRecord::of(&inst).unwrap().unwrap();
        let b = PythonVenv { packages: vec!["pytest==7.2.0".into(), "markupsafe==1.1.1".into()], ..a.clone() };
        let c = PythonVenv { packages: vec!["pytest==7.2.1".into(), "markupsafe==1.1.1".into()], ..a.clone() };
        assert_eq!(cache_key(&inst, &a), cache_key(&inst, &b));
        assert_ne!(cache_key(&inst, &a), cache_key(&inst, &c));
    }
}
