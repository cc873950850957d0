//! The one streaming scanner every format's parser is: it splits a reply into reasoning,
//! content and calls, and each format only says what opens a call and how a call body is
//! read ([`CallSyntax`]).
//!
//! What the scanner does the same for every format:
//!
//! * **Thinking.** A reply that starts (after whitespace) with a thinking marker (`<think>`,
//!   or the format's own, e.g. Mistral's `[THINK]`), or whose prompt ended inside one, is
//!   reasoning up to the closing marker; newlines after it are dropped.
//! * **Calls inside the thinking block** count as calls; the reasoning goes on after them.
//! * **Text before, between and after calls** is content; whitespace (and `;`) between calls
//!   is dropped.
//! * **Recovery**, only when tools were offered: a markdown fence (```` ```json ```` or a
//!   bare ```` ``` ````) whose body is JSON call objects for offered tools, and such a JSON
//!   object (or array of them) written on its own in the content, become calls. Other fences
//!   are content, and nothing inside them is recovered.
//! * **Holding back.** Text that may be the start of a marker (`<tool_c`, ```` `` ````,
//!   `{"na`) is not emitted until the next text shows whether it is one; if it is not, it is
//!   released as content.
//! * **Malformed calls** are reported ([`StreamEvent::Malformed`]) and the reply goes on.
//!
//! Every decision is taken on a prefix of the text only when no later text could change it,
//! so feeding a reply in any pieces gives the same events (joined) as feeding it whole.

use serde_json::Value;

use super::json::{self, Item, Recovered};
use super::{CodecError, MalformedCall, ReplyParser, StreamEvent};

/// How a format's calls are marked and read.
pub(crate) trait CallSyntax: std::fmt::Debug + Send + Sync {
    /// The markers that open a call body (`<tool_call>`, `[TOOL_CALLS]`, …).
    fn openers(&self) -> &'static [&'static str];

    /// Reads the body after opener `which` at the start of `body` (the opener itself already
    /// consumed): [`Body::More`] while the text so far does not decide where it ends (never
    /// when `end`, the reply being over), else [`Body::Done`]. `tools`: the offered tools.
    fn body(&self, which: usize, body: &str, end: bool, tools: &[Value]) -> Body;

    /// Thinking markers, (open, close).
    fn think_markers(&self) -> &'static [(&'static str, &'static str)] {
        &[("<think>", "</think>")]
    }

    /// Whether a JSON call object on its own counts for any tool name, not only offered
    /// ones (Llama 3 writes its calls as bare JSON).
    fn bare_json_any_name(&self) -> bool {
        false
    }
}

