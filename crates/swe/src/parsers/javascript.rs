//! Ports of `swebench/harness/log_parsers/javascript.py` (swebench 5.0.2).

use std::sync::LazyLock;

use regex::{NoExpand, Regex};
use serde_json::Value;

use super::pyre::{
    after_last, ansi_escape, before_last, before_match, findall, group, indent_of, py, py_float, py_m, py_match,
    py_rstrip,
};
use super::{ParseContext, ParseError, StatusMap};
use crate::pytext::py_strip;

const PASSED: &str = "PASSED";
const FAILED: &str = "FAILED";
const SKIPPED: &str = "SKIPPED";

fn set(map: &mut StatusMap, k: impl Into<String>, v: &str) {
    map.insert(k.into(), v.to_string());
}

/// The indentation-driven suite stack shared by calypso, next (v1) and lighthouse (mocha).
#[derive(Default)]
struct SuiteStack(Vec<(String, usize)>);

impl SuiteStack {
    fn adjust(&mut self, line: &str) {
        let indent = indent_of(line);
        if self.0.is_empty() {
            self.0 = vec![(py_strip(line).to_string(), indent)];
        } else {
            while self.0.last().is_some_and(|(_, i)| *i >= indent) {
                self.0.pop();
            }
            self.0.push((py_strip(line).to_string(), indent));
        }
    }
    fn names(&self) -> Vec<&str> {
        self.0.iter().map(|(n, _)| n.as_str()).collect()
    }
}

/// `parse_log_highlightjs` (mocha spec reporter).
pub fn parse_highlightjs(log: &str) -> Result<StatusMap, ParseError> {
    static SUMMARY: LazyLock<Regex> = LazyLock::new(|| py(r"\n[ \t]*\d+ passing"));
    static TIMING: LazyLock<Regex> = LazyLock::new(|| py(r"\(\d+ms\)"));
    static FAIL: LazyLock<Regex> = LazyLock::new(|| py_match(r"^\d+\)"));
    let log = before_match(&SUMMARY, log);
    let remove_timing = |t: &str| py_strip(&TIMING.replace_all(t, "")).to_string();
    let mut map = StatusMap::new();
    let mut suite: Vec<String> = Vec::new();
    for line in log.split('\n') {
        let s = py_strip(line);
        if s.starts_with('✓') || s.starts_with('✔') {
            let check = if s.starts_with('✓') { "✓" } else { "✔" };
            let name = remove_timing(line.split_once(check).map_or("", |(_, b)| b));
            let mut parts = suite.clone();
            parts.push(name);
            set(&mut map, parts.join("."), PASSED);
        } else if FAIL.is_match(s) {
            let name = remove_timing(line.split_once(')').map_or("", |(_, b)| b));
            let mut parts = suite.clone();
            parts.push(name);
            set(&mut map, parts.join("."), FAILED);
        } else if line.starts_with("  ") {
            suite = vec![s.to_string()];
        }
        // swebench's fourth branch (not 2 but 4 leading spaces) can never be taken.
    }
    Ok(map)
}

/// The `for test in results[key]` loop of `parse_log_prismjs`, with Python's errors.
fn mocha_json_titles(results: &Value, key: &str) -> Result<Vec<String>, ParseError> {
    let crash = |m: String| ParseError::Crash(format!("parse_log_prismjs: {m}"));
    let list = results.get(key).ok_or_else(|| crash(format!("KeyError: '{key}'")))?;
    let items: &[Value] = match list {
        Value::Array(a) => a,
        Value::Object(o) if o.is_empty() => &[],
        Value::String(s) if s.is_empty() => &[],
        Value::Object(_) | Value::String(_) => return Err(crash("TypeError: string indices must be integers".into())),
        other => return Err(crash(format!("TypeError: {other} is not iterable"))),
    };
    items
        .iter()
        .map(|t| match t.get("fullTitle") {
            Some(Value::String(s)) if t.is_object() => Ok(s.clone()),
            Some(other) if t.is_object() => Err(crash(format!("non-string test title {other}"))),
            _ if t.is_object() => Err(crash("KeyError: 'fullTitle'".into())),
            _ => Err(crash("TypeError: test entry is not an object".into())),
        })
        .collect()
}

