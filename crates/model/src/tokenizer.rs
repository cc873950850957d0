//! Tokenizer: a Hugging Face `tokenizer.json` run by the `tokenizers` crate, or a byte-level
//! BPE tokenizer built in memory from its parts (the `tokenizer.ggml.*` metadata of a GGUF
//! file), plus [`StreamDecoder`] for printing generated tokens as they arrive.
//!
//! ```no_run
//! use frognano_model::tokenizer::Tokenizer;
//! let tok = Tokenizer::from_file("models/qwen35-tokenizer/tokenizer.json").unwrap();
//! let ids = tok.encode("def foo(x):").unwrap();
//! assert_eq!(tok.decode(&ids, false).unwrap(), "def foo(x):");
//! let mut stream = tok.stream_decoder(true);
//! for &id in &ids {
//!     if let Some(piece) = stream.step(id).unwrap() {
//!         print!("{piece}");
//!     }
//! }
//! if let Some(rest) = stream.finish().unwrap() {
//!     print!("{rest}");
//! }
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{ModelError, Result};

/// Pre-tokenizer regex of Qwen3.5 / Qwen3.6 (docs/model.md §5.1): Qwen2's pattern with
/// `\p{M}` (combining marks) in the letter and punctuation classes; digits one per token.
pub const QWEN35_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Pre-tokenizer regex of Qwen2 / Qwen2.5 / Qwen3.
pub const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Pre-tokenizer regex of Llama 3 (`llama-bpe` in GGUF): digits in groups of up to three.
pub const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The GPT-2 pre-tokenizer regex (what `ByteLevel` with `use_regex: true` applies).
pub const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The pre-tokenizer regexes, applied in order, for a GGUF `tokenizer.ggml.pre` name.
///
/// Known names: `qwen35` (Qwen3.5/3.6), `qwen2` (Qwen2–Qwen3), `llama-bpe` / `llama3`
/// (Llama 3), `gpt2`, and `smollm` (SmolLM/SmolLM2: every digit split off first, then the
/// GPT-2 pattern, like their tokenizer.json's `Digits(individual_digits)` + `ByteLevel`).
/// Returns `None` for any other name; the caller should then refuse the file rather than
/// guess, since a wrong pattern silently changes token ids.
pub fn pretokenizer_patterns(pre: &str) -> Option<&'static [&'static str]> {
    match pre {
        "qwen35" => Some(&[QWEN35_PATTERN]),
        "qwen2" => Some(&[QWEN2_PATTERN]),
        "llama-bpe" | "llama3" => Some(&[LLAMA3_PATTERN]),
        "gpt2" | "default" => Some(&[GPT2_PATTERN]),
        "smollm" => Some(&[r"\p{N}", GPT2_PATTERN]),
        _ => None,
    }
}

/// One added (control or user-defined) token of a tokenizer built with
/// [`Tokenizer::from_bpe_parts`]. Added tokens are matched in the raw text before
/// pre-tokenization, so their literal text always maps to the single id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddedTokenSpec {
    /// The token id; must be the index of `content` in [`BpeParts::tokens`].
    pub id: u32,
    /// The literal text, e.g. `<|im_end|>` (not byte-level encoded).
    pub content: String,
    /// Control tokens (`true`) are dropped by `decode(.., skip_special = true)`;
    /// user-defined ones such as Qwen's `<think>` (`false`) are kept.
    pub special: bool,
}

/// The parts of a GPT-2-style byte-level BPE tokenizer, as a GGUF file stores them
/// (`tokenizer.ggml.tokens`, `.merges`, `.token_type`, `.pre`, `.add_bos_token`).
#[derive(Clone, Debug, Default)]
pub struct BpeParts {
    /// Every token, id = index, in GPT-2 byte↔unicode form (`Ġ` for a space byte).
    /// Added tokens appear here too, under their literal text.
    pub tokens: Vec<String>,
    /// Merge rules, highest priority first, as (left, right) pairs of entries of `tokens`.
    pub merges: Vec<(String, String)>,
    /// Control and user-defined tokens (GGUF token types 3 and 4).
    pub added: Vec<AddedTokenSpec>,
    /// Pre-tokenizer regexes, applied one after the other, each splitting the pieces of the
    /// previous one and keeping matches and gaps as pieces (see [`pretokenizer_patterns`]).
    pub patterns: Vec<String>,
    /// Apply Unicode NFC before anything else (Qwen3.5 does).
    pub nfc: bool,
    /// Token prepended by [`Tokenizer::encode`] (GGUF `add_bos_token` with `bos_token_id`).
    pub bos: Option<u32>,
    /// Like tiktoken, look a whole pre-tokenized piece up in the vocabulary before merging
    /// (Qwen and Llama 3 vocabularies come from tiktoken rank files and need this).
    pub ignore_merges: bool,
}

