//! Ports of `swebench/harness/log_parsers/python.py` (5.0.2), rule for rule.

use std::sync::LazyLock;

use regex::Regex;

use super::{ParseError, StatusMap};
use crate::pytext::{py_lstrip, py_split, py_strip, PY_SPACE_CLASS};
use crate::status::TestStatus;

/// True when the line starts with one of the five status words.
fn has_status_prefix(line: &str) -> bool {
    TestStatus::ALL.iter().any(|s| line.starts_with(s.as_str()))
}

fn has_status_suffix(line: &str) -> bool {
    TestStatus::ALL.iter().any(|s| line.ends_with(s.as_str()))
}

/// pytest's `SKIPPED [N] path:line: reason` summary, where `[N]` is a count, not a test id.
fn is_skip_summary(status: &str, name: &str) -> bool {
    static COUNT: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^\[\d+\]$").unwrap());
    status == "SKIPPED" && COUNT.is_match(name)
}

/// The shared pytest line rule: `STATUS id …` (with `" - "` removed from FAILED lines).
fn pytest_tokens(line: &str) -> Option<(String, String)> {
    if !has_status_prefix(line) {
        return None;
    }
    let owned;
    let line = if line.starts_with("FAILED") {
        owned = line.replace(" - ", " ");
        owned.as_str()
    } else {
        line
    };
    let toks = py_split(line);
    if toks.len() <= 1 || is_skip_summary(toks[0], toks[1]) {
        return None;
    }
    Some((toks[1].to_string(), toks[0].to_string()))
}

/// `parse_log_pytest` (also astroid, flask, marshmallow, pvlib, pyvista, sqlfluff, xarray).
pub fn parse_pytest(log: &str) -> Result<StatusMap, ParseError> {
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        if let Some((name, status)) = pytest_tokens(line) {
            map.insert(name, status);
        }
    }
    Ok(map)
}

/// `parse_log_pytest_options` (requests, pylint, pydicom): absolute-path options are
/// shortened to their last component.
pub fn parse_pytest_options(log: &str) -> Result<StatusMap, ParseError> {
    static OPTION: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(.*?)\[(.*)\]").unwrap());
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        let Some((name, status)) = pytest_tokens(line) else {
            continue;
        };
        let key = match OPTION.captures(&name) {
            Some(c) => {
                let main = &c[1];
                let mut option = c[2].to_string();
                if option.starts_with('/') && !option.starts_with("//") && !option.contains('*') {
                    let last = option.rsplit('/').next().unwrap_or("").to_string();
                    option = format!("/{last}");
                }
                format!("{main}[{option}]")
            }
            None => name,
        };
        map.insert(key, status);
    }
    Ok(map)
}

/// `parse_log_matplotlib`: pytest after replacing `MouseButton.LEFT/RIGHT` by 1/3.
pub fn parse_matplotlib(log: &str) -> Result<StatusMap, ParseError> {
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        let line = line.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3");
        if let Some((name, status)) = pytest_tokens(&line) {
            map.insert(name, status);
        }
    }
    Ok(map)
}

/// `parse_log_pytest_v2` (astropy, scikit-learn, sphinx): strips colour codes and control
/// characters, keys are all tokens after the status joined by one space.
pub fn parse_pytest_v2(log: &str) -> Result<StatusMap, ParseError> {
    static COLOUR: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\[(\d+)m").unwrap());
    let mut map = StatusMap::new();
    for raw in log.split('\n') {
        let no_colour = COLOUR.replace_all(raw, "");
        let line: String = no_colour.chars().filter(|c| !('\u{1}'..='\u{1f}').contains(c)).collect();
        if has_status_prefix(&line) {
            let head = if line.starts_with("FAILED") {
                line.split_once(" - ").map_or(line.as_str(), |(a, _)| a)
            } else {
                line.as_str()
            };
            let toks = py_split(head);
            if toks.len() >= 2 && !is_skip_summary(toks[0], toks[1]) {
                map.insert(toks[1..].join(" "), toks[0].to_string());
            }
        } else if has_status_suffix(&line) {
            let toks = py_split(&line);
            if toks.len() >= 2 {
                let (status, name) = toks.split_last().expect("at least two tokens");
                map.insert(name.join(" "), status.to_string());
            }
        }
    }
    Ok(map)
}

/// `parse_log_seaborn`: FAILED and PASSED only.
pub fn parse_seaborn(log: &str) -> Result<StatusMap, ParseError> {
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        let parts = py_split(line);
        if parts.len() < 2 {
            continue;
        }
        if line.starts_with("FAILED") {
            map.insert(parts[1].to_string(), "FAILED".into());
        } else if line.contains(" PASSED ") {
            if parts[1] == "PASSED" {
                map.insert(parts[0].to_string(), "PASSED".into());
            }
        } else if line.starts_with("PASSED") {
            map.insert(parts[1].to_string(), "PASSED".into());
        }
    }
    Ok(map)
}

