//! Where an instance's fix goes, read from its gold patch: the "oracle localization" of the
//! SWE-bench literature, given to an agent as a hint. It lowers a task's difficulty without
//! giving the fix away — the hint names files, functions and line numbers of the tree the
//! agent sees, never a line's text — so the same tasks serve a weaker model (a 1.5B policy
//! that cannot find the faulty function of an unknown package by itself) and a stronger one.

use std::fmt;
use std::str::FromStr;

/// How much of the fix's location a hint gives, each level adding to the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum HintLevel {
    /// No hint: the issue text alone (SWE-bench's setting).
    #[default]
    None,
    /// The files the fix changes.
    File,
    /// The files and the functions (or classes) around each change.
    Function,
    /// The files, functions and the line numbers of each change.
    Line,
}

impl HintLevel {
    /// Every level, easiest last.
    pub const ALL: [HintLevel; 4] = [HintLevel::None, HintLevel::File, HintLevel::Function, HintLevel::Line];

    /// The level's name as flags and configs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            HintLevel::None => "none",
            HintLevel::File => "file",
            HintLevel::Function => "function",
            HintLevel::Line => "line",
        }
    }
}

impl fmt::Display for HintLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HintLevel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HintLevel::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| format!("unknown hint level {s:?}: expected one of none, file, function, line"))
    }
}

/// One changed region of a file, on the side the agent sees (before the fix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangedRegion {
    /// First and last line (1-based) of the region in the unfixed file. A pure insertion is
    /// the line it goes after (or 1 at the top of the file).
    pub lines: (usize, usize),
    /// The enclosing definition as the hunk header names it (`def singularize(word)`), if any.
    pub context: Option<String>,
}

/// The files a patch changes, in order, each with its changed regions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChanges {
    /// Path relative to the repository root (the `b/` side; a deleted file's `a/` side).
    pub path: String,
    /// Changed regions in file order.
    pub regions: Vec<ChangedRegion>,
}

