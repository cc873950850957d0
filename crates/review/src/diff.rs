//! A `git diff` read for display: one [`FileDiff`] per file (paths, new/deleted/renamed,
//! binary), its lines numbered on both sides, and pages of at most a few thousand lines so a
//! huge patch never reaches the browser in one piece (`docs/review.md` §3).

use serde::Serialize;

/// Diff lines per page.
pub const LINES_PER_PAGE: usize = 2000;

/// One line of a hunk, numbered: `kind` is `@` (hunk header), ` ` (context), `-`, `+` or
/// `\` (`\ No newline at end of file`); `old`/`new` are its line numbers on either side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Line {
    /// `@`, ` `, `-`, `+` or `\`.
    pub kind: char,
    /// Line number before the change (context and `-` lines).
    pub old: Option<u32>,
    /// Line number after the change (context and `+` lines).
    pub new: Option<u32>,
    /// The text without the leading marker.
    pub text: String,
}

/// One file of a patch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileDiff {
    /// The path after the change (before it, for a deleted file).
    pub path: String,
    /// The path before a rename or copy.
    pub old_path: Option<String>,
    /// `modified`, `added`, `deleted` or `renamed`.
    pub status: &'static str,
    /// A binary file: no lines are shown.
    pub binary: bool,
    /// Lines added.
    pub additions: usize,
    /// Lines deleted.
    pub deletions: usize,
    /// The hunks' lines, numbered.
    pub lines: Vec<Line>,
}

/// A piece of one file on a page (a file longer than a page is split over several).
#[derive(Debug, Clone, Serialize)]
pub struct FileChunk {
    /// The file (its `lines` only those of this piece).
    #[serde(flatten)]
    pub file: FileDiff,
    /// Which piece of the file this is (from 1).
    pub part: usize,
    /// How many pieces the file is split into.
    pub parts: usize,
}

/// One page of a patch.
#[derive(Debug, Clone, Serialize)]
pub struct PatchPage {
    /// This page (from 1).
    pub page: usize,
    /// Pages in all (at least 1).
    pub pages: usize,
    /// Files in the whole patch.
    pub total_files: usize,
    /// Diff lines in the whole patch.
    pub total_lines: usize,
    /// Lines added in the whole patch.
    pub additions: usize,
    /// Lines deleted in the whole patch.
    pub deletions: usize,
    /// The files (or pieces) on this page.
    pub files: Vec<FileChunk>,
}

/// Reads `git diff` output (bytes: invalid UTF-8 is shown replaced, never refused).
pub fn parse(patch: &[u8]) -> Vec<FileDiff> {
    let text = String::from_utf8_lossy(patch);
    let mut files: Vec<FileDiff> = Vec::new();
    let (mut old_no, mut new_no) = (0u32, 0u32);
    let mut in_hunk = false;
    for raw in text.split_inclusive('\n') {
        let line = raw.strip_suffix('\n').unwrap_or(raw);
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(rest) = line.strip_prefix("diff --git ") {
            files.push(FileDiff {
                path: git_header_path(rest),
                old_path: None,
                status: "modified",
                binary: false,
                additions: 0,
                deletions: 0,
                lines: Vec::new(),
            });
            in_hunk = false;
            continue;
        }
        if files.is_empty() {
            // Text before the first file (a mail header, a plain `diff -u` without git's
            // header): start a file at `--- `.
            if line.starts_with("--- ") {
                files.push(FileDiff {
                    path: String::new(),
                    old_path: None,
                    status: "modified",
                    binary: false,
                    additions: 0,
                    deletions: 0,
                    lines: Vec::new(),
                });
            } else {
                continue;
            }
        }
        let f = files.last_mut().expect("a file was started above");
        if let Some(header) = line.strip_prefix("@@") {
            let (o, n) = hunk_start(header);
            (old_no, new_no) = (o, n);
            in_hunk = true;
            f.lines.push(Line { kind: '@', old: None, new: None, text: line.to_string() });
            continue;
        }
        if in_hunk {
            let (kind, rest) = match line.chars().next() {
                Some(c @ (' ' | '-' | '+' | '\\')) => (c, &line[1..]),
                // An empty line inside a hunk is a context line whose space was stripped.
                None => (' ', ""),
                Some(_) => {
                    in_hunk = false;
                    ('?', line)
                }
            };
            if kind != '?' {
                let (old, new) = match kind {
                    ' ' => (Some(old_no), Some(new_no)),
                    '-' => (Some(old_no), None),
                    '+' => (None, Some(new_no)),
                    _ => (None, None),
                };
                match kind {
                    ' ' => (old_no, new_no) = (old_no + 1, new_no + 1),
                    '-' => {
                        old_no += 1;
                        f.deletions += 1;
                    }
                    '+' => {
                        new_no += 1;
                        f.additions += 1;
                    }
                    _ => {}
                }
                f.lines.push(Line { kind, old, new, text: rest.to_string() });
                continue;
            }
        }
        // Extended header lines.
        if let Some(p) = line.strip_prefix("--- ") {
            if p != "/dev/null" {
                f.old_path.get_or_insert_with(|| strip_side(&unquote(p)));
            } else {
                f.status = "added";
            }
        } else if let Some(p) = line.strip_prefix("+++ ") {
            if p == "/dev/null" {
                f.status = "deleted";
            } else {
                f.path = strip_side(&unquote(p));
            }
        } else if line.starts_with("new file mode") {
            f.status = "added";
        } else if line.starts_with("deleted file mode") {
            f.status = "deleted";
        } else if let Some(p) = line.strip_prefix("rename from ").or_else(|| line.strip_prefix("copy from ")) {
            f.old_path = Some(unquote(p));
            f.status = "renamed";
        } else if let Some(p) = line.strip_prefix("rename to ").or_else(|| line.strip_prefix("copy to ")) {
            f.path = unquote(p);
        } else if line == "GIT binary patch" || (line.starts_with("Binary files ") && line.ends_with(" differ")) {
            f.binary = true;
        }
    }
    for f in &mut files {
        // Only a rename keeps its old path; for the others it is the same file.
        if f.status != "renamed" {
            if f.status == "deleted" {
                if let Some(old) = f.old_path.take() {
                    f.path = old;
                }
            }
            f.old_path = None;
        }
    }
    files
}

