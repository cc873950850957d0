//! `frognano synth batch MANIFEST`: many packages, each under a time budget, run in
//! parallel into one output folder, resumable after a kill, with one merged `tasks.jsonl`
//! and a yield report.
//!
//! Layout of the output folder:
//! - `packages/<slug>/` — each package's own `frognano synth` output (its `candidates.jsonl`
//!   makes a killed package continue where it stopped);
//! - `batch.jsonl` — one [`PackageYield`] line per *finished* package, written last: a rerun
//!   skips every package listed there;
//! - `tasks.jsonl` — every package's tasks, merged when the package finishes; an instance id
//!   already there is never appended again, so a package re-merged after a kill between its
//!   merge and its `batch.jsonl` line writes nothing twice;
//! - `yield.json` — the report over all finished packages ([`YieldReport`]).

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::intake::Source;
use crate::pipeline::{failure_of, synthesize_until, RunLimits, SynthOptions};
use frognano_swe::progress::{NoProgress, Progress};

/// One package of a manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchEntry {
    /// The spec as written (`pypi:six==1.16.0`, …): the package's identity in `batch.jsonl`.
    pub spec: String,
    /// Where its code comes from.
    pub source: Source,
    /// Its time budget (validation stops starting new candidates after it).
    pub budget: Duration,
}

/// Parses a duration `600`, `600s`, `10m`, `1h` (`None` for anything else or zero).
pub fn parse_budget(text: &str) -> Option<Duration> {
    let t = text.trim();
    let (num, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit() && *c != '.') {
        Some((i, _)) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let n: f64 = num.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    (secs > 0.0 && secs.is_finite()).then(|| Duration::from_secs_f64(secs))
}

/// Parses one spec: `pypi:NAME==VER`, `crate:NAME@VER`, `npm:NAME@VER`, `go:MODULE@VER` (or
/// `go:MODULE@debian`),
/// or a local git repository path (`path:DIR` or a bare path; relative to `base`).
pub fn parse_spec(spec: &str, base: &Path) -> anyhow::Result<Source> {
    if let Some(s) = spec.strip_prefix("pypi:") {
        return Source::pypi(s);
    }
    if let Some(s) = spec.strip_prefix("crate:") {
        return Source::krate(s);
    }
    if let Some(s) = spec.strip_prefix("npm:") {
        return Source::npm(s);
    }
    if let Some(s) = spec.strip_prefix("go:") {
        return Source::go(s);
    }
    let path = spec.strip_prefix("path:").unwrap_or(spec);
    let path = if Path::new(path).is_absolute() { PathBuf::from(path) } else { base.join(path) };
    anyhow::ensure!(
        path.is_dir(),
        "expected pypi:NAME==VER, crate:NAME@VER, npm:NAME@VER, go:MODULE@VER or a local git repository, found {spec:?} (no such directory {})",
        path.display()
    );
    Ok(Source::Local { path, commit: None })
}

/// Reads a manifest: one package per line, `SPEC [BUDGET]` (budget `600`, `600s`, `10m`;
/// default `default_budget`), `#` comments and blank lines ignored. Errors name the file,
/// the line and what was expected.
pub fn parse_manifest(path: &Path, default_budget: Duration) -> anyhow::Result<Vec<BatchEntry>> {
    let text =
        std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read manifest {}: {e}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut out: Vec<BatchEntry> = Vec::new();
    let mut seen = HashSet::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = |msg: String| anyhow::anyhow!("{}:{}: {msg}", path.display(), i + 1);
        let mut words = line.split_whitespace();
        let spec = words.next().expect("non-empty line").to_string();
        let budget = match words.next() {
            None => default_budget,
            Some(b) => parse_budget(b.strip_prefix("budget=").unwrap_or(b))
                .ok_or_else(|| at(format!("expected a time budget such as 600, 600s or 10m, found {b:?}")))?,
        };
        if let Some(extra) = words.next() {
            return Err(at(format!("expected `SPEC [BUDGET]`, found an extra field {extra:?}")));
        }
        let source = parse_spec(&spec, base).map_err(|e| at(format!("{e:#}")))?;
        if !seen.insert(spec.clone()) {
            return Err(at(format!("{spec} is listed twice")));
        }
        out.push(BatchEntry { spec, source, budget });
    }
    anyhow::ensure!(!out.is_empty(), "manifest {} lists no packages", path.display());
    Ok(out)
}

