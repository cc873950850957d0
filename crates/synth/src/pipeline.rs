//! The synthesis pipeline: candidates → validation in the sandbox → tasks (orphan buggy
//! commits in a task repository, SWE-bench instances appended to JSONL, Harbor dirs).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use frognano_sandbox::Isolation;
use frognano_swe::SweInstance;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::first_pass::FirstPass;
use crate::intake::{self, git, git_with_input, IntakeRepo, Source};
use crate::issue::{template_issue, IssueContext};
use crate::issue_model::{IssueModel, IssueOutcome};
use crate::mutate::{self, apply_edits, edits_overlap, Edit, Language, OperatorId};
use crate::project::{self, Baseline, EnvOptions, TestRun, TestSetup};
use crate::task_meta::{Difficulty, SynthMeta, ValidationTimes, SYNTH_FIELD};
use frognano_swe::progress::{NoProgress, Progress};
use frognano_swe::remote::UnitRunner;

// The edits of one file are part of a task's `synth` record; their type lives with it.
pub use crate::task_meta::FileMutation;

/// One candidate bug (one operator firing, or a combination of validated bugs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// Stable key: a hash of the base commit and the edits.
    pub key: String,
    /// Changed files.
    pub files: Vec<FileMutation>,
    /// Operators applied (one per combined bug).
    pub operators: Vec<OperatorId>,
    /// `path::Entity` of each mutated entity.
    pub entities: Vec<String>,
    /// Largest complexity among the mutated entities.
    pub complexity: u32,
    /// The seed the candidate was drawn with.
    pub seed: u64,
    /// Instance ids of the validated bugs a combination was built from.
    pub parents: Vec<String>,
}

fn hash_hex(parts: &[&[u8]]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
        h.update([0xff]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn candidate_key(commit: &str, files: &[FileMutation]) -> String {
    let body = serde_json::to_vec(files).unwrap_or_default();
    hash_hex(&[commit.as_bytes(), &body])[..12].to_string()
}

/// Knobs of candidate generation.
#[derive(Debug, Clone)]
pub struct GenOptions {
    /// Master seed.
    pub seed: u64,
    /// Entities simpler than this are skipped.
    pub min_complexity: u32,
    /// Operators to use (`None`: the language's whole table).
    pub operators: Option<Vec<OperatorId>>,
    /// Cap on the number of single-bug candidates (after a seeded shuffle).
    pub max_candidates: usize,
}

/// All single-operator candidates of the non-test source files of `commit`, in a seeded
/// order. Same inputs → same list.
pub fn generate_candidates(
    repo: &Path,
    commit: &str,
    lang: Language,
    opts: &GenOptions,
) -> anyhow::Result<Vec<Candidate>> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let table = mutate::operator_table(lang, opts.min_complexity);
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for path in intake::list_files(repo, commit)? {
        if Language::of_path(&path) != Some(lang) || project::is_test_path(&path) {
            continue;
        }
        let Ok(source) = intake::read_file_at(repo, commit, &path) else { continue };
        let Some(mut parsed) = mutate::ParsedSource::new(lang, &source) else { continue };
        for entity in parsed.entities() {
            for spec in &table {
                if opts.operators.as_ref().is_some_and(|ops| !ops.contains(&spec.id)) {
                    continue;
                }
                let mut rng = mutate::candidate_rng(opts.seed, &path, &entity, spec.id);
                let Some(edits) = parsed.mutate(&entity, spec, &mut rng) else { continue };
                let files = vec![FileMutation { path: path.clone(), edits }];
                let key = candidate_key(commit, &files);
                if seen.insert(key.clone()) {
                    out.push(Candidate {
                        key,
                        files,
                        operators: vec![spec.id],
                        entities: vec![format!("{path}::{}", entity.name)],
                        complexity: entity.complexity,
                        seed: opts.seed,
                        parents: vec![],
                    });
                }
            }
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    out.shuffle(&mut rng);
    out.truncate(opts.max_candidates);
    Ok(out)
}

/// The complexity floor of the extra rounds ([`more_candidates`]).
pub const SMALL_PROJECT_MIN_COMPLEXITY: u32 = 1;
/// How many extra rounds [`more_candidates`] draws.
const EXTRA_ROUNDS: u64 = 2;

/// Candidates beyond `first` for a project whose first round may be too small to reach a
/// task target **[ours]**: each operator fires at random sites, so the next seeds draw
/// other sites in the same functions, and the complexity floor drops to
/// [`SMALL_PROJECT_MIN_COMPLEXITY`] (one-branch helpers are most of a small utility
/// package). Keys already in `first` are left out; same inputs → same list, so a resumed
/// run recognises the ones it decided.
pub fn more_candidates(
    repo: &Path,
    commit: &str,
    lang: Language,
    gen: &GenOptions,
    first: &[Candidate],
) -> anyhow::Result<Vec<Candidate>> {
    let mut seen: HashSet<String> = first.iter().map(|c| c.key.clone()).collect();
    let mut out = Vec::new();
    for round in 1..=EXTRA_ROUNDS {
        let opts = GenOptions {
            seed: gen.seed.wrapping_add(round),
            min_complexity: gen.min_complexity.min(SMALL_PROJECT_MIN_COMPLEXITY),
            ..gen.clone()
        };
        for c in generate_candidates(repo, commit, lang, &opts)? {
            if seen.insert(c.key.clone()) {
                out.push(c);
            }
        }
    }
    out.truncate(gen.max_candidates);
    Ok(out)
}

/// Why a candidate was not kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Rejection {
    /// The edits do not apply to the clean file.
    EditsDoNotApply,
    /// A bug run ran past the timeout.
    Timeout,
    /// The bug run gave no parseable results (build or collection error).
    NoResults,
    /// Baseline tests vanished from the bug run and none of them failed outright (a build or
    /// collection error took them).
    LostTests {
        /// How many.
        count: usize,
    },
    /// No baseline test failed.
    NoFailure,
    /// No baseline test still passed.
    NoPassToPass,
    /// More than the allowed share of tests failed.
    TooBroad {
        /// Failing tests.
        failing: usize,
        /// Tests run.
        total: usize,
    },
    /// The second bug run classified tests differently.
    Unstable,
}

/// A candidate that passed validation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Validated {
    /// Tests the fix makes pass.
    pub fail_to_pass: Vec<String>,
    /// Tests that keep passing.
    pub pass_to_pass: Vec<String>,
    /// The first bug run's log.
    pub bug_log: String,
    /// Slower bug run, seconds.
    pub bug_seconds: f64,
}

/// Splits the baseline's passing tests by the bug run into fail-to-pass and pass-to-pass.
///
/// A passing test that is absent from the bug run counts as failing, as the grader counts
/// it (swebench reads a test missing from the log as not passed; SWE-smith keeps such tests
/// as fail-to-pass): a bug that kills a tape or mocha process mid-file, or changes a
/// parametrized test's id, takes the tests after it out of the log, and the fix brings them
/// back. It counts only when some baseline test also failed outright in the same run;
/// absent tests alone are a build or collection error (a Go package `[build failed]`, a
/// Python module that no longer imports), rejected as [`Rejection::LostTests`].
fn classify(run: &TestRun, base: &Baseline, max_f2p_fraction: f64) -> Result<(Vec<String>, Vec<String>), Rejection> {
    if run.timed_out {
        return Err(Rejection::Timeout);
    }
    if run.statuses.is_empty() {
        return Err(Rejection::NoResults);
    }
    let mut f2p = Vec::new();
    let mut p2p = Vec::new();
    let mut lost = 0;
    let mut failed_outright = false;
    for t in &base.passing {
        match run.statuses.get(t).map(String::as_str) {
            Some("FAILED" | "ERROR") => {
                failed_outright = true;
                f2p.push(t.clone());
            }
            Some("PASSED") => p2p.push(t.clone()),
            Some(_) => {}
            None => {
                lost += 1;
                f2p.push(t.clone());
            }
        }
    }
    if lost > 0 && !failed_outright {
        return Err(Rejection::LostTests { count: lost });
    }
    if f2p.is_empty() {
        return Err(Rejection::NoFailure);
    }
    if p2p.is_empty() {
        return Err(Rejection::NoPassToPass);
    }
    let total = f2p.len() + p2p.len();
    if f2p.len() as f64 > max_f2p_fraction * total as f64 {
        return Err(Rejection::TooBroad { failing: f2p.len(), total });
    }
    Ok((f2p, p2p))
}

/// How candidates are run and judged.
#[derive(Debug, Clone, Copy)]
pub struct ValidationEnv<'a> {
    /// Test command and parser.
    pub setup: &'a TestSetup,
    /// The clean tree's reference.
    pub base: &'a Baseline,
    /// Per-run timeout.
    pub timeout: Duration,
    /// Sandbox mode.
    pub isolation: Isolation,
    /// Largest share of the run tests a bug may fail.
    pub max_f2p_fraction: f64,
    /// Run the tests that import the mutated module first, when that pays (pytest only).
    pub first_pass: Option<&'a FirstPass>,
}