/// A text tokenizer: text ↔ token ids.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    origin: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("origin", &self.origin).field("vocab_size", &self.vocab_size()).finish()
    }
}

impl Tokenizer {
    /// Loads a Hugging Face `tokenizer.json`. A missing or unreadable file is
    /// [`ModelError::Io`]; a file that is not a valid tokenizer is [`ModelError::Format`];
    /// both name the file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let json = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        Self::from_json(&json, path)
    }

    /// Parses the text of a `tokenizer.json`; `origin` names it in errors.
    pub fn from_json(json: &str, origin: impl AsRef<Path>) -> Result<Self> {
        let origin = origin.as_ref();
        // serde_json first: its message says where the JSON itself is broken.
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(json) {
            return Err(ModelError::format(origin, format!("not valid JSON: {e}")));
        }
        let inner: tokenizers::Tokenizer =
            json.parse().map_err(|e| ModelError::format(origin, format!("not a valid tokenizer.json: {e}")))?;
        Ok(Self { inner, origin: origin.to_path_buf() })
    }

    /// Builds a byte-level BPE tokenizer in memory from its parts, e.g. from GGUF metadata:
    ///
    /// * model: BPE over `parts.tokens` (id = index) and `parts.merges`, no unknown token;
    /// * normalizer: NFC if `parts.nfc`;
    /// * pre-tokenizer: one isolating `Split` per regex of `parts.patterns`, then the
    ///   byte-level mapping (without its own regex);
    /// * decoder: byte-level; post-processor: prepends `parts.bos` when set;
    /// * added tokens: `parts.added` with their ids and special flags.
    ///
    /// The result behaves like the equivalent `tokenizer.json`. Errors (a duplicate token, a
    /// merge naming an unknown token, an added token whose id disagrees with `tokens`, a bad
    /// regex) are [`ModelError::Format`] naming `origin` (the GGUF file) and the field.
    pub fn from_bpe_parts(parts: BpeParts, origin: impl AsRef<Path>) -> Result<Self> {
        let origin = origin.as_ref();
        let bad = |msg: String| ModelError::format(origin, msg);
        let n = parts.tokens.len();
        let mut vocab: HashMap<String, u32> = HashMap::with_capacity(n);
        for (id, token) in parts.tokens.iter().enumerate() {
            let id = u32::try_from(id).map_err(|_| bad("tokenizer.ggml.tokens: too many tokens".into()))?;
            if let Some(first) = vocab.insert(token.clone(), id) {
                return Err(bad(format!(
                    "tokenizer.ggml.tokens: token {token:?} appears twice (ids {first} and {id})"
                )));
            }
        }
        for (i, (left, right)) in parts.merges.iter().enumerate() {
            for side in [left, right] {
                if !vocab.contains_key(side) {
                    return Err(bad(format!(
                        "tokenizer.ggml.merges[{i}]: `{left} {right}` uses {side:?}, which is not a token"
                    )));
                }
            }
        }
        for added in &parts.added {
            match parts.tokens.get(added.id as usize) {
                Some(t) if *t == added.content => {}
                Some(t) => {
                    return Err(bad(format!(
                        "added token {:?} has id {}, but token {} is {t:?}",
                        added.content, added.id, added.id
                    )))
                }
                None => {
                    return Err(bad(format!(
                        "added token {:?} has id {}, outside the {n} tokens",
                        added.content, added.id
                    )))
                }
            }
        }
        if let Some(bos) = parts.bos {
            if bos as usize >= n {
                return Err(bad(format!("bos token id {bos} is outside the {n} tokens")));
            }
        }

        let bpe = BPE::builder()
            .vocab_and_merges(vocab.into_iter().collect::<tokenizers::models::bpe::Vocab>(), parts.merges)
            .ignore_merges(parts.ignore_merges)
            .build()
            .map_err(|e| bad(format!("tokenizer.ggml.merges: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        if parts.nfc {
            inner.with_normalizer(Some(NFC)).map_err(|e| bad(format!("normalizer: {e}")))?;
        }
        let mut pre: Vec<PreTokenizerWrapper> = Vec::with_capacity(parts.patterns.len() + 1);
        for (i, pattern) in parts.patterns.iter().enumerate() {
            let split = Split::new(SplitPattern::Regex(pattern.clone()), SplitDelimiterBehavior::Isolated, false)
                .map_err(|e| bad(format!("pre-tokenizer regex {i} ({pattern:?}): {e}")))?;
            pre.push(split.into());
        }
        pre.push(ByteLevel::new(false, false, false).into());
        inner.with_pre_tokenizer(Some(Sequence::new(pre)));
        inner.with_decoder(Some(ByteLevelDecoder::new(false, false, false)));
        if let Some(bos) = parts.bos {
            let bos_text = parts.tokens[bos as usize].clone();
            let template = TemplateProcessing::builder()
                .try_single(format!("{bos_text}:0 $A:0"))
                .and_then(|b| b.try_pair(format!("{bos_text}:0 $A:0 {bos_text}:1 $B:1")))
                .map_err(|e| bad(format!("bos token {bos_text:?}: {e}")))?
                .special_tokens(vec![(bos_text.clone(), bos)])
                .build()
                .map_err(|e| bad(format!("bos token {bos_text:?}: {e}")))?;
            inner.with_post_processor(Some(template));
        }
        // Added tokens that are in the vocabulary keep their vocabulary id.
        let (special, plain): (Vec<_>, Vec<_>) = parts.added.into_iter().partition(|a| a.special);
        let to_added = |a: AddedTokenSpec| {
            AddedToken::from(a.content, a.special).normalized(false).single_word(false).lstrip(false).rstrip(false)
        };
        inner.add_special_tokens(special.into_iter().map(to_added)).map_err(|e| bad(format!("added tokens: {e}")))?;
        inner.add_tokens(plain.into_iter().map(to_added)).map_err(|e| bad(format!("added tokens: {e}")))?;
        Ok(Self { inner, origin: origin.to_path_buf() })
    }

    /// Where this tokenizer came from (a file path, or the GGUF file it was built from).
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// The underlying `tokenizers` tokenizer, for anything not wrapped here.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Encodes `text`, applying the tokenizer's post-processor: no BOS is added unless the
    /// tokenizer itself adds one (Qwen3.5 does not). Added tokens written literally in the
    /// text (`<|im_start|>`, `<think>`) become their single ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, true)
    }

    /// Encodes `text`; `add_special_tokens = false` skips the post-processor (use this for
    /// a prompt rendered by a chat template, which already holds every control token, as
    /// transformers' `apply_chat_template(tokenize=True)` does).
    pub fn encode_with(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| ModelError::Input(format!("{}: encoding failed: {e}", self.origin.display())))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids to text. `skip_special` drops control tokens (`<|im_end|>`), but not
    /// added tokens marked non-special (Qwen's `<think>`, `<tool_call>`). Bytes that do not
    /// form valid UTF-8 become U+FFFD. An id with no token is an [`ModelError::Input`] error
    /// naming it.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&id| self.inner.id_to_token(id).is_none()) {
            return Err(ModelError::Input(format!(
                "{}: token id {bad} has no token (vocabulary size {})",
                self.origin.display(),
                self.vocab_size()
            )));
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| ModelError::Input(format!("{}: decoding failed: {e}", self.origin.display())))
    }

    /// The id of a token, given in its vocabulary form (`Ġthe`, `<|im_end|>`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary form of a token id (`Ġthe`), or `None` for an id with no token.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of ids with a token, added tokens included (248,077 for Qwen3.5; the model's
    /// embedding may have more rows than this).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Whether `id` is an added token marked special (dropped by `skip_special`).
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.get_added_tokens_decoder().get(&id).is_some_and(|t| t.special)
    }

    /// All added tokens as `(id, text, special)`, sorted by id.
    pub fn added_tokens(&self) -> Vec<(u32, String, bool)> {
        let mut out: Vec<_> =
            self.inner.get_added_tokens_decoder().into_iter().map(|(id, t)| (id, t.content, t.special)).collect();
        out.sort_by_key(|t| t.0);
        out
    }

    /// Every id's exact bytes, for consumers that work on bytes rather than text (the
    /// grammar-constrained sampler: llguidance's token trie). Entry `i` is id `i`'s bytes, for
    /// `i < n` (`n` ≥ the vocabulary: a model's output head may have more rows than the
    /// tokenizer has tokens; those rows are [`TokenBytes::Missing`]).
    ///
    /// Added tokens are their literal text, [`TokenBytes::Control`] when marked special
    /// (`<|im_end|>`: never part of ordinary text), [`TokenBytes::Text`] otherwise (Qwen's
    /// `<think>`, `<tool_call>`). Other tokens are decoded from their vocabulary form by the
    /// tokenizer's decoder: GPT-2's byte ↔ character table for byte-level BPE (SmolLM2, Qwen,
    /// Llama 3, every GGUF vocabulary we load), or `▁` → space and `<0xNN>` → byte for a
    /// SentencePiece byte-fallback vocabulary. Any other decoder is a [`ModelError::Format`]
    /// naming it: the bytes of its tokens cannot be known exactly.
    pub fn token_bytes(&self, n: usize) -> Result<Vec<TokenBytes>> {
        let kind =
            decoder_kind(self.inner.get_decoder()).ok_or_else(|| {
                ModelError::format(
                    &self.origin,
                    format!(
                    "the tokenizer's decoder ({}) is neither byte-level nor byte-fallback, so the exact bytes of its \
                     tokens are unknown",
                    self.inner.get_decoder().map_or("none".to_string(), |d| format!("{d:?}").chars().take(60).collect())
                ),
                )
            })?;
        let added = self.inner.get_added_tokens_decoder();
        let table = gpt2_byte_table();
        let mut out = Vec::with_capacity(n);
        for id in 0..n as u32 {
            if let Some(t) = added.get(&id) {
                let bytes = t.content.as_bytes().to_vec();
                out.push(if t.special { TokenBytes::Control(bytes) } else { TokenBytes::Text(bytes) });
                continue;
            }
            let Some(form) = self.inner.id_to_token(id) else {
                out.push(TokenBytes::Missing);
                continue;
            };
            let bytes = match kind {
                DecoderKind::ByteLevel => form.chars().map(|c| table.get(&c).copied()).collect::<Option<Vec<u8>>>(),
                DecoderKind::ByteFallback => Some(sentencepiece_bytes(&form)),
            };
            out.push(bytes.map_or(TokenBytes::Missing, TokenBytes::Text));
        }
        Ok(out)
    }

    /// A decoder for a stream of generated ids; see [`StreamDecoder`].
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<&Tokenizer> {
        StreamDecoder::new(self, skip_special)
    }
}

