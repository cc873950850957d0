//! Harbor task directories (`task.toml`, `instruction.md`, `tests/test.sh`,
//! `environment/Dockerfile`), read with the defaults of FrogNano's published evaluation
//! (docs/grading.md §10), and Harbor's reward files.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::instance::{InstanceError, Prediction, SweInstance, Verification};
use crate::report::{instance_report_text, LOG_REPORT, LOG_TEST_OUTPUT};
use crate::workspace::{patched_workspace, run_merged, sandbox_spec, ErrorKind, ExecOptions, InstanceResult, Outcome};

/// One Harbor task.
#[derive(Debug, Clone, PartialEq)]
pub struct HarborTask {
    /// Folder name = task / instance id.
    pub id: String,
    /// The task directory.
    pub dir: PathBuf,
    /// The agent's prompt (`instruction.md`).
    pub instruction: String,
    /// Verifier entry point (`tests/test.sh`).
    pub test_script: PathBuf,
    /// Image: `[environment] docker_image`, `base_image`, else the Dockerfile's `FROM`.
    pub image: Option<String>,
    /// Working directory: `[environment] workdir`, Dockerfile `WORKDIR`, default `/app`.
    pub workdir: String,
    /// Environment: Dockerfile `ENV KEY=VALUE`, overridden by `[environment] env`.
    pub env: Vec<(String, String)>,
    /// `[agent] timeout_sec` (default 3600).
    pub agent_timeout_sec: f64,
    /// `[verifier] timeout_sec` (default 600).
    pub verifier_timeout_sec: f64,
    /// `[metadata]`, free-form.
    pub metadata: toml::Table,
    /// Whether the agent may reach the network (`allow_internet`, default false).
    pub allow_internet: bool,
}

fn dockerfile_facts(text: &str) -> (Option<String>, Option<String>, Vec<(String, String)>) {
    // Join `\` continuations, skip comments.
    let joined = text.replace("\\\n", " ");
    let (mut from, mut workdir, mut env) = (None, None, Vec::new());
    for line in joined.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
        let (kw, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        match kw.to_ascii_uppercase().as_str() {
            "FROM" => from = rest.split_whitespace().next().map(str::to_string),
            "WORKDIR" => workdir = Some(rest.trim().to_string()),
            "ENV" => {
                for pair in rest.split_whitespace() {
                    if let Some((k, v)) = pair.split_once('=') {
                        env.push((k.to_string(), v.trim_matches('"').to_string()));
                    }
                }
            }
            _ => {}
        }
    }
    (from, workdir, env)
}

/// Reads one task directory; errors name the file and the problem.
pub fn load_harbor_task(dir: &Path) -> anyhow::Result<HarborTask> {
    let id = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow::anyhow!("{}: not a task directory", dir.display()))?
        .to_string();
    let toml_path = dir.join("task.toml");
    let text = std::fs::read_to_string(&toml_path).map_err(|e| anyhow::anyhow!("{}: {e}", toml_path.display()))?;
    let config: toml::Table =
        text.parse().map_err(|e| anyhow::anyhow!("{}: invalid TOML: {e}", toml_path.display()))?;
    let instruction_path = dir.join("instruction.md");
    let instruction = std::fs::read_to_string(&instruction_path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", instruction_path.display()))?;
    let test_script = dir.join("tests/test.sh");
    anyhow::ensure!(test_script.is_file(), "{}: missing", test_script.display());
    let table = |name: &str| config.get(name).and_then(|v| v.as_table()).cloned().unwrap_or_default();
    let envt = table("environment");
    let num = |t: &toml::Table, k: &str, d: f64| {
        t.get(k).and_then(|v| v.as_float().or_else(|| v.as_integer().map(|i| i as f64))).unwrap_or(d)
    };
    let s = |t: &toml::Table, k: &str| t.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let docker = std::fs::read_to_string(dir.join("environment/Dockerfile")).unwrap_or_default();
    let (from, docker_workdir, mut env) = dockerfile_facts(&docker);
    if let Some(t) = envt.get("env").and_then(|v| v.as_table()) {
        for (k, v) in t {
            let v = v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v));
        }
    }
    Ok(HarborTask {
        id,
        dir: dir.to_path_buf(),
        instruction,
        test_script,
        image: s(&envt, "docker_image").or_else(|| s(&envt, "base_image")).or(from),
        workdir: s(&envt, "workdir").or(docker_workdir).unwrap_or_else(|| "/app".into()),
        env,
        agent_timeout_sec: num(&table("agent"), "timeout_sec", 3600.0),
        verifier_timeout_sec: num(&table("verifier"), "timeout_sec", 600.0),
        metadata: table("metadata"),
        allow_internet: envt.get("allow_internet").and_then(|v| v.as_bool()).unwrap_or(false),
    })
}

