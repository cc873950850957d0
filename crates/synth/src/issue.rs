//! Issue text from the failing tests' observable behaviour: what was called, what was
//! expected, what happened — never the diff, the fix, the mutated line, test names or
//! test-framework words. [`leak_problems`] is the check every text (template or
//! model-written) must pass.

use std::path::Path;

use crate::project::TestRunner;

/// What one failing check showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The expression that was evaluated (`add(2, 3)`), when recognisable.
    pub call: Option<String>,
    /// What it should have produced.
    pub expected: Option<String>,
    /// What happened: a value, or an exception `Type: message`.
    pub actual: Option<String>,
    /// An exception was raised (or a panic) rather than a wrong value returned.
    pub raised: bool,
}

/// The material an issue is written from.
#[derive(Debug, Clone)]
pub struct IssueContext<'a> {
    /// Test framework (decides how the log is read).
    pub runner: TestRunner,
    /// The bug run's log.
    pub bug_log: &'a str,
    /// FAIL_TO_PASS ids.
    pub fail_to_pass: &'a [String],
    /// PASS_TO_PASS ids (must not be named either).
    pub pass_to_pass: &'a [String],
    /// Clean tree, to read source lines a panic location points at.
    pub tree: &'a Path,
    /// The bug diff (buggy minus clean) — its changed lines must not appear.
    pub bug_diff: &'a str,
    /// Functions the bug is in (`module.func`); naming them is allowed.
    pub entities: &'a [String],
    /// Operators used (their names must not appear).
    pub operators: &'a [String],
}

