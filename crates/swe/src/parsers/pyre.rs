//! Python `re` semantics on top of the `regex` crate, for porting swebench's parsers.
//!
//! Patterns are written exactly as in swebench's Python source and translated: `\s` / `\S`
//! take Python's whitespace (U+001C..U+001F included), `\w` / `\W` Python's word characters
//! (letters, numbers, underscore), inside and outside brackets. `match_at_start` gives
//! `re.match` (anchored at the start, not the end); `findall` gives `re.findall`'s strings.

use regex::{Captures, Regex, RegexBuilder};

/// Translates a Python pattern (see the module docs) into `regex` syntax.
pub fn translate(p: &str) -> String {
    let mut out = String::with_capacity(p.len() + 16);
    let mut in_class = false;
    let mut chars = p.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let Some(n) = chars.next() else {
                    out.push('\\');
                    break;
                };
                match (n, in_class) {
                    ('s', false) => out.push_str(r"[\s\x1C-\x1F]"),
                    ('s', true) => out.push_str(r"\s\x1C-\x1F"),
                    ('S', _) => out.push_str(r"[^\s\x1C-\x1F]"),
                    ('w', false) => out.push_str(r"[\p{L}\p{N}_]"),
                    ('w', true) => out.push_str(r"\p{L}\p{N}_"),
                    ('W', _) => out.push_str(r"[^\p{L}\p{N}_]"),
                    _ => {
                        out.push('\\');
                        out.push(n);
                    }
                }
            }
            '[' if !in_class => {
                in_class = true;
                out.push('[');
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
                if chars.peek() == Some(&']') {
                    out.push_str(r"\]");
                    chars.next();
                }
            }
            // Python takes `[` inside a class literally; `regex` would open a nested class.
            '[' => out.push_str(r"\["),
            ']' if in_class => {
                in_class = false;
                out.push(']');
            }
            _ => out.push(c),
        }
    }
    out
}

/// Compiles a Python pattern; panics only on a malformed static pattern (a bug, caught by tests).
pub fn py(p: &str) -> Regex {
    RegexBuilder::new(&translate(p)).size_limit(64 << 20).build().expect("static pattern")
}

/// Compiles a Python pattern for `re.match` (anchored at the start).
pub fn py_match(p: &str) -> Regex {
    py(&format!("^(?:{p})"))
}

/// Compiles with `re.MULTILINE`.
pub fn py_m(p: &str) -> Regex {
    py(&format!("(?m:{p})"))
}

/// `re.findall` for a pattern with exactly one group (or none: the whole match); an
/// unmatched group gives `""`, as in Python.
pub fn findall<'a>(re: &Regex, text: &'a str) -> Vec<&'a str> {
    re.captures_iter(text).map(|c| group(&c, if c.len() > 1 { 1 } else { 0 })).collect()
}

/// A group's text, `""` when it did not participate.
pub fn group<'a>(c: &Captures<'a>, i: usize) -> &'a str {
    c.get(i).map_or("", |m| m.as_str())
}

/// Python's `len(s) - len(s.lstrip())`, in characters.
pub fn indent_of(s: &str) -> usize {
    s.chars().count() - crate::pytext::py_lstrip(s).chars().count()
}

/// `re.split(pattern, text)[0]`: the text before the first match.
pub fn before_match<'a>(re: &Regex, text: &'a str) -> &'a str {
    re.find(text).map_or(text, |m| &text[..m.start()])
}

/// `swebench.utils.ansi_escape`: removes ANSI escape sequences.
pub fn ansi_escape(text: &str) -> String {
    static ANSI: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| py(r"\x1B(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])"));
    ANSI.replace_all(text, "").into_owned()
}

/// Python's `str.rstrip()`.
pub fn py_rstrip(s: &str) -> &str {
    s.trim_end_matches(crate::pytext::is_py_space)
}

/// `text.split(sep)[-1]`: the text after the last `sep` (all of it when absent).
pub fn after_last<'a>(text: &'a str, sep: &str) -> &'a str {
    text.rsplit_once(sep).map_or(text, |(_, b)| b)
}

/// `text.rsplit(sep, 1)[0]`: the text before the last `sep` (all of it when absent).
pub fn before_last<'a>(text: &'a str, sep: &str) -> &'a str {
    text.rsplit_once(sep).map_or(text, |(a, _)| a)
}

/// Python's `float(text)` for version strings: `None` where Python raises `ValueError`.
pub fn py_float(text: &str) -> Option<f64> {
    let t = crate::pytext::py_strip(text);
    // Underscores are allowed only between digits.
    let b = t.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if c == b'_' && !(i > 0 && b[i - 1].is_ascii_digit() && b.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            return None;
        }
    }
    let t = t.replace('_', "");
    let lower = t.to_ascii_lowercase();
    let body = lower.trim_start_matches(['+', '-']);
    if body.is_empty() || lower.len() - body.len() > 1 {
        return None;
    }
    if !(["inf", "infinity", "nan"].contains(&body) || body.bytes().all(|c| c.is_ascii_digit() || b".e+-".contains(&c)))
    {
        return None;
    }
    t.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translation_keeps_python_classes() {
        assert!(py(r"^a\sb$").is_match("a\u{1c}b"));
        assert!(py(r"^[^\S\r\n]$").is_match(" "));
        assert!(!py(r"^[^\S\r\n]$").is_match("\n"));
        assert!(!py(r"^[^\S\r\n]$").is_match("x"));
        assert!(py(r"^[\s\S]+$").is_match("a\nb"));
        assert!(py(r"^[\d\.\_\S]+$").is_match("1.x_"));
        assert!(py(r"^[[]$").is_match("["));
        assert!(!py(r"^\w$").is_match("\u{301}"), "a combining mark is not a Python word character");
    }

    #[test]
    fn floats_as_python_parses_them() {
        assert_eq!(py_float(" 10.2 "), Some(10.2));
        assert_eq!(py_float("1_0"), Some(10.0));
        assert_eq!(py_float("1__0"), None);
        assert!(py_float("NaN").unwrap().is_nan());
        assert_eq!(py_float("3.x"), None);
        assert_eq!(py_float(""), None);
    }
}
