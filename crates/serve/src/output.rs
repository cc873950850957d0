//! From generated token ids to what the client sees: streaming detokenization, stop strings,
//! the reasoning / content / tool-call split of chat replies (through the shared
//! [`frognano_protocol::codec`], in the model's tool-call format), and per-token
//! log-probabilities. A malformed call reaches the client as the text the model wrote, and
//! the calls around it still come as calls.

use frognano_engine::TokenChoice;
use std::sync::Arc;

use frognano_model::tokenizer::{StreamDecoder, Tokenizer};
use frognano_protocol::codec::{ReplyParser, StreamEvent, ToolCallFormat, ToolParser};
use frognano_protocol::ToolCall;
use serde_json::Value;

/// How the generated text is turned into output.
#[derive(Debug, Clone)]
pub enum OutputMode {
    /// `/v1/completions`: plain text.
    Text,
    /// `/v1/chat/completions`: reasoning, content and tool calls.
    Chat {
        /// The tool-call format the model writes.
        format: ToolParser,
        /// The prompt ended inside an open `<think>` block.
        thinking_prompted: bool,
        /// The request's tools (argument values are typed by their schemas).
        tools: Vec<Value>,
        /// Turn tool-call text into tool calls (false for `tool_choice: "none"`).
        parse_tool_calls: bool,
    },
}

/// One token's log-probability as reported to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's text (its bytes read as UTF-8, lossily).
    pub token: String,
    /// The token's raw bytes.
    pub bytes: Vec<u8>,
    /// log p(token).
    pub logprob: f32,
    /// The most likely alternatives, best first: (text, bytes, log p).
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// New output since the last delta.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delta {
    /// Reasoning text (chat only).
    pub reasoning: String,
    /// Visible text.
    pub content: String,
    /// Complete tool calls (chat only).
    pub tool_calls: Vec<ToolCall>,
    /// Log-probabilities of the tokens behind this delta (when asked for).
    pub logprobs: Vec<TokenLogprob>,
}

impl Delta {
    /// A delta of reasoning, text and calls (no log-probabilities), as tests write them.
    #[cfg(test)]
    pub(crate) fn of(reasoning: &str, content: &str, tool_calls: Vec<ToolCall>) -> Self {
        Delta { reasoning: reasoning.into(), content: content.into(), tool_calls, logprobs: Vec::new() }
    }

    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.tool_calls.is_empty() && self.logprobs.is_empty()
    }

    /// Whether there is text or a tool call (log-probabilities alone wait for text).
    pub fn has_output(&self) -> bool {
        !(self.reasoning.is_empty() && self.content.is_empty() && self.tool_calls.is_empty())
    }

    /// Appends `other`.
    pub fn extend(&mut self, other: Delta) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
        self.tool_calls.extend(other.tool_calls);
        self.logprobs.extend(other.logprobs);
    }
}

/// What a part of a chat reply holds: the model's reasoning or its visible text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartKind {
    /// Reasoning (a `thinking` block, a `reasoning` item).
    Reasoning,
    /// Visible text.
    Text,
}

/// One step of a chat reply cut into parts, for the APIs whose replies are lists of parts
/// (Anthropic's content blocks, the Responses API's output items). Indices count the parts
/// from 0 in order; one part is open at a time.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PartEvent {
    /// A text part opens at an index with its first text.
    Open(usize, PartKind, String),
    /// More text of the open part.
    Text(usize, PartKind, String),
    /// The part at an index is complete.
    Close(usize, PartKind),
    /// A tool call: a whole part of its own.
    Call(usize, ToolCall),
}

/// Cuts a reply's deltas into parts: reasoning into reasoning parts, text into text parts,
/// each tool call into a part of its own. A part opens at its first non-blank text (the
/// blank text before it is kept in it), so the blank lines a model writes between its
/// thinking, its text and its calls make no parts of their own.
#[derive(Debug, Default)]
pub(crate) struct PartWriter {
    next: usize,
    open: Option<(usize, PartKind)>,
    /// Blank text of a part not yet opened.
    held: Option<(PartKind, String)>,
}

impl PartWriter {
    /// The events one delta makes.
    pub fn push(&mut self, delta: &Delta) -> Vec<PartEvent> {
        let mut out = Vec::new();
        self.text(PartKind::Reasoning, &delta.reasoning, &mut out);
        self.text(PartKind::Text, &delta.content, &mut out);
        for call in &delta.tool_calls {
            self.held = None;
            self.close(&mut out);
            let index = self.take_index();
            out.push(PartEvent::Call(index, call.clone()));
        }
        out
    }

    /// Closes the open part, if any (blank text never opened is dropped).
    pub fn finish(&mut self) -> Vec<PartEvent> {
        let mut out = Vec::new();
        self.held = None;
        self.close(&mut out);
        out
    }

