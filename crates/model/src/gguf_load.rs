//! What a GGUF file's metadata says beside the weights — its tokenizer, chat template and stop
//! tokens — for [`crate::load`] of a `.gguf` path (the weights come through
//! [`crate::gguf_weights`]).
//!
//! * tokenizer: `tokenizer.ggml.model = gpt2` (byte-level BPE) with `tokens`, `merges`,
//!   `token_type` (3 = control, 4 = user-defined become added tokens) and the pre-tokenizer
//!   named by `tokenizer.ggml.pre`; an unknown `pre` is refused rather than guessed. Or
//!   `tokenizer.ggml.model = llama` (SentencePiece) with `tokens`, `scores`, `token_type` and
//!   `add_space_prefix`;
//! * chat template: `tokenizer.chat_template`, with `bos_token` / `eos_token` set from the ids;
//! * stop ids: `eos_token_id`, `eot_token_id`, `eom_token_id`, and the control tokens llama.cpp
//!   also treats as end of generation (`<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, …).

use crate::chat::ChatTemplate;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::tokenizer::{
    pretokenizer_ignores_merges, pretokenizer_patterns, AddedTokenSpec, BpeParts, SpmParts, Tokenizer,
};

/// Control-token texts that end generation even when the file does not name them.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<｜end▁of▁sentence｜>",
];

/// GGUF token type of ordinary tokens.
const TOKEN_NORMAL: i64 = 1;
/// GGUF token type of the unknown token.
const TOKEN_UNKNOWN: i64 = 2;
/// GGUF token type of control tokens.
const TOKEN_CONTROL: i64 = 3;
/// GGUF token type of user-defined tokens.
const TOKEN_USER_DEFINED: i64 = 4;

