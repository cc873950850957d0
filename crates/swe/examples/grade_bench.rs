//! Benchmark (not a test): instances graded per minute on generated fixture instances with
//! 1 and 2 workers, and the per-instance overhead apart from the test command.
//! Run: `cargo run -p frognano-swe --example grade_bench -- [N_INSTANCES]`
//! (bench/swe-grade.sh wraps it).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use frognano_sandbox::{Isolation, Sandbox};
use frognano_swe::executor::ExecOptions;
use frognano_swe::instance::{gold_predictions, parse_jsonl_instances};
use frognano_swe::runs::{grade, read_results, GradeOptions};
use serde_json::json;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=b", "-c", "user.email=b@b", "-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?} failed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(12);
    let root = tempfile::tempdir()?;
    let repo = root.path().join("repos/bench__calc");
    std::fs::create_dir_all(repo.join("tests"))?;
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("calc.py"), "def add(a, b):\n    return a - b\n")?;
    std::fs::write(repo.join("tests/__init__.py"), "")?;
    std::fs::write(
        repo.join("tests/test_calc.py"),
        "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n    def test_zero(self):\n        self.assertEqual(add(0, 0), 0)\n",
    )?;
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "base"]);
    let base = git(&repo, &["rev-parse", "HEAD"]);
    let gold = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n";
    let test_patch = "diff --git a/tests/test_calc.py b/tests/test_calc.py\n--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n@@ -5,3 +5,6 @@ class T(unittest.TestCase):\n     def test_zero(self):\n         self.assertEqual(add(0, 0), 0)\n+\n+    def test_add(self):\n+        self.assertEqual(add(2, 2), 4)\n";
    let lines: String = (0..n)
        .map(|i| {
            json!({
                "instance_id": format!("bench__calc-{i}"), "repo": "bench/calc", "base_commit": base,
                "patch": gold, "test_patch": test_patch, "log_parser": "parse_log_django",
                "test_cmd": "python3 -m unittest -v tests.test_calc",
                "FAIL_TO_PASS": [], "PASS_TO_PASS": [],
            })
            .to_string()
                + "\n"
        })
        .collect();
    let instances = parse_jsonl_instances(&lines, "bench.jsonl")?;
    let isolation = if Sandbox::bubblewrap_available().is_ok() { Isolation::Bubblewrap } else { Isolation::Unconfined };
    println!("instances: {n}, sandbox: {isolation:?}");
    for workers in [1, 2] {
        let out = root.path().join(format!("out{workers}"));
        let opts = GradeOptions {
            run_id: format!("bench{workers}"),
            output: out.clone(),
            workers,
            shard: None,
            exec: ExecOptions {
                repos: Some(root.path().join("repos")),
                timeout: Duration::from_secs(300),
                isolation,
                work_root: out.join("work"),
            },
        };
        let t = Instant::now();
        let s = grade(instances.clone(), gold_predictions(&instances), &opts)?;
        let wall = t.elapsed().as_secs_f64();
        let rows = read_results(&s.results_path);
        let total: f64 = rows.iter().filter_map(|r| r["seconds"].as_f64()).sum();
        let tests: f64 = rows.iter().filter_map(|r| r["test_seconds"].as_f64()).sum();
        println!(
            "workers {workers}: {:.1} instances/min (wall {wall:.1} s, resolved {}/{n}); per instance {:.3} s, of which eval script {:.3} s, overhead {:.3} s",
            n as f64 * 60.0 / wall,
            s.resolved,
            total / n as f64,
            tests / n as f64,
            (total - tests) / n as f64
        );
    }
    Ok(())
}
