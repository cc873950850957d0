//! Grammar-constrained decoding with [llguidance]: a reply that must match a JSON schema, be
//! any JSON object, or follow a Lark grammar (the tool-call grammars of [`crate::tool_grammar`]).
//! docs/structured.md §2 describes it for users.
//!
//! Three layers, from the model outwards:
//!
//! - [`ConstraintFactory`], once per tokenizer: every token id's exact bytes (from
//!   [`Tokenizer::token_bytes`]; control tokens such as `<|im_end|>` marked special, so grammar
//!   text never contains them) in llguidance's token trie, with the model's end-of-turn ids as
//!   its end-of-sequence set. Building it takes tens of milliseconds for a 150k vocabulary, so
//!   it is shared ([`LazyConstraints`] builds it on first use).
//! - [`CompiledGrammar`], once per grammar: the grammar checked and compiled ([`Grammar`]);
//!   a bad schema or grammar is a [`ConstraintError::Grammar`] naming what is wrong. Cheap to
//!   clone; every reply that uses it starts its own [`Constraint`] from it.
//! - [`Constraint`], once per reply: the grammar's state after the tokens sampled so far. The
//!   sampler asks it for the allowed-token mask of the next position ([`Constraint::mask`]),
//!   and hands it every sampled token ([`Constraint::commit`]).
//!
//! **Off the critical path.** Computing a mask costs tens to hundreds of microseconds;
//! committing a token costs a few. Each [`Constraint`] has a helper thread: right after a token
//! is committed it starts computing the next mask, while the model runs its forward pass for
//! that token; the sampler joins it just before it samples. The first mask is computed while
//! the prompt is prefilled. [`ConstraintStats`] records how long the masks took and how long
//! the sampler waited for them (near zero when the forward pass is the longer of the two).
//!
//! **Ending.** End-of-turn ids are allowed exactly where the grammar may end. When the grammar
//! cannot continue after a token (a JSON object closed), the reply ends right there with
//! finish reason `stop`, without an end-of-turn token.
//!
//! [llguidance]: https://github.com/guidance-ai/llguidance

use std::sync::{mpsc, Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use frognano_model::tokenizer::{TokenBytes, Tokenizer};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

/// Whitespace the JSON grammars allow between two tokens of JSON: up to 20 spaces, tabs or
/// newlines (pretty-printing five levels deep fits). llguidance's default is unbounded, and a
/// small model sampled at temperature 1 can then spend its whole token budget on whitespace.
pub const JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,20}";

/// Why a constraint could not be built or went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    /// The tokenizer's token bytes cannot be known, or the model declares no end-of-turn id.
    #[error("constrained decoding is not available for this model: {0}")]
    Unsupported(String),
    /// The grammar or schema was refused; the message is llguidance's and names the part.
    #[error("{0}")]
    Grammar(String),
    /// The grammar state failed while generating (llguidance's message).
    #[error("the grammar failed during generation: {0}")]
    Failed(String),
}

/// What a reply must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// A JSON value valid under this JSON schema (draft 2020-12 as llguidance reads it:
    /// types, `properties`/`required`/`additionalProperties`, `enum`/`const`, numeric and
    /// length bounds, `pattern`, `anyOf`/`oneOf`/`allOf`, local `$ref`s).
    JsonSchema(Value),
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A grammar in llguidance's Lark dialect (`%json {…}` embeds schemas).
    Lark(String),
}

impl Grammar {
    fn to_llguidance(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonSchema(schema) => TopLevelGrammar::from_json_schema(with_json_options(schema.clone())),
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(with_json_options(json!({"type": "object"}))),
            Grammar::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        }
    }
}

/// `schema` with FrogNano's JSON options ([`JSON_WHITESPACE`]) unless it sets its own
/// (llguidance's `x-guidance` key). A schema that is not an object is left for llguidance to
/// refuse (or accept: `true` is a valid schema).
pub fn with_json_options(mut schema: Value) -> Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(|| json!({"whitespace_pattern": JSON_WHITESPACE}));
    }
    schema
}