/// What the cheap first pass of one candidate did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FirstPassRun {
    /// Test files run.
    pub files: usize,
    /// Baseline-passing tests among them.
    pub tests: usize,
    /// Seconds of the run.
    pub seconds: f64,
    /// Whether it rejected the candidate (no full-suite run followed).
    pub rejected: bool,
}

/// The first pass's verdict on the tests it selected: `Err` ends validation there.
fn classify_subset(run: &TestRun, selected: &BTreeSet<String>) -> Result<(), Rejection> {
    if run.timed_out {
        return Err(Rejection::Timeout);
    }
    if run.statuses.is_empty() {
        return Err(Rejection::NoResults);
    }
    // As in [`classify`]: absent tests count as failing only beside one that failed outright.
    let lost = selected.iter().filter(|t| !run.statuses.contains_key(*t)).count();
    let failing = selected.iter().any(|t| matches!(run.statuses.get(t).map(String::as_str), Some("FAILED" | "ERROR")));
    match (failing, lost) {
        (true, _) => Ok(()),
        (false, 0) => Err(Rejection::NoFailure),
        (false, count) => Err(Rejection::LostTests { count }),
    }
}

/// Applies `cand` in the worker tree `dir`, runs the suite twice, restores the files. With a
/// first pass, the tests that import the mutated files run first, and a candidate none of
/// them fails is rejected there.
pub fn validate(
    dir: &Path,
    clean: &HashMap<String, String>,
    cand: &Candidate,
    env: ValidationEnv<'_>,
) -> anyhow::Result<Result<Validated, Rejection>> {
    validate_counted(dir, clean, cand, env).map(|(r, _)| r)
}

/// [`validate`], also saying what its first pass did.
pub fn validate_counted(
    dir: &Path,
    clean: &HashMap<String, String>,
    cand: &Candidate,
    env: ValidationEnv<'_>,
) -> anyhow::Result<(Result<Validated, Rejection>, Option<FirstPassRun>)> {
    let ValidationEnv { setup, base, timeout, isolation, max_f2p_fraction, first_pass } = env;
    let mut written = Vec::new();
    for fm in &cand.files {
        let Some(orig) = clean.get(&fm.path) else { return Ok((Err(Rejection::EditsDoNotApply), None)) };
        let Some(buggy) = apply_edits(orig, &fm.edits) else { return Ok((Err(Rejection::EditsDoNotApply), None)) };
        std::fs::write(dir.join(&fm.path), buggy)?;
        written.push(fm.path.clone());
    }
    let mut pass_run = None;
    let result = (|| -> anyhow::Result<Result<Validated, Rejection>> {
        let mutated: Vec<&str> = cand.files.iter().map(|f| f.path.as_str()).collect();
        if let Some((files, tests)) = first_pass.and_then(|fp| fp.select(&mutated)) {
            let subset = FirstPass::subset_setup(setup, &files);
            let run = project::run_tests(dir, &subset, timeout, isolation)?;
            let verdict = classify_subset(&run, &tests);
            pass_run = Some(FirstPassRun {
                files: files.len(),
                tests: tests.len(),
                seconds: run.seconds,
                rejected: verdict.is_err(),
            });
            if let Err(r) = verdict {
                return Ok(Err(r));
            }
        }
        let first = project::run_tests(dir, setup, timeout, isolation)?;
        let (f2p, p2p) = match classify(&first, base, max_f2p_fraction) {
            Ok(x) => x,
            Err(r) => return Ok(Err(r)),
        };
        let second = project::run_tests(dir, setup, timeout, isolation)?;
        match classify(&second, base, max_f2p_fraction) {
            Ok((f2, p2)) if f2 == f2p && p2 == p2p => {}
            Ok(_) => return Ok(Err(Rejection::Unstable)),
            Err(Rejection::Timeout) => return Ok(Err(Rejection::Timeout)),
            Err(_) => return Ok(Err(Rejection::Unstable)),
        }
        Ok(Ok(Validated {
            fail_to_pass: f2p,
            pass_to_pass: p2p,
            bug_log: first.log,
            bug_seconds: first.seconds.max(second.seconds),
        }))
    })();
    for p in written {
        std::fs::write(dir.join(&p), &clean[&p])?;
    }
    Ok((result?, pass_run))
}

/// The bare repository holding one orphan buggy commit per task (`refs/heads/task/<id>`).
#[derive(Debug)]
pub struct TaskRepo {
    /// Path of the bare repository (instances' `repo_path`).
    pub path: PathBuf,
    base_commit: String,
}

