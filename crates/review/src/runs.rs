//! Run directories under the review root, found and read for the pages: `frognano solve`
//! outputs (trajectory, patch, run.json, decisions), `frognano eval` run directories
//! (`results.jsonl` and the per-instance logs) and `frognano train` run folders
//! (`metrics.jsonl`). Anything unreadable becomes a row or a page that says what is wrong,
//! never an error of the whole list.

use crate::decisions::{self, Decision};
use frognano_agent::run_dir::{self, RunInfo};
use frognano_agent::trajectory::{ExitReason, StepUsage, Trajectory, FORMAT};
use serde::Serialize;
use serde_json::{json, Value};
use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

/// How deep below the root run directories are looked for (`logs/run_evaluation/<id>` of an
/// eval output root is three levels down).
const MAX_DEPTH: usize = 5;

/// Longest text of one field sent to the page (a Write of a huge file, a huge test log).
pub const FIELD_CHARS: usize = 256 * 1024;

/// What kind of run a directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A `frognano solve` output.
    Solve,
    /// A `frognano eval` run directory.
    Eval,
    /// A `frognano train` run folder.
    Train,
}

/// A run directory found under the root.
#[derive(Debug, Clone)]
pub struct Found {
    /// Its path relative to the root, `/`-separated (`.` for the root itself).
    pub id: String,
    /// Its path.
    pub path: PathBuf,
    /// What it holds.
    pub kind: Kind,
}

/// The kind of run `dir` holds, if it is one.
pub fn classify(dir: &Path) -> Option<Kind> {
    let has = |f: &str| dir.join(f).is_file();
    if has("metrics.jsonl") {
        Some(Kind::Train)
    } else if has("results.jsonl") {
        Some(Kind::Eval)
    } else if has(run_dir::TRAJECTORY) || has(run_dir::RUN_INFO) || has(run_dir::PATCH) || has(run_dir::SUMMARY) {
        Some(Kind::Solve)
    } else {
        None
    }
}

/// Every run directory under `root` (the root itself if it is one), skipping hidden folders.
pub fn discover(root: &Path) -> Vec<Found> {
    let mut out = Vec::new();
    visit(root, root, 0, &mut out);
    out
}

fn visit(root: &Path, dir: &Path, depth: usize, out: &mut Vec<Found>) {
    if let Some(kind) = classify(dir) {
        out.push(Found { id: id_of(root, dir), path: dir.to_path_buf(), kind });
        return;
    }
    if depth >= MAX_DEPTH {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut subdirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    subdirs.sort();
    for d in subdirs {
        visit(root, &d, depth + 1, out);
    }
}

/// `dir`'s id: its path relative to `root`, `/`-separated.
pub fn id_of(root: &Path, dir: &Path) -> String {
    match dir.strip_prefix(root) {
        Ok(rel) if rel.as_os_str().is_empty() => ".".to_string(),
        Ok(rel) => rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/"),
        Err(_) => dir.display().to_string(),
    }
}

/// The directory an id names, refusing ids that climb out of the root.
pub fn resolve(root: &Path, id: &str) -> Result<PathBuf, String> {
    if id == "." || id.is_empty() {
        return Ok(root.to_path_buf());
    }
    let rel = Path::new(id);
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(format!("{id:?} is not a run under the review folder"));
    }
    let path = root.join(rel);
    // A symlink out of the root is refused as well.
    match path.canonicalize() {
        Ok(p) if p.starts_with(root) => Ok(p),
        Ok(_) => Err(format!("{id:?} leads outside the review folder")),
        Err(_) => Err(format!("there is no run {id:?} under {}", root.display())),
    }
}

/// One row of the runs list.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The run's id.
    pub id: String,
    /// What it is.
    pub kind: Kind,
    /// The title (solve), the run id (eval), the folder (train).
    pub title: String,
    /// Who answered.
    pub model: Option<String>,
    /// Why it ended (`running` while it goes on).
    pub exit_reason: Option<String>,
    /// Steps taken.
    pub steps: Option<usize>,
    /// Files the patch changes.
    pub files: Vec<String>,
    /// Seconds it ran.
    pub elapsed_sec: Option<f64>,
    /// When it started (or was last written), Unix seconds: the list is sorted by this.
    pub started_unix: u64,
    /// The decision that gives its review state.
    pub state: Option<Decision>,
    /// The run is in progress.
    pub live: bool,
    /// The run it continues.
    pub parent: Option<String>,
    /// Eval: `resolved/instances`; train: last step's reward and solve rate.
    pub stats: Option<String>,
    /// What is wrong with it, when it cannot be read.
    pub problem: Option<String>,
}