/// Splits `s` at top-level commas (outside brackets and quotes).
fn split_args(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut depth, mut quote, mut cur) = (0i32, None::<char>, String::new());
    let mut prev = ' ';
    for ch in s.chars() {
        match quote {
            Some(q) => {
                if ch == q && prev != '\\' {
                    quote = None;
                }
            }
            None => match ch {
                '"' | '\'' => quote = Some(ch),
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(cur.trim().to_string());
                    cur.clear();
                    prev = ch;
                    continue;
                }
                _ => {}
            },
        }
        cur.push(ch);
        prev = ch;
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// Splits `a == b` at a top-level `==`.
fn split_eq(s: &str) -> Option<(String, String)> {
    let bytes = s.as_bytes();
    let mut depth = 0i32;
    let mut i = 0;
    while i + 1 < bytes.len() {
        match bytes[i] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            b'=' if depth == 0 && bytes[i + 1] == b'=' && i > 0 && !b"!<>=".contains(&bytes[i - 1]) => {
                return Some((s[..i].trim().to_string(), s[i + 2..].trim().to_string()));
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Reads an assertion source line into (call, expected).
fn parse_assertion(line: &str) -> (Option<String>, Option<String>) {
    let line = line.trim().trim_end_matches(';');
    for prefix in ["assert_eq!(", "self.assertEqual(", "assertEqual(", "self.assertEquals(", "debug_assert_eq!("] {
        if let Some(rest) = line.strip_prefix(prefix) {
            let args = split_args(rest.strip_suffix(')').unwrap_or(rest));
            if args.len() >= 2 {
                return (Some(args[0].clone()), Some(args[1].clone()));
            }
        }
    }
    for (prefix, expected) in [
        ("self.assertTrue(", "a true value"),
        ("self.assertFalse(", "a false value"),
        ("self.assertIsNone(", "None"),
        ("assert!(", "true"),
    ] {
        if let Some(rest) = line.strip_prefix(prefix) {
            let args = split_args(rest.strip_suffix(')').unwrap_or(rest));
            if let Some(first) = args.first() {
                if let Some((a, b)) = split_eq(first) {
                    return (Some(a), Some(b));
                }
                return (Some(first.clone()), Some(expected.to_string()));
            }
        }
    }
    if let Some(rest) = line.strip_prefix("assert ") {
        let rest = rest.split(", \"").next().unwrap_or(rest);
        if let Some((a, b)) = split_eq(rest) {
            return (Some(a), Some(b));
        }
        if let Some(r) = rest.strip_prefix("not ") {
            return (Some(r.to_string()), Some("a false value".into()));
        }
        return (Some(rest.to_string()), Some("a true value".into()));
    }
    // A plain call in the failing frame (an exception was raised from it).
    let expr = line.split_once(" = ").map_or(line, |(_, r)| r).trim();
    if expr.contains('(') && !expr.starts_with("with ") && !expr.starts_with("for ") {
        return (Some(expr.to_string()), None);
    }
    (None, None)
}

fn pytest_sections<'l>(log: &'l str, test: &str) -> Option<Vec<&'l str>> {
    // Section header: `____ name ____` where name is the test function (or Class.method).
    let func = test.rsplit("::").next().unwrap_or(test);
    let class = test.split("::").nth(1).filter(|_| test.matches("::").count() >= 2);
    let wanted = match class {
        Some(c) => format!("{c}.{func}"),
        None => func.to_string(),
    };
    let lines: Vec<&str> = log.lines().collect();
    let start = lines.iter().position(|l| {
        let t = l.trim();
        t.starts_with('_') && t.ends_with('_') && t.trim_matches('_').trim() == wanted
    })?;
    let end = lines[start + 1..]
        .iter()
        .position(|l| {
            let t = l.trim();
            (t.starts_with("___") && t.ends_with("___")) || t.starts_with("====")
        })
        .map_or(lines.len(), |i| start + 1 + i);
    Some(lines[start + 1..end].to_vec())
}

fn observe_pytest(log: &str, test: &str) -> Option<Observation> {
    let section = pytest_sections(log, test)?;
    let source = section.iter().find(|l| l.starts_with('>')).map(|l| l[1..].trim().to_string());
    let e_lines: Vec<&str> = section.iter().filter(|l| l.starts_with("E ")).map(|l| l[1..].trim()).collect();
    let first_e = e_lines.first().copied().unwrap_or("");
    let (call, expected) = source.as_deref().map(parse_assertion).unwrap_or((None, None));
    let mut obs = Observation { call, expected, actual: None, raised: false };
    if let Some(rest) = first_e.strip_prefix("assert ") {
        // `assert 6 == 5`: the evaluated left side is the observed value.
        obs.actual = split_eq(rest).map(|(a, _)| a).or_else(|| Some(rest.to_string()));
        if let Some(w) = e_lines.iter().find_map(|l| l.trim_start_matches('+').trim().strip_prefix("where ")) {
            if let Some((value, _)) = w.split_once(" = ") {
                obs.actual = Some(value.trim().to_string());
            }
        }
    } else if first_e.starts_with("AssertionError") {
        obs.actual = Some(first_e.trim_start_matches("AssertionError").trim_start_matches(':').trim().to_string())
            .filter(|s| !s.is_empty());
    } else if !first_e.is_empty() {
        obs.actual = Some(first_e.to_string());
        obs.raised = true;
    }
    Some(obs)
}

fn observe_unittest(log: &str, test: &str) -> Option<Observation> {
    let lines: Vec<&str> = log.lines().collect();
    let header = lines.iter().position(|l| {
        (l.starts_with("FAIL: ") || l.starts_with("ERROR: ")) && l.split_once(": ").is_some_and(|(_, r)| r == test)
    })?;
    let end = lines[header + 1..]
        .iter()
        .position(|l| l.starts_with("=====") || l.starts_with("-----") && !lines[header + 1].starts_with("-----"))
        .map_or(lines.len(), |i| header + 1 + i);
    let block: Vec<&str> = lines[header + 1..end].iter().copied().filter(|l| !l.starts_with("-----")).collect();
    // The first frame's source line is the one after the first `File "...", line N, in <test>`.
    let source = block
        .iter()
        .position(|l| l.trim_start().starts_with("File \""))
        .and_then(|i| block.get(i + 1))
        .map(|l| l.trim().to_string());
    let last = block.iter().rev().find(|l| !l.trim().is_empty()).map(|l| l.trim().to_string()).unwrap_or_default();
    let (call, expected) = source.as_deref().map(parse_assertion).unwrap_or((None, None));
    let mut obs = Observation { call, expected, actual: None, raised: false };
    if let Some(msg) = last.strip_prefix("AssertionError:") {
        let msg = msg.trim();
        obs.actual = Some(msg.split_once(" != ").map_or(msg, |(a, _)| a).to_string());
    } else if !last.is_empty() {
        obs.actual = Some(last);
        obs.raised = true;
    }
    Some(obs)
}

fn observe_cargo(log: &str, test: &str, tree: &Path) -> Option<Observation> {
    let lines: Vec<&str> = log.lines().collect();
    let header = lines.iter().position(|l| l.trim() == format!("---- {test} stdout ----"))?;
    let block: Vec<&str> = lines[header + 1..]
        .iter()
        .copied()
        .take_while(|l| !l.starts_with("---- ") && !l.starts_with("failures:"))
        .collect();
    let panic_line = block.iter().position(|l| l.contains("panicked at "))?;
    let loc = block[panic_line].split("panicked at ").nth(1)?.trim_end_matches(':');
    let mut parts = loc.rsplitn(3, ':');
    let (_col, line_no, file) = (parts.next()?, parts.next()?.parse::<usize>().ok()?, parts.next()?);
    let source =
        std::fs::read_to_string(tree.join(file)).ok().and_then(|t| t.lines().nth(line_no - 1).map(str::to_string));
    let msg: Vec<&str> = block[panic_line + 1..]
        .iter()
        .copied()
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("note:"))
        .collect();
    let (call, expected) = source.as_deref().map(parse_assertion).unwrap_or((None, None));
    let mut obs = Observation { call, expected, actual: None, raised: false };
    if let Some(left) = msg.iter().find_map(|l| l.trim().strip_prefix("left:")) {
        obs.actual = Some(left.trim().to_string());
    } else if msg.first().is_some_and(|m| m.starts_with("assertion failed")) {
        obs.actual = Some("false".into());
    } else {
        obs.actual = Some(format!("a panic: {}", msg.join(" ").trim()));
        obs.raised = true;
    }
    Some(obs)
}