impl TaskRepo {
    /// Opens or creates `path` and fetches `commit` from `source`.
    pub fn open(path: &Path, source: &Path, commit: &str) -> anyhow::Result<TaskRepo> {
        if !path.join("HEAD").exists() {
            std::fs::create_dir_all(path)?;
            git(path, &["init", "-q", "--bare"])?;
        }
        let have = git(path, &["cat-file", "-e", &format!("{commit}^{{commit}}")]).is_ok();
        if !have {
            let src = source.canonicalize()?;
            git(path, &["fetch", "-q", "--no-tags", &src.to_string_lossy(), commit])?;
        }
        git(path, &["update-ref", "refs/synth/base", commit])?;
        Ok(TaskRepo { path: path.canonicalize()?, base_commit: commit.to_string() })
    }

    /// Commits the buggy tree (the clean tree with `files` replaced) as an orphan commit
    /// under `refs/heads/task/<id>`; returns (buggy commit, gold patch = buggy → clean).
    pub fn commit_task(&self, id: &str, files: &BTreeMap<String, String>) -> anyhow::Result<(String, String)> {
        let index = tempfile::NamedTempFile::new()?;
        let index_path = index.path().to_string_lossy().to_string();
        let env = [("GIT_INDEX_FILE", index_path.as_str())];
        git_with_input(&self.path, &["read-tree", &self.base_commit], None, &env)?;
        for (path, content) in files {
            let blob = git_with_input(&self.path, &["hash-object", "-w", "--stdin"], Some(content.as_bytes()), &[])?;
            let ls = git(&self.path, &["ls-tree", &self.base_commit, "--", path])?;
            let mode = ls.split_whitespace().next().unwrap_or("100644").to_string();
            git_with_input(
                &self.path,
                &["update-index", "--add", "--cacheinfo", &format!("{mode},{blob},{path}")],
                None,
                &env,
            )?;
        }
        let tree = git_with_input(&self.path, &["write-tree"], None, &env)?;
        let commit = git(&self.path, &["commit-tree", &tree, "-m", "Initial commit"])?;
        git(&self.path, &["update-ref", &format!("refs/heads/task/{id}"), &commit])?;
        let mut gold = git(&self.path, &["diff", "--no-color", "--no-ext-diff", &commit, &self.base_commit])?;
        gold.push('\n');
        Ok((commit, gold))
    }
}

/// Why a package gave no tasks, in the fixed categories of a batch's yield report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// The release has no test files (common for npm tarballs and wheels-only code).
    NoTestsShipped,
    /// Download, unpacking, dependency installation or the test runner itself failed.
    EnvironmentFailed,
    /// The clean tree's suite found no tests or no test passed.
    BaselineFailing,
    /// The clean tree's suite ran past its time limit.
    SuiteTooSlow,
    /// Candidates were tried (or none could be drawn) and none survived validation.
    NoSurvivingCandidates,
}

impl Failure {
    /// The snake-case name used in reports (`no_tests_shipped`, …).
    pub fn name(self) -> &'static str {
        match self {
            Failure::NoTestsShipped => "no_tests_shipped",
            Failure::EnvironmentFailed => "environment_failed",
            Failure::BaselineFailing => "baseline_failing",
            Failure::SuiteTooSlow => "suite_too_slow",
            Failure::NoSurvivingCandidates => "no_surviving_candidates",
        }
    }
}

/// An error of one stage of [`synthesize`], with its [`Failure`] category (its message is
/// the underlying error's).
#[derive(Debug)]
pub struct StageError {
    /// The category.
    pub failure: Failure,
    /// What went wrong.
    pub error: anyhow::Error,
}

impl std::fmt::Display for StageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.error)
    }
}

impl std::error::Error for StageError {}

fn stage(failure: Failure) -> impl FnOnce(anyhow::Error) -> anyhow::Error {
    move |error| anyhow::Error::new(StageError { failure, error })
}

/// The [`Failure`] category of an error [`synthesize`] returned (`EnvironmentFailed` for an
/// error of no stage, such as a sandbox or disk failure).
pub fn failure_of(e: &anyhow::Error) -> Failure {
    e.downcast_ref::<StageError>().map_or(Failure::EnvironmentFailed, |s| s.failure)
}

/// Everything `synthesize` needs.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// Where the code comes from.
    pub source: Source,
    /// Output directory (tasks.jsonl, tasks.git, candidates.jsonl, work/, env/).
    pub out: PathBuf,
    /// Candidate generation.
    pub gen: GenOptions,
    /// Parallel validation workers.
    pub workers: usize,
    /// Stop after this many accepted tasks (`None`: validate every candidate).
    pub max_tasks: Option<usize>,
    /// Combine this many validated bugs of one file into harder tasks (0 or 1: off).
    pub combine: usize,
    /// Cap on combination candidates.
    pub max_combos: usize,
    /// Lower bound of the per-run timeout (the timeout is max(this, 3 × reference time)).
    pub min_timeout: Duration,
    /// Largest share of the run tests a bug may fail.
    pub max_f2p_fraction: f64,
    /// Sandbox mode.
    pub isolation: Isolation,
    /// Python interpreter to use as is.
    pub python: Option<PathBuf>,
    /// Also write Harbor task directories here.
    pub harbor: Option<PathBuf>,
    /// Write issue text with this model (shared by all workers); `None`: the template.
    pub issue_model: Option<Arc<IssueModel>>,
}

impl SynthOptions {
    /// Checks the settings without side effects. Errors name a field by its `frognano synth`
    /// flag (the field's name in kebab case).
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.max_f2p_fraction > 0.0 && self.max_f2p_fraction <= 1.0,
            "--max-f2p-fraction must be in (0, 1]"
        );
        Ok(())
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SynthSummary {
    /// Candidates validated in this run.
    pub candidates_tried: usize,
    /// Tasks accepted in this run.
    pub tasks_accepted: usize,
    /// Candidates skipped because an earlier run decided them.
    pub resumed_skipped: usize,
    /// Rejections by reason.
    pub rejections: BTreeMap<String, usize>,
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
    /// Seconds spent inside test runs (all workers summed).
    pub test_seconds: f64,
    /// The reference suite time.
    pub reference_seconds: f64,
    /// Candidates that had a first pass over the tests importing the mutated module.
    pub first_pass_runs: usize,
    /// Candidates the first pass rejected (no full-suite run).
    pub first_pass_rejections: usize,
    /// Path of the instances file.
    pub tasks_path: PathBuf,
}

fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    if to.exists() {
        std::fs::remove_dir_all(to)?;
    }
    let out = std::process::Command::new("cp").arg("-a").arg(from).arg(to).output()?;
    anyhow::ensure!(
        out.status.success(),
        "copying {} failed: {}",
        from.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn append_jsonl(path: &Path, value: &Value) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    writeln!(f, "{}", serde_json::to_string(value)?)?;
    Ok(())
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn slug(repo_name: &str) -> String {
    repo_name.replace('/', "__")
}

struct Shared<'a> {
    intake: &'a IntakeRepo,
    setup: &'a TestSetup,
    base: &'a Baseline,
    clean: &'a HashMap<String, String>,
    task_repo: &'a TaskRepo,
    base_tree: &'a Path,
    timeout: Duration,
    opts: &'a SynthOptions,
    out_lock: Mutex<()>,
    environment: Value,
    /// The environment's rebuild record (`frognano_swe::env_record`), for Python virtualenvs.
    rebuild: Option<Value>,
    first_pass: Option<FirstPass>,
    deadline: Option<Instant>,
    accepted: AtomicUsize,
    summary: Mutex<SynthSummary>,
    accepted_tasks: Mutex<Vec<(Candidate, String, Vec<String>)>>,
}

fn candidate_family(c: &Candidate) -> &'static str {
    if c.parents.is_empty() {
        "procedural"
    } else {
        "combine"
    }
}

fn instance_id(repo_name: &str, c: &Candidate) -> String {
    let kind = if c.parents.is_empty() {
        c.operators[0].strategy().to_string()
    } else {
        format!("combine_{}", c.parents.len())
    };
    format!("{}.{}__{}", slug(repo_name), kind, c.key)
}

fn lines_changed(diff: &str) -> usize {
    diff.lines()
        .filter(|l| (l.starts_with('+') && !l.starts_with("+++")) || (l.starts_with('-') && !l.starts_with("---")))
        .count()
}

/// Reverses a unified diff produced by git (swaps `-`/`+` lines and the a/b sides).
fn reverse_diff(diff: &str) -> String {
    let mut out = String::new();
    for line in diff.lines() {
        let l = if let Some(r) = line.strip_prefix("--- ") {
            format!("+++ {r}")
        } else if let Some(r) = line.strip_prefix("+++ ") {
            format!("--- {r}")
        } else if let Some(r) = line.strip_prefix('-') {
            format!("+{r}")
        } else if let Some(r) = line.strip_prefix('+') {
            format!("-{r}")
        } else {
            line.to_string()
        };
        out.push_str(&l);
        out.push('\n');
    }
    out
}

fn build_instance(sh: &Shared<'_>, cand: &Candidate, v: &Validated) -> anyhow::Result<SweInstance> {
    let id = instance_id(&sh.intake.repo_name, cand);
    let mut buggy = BTreeMap::new();
    for fm in &cand.files {
        let orig = &sh.clean[&fm.path];
        buggy.insert(
            fm.path.clone(),
            apply_edits(orig, &fm.edits).ok_or_else(|| anyhow::anyhow!("edits do not apply"))?,
        );
    }
    let (commit, gold) = sh.task_repo.commit_task(&id, &buggy)?;
    let bug_diff = reverse_diff(&gold);
    let operators: Vec<String> = cand.operators.iter().map(|o| o.strategy().to_string()).collect();
    let entity_names: Vec<String> =
        cand.entities.iter().map(|e| e.rsplit("::").next().unwrap_or(e).to_string()).collect();
    let ctx = IssueContext {
        runner: sh.setup.runner,
        bug_log: &v.bug_log,
        fail_to_pass: &v.fail_to_pass,
        pass_to_pass: &v.pass_to_pass,
        tree: sh.base_tree,
        bug_diff: &bug_diff,
        entities: &entity_names,
        operators: &operators,
    };
    let template = template_issue(&ctx);
    let issue = match &sh.opts.issue_model {
        Some(m) => m.write(&ctx, &template),
        None => IssueOutcome::template(template),
    };
    let problem_statement = issue.text;
    let files: BTreeSet<&str> = cand.files.iter().map(|f| f.path.as_str()).collect();
    let mut extra = serde_json::Map::new();
    if !sh.setup.readable_paths.is_empty() {
        extra.insert(frognano_swe::executor::READABLE_PATHS_KEY.into(), json!(sh.setup.readable_paths));
    }
    if let Some(rec) = &sh.rebuild {
        extra.insert(frognano_swe::env_record::ENVIRONMENT_KEY.into(), rec.clone());
    }
    let meta = SynthMeta {
        source_repo: sh.intake.repo_name.clone(),
        source_commit: sh.intake.commit.clone(),
        family: candidate_family(cand).to_string(),
        operators,
        seed: cand.seed,
        candidate_key: cand.key.clone(),
        parents: cand.parents.clone(),
        entities: cand.entities.clone(),
        mutations: cand.files.clone(),
        difficulty: Difficulty {
            num_mutations: cand.operators.len(),
            files: files.len(),
            f2p_count: v.fail_to_pass.len(),
            p2p_count: v.pass_to_pass.len(),
            entity_complexity: cand.complexity,
            lines_changed: lines_changed(&gold),
            strong_operators: cand.operators.iter().filter(|o| o.is_strong()).count(),
        },
        validation: ValidationTimes { reference_seconds: sh.base.seconds, bug_seconds: v.bug_seconds },
        issue: issue.record,
        environment: sh.environment.clone(),
    };
    extra.insert(SYNTH_FIELD.into(), meta.to_value());
    Ok(SweInstance {
        instance_id: id,
        repo: sh.intake.repo_name.clone(),
        base_commit: commit,
        patch: gold,
        test_patch: String::new(),
        problem_statement,
        hints_text: String::new(),
        created_at: String::new(),
        version: "synth".into(),
        fail_to_pass: v.fail_to_pass.clone(),
        pass_to_pass: v.pass_to_pass.clone(),
        environment_setup_commit: sh.intake.commit.clone(),
        image: None,
        eval_script: None,
        log_parser: Some(sh.setup.log_parser.clone()),
        eval_type: Some("pass_and_fail".into()),
        repo_path: Some(sh.task_repo.path.to_string_lossy().to_string()),
        test_cmd: Some(sh.setup.test_cmd.clone()),
        setup_commands: Vec::new(),
        verification: frognano_swe::Verification::SweBench,
        extra,
    })
}

/// What validating one candidate gave: the verdict, what its first pass did, and how long it
/// took. A worker on a cluster answers with this ([`crate::remote`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CandidateVerdict {
    /// Validated, or why not.
    pub result: Result<Validated, Rejection>,
    /// The first pass, when there was one.
    pub first_pass: Option<FirstPassRun>,
    /// Wall-clock seconds of the validation.
    pub seconds: f64,
}

