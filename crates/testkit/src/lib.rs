//! Helpers shared by the integration tests of several crates (swe, synth, rl, serve): small git
//! repositories made on the fly, file writes, copies of checked-in fixture folders, the
//! demo model's path, this process's peak memory (for benchmark examples), and a local Ray
//! cluster ([`ray`]). Test code only; nothing here is part of FrogNano itself.

use std::path::{Path, PathBuf};
use std::process::Command;

pub mod ray;

/// Runs `git ARGS` in `dir` with a throwaway identity and no signing; panics with git's
/// stderr when it fails. Returns stdout, trimmed.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Writes `text` to `dir/rel`, creating the folders on the way.
pub fn write(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// Commits everything in `dir`; returns the new commit's hash.
pub fn commit(dir: &Path, msg: &str) -> String {
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", msg]);
    git(dir, &["rev-parse", "HEAD"])
}

/// The diff that turns the working tree's `rel` into `after` (the tree is left as it was).
pub fn diff_for(dir: &Path, rel: &str, after: &str) -> String {
    let before = std::fs::read_to_string(dir.join(rel)).ok();
    write(dir, rel, after);
    git(dir, &["add", "-N", rel]);
    let d = Command::new("git").args(["diff", "--", rel]).current_dir(dir).output().unwrap();
    match before {
        Some(b) => write(dir, rel, &b),
        None => std::fs::remove_file(dir.join(rel)).unwrap(),
    }
    git(dir, &["reset", "-q"]);
    String::from_utf8(d.stdout).unwrap()
}

/// A go-test style runner for bash projects: sources `lib.sh` and every `tests/*.t.sh`, then
/// prints `--- PASS: TestX (0.00s)` or `--- FAIL: …` for each `Test*` function, which the
/// `gotest` log parser reads.
pub const GOTEST_RUNNER: &str = "#!/bin/bash\n# go-test style runner over tests/*.t.sh\n. ./lib.sh\nfor t in tests/*.t.sh; do . \"$t\"; done\nfor f in $(declare -F | awk '{print $3}' | grep '^Test'); do\n  if $f; then echo \"--- PASS: $f (0.00s)\"; else echo \"--- FAIL: $f (0.00s)\"; fi\ndone\n";

/// A bash project in a new git repository `dir`: `lib.sh` holding `lib`, the
/// [`GOTEST_RUNNER`] as `run_tests.sh` (test command `bash run_tests.sh`), and one passing
/// test `TestTrue`, committed. Returns the commit.
pub fn bash_project(dir: &Path, lib: &str) -> String {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q"]);
    write(dir, "lib.sh", lib);
    write(dir, "run_tests.sh", GOTEST_RUNNER);
    write(dir, "tests/other.t.sh", "TestTrue() { true; }\n");
    commit(dir, "initial")
}

/// Copies a checked-in fixture folder to `to`, dropping the `.fixture` suffix that keeps its
/// files (`pyproject.toml.fixture`, …) from being taken for the repository's own.
pub fn copy_fixture_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name().to_string_lossy().replace(".fixture", ""));
        if e.path().is_dir() {
            copy_fixture_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// Whether a test may use a tool or fixture the machine is meant to provide (bubblewrap, a
/// writable cgroup, …), given its `status` (`Err` says why it is missing). Where it is
/// missing the test goes on without it: one visible `SKIPPED (needs NEEDS): CONTEXT: why`
/// line on stderr (once per process and context) and `false`; with
/// `FROGNANO_REQUIRE_FIXTURES` set (CI, after `scripts/ci-setup.sh`) a missing one is a
/// failure instead, so that what the test would have covered is not dropped silently.
pub fn available_or_skip(needs: &str, context: &str, status: Result<(), String>) -> bool {
    let Err(why) = status else { return true };
    if std::env::var_os("FROGNANO_REQUIRE_FIXTURES").is_some() {
        panic!("{context}: needs {needs}, which is missing and FROGNANO_REQUIRE_FIXTURES is set: {why} (run scripts/ci-setup.sh)");
    }
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let key = format!("{needs}\0{context}");
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !said.contains(&key) {
        frognano_model::test_support::report_skip(needs, &format!("{context}: {why}"));
        said.push(key);
    }
    false
}

/// Whether a test may use the network (package registries, Debian's archive): yes unless
/// `FROGNANO_OFFLINE=1`, which turns the test into one `SKIPPED (needs the network)` line
/// ([`available_or_skip`]; a failure under `FROGNANO_REQUIRE_FIXTURES`).
pub fn online_or_skip(context: &str) -> bool {
    let offline = std::env::var("FROGNANO_OFFLINE").is_ok_and(|v| v == "1");
    available_or_skip("the network", context, if offline { Err("FROGNANO_OFFLINE=1 is set".into()) } else { Ok(()) })
}

/// How `python3 -m unittest -v` names test method `test` of `class` (a dotted path such as
/// `tests.test_calc.CalcTest`), which is what a SWE-bench instance's test lists hold for
/// Django's parser: Python 3.11 put the qualified method name in the parentheses.
pub fn unittest_verbose_name(test: &str, class: &str) -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(int(sys.version_info >= (3, 11)))"])
        .output()
        .expect("python3 runs");
    if String::from_utf8_lossy(&out.stdout).trim() == "1" {
        format!("{test} ({class}.{test})")
    } else {
        format!("{test} ({class})")
    }
}

