//! A small well-formedness-checking XML reader: enough of `xml.etree.ElementTree.fromstring`
//! for doctest's XML reporter (elements, attributes, text, comments, CDATA, processing
//! instructions, the five named entities and character references). Malformed input is an
//! error, as it is a `ParseError` in Python.

/// One element: its tag, attributes and child elements (text is not kept).
#[derive(Debug, Clone, PartialEq)]
pub struct Element {
    /// Tag name.
    pub tag: String,
    /// Attributes, entity references resolved and whitespace normalised.
    pub attrs: Vec<(String, String)>,
    /// Child elements in document order.
    pub children: Vec<Element>,
}

impl Element {
    /// `element.get(name)`.
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// `element.findall(".//tag")`: every descendant with that tag, in document order.
    pub fn descendants(&self, tag: &str) -> Vec<&Element> {
        let mut out = Vec::new();
        fn walk<'a>(e: &'a Element, tag: &str, out: &mut Vec<&'a Element>) {
            for c in &e.children {
                if c.tag == tag {
                    out.push(c);
                }
                walk(c, tag, out);
            }
        }
        walk(self, tag, &mut out);
        out
    }
}

struct Reader<'a> {
    s: &'a str,
    pos: usize,
}

fn is_name_start(c: char) -> bool {
    c == '_' || c == ':' || c.is_alphabetic()
}

fn is_name_char(c: char) -> bool {
    is_name_start(c) || c == '-' || c == '.' || c.is_numeric() || c == '\u{b7}'
}

