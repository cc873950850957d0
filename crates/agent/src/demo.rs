//! The bundled example: a tiny Python repository whose `median()` is wrong for even-length
//! lists (one failing unit test), the issue describing it, and a recorded trajectory that
//! fixes it. `frognano solve --demo` runs the agent on it; tests replay the trajectory.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The demo repository's files (path, contents).
pub const DEMO_FILES: [(&str, &str); 3] = [
    ("README.md", include_str!("../demo/repo/README.md")),
    ("stats.py", include_str!("../demo/repo/stats.py")),
    ("test_stats.py", include_str!("../demo/repo/test_stats.py")),
];

/// The issue the agent is given.
pub const DEMO_ISSUE: &str = include_str!("../demo/ISSUE.md");

/// A recorded `leaf-function-calling` trajectory that fixes the demo bug.
pub const DEMO_TRAJECTORY: &str = include_str!("../demo/fix-median.trajectory.json");

/// The command that runs the demo's tests.
pub const DEMO_TEST_COMMAND: &str = "python3 -m unittest test_stats";

/// Writes the demo repository into `dest` (which must not exist or be empty) as a git
/// repository with one commit, and returns its path.
pub fn materialize(dest: &Path) -> anyhow::Result<PathBuf> {
    if dest.exists() && dest.read_dir()?.next().is_some() {
        bail!("{} already exists and is not empty", dest.display());
    }
    std::fs::create_dir_all(dest).with_context(|| format!("cannot create {}", dest.display()))?;
    for (name, text) in DEMO_FILES {
        std::fs::write(dest.join(name), text)?;
    }
    let steps: [&[&str]; 3] = [
        &["init", "-q"],
        &["add", "-A"],
        &["-c", "user.name=frognano", "-c", "user.email=frognano@localhost", "commit", "-q", "-m", "stats helpers"],
    ];
    for args in steps {
        let out = Command::new("git")
            .arg("-C")
            .arg(dest)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("cannot run git")?;
        if !out.status.success() {
            bail!("git {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
    }
    Ok(dest.canonicalize()?)
}
