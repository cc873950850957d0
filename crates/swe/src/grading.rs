//! Grading, as `swebench/harness/grading.py` (5.0.2) does it: log → status map → tests
//! report → FULL / PARTIAL / NO → per-instance report.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{json, Map, Value};

use crate::parsers::{parse_log_with, ParseContext, ParseError};
use crate::status::StatusMap;

/// Marker the eval script echoes (via `set -x`) right before the test command.
pub const START_TEST_OUTPUT: &str = ">>>>> Start Test Output";
/// Marker echoed right after the test command.
pub const END_TEST_OUTPUT: &str = ">>>>> End Test Output";
/// Prefix of the line that records the test command's own exit status.
pub const TEST_EXIT_CODE: &str = ">>>>> Test Exit Code";
/// Shell variable holding the recorded exit status.
pub const TEST_EXIT_CODE_VAR: &str = "SWEBENCH_TEST_EXIT_CODE";
/// Logged when a patch applied.
pub const APPLY_PATCH_PASS: &str = ">>>>> Applied Patch";
/// Logged when no command of the apply chain worked.
pub const APPLY_PATCH_FAIL: &str = ">>>>> Patch Apply Failed";
/// Logged when resetting the workspace failed.
pub const RESET_FAILED: &str = ">>>>> Reset Failed";
/// Logged when the tests could not be run.
pub const TESTS_ERROR: &str = ">>>>> Tests Errored";
/// Logged when the tests timed out.
pub const TESTS_TIMEOUT: &str = ">>>>> Tests Timed Out";

/// How listed tests are judged (`EvalType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvalType {
    /// Listed tests must pass (`pass_and_fail`).
    #[default]
    PassAndFail,
    /// Only an explicit `FAILED` counts as failure (`fail_only`).
    FailOnly,
}

impl EvalType {
    /// Parses swebench's spelling.
    pub fn parse(s: &str) -> Option<EvalType> {
        match s {
            "pass_and_fail" => Some(EvalType::PassAndFail),
            "fail_only" => Some(EvalType::FailOnly),
            _ => None,
        }
    }
    /// swebench's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            EvalType::PassAndFail => "pass_and_fail",
            EvalType::FailOnly => "fail_only",
        }
    }
}

/// Repositories swebench 4.x graded `fail_only` (`FAIL_ONLY_REPOS`); v5 carries `eval_type`.
pub const FAIL_ONLY_REPOS: &[&str] = &[
    "chartjs/Chart.js",
    "processing/p5.js",
    "markedjs/marked",
    "bpmn-io/bpmn-js",
    "openlayers/openlayers",
    "eslint/eslint",
];

/// `get_resolution_status`'s three outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolutionStatus {
    /// All F2P and all P2P succeed.
    Full,
    /// Some but not all F2P succeed, all P2P succeed. Not resolved.
    Partial,
    /// Anything else.
    No,
}

impl ResolutionStatus {
    /// swebench's `ResolvedStatus` value.
    pub fn as_str(self) -> &'static str {
        match self {
            ResolutionStatus::Full => "RESOLVED_FULL",
            ResolutionStatus::Partial => "RESOLVED_PARTIAL",
            ResolutionStatus::No => "RESOLVED_NO",
        }
    }
}

/// Why a log could not be graded at all (swebench raises; no report.json is written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GradeError {
    /// The parser is unknown, not ported, or crashed on this log.
    #[error(transparent)]
    Parser(#[from] ParseError),
    /// The log is not valid UTF-8 (Python's strict read raises `UnicodeDecodeError`).
    #[error("test log is not valid UTF-8 at byte {0}")]
    InvalidUtf8(usize),
}