    fn text(&mut self, kind: PartKind, text: &str, out: &mut Vec<PartEvent>) {
        if text.is_empty() {
            return;
        }
        if let Some((index, open)) = self.open {
            if open == kind {
                out.push(PartEvent::Text(index, kind, text.to_string()));
                return;
            }
        }
        let mut pending = match self.held.take() {
            Some((held_kind, blank)) if held_kind == kind => blank,
            _ => String::new(),
        };
        pending.push_str(text);
        if pending.trim().is_empty() {
            self.held = Some((kind, pending));
            return;
        }
        self.close(out);
        let index = self.take_index();
        out.push(PartEvent::Open(index, kind, pending));
        self.open = Some((index, kind));
    }

    fn close(&mut self, out: &mut Vec<PartEvent>) {
        if let Some((index, kind)) = self.open.take() {
            out.push(PartEvent::Close(index, kind));
        }
    }

    fn take_index(&mut self) -> usize {
        self.next += 1;
        self.next - 1
    }
}

/// Holds back text that may be the start of a stop string; cuts at the first stop string.
#[derive(Debug, Clone, Default)]
pub struct StopScanner {
    stops: Vec<String>,
    held: String,
    /// The stop string that ended the text, once one has.
    matched: Option<String>,
}

impl StopScanner {
    /// A scanner for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        StopScanner { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new(), matched: None }
    }

    /// Adds text; returns the text that is safe to emit and whether a stop string was hit
    /// (the text before it is emitted; the stop string and everything after are dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.stops.is_empty() {
            return (text.to_string(), false);
        }
        self.held.push_str(text);
        // The earliest match wins; of two starting at the same byte, the first listed.
        let first =
            self.stops.iter().filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s))).min_by_key(|&(at, _)| at);
        if let Some((at, stop)) = first {
            self.matched = Some(stop.clone());
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        let keep = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len().min(self.held.len() + 1))
                    .rev()
                    .find(|&n| {
                        self.held.is_char_boundary(self.held.len() - n)
                            && s.is_char_boundary(n)
                            && self.held.ends_with(&s[..n])
                    })
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// Ends the text: whatever is held back is emitted.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The stop string that ended the text, if one did (Anthropic's `stop_sequence`).
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }
}

/// The whole path from generated ids to [`Delta`]s for one reply.
pub struct ReplyAssembler {
    tokenizer: Arc<Tokenizer>,
    decoder: StreamDecoder<Arc<Tokenizer>>,
    stops: StopScanner,
    parser: Option<(ToolParser, Box<dyn ReplyParser>)>,
    /// `tool_choice: "none"`: tool-call blocks are given back as text, not as calls.
    tool_passthrough: bool,
    eos_ids: Vec<u32>,
    top_logprobs: Option<usize>,
    pending_logprobs: Vec<TokenLogprob>,
    /// A stop string was hit.
    pub stopped_by_string: bool,
    /// At least one tool call was produced.
    pub saw_tool_call: bool,
}

impl ReplyAssembler {
    /// An assembler for one reply. `top_logprobs`: `None` for no log-probabilities, else the
    /// number of alternatives per token. `eos_ids` are not shown as text or log-probabilities.
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        mode: &OutputMode,
        stops: Vec<String>,
        eos_ids: Vec<u32>,
        top_logprobs: Option<usize>,
    ) -> Self {
        let (parser, tool_passthrough) = match mode {
            OutputMode::Text => (None, false),
            OutputMode::Chat { format, thinking_prompted, tools, parse_tool_calls } => {
                (Some((*format, format.stream_parser(*thinking_prompted, tools))), !parse_tool_calls)
            }
        };
        ReplyAssembler {
            decoder: StreamDecoder::new(Arc::clone(&tokenizer), true),
            tokenizer,
            stops: StopScanner::new(stops),
            parser,
            tool_passthrough,
            eos_ids,
            top_logprobs,
            pending_logprobs: Vec::new(),
            stopped_by_string: false,
            saw_tool_call: false,
        }
    }

    /// Takes one generated token. Returns the new output (possibly empty) and whether
    /// generation must stop (a stop string was hit).
    pub fn push_token(&mut self, choice: &TokenChoice) -> (Delta, bool) {
        if self.eos_ids.contains(&choice.id) {
            return (Delta::default(), false);
        }
        if let Some(k) = self.top_logprobs {
            let (token, bytes) = token_text(&self.tokenizer, choice.id);
            let top = choice
                .top
                .iter()
                .take(k)
                .map(|&(id, lp)| {
                    let (t, b) = token_text(&self.tokenizer, id);
                    (t, b, lp)
                })
                .collect();
            self.pending_logprobs.push(TokenLogprob { token, bytes, logprob: choice.logprob, top });
        }
        let piece = self.decoder.step(choice.id).ok().flatten().unwrap_or_default();
        let mut delta = Delta::default();
        if !piece.is_empty() {
            let (text, stopped) = self.stops.push(&piece);
            delta = self.push_text(&text);
            if stopped {
                self.stopped_by_string = true;
                delta.extend(self.flush_parser());
                delta.logprobs = std::mem::take(&mut self.pending_logprobs);
                return (delta, true);
            }
        }
        if delta.has_output() {
            delta.logprobs = std::mem::take(&mut self.pending_logprobs);
        }
        (delta, false)
    }

    /// The stop string that ended the reply, if one did.
    pub fn stop_sequence(&self) -> Option<&str> {
        self.stops.matched()
    }

    /// Ends the reply: flushes held-back text and the parser.
    pub fn finish(&mut self) -> Delta {
        let mut delta = Delta::default();
        if !self.stopped_by_string {
            let tail = self.decoder.finish().ok().flatten().unwrap_or_default();
            let (text, stopped) = self.stops.push(&tail);
            self.stopped_by_string |= stopped;
            delta.extend(self.push_text(&text));
            if !stopped {
                let held = self.stops.finish();
                delta.extend(self.push_text(&held));
            }
        }
        delta.extend(self.flush_parser());
        delta.logprobs = std::mem::take(&mut self.pending_logprobs);
        delta
    }

    fn push_text(&mut self, text: &str) -> Delta {
        if text.is_empty() {
            return Delta::default();
        }
        match self.parser.as_mut() {
            None => Delta { content: text.to_string(), ..Delta::default() },
            Some((_, parser)) => {
                let events = parser.push(text);
                self.apply(events)
            }
        }
    }

    fn flush_parser(&mut self) -> Delta {
        match self.parser.as_mut() {
            None => Delta::default(),
            Some((_, parser)) => {
                let events = parser.finish();
                self.apply(events)
            }
        }
    }

    fn apply(&mut self, events: Vec<StreamEvent>) -> Delta {
        let mut d = Delta::default();
        let format = self.parser.as_ref().map(|(f, _)| *f);
        for e in events {
            match e {
                StreamEvent::Reasoning(r) => d.reasoning.push_str(&r),
                StreamEvent::Content(c) => d.content.push_str(&c),
                StreamEvent::ToolCall(call) if self.tool_passthrough => {
                    let text = format.and_then(|f| f.render_tool_calls(&[call]).ok()).unwrap_or_default();
                    d.content.push_str(&text)
                }
                StreamEvent::ToolCall(call) => {
                    self.saw_tool_call = true;
                    d.tool_calls.push(call)
                }
                StreamEvent::Malformed(bad) => {
                    tracing::warn!("the model wrote a malformed tool call ({}); it is sent as text", bad.error);
                    d.content.push_str(&bad.text)
                }
            }
        }
        d
    }
}