/// Page `page` (from 1; past the end gives the last) of `files`, at most `per_page` diff lines
/// a page; a file longer than that is split at hunk boundaries where it can be.
pub fn page(files: &[FileDiff], page: usize, per_page: usize) -> PatchPage {
    let per_page = per_page.max(1);
    // Cut each file into pieces, then pack pieces into pages.
    let mut pieces: Vec<FileChunk> = Vec::new();
    for f in files {
        let mut cuts: Vec<std::ops::Range<usize>> = Vec::new();
        let mut start = 0;
        while f.lines.len() - start > per_page {
            // The last hunk header within the page (not at its start), else a hard cut.
            let window = &f.lines[start..start + per_page];
            let cut = window.iter().rposition(|l| l.kind == '@').filter(|&i| i > 0).unwrap_or(per_page);
            cuts.push(start..start + cut);
            start += cut;
        }
        cuts.push(start..f.lines.len());
        let parts = cuts.len();
        for (i, r) in cuts.into_iter().enumerate() {
            let mut file = f.clone();
            file.lines = f.lines[r].to_vec();
            pieces.push(FileChunk { file, part: i + 1, parts });
        }
    }
    let mut pages: Vec<Vec<FileChunk>> = vec![Vec::new()];
    let mut used = 0;
    for p in pieces {
        let n = p.file.lines.len().max(1);
        if used > 0 && used + n > per_page {
            pages.push(Vec::new());
            used = 0;
        }
        used += n;
        pages.last_mut().expect("pages starts non-empty").push(p);
    }
    let count = pages.len();
    let index = page.clamp(1, count);
    PatchPage {
        page: index,
        pages: count,
        total_files: files.len(),
        total_lines: files.iter().map(|f| f.lines.len()).sum(),
        additions: files.iter().map(|f| f.additions).sum(),
        deletions: files.iter().map(|f| f.deletions).sum(),
        files: pages.swap_remove(index - 1),
    }
}

/// `@@ -A,B +C,D @@` → (A, C).
fn hunk_start(header: &str) -> (u32, u32) {
    let mut old = 1;
    let mut new = 1;
    for part in header.split_whitespace() {
        let num = |p: &str| p.split(',').next().and_then(|n| n.parse::<u32>().ok());
        if let Some(n) = part.strip_prefix('-').and_then(num) {
            old = n;
        } else if let Some(n) = part.strip_prefix('+').and_then(num) {
            new = n;
            break;
        }
    }
    (old, new)
}

/// The path of `diff --git a/X b/X` (used until `---`/`+++` or a rename says better).
fn git_header_path(rest: &str) -> String {
    let rest = rest.trim();
    if rest.starts_with('"') {
        // Quoted: take the second quoted name.
        let parts: Vec<&str> = rest.split("\" \"").collect();
        if let Some(last) = parts.last() {
            return strip_side(&unquote(&format!("\"{}", last.trim_start_matches('"'))));
        }
    }
    // `a/X b/X` with the same X on both sides: split in the middle.
    let half = rest.len() / 2;
    if rest.is_char_boundary(half) && rest.as_bytes().get(half) == Some(&b' ') {
        return strip_side(&rest[half + 1..]);
    }
    rest.rsplit(" b/").next().map(str::to_string).unwrap_or_else(|| rest.to_string())
}

/// `a/X` or `b/X` → `X`.
fn strip_side(p: &str) -> String {
    p.strip_prefix("a/").or_else(|| p.strip_prefix("b/")).unwrap_or(p).to_string()
}