/// How one package went: a line of `batch.jsonl` and a row of the yield report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PackageYield {
    /// The manifest spec.
    pub spec: String,
    /// Its output folder (under `packages/`).
    pub dir: PathBuf,
    /// Tasks accepted (all runs of this package).
    pub tasks: usize,
    /// Candidates validated (all runs of this package).
    pub candidates_tried: usize,
    /// Wall-clock seconds of the last run.
    pub seconds: f64,
    /// Seconds of test runs of the last run (all of its workers).
    pub test_seconds: f64,
    /// `ok` (at least one task) or a [`crate::pipeline::Failure`] name.
    pub outcome: String,
    /// The error message of a failed package.
    pub error: Option<String>,
    /// Whether the budget ran out before every candidate was tried.
    pub budget_exhausted: bool,
}

/// The batch's report (`yield.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct YieldReport {
    /// Every finished package, in manifest order.
    pub packages: Vec<PackageYield>,
    /// Packages by outcome (`ok` and the failure categories).
    pub outcomes: BTreeMap<String, usize>,
    /// Tasks over all packages.
    pub tasks: usize,
    /// Candidates validated over all packages.
    pub candidates_tried: usize,
    /// Wall-clock seconds of this run of the batch.
    pub wall_seconds: f64,
    /// CPU seconds of this run (the process and the test runs it waited for).
    pub cpu_seconds: f64,
    /// Tasks accepted in this run per CPU-minute of this run.
    pub tasks_per_cpu_minute: f64,
    /// Packages the manifest lists but no run has finished yet.
    pub unfinished: Vec<String>,
}

/// A batch run's settings.
#[derive(Debug, Clone)]
pub struct BatchOptions {
    /// The packages.
    pub entries: Vec<BatchEntry>,
    /// Output folder.
    pub out: PathBuf,
    /// Packages run at once.
    pub jobs: usize,
    /// Settings every package runs with (`source` and `out` are replaced per package).
    pub template: SynthOptions,
    /// Time limit of a package's clean-tree suite run (slower: `suite_too_slow`).
    pub suite_limit: Duration,
}

/// CPU seconds of this process and its waited-for children (`/proc/self/stat`; 0 where
/// that is not readable).
pub fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    // Fields after the parenthesised command name: state is field 3; utime, stime, cutime,
    // cstime are fields 14–17, in clock ticks (100 per second on Linux).
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { return 0.0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    (11..15).filter_map(|i| fields.get(i).and_then(|f| f.parse::<f64>().ok())).sum::<f64>() / 100.0
}

fn slug(entry: &BatchEntry) -> String {
    use sha2::{Digest, Sha256};
    let name: String = entry
        .source
        .repo_name()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' })
        .collect();
    let hash = Sha256::digest(entry.spec.as_bytes());
    format!("{name}-{:02x}{:02x}{:02x}{:02x}", hash[0], hash[1], hash[2], hash[3])
}

fn read_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn append_line(path: &Path, line: &str) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    writeln!(f, "{line}")?;
    f.sync_data()?;
    Ok(())
}

struct State {
    merged_ids: HashSet<String>,
}

/// Appends the package's tasks not yet in the merged file.
fn merge_tasks(out: &Path, package_dir: &Path, state: &mut State) -> anyhow::Result<usize> {
    let text = std::fs::read_to_string(package_dir.join("tasks.jsonl")).unwrap_or_default();
    let mut added = 0;
    let mut buf = String::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let Some(id) = v["instance_id"].as_str() else { continue };
        if state.merged_ids.insert(id.to_string()) {
            buf.push_str(line);
            buf.push('\n');
            added += 1;
        }
    }
    if !buf.is_empty() {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(out.join("tasks.jsonl"))?;
        f.write_all(buf.as_bytes())?;
        f.sync_data()?;
    }
    Ok(added)
}