/// One token's exact bytes ([`Tokenizer::token_bytes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenBytes {
    /// An ordinary token, or an added token not marked special: these bytes.
    Text(Vec<u8>),
    /// A control token (an added token marked special, e.g. `<|im_end|>`): its literal text.
    Control(Vec<u8>),
    /// No token has this id (a padding row of the output head), or its form does not map to
    /// bytes.
    Missing,
}

/// How a tokenizer's decoder turns vocabulary forms into bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DecoderKind {
    /// GPT-2 byte-level: every character of the form stands for one byte.
    ByteLevel,
    /// SentencePiece with byte fallback: `▁` is a space, `<0xNN>` one byte.
    ByteFallback,
}

fn decoder_kind(d: Option<&tokenizers::DecoderWrapper>) -> Option<DecoderKind> {
    use tokenizers::DecoderWrapper as D;
    match d? {
        D::ByteLevel(_) => Some(DecoderKind::ByteLevel),
        D::ByteFallback(_) => Some(DecoderKind::ByteFallback),
        D::Sequence(seq) => {
            let kinds: Vec<DecoderKind> = seq.get_decoders().iter().filter_map(|d| decoder_kind(Some(d))).collect();
            kinds.first().copied()
        }
        _ => None,
    }
}

/// GPT-2's printable character for each byte, inverted: printable bytes stand for themselves,
/// the others (0..=32, 127..=160, 173) for U+0100 onwards, in byte order.
fn gpt2_byte_table() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, 33..=126 | 161..=172 | 174..=255);
    let mut next = 256u32;
    let mut table = HashMap::with_capacity(256);
    for b in 0..=255u8 {
        let c = if printable(b) {
            b as char
        } else {
            next += 1;
            char::from_u32(next - 1).expect("U+0100..U+0143 are characters")
        };
        table.insert(c, b);
    }
    table
}