/// `parse_log_sympy`: `___ file.py:test ___` headers are failures, then per-line verdicts.
pub fn parse_sympy(log: &str) -> Result<StatusMap, ParseError> {
    static HEADER: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(_*) (.*)\.py:(.*) (_*)").unwrap());
    let mut map = StatusMap::new();
    for c in HEADER.captures_iter(log) {
        map.insert(format!("{}.py:{}", &c[2], &c[3]), "FAILED".into());
    }
    for line in log.split('\n') {
        let line = py_strip(line);
        if !line.starts_with("test_") {
            continue;
        }
        // Python checks the three suffixes independently; later ones overwrite.
        let first = py_split(line)[0].to_string();
        if line.ends_with(" E") {
            map.insert(first.clone(), "ERROR".into());
        }
        if line.ends_with(" F") {
            map.insert(first.clone(), "FAILED".into());
        }
        if line.ends_with(" ok") {
            map.insert(first, "PASSED".into());
        }
    }
    Ok(map)
}

/// `parse_log_django`: the unittest verbose runner of `tests/runtests.py`.
pub fn parse_django(log: &str) -> Result<StatusMap, ParseError> {
    let mut map = StatusMap::new();
    let mut prev_test: Option<String> = None;
    for raw in log.split('\n') {
        let mut line = py_strip(raw).to_string();
        if line.contains("--version is equivalent to version") {
            map.insert("--version is equivalent to version".into(), "PASSED".into());
        }
        if let Some((before, _)) = line.split_once(" ... ") {
            prev_test = Some(before.to_string());
        }
        for suffix in [" ... ok", " ... OK", " ...  OK"] {
            if line.ends_with(suffix) {
                // django__django-7188: a migration message and the verdict share one line.
                if py_strip(&line).starts_with("Applying sites.0002_alter_domain_unique...test_no_migrations") {
                    let after = line.split_once("...").map_or("", |(_, b)| b);
                    line = py_strip(after).to_string();
                }
                let test = match line.rfind(suffix) {
                    Some(i) => line[..i].to_string(),
                    None => line.clone(),
                };
                map.insert(test, "PASSED".into());
                break;
            }
        }
        if line.contains(" ... skipped") {
            let test = line.split_once(" ... skipped").map_or("", |(a, _)| a);
            map.insert(test.to_string(), "SKIPPED".into());
        }
        if line.ends_with(" ... FAIL") {
            let test = line.split_once(" ... FAIL").map_or("", |(a, _)| a);
            map.insert(test.to_string(), "FAILED".into());
        }
        if line.starts_with("FAIL:") {
            let test = second_token(&line)?;
            map.insert(test, "FAILED".into());
        }
        if line.ends_with(" ... ERROR") {
            let test = line.split_once(" ... ERROR").map_or("", |(a, _)| a);
            map.insert(test.to_string(), "ERROR".into());
        }
        if line.starts_with("ERROR:") {
            let test = second_token(&line)?;
            map.insert(test, "ERROR".into());
        }
        if py_lstrip(&line).starts_with("ok") {
            if let Some(prev) = &prev_test {
                map.insert(prev.clone(), "PASSED".into());
            }
        }
    }
    static PATTERNS: LazyLock<[Regex; 3]> = LazyLock::new(|| {
        let s = PY_SPACE_CLASS;
        [
            Regex::new(&format!(
                r"(?m)^(.*?){s}\.\.\.{s}Testing against Django installed in ((?s:.*?)) silenced\)\.\nok$"
            ))
            .unwrap(),
            Regex::new(&format!(r"(?m)^(.*?){s}\.\.\.{s}Internal Server Error: /(.*)/\nok$")).unwrap(),
            Regex::new(&format!(r"(?m)^(.*?){s}\.\.\.{s}System check identified no issues \(0 silenced\)\nok$"))
                .unwrap(),
        ]
    });
    for pattern in PATTERNS.iter() {
        for c in pattern.captures_iter(log) {
            map.insert(c[1].to_string(), "PASSED".into());
        }
    }
    Ok(map)
}

/// `line.split()[1].strip()`; Python raises IndexError on a one-token line, which aborts
/// grading of the instance. We report that as a parser crash, never as a silent skip.
fn second_token(line: &str) -> Result<String, ParseError> {
    let toks = py_split(line);
    match toks.get(1) {
        Some(t) => Ok(py_strip(t).to_string()),
        None => Err(ParseError::Crash(format!(
            "django parser: line {line:?} has no test name after the verdict (IndexError in swebench)"
        ))),
    }
}