/// The evidence regex swebench uses to tell "ran with no parsed results" from "never ran".
static SUITE_RAN: LazyLock<Regex> = LazyLock::new(|| {
    let s = crate::pytext::PY_SPACE_CLASS;
    Regex::new(&format!(
        r"(?m)Executed [1-9]\d* of \d+|TOTAL: [1-9]\d* (?:SUCCESS|FAILED)|[1-9]\d* passing|Tests:{s}+[1-9]\d*|Test Suites:{s}+(?:\d+ \w+, )*[1-9]\d* total|^# tests [1-9]\d*|[1-9]\d* specs?, \d+ failures?|': ok$"
    ))
    .unwrap()
});

/// `parse_test_exit_code`: the first recorded test exit status. A number too large for
/// `i64` is still a non-zero status, so it saturates instead of being dropped.
pub fn parse_test_exit_code(text: &str) -> Option<i64> {
    static RE: LazyLock<Regex> = LazyLock::new(|| {
        let s = crate::pytext::PY_SPACE_CLASS;
        Regex::new(&format!(r">>>>> Test Exit Code:{s}*(-?\d+)")).unwrap()
    });
    let c = RE.captures(text)?;
    let digits = &c[1];
    Some(digits.parse::<i64>().unwrap_or_else(|_| {
        // Unicode digits (Python's \d) or overflow: keep zero-ness, which is all we use.
        if digits.chars().all(|ch| ch == '0' || ch == '-') {
            0
        } else if digits.starts_with('-') {
            i64::MIN
        } else {
            i64::MAX
        }
    }))
}

/// `get_logs_eval` on already-decoded text (universal newlines applied): the status map and
/// whether the log is usable.
pub fn logs_eval(text: &str, parser: &str) -> Result<(StatusMap, bool), GradeError> {
    logs_eval_with(text, parser, &ParseContext::default())
}

/// [`logs_eval`] with the instance context some parsers need (see [`ParseContext`]).
pub fn logs_eval_with(text: &str, parser: &str, ctx: &ParseContext) -> Result<(StatusMap, bool), GradeError> {
    if [APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT].iter().any(|m| text.contains(m)) {
        return Ok((StatusMap::new(), false));
    }
    if !(text.contains(START_TEST_OUTPUT) && text.contains(END_TEST_OUTPUT)) {
        return Ok((StatusMap::new(), false));
    }
    // Python: content.split(START)[1].split(END)[0]
    let after_start = text.split(START_TEST_OUTPUT).nth(1).unwrap_or("");
    let sliced = crate::pytext::before_first(after_start, END_TEST_OUTPUT);
    let mut map = parse_log_with(parser, sliced, ctx)?;
    if map.is_empty() {
        map = parse_log_with(parser, text, ctx)?;
    }
    if map.is_empty() && !SUITE_RAN.is_match(text) {
        return Ok((StatusMap::new(), false));
    }
    let exit_code = parse_test_exit_code(text);
    if matches!(exit_code, Some(c) if c != 0) && !map.is_empty() && !map.values().any(|s| s == "FAILED" || s == "ERROR")
    {
        return Ok((StatusMap::new(), false));
    }
    Ok((map, true))
}

/// `get_logs_eval` on the raw bytes of a log file.
pub fn logs_eval_bytes(bytes: &[u8], parser: &str) -> Result<(StatusMap, bool), GradeError> {
    logs_eval_bytes_with(bytes, parser, &ParseContext::default())
}

/// [`logs_eval_bytes`] with the instance context.
pub fn logs_eval_bytes_with(bytes: &[u8], parser: &str, ctx: &ParseContext) -> Result<(StatusMap, bool), GradeError> {
    let text = crate::pytext::read_text_strict(bytes).map_err(|e| GradeError::InvalidUtf8(e.valid_up_to()))?;
    logs_eval_with(&text, parser, ctx)
}

fn is_passing(status: &str) -> bool {
    status == "PASSED" || status == "XFAIL"
}