/// The token environment llguidance needs: our tokenizer's vocabulary as bytes in a
/// [`TokTrie`], and our tokenizer for turning grammar text into tokens.
struct VocabEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Text goes through the real tokenizer (so forced text gets the ids the model was
        // trained on); bytes that are not UTF-8, text the tokenizer fails on, and ids that do
        // not spell the text exactly (a SentencePiece vocabulary prepends a space to every
        // text it is given) fall back to the longest-match walk of the trie.
        self.trie.tokenize_with_greedy_fallback(s, |text| match self.tokenizer.encode_with(text, false) {
            Ok(ids) if self.trie.decode(&ids) == text.as_bytes() => ids,
            _ => self.trie.greedy_tokenize(text.as_bytes()),
        })
    }
}

/// The shared, per-tokenizer half of constrained decoding: compiles grammars.
pub struct ConstraintFactory {
    parsers: ParserFactory,
}

impl std::fmt::Debug for ConstraintFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintFactory")
            .field("vocab_size", &self.parsers.tok_env().tok_trie().vocab_size())
            .finish()
    }
}

impl ConstraintFactory {
    /// The factory for a model whose output head has `vocab_size` rows, whose tokens are
    /// `tokenizer`'s, and whose turns end with `eos_ids` (allowed where a grammar may end).
    pub fn new(tokenizer: Arc<Tokenizer>, vocab_size: usize, eos_ids: &[u32]) -> Result<Self, ConstraintError> {
        let unsupported = ConstraintError::Unsupported;
        if eos_ids.is_empty() {
            return Err(unsupported("the model declares no end-of-sequence token".into()));
        }
        if let Some(bad) = eos_ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(unsupported(format!("end-of-sequence id {bad} is outside the vocabulary ({vocab_size})")));
        }
        let entries = tokenizer.token_bytes(vocab_size).map_err(|e| unsupported(e.to_string()))?;
        let words: Vec<Vec<u8>> = entries
            .into_iter()
            .map(|entry| match entry {
                TokenBytes::Text(bytes) => bytes,
                TokenBytes::Control(text) => {
                    // llguidance's convention: special tokens are their text behind 0xFF (never
                    // a byte of UTF-8 text), reachable in grammars only as `<|name|>`.
                    let mut b = Vec::with_capacity(text.len() + 1);
                    b.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    b.extend_from_slice(&text);
                    b
                }
                TokenBytes::Missing => Vec::new(),
            })
            .collect();
        let info = TokRxInfo::new(vocab_size as u32, eos_ids[0]);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos_ids);
        let env: llguidance::toktrie::TokEnv = Arc::new(VocabEnv { trie, tokenizer });
        let mut parsers = ParserFactory::new_simple(&env).map_err(|e| unsupported(e.to_string()))?;
        // Errors come back as values; llguidance's own stderr logging would duplicate them.
        parsers.quiet();
        Ok(ConstraintFactory { parsers })
    }

    /// Rows of the output head the masks cover.
    pub fn vocab_size(&self) -> usize {
        self.parsers.tok_env().tok_trie().vocab_size()
    }

    /// Checks and compiles `grammar`. A schema or grammar llguidance refuses, or one that no
    /// text can match, is a [`ConstraintError::Grammar`] with llguidance's message.
    pub fn compile(&self, grammar: &Grammar) -> Result<CompiledGrammar, ConstraintError> {
        let parser =
            self.parsers.create_parser(grammar.to_llguidance()).map_err(|e| ConstraintError::Grammar(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::Grammar(e));
        }
        // A grammar that allows no first token (an unsatisfiable schema) is refused now, not
        // at the first token of a reply.
        let mut probe = matcher.clone();
        probe.compute_mask().map_err(|e| ConstraintError::Grammar(e.to_string()))?;
        Ok(CompiledGrammar { prototype: Arc::new(matcher), vocab_size: self.vocab_size() })
    }
}

/// A [`ConstraintFactory`] built on first use (so a server or agent that never constrains a
/// reply never pays for it), or the reason it cannot be built, remembered; with the last few
/// grammars it compiled, since an agent or a client sends the same tool list every turn.
pub struct LazyConstraints {
    tokenizer: Arc<Tokenizer>,
    vocab_size: usize,
    eos_ids: Vec<u32>,
    cell: OnceLock<Result<Arc<ConstraintFactory>, ConstraintError>>,
    /// Recently compiled grammars, the most recently used last.
    recent: Mutex<Vec<(Grammar, CompiledGrammar)>>,
}