fn mtime_unix(path: &Path) -> u64 {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

/// The first non-blank line of the task, without markdown heading marks, at most 140 chars.
pub fn title_of(task: &str) -> String {
    let line = task.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("(no task text)");
    let line = line.trim_start_matches('#').trim();
    let mut t: String = line.chars().take(140).collect();
    if line.chars().count() > 140 {
        t.push('…');
    }
    t
}

/// A trajectory read for the pages: Leaf's record, or what is wrong with the file.
pub fn load_trajectory(dir: &Path) -> Result<Trajectory, String> {
    let path = dir.join(run_dir::TRAJECTORY);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(
                "no trajectory.json yet: the run has not finished its first step, or it was stopped before".into()
            )
        }
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let value: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            return Err(format!(
                "trajectory.json is not valid JSON ({e}); it may be half-written (a run killed while saving) or damaged"
            ))
        }
    };
    match value.get("trajectory_format").and_then(Value::as_str) {
        Some(FORMAT) => {}
        Some(other) => {
            return Err(format!(
                "trajectory.json is in the format {other:?}, not {FORMAT:?}: it was written by another tool"
            ))
        }
        None => {
            let keys: Vec<&str> =
                value.as_object().map(|o| o.keys().map(String::as_str).take(8).collect()).unwrap_or_default();
            return Err(format!(
                "trajectory.json has no trajectory_format field, so it is not a {FORMAT} record (another tool's trajectory? its keys: {})",
                if keys.is_empty() { "none".to_string() } else { keys.join(", ") }
            ));
        }
    }
    serde_json::from_value(value).map_err(|e| format!("trajectory.json is a {FORMAT} record with a bad field: {e}"))
}

fn parent_id(root: &Path, info: Option<&RunInfo>) -> Option<String> {
    let parent = info?.parent.as_ref()?;
    let dir = parent.dir.canonicalize().unwrap_or_else(|_| parent.dir.clone());
    Some(id_of(root, &dir))
}

/// The model line of a `summary.md` (runs made before `run.json` existed).
fn summary_model(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(run_dir::SUMMARY)).ok()?;
    text.lines().find_map(|l| l.strip_prefix("- model: ")).map(str::to_string)
}

/// The list row of a solve run.
pub fn solve_row(root: &Path, found: &Found) -> Row {
    let dir = &found.path;
    let info = RunInfo::load(dir).ok();
    let (decisions, _) = decisions::load(dir);
    let mut row = Row {
        id: found.id.clone(),
        kind: Kind::Solve,
        title: dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        model: info.as_ref().map(|i| i.model.clone()).or_else(|| summary_model(dir)),
        exit_reason: None,
        steps: None,
        files: Vec::new(),
        elapsed_sec: None,
        started_unix: info
            .as_ref()
            .map_or_else(|| mtime_unix(&dir.join(run_dir::TRAJECTORY)).max(mtime_unix(dir)), |i| i.started_unix),
        state: decisions::state(&decisions).cloned(),
        live: false,
        parent: parent_id(root, info.as_ref()),
        stats: None,
        problem: None,
    };
    match load_trajectory(dir) {
        Ok(t) => {
            if let Some(user) = t.messages.iter().find(|m| m.role == "user") {
                row.title = title_of(&user.text());
            }
            row.exit_reason = Some(t.exit_reason.as_str().to_string());
            row.steps = Some(t.n_steps);
            row.elapsed_sec = Some(t.elapsed_sec);
            row.live = t.partial || t.exit_reason == ExitReason::Running;
            row.files = match std::fs::read(dir.join(run_dir::PATCH)) {
                Ok(bytes) => frognano_sandbox::patch::changed_files(&bytes),
                Err(_) => frognano_agent::solve::changed_files(&t.output_patch),
            };
        }
        Err(e) => row.problem = Some(e),
    }
    row
}

/// One step as the run page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct StepView {
    /// 0-based step number.
    pub step: usize,
    /// The thinking (shown collapsed).
    pub reasoning: Option<String>,
    /// What the model wrote.
    pub content: String,
    /// Its tool calls.
    pub calls: Vec<CallView>,
    /// Tool results in call order; a guard's notice to the model comes as a `notice`.
    pub observations: Vec<ObservationView>,
    /// Tokens and time, when recorded.
    pub usage: Option<StepUsage>,
    /// The step belongs to the run this one continues.
    pub inherited: bool,
    /// The user message that came right before this step and is not the task (a reviewer's
    /// comment of a Send back, a guard's notice).
    pub user_before: Option<String>,
}