/// Reads every task directory (a subdirectory with `task.toml`) of a dataset, sorted by id.
pub fn load_harbor_dataset(dir: &Path) -> anyhow::Result<Vec<HarborTask>> {
    let mut tasks = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))? {
        let p = entry?.path();
        if p.join("task.toml").is_file() {
            tasks.push(load_harbor_task(&p)?);
        }
    }
    tasks.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(tasks)
}

/// Harbor's reward: `reward.json` (`{"reward": x}`, any one-key object, or a bare number),
/// else `reward.txt` (a number), in the verifier log directory. Resolved = reward >= 1.
pub fn read_reward(verifier_logs: &Path) -> anyhow::Result<f64> {
    let json_path = verifier_logs.join("reward.json");
    if let Ok(text) = std::fs::read_to_string(&json_path) {
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: invalid JSON: {e}", json_path.display()))?;
        let n = match &v {
            serde_json::Value::Object(m) if m.contains_key("reward") => m["reward"].as_f64(),
            serde_json::Value::Object(m) if m.len() == 1 => m.values().next().and_then(|x| x.as_f64()),
            other => other.as_f64(),
        };
        return n.ok_or_else(|| anyhow::anyhow!("{}: no numeric reward", json_path.display()));
    }
    let txt_path = verifier_logs.join("reward.txt");
    let text = std::fs::read_to_string(&txt_path)
        .map_err(|_| anyhow::anyhow!("no reward.json or reward.txt in {}", verifier_logs.display()))?;
    text.trim().parse().map_err(|_| anyhow::anyhow!("{}: {:?} is not a number", txt_path.display(), text.trim()))
}

/// Whether `dir` is one Harbor task (has `task.toml`).
pub fn is_task_dir(dir: &Path) -> bool {
    dir.join("task.toml").is_file()
}

/// Loads a Harbor dataset folder (or one task directory) as instances for `eval grade` /
/// `eval run`: the prompt is `instruction.md`; repository and commit come from
/// `tests/instance.json` (SWE fields, as `frognano synth` writes them), else `[metadata]`
/// `repo` / `base_commit` / `repo_path`, else a `frognano-synth/<owner__name>` Dockerfile
/// `FROM` with its `orphan commit <sha>` comment. The gold patch is `instance.json`'s `patch`.
pub fn load_harbor_instances(path: &Path) -> anyhow::Result<Vec<SweInstance>> {
    let tasks = if is_task_dir(path) { vec![load_harbor_task(path)?] } else { load_harbor_dataset(path)? };
    anyhow::ensure!(
        !tasks.is_empty(),
        "{}: a directory of instances must be a Harbor dataset (subfolders with task.toml) or one task",
        path.display()
    );
    tasks.iter().map(task_instance).collect()
}

fn synth_dockerfile_source(text: &str) -> (Option<String>, Option<String>) {
    let repo = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("FROM "))
        .and_then(|img| img.trim().strip_prefix("frognano-synth/"))
        .map(|rest| rest.split(':').next().unwrap_or(rest).replacen("__", "/", 1));
    let commit = text
        .split("orphan commit ")
        .nth(1)
        .map(|rest| rest.chars().take_while(char::is_ascii_hexdigit).collect::<String>())
        .filter(|c| !c.is_empty());
    (repo, commit)
}