/// `_resolve_case`: the map key for an expected id; exact match, else (only for ids with
/// more `[` than `]`, i.e. truncated parametrised ids) the first key starting with it, when
/// all such keys agree on passing versus not.
pub fn resolve_case<'a>(case: &str, map: &'a StatusMap) -> Option<&'a str> {
    if let Some((k, _)) = map.get_key_value(case) {
        return Some(k.as_str());
    }
    if case.matches('[').count() > case.matches(']').count() {
        let mut matches = map.iter().filter(|(k, _)| k.starts_with(case));
        let (first_key, first_status) = matches.next()?;
        let outcome = is_passing(first_status);
        if matches.all(|(_, s)| is_passing(s) == outcome) {
            return Some(first_key.as_str());
        }
    }
    None
}

fn test_passed(case: &str, map: &StatusMap) -> bool {
    resolve_case(case, map).is_some_and(|k| is_passing(&map[k]))
}

fn test_maintained(case: &str, map: &StatusMap) -> bool {
    test_passed(case, map) || resolve_case(case, map).is_some_and(|k| map[k] == "SKIPPED")
}

fn test_failed(case: &str, map: &StatusMap) -> bool {
    match resolve_case(case, map) {
        None => true,
        Some(k) => matches!(map[k].as_str(), "FAILED" | "ERROR" | "SKIPPED"),
    }
}

/// Success and failure lists for one group of tests.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SuccessFailure {
    /// Ids judged successful, in dataset order.
    pub success: Vec<String>,
    /// Ids judged failed, in dataset order.
    pub failure: Vec<String>,
}

/// `get_eval_tests_report`'s result.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TestsReport {
    /// Tests the fix must make pass.
    #[serde(rename = "FAIL_TO_PASS")]
    pub fail_to_pass: SuccessFailure,
    /// Tests that must keep passing.
    #[serde(rename = "PASS_TO_PASS")]
    pub pass_to_pass: SuccessFailure,
    /// Not graded by the harness (always empty).
    #[serde(rename = "FAIL_TO_FAIL")]
    pub fail_to_fail: SuccessFailure,
    /// Not graded by the harness (always empty).
    #[serde(rename = "PASS_TO_FAIL")]
    pub pass_to_fail: SuccessFailure,
}

/// `get_eval_tests_report` (with `calculate_to_fail=False`, as the harness calls it).
pub fn eval_tests_report(
    map: &StatusMap,
    fail_to_pass: &[String],
    pass_to_pass: &[String],
    eval_type: EvalType,
) -> TestsReport {
    let fail_only = |case: &str, out: &mut SuccessFailure| {
        if map.get(case).is_some_and(|s| s == "FAILED") {
            out.failure.push(case.to_string());
        } else {
            out.success.push(case.to_string());
        }
    };
    let mut report = TestsReport::default();
    for case in fail_to_pass {
        let out = &mut report.fail_to_pass;
        match eval_type {
            EvalType::FailOnly => fail_only(case, out),
            EvalType::PassAndFail => {
                if test_passed(case, map) {
                    out.success.push(case.clone());
                } else if test_failed(case, map) {
                    out.failure.push(case.clone());
                }
            }
        }
    }
    for case in pass_to_pass {
        let out = &mut report.pass_to_pass;
        match eval_type {
            EvalType::FailOnly => fail_only(case, out),
            EvalType::PassAndFail => {
                if test_maintained(case, map) {
                    out.success.push(case.clone());
                } else if test_failed(case, map) {
                    out.failure.push(case.clone());
                }
            }
        }
    }
    report
}

fn ratio(group: &SuccessFailure) -> f64 {
    let total = group.success.len() + group.failure.len();
    if total == 0 {
        1.0
    } else {
        group.success.len() as f64 / total as f64
    }
}

/// `compute_fail_to_pass`: share of F2P successes, 1 when there are none.
pub fn compute_fail_to_pass(report: &TestsReport) -> f64 {
    ratio(&report.fail_to_pass)
}

/// `compute_pass_to_pass`: share of P2P successes, 1 when there are none.
pub fn compute_pass_to_pass(report: &TestsReport) -> f64 {
    ratio(&report.pass_to_pass)
}