fn run_package(entry: &BatchEntry, opts: &BatchOptions, dir: &Path) -> PackageYield {
    let mut synth = opts.template.clone();
    synth.source = entry.source.clone();
    synth.out = dir.to_path_buf();
    let limits = RunLimits { deadline: Some(Instant::now() + entry.budget), suite_limit: Some(opts.suite_limit) };
    let started = Instant::now();
    let result = synthesize_until(&synth, &NoProgress, &limits);
    let seconds = started.elapsed().as_secs_f64();
    let candidates = read_lines(&dir.join("candidates.jsonl")).len();
    let tasks = read_lines(&dir.join("tasks.jsonl")).len();
    let mut row = PackageYield {
        spec: entry.spec.clone(),
        dir: dir.to_path_buf(),
        tasks,
        candidates_tried: candidates,
        seconds,
        test_seconds: 0.0,
        outcome: "ok".into(),
        error: None,
        budget_exhausted: Instant::now() >= limits.deadline.expect("set above"),
    };
    match result {
        Ok(summary) => {
            row.test_seconds = summary.test_seconds;
            if tasks == 0 {
                row.outcome = crate::pipeline::Failure::NoSurvivingCandidates.name().into();
                let reasons: Vec<String> = summary.rejections.iter().map(|(r, n)| format!("{r}: {n}")).collect();
                row.error = Some(format!("no candidate survived validation ({})", reasons.join(", ")));
            }
        }
        Err(e) => {
            row.outcome = failure_of(&e).name().into();
            let msg = format!("{e:#}");
            // The reports stay readable: the first lines carry the reason.
            row.error = Some(msg.lines().take(6).collect::<Vec<_>>().join("\n"));
        }
    }
    row
}

/// Runs the batch: every package not finished by an earlier run, `jobs` at a time; returns
/// the report over all finished packages (also written to `yield.json`).
pub fn run_batch(opts: &BatchOptions, progress: &dyn Progress) -> anyhow::Result<YieldReport> {
    run_batch_at(opts, progress, None)
}

/// A package as a unit of a cluster run: its entry, its folder and the settings it runs with.
fn package_unit(entry: &BatchEntry, opts: &BatchOptions, dir: &Path) -> serde_json::Value {
    let t = &opts.template;
    serde_json::json!({
        "kind": "synth_package",
        "label": entry.spec,
        "spec": entry.spec,
        "source": entry.source,
        "budget_s": entry.budget.as_secs_f64(),
        "dir": dir,
        "suite_limit_s": opts.suite_limit.as_secs_f64(),
        "template": {
            "seed": t.gen.seed,
            "min_complexity": t.gen.min_complexity,
            "operators": t.gen.operators,
            "max_candidates": t.gen.max_candidates,
            "workers": t.workers,
            "max_tasks": t.max_tasks,
            "combine": t.combine,
            "max_combos": t.max_combos,
            "min_timeout_s": t.min_timeout.as_secs_f64(),
            "max_f2p_fraction": t.max_f2p_fraction,
            "unconfined": t.isolation == frognano_sandbox::Isolation::Unconfined,
            "python": t.python,
            "harbor": t.harbor,
        },
    })
}

/// A cluster worker's side of one `synth_package` unit: runs the package into its folder
/// (under the batch's `--out`, on a path every node sees) exactly as a local batch job does,
/// and answers with its [`PackageYield`] row, which the driver records.
pub fn package_unit_run(unit: &serde_json::Value) -> anyhow::Result<serde_json::Value> {
    fn field<T: serde::de::DeserializeOwned>(v: &serde_json::Value, name: &str) -> anyhow::Result<T> {
        serde_json::from_value(v[name].clone()).map_err(|e| anyhow::anyhow!("unit field `{name}`: {e}"))
    }
    let t = &unit["template"];
    let secs = |v: &serde_json::Value, name: &str| -> anyhow::Result<Duration> {
        let s: f64 = field(v, name)?;
        Ok(Duration::from_secs_f64(s))
    };
    let template = SynthOptions {
        source: field(unit, "source")?,
        out: field(unit, "dir")?,
        gen: crate::pipeline::GenOptions {
            seed: field(t, "seed")?,
            min_complexity: field(t, "min_complexity")?,
            operators: field(t, "operators")?,
            max_candidates: field(t, "max_candidates")?,
        },
        workers: field(t, "workers")?,
        max_tasks: field(t, "max_tasks")?,
        combine: field(t, "combine")?,
        max_combos: field(t, "max_combos")?,
        min_timeout: secs(t, "min_timeout_s")?,
        max_f2p_fraction: field(t, "max_f2p_fraction")?,
        isolation: if field(t, "unconfined")? {
            frognano_sandbox::Isolation::Unconfined
        } else {
            frognano_sandbox::Isolation::Bubblewrap
        },
        python: field(t, "python")?,
        harbor: field(t, "harbor")?,
        issue_model: None,
    };
    let entry =
        BatchEntry { spec: field(unit, "spec")?, source: template.source.clone(), budget: secs(unit, "budget_s")? };
    let dir: PathBuf = field(unit, "dir")?;
    let opts = BatchOptions {
        entries: vec![entry.clone()],
        out: dir.clone(),
        jobs: 1,
        template,
        suite_limit: secs(unit, "suite_limit_s")?,
    };
    Ok(serde_json::to_value(run_package(&entry, &opts, &dir))?)
}