/// A token's text and raw bytes. Byte-level BPE vocabularies store bytes as GPT-2's
/// printable characters (`Ġ` for a space); those are mapped back, so a token that ends in
/// the middle of a UTF-8 character still reports its exact bytes.
pub fn token_text(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = match tokenizer.id_to_token(id) {
        Some(vocab_form) => match gpt2_bytes(&vocab_form) {
            Some(b) => b,
            None => tokenizer.decode(&[id], false).unwrap_or_default().into_bytes(),
        },
        None => Vec::new(),
    };
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// GPT-2's byte ↔ printable-character table, inverted; `None` if a character is not in it.
fn gpt2_bytes(s: &str) -> Option<Vec<u8>> {
    s.chars().map(gpt2_char_to_byte).collect()
}

fn gpt2_char_to_byte(c: char) -> Option<u8> {
    let c = c as u32;
    // Printable bytes map to themselves; the rest (0..=32, 127..=160, 173) to 256 + n in order.
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    if c < 256 {
        return printable(c).then_some(c as u8);
    }
    let n = c - 256;
    (0u32..256).filter(|b| !printable(*b)).nth(n as usize).map(|b| b as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_cut_and_hold_back() {
        let mut s = StopScanner::new(vec!["END".into()]);
        assert_eq!(s.push("abc E"), ("abc ".to_string(), false));
        assert_eq!(s.push("N"), (String::new(), false));
        assert_eq!(s.push("Dxyz"), (String::new(), true));
        let mut s = StopScanner::new(vec!["END".into()]);
        assert_eq!(s.push("abc EN"), ("abc ".to_string(), false));
        assert_eq!(s.push("x"), ("ENx".to_string(), false));
        assert_eq!(s.finish(), "");
        let mut s = StopScanner::new(vec!["\n\n".into(), "é!".into()]);
        assert_eq!(s.push("aé"), ("a".to_string(), false));
        assert_eq!(s.push("!b"), (String::new(), true));
        assert_eq!(s.matched(), Some("é!"));
        let mut s = StopScanner::new(vec!["cd".into(), "b".into()]);
        assert_eq!(s.push("abcd"), ("a".to_string(), true));
        assert_eq!(s.matched(), Some("b"), "the earliest match, not the first listed");
    }

    #[test]
    fn gpt2_table_round_trips() {
        assert_eq!(gpt2_char_to_byte('Ġ'), Some(b' '));
        assert_eq!(gpt2_char_to_byte('Ċ'), Some(b'\n'));
        assert_eq!(gpt2_char_to_byte('a'), Some(b'a'));
        assert_eq!(gpt2_char_to_byte('Ā'), Some(0));
        assert_eq!(gpt2_bytes("ĠÃ©"), Some(" é".as_bytes().to_vec()));
        assert_eq!(gpt2_char_to_byte('中'), None);
    }
}