/// A SentencePiece form's bytes: `<0xNN>` is byte NN, `▁` a space.
fn sentencepiece_bytes(form: &str) -> Vec<u8> {
    let hex = form.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')).filter(|h| h.len() == 2);
    match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
        Some(b) => vec![b],
        None => form.replace('\u{2581}', " ").into_bytes(),
    }
}

/// Turns a stream of token ids into text pieces as they arrive.
///
/// A byte-level token can end in the middle of a UTF-8 character (an emoji or a CJK
/// character often spans two or three tokens). [`step`](Self::step) returns `None` until the
/// character is complete, then the new text; concatenating every piece plus
/// [`finish`](Self::finish) gives exactly `decode(all_ids)`. A small window of ids is kept
/// so that decoders that depend on the previous token (SentencePiece's leading space)
/// produce the right spacing; memory stays bounded over long generations.
///
/// `T` is how the decoder holds the tokenizer: a borrow (`&Tokenizer`, from
/// [`Tokenizer::stream_decoder`]) or a shared handle (`Arc<Tokenizer>`) for a decoder that
/// must outlive the caller's borrow, such as one that lives with a job on a scheduler thread.
pub struct StreamDecoder<T: std::ops::Deref<Target = Tokenizer>> {
    tok: T,
    skip_special: bool,
    /// Ids of the last emitted piece (context) followed by ids not emitted yet.
    ids: Vec<u32>,
    /// How many leading entries of `ids` are context already emitted.
    emitted: usize,
    /// `decode(ids[..emitted])`.
    prefix: String,
}

