//! The test command a Python project declares for itself, in `tox.ini` (`[testenv]
//! commands`) or `noxfile.py` (`session.run("pytest", …)`): the last rung of synth's retry
//! ladder when the default pytest / unittest discovery finds nothing or fails, because some
//! projects keep their tests where discovery does not look (`tests/*_tests.py`, a custom
//! `-p` pattern, a `--pyargs` package) and say so only there.
//!
//! Only commands whose output a SWE-bench parser reads are taken: pytest (`pytest`,
//! `py.test`, `python -m pytest`, under `coverage run -m`) and unittest (`python -m
//! unittest`). Options that would change what a run reports are dropped: coverage
//! (`--cov*`), stopping early (`-x`, `--maxfail`), parallel workers (`-n`).

use std::path::Path;

/// A runner and the arguments the project gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredCommand {
    /// `pytest` or `unittest`.
    pub runner: DeclaredRunner,
    /// Arguments after the runner (`tests --doctest-modules`, `discover -s tests -p
    /// *_tests.py`), unquoted, placeholders removed.
    pub args: Vec<String>,
    /// Where it was read (`tox.ini [testenv] commands`, `noxfile.py`).
    pub source: String,
}

/// The runners a declared command may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclaredRunner {
    /// pytest, with the project's arguments.
    Pytest,
    /// `python -m unittest`, with the project's arguments.
    Unittest,
}

/// The first test command `tree` declares in `tox.ini`, then `noxfile.py`.
pub fn declared_command(tree: &Path) -> Option<DeclaredCommand> {
    if let Ok(text) = std::fs::read_to_string(tree.join("tox.ini")) {
        for (section, line) in tox_commands(&text) {
            if let Some((runner, args)) = parse_command(&shell_words(&line)) {
                return Some(DeclaredCommand { runner, args, source: format!("tox.ini [{section}] commands") });
            }
        }
    }
    if let Ok(text) = std::fs::read_to_string(tree.join("noxfile.py")) {
        for words in nox_runs(&text) {
            if let Some((runner, args)) = parse_command(&words) {
                return Some(DeclaredCommand { runner, args, source: "noxfile.py session.run".into() });
            }
        }
    }
    None
}

/// The command lines of every `[testenv]` / `[testenv:NAME]` section's `commands` (in file
/// order, `[testenv]` first), continuation lines joined, `{posargs}` and other substitutions
/// resolved to what a plain run would use.
fn tox_commands(ini: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut in_commands = false;
    for raw in ini.lines() {
        let line = raw.split(" #").next().unwrap_or("");
        let trimmed = line.trim();
        if trimmed.starts_with('[') && trimmed.ends_with(']') {
            section = trimmed[1..trimmed.len() - 1].trim().to_string();
            in_commands = false;
            continue;
        }
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        let continuation = line.starts_with([' ', '\t']);
        if !continuation {
            in_commands = false;
            if let Some((key, value)) = trimmed.split_once('=') {
                if key.trim() == "commands" && (section == "testenv" || section.starts_with("testenv:")) {
                    in_commands = true;
                    if !value.trim().is_empty() {
                        out.push((section.clone(), substitute(command_start(value))));
                    }
                }
            }
        } else if in_commands {
            // A trailing backslash joins the next line to this command.
            match out.last_mut() {
                Some((_, prev)) if prev.ends_with('\\') => {
                    prev.pop();
                    prev.push(' ');
                    prev.push_str(&substitute(trimmed));
                }
                _ => out.push((section.clone(), substitute(command_start(trimmed)))),
            }
        }
    }
    // The plain `[testenv]` is what `tox` runs for every environment; named ones after it.
    out.sort_by_key(|(s, _)| s != "testenv");
    out
}

/// A command line without tox's leading `-` (run it, ignore its exit code).
fn command_start(line: &str) -> &str {
    line.trim().strip_prefix('-').unwrap_or(line.trim()).trim_start()
}

/// tox substitutions: `{posargs}` → nothing, `{posargs:DEFAULT}` → DEFAULT, `{envpython}` →
/// `python`, `{toxinidir}` → `.`.
fn substitute(cmd: &str) -> String {
    let mut out = String::new();
    let mut rest = cmd.trim();
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            out.push_str(&rest[open..]);
            rest = "";
            break;
        };
        let inner = &rest[open + 1..open + close];
        out.push_str(match inner.split_once(':') {
            Some(("posargs", default)) => default,
            _ => match inner {
                "envpython" => "python",
                "toxinidir" | "toxworkdir" => ".",
                _ => "",
            },
        });
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out.trim().to_string()
}

