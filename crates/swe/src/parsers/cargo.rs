//! Port of `swebench/harness/log_parsers/rust.py::parse_log_cargo`.

use std::sync::LazyLock;

use regex::Regex;

use super::{ParseError, StatusMap};
use crate::pytext::{py_strip, PY_NONSPACE_CLASS, PY_SPACE_CLASS};

/// `test NAME ... ok|FAILED` lines of `cargo test`; `ignored` and other outcomes are dropped.
pub fn parse_cargo(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| {
        let (s, ns) = (PY_SPACE_CLASS, PY_NONSPACE_CLASS);
        Regex::new(&format!(r"^test{s}+({ns}+){s}+\.\.\.{s}+(\w+)$")).unwrap()
    });
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        if let Some(c) = LINE.captures(py_strip(line)) {
            match &c[2] {
                "ok" => {
                    map.insert(c[1].to_string(), "PASSED".into());
                }
                "FAILED" => {
                    map.insert(c[1].to_string(), "FAILED".into());
                }
                _ => {}
            }
        }
    }
    Ok(map)
}