/// [`run_batch`] with each package run as one unit of `runner` (a Ray cluster: `synth batch
/// --ray`) instead of on `jobs` local threads: a package's intake, environment, baseline and
/// candidates all run on one node, in its folder under `opts.out` (which must be on a path
/// every node sees); this process merges its tasks and appends its `batch.jsonl` line as a
/// local job does. A package whose unit fails is not recorded (a rerun runs it again) and the
/// run ends with an error naming it, after the others are recorded.
pub fn run_batch_at(
    opts: &BatchOptions,
    progress: &dyn Progress,
    runner: Option<&dyn frognano_swe::remote::UnitRunner>,
) -> anyhow::Result<YieldReport> {
    anyhow::ensure!(opts.jobs >= 1, "--jobs must be at least 1");
    std::fs::create_dir_all(opts.out.join("packages"))?;
    let out = opts.out.canonicalize()?;
    let started = Instant::now();
    let cpu_start = cpu_seconds();
    let finished: HashSet<String> =
        read_lines(&out.join("batch.jsonl")).iter().filter_map(|v| v["spec"].as_str().map(str::to_string)).collect();
    let merged_ids: HashSet<String> = read_lines(&out.join("tasks.jsonl"))
        .iter()
        .filter_map(|v| v["instance_id"].as_str().map(str::to_string))
        .collect();
    let tasks_before = merged_ids.len();
    let state = Mutex::new(State { merged_ids });
    let todo: Vec<&BatchEntry> = opts.entries.iter().filter(|e| !finished.contains(&e.spec)).collect();
    progress.start("batch", opts.entries.len() as u64, (opts.entries.len() - todo.len()) as u64);
    let first_error: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    // Merges a finished package's tasks and records its row (both kinds of run end here).
    let finish = |entry: &BatchEntry, dir: &Path, row: &PackageYield| {
        let record = (|| -> anyhow::Result<()> {
            let mut st = state.lock().expect("state lock");
            merge_tasks(&out, dir, &mut st)?;
            append_line(&out.join("batch.jsonl"), &serde_json::to_string(row)?)?;
            Ok(())
        })();
        if let Err(e) = record {
            first_error.lock().expect("error lock").get_or_insert(e);
        }
        progress.message(&format!("{}: {} ({} tasks)", entry.spec, row.outcome, row.tasks));
        progress.inc(1);
    };
    match runner {
        None => {
            // `jobs` threads take the packages in manifest order.
            let next = std::sync::atomic::AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..opts.jobs.min(todo.len()) {
                    let (first_error, out, next, todo, finish) = (&first_error, &out, &next, &todo, &finish);
                    s.spawn(move || loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let Some(entry) = todo.get(i) else { return };
                        if first_error.lock().expect("error lock").is_some() {
                            return;
                        }
                        let dir = out.join("packages").join(slug(entry));
                        let row = run_package(entry, opts, &dir);
                        finish(entry, &dir, &row);
                    });
                }
            });
        }
        Some(runner) => {
            let dirs: Vec<PathBuf> = todo.iter().map(|e| out.join("packages").join(slug(e))).collect();
            let units: Vec<serde_json::Value> =
                todo.iter().zip(&dirs).map(|(e, dir)| package_unit(e, opts, dir)).collect();
            let mut failed: Vec<String> = Vec::new();
            let res = runner.run_units(&units, progress, &mut |i, answer| {
                let row = answer.outcome.map_err(anyhow::Error::msg).and_then(|v| {
                    serde_json::from_value::<PackageYield>(v).map_err(|e| anyhow::anyhow!("unreadable answer: {e}"))
                });
                match row {
                    Ok(row) => finish(todo[i], &dirs[i], &row),
                    Err(e) => {
                        progress.println(&format!("{} failed on the cluster: {e:#}", todo[i].spec));
                        failed.push(format!("{} ({e:#})", todo[i].spec));
                        progress.inc(1);
                    }
                }
            });
            let mut first = first_error.lock().expect("error lock");
            if first.is_none() {
                if let Err(e) = res {
                    *first = Some(e);
                } else if !failed.is_empty() {
                    *first = Some(anyhow::anyhow!(
                        "{} package(s) failed on the cluster and are not recorded (rerun the same command to run them): {}",
                        failed.len(),
                        failed.join("; ")
                    ));
                }
            }
        }
    }
    progress.finish();
    if let Some(e) = first_error.into_inner().expect("error lock") {
        return Err(e);
    }
    let tasks_now = state.into_inner().expect("state lock").merged_ids.len();
    let mut report = report(opts, &out);
    report.wall_seconds = started.elapsed().as_secs_f64();
    report.cpu_seconds = cpu_seconds() - cpu_start;
    report.tasks_per_cpu_minute =
        if report.cpu_seconds > 0.0 { 60.0 * (tasks_now - tasks_before) as f64 / report.cpu_seconds } else { 0.0 };
    std::fs::write(out.join("yield.json"), serde_json::to_string_pretty(&report)?)?;
    Ok(report)
}

