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

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::prepend::Prepend;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::normalizers::utils::Sequence as NormalizerSequence;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

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

/// Pre-tokenizer regex of Mistral's Tekken vocabulary (Mistral Nemo, Mistral Small 3,
/// Devstral, Ministral): GPT-4o's letter runs split at case changes, without contractions,
/// digits one per token.
pub const TEKKEN_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Pre-tokenizer regex of GPT-4o's o200k vocabulary (`gpt-4o`, Llama 4): letter runs split at
/// case changes with an optional contraction, digits in groups of up to three.
pub const GPT4O_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Pre-tokenizer regex of ByteDance's Seed-Coder: Qwen2's with every digit alone and no run of
/// punctuation taking the line breaks after it.
pub const SEED_CODER_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
/// CJK ideographs and Hangul, one piece per run (DeepSeek's vocabularies).
const DEEPSEEK_CJK: &str = "[\u{4E00}-\u{9FA5}\u{0800}-\u{4E00}\u{AC00}-\u{D7FF}]+";
/// Letters of DeepSeek LLM's vocabulary (the cased scripts), with an optional leading space.
const DEEPSEEK_LLM_LETTERS: &str = concat!(
    "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-",
    "\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}",
    "\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}",
    "\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}",
    "\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-",
    "\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}",
    "\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-",
    "\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}",
    "-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}",
    "\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}",
    "\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-",
    "\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-",
    "\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}",
    "-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}",
    "\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+",
);

/// The pre-tokenizer regexes, applied in order, for a GGUF `tokenizer.ggml.pre` name (the
/// names llama.cpp's converter writes; a vocabulary's own `tokenizer.json` describes the same
/// splits).
///
/// Known names (llama.cpp's, grouped as it groups them): `qwen35` (Qwen3.5/3.6); `qwen2`
/// (Qwen2–Qwen3) and the vocabularies that share its pattern (`deepseek-r1-qwen`, `stablelm2`,
/// `megrez`, …); `llama-bpe` / `llama3` / `llama-v3` (Llama 3) and `falcon3`, `pixtral`, `dbrx`,
/// …; `gpt2` / `gpt-2` / `default` and `mpt`, `olmo`, `phi-2`, `mellum`, …; `smollm` and the
/// other vocabularies that split every digit off before GPT-2's pattern (`starcoder`, `refact`,
/// `command-r`, `codeshell`, `exaone`, `minerva-7b`, `mellum2`); `deepseek-coder`;
/// `deepseek-llm`; `seed-coder`; `tekken` (Mistral Nemo, Mistral Small 3, Devstral); `gpt-4o`
/// / `llama4`. Returns `None` for any other name; the caller should then refuse the file
/// rather than guess, since a wrong pattern silently changes token ids.
pub fn pretokenizer_patterns(pre: &str) -> Option<&'static [&'static str]> {
    match pre {
        "qwen35" => Some(&[QWEN35_PATTERN]),
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open" => {
            Some(&[QWEN2_PATTERN])
        }
        "llama-bpe" | "llama3" | "llama-v3" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" | "dbrx" | "smaug-bpe" => Some(&[LLAMA3_PATTERN]),
        "gpt2" | "gpt-2" | "default" | "mpt" | "olmo" | "phi-2" | "jais" | "gigachat" | "a.x-4.0" | "mellum"
        | "exaone4" | "trillion" | "granite-docling" | "jina-es" | "jina-de" | "jina-v2-es" | "jina-v2-de"
        | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "modern-bert" => Some(&[GPT2_PATTERN]),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            Some(&[r"\p{N}", GPT2_PATTERN])
        }
        "seed-coder" => Some(&[SEED_CODER_PATTERN]),
        "deepseek-coder" => Some(&["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", DEEPSEEK_CJK, r"\p{N}"]),
        "deepseek-llm" => Some(&[
            "[\r\n]",
            DEEPSEEK_LLM_LETTERS,
            "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
            r"\s+$",
            DEEPSEEK_CJK,
            r"\p{N}+",
        ]),
        "tekken" => Some(&[TEKKEN_PATTERN]),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => Some(&[GPT4O_PATTERN]),
        _ => None,
    }
}