/// The argument lists of `session.run("…", "…", …)` calls whose arguments are all string
/// literals (later arguments such as `*session.posargs` end the list).
fn nox_runs(py: &str) -> Vec<Vec<String>> {
    let call = regex::Regex::new(r"session\.run\(([^)]*)\)").expect("static regex");
    let literal = regex::Regex::new(r#"^\s*(?:"([^"]*)"|'([^']*)')\s*$"#).expect("static regex");
    call.captures_iter(py)
        .map(|c| {
            c[1].split(',')
                .map_while(|a| literal.captures(a).map(|l| l.get(1).or(l.get(2)).unwrap().as_str().to_string()))
                .collect()
        })
        .filter(|w: &Vec<String>| !w.is_empty())
        .collect()
}

/// Splits a command line as a POSIX shell would (quotes removed), enough for tox lines.
pub(crate) fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if !cur.is_empty() || any {
                    words.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (None, c) => cur.push(c),
        }
    }
    if !cur.is_empty() || any {
        words.push(cur);
    }
    words
}

/// The runner and kept arguments of one command, if it runs pytest or unittest.
fn parse_command(words: &[String]) -> Option<(DeclaredRunner, Vec<String>)> {
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    let is_python = |s: &str| {
        let base = s.rsplit('/').next().unwrap_or(s);
        base == "python" || base.starts_with("python3")
    };
    // Where the runner's own arguments start, and which runner.
    let (runner, at) = match w.as_slice() {
        ["pytest" | "py.test", ..] => (DeclaredRunner::Pytest, 1),
        [py, "-m", "pytest", ..] if is_python(py) => (DeclaredRunner::Pytest, 3),
        [py, "-m", "unittest", ..] if is_python(py) => (DeclaredRunner::Unittest, 3),
        ["coverage", "run", rest @ ..] => {
            let m = rest.iter().position(|a| *a == "-m")?;
            match rest.get(m + 1) {
                Some(&"pytest") => (DeclaredRunner::Pytest, 2 + m + 2),
                Some(&"unittest") => (DeclaredRunner::Unittest, 2 + m + 2),
                _ => return None,
            }
        }
        _ => return None,
    };
    let mut args = Vec::new();
    let mut i = at;
    while i < w.len() {
        let (a, next) = (w[i], w.get(i + 1).copied());
        // How many words this option spans when it is dropped (0: kept).
        let drop = match a {
            "-x" | "--exitfirst" => 1,
            "-n" | "--numprocesses" | "--maxfail" | "--cov-report" | "--cov-config" | "--cov-fail-under" => 2,
            // `--cov` takes an optional source: the next word unless it is an option or a
            // test path.
            "--cov" => 1 + usize::from(next.is_some_and(|n| !n.starts_with('-') && !n.contains("test"))),
            "-p" if next.is_some_and(|n| n.starts_with("xdist")) => 2,
            _ if a.starts_with("--cov") || a.starts_with("--maxfail=") || a.starts_with("--numprocesses=") => 1,
            _ => 0,
        };
        if drop > 0 {
            i += drop;
            continue;
        }
        args.push(a.to_string());
        i += 1;
    }
    Some((runner, args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(files: &[(&str, &str)]) -> Option<DeclaredCommand> {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        declared_command(dir.path())
    }

    #[test]
    fn tox_commands_with_substitutions_and_continuations() {
        let ini = "[tox]\nenvlist = py38,lint\n\n[testenv:lint]\ncommands = flake8 src\n\n\
                   [testenv]\ndeps = pytest\ncommands =\n    -pip list\n    coverage run --source=pkg -m pytest \\\n        \
                   --cov=pkg -x tests/unit {posargs:--doctest-modules}\n";
        let got = declared(&[("tox.ini", ini)]).unwrap();
        assert_eq!(got.runner, DeclaredRunner::Pytest);
        assert_eq!(got.args, ["tests/unit", "--doctest-modules"]);
        assert_eq!(got.source, "tox.ini [testenv] commands");
        // unittest discovery with a pattern default discovery would miss.
        let ini = "[testenv]\ncommands = {envpython} -m unittest discover -s tests -p \"*_tests.py\" {posargs}\n";
        let got = declared(&[("tox.ini", ini)]).unwrap();
        assert_eq!(got.runner, DeclaredRunner::Unittest);
        assert_eq!(got.args, ["discover", "-s", "tests", "-p", "*_tests.py"]);
        // Nothing a parser reads: no command.
        assert_eq!(declared(&[("tox.ini", "[testenv]\ncommands = nosetests -v\n    python setup.py test\n")]), None);
        assert_eq!(declared(&[("setup.py", "")]), None);
    }

    #[test]
    fn nox_sessions_and_dropped_options() {
        let nox = "import nox\n\n@nox.session\ndef lint(session):\n    session.run(\"ruff\", \"check\")\n\n\
                   @nox.session(python=['3.11'])\ndef tests(session):\n    session.install('.')\n    \
                   session.run('pytest', '-n', 'auto', '--maxfail=3', 'tests', *session.posargs)\n";
        let got = declared(&[("noxfile.py", nox)]).unwrap();
        assert_eq!((got.runner, got.args.as_slice()), (DeclaredRunner::Pytest, &["tests".to_string()][..]));
        assert_eq!(got.source, "noxfile.py session.run");
        // tox.ini is read first.
        let both = declared(&[("noxfile.py", nox), ("tox.ini", "[testenv]\ncommands = py.test -p no:xdist src\n")]);
        assert_eq!(both.unwrap().args, ["-p", "no:xdist", "src"]);
    }
}
