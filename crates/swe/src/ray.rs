//! Ray as a [`UnitRunner`]: `frognano eval … --ray ADDRESS`.
//!
//! Ray's API is Python, so the cluster side is a short Python script shipped in the binary
//! (`scaleout/ray_driver.py`, run with a Python that has `ray`: `scripts/setup-ray.sh`). This
//! module starts it, writes the units to its stdin and reads one JSON line per finished unit
//! from its stdout; every task it submits runs `frognano unit` on a cluster node. Retries
//! of lost workers and nodes are Ray's (`max_retries`); each unit is answered at most once.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::progress::Progress;
use crate::remote::{UnitAnswer, UnitRunner};

/// The driver script, as shipped in the repository.
pub const DRIVER_SCRIPT: &str = include_str!("../../../scaleout/ray_driver.py");

/// Settings of a run on a Ray cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct RayConfig {
    /// Cluster address as `ray.init` takes it (`host:port`, `ray://host:10001`, `auto`).
    pub address: String,
    /// A Python with the `ray` package (`FROGNANO_RAY_PYTHON`; default `python3`).
    pub python: PathBuf,
    /// The `frognano` the workers run when their node has this path (else `$FROGNANO_BIN`
    /// or `frognano` on the node's PATH).
    pub frognano: PathBuf,
    /// CPUs one unit declares (Ray's `num_cpus`).
    pub cpus_per_unit: f64,
    /// Memory one unit declares, in bytes (Ray's `memory`; 0: none).
    pub memory_per_unit: u64,
    /// Reruns of a unit whose worker process or node died (Ray's `max_retries`).
    pub max_retries: u32,
}

impl RayConfig {
    /// Checks the settings without side effects; errors name the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.address.trim().is_empty(), "--ray needs a cluster ADDRESS (or RAY_ADDRESS), got none");
        anyhow::ensure!(
            self.cpus_per_unit > 0.0 && self.cpus_per_unit.is_finite(),
            "--ray-cpus must be more than 0, got {}",
            self.cpus_per_unit
        );
        Ok(())
    }
}

/// Parses a memory size as `--ray-memory` takes it: bytes, or a number with `K`, `M`, `G`
/// (powers of 1024; `Ki`/`Mi`/`Gi` and a trailing `B` are accepted too).
pub fn parse_memory(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let upper = t.to_ascii_uppercase();
    let digits = upper.trim_end_matches(['B', 'I']);
    let (num, unit) = match digits.chars().last() {
        Some('K') => (&digits[..digits.len() - 1], 1u64 << 10),
        Some('M') => (&digits[..digits.len() - 1], 1 << 20),
        Some('G') => (&digits[..digits.len() - 1], 1 << 30),
        _ => (digits, 1),
    };
    let n: f64 =
        num.trim().parse().map_err(|_| format!("memory size {text:?}: expected e.g. 2G, 512M or a number of bytes"))?;
    if !(n >= 0.0 && n.is_finite()) {
        return Err(format!("memory size {text:?} must not be negative"));
    }
    Ok((n * unit as f64) as u64)
}

/// The cluster: units go out through `scaleout/ray_driver.py`.
#[derive(Debug, Clone)]
pub struct RayRunner {
    /// Settings.
    pub config: RayConfig,
}