/// How many compiled grammars a [`LazyConstraints`] keeps.
const RECENT_GRAMMARS: usize = 8;

impl LazyConstraints {
    /// The factory [`ConstraintFactory::new`] would build from these, built when first asked for.
    pub fn new(tokenizer: Arc<Tokenizer>, vocab_size: usize, eos_ids: Vec<u32>) -> Self {
        LazyConstraints { tokenizer, vocab_size, eos_ids, cell: OnceLock::new(), recent: Mutex::new(Vec::new()) }
    }

    /// The factory (built now if this is the first call).
    pub fn get(&self) -> Result<&Arc<ConstraintFactory>, ConstraintError> {
        self.cell
            .get_or_init(|| {
                ConstraintFactory::new(Arc::clone(&self.tokenizer), self.vocab_size, &self.eos_ids).map(Arc::new)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// [`ConstraintFactory::compile`] on the factory, or the same grammar's earlier result
    /// when it is among the last few compiled.
    pub fn compile(&self, grammar: &Grammar) -> Result<CompiledGrammar, ConstraintError> {
        {
            let mut recent = self.recent();
            if let Some(i) = recent.iter().position(|(g, _)| g == grammar) {
                let entry = recent.remove(i);
                let compiled = entry.1.clone();
                recent.push(entry);
                return Ok(compiled);
            }
        }
        // Compiled outside the lock: another request's grammar need not wait for this one.
        let compiled = self.get()?.compile(grammar)?;
        let mut recent = self.recent();
        if recent.len() == RECENT_GRAMMARS {
            recent.remove(0);
        }
        recent.push((grammar.clone(), compiled.clone()));
        Ok(compiled)
    }

    fn recent(&self) -> MutexGuard<'_, Vec<(Grammar, CompiledGrammar)>> {
        // The list is only ever whole: a panic elsewhere while it was held leaves it usable.
        self.recent.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl std::fmt::Debug for LazyConstraints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyConstraints").field("built", &self.cell.get().is_some()).finish()
    }
}

/// A checked, compiled grammar: the state before any token, which every reply copies.
#[derive(Clone)]
pub struct CompiledGrammar {
    prototype: Arc<Matcher>,
    vocab_size: usize,
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledGrammar").field("vocab_size", &self.vocab_size).finish()
    }
}

impl CompiledGrammar {
    /// A constraint for one reply; its helper thread starts computing the first mask at once
    /// (while the prompt is prefilled).
    pub fn start(&self) -> Constraint {
        Constraint::new(Matcher::clone(&self.prototype), self.vocab_size)
    }
}

/// The allowed tokens of one position.
#[derive(Debug, Clone)]
pub struct TokenMask {
    allowed: SimpleVob,
}

impl TokenMask {
    /// Whether `id` may be sampled.
    pub fn is_allowed(&self, id: u32) -> bool {
        (id as usize) < self.allowed.len() && self.allowed.is_allowed(id)
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        self.allowed.num_set()
    }

    /// Sets every disallowed entry of `logits` to −∞ (entries past the mask's vocabulary too).
    pub fn apply(&self, logits: &mut [f32]) {
        let n = self.allowed.len().min(logits.len());
        self.allowed.iter_unset_entries(|i| {
            if i < n {
                logits[i] = f32::NEG_INFINITY;
            }
        });
        logits[n..].iter_mut().for_each(|l| *l = f32::NEG_INFINITY);
    }
}

/// How a reply's constraint went: for logs, benchmarks and tests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConstraintStats {
    /// Masks computed.
    pub masks: usize,
    /// Time spent computing them (on the helper thread).
    pub mask_time: Duration,
    /// Time the sampler waited for a mask (the part of `mask_time` that was not hidden
    /// behind a forward pass).
    pub wait_time: Duration,
    /// The grammar was complete and could not continue: the reply ended there.
    pub completed: bool,
    /// Why the grammar stopped the reply early, if it failed.
    pub error: Option<String>,
}