impl<T: std::ops::Deref<Target = Tokenizer>> StreamDecoder<T> {
    /// A fresh stream over `tok`; `skip_special` as in [`Tokenizer::decode`].
    pub fn new(tok: T, skip_special: bool) -> Self {
        Self { tok, skip_special, ids: Vec::new(), emitted: 0, prefix: String::new() }
    }

    /// Adds one id; returns the text it completes, if any.
    pub fn step(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let text = self.tok.decode(&self.ids, self.skip_special)?;
        if text.len() <= self.prefix.len() || text.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        let piece = new_suffix(&self.prefix, &text).to_string();
        // The ids just emitted become the context for the next piece.
        self.ids.drain(..self.emitted);
        self.emitted = self.ids.len();
        self.prefix = self.tok.decode(&self.ids, self.skip_special)?;
        Ok(Some(piece))
    }

    /// Ends the stream: returns whatever text is still held back (an incomplete character
    /// becomes U+FFFD), and resets the decoder.
    pub fn finish(&mut self) -> Result<Option<String>> {
        let out = if self.emitted < self.ids.len() {
            let text = self.tok.decode(&self.ids, self.skip_special)?;
            let piece = new_suffix(&self.prefix, &text);
            (!piece.is_empty()).then(|| piece.to_string())
        } else {
            None
        };
        self.ids.clear();
        self.emitted = 0;
        self.prefix.clear();
        Ok(out)
    }
}

/// The part of `text` after `prefix`. Normally `prefix` is a prefix of `text`; if a decoder
/// rewrote earlier characters, the text after the longest common prefix is returned.
fn new_suffix<'t>(prefix: &str, text: &'t str) -> &'t str {
    if let Some(rest) = text.strip_prefix(prefix) {
        return rest;
    }
    let mut common = 0;
    for ((i, a), b) in text.char_indices().zip(prefix.chars()) {
        if a != b {
            break;
        }
        common = i + a.len_utf8();
    }
    &text[common..]
}
