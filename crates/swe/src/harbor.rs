//! Harbor task directories (`task.toml`, `instruction.md`, `tests/test.sh`,
//! `environment/Dockerfile`), read with the defaults of FrogNano's published evaluation
//! (shared/docs/swe-bench.md §10), and Harbor's reward files.

use std::path::{Path, PathBuf};

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
    fn rewards_from_json_or_text() {
        let d = tempfile::tempdir().unwrap();
        assert!(read_reward(d.path()).is_err());
        std::fs::write(d.path().join("reward.txt"), "0.5\n").unwrap();
        assert_eq!(read_reward(d.path()).unwrap(), 0.5);
        std::fs::write(d.path().join("reward.json"), "{\"score\": 1}").unwrap();
        assert_eq!(read_reward(d.path()).unwrap(), 1.0);
    }
}