/// What [`Constraint::commit`] says about the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// The grammar goes on; the next mask is being computed.
    Continue,
    /// The grammar is complete and allows nothing more: the reply ends with this token.
    Complete,
}

struct MaskResult {
    mask: Result<SimpleVob, String>,
    took: Duration,
}

fn lock(m: &Mutex<Matcher>) -> MutexGuard<'_, Matcher> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One reply's grammar state, with the helper thread that computes its masks.
pub struct Constraint {
    matcher: Arc<Mutex<Matcher>>,
    /// Asks the helper thread for the mask of the current state.
    requests: mpsc::Sender<()>,
    masks: mpsc::Receiver<MaskResult>,
    /// A request is out and its answer not yet taken.
    pending: bool,
    vocab_size: usize,
    stats: ConstraintStats,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("pending", &self.pending).field("stats", &self.stats).finish()
    }
}

impl Constraint {
    fn new(matcher: Matcher, vocab_size: usize) -> Self {
        let matcher = Arc::new(Mutex::new(matcher));
        let (requests, request_rx) = mpsc::channel::<()>();
        let (mask_tx, masks) = mpsc::channel();
        let worker = Arc::clone(&matcher);
        // The helper thread lives as long as the constraint: it ends when `requests` is
        // dropped (the reply finished or was abandoned).
        let spawned = std::thread::Builder::new().name("frognano-mask".into()).spawn(move || {
            for () in request_rx {
                let t = Instant::now();
                let mask = lock(&worker).compute_mask().map_err(|e| e.to_string());
                if mask_tx.send(MaskResult { mask, took: t.elapsed() }).is_err() {
                    return;
                }
            }
        });
        let mut c =
            Constraint { matcher, requests, masks, pending: false, vocab_size, stats: ConstraintStats::default() };
        if let Err(e) = spawned {
            // No thread: masks are computed inline (slower, still correct).
            c.stats.error = Some(format!("no mask thread ({e}); masks computed inline"));
        } else {
            c.request();
        }
        c
    }

    fn request(&mut self) {
        self.pending = self.requests.send(()).is_ok();
    }

