//! Python string semantics that swebench's graders rely on.
//!
//! The official grader is Python: `str.split()`, `str.strip()` and regex `\s` treat
//! U+001C..U+001F as whitespace, while Rust's `char::is_whitespace` does not; files are read
//! with universal newlines. Every parser in this crate goes through these helpers so that the
//! same bytes give the same tokens as in Python.

/// Python's `str.isspace()` for one character: Rust's Unicode `White_Space` plus the four
/// ASCII information separators U+001C..U+001F.
pub fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python `str.split()` with no argument: runs of whitespace separate, no empty tokens.
pub fn py_split(s: &str) -> Vec<&str> {
    s.split(is_py_space).filter(|t| !t.is_empty()).collect()
}

/// Python `str.strip()` with no argument.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

/// Python `str.lstrip()` with no argument.
pub fn py_lstrip(s: &str) -> &str {
    s.trim_start_matches(is_py_space)
}

/// The regex class equivalent to Python's `\s` for `str` patterns.
pub const PY_SPACE_CLASS: &str = r"[\s\x1C-\x1F]";

/// The regex class equivalent to Python's `\S` for `str` patterns.
pub const PY_NONSPACE_CLASS: &str = r"[^\s\x1C-\x1F]";

/// Python's universal-newline translation on read: `\r\n` and a lone `\r` both become `\n`.
pub fn universal_newlines(s: &str) -> String {
    if !s.contains('\r') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\r' {
            if chars.peek() == Some(&'\n') {
                chars.next();
            }
            out.push('\n');
        } else {
            out.push(c);
        }
    }
    out
}

/// Reads a log the way `open(path).read()` does under `PYTHONUTF8=1`: strict UTF-8, then
/// universal newlines. Invalid UTF-8 is an error, as it is a `UnicodeDecodeError` in Python.
pub fn read_text_strict(bytes: &[u8]) -> Result<String, std::str::Utf8Error> {
    std::str::from_utf8(bytes).map(universal_newlines)
}

/// Reads a log the way `Path.read_text(errors="replace")` does: invalid UTF-8 becomes U+FFFD.
pub fn read_text_replace(bytes: &[u8]) -> String {
    universal_newlines(&String::from_utf8_lossy(bytes))
}

/// Python `text.split(sep)[index]` style helper: the part before the first `sep`.
pub fn before_first<'a>(s: &'a str, sep: &str) -> &'a str {
    s.split_once(sep).map_or(s, |(a, _)| a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_treats_information_separators_as_space() {
        assert_eq!(py_split("a\u{1c}b \t c\u{1f}"), vec!["a", "b", "c"]);
        assert_eq!(py_strip("\u{1d} x \u{1e}"), "x");
    }

    #[test]
    fn universal_newlines_translate_cr_and_crlf() {
        assert_eq!(universal_newlines("a\r\nb\rc\n"), "a\nb\nc\n");
        assert_eq!(universal_newlines("a\r\r\n"), "a\n\n");
    }
}