/// The changed regions of a unified diff (as `git diff` or `diff -u` writes it), file by
/// file. A hunk ends where its header's line counts say, so a removed line that reads `--- x`
/// stays a removed line. Lines the diff does not understand are skipped; an empty or
/// unreadable patch gives no files.
pub fn changed_regions(patch: &str) -> Vec<FileChanges> {
    let mut files: Vec<FileChanges> = Vec::new();
    // Whether the last file has had a hunk (a `--- ` line after one starts the next file).
    let mut file_has_hunk = false;
    // Position in the old file of the next hunk line; old and new lines the hunk has left.
    let (mut old_line, mut old_left, mut new_left) = (0usize, 0usize, 0usize);
    let mut open: Option<(usize, usize)> = None;
    let mut context: Option<String> = None;
    let close = |files: &mut Vec<FileChanges>, open: &mut Option<(usize, usize)>, context: &Option<String>| {
        if let (Some(lines), Some(f)) = (open.take(), files.last_mut()) {
            f.regions.push(ChangedRegion { lines, context: context.clone() });
        }
    };
    // `a/X`, `b/X` or a plain path, without `diff -u`'s tab and timestamp.
    let header_path = |p: &str| {
        let p = p.split('\t').next().unwrap_or(p).trim_end();
        p.strip_prefix("a/").or_else(|| p.strip_prefix("b/")).unwrap_or(p).to_string()
    };
    for line in patch.lines() {
        if old_left > 0 || new_left > 0 {
            match line.as_bytes().first() {
                Some(b'-') => {
                    open = Some(match open {
                        Some((s, _)) => (s, old_line),
                        None => (old_line, old_line),
                    });
                    old_line += 1;
                    old_left = old_left.saturating_sub(1);
                }
                Some(b'+') => {
                    // An insertion sits after the previous old line.
                    let at = old_line.saturating_sub(1).max(1);
                    open.get_or_insert((at, at));
                    new_left = new_left.saturating_sub(1);
                }
                Some(b'\\') => {}
                _ => {
                    close(&mut files, &mut open, &context);
                    old_line += 1;
                    old_left = old_left.saturating_sub(1);
                    new_left = new_left.saturating_sub(1);
                }
            }
            if old_left == 0 && new_left == 0 {
                close(&mut files, &mut open, &context);
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("diff --git ") {
            // `a/X b/X`: the b side, unless a `+++` line below says otherwise.
            let path = rest.split_once(" b/").map(|(_, b)| b).unwrap_or(rest).to_string();
            files.push(FileChanges { path, regions: Vec::new() });
            file_has_hunk = false;
        } else if let Some(p) = line.strip_prefix("--- ") {
            if files.is_empty() || file_has_hunk {
                files.push(FileChanges { path: header_path(p), regions: Vec::new() });
                file_has_hunk = false;
            }
        } else if let Some(p) = line.strip_prefix("+++ ") {
            let path = header_path(p);
            if let (false, Some(f)) = (path == "/dev/null", files.last_mut()) {
                f.path = path;
            }
        } else if let Some(header) = line.strip_prefix("@@ ") {
            let Some((ranges, tail)) = header.split_once(" @@") else { continue };
            let mut sides = ranges.split_whitespace();
            // `-start[,count] +start[,count]`; a missing count is 1.
            let range = |r: Option<&str>, sign: char| -> Option<(usize, usize)> {
                let r = r?.strip_prefix(sign)?;
                let (start, count) = r.split_once(',').unwrap_or((r, "1"));
                Some((start.parse().ok()?, count.parse().ok()?))
            };
            let (Some((start, olds)), Some((_, news))) = (range(sides.next(), '-'), range(sides.next(), '+')) else {
                continue;
            };
            if files.is_empty() {
                // A bare hunk list without file headers: one unnamed file.
                files.push(FileChanges { path: String::new(), regions: Vec::new() });
            }
            file_has_hunk = true;
            (old_line, old_left, new_left) = (start.max(1), olds, news);
            let tail = tail.trim();
            context = (!tail.is_empty()).then(|| tail.to_string());
        }
    }
    close(&mut files, &mut open, &context);
    files.retain(|f| !f.regions.is_empty());
    files
}

/// The name a hunk header's context gives (`def singularize(word: str) -> str:` →
/// `singularize`, `class Version:` → `Version`, `fn parse(s: &str)` → `parse`); the header
/// as is when it has no recognisable definition.
fn definition_name(context: &str) -> String {
    let words: Vec<&str> = context.split(|c: char| c.is_whitespace() || c == '(' || c == ':' || c == '<').collect();
    let keywords = ["def", "class", "fn", "func", "function", "struct", "impl", "enum", "trait", "interface"];
    for (i, w) in words.iter().enumerate() {
        if keywords.contains(w) {
            if let Some(name) = words[i + 1..].iter().find(|n| !n.is_empty()) {
                return name.to_string();
            }
        }
    }
    context.to_string()
}

/// The hint for `patch` at `level`, as text for the agent; `None` at [`HintLevel::None`] or
/// when the patch changes nothing recognisable. `functions` names the changed definitions
/// when the caller knows them better than the hunk headers do (a synthesized task records
/// its mutated entities as `path::name`); otherwise each hunk header's definition is used.
pub fn hint(patch: &str, level: HintLevel, functions: &[String]) -> Option<String> {
    if level == HintLevel::None {
        return None;
    }
    let files = changed_regions(patch);
    if files.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    for f in &files {
        let mut names: Vec<String> = Vec::new();
        if level >= HintLevel::Function {
            // Known entities of this file (`path::name`, or a bare name for any file) come
            // first; the hunk headers' definitions stand in when there are none.
            let known: Vec<String> = functions
                .iter()
                .filter_map(|e| match e.rsplit_once("::") {
                    Some((path, name)) => (path == f.path).then(|| name.to_string()),
                    None => Some(e.clone()),
                })
                .collect();
            let candidates: Vec<String> = if known.is_empty() {
                f.regions.iter().filter_map(|r| r.context.as_deref()).map(definition_name).collect()
            } else {
                known
            };
            for n in candidates {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
        let mut part = format!("`{}`", f.path);
        if !names.is_empty() {
            let list: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            part = format!("{} in {part}", list.join(", "));
        }
        if level >= HintLevel::Line {
            let spans: Vec<String> = f
                .regions
                .iter()
                .map(|r| {
                    if r.lines.0 == r.lines.1 {
                        format!("{}", r.lines.0)
                    } else {
                        format!("{}-{}", r.lines.0, r.lines.1)
                    }
                })
                .collect();
            let word = if spans.len() == 1 && !spans[0].contains('-') { "line" } else { "lines" };
            part = format!("{part}, {word} {}", spans.join(", "));
        }
        parts.push(part);
    }
    Some(format!("Hint: the code to fix is {}.", parts.join("; and ")))
}

/// `problem` with the hint for `patch` at `level` appended as its last paragraph; `problem`
/// unchanged when there is no hint.
pub fn with_hint(problem: &str, patch: &str, level: HintLevel, functions: &[String]) -> String {
    match hint(patch, level, functions) {
        Some(h) => format!("{}\n\n{h}\n", problem.trim_end()),
        None => problem.to_string(),
    }
}

/// The issue text an agent is given for `inst` at `level`: its problem statement with the
/// hint of its gold patch appended. A synthesized instance names its mutated functions in
/// `synth.entities` (`path::name`); those are used over the hunk headers, which name a
/// Python method's class rather than the method.
pub fn instance_text(inst: &crate::SweInstance, level: HintLevel) -> String {
    let entities: Vec<String> = inst
        .extra
        .get("synth")
        .and_then(|m| m.get("entities"))
        .and_then(|e| e.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    with_hint(&inst.problem_statement, &inst.patch, level, &entities)
}

/// Every instance's problem statement replaced by its [`instance_text`] at `level` (the
/// instances an eval run or a calibration hands its solver); unchanged at
/// [`HintLevel::None`].
pub fn add_hints(instances: &mut [crate::SweInstance], level: HintLevel) {
    if level == HintLevel::None {
        return;
    }
    for inst in instances {
        inst.problem_statement = instance_text(inst, level);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATCH: &str = "diff --git a/inflection/__init__.py b/inflection/__init__.py\n\
index ac004f9..c18a0b6 100644\n\
--- a/inflection/__init__.py\n\
+++ b/inflection/__init__.py\n\
@@ -329,7 +329,8 @@ def singularize(word: str) -> str:\n\
             return word\n\
 \n\
     for rule, replacement in SINGULARS:\n\
-        pass\n\
+        if re.search(rule, word):\n\
+            return re.sub(rule, replacement, word)\n\
     return word\n\
 \n\
 \n\
diff --git a/semver/version.py b/semver/version.py\n\
--- a/semver/version.py\n\
+++ b/semver/version.py\n\
@@ -10,4 +10,3 @@ class Version:\n\
     def bump(self):\n\
-        x = 1\n\
-        y = 2\n\
+        x = 2\n\
     return x\n\
@@ -40,2 +39,3 @@ class Version:\n\
     a = 1\n\
+    b = 2\n\
     c = 3\n";

    #[test]
    fn regions_are_the_changed_lines_of_the_unfixed_file() {
        let files = changed_regions(PATCH);
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].path, "inflection/__init__.py");
        assert_eq!(
            files[0].regions,
            vec![ChangedRegion { lines: (332, 332), context: Some("def singularize(word: str) -> str:".into()) }]
        );
        assert_eq!(files[1].path, "semver/version.py");
        // Two removed lines 11-12; an insertion after line 40.
        let lines: Vec<_> = files[1].regions.iter().map(|r| r.lines).collect();
        assert_eq!(lines, vec![(11, 12), (40, 40)]);
    }

    #[test]
    fn plain_unified_diffs_and_removed_lines_that_look_like_headers() {
        // `diff -u` headers (timestamps, no `diff --git`), and a removed line `-- x` that
        // reads as `--- x` inside the hunk: the hunk's counts say it is a removed line.
        let patch = "--- a/notes.md\t2026-01-01 00:00:00\n+++ b/notes.md\t2026-01-02 00:00:00\n@@ -1,3 +1,3 @@\n title\n--- x\n+-- y\n end\n--- src/lib.py\n+++ src/lib.py\n@@ -7 +7 @@ def f():\n-    return 1\n+    return 2\n";
        let files = changed_regions(patch);
        let got: Vec<(&str, Vec<(usize, usize)>)> =
            files.iter().map(|f| (f.path.as_str(), f.regions.iter().map(|r| r.lines).collect())).collect();
        assert_eq!(got, vec![("notes.md", vec![(2, 2)]), ("src/lib.py", vec![(7, 7)])]);
        assert_eq!(
            hint(patch, HintLevel::Function, &[]).unwrap(),
            "Hint: the code to fix is `notes.md`; and `f` in `src/lib.py`."
        );
    }

    #[test]
    fn each_level_adds_to_the_one_before_and_never_quotes_the_code() {
        assert_eq!(hint(PATCH, HintLevel::None, &[]), None);
        assert_eq!(
            hint(PATCH, HintLevel::File, &[]).unwrap(),
            "Hint: the code to fix is `inflection/__init__.py`; and `semver/version.py`."
        );
        assert_eq!(
            hint(PATCH, HintLevel::Function, &[]).unwrap(),
            "Hint: the code to fix is `singularize` in `inflection/__init__.py`; and `Version` in `semver/version.py`."
        );
        let line = hint(PATCH, HintLevel::Line, &[]).unwrap();
        assert_eq!(
            line,
            "Hint: the code to fix is `singularize` in `inflection/__init__.py`, line 332; and `Version` in \
             `semver/version.py`, lines 11-12, 40."
        );
        for code in ["pass", "re.search", "x = 1", "b = 2"] {
            assert!(!line.contains(code), "{line}");
        }
        // Known entities replace the hunk headers' guesses.
        let named = hint(PATCH, HintLevel::Function, &["semver/version.py::Version.bump".into()]).unwrap();
        assert!(named.contains("`Version.bump` in `semver/version.py`"), "{named}");
        assert!(named.contains("`singularize` in `inflection/__init__.py`"), "{named}");
    }

    #[test]
    fn hint_is_appended_as_the_last_paragraph() {
        let text = with_hint("Wrong plural.\n", PATCH, HintLevel::File, &[]);
        assert!(text.starts_with("Wrong plural.\n\nHint: the code to fix is `inflection/__init__.py`"), "{text}");
        assert_eq!(with_hint("Wrong plural.\n", PATCH, HintLevel::None, &[]), "Wrong plural.\n");
        assert_eq!(with_hint("x", "", HintLevel::Line, &[]), "x");
    }

    #[test]
    fn a_synthesized_instance_names_its_methods_not_their_class() {
        let line = serde_json::json!({
            "instance_id": "a__b-1", "repo": "a/b", "base_commit": "0", "patch": PATCH,
            "problem_statement": "Bumping is wrong.", "FAIL_TO_PASS": ["t"], "PASS_TO_PASS": [],
            "version": "1", "synth": {"entities": ["semver/version.py::Version.bump"]}
        });
        let inst = crate::instance::parse_jsonl_instances(&line.to_string(), "x.jsonl").unwrap().remove(0);
        assert_eq!(instance_text(&inst, HintLevel::None), "Bumping is wrong.");
        let text = instance_text(&inst, HintLevel::Function);
        assert!(text.contains("`Version.bump` in `semver/version.py`"), "{text}");
        assert!(text.contains("`singularize` in `inflection/__init__.py`"), "{text}");
    }

    #[test]
    fn levels_parse_by_name() {
        for l in HintLevel::ALL {
            assert_eq!(l.as_str().parse::<HintLevel>(), Ok(l));
        }
        let err = "lines".parse::<HintLevel>().unwrap_err();
        assert!(err.contains("\"lines\"") && err.contains("none, file, function, line"), "{err}");
    }
}