    /// The allowed tokens of the next position: the mask the helper thread computed (waiting
    /// for it if it is not ready). An error means the grammar cannot go on; the reply should
    /// end.
    pub fn mask(&mut self) -> Result<TokenMask, ConstraintError> {
        let result = if self.pending {
            let t = Instant::now();
            let r = self.masks.recv();
            self.stats.wait_time += t.elapsed();
            self.pending = false;
            match r {
                Ok(r) => r,
                Err(_) => return Err(self.fail("the mask thread stopped".into())),
            }
        } else {
            let t = Instant::now();
            let mask = lock(&self.matcher).compute_mask().map_err(|e| e.to_string());
            let took = t.elapsed();
            self.stats.wait_time += took;
            MaskResult { mask, took }
        };
        self.stats.masks += 1;
        self.stats.mask_time += result.took;
        match result.mask {
            Ok(mut allowed) => {
                if allowed.len() != self.vocab_size {
                    allowed.resize(self.vocab_size);
                }
                Ok(TokenMask { allowed })
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Advances the grammar by the sampled token `id` and starts computing the next mask in
    /// the background. An error means the token was not allowed (a bug: it was sampled
    /// under the mask) or the grammar failed; the reply should end.
    pub fn commit(&mut self, id: u32) -> Result<Commit, ConstraintError> {
        let mut m = lock(&self.matcher);
        if let Err(e) = m.consume_token(id) {
            drop(m);
            return Err(self.fail(e.to_string()));
        }
        if m.is_stopped() {
            drop(m);
            self.stats.completed = true;
            return Ok(Commit::Complete);
        }
        drop(m);
        self.request();
        Ok(Commit::Continue)
    }

    /// Whether the text so far is a complete match (an end-of-turn id would be allowed now).
    pub fn is_accepting(&mut self) -> bool {
        lock(&self.matcher).is_accepting().unwrap_or(false)
    }

    /// How the constraint has gone so far.
    pub fn stats(&self) -> &ConstraintStats {
        &self.stats
    }

    fn fail(&mut self, message: String) -> ConstraintError {
        self.stats.error = Some(message.clone());
        ConstraintError::Failed(message)
    }
}

#[cfg(test)]
pub(crate) mod test_vocab {
    //! A tiny vocabulary for grammar tests: one token per byte, so any text can be fed.
    use super::*;
    use frognano_model::tokenizer::{AddedTokenSpec, BpeParts};

    /// A tiny byte-level vocabulary: every printable ASCII byte, a few merges, and two
    /// control tokens (`<|im_end|>` is the end of turn).
    pub fn tiny_tokenizer() -> (Arc<Tokenizer>, u32) {
        let table: Vec<String> = (0u8..=255).map(|b| gpt2_char(b).to_string()).collect();
        let mut tokens = table.clone();
        let merges = vec![("t".to_string(), "r".to_string()), ("tr".to_string(), "u".to_string())];
        tokens.extend(["tr".to_string(), "tru".to_string()]);
        let end = tokens.len() as u32;
        tokens.push("<|im_end|>".into());
        tokens.push("<|im_start|>".into());
        let added = vec![
            AddedTokenSpec { id: end, content: "<|im_end|>".into(), special: true },
            AddedTokenSpec { id: end + 1, content: "<|im_start|>".into(), special: true },
        ];
        let parts = BpeParts {
            tokens,
            merges,
            added,
            patterns: vec![frognano_model::tokenizer::GPT2_PATTERN.into()],
            ..Default::default()
        };
        (Arc::new(Tokenizer::from_bpe_parts(parts, "tiny").unwrap()), end)
    }

    fn gpt2_char(b: u8) -> char {
        let printable = |b: u8| matches!(b, 33..=126 | 161..=172 | 174..=255);
        if printable(b) {
            return b as char;
        }
        let n = (0..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(256 + n).unwrap()
    }

    pub fn factory() -> (ConstraintFactory, Arc<Tokenizer>, u32) {
        let (tok, end) = tiny_tokenizer();
        // Two rows more than the tokenizer has tokens, as a padded output head would.
        let f = ConstraintFactory::new(Arc::clone(&tok), tok.vocab_size() + 2, &[end]).unwrap();
        (f, tok, end)
    }

    /// How a text fed byte by byte fared under a grammar.
    #[derive(Debug, PartialEq, Eq)]
    pub enum Fed {
        /// Byte `at` was not allowed.
        Refused { at: usize, rest: String },
        /// All fed; the grammar could not continue after the last byte.
        Complete,
        /// All fed; the end of turn is allowed now.
        MayEnd,
        /// All fed; more must follow.
        Open,
    }

    /// Feeds `text` one byte token at a time (byte `b` is token `b`) under `grammar`.
    pub fn feed(grammar: &CompiledGrammar, end: u32, text: &str) -> Fed {
        let mut c = grammar.start();
        let bytes = text.as_bytes();
        for (at, &b) in bytes.iter().enumerate() {
            let refused = || Fed::Refused { at, rest: String::from_utf8_lossy(&bytes[at..]).into_owned() };
            match c.mask() {
                Ok(m) if m.is_allowed(b as u32) => {}
                _ => return refused(),
            }
            match c.commit(b as u32) {
                Ok(Commit::Continue) => {}
                Ok(Commit::Complete) if at + 1 == bytes.len() => return Fed::Complete,
                _ => return Fed::Refused { at: at + 1, rest: String::from_utf8_lossy(&bytes[at + 1..]).into_owned() },
            }
        }
        match c.mask() {
            Ok(m) if m.is_allowed(end) => Fed::MayEnd,
            _ => Fed::Open,
        }
    }

    pub fn id(tok: &Tokenizer, s: &str) -> u32 {
        let ids = tok.encode_with(s, false).unwrap();
        assert_eq!(ids.len(), 1, "{s:?} is one token");
        ids[0]
    }
}

#[cfg(test)]
mod tests {
    use super::test_vocab::{factory, id, tiny_tokenizer};
    use super::*;

    /// Grammar text is tokenized to ids that spell it exactly, also on a SentencePiece
    /// vocabulary, whose tokenizer prepends a space (`▁`) to every text it is given: `ab` is
    /// not `▁ab`.
    #[test]
    fn forced_text_on_a_sentencepiece_vocabulary_has_no_space_prefix() {
        use frognano_model::tokenizer::{AddedTokenSpec, SpmParts};
        let mut tokens: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
        tokens.extend(["\u{2581}", "a", "b", "ab", "\u{2581}ab", "</s>"].map(String::from));
        let n = tokens.len();
        let parts = SpmParts {
            normal: (0..n).map(|i| (256..n - 1).contains(&i)).collect(),
            scores: (0..n).map(|i| -(i as f32)).collect(),
            added: vec![AddedTokenSpec { id: n as u32 - 1, content: "</s>".into(), special: true }],
            tokens,
            unk: None,
            add_space_prefix: true,
            bos: None,
            strip_after: Vec::new(),
        };
        let tok = Arc::new(Tokenizer::from_spm_parts(parts, "tiny-spm").unwrap());
        assert_eq!(tok.encode_with("ab", false).unwrap(), vec![260], "the tokenizer itself gives `▁ab`");
        let f = ConstraintFactory::new(Arc::clone(&tok), n, &[n as u32 - 1]).unwrap();
        let env = f.parsers.tok_env();
        let ids = env.tokenize_bytes(b"ab");
        assert_eq!(env.tok_trie().decode(&ids), b"ab", "{ids:?}");
        assert_eq!(env.tok_trie().decode(&env.tokenize_bytes(b" ab")), b" ab");
    }

    /// An agent's every turn asks for the same tool grammar: it is compiled once and shared
    /// until RECENT_GRAMMARS other grammars have been compiled since it was last used.
    #[test]
    fn the_lazy_factory_reuses_recent_grammars() {
        let (tok, end) = tiny_tokenizer();
        let lazy = LazyConstraints::new(Arc::clone(&tok), tok.vocab_size(), vec![end]);
        let grammar = |i: usize| Grammar::Lark(format!("start: \"a\"{}", " \"b\"".repeat(i)));
        let first = lazy.compile(&grammar(0)).unwrap();
        assert!(Arc::ptr_eq(&first.prototype, &lazy.compile(&grammar(0)).unwrap().prototype));
        let other = lazy.compile(&grammar(1)).unwrap();
        assert!(!Arc::ptr_eq(&first.prototype, &other.prototype));
        for i in 1..RECENT_GRAMMARS {
            lazy.compile(&grammar(i)).unwrap();
        }
        // grammar(0) was used before the other RECENT_GRAMMARS - 1 and is still kept…
        assert!(Arc::ptr_eq(&first.prototype, &lazy.compile(&grammar(0)).unwrap().prototype));
        for i in RECENT_GRAMMARS..2 * RECENT_GRAMMARS {
            lazy.compile(&grammar(i)).unwrap();
        }
        // …until RECENT_GRAMMARS newer ones push it out.
        assert!(!Arc::ptr_eq(&first.prototype, &lazy.compile(&grammar(0)).unwrap().prototype));
    }

    /// The mask follows the grammar token by token: after `a` only `b` or `c`, end-of-turn
    /// exactly where the grammar may end, and the reply completes when nothing can follow.
    #[test]
    fn masks_follow_a_tiny_grammar() {
        let (f, tok, end) = factory();
        let g = f.compile(&Grammar::Lark(r#"start: "a" ("b" | "c"+)"#.into())).unwrap();
        let mut c = g.start();
        let m = c.mask().unwrap();
        assert!(m.is_allowed(id(&tok, "a")));
        assert_eq!(m.count(), 1, "only `a` may start");
        assert!(!m.is_allowed(end));
        assert_eq!(c.commit(id(&tok, "a")).unwrap(), Commit::Continue);
        let m = c.mask().unwrap();
        assert!(m.is_allowed(id(&tok, "b")) && m.is_allowed(id(&tok, "c")));
        assert!(!m.is_allowed(id(&tok, "a")) && !m.is_allowed(end), "`a` again or the end are not allowed");
        assert_eq!(c.commit(id(&tok, "c")).unwrap(), Commit::Continue);
        let m = c.mask().unwrap();
        assert!(m.is_allowed(id(&tok, "c")) && m.is_allowed(end), "more `c` or the end");
        assert!(!m.is_allowed(id(&tok, "b")));
        // Padding rows beyond the tokenizer are never allowed.
        assert!(!m.is_allowed(f.vocab_size() as u32 - 1));
        let mut logits = vec![1.0f32; f.vocab_size()];
        m.apply(&mut logits);
        let kept: Vec<usize> = (0..logits.len()).filter(|&i| logits[i].is_finite()).collect();
        assert_eq!(kept, vec![id(&tok, "c") as usize, end as usize]);

        let mut c = g.start();
        c.mask().unwrap();
        c.commit(id(&tok, "a")).unwrap();
        c.mask().unwrap();
        assert_eq!(c.commit(id(&tok, "b")).unwrap(), Commit::Complete, "nothing can follow `ab`");
        assert!(c.stats().completed);
        assert_eq!(c.stats().masks, 2);
    }

    /// A multi-byte token is allowed when its bytes fit the grammar, and a token that is
    /// not allowed is refused by commit.
    #[test]
    fn multi_byte_tokens_and_refused_tokens() {
        let (f, tok, _) = factory();
        let g = f.compile(&Grammar::Lark(r#"start: "true" | "trap""#.into())).unwrap();
        let mut c = g.start();
        let m = c.mask().unwrap();
        for s in ["t", "tr", "tru"] {
            assert!(m.is_allowed(id(&tok, s)), "{s:?} starts `true`");
        }
        assert!(!m.is_allowed(id(&tok, "x")));
        assert!(c.commit(id(&tok, "x")).is_err(), "a token outside the mask is refused");
        assert!(c.stats().error.is_some());
    }

    /// Control tokens never appear inside grammar text: a JSON string may hold any text,
    /// but not `<|im_start|>`.
    #[test]
    fn control_tokens_are_not_text() {
        let (f, tok, end) = factory();
        let g = f.compile(&Grammar::JsonSchema(json!({"type": "string"}))).unwrap();
        let mut c = g.start();
        c.mask().unwrap();
        c.commit(id(&tok, "\"")).unwrap();
        let m = c.mask().unwrap();
        assert!(m.is_allowed(id(&tok, "x")));
        assert!(!m.is_allowed(end + 1), "<|im_start|> is not string text");
        assert!(!m.is_allowed(end), "the string is still open");
    }

    /// JSON whitespace is bounded: 20 blanks between tokens at most.
    #[test]
    fn json_whitespace_is_bounded() {
        let (f, tok, _) = factory();
        let g = f.compile(&Grammar::JsonObject).unwrap();
        let mut c = g.start();
        c.mask().unwrap();
        c.commit(id(&tok, "{")).unwrap();
        let space = id(&tok, " ");
        for i in 0..20 {
            assert!(c.mask().unwrap().is_allowed(space), "blank {i}");
            c.commit(space).unwrap();
        }
        let m = c.mask().unwrap();
        assert!(!m.is_allowed(space), "a 21st blank");
        assert!(m.is_allowed(id(&tok, "}")));
    }

    #[test]
    fn bad_grammars_are_named() {
        let (f, _, _) = factory();
        let e = f.compile(&Grammar::Lark("start: undefined_rule".into())).unwrap_err();
        assert!(matches!(e, ConstraintError::Grammar(_)), "{e:?}");
        assert!(e.to_string().contains("undefined_rule"), "{e}");
        let e = f.compile(&Grammar::JsonSchema(json!({"type": "integer", "minimum": 5, "maximum": 1}))).unwrap_err();
        assert!(matches!(e, ConstraintError::Grammar(_)), "{e:?}");
        let e = f.compile(&Grammar::JsonSchema(json!({"type": "frog"}))).unwrap_err();
        assert!(e.to_string().contains("frog"), "{e}");
    }

    #[test]
    fn a_model_without_end_of_turn_is_refused() {
        let (tok, _) = tiny_tokenizer();
        let n = tok.vocab_size();
        let e = ConstraintFactory::new(tok, n, &[]).unwrap_err();
        assert!(e.to_string().contains("end-of-sequence"), "{e}");
    }
}