/// One tool call.
#[derive(Debug, Clone, Serialize)]
pub struct CallView {
    /// The tool.
    pub name: String,
    /// Its arguments: the JSON object, or the raw string when it is not one.
    pub arguments: Value,
}

/// One observation.
#[derive(Debug, Clone, Serialize)]
pub struct ObservationView {
    /// The tool that produced it.
    pub tool: String,
    /// Its text.
    pub text: String,
}

fn cap(text: &str) -> String {
    if text.len() <= FIELD_CHARS {
        return text.to_string();
    }
    let mut end = FIELD_CHARS;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[… {} more bytes not shown]", &text[..end], text.len() - end)
}

fn cap_value(v: Value) -> Value {
    match v {
        Value::String(s) => Value::String(cap(&s)),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, cap_value(v))).collect()),
        Value::Array(a) => Value::Array(a.into_iter().map(cap_value).collect()),
        other => other,
    }
}

/// The steps of `t` for the page; the first `inherited` came from the parent run.
pub fn step_views(t: &Trajectory, inherited: usize) -> Vec<StepView> {
    // User messages between assistant turns (after the task), keyed by the index of the
    // assistant turn they precede.
    let mut users_before: Vec<Option<String>> = Vec::new();
    let mut pending: Option<String> = None;
    let mut seen_task = false;
    for m in &t.messages {
        match m.role.as_str() {
            "user" if !seen_task => seen_task = true,
            "user" => pending = Some(m.text().into_owned()),
            "assistant" => users_before.push(pending.take()),
            _ => {}
        }
    }
    t.steps
        .iter()
        .enumerate()
        .map(|(i, s)| StepView {
            step: s.step,
            reasoning: s.assistant.reasoning_content.as_deref().map(cap).filter(|r| !r.trim().is_empty()),
            content: cap(&s.assistant.text()),
            calls: s
                .assistant
                .calls()
                .iter()
                .map(|c| CallView {
                    name: c.function.name.clone(),
                    arguments: match serde_json::from_str::<Value>(&c.function.arguments) {
                        Ok(v @ Value::Object(_)) => cap_value(v),
                        _ => Value::String(cap(&c.function.arguments)),
                    },
                })
                .collect(),
            observations: s
                .observations
                .iter()
                .map(|o| ObservationView { tool: o.tool.clone(), text: cap(&o.observation) })
                .collect(),
            usage: s.usage,
            inherited: i < inherited,
            user_before: users_before.get(i).cloned().flatten(),
        })
        .collect()
}

/// The run page of a solve run (also the page of a run that cannot be read: `problem` says
/// why, `files_present` what is there).
pub fn solve_view(root: &Path, found: &Found, all_rows: &[Row]) -> Value {
    let dir = &found.path;
    let info = RunInfo::load(dir);
    let (decisions, mut problems) = decisions::load(dir);
    let patch = std::fs::read(dir.join(run_dir::PATCH)).ok();
    let summary = std::fs::read_to_string(dir.join(run_dir::SUMMARY)).ok();
    let files_present: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            let mut v: Vec<String> =
                d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
            v.sort();
            v
        })
        .unwrap_or_default();
    if let Err(e) = &info {
        problems.push(format!("{e:#}: Apply and Send back need it (runs of frognano solve write it)"));
    }
    let info = info.ok();
    let children: Vec<&str> =
        all_rows.iter().filter(|r| r.parent.as_deref() == Some(found.id.as_str())).map(|r| r.id.as_str()).collect();
    let mut view = json!({
        "id": found.id,
        "kind": "solve",
        "path": dir.display().to_string(),
        "info": info,
        "decisions": decisions,
        "state": decisions::state(&decisions),
        "parent": parent_id(root, info.as_ref()),
        "children": children,
        "summary_md": summary.as_deref().map(cap),
        "files_present": files_present,
        "has_patch": patch.as_ref().is_some_and(|p| !p.iter().all(u8::is_ascii_whitespace)),
        "problems": problems,
    });
    let model = info.as_ref().map(|i| i.model.clone()).or_else(|| summary_model(dir));
    view["model"] = json!(model);
    match load_trajectory(dir) {
        Ok(t) => {
            let inherited = info.as_ref().and_then(|i| i.parent.as_ref()).map_or(0, |p| p.steps);
            let task = t.messages.iter().find(|m| m.role == "user").map(|m| m.text().into_owned()).unwrap_or_default();
            view["title"] = json!(title_of(&task));
            view["issue"] = json!(cap(&task));
            view["exit_reason"] = json!(t.exit_reason.as_str());
            view["error"] = json!(t.error);
            view["final_message"] = json!(cap(&t.final_message));
            view["n_steps"] = json!(t.n_steps);
            view["elapsed_sec"] = json!(t.elapsed_sec);
            view["context_tokens"] = json!(t.context_tokens);
            view["live"] = json!(t.partial || t.exit_reason == ExitReason::Running);
            view["inherited_steps"] = json!(inherited);
            view["steps"] = json!(step_views(&t, inherited));
            view["trajectory_id"] = json!(t.trajectory_id);
        }
        Err(e) => {
            view["title"] = json!(dir.file_name().map(|n| n.to_string_lossy().into_owned()));
            view["problem"] = json!(e);
        }
    }
    view
}