/// How far a call body goes.
pub(crate) enum Body {
    /// More text is needed to tell.
    More,
    /// The body is the first `len` bytes (its closing marker included) and holds `calls`.
    Done {
        /// Bytes of the body consumed.
        len: usize,
        /// The calls it holds, each parsed or malformed.
        calls: Vec<Item>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Reasoning,
    Content,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Text(Mode),
    /// Inside the body after opener `which`; `back` is where the text goes on after it.
    Call {
        which: usize,
        back: Mode,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Skip {
    Nothing,
    /// Newlines after the end of the thinking block.
    Newlines,
    /// Whitespace and `;` after a call.
    Separators,
}

const FENCE: &str = "```";

/// Info strings of a markdown fence whose body may be a call.
const JSON_FENCES: [&str; 6] = ["", "json", "json5", "tool_call", "tool_calls", "tool_code"];

/// What comes next in content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Opener(usize),
    Fence,
    Bare,
    /// A possible bare call start that the text so far does not decide.
    Undecided,
}

/// The [`ReplyParser`] of every format: the scanner over a [`CallSyntax`].
#[derive(Debug)]
pub(crate) struct Scanner<S: CallSyntax> {
    syntax: S,
    tools: Vec<Value>,
    state: State,
    buf: String,
    /// Still at the start of the reply (a leading thinking marker opens reasoning).
    at_start: bool,
    skip: Skip,
    /// Inside a markdown fence that is not a call (nothing in it is recovered).
    in_code: bool,
}

impl<S: CallSyntax> Scanner<S> {
    pub(crate) fn new(syntax: S, thinking_prompted: bool, tools: &[Value]) -> Self {
        Scanner {
            syntax,
            tools: tools.to_vec(),
            state: State::Text(if thinking_prompted { Mode::Reasoning } else { Mode::Content }),
            buf: String::new(),
            at_start: true,
            skip: Skip::Nothing,
            in_code: false,
        }
    }

    fn recovering(&self) -> bool {
        !self.tools.is_empty()
    }

    fn drain(&mut self, end: bool) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        loop {
            if self.at_start {
                let trimmed = self.buf.trim_start();
                let opens = self.syntax.think_markers().iter().map(|(o, _)| *o);
                if let Some(open) = opens.clone().find(|o| trimmed.starts_with(o)) {
                    let cut = self.buf.len() - trimmed.len() + open.len();
                    self.buf.drain(..cut);
                    self.state = State::Text(Mode::Reasoning);
                    self.at_start = false;
                    continue;
                }
                if !end && opens.clone().any(|o| o.starts_with(trimmed)) {
                    return out; // could still become a thinking marker
                }
                self.at_start = false;
            }
            let progressed = match self.state {
                State::Text(Mode::Reasoning) => self.reasoning(end, &mut out),
                State::Text(Mode::Content) => self.content(end, &mut out),
                State::Call { which, back } => self.call(which, back, end, &mut out),
            };
            if !progressed {
                return out;
            }
        }
    }

    /// Reasoning up to the end of the thinking block or a call. Returns whether the state
    /// changed (false: everything that can be emitted was).
    fn reasoning(&mut self, end: bool, out: &mut Vec<StreamEvent>) -> bool {
        let close =
            self.syntax.think_markers().iter().filter_map(|(_, c)| self.buf.find(c).map(|at| (at, c.len()))).min();
        let call = self.first_opener();
        match (close, call) {
            (Some((at, len)), c) if c.is_none_or(|(t, _)| at < t) => {
                emit(out, StreamEvent::Reasoning, &self.buf[..at]);
                self.buf.drain(..at + len);
                self.state = State::Text(Mode::Content);
                self.skip = Skip::Newlines;
                true
            }
            (_, Some((at, which))) => {
                emit(out, StreamEvent::Reasoning, &self.buf[..at]);
                self.buf.drain(..at + self.syntax.openers()[which].len());
                self.state = State::Call { which, back: Mode::Reasoning };
                true
            }
            _ => {
                let keep = if end {
                    0
                } else {
                    let closes = self.syntax.think_markers().iter().map(|(_, c)| *c);
                    let markers: Vec<&str> = closes.chain(self.syntax.openers().iter().copied()).collect();
                    partial_suffix(&self.buf, &markers)
                };
                let upto = self.buf.len() - keep;
                emit(out, StreamEvent::Reasoning, &self.buf[..upto]);
                self.buf.drain(..upto);
                false
            }
        }
    }

    /// The earliest call opener in the buffer: (offset, which).
    fn first_opener(&self) -> Option<(usize, usize)> {
        self.syntax.openers().iter().enumerate().filter_map(|(i, o)| self.buf.find(o).map(|at| (at, i))).min()
    }

    /// Content up to the next call, fence or bare JSON call.
    fn content(&mut self, end: bool, out: &mut Vec<StreamEvent>) -> bool {
        let skip = match self.skip {
            Skip::Nothing => None,
            Skip::Newlines => Some(self.buf.trim_start_matches(['\n', '\r']).len()),
            Skip::Separators => Some(self.buf.trim_start_matches(|c: char| c.is_whitespace() || c == ';').len()),
        };
        if let Some(left) = skip {
            self.buf.drain(..self.buf.len() - left);
            if self.buf.is_empty() && !end {
                return false;
            }
            self.skip = Skip::Nothing;
        }
        let Some((at, next)) = self.next_in_content(end) else {
            let keep = if end {
                0
            } else {
                let mut markers: Vec<&str> = self.syntax.openers().to_vec();
                if self.recovering() {
                    markers.push(FENCE);
                }
                partial_suffix(&self.buf, &markers)
            };
            let upto = self.buf.len() - keep;
            emit(out, StreamEvent::Content, &self.buf[..upto]);
            self.buf.drain(..upto);
            return false;
        };
        match next {
            Next::Opener(which) => {
                self.emit_content(out, at);
                self.buf.drain(..self.syntax.openers()[which].len());
                self.state = State::Call { which, back: Mode::Content };
                true
            }
            Next::Undecided => {
                self.emit_content(out, at);
                false
            }
            Next::Fence => self.fence(at, end, out),
            Next::Bare => self.bare(at, end, out),
        }
    }

    /// Emits the first `n` bytes of the buffer as content.
    fn emit_content(&mut self, out: &mut Vec<StreamEvent>, n: usize) {
        emit(out, StreamEvent::Content, &self.buf[..n]);
        self.buf.drain(..n);
    }

    /// The first thing in the content that is not plain text.
    fn next_in_content(&self, end: bool) -> Option<(usize, Next)> {
        let mut best: Option<(usize, Next)> = self.first_opener().map(|(at, w)| (at, Next::Opener(w)));
        if !self.recovering() {
            return best;
        }
        let limit = best.map_or(self.buf.len(), |(at, _)| at);
        if let Some(at) = self.buf[..limit].find(FENCE) {
            best = Some((at, Next::Fence));
        }
        if self.in_code {
            return best;
        }
        let limit = best.map_or(self.buf.len(), |(at, _)| at);
        for (at, _) in self.buf[..limit].match_indices(['{', '[']) {
            match bare_call_start(&self.buf[at..]) {
                Tri::No => continue,
                Tri::Maybe if end => continue,
                Tri::Maybe => return Some((at, Next::Undecided)),
                Tri::Yes => return Some((at, Next::Bare)),
            }
        }
        best
    }

    /// A markdown fence at `at`.
    fn fence(&mut self, at: usize, end: bool, out: &mut Vec<StreamEvent>) -> bool {
        if self.in_code {
            // The fence that closes a code block.
            self.emit_content(out, at + FENCE.len());
            self.in_code = false;
            return true;
        }
        let after = at + FENCE.len();
        let Some(nl) = self.buf[after..].find('\n').map(|n| after + n) else {
            if end {
                self.emit_content(out, self.buf.len());
            } else {
                self.emit_content(out, at);
            }
            return false;
        };
        let info = self.buf[after..nl].trim().to_ascii_lowercase();
        let body_start = nl + 1;
        if !JSON_FENCES.contains(&info.as_str()) {
            self.emit_content(out, body_start);
            self.in_code = true;
            return true;
        }
        match self.buf[body_start..].trim_start().chars().next() {
            None if end => {
                self.emit_content(out, self.buf.len());
                return false;
            }
            None => {
                // Wait for the body's first character.
                self.emit_content(out, at);
                return false;
            }
            Some('{' | '[') => {}
            Some(_) => {
                self.emit_content(out, body_start);
                self.in_code = true;
                return true;
            }
        }
        let (body_end, consumed) = match self.buf[body_start..].find(FENCE) {
            Some(close) => (body_start + close, body_start + close + FENCE.len()),
            None if end => (self.buf.len(), self.buf.len()),
            None => {
                self.emit_content(out, at);
                return false;
            }
        };
        let recovered = json::recover(&self.buf[body_start..body_end], &self.tools, false);
        self.finish_recovery(at, consumed, recovered, out);
        true
    }

    /// A JSON call object on its own at `at`.
    fn bare(&mut self, at: usize, end: bool, out: &mut Vec<StreamEvent>) -> bool {
        let any = self.syntax.bare_json_any_name();
        match json::json_value_end(&self.buf[at..]) {
            Some(len) => {
                let recovered = json::recover(&self.buf[at..at + len], &self.tools, any);
                self.finish_recovery(at, at + len, recovered, out);
                true
            }
            None if end => {
                let text = &self.buf[at..];
                let names = json::peek_name(text).filter(|n| any || json::offered(&self.tools, n));
                self.emit_content(out, at);
                let text = std::mem::take(&mut self.buf);
                if names.is_some() {
                    out.push(StreamEvent::Malformed(MalformedCall {
                        text,
                        error: CodecError::Unterminated("a JSON tool call".into()),
                    }));
                } else {
                    emit(out, StreamEvent::Content, &text);
                }
                false
            }
            None => {
                self.emit_content(out, at);
                false
            }
        }
    }

    /// Replaces bytes `at..consumed` by the calls recovered from them, or emits them as
    /// content when they are not calls.
    fn finish_recovery(&mut self, at: usize, consumed: usize, recovered: Recovered, out: &mut Vec<StreamEvent>) {
        match recovered {
            Recovered::Calls(items) => {
                self.emit_content(out, at);
                self.buf.drain(..consumed - at);
                push_items(out, items);
                self.skip = Skip::Separators;
            }
            Recovered::NotACall => self.emit_content(out, consumed),
        }
    }

    /// A call body.
    fn call(&mut self, which: usize, back: Mode, end: bool, out: &mut Vec<StreamEvent>) -> bool {
        let opener = self.syntax.openers()[which];
        let (len, calls) = match self.syntax.body(which, &self.buf, end, &self.tools) {
            Body::More if !end => return false,
            Body::More => {
                let raw = format!("{opener}{}", self.buf);
                (self.buf.len(), vec![json::bad(&raw, CodecError::Unterminated(opener.into()))])
            }
            Body::Done { len, calls } => (len, calls),
        };
        self.buf.drain(..len);
        push_items(out, calls);
        self.state = State::Text(back);
        if back == Mode::Content {
            self.skip = Skip::Separators;
        }
        true
    }
}

impl<S: CallSyntax> ReplyParser for Scanner<S> {
    fn push(&mut self, delta: &str) -> Vec<StreamEvent> {
        self.buf.push_str(delta);
        self.drain(false)
    }