/// Whether a candidate should still be validated now: not once `max_tasks` are accepted,
/// not past the time budget (left undecided, not recorded, so a later run tries it).
fn wanted(sh: &Shared<'_>) -> bool {
    sh.opts.max_tasks.is_none_or(|m| sh.accepted.load(Ordering::SeqCst) < m)
        && sh.deadline.is_none_or(|d| Instant::now() < d)
}

fn validation_env<'a>(sh: &'a Shared<'_>) -> ValidationEnv<'a> {
    ValidationEnv {
        setup: sh.setup,
        base: sh.base,
        timeout: sh.timeout,
        isolation: sh.opts.isolation,
        max_f2p_fraction: sh.opts.max_f2p_fraction,
        first_pass: sh.first_pass.as_ref(),
    }
}

fn process(sh: &Shared<'_>, worker_dir: &Path, cand: &Candidate) -> anyhow::Result<()> {
    if !wanted(sh) {
        return Ok(());
    }
    let t0 = Instant::now();
    let (result, first_pass) = validate_counted(worker_dir, sh.clean, cand, validation_env(sh))?;
    record(sh, cand, CandidateVerdict { result, first_pass, seconds: t0.elapsed().as_secs_f64() })
}

/// Writes what `verdict` says about `cand`: the task (tasks.jsonl, the task repository,
/// Harbor) when it is accepted, and its line in candidates.jsonl either way. Local workers
/// and the answers of a cluster's workers both end here, so both write the same files.
fn record(sh: &Shared<'_>, cand: &Candidate, verdict: CandidateVerdict) -> anyhow::Result<()> {
    let CandidateVerdict { result: res, first_pass: pass_run, seconds: spent } = verdict;
    let _guard = sh.out_lock.lock().expect("output lock");
    {
        let mut s = sh.summary.lock().expect("summary lock");
        s.candidates_tried += 1;
        s.test_seconds += spent;
        if let Some(p) = &pass_run {
            s.first_pass_runs += 1;
            s.first_pass_rejections += usize::from(p.rejected);
        }
    }
    let mut record = match res {
        Ok(v) => {
            if sh.opts.max_tasks.is_some_and(|m| sh.accepted.load(Ordering::SeqCst) >= m) {
                return Ok(());
            }
            let inst = build_instance(sh, cand, &v)?;
            append_jsonl(&sh.opts.out.join("tasks.jsonl"), &inst.to_json())?;
            if let Some(h) = &sh.opts.harbor {
                crate::harbor::write_harbor_task(h, &inst)?;
            }
            sh.accepted.fetch_add(1, Ordering::SeqCst);
            sh.summary.lock().expect("summary lock").tasks_accepted += 1;
            sh.accepted_tasks.lock().expect("tasks lock").push((
                cand.clone(),
                inst.instance_id.clone(),
                v.fail_to_pass.clone(),
            ));
            json!({"key": cand.key, "outcome": "accepted", "instance_id": inst.instance_id})
        }
        Err(r) => {
            let reason = serde_json::to_value(&r)?;
            let name = reason["reason"].as_str().unwrap_or("rejected").to_string();
            *sh.summary.lock().expect("summary lock").rejections.entry(name).or_default() += 1;
            json!({"key": cand.key, "outcome": "rejected", "rejection": reason, "operators": cand.operators})
        }
    };
    record["seconds"] = json!((spent * 1000.0).round() / 1000.0);
    if let Some(p) = pass_run {
        record["first_pass"] = serde_json::to_value(p)?;
    }
    append_jsonl(&sh.opts.out.join("candidates.jsonl"), &record)?;
    Ok(())
}

/// Combinations of `k` validated bugs of the same file whose edits do not overlap, in a
/// deterministic order, at most `max` of them.
pub fn combine_candidates(commit: &str, singles: &[(Candidate, String)], k: usize, max: usize) -> Vec<Candidate> {
    let mut by_file: BTreeMap<&str, Vec<&(Candidate, String)>> = BTreeMap::new();
    for s in singles {
        if s.0.files.len() == 1 && s.0.parents.is_empty() {
            by_file.entry(s.0.files[0].path.as_str()).or_default().push(s);
        }
    }
    let mut out = Vec::new();
    for (path, mut group) in by_file {
        group.sort_by(|a, b| a.1.cmp(&b.1));
        // Greedy windows over the sorted group: pick the next k mutually disjoint bugs.
        for start in 0..group.len() {
            let mut chosen: Vec<&(Candidate, String)> = vec![group[start]];
            for other in &group[start + 1..] {
                if chosen.len() == k {
                    break;
                }
                if chosen.iter().all(|c| !edits_overlap(&c.0.files[0].edits, &other.0.files[0].edits)) {
                    chosen.push(other);
                }
            }
            if chosen.len() < k {
                continue;
            }
            let edits: Vec<Edit> = chosen.iter().flat_map(|c| c.0.files[0].edits.clone()).collect();
            let files = vec![FileMutation { path: path.to_string(), edits }];
            out.push(Candidate {
                key: candidate_key(commit, &files),
                files,
                operators: chosen.iter().flat_map(|c| c.0.operators.clone()).collect(),
                entities: chosen.iter().flat_map(|c| c.0.entities.clone()).collect(),
                complexity: chosen.iter().map(|c| c.0.complexity).max().unwrap_or(0),
                seed: chosen[0].0.seed,
                parents: chosen.iter().map(|c| c.1.clone()).collect(),
            });
            if out.len() >= max {
                return out;
            }
        }
    }
    out
}