/// `parse_log_prismjs`: the JSON mocha reporter output after the test command.
pub fn parse_prismjs(log: &str) -> Result<StatusMap, ParseError> {
    const TEST_CMD: &str = "./node_modules/.bin/mocha tests/run.js --reporter json";
    let mut map = StatusMap::new();
    for part in log.split(TEST_CMD).skip(1) {
        let inner = before_last(part.split_once('{').map_or(part, |(_, b)| b), "}");
        let text = format!("{{{inner}}}");
        let results: Value = serde_json::from_str(&text)
            .map_err(|e| ParseError::Crash(format!("parse_log_prismjs: JSONDecodeError: {e}")))?;
        for t in mocha_json_titles(&results, "failures")? {
            set(&mut map, t, FAILED);
        }
        for t in mocha_json_titles(&results, "passes")? {
            set(&mut map, t, PASSED);
        }
    }
    Ok(map)
}

fn collapse_ws(s: &str) -> String {
    static WS: LazyLock<Regex> = LazyLock::new(|| py(r"\s+"));
    py_strip(&WS.replace_all(s, " ")).to_string()
}

/// `parse_log_eslint`: numbered mocha failures.
pub fn parse_eslint(log: &str) -> Result<StatusMap, ParseError> {
    static FAIL: LazyLock<Regex> = LazyLock::new(|| py(r"(\s{2}\d+\))([\s\S]*?)\s+(?:(.*)Error)"));
    let mut map = StatusMap::new();
    for c in FAIL.captures_iter(log) {
        set(&mut map, collapse_ws(group(&c, 2)), FAILED);
    }
    Ok(map)
}

/// `parse_log_bpmn_js`: karma `FAILED` lines.
pub fn parse_bpmn_js(log: &str) -> Result<StatusMap, ParseError> {
    static PATTERNS: LazyLock<[Regex; 4]> = LazyLock::new(|| {
        [
            py(r"2KPhantomJS\s[\d\.]+\s\(Linux\s[\d\.]+\)\s(.*)FAILED\n"),
            py(r"2KPhantomJS\s[\d\.]+\s\(Linux\sx86\_64\)\s(.*)FAILED\n"),
            py(r"Chrome\sHeadless\s(.*)\s\(Linux\sx86\_64\)\s(.*)FAILED\n"),
            py(r"HeadlessChrome\s[\d\.]+\s\(Linux\s[\d\.]+\)\s(.*)FAILED\n"),
        ]
    });
    let mut map = StatusMap::new();
    for re in PATTERNS.iter() {
        for c in re.captures_iter(log) {
            // findall gives a tuple for the two-group pattern; swebench takes its second item.
            let name = if c.len() > 2 { group(&c, 2) } else { group(&c, 1) };
            set(&mut map, name, FAILED);
        }
    }
    Ok(map)
}

/// `parse_log_openlayers`.
pub fn parse_openlayers(log: &str) -> Result<StatusMap, ParseError> {
    static PATTERNS: LazyLock<[Regex; 4]> = LazyLock::new(|| {
        [
            py_m(r"Chrome\sHeadless\s[\d\.]+\s\(Linux\s[\d\.\_\S]+\)\s(.*)\sFAILED\n"),
            py_m(r"Chrome\s[\d\.]+\s\(Linux\s[\d\.\_\S]+\)\s(.*)FAILED\n"),
            py_m(r"^\s{2}\d+\)([\s\S]*?)Error:"),
            py_m(r"^case\s(.*):\smismatch"),
        ]
    });
    let mut map = StatusMap::new();
    for re in PATTERNS.iter() {
        for f in findall(re, log) {
            set(&mut map, collapse_ws(f), FAILED);
        }
    }
    Ok(map)
}

/// `parse_log_grommet`: jest-style `PASS` / `FAIL` lines without their timing.
pub fn parse_grommet(log: &str) -> Result<StatusMap, ParseError> {
    static TIMING: LazyLock<Regex> = LazyLock::new(|| py(r"\s\([\d\.]+\s?(?:ms|s)\)$"));
    static FAIL: LazyLock<Regex> = LazyLock::new(|| py_m(r"^FAIL\s(.*)"));
    static PASS: LazyLock<Regex> = LazyLock::new(|| py_m(r"^PASS\s(.*)"));
    let mut map = StatusMap::new();
    for (re, status) in [(&*FAIL, FAILED), (&*PASS, PASSED)] {
        for f in findall(re, log) {
            set(&mut map, TIMING.replace_all(py_strip(f), "").into_owned(), status);
        }
    }
    Ok(map)
}