    fn finish(&mut self) -> Vec<StreamEvent> {
        self.drain(true)
    }
}

fn push_items(out: &mut Vec<StreamEvent>, items: Vec<Item>) {
    for item in items {
        out.push(match item {
            Ok(call) => StreamEvent::ToolCall(call),
            Err(m) => StreamEvent::Malformed(m),
        });
    }
}

fn emit(out: &mut Vec<StreamEvent>, make: fn(String) -> StreamEvent, text: &str) {
    if !text.is_empty() {
        out.push(make(text.to_string()));
    }
}

/// Length of the longest suffix of `buf` that is a proper prefix of one of `markers`.
pub(crate) fn partial_suffix(buf: &str, markers: &[&str]) -> usize {
    let mut best = 0;
    for marker in markers {
        for n in (best + 1)..marker.len().min(buf.len() + 1) {
            if buf.is_char_boundary(buf.len() - n) && marker.is_char_boundary(n) && buf.ends_with(&marker[..n]) {
                best = n;
            }
        }
    }
    best
}

/// A three-way answer for a prefix: yes, no, or not decided by the text so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tri {
    Yes,
    No,
    Maybe,
}

/// The keys a JSON call object may start with.
const CALL_KEYS: [&str; 3] = ["name", "function", "type"];

/// Whether `s` (starting with `{` or `[`) starts like a JSON call object: `{"name"`,
/// `{"function"`, `{"type"`, or `[` then one of those, with any whitespace between.
fn bare_call_start(s: &str) -> Tri {
    let mut rest = s;
    if let Some(r) = rest.strip_prefix('[') {
        rest = r.trim_start();
        if rest.is_empty() {
            return Tri::Maybe;
        }
    }
    let Some(r) = rest.strip_prefix('{') else { return Tri::No };
    let r = r.trim_start();
    if r.is_empty() {
        return Tri::Maybe;
    }
    let Some(key) = r.strip_prefix('"') else { return Tri::No };
    let mut maybe = false;
    for k in CALL_KEYS {
        let quoted = format!("{k}\"");
        if key.starts_with(&quoted) {
            return Tri::Yes;
        }
        maybe |= quoted.starts_with(key);
    }
    if maybe {
        Tri::Maybe
    } else {
        Tri::No
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_starts() {
        assert_eq!(bare_call_start(r#"{"name": 1"#), Tri::Yes);
        assert_eq!(bare_call_start("[\n {\n \"function\""), Tri::Yes);
        assert_eq!(bare_call_start(r#"{"na"#), Tri::Maybe);
        assert_eq!(bare_call_start("{ "), Tri::Maybe);
        assert_eq!(bare_call_start("["), Tri::Maybe);
        assert_eq!(bare_call_start(r#"{"nope"#), Tri::No);
        assert_eq!(bare_call_start("[1, 2]"), Tri::No);
        assert_eq!(bare_call_start("{x}"), Tri::No);
    }

    #[test]
    fn partial_suffixes() {
        assert_eq!(partial_suffix("abc <tool_c", &["<tool_call>"]), 7);
        assert_eq!(partial_suffix("abc <tool_call>", &["<tool_call>"]), 0);
        assert_eq!(partial_suffix("x `", &["```", "<tool_call>"]), 1);
        assert_eq!(partial_suffix("é", &["<a>"]), 0);
    }
}