/// The tokenizer described by the file's `tokenizer.ggml.*` metadata.
pub fn tokenizer_from_gguf(f: &GgufFile) -> Result<Tokenizer> {
    let model = f.get_str("tokenizer.ggml.model")?.ok_or_else(|| {
        ModelError::format(f.path(), "metadata `tokenizer.ggml.model` is missing: the file has no tokenizer")
    })?;
    match model {
        "gpt2" => {}
        "llama" => return spm_tokenizer(f),
        _ => {
            return Err(ModelError::format(
                f.path(),
                format!(
                    "tokenizer.ggml.model {model:?} is not supported (\"gpt2\": byte-level BPE, \"llama\": \
                     SentencePiece)"
                ),
            ))
        }
    }
    let pre = f.get_str("tokenizer.ggml.pre")?.unwrap_or("default");
    let patterns = pretokenizer_patterns(pre).ok_or_else(|| {
        ModelError::format(f.path(), format!("tokenizer.ggml.pre {pre:?} is not a pre-tokenizer FrogNano knows"))
    })?;
    let Vocab { tokens, added, bos, .. } = vocab(f, false)?;
    let merges = f
        .get_str_array("tokenizer.ggml.merges")?
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).ok_or_else(|| {
                ModelError::format(f.path(), format!("tokenizer.ggml.merges[{i}] {m:?} is not two tokens"))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let parts = BpeParts {
        tokens,
        merges,
        added,
        patterns: patterns.iter().map(|p| p.to_string()).collect(),
        nfc: matches!(pre, "qwen2" | "qwen35"),
        bos,
        ignore_merges: pretokenizer_ignores_merges(pre),
    };
    Tokenizer::from_bpe_parts(parts, f.path())
}

/// What both kinds of vocabulary read the same way.
struct Vocab {
    /// `tokenizer.ggml.tokens`.
    tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token (all normal when absent).
    types: Vec<i64>,
    /// Control (type 3) and user-defined (type 4) tokens.
    added: Vec<AddedTokenSpec>,
    /// The BOS `encode` prepends: `bos_token_id` when `add_bos_token` says so, which it does by
    /// default for SentencePiece (`bos_by_default`), as llama.cpp reads it.
    bos: Option<u32>,
}

fn vocab(f: &GgufFile, bos_by_default: bool) -> Result<Vocab> {
    let tokens: Vec<String> = f
        .get_str_array("tokenizer.ggml.tokens")?
        .ok_or_else(|| ModelError::format(f.path(), "metadata `tokenizer.ggml.tokens` is missing"))?
        .into_iter()
        .map(str::to_string)
        .collect();
    let types = f.get_i64_array("tokenizer.ggml.token_type")?.unwrap_or_else(|| vec![TOKEN_NORMAL; tokens.len()]);
    if types.len() != tokens.len() {
        return Err(ModelError::format(
            f.path(),
            format!("tokenizer.ggml.token_type has {} entries for {} tokens", types.len(), tokens.len()),
        ));
    }
    let added = types
        .iter()
        .enumerate()
        .filter(|(_, &t)| t == TOKEN_CONTROL || t == TOKEN_USER_DEFINED)
        .map(|(id, &t)| AddedTokenSpec { id: id as u32, content: tokens[id].clone(), special: t == TOKEN_CONTROL })
        .collect();
    let bos = if f.get_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(bos_by_default) {
        f.get_u64("tokenizer.ggml.bos_token_id")?.map(|v| v as u32)
    } else {
        None
    };
    Ok(Vocab { tokens, types, added, bos })
}

/// A SentencePiece vocabulary (`tokenizer.ggml.model = llama`): pieces, their scores and
/// types. As in llama.cpp, a space is prepended unless `add_space_prefix` is false, and a BOS
/// is added unless `add_bos_token` is false.
fn spm_tokenizer(f: &GgufFile) -> Result<Tokenizer> {
    let Vocab { tokens, types, added, bos } = vocab(f, true)?;
    let scores = f.get_f64_array("tokenizer.ggml.scores")?.ok_or_else(|| {
        ModelError::format(
            f.path(),
            "metadata `tokenizer.ggml.scores` is missing (a SentencePiece vocabulary needs it)",
        )
    })?;
    // The file's unknown id, else `<unk>`, else the first unknown-type piece (Phi-3's
    // vocabulary also types its `[PAD…]` pieces unknown).
    let unk = match f.get_u64("tokenizer.ggml.unknown_token_id")? {
        Some(id) => Some(id as u32),
        None => tokens
            .iter()
            .position(|t| t == "<unk>")
            .or_else(|| types.iter().position(|&t| t == TOKEN_UNKNOWN))
            .map(|id| id as u32),
    };
    // llama.cpp's rule for Phi-3 (by the model's name, as the file does not say): its control
    // and user-defined tokens but `<unk>`, `<s>` and `<|endoftext|>` swallow the whitespace
    // after them, as Phi-3's Hugging Face tokenizer marks them `rstrip`.
    let name = f.get_str("general.name")?.unwrap_or("").to_lowercase();
    let strip_after = if name.contains("phi-3") || name.contains("phi3") {
        added
            .iter()
            .filter(|a: &&AddedTokenSpec| !matches!(a.content.as_str(), "<unk>" | "<s>" | "<|endoftext|>"))
            .map(|a| a.id)
            .collect()
    } else {
        Vec::new()
    };
    let parts = SpmParts {
        normal: types.iter().map(|&t| t == TOKEN_NORMAL).collect(),
        scores: scores.into_iter().map(|s| s as f32).collect(),
        tokens,
        added,
        unk,
        add_space_prefix: f.get_bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true),
        bos,
        strip_after,
    };
    Tokenizer::from_spm_parts(parts, f.path())
}

fn token_text(f: &GgufFile, key: &str) -> Result<Option<String>> {
    let Some(id) = f.get_u64(key)? else { return Ok(None) };
    let tokens = f.get_str_array("tokenizer.ggml.tokens")?.unwrap_or_default();
    Ok(tokens.get(id as usize).map(|s| s.to_string()))
}

/// The chat template in `tokenizer.chat_template`, if any, with `bos_token`/`eos_token` set.
pub fn chat_template_from_gguf(f: &GgufFile) -> Result<Option<ChatTemplate>> {
    let Some(src) = f.get_str("tokenizer.chat_template")? else { return Ok(None) };
    let mut t = ChatTemplate::new(src, f.path())?;
    if let Some(bos) = token_text(f, "tokenizer.ggml.bos_token_id")? {
        t = t.with_special_token("bos_token", bos);
    }
    if let Some(eos) = token_text(f, "tokenizer.ggml.eos_token_id")? {
        t = t.with_special_token("eos_token", eos);
    }
    Ok(Some(t))
}

/// Every id that ends generation, sorted.
pub fn stop_ids_from_gguf(f: &GgufFile) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = f.get_u64(key)? {
            ids.push(id as u32);
        }
    }
    let tokens = f.get_str_array("tokenizer.ggml.tokens")?.unwrap_or_default();
    let types = f.get_i64_array("tokenizer.ggml.token_type")?.unwrap_or_default();
    for (id, (tok, ty)) in tokens.iter().zip(&types).enumerate() {
        if *ty == TOKEN_CONTROL && EOG_TEXTS.contains(tok) {
            ids.push(id as u32);
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}