/// The report over the packages `batch.jsonl` lists (the latest line of each), in manifest
/// order; timing fields are left at 0 for the caller.
fn report(opts: &BatchOptions, out: &Path) -> YieldReport {
    let mut rows: BTreeMap<String, PackageYield> = BTreeMap::new();
    for v in read_lines(&out.join("batch.jsonl")) {
        if let Ok(row) = serde_json::from_value::<PackageYield>(v) {
            rows.insert(row.spec.clone(), row);
        }
    }
    let mut r = YieldReport::default();
    for e in &opts.entries {
        match rows.remove(&e.spec) {
            Some(row) => {
                *r.outcomes.entry(row.outcome.clone()).or_default() += 1;
                r.tasks += row.tasks;
                r.candidates_tried += row.candidates_tried;
                r.packages.push(row);
            }
            None => r.unfinished.push(e.spec.clone()),
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_parse_and_bad_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("repo")).unwrap();
        let m = dir.path().join("m.txt");
        std::fs::write(
            &m,
            "# packages\npypi:six==1.16.0 10m\ncrate:fnv@1.0.7\nnpm:@scope/pkg@1.2.3 budget=90\ngo:github.com/pkg/errors@v0.9.1 30s\nrepo   # local\n",
        )
        .unwrap();
        let es = parse_manifest(&m, Duration::from_secs(300)).unwrap();
        assert_eq!(es.len(), 5);
        assert_eq!(es[0].budget, Duration::from_secs(600));
        assert_eq!(es[1].budget, Duration::from_secs(300));
        assert_eq!(es[2].source, Source::Npm { name: "@scope/pkg".into(), version: "1.2.3".into() });
        assert_eq!(es[2].budget, Duration::from_secs(90));
        assert_eq!(es[3].source, Source::Go { module: "github.com/pkg/errors".into(), version: "v0.9.1".into() });
        assert_eq!(es[4].source, Source::Local { path: dir.path().join("repo"), commit: None });
        let bad = |text: &str| {
            std::fs::write(&m, text).unwrap();
            parse_manifest(&m, Duration::from_secs(1)).unwrap_err().to_string()
        };
        let e = bad("pypi:six==1.16.0 soon\n");
        assert!(e.starts_with(&format!("{}:1: expected a time budget", m.display())), "{e}");
        let e = bad("\nnowhere\n");
        assert!(e.contains(":2: expected pypi:NAME==VER") && e.contains("found \"nowhere\""), "{e}");
        assert!(bad("go:github.com/x/y@latest\n").contains("--go expects MODULE@VERSION"));
        assert!(bad("repo\nrepo\n").contains(":2: repo is listed twice"));
        assert!(bad("# nothing\n").contains("lists no packages"));
    }

    #[test]
    fn cpu_time_is_read() {
        // Spin until the process's CPU time moves (it counts in ticks of 10 ms), for at most
        // 5 s of wall time: a reader that returns a constant never sees it move.
        let t0 = cpu_seconds();
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while cpu_seconds() <= t0 && started.elapsed() < Duration::from_secs(5) {
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        assert!(cpu_seconds() > t0, "no CPU time counted in {:?} of spinning", started.elapsed());
    }
}