fn parse_next_v1(log: &str) -> Result<StatusMap, ParseError> {
    static ASSERTION: LazyLock<Regex> = LazyLock::new(|| py(r"(?s:AssertionError:\s+#([\s\S]*?)\n\n)"));
    static FAIL: LazyLock<Regex> = LazyLock::new(|| py_match(r".*?✗\s*(.*)"));
    static PASS: LazyLock<Regex> = LazyLock::new(|| py_match(r".*?✓\s*(.*)"));
    let log = ansi_escape(log);
    let log = ASSERTION.replace_all(&log, "");
    let mut map = StatusMap::new();
    let mut suite = SuiteStack::default();
    for part in log.split(" xvfb-run ").skip(1) {
        let part = after_last(part, "Starting browser Chrome");
        for line in part.split('\n') {
            if line.starts_with("TOTAL") {
                break;
            }
            let s = py_strip(line);
            if ["ERROR", "LOG", "WARN", "Check", "in"].iter().any(|p| s.starts_with(p)) {
                continue;
            }
            if let Some(c) = FAIL.captures(line) {
                let mut parts = suite.names();
                parts.push(group(&c, 1));
                set(&mut map, parts.join(" - "), FAILED);
            } else if let Some(c) = PASS.captures(line) {
                let mut parts = suite.names();
                parts.push(group(&c, 1));
                set(&mut map, parts.join(" - "), PASSED);
            } else if indent_of(line) > 0 {
                suite.adjust(line);
            }
        }
    }
    Ok(map)
}

fn parse_next_v2(log: &str) -> Result<StatusMap, ParseError> {
    static SUITES: LazyLock<Regex> = LazyLock::new(|| py(r"Running\:(.*)\)\n{3}\s{2}(.*)\n"));
    static FAIL: LazyLock<Regex> = LazyLock::new(|| py_m(r"^\s{4}\d+\)\s(.*)"));
    static PASS: LazyLock<Regex> = LazyLock::new(|| py_m(r"^\s{4}✓\s(.*)\("));
    let mut map = StatusMap::new();
    let matches: Vec<_> = SUITES.captures_iter(log).collect();
    for (i, c) in matches.iter().enumerate() {
        let suite = group(c, 2);
        // re.split's piece after match i: up to the next match.
        let start = c.get(0).map_or(0, |m| m.end());
        let end = matches.get(i + 1).and_then(|n| n.get(0)).map_or(log.len(), |m| m.start());
        let chunk = &log[start..end];
        for f in findall(&FAIL, chunk) {
            set(&mut map, format!("{suite}: {}", py_strip(f)), FAILED);
        }
        for p in findall(&PASS, chunk) {
            set(&mut map, format!("{suite}: {}", py_strip(p)), PASSED);
        }
    }
    Ok(map)
}

fn no_spec(parser: &str, attr: &str) -> ParseError {
    ParseError::Crash(format!(
        "{parser}: AttributeError: 'NoneType' object has no attribute '{attr}' (needs the instance)"
    ))
}

/// `parse_log_next`: v2 for version 1.27, else v1.
pub fn parse_next(log: &str, ctx: &ParseContext) -> Result<StatusMap, ParseError> {
    match ctx.version.as_deref() {
        None => Err(no_spec("parse_log_next", "version")),
        Some("1.27") => parse_next_v2(log),
        Some(_) => parse_next_v1(log),
    }
}

/// `parse_log_carbon` (also `parse_log_react_pdf`, and lighthouse's jest branch).
pub fn parse_carbon(log: &str) -> Result<StatusMap, ParseError> {
    static PATTERNS: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
        [
            (r"^PASS\s(.*)\s\([\d\.]+ms\)", PASSED),
            (r"^PASS\s(.*)\s\([\d\.]+\ss\)", PASSED),
            (r"^PASS\s(.*)\s\([\d\.]+s\)", PASSED),
            (r"^PASS\s(.*)", PASSED),
            (r"^FAIL\s(.*)\s\([\d\.]+ms\)", FAILED),
            (r"^FAIL\s(.*)\s\([\d\.]+\ss\)", FAILED),
            (r"^FAIL\s(.*)\s\([\d\.]+s\)", FAILED),
            (r"^FAIL\s(.*)", FAILED),
        ]
        .into_iter()
        .map(|(p, s)| (py(p), s))
        .collect()
    });
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        if let Some((c, status)) = PATTERNS.iter().find_map(|(re, s)| re.captures(line).map(|c| (c, *s))) {
            set(&mut map, group(&c, 1), status);
        }
    }
    Ok(map)
}

