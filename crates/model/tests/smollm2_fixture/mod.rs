//! The demo model and llama.cpp's outputs on it (fixtures/smollm2/llama_cpp_reference.json),
//! shared by `smollm2_gguf.rs` (default kernels) and `smollm2_exact.rs` (plain kernels, bit
//! for bit).
#![allow(dead_code)] // each test binary uses its own part

use std::path::PathBuf;

/// `rel` under the workspace root.
pub fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

/// The index of the largest value.
pub fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32
}

/// The demo model, or `None` with a skip line (a failure under `FROGNANO_REQUIRE_FIXTURES`).
pub fn demo_model(what: &str) -> Option<PathBuf> {
    frognano_model::test_support::demo_model(what)
}

/// One prompt of the fixture and llama.cpp's outputs on it.
pub struct Case {
    pub prompt: String,
    pub ids: Vec<u32>,
    pub argmax: Vec<u32>,
    pub argmax_margin: Vec<f32>,
    pub top_ids: Vec<u32>,
    pub top_logits: Vec<f32>,
    pub greedy: Vec<u32>,
    pub greedy_margin: Vec<f32>,
    /// The largest logit difference between llama.cpp's batch and one-token paths.
    pub spread: f32,
}

/// The fixture's prompts.
pub fn cases() -> Vec<Case> {
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
            spread: c["batch_vs_single_max_abs"].as_f64().unwrap() as f32,
        })
        .collect()
}