impl UnitRunner for RayRunner {
    fn run_units(
        &self,
        units: &[Value],
        progress: &dyn Progress,
        on_done: &mut dyn FnMut(usize, UnitAnswer),
    ) -> anyhow::Result<()> {
        if units.is_empty() {
            return Ok(());
        }
        let c = &self.config;
        c.validate()?;
        let script = tempfile::Builder::new().prefix("frognano-ray-driver").suffix(".py").tempfile()?;
        std::fs::write(script.path(), DRIVER_SCRIPT)?;
        let mut child = Command::new(&c.python)
            .arg(script.path())
            .args(["--address", &c.address])
            .arg("--frognano")
            .arg(&c.frognano)
            .args(["--num-cpus", &c.cpus_per_unit.to_string()])
            .args(["--memory", &c.memory_per_unit.to_string()])
            .args(["--max-retries", &c.max_retries.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot start the Ray driver with {} ({e}); set FROGNANO_RAY_PYTHON to a Python with `ray` \
                     (scripts/setup-ray.sh makes .venv-ray)",
                    c.python.display()
                )
            })?;
        let mut stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let lines: Vec<String> =
            units.iter().enumerate().map(|(i, u)| json!({"index": i, "unit": u}).to_string()).collect();
        // Units go in on a thread of their own and errors come out on another, so that
        // neither pipe can fill up while this thread reads answers.
        let feeder = std::thread::spawn(move || -> std::io::Result<()> {
            for l in lines {
                writeln!(stdin, "{l}")?;
            }
            Ok(())
        });
        let err_reader = std::thread::spawn(move || {
            let mut tail: Vec<String> = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                tail.push(line);
                if tail.len() > 40 {
                    tail.remove(0);
                }
            }
            tail
        });
        let mut answered = vec![false; units.len()];
        let mut bad_line = None;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            let Ok(msg) = serde_json::from_str::<Value>(&line) else {
                bad_line.get_or_insert(line);
                continue;
            };
            if msg["event"] == "cluster" {
                progress.println(&format!(
                    "ray: {} node(s), {} CPU(s) at {}; {} unit(s), {} CPU each",
                    msg["nodes"],
                    msg["cpus"],
                    c.address,
                    units.len(),
                    c.cpus_per_unit
                ));
                continue;
            }
            let Some(i) = msg["index"].as_u64().map(|i| i as usize).filter(|i| *i < units.len()) else {
                bad_line.get_or_insert(line);
                continue;
            };
            // The driver prints each index once; a second answer would be a bug there, and
            // writing it would record the unit twice.
            if std::mem::replace(&mut answered[i], true) {
                progress.println(&format!("warning: ray driver answered unit {i} twice; the second is ignored"));
                continue;
            }
            let outcome = match msg.get("ok") {
                Some(answer) => Ok(answer.clone()),
                None => Err(msg["error"].as_str().unwrap_or("no answer").to_string()),
            };
            let placement = json!({
                "node": msg["node"],
                "seconds": msg["seconds"],
                "worker_seconds": msg["worker_seconds"],
            });
            on_done(i, UnitAnswer { outcome, placement });
        }
        let status = child.wait()?;
        let fed = feeder.join().expect("feeder thread");
        let tail = err_reader.join().expect("stderr thread");
        let missing = answered.iter().filter(|a| !**a).count();
        if !status.success() || missing > 0 {
            let tail: Vec<&String> = tail.iter().filter(|l| !l.trim().is_empty()).collect();
            let tail = tail[tail.len().saturating_sub(8)..].iter().map(|l| l.as_str()).collect::<Vec<_>>().join("\n  ");
            anyhow::bail!(
                "ray driver ({}) ended with {status}; {missing} of {} unit(s) got no answer and are not recorded \
                 (rerun the same command to run them){}{}:\n  {tail}",
                c.python.display(),
                units.len(),
                fed.err().map(|e| format!("; writing units failed: {e}")).unwrap_or_default(),
                bad_line.map(|l| format!("; unreadable output line {l:?}")).unwrap_or_default(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes_parse_with_units_and_bad_ones_say_what_was_expected() {
        assert_eq!(parse_memory("2G"), Ok(2 << 30));
        assert_eq!(parse_memory("512Mi"), Ok(512 << 20));
        assert_eq!(parse_memory("1.5g"), Ok(3 << 29));
        assert_eq!(parse_memory("4096"), Ok(4096));
        assert!(parse_memory("lots").unwrap_err().contains("expected e.g. 2G"));
    }

    #[test]
    fn a_missing_python_is_a_clear_error() {
        let runner = RayRunner {
            config: RayConfig {
                address: "127.0.0.1:1".into(),
                python: "/no/such/python".into(),
                frognano: "frognano".into(),
                cpus_per_unit: 1.0,
                memory_per_unit: 0,
                max_retries: 3,
            },
        };
        let err = runner
            .run_units(&[json!({})], &crate::progress::NoProgress, &mut |_, _| panic!("no answer expected"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("FROGNANO_RAY_PYTHON") && err.contains("/no/such/python"), "{err}");
    }
}
