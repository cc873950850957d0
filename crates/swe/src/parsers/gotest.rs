//! Port of `swebench/harness/log_parsers/go.py::parse_log_gotest`.

use std::sync::LazyLock;

use regex::Regex;

use super::{ParseError, StatusMap};
use crate::pytext::py_strip;

/// `--- PASS|FAIL|SKIP: Name (0.00s)` lines of `go test -v`.
pub fn parse_gotest(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^--- (PASS|FAIL|SKIP): (.+) \((.+)\)$").unwrap());
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        if let Some(c) = LINE.captures(py_strip(line)) {
            let status = match &c[1] {
                "PASS" => "PASSED",
                "FAIL" => "FAILED",
                _ => "SKIPPED",
            };
            map.insert(c[2].to_string(), status.into());
        }
    }
    Ok(map)
}