/// `get_resolution_status`.
pub fn resolution_status(report: &TestsReport) -> ResolutionStatus {
    let f2p = compute_fail_to_pass(report);
    let p2p = compute_pass_to_pass(report);
    if f2p == 1.0 && p2p == 1.0 {
        ResolutionStatus::Full
    } else if f2p < 1.0 && f2p > 0.0 && p2p == 1.0 {
        ResolutionStatus::Partial
    } else {
        ResolutionStatus::No
    }
}

/// Tier of an infrastructure-failure signature (`harness/infra_failure.py`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InfraTier {
    /// Cannot plausibly be caused by the patch; sets `infra_failure: true`.
    Environment,
    /// Could be either; only the reason is recorded.
    Ambiguous,
}

/// `classify_text`: the first matching infrastructure-failure signature.
pub fn classify_infra_failure(text: &str) -> Option<(&'static str, InfraTier)> {
    static SIGNATURES: LazyLock<Vec<(&'static str, InfraTier, Regex)>> = LazyLock::new(|| {
        use InfraTier::*;
        [
            ("browser_launch_failed", Environment, r"Failed to launch|Failed to connect to the bus"),
            ("display_unavailable", Environment, r"cannot open display|Missing X server|unable to open X display"),
            ("out_of_memory", Environment, r"Cannot allocate memory|OutOfMemoryError|^Killed$"),
            ("container_unavailable", Environment, r"Error response from daemon|Cannot connect to the Docker daemon"),
            ("network_unreachable", Environment, r"Could not resolve host|Temporary failure in name resolution"),
            ("missing_module", Ambiguous, r"Cannot find module|MODULE_NOT_FOUND|ModuleNotFoundError"),
            ("no_tests_collected", Ambiguous, r"no tests ran|collected 0 items"),
            ("tests_timed_out", Ambiguous, r"Timeout error: \d+ seconds exceeded"),
        ]
        .into_iter()
        .map(|(r, t, p)| (r, t, Regex::new(&format!("(?m){p}")).unwrap()))
        .collect()
    });
    if text.is_empty() {
        return None;
    }
    SIGNATURES.iter().find(|(_, _, re)| re.is_match(text)).map(|(r, t, _)| (*r, *t))
}

/// `classify_logs`: classifies the existing files among `paths`, joined by newlines.
pub fn classify_infra_failure_files(paths: &[&std::path::Path]) -> Option<(&'static str, InfraTier)> {
    let chunks: Vec<String> =
        paths.iter().filter_map(|p| std::fs::read(p).ok()).map(|b| crate::pytext::read_text_replace(&b)).collect();
    classify_infra_failure(&chunks.join("\n"))
}

/// What grading one instance needs: the instance's test lists, parser and eval type.
#[derive(Debug, Clone)]
pub struct GradingSpec {
    /// Instance id (the report's key).
    pub instance_id: String,
    /// Tests that must go from failing to passing.
    pub fail_to_pass: Vec<String>,
    /// Tests that must keep passing.
    pub pass_to_pass: Vec<String>,
    /// Registry name of the log parser.
    pub log_parser: String,
    /// How listed tests are judged.
    pub eval_type: EvalType,
    /// What spec-dependent parsers read (instance id, version).
    pub context: ParseContext,
}

/// Everything grading derives from one log, for inspection and parity checks.
#[derive(Debug, Clone)]
pub struct Grade {
    /// The per-instance report, exactly as swebench's `get_eval_report` returns it.
    pub report: Value,
    /// Whether the instance is resolved.
    pub resolved: bool,
    /// The status map, when the log was usable.
    pub status_map: Option<StatusMap>,
    /// The tests report, when the log was usable.
    pub tests_report: Option<TestsReport>,
    /// Resolution status, when the log was usable.
    pub resolution: Option<ResolutionStatus>,
}