/// One task as an instance (see [`load_harbor_instances`]).
pub fn task_instance(task: &HarborTask) -> anyhow::Result<SweInstance> {
    let ij = task.dir.join("tests/instance.json");
    let mut inst = if ij.is_file() {
        let name = ij.display().to_string();
        let text = std::fs::read_to_string(&ij).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{name}: invalid JSON: {e}"))?;
        let err = |field: &str, problem: String| InstanceError {
            source_name: name.clone(),
            line: None,
            field: field.to_string(),
            problem,
        };
        SweInstance::from_json(v, &err)?
    } else {
        SweInstance::default()
    };
    let meta = |k: &str| task.metadata.get(k).and_then(|v| v.as_str()).map(str::to_string);
    if inst.repo.is_empty() {
        inst.repo = meta("repo").unwrap_or_default();
    }
    if inst.base_commit.is_empty() {
        inst.base_commit = meta("base_commit").unwrap_or_default();
    }
    if inst.repo_path.is_none() {
        inst.repo_path = meta("repo_path");
    }
    if inst.repo.is_empty() || inst.base_commit.is_empty() {
        let docker = std::fs::read_to_string(task.dir.join("environment/Dockerfile")).unwrap_or_default();
        let (repo, commit) = synth_dockerfile_source(&docker);
        if inst.repo.is_empty() {
            inst.repo = repo.unwrap_or_default();
        }
        if inst.base_commit.is_empty() {
            inst.base_commit = commit.unwrap_or_default();
        }
    }
    inst.instance_id = task.id.clone();
    inst.problem_statement = task.instruction.clone();
    // The executor then verifies with the task's `tests/test.sh` instead of an eval script.
    inst.verification = Verification::Harbor { task_dir: task.dir.canonicalize().unwrap_or_else(|_| task.dir.clone()) };
    Ok(inst)
}

fn is_path_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_-.~".contains(&b)
}

/// Replaces absolute container paths by host paths in a script: `from` matches only as a
/// whole path prefix (`/app` in `/app/x` or `"/app"`, not in `/apple` or `/x/app`).
pub fn remap_paths(text: &str, maps: &[(String, String)]) -> String {
    let mut maps: Vec<&(String, String)> = maps.iter().filter(|(f, _)| f.len() > 1).collect();
    maps.sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    'outer: while i < text.len() {
        if bytes[i] == b'/' && (i == 0 || !(is_path_byte(bytes[i - 1]) || bytes[i - 1] == b'/')) {
            for (from, to) in &maps {
                let end = i + from.len();
                if text[i..].starts_with(from.as_str()) && (end == text.len() || !is_path_byte(bytes[end])) {
                    out.push_str(to);
                    i = end;
                    continue 'outer;
                }
            }
        }
        let ch = text[i..].chars().next().unwrap_or('\0');
        out.push(ch);
        i += ch.len_utf8().max(1);
    }
    out
}

fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).map_err(|e| anyhow::anyhow!("{}: {e}", from.display()))? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type()?.is_dir() {
            copy_dir(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).map_err(|e| anyhow::anyhow!("{}: {e}", src.display()))?;
        }
    }
    Ok(())
}

/// The directory of a `frognano` executable to put on the verifier's `PATH` (synth's
/// `test.sh` calls `frognano eval grade-log`): this process when it is `frognano`, else
/// `FROGNANO_BIN`.
fn frognano_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok().filter(|p| p.file_stem().is_some_and(|s| s == "frognano"));
    let exe = exe.or_else(|| std::env::var_os("FROGNANO_BIN").map(PathBuf::from))?;
    exe.parent().map(Path::to_path_buf)
}

