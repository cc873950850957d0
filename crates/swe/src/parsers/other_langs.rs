//! Ports of swebench 5.0.2's C (`c.py`), Java (`java.py`), PHP (`php.py`) and Ruby
//! (`ruby.py`) log parsers.

use std::sync::LazyLock;

use regex::Regex;

use super::pyre::{group, py};
use super::xml;
use super::{ParseContext, ParseError, StatusMap};
use crate::pytext::py_strip;

const PASSED: &str = "PASSED";
const FAILED: &str = "FAILED";
const SKIPPED: &str = "SKIPPED";

/// Runs `re.match(pattern, line.strip())` over every line; `f` maps the captures to an
/// entry (or none).
fn per_stripped_line<'a>(
    log: &'a str,
    re: &Regex,
    mut f: impl FnMut(&regex::Captures<'a>) -> Option<(String, &'static str)>,
) -> StatusMap {
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        if let Some(c) = re.captures(py_strip(line)) {
            if let Some((k, v)) = f(&c) {
                map.insert(k, v.to_string());
            }
        }
    }
    map
}

/// `parse_log_redis`: `[ok]: name (12 ms)`, `[err]: name in file`, `[skip]`, `[ignore]`.
pub fn parse_redis(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| py(r"^\[(ok|err|skip|ignore)\]:\s(.+?)(?:\s\((\d+\s*m?s)\))?$"));
    static IN_FILE: LazyLock<Regex> = LazyLock::new(|| py(r"\s+in\s+\S+$"));
    Ok(per_stripped_line(log, &LINE, |c| {
        let name = group(c, 2);
        Some(match group(c, 1) {
            "ok" => (name.to_string(), PASSED),
            "err" => (IN_FILE.replace_all(name, "").into_owned(), FAILED),
            _ => (name.to_string(), SKIPPED),
        })
    }))
}

/// `parse_log_jq`: `PASS: name` / `FAIL: name`.
pub fn parse_jq(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| py(r"^\s*(PASS|FAIL):\s(.+)$"));
    Ok(per_stripped_line(log, &LINE, |c| {
        Some((group(c, 2).to_string(), if group(c, 1) == "PASS" { PASSED } else { FAILED }))
    }))
}

/// `parse_log_micropython_test`: `pass name` / `FAIL name` / `skip name`.
pub fn parse_micropython_test(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| py(r"^(pass|FAIL|skip)\s+(.+)$"));
    Ok(per_stripped_line(log, &LINE, |c| {
        let status = match group(c, 1) {
            "pass" => PASSED,
            "FAIL" => FAILED,
            _ => SKIPPED,
        };
        Some((group(c, 2).to_string(), status))
    }))
}

/// `parse_log_googletest`: `[       OK ] Suite.Name (0 ms)` / `[  FAILED  ] Suite.Name (0 ms)`.
pub fn parse_googletest(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| py(r"^.*\[\s*(OK|FAILED)\s*\]\s(.*)\s\(.*\)$"));
    Ok(per_stripped_line(log, &LINE, |c| {
        Some((group(c, 2).to_string(), if group(c, 1) == "OK" { PASSED } else { FAILED }))
    }))
}

/// `parse_log_doctest`: doctest's XML reporter (`-r=xml`); a subcase passes when all its
/// expressions succeeded. Malformed XML is an error, as `ElementTree.fromstring` raises.
pub fn parse_doctest(log: &str) -> Result<StatusMap, ParseError> {
    let mut map = StatusMap::new();
    let Some(start) = log.find("<doctest") else {
        return Ok(map);
    };
    // Python: without an end tag the slice ends at index 9 (-1 + len("</doctest>")), which
    // never holds a whole document, so ElementTree raises.
    let Some(len) = log[start..].find("</doctest>") else {
        return Err(ParseError::Crash("parse_log_doctest: ParseError: no closing </doctest>".into()));
    };
    let xml_text = &log[start..start + len + "</doctest>".len()];
    let root = xml::parse(xml_text).map_err(|e| ParseError::Crash(format!("parse_log_doctest: ParseError: {e}")))?;
    for tc in root.descendants("TestCase") {
        let tc_name = tc.attr("name").unwrap_or("None");
        for sub in tc.descendants("SubCase") {
            let name = format!("{tc_name} > {}", sub.attr("name").unwrap_or("None"));
            let passed = sub.descendants("Expression").iter().all(|e| e.attr("success") == Some("true"));
            map.insert(name, if passed { PASSED } else { FAILED }.into());
        }
    }
    Ok(map)
}

/// `parse_log_maven`: one `mvn -Dtest=NAME` per test, paired in order with `BUILD SUCCESS`
/// / `BUILD FAILURE`.
pub fn parse_maven(log: &str) -> Result<StatusMap, ParseError> {
    static NAME: LazyLock<Regex> = LazyLock::new(|| py(r"^.*-Dtest=(\S+).*$"));
    static RESULT: LazyLock<Regex> = LazyLock::new(|| py(r"^.*BUILD (SUCCESS|FAILURE)$"));
    let mut map = StatusMap::new();
    let mut pending: std::collections::VecDeque<String> = Default::default();
    let mut unmatched: std::collections::VecDeque<String> = Default::default();
    let status_of = |s: &str| if s == "SUCCESS" { PASSED } else { FAILED };
    for line in log.split('\n') {
        let s = py_strip(line);
        if let Some(c) = NAME.captures(s) {
            pending.push_back(group(&c, 1).to_string());
        }
        if let Some(c) = RESULT.captures(s) {
            match pending.pop_front() {
                Some(name) => {
                    map.insert(name, status_of(group(&c, 1)).into());
                }
                None => unmatched.push_back(group(&c, 1).to_string()),
            }
        }
    }
    while let (Some(name), Some(status)) = (pending.front().cloned(), unmatched.front().cloned()) {
        pending.pop_front();
        unmatched.pop_front();
        map.insert(name, status_of(&status).into());
    }
    Ok(map)
}