fn parse_lighthouse_mocha(log: &str) -> Result<StatusMap, ParseError> {
    static RUNS: LazyLock<Regex> = LazyLock::new(|| py(r"running\s\d+\stest\sfiles"));
    static PASSING: LazyLock<Regex> = LazyLock::new(|| py(r"\d+\spassing"));
    static PATTERNS: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
        [
            (r"✔\s(.*)\s\(\d+m+s\)", PASSED),
            (r"✔\s(.*)", PASSED),
            (r"\d+\)\s(.*)\s\(\d+m+s\)", FAILED),
            (r"\d+\)\s(.*)", FAILED),
        ]
        .into_iter()
        .map(|(p, s)| (py_match(p), s))
        .collect()
    });
    let mut map = StatusMap::new();
    for run in RUNS.split(log).skip(1) {
        let run = py_strip(before_match(&PASSING, run));
        let mut suite = SuiteStack::default();
        for line in run.split('\n') {
            let s = py_strip(line);
            if let Some((c, status)) = PATTERNS.iter().find_map(|(re, st)| re.captures(s).map(|c| (c, *st))) {
                let mut parts = suite.names();
                parts.push(group(&c, 1));
                set(&mut map, parts.join(" - "), status);
            } else if indent_of(line) > 0 {
                suite.adjust(line);
            }
        }
    }
    Ok(map)
}

