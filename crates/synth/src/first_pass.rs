//! The cheap first pass of validation (Python, pytest): a candidate is first run on only the
//! test files that import the module it mutates — directly, through a package's
//! `__init__`, through other project modules, or through a `conftest.py` above them — and
//! rejected there when none of those tests fails; only a candidate that breaks a test there
//! pays for the full suite, twice, which decides as before.
//!
//! Imports are read with tree-sitter (`import a.b`, `from a.b import c`, relative imports);
//! importing `a.b.c` counts as importing `a` and `a.b` too (their `__init__` runs). A module
//! reached only by dynamic import is missed: such a candidate is rejected as `no_failure`
//! where the full suite might have caught it — the price of the speed, measured in
//! bench/RESULTS.md.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

use crate::mutate::Language;
use crate::project::{shell_quote, TestRunner, TestSetup};

/// Which project modules each test file reaches.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct FirstPass {
    /// Test file → every project module it imports, transitively (its conftests' included).
    reach: BTreeMap<String, BTreeSet<String>>,
    /// Project file → its module name.
    modules: BTreeMap<String, String>,
    /// Baseline-passing test ids by file.
    tests_by_file: BTreeMap<String, Vec<String>>,
    /// All baseline-passing tests.
    total_tests: usize,
}

/// Folders a package may live under (`src/` layout or the root).
const SOURCE_ROOTS: [&str; 2] = ["src/", ""];

/// The module name of a Python file under one of [`SOURCE_ROOTS`] (`src/a/b.py` → `a.b`,
/// `a/__init__.py` → `a`), `None` for a non-Python file or an invalid name.
pub fn module_of(path: &str) -> Option<String> {
    let stem = path.strip_suffix(".py")?;
    let rel = SOURCE_ROOTS.iter().find_map(|r| stem.strip_prefix(r)).unwrap_or(stem);
    let rel = rel.strip_suffix("/__init__").unwrap_or(rel);
    let ok = rel.split('/').all(|p| !p.is_empty() && p.chars().all(|c| c.is_alphanumeric() || c == '_'));
    ok.then(|| rel.replace('/', "."))
}

/// `a.b.c` and each package above it: `a.b.c`, `a.b`, `a`.
fn with_parents(module: &str) -> impl Iterator<Item = String> + '_ {
    let mut cut = Some(module.len());
    std::iter::from_fn(move || {
        let end = cut?;
        let m = &module[..end];
        cut = m.rfind('.');
        Some(m.to_string())
    })
}

/// The modules `source` imports (absolute names, parents included; each `from X import n`
/// also yields `X.n`, which may be a module). `module` is the file's own module name and
/// `is_package` whether it is an `__init__.py` (relative imports resolve against them).
pub fn imports_of(source: &str, module: &str, is_package: bool) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Some(tree) = Language::Python.parse(source) else { return out };
    let text = |n: tree_sitter::Node<'_>| source[n.byte_range()].to_string();
    // The package relative imports start from.
    let package: Vec<&str> = {
        let parts: Vec<&str> = module.split('.').collect();
        if is_package {
            parts
        } else {
            parts[..parts.len().saturating_sub(1)].to_vec()
        }
    };
    let mut stack = vec![tree.root_node()];
    while let Some(node) = stack.pop() {
        match node.kind() {
            "import_statement" => {
                let mut c = node.walk();
                for name in node.children_by_field_name("name", &mut c) {
                    let target =
                        if name.kind() == "aliased_import" { name.child_by_field_name("name") } else { Some(name) };
                    if let Some(t) = target {
                        out.extend(with_parents(&text(t)).collect::<Vec<_>>());
                    }
                }
            }
            "import_from_statement" => {
                let Some(from) = node.child_by_field_name("module_name") else { continue };
                let base = if from.kind() == "relative_import" {
                    let raw = text(from);
                    let dots = raw.chars().take_while(|c| *c == '.').count();
                    let rest = raw[dots..].trim();
                    let keep = package.len().saturating_sub(dots - 1);
                    if dots - 1 > package.len() {
                        continue;
                    }
                    let mut parts: Vec<&str> = package[..keep].to_vec();
                    if !rest.is_empty() {
                        parts.push(rest);
                    }
                    parts.join(".")
                } else {
                    text(from)
                };
                if base.is_empty() {
                    continue;
                }
                out.extend(with_parents(&base).collect::<Vec<_>>());
                let mut c = node.walk();
                for name in node.children_by_field_name("name", &mut c) {
                    let target =
                        if name.kind() == "aliased_import" { name.child_by_field_name("name") } else { Some(name) };
                    if let Some(t) = target {
                        out.insert(format!("{base}.{}", text(t)));
                    }
                }
            }
            _ => {
                let mut c = node.walk();
                stack.extend(node.children(&mut c));
            }
        }
    }
    out
}