/// `parse_log_ant`: `[junit] [PASS] name` (FAIL and ERR count as failed).
pub fn parse_ant(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| py(r"^\s*\[junit\]\s+\[(PASS|FAIL|ERR)\]\s+(.*)$"));
    Ok(per_stripped_line(log, &LINE, |c| {
        Some((group(c, 2).to_string(), if group(c, 1) == "PASS" { PASSED } else { FAILED }))
    }))
}

/// `parse_log_gradle_custom`: `Class > method PASSED|FAILED`, also split over two lines.
pub fn parse_gradle_custom(log: &str) -> Result<StatusMap, ParseError> {
    static FULL: LazyLock<Regex> = LazyLock::new(|| py(r"^([^>].+)\s+(PASSED|FAILED)$"));
    static NAME: LazyLock<Regex> = LazyLock::new(|| py(r"^([^>]\S*\s+>\s+\S+)$"));
    static STATUS: LazyLock<Regex> = LazyLock::new(|| py(r"^(PASSED|FAILED)$"));
    let mut map = StatusMap::new();
    let mut pending: Option<String> = None;
    for line in log.split('\n') {
        let s = py_strip(line);
        if let Some(c) = FULL.captures(s) {
            map.insert(group(&c, 1).to_string(), group(&c, 2).to_string());
            pending = None;
            continue;
        }
        if let Some(c) = NAME.captures(s) {
            pending = Some(group(&c, 1).to_string());
            continue;
        }
        if let Some(name) = &pending {
            if let Some(c) = STATUS.captures(s) {
                map.insert(name.clone(), group(&c, 1).to_string());
                pending = None;
            }
        }
    }
    Ok(map)
}

/// `parse_log_phpunit` (`--testdox`): `Suite (Class)` headers, then `✔` / `✘` / `↩` lines.
pub fn parse_phpunit(log: &str) -> Result<StatusMap, ParseError> {
    static SUITE: LazyLock<Regex> = LazyLock::new(|| py(r"^(\w.+) \(.+\)$"));
    static TEST: LazyLock<Regex> = LazyLock::new(|| py(r"^\s*([✔✘↩])\s*(.*)$"));
    let mut map = StatusMap::new();
    let mut suite: Option<String> = None;
    for line in log.split('\n') {
        if let Some(c) = SUITE.captures(line) {
            suite = Some(group(&c, 1).to_string());
            continue;
        }
        if let Some(c) = TEST.captures(line) {
            let name = format!("{} > {}", suite.as_deref().unwrap_or("None"), group(&c, 2));
            let status = match group(&c, 1) {
                "✔" => PASSED,
                "✘" => FAILED,
                _ => SKIPPED,
            };
            map.insert(name, status.into());
        }
    }
    Ok(map)
}

/// `parse_log_minitest`.
pub fn parse_minitest(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| py(r"^(.+)\. .*=.*(\.|F|E).*$"));
    Ok(per_stripped_line(log, &LINE, |c| {
        let name = group(c, 1).to_string();
        match group(c, 2) {
            "." => Some((name, PASSED)),
            _ => Some((name, FAILED)),
        }
    }))
}

/// `parse_log_cucumber` (`--format progress`).
pub fn parse_cucumber(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| py(r"^(.*) \.+(\.|F)"));
    Ok(per_stripped_line(log, &LINE, |c| {
        Some((group(c, 1).to_string(), if group(c, 2) == "." { PASSED } else { FAILED }))
    }))
}

/// `parse_log_ruby_unit`: `name: .` / `E` / `F` / `O` (`\b` after the letter: Python's word
/// boundary, i.e. not followed by a letter, number or underscore).
pub fn parse_ruby_unit(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| {
        py(r"^\s*(?:test: )?(.+):\s+(\.|E(?:[^\p{L}\p{N}_]|$)|F(?:[^\p{L}\p{N}_]|$)|O(?:[^\p{L}\p{N}_]|$))")
    });
    Ok(per_stripped_line(log, &LINE, |c| {
        let status = match group(c, 2).chars().next() {
            Some('.') => PASSED,
            Some('O') => SKIPPED,
            _ => FAILED,
        };
        Some((group(c, 1).to_string(), status))
    }))
}

/// `parse_log_rspec_transformed_json`: `name - passed|failed`.
pub fn parse_rspec_transformed_json(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| py(r"^(?:(.+) - (passed|failed))"));
    Ok(per_stripped_line(log, &LINE, |c| {
        Some((group(c, 1).to_string(), if group(c, 2) == "passed" { PASSED } else { FAILED }))
    }))
}

/// `parse_log_jekyll`: minitest for PRs 9141/8047/8167, cucumber for 8761/8771.
pub fn parse_jekyll(log: &str, ctx: &ParseContext) -> Result<StatusMap, ParseError> {
    let id = ctx.instance_id.as_deref().ok_or_else(|| {
        ParseError::Crash("parse_log_jekyll: AttributeError: 'NoneType' object has no attribute 'instance_id'".into())
    })?;
    let pr = id
        .split('-')
        .nth(1)
        .ok_or_else(|| ParseError::Crash("parse_log_jekyll: IndexError: list index out of range".into()))?;
    match pr {
        "9141" | "8047" | "8167" => parse_minitest(log),
        "8761" | "8771" => parse_cucumber(log),
        _ => Err(ParseError::Crash(format!("parse_log_jekyll: ValueError: Unknown instance id: {id}"))),
    }
}