/// `get_eval_report(spec, prediction, log, include_tests_status=True)`.
///
/// `model_patch` is `None` for a `null` patch (early return, `patch_is_None: true`).
/// `log_bytes` is the content of `test_output.txt`; `extra_logs` are the other logs
/// `classify_logs` reads (swebench passes only the test log here).
pub fn eval_report(spec: &GradingSpec, model_patch: Option<&str>, log_bytes: &[u8]) -> Result<Grade, GradeError> {
    let mut entry = Map::new();
    entry.insert("patch_is_None".into(), json!(false));
    entry.insert("patch_exists".into(), json!(false));
    entry.insert("patch_successfully_applied".into(), json!(false));
    entry.insert("resolved".into(), json!(false));
    entry.insert("infra_failure".into(), json!(false));
    let wrap = |entry: Map<String, Value>| {
        let mut outer = Map::new();
        outer.insert(spec.instance_id.clone(), Value::Object(entry));
        Value::Object(outer)
    };
    let mut grade =
        Grade { report: Value::Null, resolved: false, status_map: None, tests_report: None, resolution: None };
    if model_patch.is_none() {
        entry.insert("patch_is_None".into(), json!(true));
        grade.report = wrap(entry);
        return Ok(grade);
    }
    entry.insert("patch_exists".into(), json!(true));
    let (map, found) = logs_eval_bytes_with(log_bytes, &spec.log_parser, &spec.context)?;
    if !found {
        let text = crate::pytext::read_text_replace(log_bytes);
        if let Some((reason, tier)) = classify_infra_failure(&text) {
            entry.insert("infra_failure".into(), json!(tier == InfraTier::Environment));
            entry.insert("infra_failure_reason".into(), json!(reason));
        }
        grade.report = wrap(entry);
        return Ok(grade);
    }
    entry.insert("patch_successfully_applied".into(), json!(true));
    let tests = eval_tests_report(&map, &spec.fail_to_pass, &spec.pass_to_pass, spec.eval_type);
    let resolution = resolution_status(&tests);
    grade.resolved = resolution == ResolutionStatus::Full;
    entry.insert("resolved".into(), json!(grade.resolved));
    entry.insert("tests_status".into(), serde_json::to_value(&tests).expect("plain struct serialises"));
    grade.report = wrap(entry);
    grade.status_map = Some(map);
    grade.tests_report = Some(tests);
    grade.resolution = Some(resolution);
    Ok(grade)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> StatusMap {
        pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn skipped_fail_to_pass_is_a_failure_but_skipped_pass_to_pass_is_not() {
        let m = map(&[("a", "SKIPPED"), ("b", "SKIPPED")]);
        let r = eval_tests_report(&m, &["a".into()], &["b".into()], EvalType::PassAndFail);
        assert_eq!(r.fail_to_pass.failure, vec!["a"]);
        assert_eq!(r.pass_to_pass.success, vec!["b"]);
        assert_eq!(resolution_status(&r), ResolutionStatus::No);
    }

    #[test]
    fn truncated_ids_match_the_first_agreeing_prefix() {
        let m = map(&[("t[a(b)]", "PASSED"), ("t[a(c)]", "XFAIL")]);
        assert_eq!(resolve_case("t[a(", &m), Some("t[a(b)]"));
        let m = map(&[("t[a(b)]", "PASSED"), ("t[a(c)]", "FAILED")]);
        assert_eq!(resolve_case("t[a(", &m), None);
        // balanced brackets never prefix-match
        assert_eq!(resolve_case("t", &m), None);
    }

    #[test]
    fn spoofed_pass_with_nonzero_exit_is_not_usable() {
        let log = format!("+ : '{START_TEST_OUTPUT}'\nPASSED t::a\n+ : '{END_TEST_OUTPUT}'\n{TEST_EXIT_CODE}: 1\n");
        let (m, found) = logs_eval(&log, "parse_log_pytest").unwrap();
        assert!(!found && m.is_empty());
    }
}