/// `parse_log_lighthouse`: mocha for 9.5/10.0/10.2, the carbon (jest) rules from 3.0 on,
/// else the JSON mocha reporter.
pub fn parse_lighthouse(log: &str, ctx: &ParseContext) -> Result<StatusMap, ParseError> {
    static TITLE: LazyLock<Regex> = LazyLock::new(|| py_m(r#"\"fullTitle\"\:\s\"(.*)\",\n"#));
    let version = ctx.version.as_deref().ok_or_else(|| no_spec("parse_log_lighthouse", "version"))?;
    if ["9.5", "10.0", "10.2"].contains(&version) {
        return parse_lighthouse_mocha(log);
    }
    let v = py_float(version).ok_or_else(|| {
        ParseError::Crash(format!("parse_log_lighthouse: ValueError: could not convert string to float: {version:?}"))
    })?;
    if v >= 3.0 {
        return parse_carbon(log);
    }
    let mut map = StatusMap::new();
    for part in log.split("./node_modules/.bin/mocha --reporter json").skip(1) {
        for t in findall(&TITLE, before_last(after_last(part, "\"passes\": ["), "]")) {
            set(&mut map, t, PASSED);
        }
        for t in findall(&TITLE, before_last(after_last(part, "\"failures\": ["), "],")) {
            set(&mut map, t, FAILED);
        }
    }
    Ok(map)
}

/// `parse_log_quarto_cli`.
pub fn parse_quarto_cli(log: &str) -> Result<StatusMap, ParseError> {
    static PREFIX: LazyLock<Regex> = LazyLock::new(|| py(r"\[(smoke|unit)\]"));
    static EXCLUDE: LazyLock<Regex> = LazyLock::new(|| py_match(r"test result:"));
    static TMP: LazyLock<[Regex; 2]> = LazyLock::new(|| [py(r"/tmp/(\w+)\.qmd"), py(r"/tmp/(\w+)/")]);
    let mut tmp_keys: Vec<(String, usize)> = Vec::new();
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        if line.contains("ERRORS") || line.contains("failures:") {
            break;
        }
        if !PREFIX.is_match(line) {
            continue;
        }
        let mut line = line.to_string();
        for re in TMP.iter() {
            if let Some(m) = re.find(&line) {
                let key = m.as_str().to_string();
                let n = match tmp_keys.iter().find(|(k, _)| *k == key) {
                    Some((_, n)) => *n,
                    None => {
                        tmp_keys.push((key, tmp_keys.len()));
                        tmp_keys.len() - 1
                    }
                };
                line = re.replace_all(&line, NoExpand(&format!("/tmp/{n}"))).into_owned();
            }
        }
        let name = py_strip(line.split("...").next().unwrap_or("")).to_string();
        let reject = EXCLUDE.is_match(&line)
            || (line.contains("passed") && line.contains("failed") && line.contains("steps"))
            || line.contains("34mINFO");
        if !reject {
            if line.contains("32mok") {
                set(&mut map, name.clone(), PASSED);
            } else if line.contains("31mFAILED") {
                set(&mut map, name.clone(), FAILED);
            }
            if !map.contains_key(&name) {
                set(&mut map, name, FAILED);
            }
        }
    }
    Ok(map)
}

/// `parse_log_calypso`: jest's verbose tree after each `./node_modules/.bin/jest` call.
pub fn parse_calypso(log: &str) -> Result<StatusMap, ParseError> {
    static MS: LazyLock<Regex> = LazyLock::new(|| py(r"\(\d+ms\)"));
    static PASS_MS: LazyLock<Regex> = LazyLock::new(|| py_match(r"^\s+✓\s(.*)\(\d+ms\)$"));
    static PASS: LazyLock<Regex> = LazyLock::new(|| py_match(r"^\s+✓\s(.*)"));
    static FAIL_MS: LazyLock<Regex> = LazyLock::new(|| py_match(r"^\s+✕\s(.*)\(\d+ms\)$"));
    static FAIL: LazyLock<Regex> = LazyLock::new(|| py_match(r"^\s+✕\s(.*)"));
    let mut map = StatusMap::new();
    let mut suite = SuiteStack::default();
    for part in log.split(" ./node_modules/.bin/jest ").skip(1) {
        for line in part.split('\n') {
            if line.starts_with("Test Suites") || line.starts_with("  ● ") {
                break;
            }
            let s = py_strip(line);
            let (with_ms, plain, status) = if s.starts_with('✓') {
                (&*PASS_MS, &*PASS, PASSED)
            } else if s.starts_with('✕') {
                (&*FAIL_MS, &*FAIL, FAILED)
            } else {
                if indent_of(line) > 0 {
                    suite.adjust(line);
                }
                continue;
            };
            let re = if MS.is_match(line) { with_ms } else { plain };
            let c = re.captures(line).ok_or_else(|| {
                ParseError::Crash(format!(
                    "parse_log_calypso: AttributeError: 'NoneType' object has no attribute 'group' (line {line:?})"
                ))
            })?;
            let name = format!("{} - {}", suite.names().join(" - "), group(&c, 1));
            set(&mut map, py_strip(&name), status);
        }
    }
    Ok(map)
}

/// `parse_log_chart_js`: karma `FAILED` lines.
pub fn parse_chart_js(log: &str) -> Result<StatusMap, ParseError> {
    static FAIL: LazyLock<Regex> = LazyLock::new(|| py_m(r"Chrome\s[\d\.]+[^\S\r\n]\(.+?\)[^\S\r\n](.*)FAILED$"));
    let log = ansi_escape(log);
    let mut map = StatusMap::new();
    for f in findall(&FAIL, &log) {
        set(&mut map, f, FAILED);
    }
    Ok(map)
}

/// `parse_log_marked`: numbered failures.
pub fn parse_marked(log: &str) -> Result<StatusMap, ParseError> {
    static FAIL: LazyLock<Regex> = LazyLock::new(|| py(r"^\d+\)\s(.*)"));
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        if let Some(c) = FAIL.captures(line) {
            set(&mut map, py_strip(group(&c, 1)), FAILED);
        }
    }
    Ok(map)
}

fn p5js_remove_json_blocks(log: &str) -> String {
    let (mut in_obj, mut in_list) = (false, false);
    let mut kept = Vec::new();
    for line in log.split('\n') {
        let s = py_rstrip(line);
        if s.ends_with('{') {
            in_obj = true;
            continue;
        }
        if s.ends_with('[') {
            in_list = true;
            continue;
        }
        if s == "}" && in_obj {
            in_obj = false;
            continue;
        }
        if s == "]" && in_list {
            in_list = false;
            continue;
        }
        if in_obj || in_list {
            continue;
        }
        if (s.starts_with('{') && s.ends_with('}')) || (s.starts_with('[') && s.ends_with(']')) {
            continue;
        }
        kept.push(line);
    }
    kept.join("\n")
}