/// The demo model ([`frognano_model::load::DEMO_MODEL`]), or `None` with a note on stderr
/// when it has not been fetched; with `FROGNANO_REQUIRE_FIXTURES` set (CI) a missing model is
/// a failure instead of a skip.
pub fn demo_model() -> Option<PathBuf> {
    frognano_model::test_support::demo_model("a demo-model test")
}

/// A network that writes `script` whatever the prompt: after the longest tail of the history
/// that is a prefix of the script, the script's next token gets logit 30 and every other
/// token 0, so sampling at temperature 1 follows the script (a gap of 30 over a 250k
/// vocabulary leaves about 1e-8 for everything else), and a grammar that forbids its token
/// leaves a uniform choice among the allowed ones. Its cache stores the token history (one
/// value per position in an attention layer).
pub struct ScriptedLm {
    /// Logit width.
    pub vocab: usize,
    /// The reply, end of turn included.
    pub script: Vec<u32>,
}

impl frognano_model::CausalLm for ScriptedLm {
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn max_context(&self) -> usize {
        // Room for a whole agent's prompt: Codex's tools and instructions are ~10K tokens.
        65_536
    }
    fn new_cache(&self) -> frognano_model::cache::Cache {
        use frognano_model::cache::{Cache, KvType, LayerCache};
        // One f32 "key" per token holding its id (exact up to 2^24), so the history can be read back.
        Cache::new(vec![LayerCache::attention(KvType::F32, 1, 1)])
    }
    fn forward(
        &self,
        ids: &[u32],
        cache: &mut frognano_model::cache::Cache,
        all_logits: bool,
    ) -> frognano_model::Result<Vec<f32>> {
        assert!(!all_logits, "the scripted model gives the last position only");
        let frognano_model::cache::LayerCache::Attention { k, v } = &mut cache.layers[0] else {
            unreachable!("ScriptedLm's cache has one attention layer")
        };
        k.push(&ids.iter().map(|&id| id as f32).collect::<Vec<_>>());
        v.push(&vec![0.0; ids.len()]);
        cache.pos += ids.len();
        let history: Vec<u32> = k.f32_values().unwrap_or_default().iter().map(|&x| x as u32).collect();
        let done = (1..=self.script.len().min(history.len()))
            .rev()
            .find(|&m| history.ends_with(&self.script[..m]))
            .unwrap_or(0);
        let mut logits = vec![0.0f32; self.vocab];
        logits[self.script[done.min(self.script.len() - 1)] as usize] = 30.0;
        Ok(logits)
    }
}

/// This process's peak resident memory so far in KiB (`VmHWM` of `/proc/self/status`; 0 where
/// there is no such file), for the figures benchmark examples print.
pub fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