/// The file part of a pytest test id (`tests/test_a.py::T::t[x]` → `tests/test_a.py`).
fn file_of(test_id: &str) -> &str {
    test_id.split("::").next().unwrap_or(test_id)
}

impl FirstPass {
    /// The import reach of every test file of the tree at `root` (`files`: its files), for
    /// the `passing` tests of its baseline. `None` unless the setup runs pytest (the only
    /// runner whose command takes test files and whose ids name them).
    pub fn build(root: &Path, files: &[String], setup: &TestSetup, passing: &BTreeSet<String>) -> Option<FirstPass> {
        if setup.runner != TestRunner::Pytest || !setup.test_cmd.ends_with(" 2>&1") {
            return None;
        }
        let mut modules = BTreeMap::new();
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut file_imports: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for f in files.iter().filter(|f| f.ends_with(".py")) {
            let Ok(source) = std::fs::read_to_string(root.join(f)) else { continue };
            let module = module_of(f).unwrap_or_default();
            let imports = imports_of(&source, &module, f.ends_with("__init__.py"));
            if !module.is_empty() {
                graph.entry(module.clone()).or_default().extend(imports.iter().cloned());
                modules.insert(f.clone(), module);
            }
            file_imports.insert(f.clone(), imports);
        }
        let known: BTreeSet<&String> = modules.values().collect();
        let closure = |start: &BTreeSet<String>| -> BTreeSet<String> {
            let mut seen: BTreeSet<String> = BTreeSet::new();
            let mut queue: VecDeque<String> = start.iter().filter(|m| known.contains(m)).cloned().collect();
            while let Some(m) = queue.pop_front() {
                if seen.insert(m.clone()) {
                    for next in graph.get(&m).into_iter().flatten() {
                        if known.contains(next) && !seen.contains(next) {
                            queue.push_back(next.clone());
                        }
                    }
                }
            }
            seen
        };
        let mut tests_by_file: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for t in passing {
            tests_by_file.entry(file_of(t).to_string()).or_default().push(t.clone());
        }
        let mut reach = BTreeMap::new();
        for test_file in tests_by_file.keys() {
            let mut start = file_imports.get(test_file).cloned().unwrap_or_default();
            // Every conftest.py from the root down to the test's folder.
            let mut dir = String::new();
            for part in
                test_file.split('/').collect::<Vec<_>>().split_last().map(|(_, d)| d.to_vec()).unwrap_or_default()
            {
                start.extend(file_imports.get(&format!("{dir}conftest.py")).cloned().unwrap_or_default());
                dir.push_str(part);
                dir.push('/');
            }
            start.extend(file_imports.get(&format!("{dir}conftest.py")).cloned().unwrap_or_default());
            // A test module reached by import from another test file is reached too.
            if let Some(m) = modules.get(test_file) {
                start.insert(m.clone());
            }
            reach.insert(test_file.clone(), closure(&start));
        }
        Some(FirstPass { reach, modules, tests_by_file, total_tests: passing.len() })
    }

    /// The test files (and their baseline-passing tests) that reach one of `mutated` files;
    /// `None` when the first pass would not pay: a mutated file is no importable module, or
    /// the selection holds more than half of the passing tests.
    pub fn select(&self, mutated: &[&str]) -> Option<(Vec<String>, BTreeSet<String>)> {
        let targets: Vec<&String> = mutated.iter().map(|f| self.modules.get(*f)).collect::<Option<_>>()?;
        let files: Vec<String> =
            self.reach.iter().filter(|(_, r)| targets.iter().any(|t| r.contains(*t))).map(|(f, _)| f.clone()).collect();
        let tests: BTreeSet<String> = files.iter().flat_map(|f| self.tests_by_file[f].iter().cloned()).collect();
        (2 * tests.len() <= self.total_tests).then_some((files, tests))
    }