/// The list row of an eval run directory.
pub fn eval_row(found: &Found) -> Row {
    let rows = read_jsonl(&found.path.join("results.jsonl"));
    let (values, bad) = rows;
    let instances: std::collections::BTreeSet<&str> = values.iter().filter_map(|r| r["instance_id"].as_str()).collect();
    let resolved: std::collections::BTreeSet<&str> =
        values.iter().filter(|r| r["resolved"] == true).filter_map(|r| r["instance_id"].as_str()).collect();
    let model = values.iter().find_map(|r| r["model_name_or_path"].as_str()).map(str::to_string);
    Row {
        id: found.id.clone(),
        kind: Kind::Eval,
        title: format!("eval {}", found.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()),
        model,
        exit_reason: None,
        steps: None,
        files: Vec::new(),
        elapsed_sec: Some(values.iter().filter_map(|r| r["seconds"].as_f64()).sum()),
        started_unix: mtime_unix(&found.path.join("results.jsonl")),
        state: None,
        live: false,
        parent: None,
        stats: Some(format!("{} of {} resolved ({} attempts)", resolved.len(), instances.len(), values.len())),
        problem: (!bad.is_empty()).then(|| bad.join("; ")),
    }
}

/// Lines of a JSONL file: the objects, and what is wrong with the others.
pub fn read_jsonl(path: &Path) -> (Vec<Value>, Vec<String>) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return (Vec::new(), vec![format!("cannot read {}", path.display())]);
    };
    let mut good = Vec::new();
    let mut bad = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        match serde_json::from_str::<Value>(line) {
            Ok(v @ Value::Object(_)) => good.push(v),
            // The last line of a file being appended to may be half-written; say so.
            Ok(_) | Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {
                bad.push(format!("{} line {} is half-written (still being appended?)", path.display(), i + 1))
            }
            Ok(_) => bad.push(format!("{} line {}: not a JSON object", path.display(), i + 1)),
            Err(e) => bad.push(format!("{} line {}: {e}", path.display(), i + 1)),
        }
    }
    (good, bad)
}

/// The logs folder of one graded instance of an eval run: `<run>/<model>/<id>/` (grade) or
/// `<run>/attempt-N/<model>/<id>/` (run).
fn instance_log_dir(run: &Path, instance: &str, attempt: u64) -> Option<PathBuf> {
    let attempt_dir = run.join(format!("attempt-{attempt}"));
    let base = if attempt_dir.is_dir() { attempt_dir } else { run.to_path_buf() };
    let models = std::fs::read_dir(&base).ok()?;
    models.filter_map(Result::ok).map(|m| m.path().join(instance)).find(|p| p.is_dir())
}

/// The eval page: one row per (instance, attempt) with its outcome, and the run report when
/// `frognano eval grade` wrote one.
pub fn eval_view(found: &Found) -> Value {
    let (rows, problems) = read_jsonl(&found.path.join("results.jsonl"));
    let run_id = found.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // logs/run_evaluation/<run_id> → the output root holds <model>.<run_id>.json.
    let report = found
        .path
        .ancestors()
        .nth(3)
        .and_then(|root| std::fs::read_dir(root).ok())
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().ends_with(&format!(".{run_id}.json")))
        .and_then(|e| std::fs::read_to_string(e.path()).ok())
        .and_then(|t| serde_json::from_str::<Value>(&t).ok());
    let instances: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "instance_id": r["instance_id"],
                "attempt": r["attempt"],
                "status": r["status"],
                "resolved": r["resolved"],
                "error": r["error"],
                "seconds": r["seconds"],
                "trajectory": r["trajectory"],
            })
        })
        .collect();
    json!({
        "id": found.id,
        "kind": "eval",
        "title": format!("eval {run_id}"),
        "path": found.path.display().to_string(),
        "instances": instances,
        "report": report,
        "problems": problems,
    })
}