/// Reads what a failing test showed, from the bug log.
pub fn observe(runner: TestRunner, log: &str, test: &str, tree: &Path) -> Option<Observation> {
    match runner {
        TestRunner::Pytest => observe_pytest(log, test),
        TestRunner::Unittest => observe_unittest(log, test),
        TestRunner::Cargo => observe_cargo(log, test, tree),
        TestRunner::GoTest
        | TestRunner::NodeTest
        | TestRunner::Jest
        | TestRunner::Vitest
        | TestRunner::Mocha
        | TestRunner::Tape => None,
    }
}

fn normalise(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The words and strings an issue must not contain.
const FORBIDDEN_WORDS: &[&str] = &["test", "tests", "pytest", "unittest", "assert", "assertion", "testcase"];

/// Reasons `text` leaks the fix or the grading: changed lines of the diff, test ids or
/// names, test file paths, test-framework words, operator names. Empty = clean.
pub fn leak_problems(text: &str, ctx: &IssueContext<'_>) -> Vec<String> {
    let mut problems = Vec::new();
    let norm_text = normalise(text);
    for line in ctx.bug_diff.lines() {
        let changed =
            (line.starts_with('+') && !line.starts_with("+++")) || (line.starts_with('-') && !line.starts_with("---"));
        if !changed {
            continue;
        }
        let body = normalise(&line[1..]);
        if body.len() >= 8 && norm_text.contains(&body) {
            problems.push(format!("contains a changed line of the diff: {body:?}"));
        }
    }
    for id in ctx.fail_to_pass.iter().chain(ctx.pass_to_pass) {
        let name = id.rsplit("::").next().unwrap_or(id).split(' ').next().unwrap_or(id);
        if text.contains(id.as_str()) || (name.len() > 3 && text.contains(name)) {
            problems.push(format!("names the check {id:?}"));
        }
        let file = id.split("::").next().unwrap_or("");
        if file.ends_with(".py") && text.contains(file) {
            problems.push(format!("names the file {file:?}"));
        }
    }
    let lower = text.to_lowercase();
    for word in lower.split(|c: char| !c.is_alphanumeric() && c != '_') {
        if FORBIDDEN_WORDS.contains(&word) || word.starts_with("test_") || word.starts_with("assert") {
            problems.push(format!("uses the word {word:?}"));
        }
    }
    for op in ctx.operators {
        if lower.contains(&op.to_lowercase()) {
            problems.push(format!("names the operator {op:?}"));
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

fn bullet(o: &Observation) -> Option<String> {
    let call = o.call.as_ref()?;
    if call.contains("self.") || call.len() > 160 {
        return None;
    }
    Some(match (&o.actual, &o.expected, o.raised) {
        (Some(a), _, true) => format!("- Evaluating `{call}` fails with `{a}`; it should work."),
        (Some(a), Some(e), false) => format!("- `{call}` gives `{a}`, but `{e}` is expected."),
        (None, Some(e), _) => format!("- `{call}` does not give `{e}` as expected."),
        (Some(a), None, false) => format!("- `{call}` gives `{a}`, which is wrong."),
        (None, None, _) => return None,
    })
}

/// Writes the template issue: observed-versus-expected bullets from the failing checks,
/// each dropped if it would leak; falls back to naming the affected function.
pub fn template_issue(ctx: &IssueContext<'_>) -> String {
    let mut bullets: Vec<String> = Vec::new();
    for t in ctx.fail_to_pass {
        if bullets.len() >= 3 {
            break;
        }
        let Some(obs) = observe(ctx.runner, ctx.bug_log, t, ctx.tree) else { continue };
        let Some(b) = bullet(&obs) else { continue };
        if !bullets.contains(&b) && leak_problems(&b, ctx).is_empty() {
            bullets.push(b);
        }
    }
    let subject = ctx
        .entities
        .first()
        .map(|e| e.rsplit("::").next().unwrap_or(e).to_string())
        .unwrap_or_else(|| "the library".into());
    let mut text = if bullets.is_empty() {
        format!(
            "Wrong behaviour around `{subject}`\n\nResults involving `{subject}` are not what the documentation and \
             earlier releases give: calls that used to return correct values now return wrong ones or raise.\n\n\
             Expected: `{subject}` behaves as before."
        )
    } else {
        format!(
            "Incorrect results from the library\n\nI ran into the following:\n\n{}\n\nExpected: these calls return the \
             values described above instead of what they do now.",
            bullets.join("\n")
        )
    };
    text.push('\n');
    if !leak_problems(&text, ctx).is_empty() {
        // The subject itself leaked (e.g. its name equals a changed line): minimal text.
        text = "Some calls into the library return wrong results or raise where they used to work. Expected: the \
                previous, correct behaviour.\n"
            .into();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx<'a>(runner: TestRunner, log: &'a str, f2p: &'a [String], diff: &'a str) -> IssueContext<'a> {
        IssueContext {
            runner,
            bug_log: log,
            fail_to_pass: f2p,
            pass_to_pass: &[],
            tree: Path::new("/nonexistent"),
            bug_diff: diff,
            entities: &[],
            operators: &[],
        }
    }

    #[test]
    fn pytest_failure_becomes_observed_vs_expected() {
        let log = "____ test_add ____\n\n    def test_add():\n>       assert add(2, 3) == 5\nE       assert -1 == 5\nE        +  where -1 = add(2, 3)\n\ntests/test_calc.py:4: AssertionError\n==== short test summary info ====\nFAILED tests/test_calc.py::test_add\n";
        let f2p = vec!["tests/test_calc.py::test_add".to_string()];
        let diff = "--- a/calc.py\n+++ b/calc.py\n-    return a + b\n+    return a - b\n";
        let c = ctx(TestRunner::Pytest, log, &f2p, diff);
        let o = observe(TestRunner::Pytest, log, &f2p[0], Path::new("/")).unwrap();
        assert_eq!(o.call.as_deref(), Some("add(2, 3)"));
        assert_eq!(o.actual.as_deref(), Some("-1"));
        let text = template_issue(&c);
        assert!(text.contains("`add(2, 3)` gives `-1`, but `5` is expected"), "{text}");
        assert!(leak_problems(&text, &c).is_empty());
    }

    #[test]
    fn unittest_failure_and_exceptions() {
        let log = "======================================================================\nERROR: test_div (tests.test_calc.CalcTest.test_div)\n----------------------------------------------------------------------\nTraceback (most recent call last):\n  File \"/w/tests/test_calc.py\", line 9, in test_div\n    self.assertEqual(safe_div(4, 2), 2)\n  File \"/w/calc.py\", line 3, in safe_div\n    return a / (b - b)\nZeroDivisionError: division by zero\n\n----------------------------------------------------------------------\n";
        let f2p = ["test_div (tests.test_calc.CalcTest.test_div)".to_string()];
        let o = observe(TestRunner::Unittest, log, &f2p[0], Path::new("/")).unwrap();
        assert_eq!(o.call.as_deref(), Some("safe_div(4, 2)"));
        assert!(o.raised && o.actual.as_deref() == Some("ZeroDivisionError: division by zero"));
    }

    #[test]
    fn leak_check_catches_diff_lines_names_and_framework_words() {
        let f2p = vec!["tests/test_calc.py::test_add".to_string()];
        let diff = "-    return total + value\n+    return total - value\n";
        let c = ctx(TestRunner::Pytest, "", &f2p, diff);
        assert!(!leak_problems("change it to return total + value please", &c).is_empty());
        assert!(!leak_problems("test_add fails", &c).is_empty());
        assert!(!leak_problems("The pytest run is red", &c).is_empty());
        assert!(leak_problems("`add(1, 2)` gives `-1`, but `3` is expected.", &c).is_empty());
    }

    #[test]
    fn assertions_are_split_at_top_level() {
        assert_eq!(
            parse_assertion("assert_eq!(total(&[1, 2], 3), 6);"),
            (Some("total(&[1, 2], 3)".into()), Some("6".into()))
        );
        assert_eq!(parse_assertion("assert f(a == b) == [1, 2]"), (Some("f(a == b)".into()), Some("[1, 2]".into())));
    }
}