    /// `setup` running only `files`.
    pub fn subset_setup(setup: &TestSetup, files: &[String]) -> TestSetup {
        let base = setup.test_cmd.strip_suffix(" 2>&1").unwrap_or(&setup.test_cmd);
        let args: Vec<String> = files.iter().map(|f| shell_quote(f)).collect();
        TestSetup { test_cmd: format!("{base} {} 2>&1", args.join(" ")), ..setup.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn module_names_and_imports_resolve_like_python() {
        assert_eq!(module_of("src/pkg/sub/mod.py").as_deref(), Some("pkg.sub.mod"));
        assert_eq!(module_of("pkg/__init__.py").as_deref(), Some("pkg"));
        assert_eq!(module_of("six.py").as_deref(), Some("six"));
        assert_eq!(module_of("tests/test_x.py").as_deref(), Some("tests.test_x"));
        assert_eq!(module_of("docs/conf-old.py"), None);
        assert_eq!(module_of("README.md"), None);
        let src = "import os.path\nimport pkg.a as pa\nfrom pkg.b import (f,\n    g as h)\nfrom . import sib\nfrom ..up import x\nif True:\n    from .deep.m import y\n";
        let got = imports_of(src, "pkg.sub.mod", false);
        let want = [
            "os",
            "os.path",
            "pkg",
            "pkg.a",
            "pkg.b",
            "pkg.b.f",
            "pkg.b.g",
            "pkg.sub",
            "pkg.sub.sib",
            "pkg.up",
            "pkg.up.x",
            "pkg.sub.deep",
            "pkg.sub.deep.m",
            "pkg.sub.deep.m.y",
        ];
        assert_eq!(got, want.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>());
        // In a package's __init__, `.` is the package itself.
        assert!(imports_of("from ._impl import run\n", "pkg", true).contains("pkg._impl"));
        // Beyond the top package: ignored, not a panic.
        assert!(imports_of("from ...x import y\n", "pkg.m", false).is_empty());
    }

    fn setup() -> TestSetup {
        TestSetup {
            language: Some(Language::Python),
            runner: TestRunner::Pytest,
            test_cmd: "TZ=UTC '/v/bin/python' -m pytest -rA 2>&1".into(),
            log_parser: "parse_log_pytest".into(),
            readable_paths: vec![PathBuf::from("/v")],
            python: None,
        }
    }

    #[test]
    fn a_mutated_module_selects_the_tests_that_reach_it() {
        let dir = tempfile::tempdir().unwrap();
        let files = [
            ("pkg/__init__.py", "from .core import run\n"),
            ("pkg/core.py", "from pkg import util\n"),
            ("pkg/util.py", "X = 1\n"),
            ("pkg/strings.py", "Y = 2\n"),
            ("pkg/extra.py", "Z = 3\n"),
            ("tests/test_core.py", "from pkg import run\n"),
            ("tests/test_strings.py", "import pkg.strings\n"),
            ("tests/test_extra.py", "from pkg.extra import Z\n"),
            ("tests/more/conftest.py", "import pkg.extra\n"),
            ("tests/more/test_fixture.py", "def test_x(): pass\n"),
        ];
        for (f, text) in files {
            let p = dir.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let names: Vec<String> = files.iter().map(|(f, _)| f.to_string()).collect();
        let passing: BTreeSet<String> = [
            "tests/test_core.py::test_a",
            "tests/test_core.py::test_b",
            "tests/test_strings.py::test_s",
            "tests/test_extra.py::test_e",
            "tests/more/test_fixture.py::test_x",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let fp = FirstPass::build(dir.path(), &names, &setup(), &passing).unwrap();
        // util is reached through pkg/__init__ → core → util, and every test file imports
        // `pkg` (hence its __init__): all tests, so a first pass would not pay.
        assert!(fp.select(&["pkg/util.py"]).is_none());
        // strings.py is only reached by the file importing it (and, through `pkg`, by no one
        // else: pkg/__init__ does not import it).
        let (files, tests) = fp.select(&["pkg/strings.py"]).unwrap();
        assert_eq!(files, ["tests/test_strings.py"]);
        assert_eq!(tests.len(), 1);
        // extra.py: the file importing it and the folder whose conftest imports it.
        let (files, _) = fp.select(&["pkg/extra.py"]).unwrap();
        assert_eq!(files, ["tests/more/test_fixture.py", "tests/test_extra.py"]);
        // A file that is no module: no first pass.
        assert!(fp.select(&["setup.cfg"]).is_none());
        let sub = FirstPass::subset_setup(&setup(), &files);
        assert_eq!(
            sub.test_cmd,
            "TZ=UTC '/v/bin/python' -m pytest -rA 'tests/more/test_fixture.py' 'tests/test_extra.py' 2>&1"
        );
        // Other runners get no first pass.
        let unittest = TestSetup { runner: TestRunner::Unittest, ..setup() };
        assert!(FirstPass::build(dir.path(), &names, &unittest, &passing).is_none());
    }
}