/// `re.compile(r"<(\w+)>[\s\S]*?<\/\1>").search`: the leftmost `<name>` with a later
/// `</name>`, up to the first such closing tag. (The backreference is why this is by hand.)
fn p5js_xml_block(text: &str) -> Option<(usize, usize, String)> {
    static OPEN: LazyLock<Regex> = LazyLock::new(|| py(r"<(\w+)>"));
    for c in OPEN.captures_iter(text) {
        let (m, name) = (c.get(0)?, group(&c, 1));
        let close = format!("</{name}>");
        if let Some(pos) = text[m.end()..].find(&close) {
            return Some((m.start(), m.end() + pos + close.len(), name.to_string()));
        }
    }
    None
}

fn p5js_remove_xml_blocks(log: &str) -> String {
    let mut text = log.to_string();
    while let Some((start, end, name)) = p5js_xml_block(&text) {
        let open = format!("<{name}>");
        let n = text[start..end].matches(&open).count().saturating_sub(1);
        text = format!("{}{}{}", &text[..start], open.repeat(n), &text[end..]);
    }
    text
}

/// `parse_log_p5js`: numbered mocha failures whose title lines are increasingly indented,
/// after removing JSON and XML blocks.
pub fn parse_p5js(log: &str) -> Result<StatusMap, ParseError> {
    static FAIL: LazyLock<Regex> = LazyLock::new(|| py(r"(?ms:^\s*(\d+)\)(.{0,1000}?):)"));
    let log = p5js_remove_xml_blocks(&p5js_remove_json_blocks(&ansi_escape(log)));
    let mut map = StatusMap::new();
    for c in FAIL.captures_iter(&log) {
        let title = group(&c, 2);
        let mut last = 0;
        let valid = title.split('\n').all(|l| {
            let i = indent_of(l);
            let ok = i > last;
            last = i;
            ok
        });
        if valid {
            let names: Vec<&str> = title.split('\n').map(py_strip).collect();
            set(&mut map, names.join(":"), FAILED);
        }
    }
    Ok(map)
}

/// `parse_log_jest` (`--verbose`).
pub fn parse_jest(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| py(r"^\s*(✓|✕|○)\s(.+?)(?:\s\((\d+\s*m?s)\))?$"));
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        if let Some(c) = LINE.captures(py_strip(line)) {
            let status = match group(&c, 1) {
                "✓" => PASSED,
                "✕" => FAILED,
                _ => SKIPPED,
            };
            set(&mut map, py_strip(group(&c, 2)), status);
        }
    }
    Ok(map)
}

/// `parse_log_jest_json` (`[PASSED] name` lines from the JSON transform).
pub fn parse_jest_json(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| py(r"^\[(PASSED|FAILED)\]\s(.+)$"));
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        if let Some(c) = LINE.captures(py_strip(line)) {
            set(&mut map, group(&c, 2), if group(&c, 1) == "PASSED" { PASSED } else { FAILED });
        }
    }
    Ok(map)
}

/// `parse_log_vitest` (`--reporter=verbose`).
pub fn parse_vitest(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| py(r"^\s*(✓|×|↓)\s(.+?)(?:\s(\d+\s*m?s?|\[skipped\]))?$"));
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        if let Some(c) = LINE.captures(py_strip(line)) {
            let status = match group(&c, 1) {
                "✓" => PASSED,
                "×" => FAILED,
                _ => SKIPPED,
            };
            set(&mut map, group(&c, 2), status);
        }
    }
    Ok(map)
}

