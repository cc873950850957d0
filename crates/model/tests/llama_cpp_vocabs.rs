//! The tokenizers of real GGUF files against the token ids their models' own Hugging Face
//! tokenizers give: llama.cpp's test vocabularies (`ggml-vocab-NAME.gguf`, the tokenizer
//! metadata of a real model; `.inp` the texts, `.out` the ids), fetched by
//! scripts/setup-llama-vocabs.sh into models/llama-vocabs/. Each file's tokenizer is built from
//! its metadata as `frognano run model.gguf` builds it ([`tokenizer_from_gguf`]), and every
//! text (accents, emoji, CJK, runs of spaces and newlines, digits, code) must give exactly the
//! reference ids: a wrong pre-tokenizer or merge order changes ids silently, and the model then
//! reads text it was never trained on.

use std::path::{Path, PathBuf};

use frognano_model::gguf::GgufFile;
use frognano_model::gguf_load::tokenizer_from_gguf;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::{NormalizedString, Normalizer};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/llama-vocabs")
}

/// A text and the ids its model's own tokenizer gives it.
type Case = (String, Vec<u32>);

/// The texts and reference ids of `ggml-vocab-NAME.gguf`, or `None` (reported) when the
/// vocabularies have not been fetched and FROGNANO_REQUIRE_FIXTURES is unset.
fn cases(name: &str) -> Option<(PathBuf, Vec<Case>)> {
    let gguf = dir().join(format!("ggml-vocab-{name}.gguf"));
    if !gguf.is_file() {
        if std::env::var_os("FROGNANO_REQUIRE_FIXTURES").is_some() {
            panic!("{} is missing: run scripts/setup-llama-vocabs.sh", gguf.display());
        }
        frognano_model::test_support::report_skip(
            &gguf.display().to_string(),
            &format!("the {name} vocabulary test (run scripts/setup-llama-vocabs.sh)"),
        );
        return None;
    }
    let read = |ext: &str| {
        let p = dir().join(format!("ggml-vocab-{name}.gguf.{ext}"));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    // llama.cpp's convert_hf_to_gguf_update.py writes each text followed by this separator.
    let texts: Vec<String> = read("inp").split("\n__ggml_vocab_test__\n").map(str::to_string).collect();
    let texts = &texts[..texts.len() - 1];
    let ids: Vec<Vec<u32>> =
        read("out").lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
    assert_eq!(texts.len(), ids.len(), "{name}: {} texts, {} id lines", texts.len(), ids.len());
    Some((gguf, texts.iter().cloned().zip(ids).collect()))
}

/// How a vocabulary's own tokenizer treats Unicode normalization.
#[derive(Clone, Copy, PartialEq)]
enum Nfc {
    /// No normalization: every reference id must match.
    None,
    /// Qwen's tokenizers fold text to NFC first (Qwen's own tiktoken tokenizer, the
    /// `tokenizer.json` normalizer), which llama.cpp does not: its references for decomposed
    /// text (`e` + U+0301) keep the two characters apart. Those texts must encode as their NFC
    /// form, whose ids decode to the folded text.
    Folds,
}

/// Every text of `name` encodes (no BOS: llama.cpp's test adds no special tokens) to its
/// reference ids, which decode back to the text, whole and streamed.
fn check(name: &str, nfc: Nfc) {
    let Some((gguf, cases)) = cases(name) else { return };
    let file = GgufFile::open(&gguf).unwrap();
    let tok = tokenizer_from_gguf(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut wrong = Vec::new();
    let mut folded = 0;
    for (text, want) in &cases {
        let got = tok.encode_with(text, false).unwrap();
        let mut normalized = NormalizedString::from(text.as_str());
        NFC.normalize(&mut normalized).unwrap();
        if nfc == Nfc::Folds && normalized.get() != text {
            assert_ne!(&got, want, "{name}: {text:?} is not in NFC, yet encoded as llama.cpp does");
            assert_eq!(tok.decode(&got, false).unwrap(), normalized.get(), "{name}: {text:?}");
            assert_eq!(tok.decode(want, false).unwrap(), *text, "{name}: {text:?}");
            folded += 1;
        } else if &got != want {
            wrong.push(format!("{text:?}:\n    got  {got:?}\n    want {want:?}"));
        } else {
            // Back to the same text, whole and streamed a token at a time.
            assert_eq!(tok.decode(&got, false).unwrap(), *text, "{name}: decoding {got:?}");
            let mut stream = tok.stream_decoder(false);
            let mut streamed = String::new();
            for &id in &got {
                streamed.extend(stream.step(id).unwrap());
            }
            streamed.extend(stream.finish().unwrap());
            assert_eq!(streamed, *text, "{name}: streaming {got:?}");
        }
    }
    assert!(
        wrong.is_empty(),
        "{name}: {} of {} texts tokenized differently:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
    assert!(folded < cases.len() / 4, "{name}: {folded} of {} texts compared only after NFC", cases.len());
}

#[test]
fn gpt2() {
    check("gpt-2", Nfc::None);
}

#[test]
fn mpt() {
    check("mpt", Nfc::None);
}

#[test]
fn starcoder() {
    check("starcoder", Nfc::None);
}

#[test]
fn refact() {
    check("refact", Nfc::None);
}

#[test]
fn command_r() {
    check("command-r", Nfc::None);
}

#[test]
fn llama3() {
    check("llama-bpe", Nfc::None);
}

#[test]
fn qwen2() {
    check("qwen2", Nfc::Folds);
}

#[test]
fn qwen35() {
    check("qwen35", Nfc::Folds);
}

#[test]
fn deepseek_coder() {
    check("deepseek-coder", Nfc::None);
}

#[test]
fn deepseek_llm() {
    check("deepseek-llm", Nfc::None);
}

#[test]
fn llama_spm() {
    check("llama-spm", Nfc::None);
}

#[test]
fn phi3() {
    check("phi-3", Nfc::None);
}

/// Phi-3's chat tokens swallow the whitespace after them, as its Hugging Face tokenizer marks
/// them `rstrip` (and llama.cpp gives files named Phi-3 the same rule): a rendered turn reads
/// `<|user|>`, `▁Hi`, `<|end|>`, `<|assistant|>`, without the newlines between.
#[test]
fn phi3_chat_tokens_swallow_the_newline_after_them() {
    let Some((gguf, _)) = cases("phi-3") else { return };
    let tok = tokenizer_from_gguf(&GgufFile::open(&gguf).unwrap()).unwrap();
    let id = |t: &str| tok.token_to_id(t).unwrap();
    let hi = tok.encode_with("Hi", false).unwrap();
    let want: Vec<u32> = [vec![id("<|user|>")], hi, vec![id("<|end|>"), id("<|assistant|>")]].concat();
    assert_eq!(tok.encode_with("<|user|>\nHi<|end|>\n<|assistant|>\n", false).unwrap(), want);
    // `<s>` keeps what follows.
    assert_eq!(tok.encode_with("<s>\n", false).unwrap()[0], id("<s>"));
    assert!(tok.encode_with("<s>\n", false).unwrap().len() > 1);
}