fn run_batch(sh: &Shared<'_>, workers: &[PathBuf], cands: &[Candidate], progress: &dyn Progress) -> anyhow::Result<()> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(workers.len()).build()?;
    let free: Mutex<Vec<PathBuf>> = Mutex::new(workers.to_vec());
    let first_error: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    pool.scope(|s| {
        for cand in cands {
            let (free, first_error) = (&free, &first_error);
            s.spawn(move |_| {
                if first_error.lock().expect("error lock").is_some() {
                    return;
                }
                let dir = free.lock().expect("worker lock").pop().expect("one worker dir per thread");
                if let Err(e) = process(sh, &dir, cand) {
                    first_error.lock().expect("error lock").get_or_insert(e.context(format!("candidate {}", cand.key)));
                }
                free.lock().expect("worker lock").push(dir);
                progress.inc(1);
            });
        }
    });
    match first_error.into_inner().expect("error lock") {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What a cluster worker needs to validate candidates, written once per run to
/// [`VALIDATION_CONTEXT_FILE`] under the run's `work/` folder (on a path every node sees)
/// instead of with every unit.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ValidationContext {
    /// The clean tree (with its environment prepared), copied by the worker per candidate.
    pub base_tree: PathBuf,
    /// Test command and parser.
    pub setup: TestSetup,
    /// The clean tree's reference.
    pub baseline: Baseline,
    /// The first pass's map, when first passes are on.
    pub first_pass: Option<FirstPass>,
    /// Per-run timeout, seconds.
    pub timeout_s: f64,
    /// Run the tests unconfined.
    pub unconfined: bool,
    /// Largest share of the run tests a bug may fail.
    pub max_f2p_fraction: f64,
}

/// File name of the [`ValidationContext`] of a run (under `OUT/work/`).
pub const VALIDATION_CONTEXT_FILE: &str = "validation-context.json";

/// Validates `cands` as units of `runner` (one candidate each) and records every answer here
/// exactly as [`run_batch`] records a local worker's verdict. With `max_tasks`, candidates go
/// out in waves of `4 × workers` so that a cluster does not validate far past the cap. A unit
/// that fails (its worker errs, or the cluster gives up on it) is left undecided: nothing is
/// recorded for it and the run ends with an error naming it, after recording the others; a
/// rerun of the same command validates it (and only the undecided ones).
fn run_remote(
    sh: &Shared<'_>,
    runner: &dyn UnitRunner,
    cands: &[Candidate],
    progress: &dyn Progress,
) -> anyhow::Result<()> {
    if cands.is_empty() {
        return Ok(());
    }
    let work = sh.base_tree.parent().expect("the base tree lies under work/");
    let context_path = work.join(VALIDATION_CONTEXT_FILE);
    let context = ValidationContext {
        base_tree: sh.base_tree.to_path_buf(),
        setup: sh.setup.clone(),
        baseline: sh.base.clone(),
        first_pass: sh.first_pass.clone(),
        timeout_s: sh.timeout.as_secs_f64(),
        unconfined: sh.opts.isolation == Isolation::Unconfined,
        max_f2p_fraction: sh.opts.max_f2p_fraction,
    };
    std::fs::write(&context_path, serde_json::to_string(&context)?)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", context_path.display()))?;
    let wave = if sh.opts.max_tasks.is_some() { 4 * sh.opts.workers.max(1) } else { cands.len() };
    let placements = sh.opts.out.join("placements.jsonl");
    let mut failed: Vec<String> = Vec::new();
    let mut first_error: Option<anyhow::Error> = None;
    for chunk in cands.chunks(wave) {
        if !wanted(sh) || first_error.is_some() {
            break;
        }
        let units: Vec<Value> = chunk
            .iter()
            .map(|c| json!({"kind": "synth_candidate", "label": c.key, "context": context_path, "candidate": c}))
            .collect();
        let res = runner.run_units(&units, progress, &mut |i, answer| {
            let cand = &chunk[i];
            let mut row = json!({"key": cand.key});
            if let Value::Object(m) = answer.placement {
                row.as_object_mut().expect("an object").extend(m);
            }
            if let Err(e) = append_jsonl(&placements, &row) {
                progress.println(&format!("warning: {e}"));
            }
            let verdict = answer.outcome.map_err(anyhow::Error::msg).and_then(|v| {
                serde_json::from_value::<CandidateVerdict>(v)
                    .map_err(|e| anyhow::anyhow!("unreadable answer for candidate {}: {e}", cand.key))
            });
            match verdict {
                Ok(v) => {
                    if let Err(e) = record(sh, cand, v) {
                        first_error.get_or_insert(e.context(format!("candidate {}", cand.key)));
                    }
                }
                Err(e) => {
                    progress.println(&format!("candidate {} failed on the cluster: {e:#}", cand.key));
                    failed.push(format!("{} ({e:#})", cand.key));
                }
            }
            progress.inc(1);
        });
        if let Some(e) = first_error.take() {
            return Err(e);
        }
        res?;
    }
    if !failed.is_empty() {
        anyhow::bail!(
            "{} candidate(s) failed on the cluster and are not recorded (rerun the same command to validate them): {}",
            failed.len(),
            failed.join("; ")
        );
    }
    Ok(())
}

/// A cluster worker's side of one `synth_candidate` unit: copies the clean tree the unit's
/// context names into a private folder, validates the candidate there, and answers with the
/// [`CandidateVerdict`].
pub fn validate_unit(unit: &Value) -> anyhow::Result<Value> {
    let path = unit["context"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("unit field `context`: expected the path of {VALIDATION_CONTEXT_FILE}"))?;
    let text = std::fs::read_to_string(path).map_err(|e| {
        anyhow::anyhow!("cannot read {path} ({e}): the synth --out folder must be on a path every node sees")
    })?;
    let ctx: ValidationContext = serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
    let cand: Candidate = serde_json::from_value(unit["candidate"].clone())
        .map_err(|e| anyhow::anyhow!("unit field `candidate`: {e}"))?;
    let tmp = tempfile::Builder::new().prefix("frognano-synth-unit").tempdir()?;
    let tree = tmp.path().join("tree");
    copy_tree(&ctx.base_tree, &tree)?;
    let mut clean = HashMap::new();
    for f in &cand.files {
        // A file the clean tree lacks stays out of `clean`: validation rejects the candidate
        // (edits do not apply), as it does locally.
        if let Ok(text) = std::fs::read_to_string(tree.join(&f.path)) {
            clean.insert(f.path.clone(), text);
        }
    }
    let env = ValidationEnv {
        setup: &ctx.setup,
        base: &ctx.baseline,
        timeout: Duration::from_secs_f64(ctx.timeout_s),
        isolation: if ctx.unconfined { Isolation::Unconfined } else { Isolation::Bubblewrap },
        max_f2p_fraction: ctx.max_f2p_fraction,
        first_pass: ctx.first_pass.as_ref(),
    };
    let t0 = Instant::now();
    let (result, first_pass) = validate_counted(&tree, &clean, &cand, env)?;
    let verdict = CandidateVerdict { result, first_pass, seconds: t0.elapsed().as_secs_f64() };
    Ok(serde_json::to_value(verdict)?)
}

/// Runs the whole pipeline; appends to `out/tasks.jsonl` and skips candidates an earlier
/// run already decided (resume).
pub fn synthesize(opts: &SynthOptions) -> anyhow::Result<SynthSummary> {
    synthesize_with_progress(opts, &NoProgress)
}

/// [`synthesize`], reporting each validated candidate to `progress`.
pub fn synthesize_with_progress(opts: &SynthOptions, progress: &dyn Progress) -> anyhow::Result<SynthSummary> {
    synthesize_until(opts, progress, &RunLimits::default())
}

/// Whether candidates get the cheap first pass ([`crate::first_pass`]): on unless the
/// environment variable `FROGNANO_SYNTH_FIRST_PASS` is `0` (for measuring what it saves).
pub fn first_pass_enabled() -> bool {
    std::env::var("FROGNANO_SYNTH_FIRST_PASS").map_or(true, |v| v != "0")
}

/// The task's environment record ([`project::environment_record`]), plus, for a Go module
/// taken from Debian, the package and exact version its code came from (`debian_source`).
fn environment_record(setup: &project::TestSetup, env_dir: &Path, intake: &intake::IntakeRepo) -> Value {
    let mut rec = project::environment_record(setup, env_dir);
    if let Some(package) = &intake.debian_package {
        rec["debian_source"] = json!(package);
    }
    rec
}

/// Limits of one [`synthesize_until`] run (a batch's per-package budget).
#[derive(Debug, Clone, Copy, Default)]
pub struct RunLimits {
    /// No new candidate is validated after this instant; the ones left are not recorded,
    /// so a rerun continues with them.
    pub deadline: Option<Instant>,
    /// Time limit of each clean-tree reference run (default max(`min_timeout`, 600 s)); a
    /// suite slower than this is [`Failure::SuiteTooSlow`].
    pub suite_limit: Option<Duration>,
}

/// [`synthesize_with_progress`] under `limits`. Errors carry their [`Failure`] category
/// ([`failure_of`]).
pub fn synthesize_until(
    opts: &SynthOptions,
    progress: &dyn Progress,
    limits: &RunLimits,
) -> anyhow::Result<SynthSummary> {
    synthesize_at(opts, progress, limits, None)
}

/// [`synthesize_until`] with the candidates validated by `runner` (one unit per candidate, on
/// a Ray cluster: `frognano synth … --ray`) instead of local workers. Intake, environment,
/// baseline and the recording of every verdict stay in this process; `opts.out` must be on a
/// path the cluster's nodes see (they copy its clean tree and run its environment).
pub fn synthesize_at(
    opts: &SynthOptions,
    progress: &dyn Progress,
    limits: &RunLimits,
    runner: Option<&dyn UnitRunner>,
) -> anyhow::Result<SynthSummary> {
    opts.validate()?;
    let started = Instant::now();
    std::fs::create_dir_all(&opts.out)?;
    let out = opts.out.canonicalize()?;
    let work = out.join("work");
    std::fs::create_dir_all(&work)?;
    let intake = intake::intake(&opts.source, &work).map_err(stage(Failure::EnvironmentFailed))?;
    let base_tree = work.join("base");
    if base_tree.exists() {
        std::fs::remove_dir_all(&base_tree)?;
    }
    intake::export_tree(&intake.git_dir, &intake.commit, &base_tree)?;
    let env_opts = EnvOptions {
        python: opts.python.clone(),
        env_dir: out.join("env"),
        released: intake.released.clone(),
        dependencies: intake.dependency_source(),
    };
    let mut setup = project::prepare(&base_tree, &env_opts).map_err(|e| {
        let no_tests = e.downcast_ref::<project::NoTests>().is_some();
        stage(if no_tests { Failure::NoTestsShipped } else { Failure::EnvironmentFailed })(e)
    })?;
    let lang = setup.language.ok_or_else(|| {
        stage(Failure::EnvironmentFailed)(anyhow::anyhow!(
            "{}: {:?} projects have tests but no bug operators yet",
            intake.repo_name,
            setup.runner
        ))
    })?;
    let probe_timeout = limits.suite_limit.unwrap_or_else(|| opts.min_timeout.max(Duration::from_secs(600)));
    let mut reference = project::baseline(&base_tree, &setup, probe_timeout, opts.isolation);
    // Modules the failing output says are missing are installed (with the same cutoffs) and
    // the baseline is run again, before the ladder changes anything else.
    let missing = reference.as_ref().err().and_then(|e| e.downcast_ref::<project::BaselineFailed>());
    if let Some(dists) = missing.map(|b| b.missing_modules.clone()).filter(|d| !d.is_empty()) {
        match project::install_missing(&setup, &dists) {
            Ok(()) => {
                tracing::info!("baseline failed on missing modules; installed {dists:?}");
                reference = project::baseline(&base_tree, &setup, probe_timeout, opts.isolation);
            }
            Err(e) => tracing::warn!("installing {dists:?}, which the tests import, failed: {e:#}"),
        }
    }
    // A Python suite that fails on the clean tree (not one that is too slow) is retried down
    // the ladder: older pytest majors, unittest, the project's tox/nox command; the first
    // that passes is kept.
    if reference.as_ref().is_err_and(|e| e.downcast_ref::<project::SuiteTooSlow>().is_none()) {
        for step in project::python_ladder(&setup, &base_tree) {
            tracing::info!("baseline failed; retrying with {step:?}");
            let Ok(next) = project::apply_ladder_step(&setup, step, &base_tree, &env_opts) else { continue };
            if let Ok(b) = project::baseline(&base_tree, &next, probe_timeout, opts.isolation) {
                setup = next;
                reference = Ok(b);
                break;
            }
        }
    }
    let base = reference.map_err(|e| {
        let slow = e.downcast_ref::<project::SuiteTooSlow>().is_some();
        stage(if slow { Failure::SuiteTooSlow } else { Failure::BaselineFailing })(e)
    })?;
    let timeout = opts.min_timeout.max(Duration::from_secs_f64(3.0 * base.seconds));
    tracing::info!(
        "baseline: {} passing, {} flaky, {} not passing",
        base.passing.len(),
        base.flaky.len(),
        base.not_passing.len()
    );

    let cands = generate_candidates(&intake.git_dir, &intake.commit, lang, &opts.gen)?;
    if cands.is_empty() {
        return Err(stage(Failure::NoSurvivingCandidates)(anyhow::anyhow!(
            "{}: no bug candidates: no function reaches complexity {} (lower --min-complexity)",
            intake.repo_name,
            opts.gen.min_complexity
        )));
    }
    // With a task target, small projects run out of candidates before reaching it; the next
    // rounds are drawn up front (so their clean files are read with the first round's) and
    // validated only if the first round falls short.
    let more = match opts.max_tasks {
        Some(_) => more_candidates(&intake.git_dir, &intake.commit, lang, &opts.gen, &cands)?,
        None => Vec::new(),
    };
    let done: HashSet<String> = read_jsonl(&out.join("candidates.jsonl"))
        .iter()
        .filter_map(|v| v["key"].as_str().map(str::to_string))
        .collect();
    let mut clean = HashMap::new();
    for c in cands.iter().chain(&more) {
        for f in &c.files {
            if !clean.contains_key(&f.path) {
                clean.insert(f.path.clone(), intake::read_file_at(&intake.git_dir, &intake.commit, &f.path)?);
            }
        }
    }
    let task_repo = TaskRepo::open(&out.join("tasks.git"), &intake.git_dir, &intake.commit)?;
    // A cluster's workers copy the clean tree themselves.
    let n_workers = if runner.is_some() { 0 } else { opts.workers.max(1) };
    let mut workers = Vec::new();
    for i in 0..n_workers {
        let d = work.join(format!("w{i}"));
        copy_tree(&base_tree, &d)?;
        workers.push(d);
    }
    let previously_accepted = read_jsonl(&out.join("tasks.jsonl")).len();
    let sh = Shared {
        intake: &intake,
        setup: &setup,
        base: &base,
        clean: &clean,
        task_repo: &task_repo,
        base_tree: &base_tree,
        timeout,
        opts,
        out_lock: Mutex::new(()),
        environment: environment_record(&setup, &out.join("env"), &intake),
        rebuild: project::rebuild_record(&setup, &base_tree)
            .map_err(|e| tracing::warn!("tasks will name their environment by path only: {e:#}"))
            .ok()
            .flatten()
            .map(|r| r.to_value()),
        first_pass: first_pass_enabled()
            .then(|| FirstPass::build(&base_tree, &project::walk_files(&base_tree), &setup, &base.passing))
            .flatten(),
        deadline: limits.deadline,
        accepted: AtomicUsize::new(previously_accepted),
        summary: Mutex::new(SynthSummary {
            reference_seconds: base.seconds,
            tasks_path: out.join("tasks.jsonl"),
            ..Default::default()
        }),
        accepted_tasks: Mutex::new(Vec::new()),
    };
    // One round of candidates: those an earlier run decided are skipped, the rest validated
    // here or on the cluster.
    let validate = |round: &[Candidate], label: &str| -> anyhow::Result<()> {
        let todo: Vec<Candidate> = round.iter().filter(|c| !done.contains(&c.key)).cloned().collect();
        sh.summary.lock().expect("summary lock").resumed_skipped += round.len() - todo.len();
        progress.start(label, todo.len() as u64, 0);
        match runner {
            Some(r) => run_remote(&sh, r, &todo, progress),
            None => run_batch(&sh, &workers, &todo, progress),
        }
    };
    validate(&cands, "synth")?;
    if !more.is_empty() && wanted(&sh) {
        tracing::info!(
            "{} tasks after the first {} candidates; {} more at complexity ≥ {}, new seeds",
            sh.accepted.load(Ordering::SeqCst),
            cands.len(),
            more.len(),
            SMALL_PROJECT_MIN_COMPLEXITY
        );
        validate(&more, "synth (more candidates)")?;
    }

    if opts.combine >= 2 {
        // Combine every validated single bug, from this run and earlier ones.
        let mut singles: Vec<(Candidate, String)> = Vec::new();
        for inst in read_jsonl(&out.join("tasks.jsonl")) {
            // A record that does not parse (hand-edited, or from another tool) is no parent.
            let Ok(meta) = SynthMeta::from_value(&inst[SYNTH_FIELD]) else { continue };
            if meta.family != "procedural" {
                continue;
            }
            let cand = Candidate {
                operators: meta.operator_ids(),
                key: meta.candidate_key,
                files: meta.mutations,
                entities: meta.entities,
                complexity: meta.difficulty.entity_complexity,
                seed: meta.seed,
                parents: vec![],
            };
            singles.push((cand, inst["instance_id"].as_str().unwrap_or_default().to_string()));
        }
        let combos: Vec<Candidate> = combine_candidates(&intake.commit, &singles, opts.combine, opts.max_combos)
            .into_iter()
            .filter(|c| !done.contains(&c.key))
            .collect();
        for c in &combos {
            for f in &c.files {
                anyhow::ensure!(clean.contains_key(&f.path), "combination over unknown file {}", f.path);
            }
        }
        progress.add_total(combos.len() as u64);
        match runner {
            Some(r) => run_remote(&sh, r, &combos, progress)?,
            None => run_batch(&sh, &workers, &combos, progress)?,
        }
    }
    progress.finish();
    for w in &workers {
        std::fs::remove_dir_all(w).ok();
    }
    let mut summary = sh.summary.into_inner().expect("summary lock");
    summary.seconds = started.elapsed().as_secs_f64();
    std::fs::write(out.join("summary.json"), serde_json::to_string_pretty(&summary)?)?;
    Ok(summary)
}

#[cfg(test)]
mod classify_tests {
    use super::*;

    fn base(passing: &[&str]) -> Baseline {
        Baseline {
            passing: passing.iter().map(|s| s.to_string()).collect(),
            flaky: BTreeSet::new(),
            not_passing: BTreeSet::new(),
            seconds: 1.0,
        }
    }

    fn run(statuses: &[(&str, &str)]) -> TestRun {
        let mut map = frognano_swe::StatusMap::new();
        for (t, s) in statuses {
            map.insert(t.to_string(), s.to_string());
        }
        TestRun { statuses: map, log: String::new(), timed_out: false, seconds: 1.0 }
    }

    #[test]
    fn absent_tests_fail_only_beside_a_test_that_failed_outright() {
        let b = base(&["a", "b", "c", "d", "e", "f"]);
        // The process died in `b`: `c` never ran. Both are fail-to-pass.
        let died = run(&[("a", "PASSED"), ("b", "FAILED"), ("d", "PASSED"), ("e", "PASSED"), ("f", "PASSED")]);
        let (f2p, p2p) = classify(&died, &b, 0.5).unwrap();
        assert_eq!(f2p, ["b", "c"]);
        assert_eq!(p2p, ["a", "d", "e", "f"]);
        // Tests gone with nothing failing: a build or collection error, rejected as before.
        let build_failed = run(&[("a", "PASSED"), ("b", "PASSED"), ("c", "PASSED"), ("d", "PASSED")]);
        assert_eq!(classify(&build_failed, &b, 0.5), Err(Rejection::LostTests { count: 2 }));
        // Absent tests count toward the share a bug may fail.
        let most = run(&[("a", "FAILED"), ("b", "PASSED"), ("c", "PASSED")]);
        assert_eq!(classify(&most, &b, 0.5), Err(Rejection::TooBroad { failing: 4, total: 6 }));
        // Plain failures and passes are as they were.
        let plain = run(&[
            ("a", "FAILED"),
            ("b", "PASSED"),
            ("c", "PASSED"),
            ("d", "PASSED"),
            ("e", "PASSED"),
            ("f", "SKIPPED"),
        ]);
        assert_eq!(
            classify(&plain, &b, 0.5).unwrap(),
            (vec!["a".to_string()], vec!["b".into(), "c".into(), "d".into(), "e".into()])
        );
        let none = run(&[
            ("a", "PASSED"),
            ("b", "PASSED"),
            ("c", "PASSED"),
            ("d", "PASSED"),
            ("e", "PASSED"),
            ("f", "PASSED"),
        ]);
        assert_eq!(classify(&none, &b, 0.5), Err(Rejection::NoFailure));
    }
}