/// One instance of an eval run: its report, test log, patch and harness log.
pub fn eval_instance_view(found: &Found, instance: &str, attempt: u64) -> Result<Value, String> {
    let (rows, _) = read_jsonl(&found.path.join("results.jsonl"));
    let row = rows
        .iter()
        .find(|r| r["instance_id"].as_str() == Some(instance) && r["attempt"].as_u64().unwrap_or(0) == attempt)
        .cloned()
        .ok_or_else(|| format!("eval run {} has no instance {instance:?} (attempt {attempt})", found.id))?;
    let logs = instance_log_dir(&found.path, instance, attempt);
    let read = |name: &str| -> Option<String> {
        let bytes = std::fs::read(logs.as_ref()?.join(name)).ok()?;
        Some(tail(&String::from_utf8_lossy(&bytes)))
    };
    let patch = logs.as_ref().and_then(|d| std::fs::read(d.join("patch.diff")).ok());
    let trajectory_id = row["trajectory"].as_str().map(str::to_string);
    Ok(json!({
        "instance_id": instance,
        "attempt": attempt,
        "row": row,
        "logs_dir": logs.as_ref().map(|d| d.display().to_string()),
        "report": read("report.json").and_then(|t| serde_json::from_str::<Value>(&t).ok()),
        "test_output": read("test_output.txt"),
        "run_instance_log": read("run_instance.log"),
        "patch_files": patch.map(|p| crate::diff::page(&crate::diff::parse(&p), 1, crate::diff::LINES_PER_PAGE)),
        "trajectory": trajectory_id,
    }))
}

/// The last [`FIELD_CHARS`] of a log (the end of a test run is what matters).
fn tail(text: &str) -> String {
    if text.len() <= FIELD_CHARS {
        return text.to_string();
    }
    let mut start = text.len() - FIELD_CHARS;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("[… {start} earlier bytes not shown]\n{}", &text[start..])
}

/// The list row of a train run.
pub fn train_row(found: &Found) -> Row {
    let (rows, bad) = read_jsonl(&found.path.join("metrics.jsonl"));
    let last = rows.last();
    let modified = mtime_unix(&found.path.join("metrics.jsonl"));
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    Row {
        id: found.id.clone(),
        kind: Kind::Train,
        title: format!(
            "train {}",
            found.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
        ),
        model: None,
        exit_reason: None,
        steps: Some(rows.len()),
        files: Vec::new(),
        elapsed_sec: Some(
            rows.iter().map(|r| r["rollout_s"].as_f64().unwrap_or(0.0) + r["train_s"].as_f64().unwrap_or(0.0)).sum(),
        ),
        started_unix: modified,
        state: None,
        // Written to in the last two minutes: probably still training.
        live: now.saturating_sub(modified) < 120,
        parent: None,
        stats: last.map(|r| {
            format!(
                "step {}: reward {:.3}, solved {:.1}%",
                r["step"],
                r["reward_mean"].as_f64().unwrap_or(0.0),
                100.0 * r["solve_rate"].as_f64().unwrap_or(0.0)
            )
        }),
        problem: (!bad.is_empty() && rows.is_empty()).then(|| bad.join("; ")),
    }
}

/// The train page: every metrics line (the page draws the plots), and what could not be read.
pub fn train_view(found: &Found) -> Value {
    let (rows, problems) = read_jsonl(&found.path.join("metrics.jsonl"));
    json!({
        "id": found.id,
        "kind": "train",
        "title": format!("train {}", found.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()),
        "path": found.path.display().to_string(),
        "metrics": rows,
        "problems": problems,
        "modified_unix": mtime_unix(&found.path.join("metrics.jsonl")),
    })
}

/// Every row under `root`, newest first.
pub fn list(root: &Path) -> Vec<Row> {
    let mut rows: Vec<Row> = discover(root)
        .iter()
        .map(|f| match f.kind {
            Kind::Solve => solve_row(root, f),
            Kind::Eval => eval_row(f),
            Kind::Train => train_row(f),
        })
        .collect();
    rows.sort_by(|a, b| b.started_unix.cmp(&a.started_unix).then_with(|| b.id.cmp(&a.id)));
    rows
}