/// `parse_log_karma`: the indented tree after `Starting browser`, until `SUMMARY:`.
pub fn parse_karma(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| py(r"^(\s*)?([✔✖])?\s(.*)$"));
    let mut map = StatusMap::new();
    let mut current_indent: i64 = -1;
    let mut suite: Vec<String> = Vec::new();
    let mut started = false;
    for line in log.split('\n') {
        if line.starts_with("SUMMARY:") {
            return Ok(map);
        }
        if line.contains("Starting browser") {
            started = true;
            continue;
        }
        if !started {
            continue;
        }
        let Some(c) = LINE.captures(line) else { continue };
        let (indent, status, name) = (group(&c, 1), group(&c, 2), group(&c, 3));
        if !indent.is_empty() && status.is_empty() {
            let n = indent.chars().count() as i64;
            if n > current_indent {
                current_indent = n;
                suite.push(name.to_string());
            } else if n < current_indent {
                current_indent = n;
                if suite.pop().is_none() {
                    return Err(ParseError::Crash("parse_log_karma: IndexError: pop from empty list".into()));
                }
                continue;
            }
        }
        if status == "✔" || status == "✖" {
            let mut parts = suite.clone();
            parts.push(name.to_string());
            set(&mut map, parts.join(" > "), if status == "✔" { PASSED } else { FAILED });
        }
    }
    Ok(map)
}

/// `parse_log_tap`: `ok N name` / `not ok N name`.
pub fn parse_tap(log: &str) -> Result<StatusMap, ParseError> {
    static LINE: LazyLock<Regex> = LazyLock::new(|| py(r"^(ok|not ok) (\d+) (.+)$"));
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        if let Some(c) = LINE.captures(py_strip(line)) {
            set(&mut map, group(&c, 3), if group(&c, 1) == "ok" { PASSED } else { FAILED });
        }
    }
    Ok(map)
}

/// `parse_log_immutable_js`: jest for PR 2006, jest_json for PR 2005.
pub fn parse_immutable_js(log: &str, ctx: &ParseContext) -> Result<StatusMap, ParseError> {
    let id = ctx.instance_id.as_deref().ok_or_else(|| no_spec("parse_log_immutable_js", "instance_id"))?;
    match id.rsplit('-').next().unwrap_or(id) {
        "2006" => parse_jest(log),
        "2005" => parse_jest_json(log),
        _ => Err(ParseError::Crash(format!("parse_log_immutable_js: ValueError: Unknown instance id: {id}"))),
    }
}

/// `parse_log_tape` (FrogNano's own; swebench has no tape parser): tape prints each test as a
/// `# name` comment followed by its assertions (`ok N msg` / `not ok N msg`), and subtests as
/// further `# name` lines. A test fails when any of its assertions fails, and passes when it
/// finished with none failing (an assertion's message, such as "should be equal", repeats
/// across tests, so it cannot name a test). `# SKIP name` is a skipped test. Names that repeat
/// (the same title in two files) get ` (2)`, ` (3)`… in run order. When the log ends before
/// tape's plan line (`1..N`), the process died inside the test then running: that test fails
/// and the ones after it are absent. A log may hold several tape runs one after another (one
/// process per test file, so that a file that crashes loses only its own tests): each starts
/// with `TAP version`, and a test still open when the next run starts died with its process.
pub fn parse_tape_tests(log: &str) -> Result<StatusMap, ParseError> {
    static ASSERT: LazyLock<Regex> = LazyLock::new(|| py(r"^(ok|not ok) \d+\b(.*)$"));
    static PLAN: LazyLock<Regex> = LazyLock::new(|| py(r"^1\.\.\d+$"));
    let mut map = StatusMap::new();
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut unique = |name: &str| {
        let n = seen.entry(name.to_string()).or_insert(0);
        *n += 1;
        if *n == 1 {
            name.to_string()
        } else {
            format!("{name} ({n})")
        }
    };
    // The test whose assertions are being read, and whether one of them failed.
    let mut current: Option<(String, bool)> = None;
    let finish = |current: &mut Option<(String, bool)>, map: &mut StatusMap| {
        if let Some((name, failed)) = current.take() {
            set(map, name, if failed { FAILED } else { PASSED });
        }
    };
    // After a run's plan line only its summary follows (`# tests 6`, `# pass 5`, `# ok`),
    // until the next run's `TAP version`.
    let mut after_plan = false;
    for raw in log.split('\n') {
        // Assertion diagnostics (`  ---` … `  ...`) and stack traces are indented.
        if raw.starts_with(' ') || raw.starts_with('\t') {
            continue;
        }
        let line = raw.trim_end();
        if line.starts_with("TAP version") {
            // A test still open belongs to a run that died.
            if let Some((name, _)) = current.take() {
                set(&mut map, name, FAILED);
            }
            after_plan = false;
            continue;
        }
        if after_plan {
            continue;
        }
        if PLAN.is_match(line) {
            finish(&mut current, &mut map);
            after_plan = true;
            continue;
        }
        if let Some(name) = line.strip_prefix("# SKIP ") {
            finish(&mut current, &mut map);
            set(&mut map, unique(name.trim()), SKIPPED);
        } else if let Some(name) = line.strip_prefix("# ") {
            finish(&mut current, &mut map);
            current = Some((unique(name.trim()), false));
        } else if let Some(c) = ASSERT.captures(line) {
            let skipped = group(&c, 2).contains("# SKIP") || group(&c, 2).contains("# TODO");
            if let Some((_, failed)) = current.as_mut() {
                *failed |= group(&c, 1) == "not ok" && !skipped;
            }
        }
    }
    // No plan line: the run stopped early, inside `current`.
    if let Some((name, _)) = current.take() {
        set(&mut map, name, FAILED);
    }
    Ok(map)
}