impl<'a> Reader<'a> {
    fn rest(&self) -> &'a str {
        &self.s[self.pos..]
    }
    fn err<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("{what} at byte {}", self.pos))
    }
    fn skip_ws(&mut self) {
        let r = self.rest();
        self.pos += r.len() - r.trim_start_matches([' ', '\t', '\r', '\n']).len();
    }
    fn name(&mut self) -> Result<String, String> {
        let r = self.rest();
        match r.chars().next() {
            Some(c) if is_name_start(c) => {}
            _ => return self.err("not well-formed (invalid token)"),
        }
        let len = r.find(|c: char| !is_name_char(c)).unwrap_or(r.len());
        self.pos += len;
        Ok(r[..len].to_string())
    }
    fn skip_until(&mut self, end: &str, what: &str) -> Result<(), String> {
        match self.rest().find(end) {
            Some(i) => {
                self.pos += i + end.len();
                Ok(())
            }
            None => self.err(&format!("unclosed {what}")),
        }
    }
    fn text_with_refs(&self, raw: &str) -> Result<String, String> {
        let mut out = String::new();
        let mut rest = raw;
        while let Some(i) = rest.find('&') {
            out.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            let end = after.find(';').ok_or_else(|| format!("not well-formed (invalid token) at byte {}", self.pos))?;
            let ent = &after[..end];
            let ch = match ent {
                "lt" => '<',
                "gt" => '>',
                "amp" => '&',
                "quot" => '"',
                "apos" => '\'',
                _ => {
                    let code = if let Some(h) = ent.strip_prefix("#x") {
                        u32::from_str_radix(h, 16).ok()
                    } else if let Some(d) = ent.strip_prefix('#') {
                        d.parse().ok()
                    } else {
                        return Err(format!("undefined entity &{ent}; at byte {}", self.pos));
                    };
                    code.and_then(char::from_u32)
                        .filter(|c| *c != '\0')
                        .ok_or_else(|| format!("reference to invalid character number at byte {}", self.pos))?
                }
            };
            out.push(ch);
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }
    /// Skips comments, PIs, CDATA and text until the next tag; returns false at the end.
    fn skip_misc(&mut self, in_element: bool) -> Result<(), String> {
        loop {
            let r = self.rest();
            if r.starts_with("<!--") {
                self.skip_until("-->", "comment")?;
            } else if r.starts_with("<?") {
                self.skip_until("?>", "processing instruction")?;
            } else if r.starts_with("<![CDATA[") {
                if !in_element {
                    return self.err("not well-formed (invalid token)");
                }
                self.skip_until("]]>", "CDATA section")?;
            } else if r.starts_with('<') || r.is_empty() {
                return Ok(());
            } else {
                let len = r.find('<').unwrap_or(r.len());
                let text = &r[..len];
                if !in_element && !text.trim_matches([' ', '\t', '\r', '\n']).is_empty() {
                    return self.err("syntax error");
                }
                self.text_with_refs(text)?;
                self.pos += len;
            }
        }
    }
    fn element(&mut self, depth: usize) -> Result<Element, String> {
        if depth > 256 {
            return self.err("nesting too deep");
        }
        if !self.rest().starts_with('<') {
            return self.err("syntax error");
        }
        self.pos += 1;
        let tag = self.name()?;
        let mut attrs: Vec<(String, String)> = Vec::new();
        loop {
            let before = self.pos;
            self.skip_ws();
            let r = self.rest();
            if r.starts_with("/>") {
                self.pos += 2;
                return Ok(Element { tag, attrs, children: Vec::new() });
            }
            if r.starts_with('>') {
                self.pos += 1;
                break;
            }
            if self.pos == before {
                return self.err("not well-formed (invalid token)");
            }
            let key = self.name()?;
            self.skip_ws();
            if !self.rest().starts_with('=') {
                return self.err("not well-formed (invalid token)");
            }
            self.pos += 1;
            self.skip_ws();
            let quote = match self.rest().chars().next() {
                Some(q @ ('"' | '\'')) => q,
                _ => return self.err("not well-formed (invalid token)"),
            };
            self.pos += 1;
            let r = self.rest();
            let end = r.find(quote).ok_or_else(|| format!("unclosed token at byte {}", self.pos))?;
            let raw = &r[..end];
            if raw.contains('<') {
                return self.err("not well-formed (invalid token)");
            }
            let value = self.text_with_refs(&raw.replace(['\t', '\n', '\r'], " "))?;
            if attrs.iter().any(|(k, _)| *k == key) {
                return self.err("duplicate attribute");
            }
            attrs.push((key, value));
            self.pos += end + 1;
        }
        let mut children = Vec::new();
        loop {
            self.skip_misc(true)?;
            let r = self.rest();
            if r.is_empty() {
                return self.err("no element found");
            }
            if let Some(close) = r.strip_prefix("</") {
                self.pos += 2;
                let name = self.name()?;
                self.skip_ws();
                if name != tag || !self.rest().starts_with('>') {
                    let _ = close;
                    return self.err("mismatched tag");
                }
                self.pos += 1;
                return Ok(Element { tag, attrs, children });
            }
            children.push(self.element(depth + 1)?);
        }
    }
}

/// Parses a document with one root element.
pub fn parse(text: &str) -> Result<Element, String> {
    let mut r = Reader { s: text, pos: 0 };
    r.skip_misc(false)?;
    if r.rest().is_empty() {
        return r.err("no element found");
    }
    if r.rest().starts_with("<!DOCTYPE") {
        return r.err("DOCTYPE is not supported");
    }
    let root = r.element(0)?;
    r.skip_misc(false)?;
    if !r.rest().is_empty() {
        return r.err("junk after document element");
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_doctest_shape_and_rejects_malformed() {
        let x = "<doctest binary=\"t\"><!-- c --><TestSuite><TestCase name=\"a &amp; b\" filename=\"t.cpp\">\
                 <SubCase name=\"s\"><Expression success=\"false\" type=\"CHECK\"><Original>x</Original></Expression>\
                 </SubCase></TestCase></TestSuite><OverallResultsAsserts successes=\"1\"/></doctest>";
        let root = parse(x).unwrap();
        let tc = root.descendants("TestCase");
        assert_eq!(tc[0].attr("name"), Some("a & b"));
        assert_eq!(tc[0].descendants("Expression")[0].attr("success"), Some("false"));
        assert!(parse("<a><b></a>").is_err());
        assert!(parse("<a x='1' x='2'/>").is_err());
        assert!(parse("<a>&nope;</a>").is_err());
        assert!(parse("<a/>junk").is_err());
        assert!(parse("").is_err());
    }
}