/// Runs one prediction on a Harbor task: a workspace at the task's commit, the patch applied
/// with the 5.0.2 chain, then — the agent being done — the task's `tests/` copied in and
/// `tests/test.sh` run in the sandbox with `/logs`, `/tests` and the workdir remapped to
/// host paths. The reward (`reward.json` / `reward.txt`) decides: resolved iff >= 1.
pub(crate) fn run_harbor_instance(
    inst: &SweInstance,
    task_dir: &Path,
    pred: &Prediction,
    opts: &ExecOptions,
    log_dir: &Path,
    log: &mut String,
    result: &mut InstanceResult,
) -> Result<(), ErrorKind> {
    let infra = |e: anyhow::Error| ErrorKind::Infra(format!("{e:#}"));
    let task = load_harbor_task(task_dir).map_err(infra)?;
    if inst.base_commit.is_empty() || (inst.repo.is_empty() && inst.repo_path.is_none()) {
        return Err(ErrorKind::RepoMissing(format!(
            "Harbor task {}: no local source for the workspace (needs tests/instance.json, [metadata] repo and \
             base_commit, or a frognano-synth Dockerfile)",
            task.id
        )));
    }
    // The sandbox here only applies the patch; the verifier gets its own below.
    let (holder, ws, _) = patched_workspace(inst, pred, opts, log_dir, log, Duration::from_secs(300))?;
    result.patch_applied = true;

    // The verifier's view: /tests, /logs/{verifier,agent} and the workdir, on the host.
    let tests = holder.path().join("tests");
    let logs = holder.path().join("logs");
    copy_dir(&task.dir.join("tests"), &tests).map_err(infra)?;
    for sub in ["verifier", "agent"] {
        std::fs::create_dir_all(logs.join(sub)).map_err(|e| infra(e.into()))?;
    }
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let mut maps = vec![("/logs".to_string(), s(&logs)), ("/tests".to_string(), s(&tests))];
    if task.workdir != "/" {
        maps.push((task.workdir.trim_end_matches('/').to_string(), s(&ws)));
    }
    let script_text = std::fs::read_to_string(&task.test_script).map_err(|e| infra(e.into()))?;
    let script = remap_paths(&script_text, &maps);
    let script_path = tests.join("test.sh");
    std::fs::write(&script_path, &script).map_err(|e| infra(e.into()))?;
    std::fs::write(log_dir.join("test.sh"), &script).map_err(|e| infra(e.into()))?;
    let timeout = Duration::from_secs_f64(task.verifier_timeout_sec.clamp(1.0, 7.0 * 86400.0));
    let mut spec = sandbox_spec(&ws, opts, timeout).network(task.allow_internet).writable_path(&logs);
    // The sandbox's /tmp is private: the copies must be mounted to be seen (a copy, so the
    // verifier writing there is harmless, as it may in Harbor's container).
    spec = spec.writable_path(&tests);
    for (k, v) in &task.env {
        spec = spec.env(k, remap_paths(v, &maps));
    }
    if let Some(dir) = frognano_dir() {
        let path = std::env::var("PATH").unwrap_or_default();
        spec = spec.env("PATH", format!("{}:{path}", dir.display()));
    }
    let verifier = frognano_sandbox::Sandbox::new(spec).map_err(|e| infra(anyhow::anyhow!("{e}")))?;
    let t0 = Instant::now();
    let (output, code, timed_out) = run_merged(
        &verifier,
        &format!(
            "cd {} && bash {}",
            crate::eval_script::shell_quote(&s(&ws)),
            crate::eval_script::shell_quote(&s(&script_path))
        ),
        timeout,
    )
    .map_err(infra)?;
    result.test_seconds = t0.elapsed().as_secs_f64();
    std::fs::write(log_dir.join(LOG_TEST_OUTPUT), &output).map_err(|e| infra(e.into()))?;
    copy_dir(&logs.join("verifier"), &log_dir.join("verifier")).map_err(infra)?;
    log.push_str(&format!("verifier: bash tests/test.sh exited {code} after {:.1} s\n", result.test_seconds));
    if timed_out {
        return Err(ErrorKind::TestTimeout(timeout.as_secs()));
    }
    let reward = read_reward(&logs.join("verifier"))
        .map_err(|e| ErrorKind::Infra(format!("verifier wrote no usable reward: {e:#}")))?;
    let resolved = reward >= 1.0;
    let report = json!({ inst.instance_id.clone(): {
        "patch_is_None": false,
        "patch_exists": true,
        "patch_successfully_applied": true,
        "resolved": resolved,
        "reward": reward,
    }});
    std::fs::write(log_dir.join(LOG_REPORT), instance_report_text(&report)).map_err(|e| infra(e.into()))?;
    result.outcome = if resolved { Outcome::Resolved } else { Outcome::Unresolved };
    result.report = Some(report);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_dir_defaults_and_overrides() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("django__django-1");
        std::fs::create_dir_all(t.join("tests")).unwrap();
        std::fs::create_dir_all(t.join("environment")).unwrap();
        std::fs::write(t.join("task.toml"), "version = \"1.0\"\n[metadata]\ndifficulty = \"easy\"\n[verifier]\ntimeout_sec = 900\n[environment]\nenv = { A = \"2\" }\n").unwrap();
        std::fs::write(t.join("instruction.md"), "Fix it").unwrap();
        std::fs::write(t.join("tests/test.sh"), "exit 0").unwrap();
        std::fs::write(
            t.join("environment/Dockerfile"),
            "FROM python:3.11 \\\n  AS x\nWORKDIR /testbed\nENV A=1 B=3\n",
        )
        .unwrap();
        let task = load_harbor_task(&t).unwrap();
        assert_eq!(task.id, "django__django-1");
        assert_eq!(task.image.as_deref(), Some("python:3.11"));
        assert_eq!(task.workdir, "/testbed");
        assert_eq!(task.verifier_timeout_sec, 900.0);
        assert_eq!(task.agent_timeout_sec, 3600.0);
        assert_eq!(task.env, vec![("B".into(), "3".into()), ("A".into(), "2".into())]);
        assert_eq!(load_harbor_dataset(d.path()).unwrap().len(), 1);
        std::fs::remove_file(t.join("tests/test.sh")).unwrap();
        assert!(load_harbor_task(&t).unwrap_err().to_string().contains("tests/test.sh"));
    }

    #[test]
    fn paths_remap_only_as_whole_prefixes() {
        let maps = vec![("/app".to_string(), "/w/ws".to_string()), ("/logs".to_string(), "/w/logs".to_string())];
        let t = "cd /app\nls /apple /x/app \"/app/a b\" /logs/verifier/reward.txt $X/app\n";
        assert_eq!(
            remap_paths(t, &maps),
            "cd /w/ws\nls /apple /x/app \"/w/ws/a b\" /w/logs/verifier/reward.txt $X/app\n"
        );
        assert_eq!(remap_paths("é/app", &maps), "é/w/ws");
    }

    #[test]
    fn synth_dockerfile_names_repo_and_commit() {
        let (r, c) = synth_dockerfile_source(
            "FROM frognano-synth/owner__name:latest\nWORKDIR /app\n# The buggy tree is the single orphan commit 0a1b2c of the task\n",
        );
        assert_eq!(r.as_deref(), Some("owner/name"));
        assert_eq!(c.as_deref(), Some("0a1b2c"));
    }

    #[test]
    fn rewards_from_json_or_text() {
        let d = tempfile::tempdir().unwrap();
        assert!(read_reward(d.path()).is_err());
        std::fs::write(d.path().join("reward.txt"), "0.5\n").unwrap();
        assert_eq!(read_reward(d.path()).unwrap(), 0.5);
        std::fs::write(d.path().join("reward.json"), "{\"score\": 1}").unwrap();
        assert_eq!(read_reward(d.path()).unwrap(), 1.0);
    }
}
