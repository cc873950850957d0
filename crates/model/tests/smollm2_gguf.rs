//! The demo model, SmolLM2-135M-Instruct Q4_1 (scripts/fetch-demo-model.sh), against
//! llama.cpp's own outputs (fixtures/smollm2/llama_cpp_reference.json from
//! scripts/llama_reference.py). Without the model these tests skip loudly, or fail when
//! `FROGNANO_REQUIRE_FIXTURES` is set (CI).

use std::path::PathBuf;

use frognano_model::load;

fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32
}

const DEMO: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

fn demo_model() -> Option<PathBuf> {
    let p = repo(DEMO);
    if p.exists() {
        return Some(p);
    }
    if std::env::var_os("FROGNANO_REQUIRE_FIXTURES").is_some() {
        panic!("{DEMO} is missing and FROGNANO_REQUIRE_FIXTURES is set: run scripts/fetch-demo-model.sh");
    }
    frognano_model::test_support::report_skip(DEMO, "smollm2_gguf (run scripts/fetch-demo-model.sh)");
    None
}

struct Case {
    prompt: String,
    ids: Vec<u32>,
    argmax: Vec<u32>,
    argmax_margin: Vec<f32>,
    top_ids: Vec<u32>,
    top_logits: Vec<f32>,
    greedy: Vec<u32>,
    greedy_margin: Vec<f32>,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(repo("fixtures/smollm2/llama_cpp_reference.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let f32s = |x: &serde_json::Value| x.as_array().unwrap().iter().map(|e| e.as_f64().unwrap() as f32).collect();
    let u32s = |x: &serde_json::Value| x.as_array().unwrap().iter().map(|e| e.as_u64().unwrap() as u32).collect();
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: c["prompt"].as_str().unwrap().to_string(),
            ids: u32s(&c["ids"]),
            argmax: u32s(&c["argmax"]),
            argmax_margin: f32s(&c["argmax_margin"]),
            top_ids: u32s(&c["last_top_ids"]),
            top_logits: c["last_top_logits"].as_array().unwrap().iter().map(|e| e.as_f64().unwrap() as f32).collect(),
            greedy: u32s(&c["greedy"]),
            greedy_margin: f32s(&c["greedy_margin"]),
        })
        .collect()
}

/// The model reproduces llama.cpp's CPU numerics to the bit (module docs of
/// `frognano_model::quant::ggml`), so logits agree to the 4 decimals the fixture keeps.
const LOGIT_TOL: f32 = 2e-4;

#[test]
fn smollm2_matches_llama_cpp() {
    let Some(path) = demo_model() else { return };
    let m = load(path.to_str().unwrap()).unwrap();
    let vocab = m.model.vocab_size();
    assert_eq!(vocab, 49152);
    let tok = m.tokenizer().unwrap();
    let mut positions = 0;
    for case in cases() {
        let short: String = case.prompt.chars().take(40).collect();
        assert_eq!(tok.encode(&case.prompt).unwrap(), case.ids, "tokenization of {short:?}");
        let mut cache = m.model.new_cache();
        let logits = m.model.forward(&case.ids, &mut cache, true).unwrap();
        for (p, row) in logits.chunks_exact(vocab).enumerate() {
            positions += 1;
            assert_eq!(
                argmax(row),
                case.argmax[p],
                "top-1 at prompt position {p} of {short:?} (llama.cpp's top-2 margin there: {})",
                case.argmax_margin[p]
            );
        }
        let last = &logits[(case.ids.len() - 1) * vocab..];
        let worst =
            case.top_ids.iter().zip(&case.top_logits).map(|(&i, &l)| (last[i as usize] - l).abs()).fold(0.0, f32::max);
        assert!(worst < LOGIT_TOL, "{short:?}: last-position logits differ from llama.cpp's by up to {worst}");
        // Greedy decode one token at a time (the single-token path), every step.
        let mut next = argmax(last);
        for (step, (&want, &margin)) in case.greedy.iter().zip(&case.greedy_margin).enumerate() {
            assert_eq!(next, want, "greedy token {step} of {short:?} (llama.cpp's top-2 margin there: {margin})");
            next = argmax(&m.model.forward(&[want], &mut cache, false).unwrap());
        }
    }
    eprintln!("top-1 equal to llama.cpp's at all {positions} prompt positions");
}

#[test]
fn smollm2_metadata_gives_template_and_stop_tokens() {
    let Some(path) = demo_model() else { return };
    let m = load(path.to_str().unwrap()).unwrap();
    let tok = m.tokenizer().unwrap();
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert!(m.eos_ids.contains(&im_end), "{:?}", m.eos_ids);
    let msgs = [frognano_protocol::Message::user("Hi")];
    let text = m.chat_template().unwrap().render(&msgs, None, true, None).unwrap();
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text:?}");
}
