//! Support shared by the workspace's tests: one visible, logged line for every test (or path
//! inside a test) that this machine cannot run.
//!
//! CI runs on machines of different kinds (AVX2-only and AVX-512), so a test that quietly
//! returns on one of them would test nothing there. Every such skip goes through
//! [`report_skip`], and `scripts/test.sh` summarises the log and fails on a skip that
//! `scripts/allowed-skips.txt` does not allow.

use std::io::Write;

/// The demo model ([`crate::load::DEMO_MODEL`], under the workspace root), or `None` with a
/// skip line naming `what` when it has not been fetched; with `FROGNANO_REQUIRE_FIXTURES` set
/// (CI) a missing model is a failure instead of a skip.
pub fn demo_model(what: &str) -> Option<std::path::PathBuf> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(crate::load::DEMO_MODEL);
    if path.exists() {
        return Some(path);
    }
    if std::env::var_os("FROGNANO_REQUIRE_FIXTURES").is_some() {
        panic!("{} is missing and FROGNANO_REQUIRE_FIXTURES is set: run scripts/fetch-demo-model.sh", path.display());
    }
    report_skip(&path.display().to_string(), &format!("{what} (run scripts/fetch-demo-model.sh)"));
    None
}

/// The environment variable naming the file every skip line is appended to.
pub const SKIP_LOG_ENV: &str = "FROGNANO_SKIP_LOG";

/// Reports that `name` did not run because this machine lacks `needs` (a CPU feature such as
/// `avx512vnni`, a fetched fixture, a tool): prints `SKIPPED (needs <needs>): <name>` to stderr
/// and, when [`SKIP_LOG_ENV`] names a file, appends the same line to it. Cargo captures the
/// stderr of passing tests, so the file is what makes the summary of a test run reliable.
///
/// # Panics
/// When the log file is named but cannot be appended to: a skip that nobody would see is what
/// this function exists to prevent.
pub fn report_skip(needs: &str, name: &str) {
    let line = skip_line(needs, name);
    eprint!("{line}");
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV) {
        if let Err(e) = append_line(std::path::Path::new(&path), &line) {
            panic!("cannot append to {SKIP_LOG_ENV}={}: {e}", path.to_string_lossy());
        }
    }
}

/// The line [`report_skip`] prints, newline included.
fn skip_line(needs: &str, name: &str) -> String {
    format!("SKIPPED (needs {needs}): {name}\n")
}

/// Appends `line` in one write to a file opened for appending, so that lines from tests running
/// in parallel threads and processes do not interleave.
fn append_line(path: &std::path::Path, line: &str) -> std::io::Result<()> {
    std::fs::OpenOptions::new().create(true).append(true).open(path)?.write_all(line.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_one_line_appended_to_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("skips.txt");
        append_line(&log, &skip_line("x", "earlier")).unwrap();
        append_line(&log, &skip_line("avx512vnni", "quant::x86 VNNI dots")).unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text, "SKIPPED (needs x): earlier\nSKIPPED (needs avx512vnni): quant::x86 VNNI dots\n");
        assert!(append_line(&dir.path().join("no/such/dir/log"), "x\n").is_err());
    }
}