#[cfg(test)]
mod tape_tests {
    use super::*;

    /// tape 5.10.2's output (abridged diagnostics) for two files that both have a test named
    /// "adds numbers", a failing test, nested subtests and a skipped test.
    const FINISHED: &str = "TAP version 13\n# adds numbers\nok 1 should be equal\nok 2 should be equal\n\
        # fails one\nnot ok 3 should be strictly equal\n  ---\n    operator: equal\n    expected: 2\n    actual:   1\n  ...\n\
        ok 4 should be truthy\n# nested\n# child one\nok 5 yes\n# SKIP skipped\n# adds numbers\nok 6 should be equal\n\
        # with todo\nok 7 not now # SKIP\n\n1..7\n# tests 7\n# pass  6\n# fail  1\n";

    #[test]
    fn a_test_fails_when_one_of_its_assertions_fails() {
        let m = parse_tape_tests(FINISHED).unwrap();
        let get = |k: &str| m.get(k).map(String::as_str);
        assert_eq!(get("adds numbers"), Some(PASSED));
        assert_eq!(get("fails one"), Some(FAILED));
        assert_eq!(get("nested"), Some(PASSED));
        assert_eq!(get("child one"), Some(PASSED));
        assert_eq!(get("skipped"), Some(SKIPPED));
        assert_eq!(get("adds numbers (2)"), Some(PASSED));
        assert_eq!(get("with todo"), Some(PASSED));
        // The summary after the plan is not a test.
        assert_eq!(m.len(), 7, "{m:?}");
        assert!(!m.contains_key("tests 7") && !m.contains_key("pass  6"));
    }

    #[test]
    fn runs_one_after_another_each_read_and_a_crash_loses_only_its_own() {
        // One tape process per file: the first finishes, the second dies at load (no test
        // opened), the third dies inside its second test, the fourth finishes.
        let log = "TAP version 13\n# adds\nok 1 fine\n\n1..1\n# tests 1\n# pass  1\n\n# ok\n\n\
            node:fs:1822\nError: ENOENT: no such file or directory, symlink\n    at Object.symlinkSync\n\
            TAP version 13\n# first\nok 1 fine\n# dies\nError: boom\n    at Test\n\
            TAP version 13\n# adds\nnot ok 1 should be equal\n\n1..1\n# tests 1\n# fail  1\n";
        let m = parse_tape_tests(log).unwrap();
        let get = |k: &str| m.get(k).map(String::as_str);
        assert_eq!(get("adds"), Some(PASSED));
        assert_eq!(get("first"), Some(PASSED));
        assert_eq!(get("dies"), Some(FAILED));
        assert_eq!(get("adds (2)"), Some(FAILED));
        // Summary lines of a finished run are not tests.
        assert_eq!(m.len(), 4, "{m:?}");
    }

    #[test]
    fn a_run_that_dies_fails_the_test_it_died_in() {
        let log = "TAP version 13\n# first\nok 1 fine\n# throws\n/tmp/x/test/a.js:5\n\
            test('throws', function (t) { throw new Error('boom'); });\n\nError: boom\n    at Test.<anonymous>\n\nNode.js v20.20.2\n";
        let m = parse_tape_tests(log).unwrap();
        assert_eq!(m.get("first").map(String::as_str), Some(PASSED));
        assert_eq!(m.get("throws").map(String::as_str), Some(FAILED));
        assert_eq!(m.len(), 2);
    }
}