/// Whether a vocabulary of this `tokenizer.ggml.pre` looks a whole pre-tokenized piece up
/// before merging (vocabularies converted from tiktoken rank files, whose merges do not
/// rebuild every token; llama.cpp's `ignore_merges`).
pub fn pretokenizer_ignores_merges(pre: &str) -> bool {
    matches!(
        pre,
        "qwen35"
            | "llama-bpe"
            | "llama3"
            | "llama-v3"
            | "falcon3"
            | "falcon-h1"
            | "pixtral"
            | "midm-2.0"
            | "lfm2"
            | "jina-v5-nano"
            | "tekken"
    )
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

/// The parts of a SentencePiece tokenizer, as a GGUF file of `tokenizer.ggml.model = llama`
/// stores them (`tokenizer.ggml.tokens`, `.scores`, `.token_type`, `.add_space_prefix`).
#[derive(Clone, Debug, Default)]
pub struct SpmParts {
    /// Every piece, id = index, spaces as `▁`; bytes as `<0xNN>` pieces.
    pub tokens: Vec<String>,
    /// Each piece's score: of two mergeable pairs, the one whose union scores higher joins first.
    pub scores: Vec<f32>,
    /// Whether each piece is an ordinary one (GGUF token type 1), which merges may build;
    /// control, user-defined, byte, unknown and unused pieces are never merged into.
    pub normal: Vec<bool>,
    /// Control and user-defined tokens (GGUF token types 3 and 4), matched in the raw text.
    pub added: Vec<AddedTokenSpec>,
    /// The unknown piece (`<unk>`), for text no piece or byte piece covers.
    pub unk: Option<u32>,
    /// Prepend a space (as `▁`) to the text, as SentencePiece does (GGUF's default: true).
    pub add_space_prefix: bool,
    /// Token prepended by [`Tokenizer::encode`] (GGUF `add_bos_token` with `bos_token_id`).
    pub bos: Option<u32>,
    /// Added tokens that swallow the whitespace after them (Phi-3's chat tokens: its Hugging
    /// Face tokenizer marks them `rstrip`, so `<|user|>\nHi` is `<|user|>`, `▁Hi`).
    pub strip_after: Vec<u32>,
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
        let vocab = vocab_map(&parts.tokens, origin)?;
        for (i, (left, right)) in parts.merges.iter().enumerate() {
            for side in [left, right] {
                if !vocab.contains_key(side) {
                    return Err(bad(format!(
                        "tokenizer.ggml.merges[{i}]: `{left} {right}` uses {side:?}, which is not a token"
                    )));
                }
            }
        }
        check_added(&parts.tokens, &parts.added, parts.bos, origin)?;

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
        finish(inner, &parts.tokens, parts.added, parts.bos, &[], origin)
    }

    /// Builds a SentencePiece tokenizer (`tokenizer.ggml.model = llama` in GGUF: Llama 2,
    /// Mistral 7B, TinyLlama, CodeLlama, Phi-3) in memory from its parts. SentencePiece's BPE
    /// joins, again and again, the adjacent pair of pieces whose union is the vocabulary piece
    /// of the highest score; that is a BPE whose merges are every split of every normal piece
    /// into two normal pieces, ranked by the whole piece's score (as Hugging Face converts
    /// these vocabularies to `tokenizer.json`):
    ///
    /// * normalizer: spaces become `▁`, and with `add_space_prefix` a `▁` is prepended;
    /// * model: that BPE, characters without a piece falling back to `<0xNN>` byte pieces;
    /// * decoder: `▁` to space, byte pieces to bytes, the prepended space stripped;
    /// * post-processor and added tokens as [`Tokenizer::from_bpe_parts`].
    ///
    /// Errors (a duplicate piece, lengths that disagree, an added token whose id disagrees) are
    /// [`ModelError::Format`] naming `origin` and the field.
    pub fn from_spm_parts(parts: SpmParts, origin: impl AsRef<Path>) -> Result<Self> {
        let origin = origin.as_ref();
        let bad = |msg: String| ModelError::format(origin, msg);
        let n = parts.tokens.len();
        for (field, len) in
            [("tokenizer.ggml.scores", parts.scores.len()), ("tokenizer.ggml.token_type", parts.normal.len())]
        {
            if len != n {
                return Err(bad(format!("{field} has {len} entries for {n} tokens")));
            }
        }
        let vocab = vocab_map(&parts.tokens, origin)?;
        check_added(&parts.tokens, &parts.added, parts.bos, origin)?;
        if let Some(unk) = parts.unk.filter(|&u| u as usize >= n) {
            return Err(bad(format!("unknown token id {unk} is outside the {n} tokens")));
        }
        let normal = |piece: &str| vocab.get(piece).is_some_and(|&id| parts.normal[id as usize]);
        // (score, id, split) of every merge, best first; ties keep the lower id and the
        // shorter left piece, so the order does not depend on hashing.
        let mut ranked: Vec<(f32, u32, usize)> = Vec::new();
        for (id, piece) in parts.tokens.iter().enumerate() {
            if !parts.normal[id] {
                continue;
            }
            for (at, _) in piece.char_indices().skip(1) {
                if normal(&piece[..at]) && normal(&piece[at..]) {
                    ranked.push((parts.scores[id], id as u32, at));
                }
            }
        }
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        let merges = ranked
            .into_iter()
            .map(|(_, id, at)| {
                let piece = &parts.tokens[id as usize];
                (piece[..at].to_string(), piece[at..].to_string())
            })
            .collect();
        let mut model = BPE::builder()
            .vocab_and_merges(vocab.into_iter().collect::<tokenizers::models::bpe::Vocab>(), merges)
            .byte_fallback(true)
            .fuse_unk(true);
        if let Some(unk) = parts.unk {
            model = model.unk_token(parts.tokens[unk as usize].clone());
        }
        let model = model.build().map_err(|e| bad(format!("tokenizer.ggml.tokens: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(model);
        let to_piece = Replace::new(" ", "\u{2581}").map_err(|e| bad(format!("normalizer: {e}")))?;
        let normalizer: NormalizerWrapper = if parts.add_space_prefix {
            NormalizerSequence::new(vec![Prepend::new("\u{2581}".into()).into(), to_piece.into()]).into()
        } else {
            to_piece.into()
        };
        inner.with_normalizer(Some(normalizer)).map_err(|e| bad(format!("normalizer: {e}")))?;
        let mut decoders: Vec<DecoderWrapper> = vec![
            Replace::new("\u{2581}", " ").map_err(|e| bad(format!("decoder: {e}")))?.into(),
            ByteFallback::new().into(),
            Fuse::new().into(),
        ];
        if parts.add_space_prefix {
            decoders.push(Strip::new(' ', 1, 0).into());
        }
        inner.with_decoder(Some(DecoderSequence::new(decoders)));
        finish(inner, &parts.tokens, parts.added, parts.bos, &parts.strip_after, origin)
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

/// Id of every token; a token that appears twice is an error naming both ids.
fn vocab_map(tokens: &[String], origin: &Path) -> Result<HashMap<String, u32>> {
    let mut vocab: HashMap<String, u32> = HashMap::with_capacity(tokens.len());
    for (id, token) in tokens.iter().enumerate() {
        let id = u32::try_from(id).map_err(|_| ModelError::format(origin, "tokenizer.ggml.tokens: too many tokens"))?;
        if let Some(first) = vocab.insert(token.clone(), id) {
            return Err(ModelError::format(
                origin,
                format!("tokenizer.ggml.tokens: token {token:?} appears twice (ids {first} and {id})"),
            ));
        }
    }
    Ok(vocab)
}

/// Every added token is the token of its id, and `bos` is a token.
fn check_added(tokens: &[String], added: &[AddedTokenSpec], bos: Option<u32>, origin: &Path) -> Result<()> {
    let n = tokens.len();
    for a in added {
        let msg = match tokens.get(a.id as usize) {
            Some(t) if *t == a.content => continue,
            Some(t) => format!("added token {:?} has id {}, but token {} is {t:?}", a.content, a.id, a.id),
            None => format!("added token {:?} has id {}, outside the {n} tokens", a.content, a.id),
        };
        return Err(ModelError::format(origin, msg));
    }
    match bos {
        Some(bos) if bos as usize >= n => {
            Err(ModelError::format(origin, format!("bos token id {bos} is outside the {n} tokens")))
        }
        _ => Ok(()),
    }
}

/// `inner` with its post-processor (prepending `bos` when set) and its added tokens (those
/// of `strip_after` swallowing the whitespace after them).
fn finish(
    mut inner: tokenizers::Tokenizer,
    tokens: &[String],
    added: Vec<AddedTokenSpec>,
    bos: Option<u32>,
    strip_after: &[u32],
    origin: &Path,
) -> Result<Tokenizer> {
    let bad = |msg: String| ModelError::format(origin, msg);
    if let Some(bos) = bos {
        let bos_text = tokens[bos as usize].clone();
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
    let (special, plain): (Vec<_>, Vec<_>) = added.into_iter().partition(|a| a.special);
    let to_added = |a: AddedTokenSpec| {
        let rstrip = strip_after.contains(&a.id);
        AddedToken::from(a.content, a.special).normalized(false).single_word(false).lstrip(false).rstrip(rstrip)
    };
    inner.add_special_tokens(special.into_iter().map(to_added)).map_err(|e| bad(format!("added tokens: {e}")))?;
    inner.add_tokens(plain.into_iter().map(to_added)).map_err(|e| bad(format!("added tokens: {e}")))?;
    Ok(Tokenizer { inner, origin: origin.to_path_buf() })
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
