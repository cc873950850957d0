//! JSON text exactly as Python's `json.dumps(obj, indent=N)` writes it (default
//! `ensure_ascii=True`), so report files are byte-identical to swebench's.

use serde_json::Value;

/// `json.dumps(value, indent=indent)`; `None` gives the compact default (`", "`, `": "`).
pub fn dumps(value: &Value, indent: Option<usize>) -> String {
    let mut out = String::new();
    write_value(&mut out, value, indent, 0);
    out
}

fn newline(out: &mut String, indent: usize, level: usize) {
    out.push('\n');
    out.extend(std::iter::repeat_n(' ', indent * level));
}

fn write_value(out: &mut String, value: &Value, indent: Option<usize>, level: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                    if indent.is_none() {
                        out.push(' ');
                    }
                }
                if let Some(n) = indent {
                    newline(out, n, level + 1);
                }
                write_value(out, item, indent, level + 1);
            }
            if let Some(n) = indent {
                newline(out, n, level);
            }
            out.push(']');
        }
        Value::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                    if indent.is_none() {
                        out.push(' ');
                    }
                }
                if let Some(n) = indent {
                    newline(out, n, level + 1);
                }
                write_string(out, k);
                out.push_str(": ");
                write_value(out, v, indent, level + 1);
            }
            if let Some(n) = indent {
                newline(out, n, level);
            }
            out.push('}');
        }
    }
}

fn write_number(out: &mut String, n: &serde_json::Number) {
    if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
        // Python writes floats with repr(): always a '.' or exponent.
        if f.is_finite() && f == f.trunc() && f.abs() < 1e16 {
            out.push_str(&format!("{f:.1}"));
        } else {
            out.push_str(&n.to_string());
        }
    } else {
        out.push_str(&n.to_string());
    }
}

/// A JSON string literal with Python's `ensure_ascii` escaping.
pub fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn matches_python_indent_and_ascii_escaping() {
        let v = json!({"a": [], "b": {"c": ["é😀\u{7f}"]}, "d": {}});
        assert_eq!(
            dumps(&v, Some(4)),
            "{\n    \"a\": [],\n    \"b\": {\n        \"c\": [\n            \"\\u00e9\\ud83d\\ude00\\u007f\"\n        ]\n    },\n    \"d\": {}\n}"
        );
        assert_eq!(dumps(&json!([1, {"x": true}]), None), "[1, {\"x\": true}]");
    }
}