/// Git's C-style quoting of unusual paths (`"t\303\244st.py"`), undone; a trailing tab
/// (`--- a/x\t`, as some tools write) dropped.
fn unquote(p: &str) -> String {
    let p = p.trim_end_matches('\t');
    let Some(inner) = p.strip_prefix('"').and_then(|q| q.strip_suffix('"')) else { return p.to_string() };
    let mut bytes = Vec::new();
    let mut chars = inner.bytes().peekable();
    while let Some(b) = chars.next() {
        if b != b'\\' {
            bytes.push(b);
            continue;
        }
        match chars.next() {
            Some(b'n') => bytes.push(b'\n'),
            Some(b't') => bytes.push(b'\t'),
            Some(d @ b'0'..=b'7') => {
                let mut v = u32::from(d - b'0');
                for _ in 0..2 {
                    if let Some(&n @ b'0'..=b'7') = chars.peek() {
                        v = v * 8 + u32::from(n - b'0');
                        chars.next();
                    }
                }
                bytes.push(v as u8);
            }
            Some(other) => bytes.push(other),
            None => {}
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATCH: &str = "diff --git a/stats.py b/stats.py\nindex 1..2 100644\n--- a/stats.py\n+++ b/stats.py\n@@ -1,3 +1,3 @@\n def median(xs):\n-    return xs[len(xs) // 2]\n+    return sorted(xs)[len(xs) // 2]\n \n\
diff --git a/new.txt b/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+hello\n\\ No newline at end of file\n\
diff --git a/logo.png b/logo.png\nnew file mode 100644\nindex 0000000..3f2a\nGIT binary patch\nliteral 12\nTcmZ?wbhEHbWMp7u\n\nliteral 0\nHcmV?d00001\n\n\
diff --git a/old.py b/gone.py\nsimilarity index 90%\nrename from old.py\nrename to gone.py\n\
diff --git a/dead.py b/dead.py\ndeleted file mode 100644\n--- a/dead.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x = 1\n";

    #[test]
    fn files_are_read_with_status_binary_and_numbered_lines() {
        let files = parse(PATCH.as_bytes());
        type Summary<'a> = (&'a str, Option<&'a str>, &'a str, bool, usize, usize);
        let summary: Vec<Summary> = files
            .iter()
            .map(|f| (f.path.as_str(), f.old_path.as_deref(), f.status, f.binary, f.additions, f.deletions))
            .collect();
        assert_eq!(
            summary,
            [
                ("stats.py", None, "modified", false, 1, 1),
                ("new.txt", None, "added", false, 1, 0),
                ("logo.png", None, "added", true, 0, 0),
                ("gone.py", Some("old.py"), "renamed", false, 0, 0),
                ("dead.py", None, "deleted", false, 0, 1),
            ]
        );
        let numbered: Vec<(char, Option<u32>, Option<u32>)> =
            files[0].lines.iter().map(|l| (l.kind, l.old, l.new)).collect();
        assert_eq!(
            numbered,
            [
                ('@', None, None),
                (' ', Some(1), Some(1)),
                ('-', Some(2), None),
                ('+', None, Some(2)),
                (' ', Some(3), Some(3))
            ]
        );
        assert!(files[2].lines.is_empty(), "binary data is not shown as lines");
        assert_eq!(files[1].lines.last().unwrap().kind, '\\');
    }

    #[test]
    fn a_huge_patch_is_paged_and_a_huge_file_split_at_hunks() {
        let mut patch = String::from("diff --git a/big.txt b/big.txt\n--- a/big.txt\n+++ b/big.txt\n");
        for h in 0..30 {
            patch.push_str(&format!("@@ -{0},100 +{0},100 @@\n", h * 1000 + 1));
            for i in 0..100 {
                patch.push_str(&format!("-old {h} {i}\n+new {h} {i}\n"));
            }
        }
        patch.push_str(PATCH);
        let files = parse(patch.as_bytes());
        let total: usize = files.iter().map(|f| f.lines.len()).sum();
        let first = page(&files, 1, 1000);
        assert!(first.pages >= 7, "{} pages", first.pages);
        let mut seen = 0;
        for n in 1..=first.pages {
            let p = page(&files, n, 1000);
            assert_eq!(p.page, n);
            for f in &p.files {
                assert!(f.file.lines.len() <= 1000);
                if f.file.path == "big.txt" && f.part > 1 {
                    assert_eq!(f.file.lines[0].kind, '@', "pieces start at a hunk");
                }
                seen += f.file.lines.len();
            }
        }
        assert_eq!(seen, total, "every line is on exactly one page");
        assert_eq!(page(&files, 99, 1000).page, first.pages, "past the end gives the last page");
        assert_eq!(page(&[], 1, 1000).pages, 1);
    }

    #[test]
    fn quoted_paths_are_unquoted() {
        let p = "diff --git \"a/t\\303\\244st.py\" \"b/t\\303\\244st.py\"\n--- \"a/t\\303\\244st.py\"\n+++ \"b/t\\303\\244st.py\"\n@@ -1 +1 @@\n-a\n+b\n";
        assert_eq!(parse(p.as_bytes())[0].path, "täst.py");
    }
}
