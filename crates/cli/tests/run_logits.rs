//! `frognano run` and `frognano logits` as a user calls them.

use std::process::Command;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_frognano"));
    c.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    c
}

#[test]
fn logits_prints_one_row_per_position_matching_the_fixture() {
    let out = bin().args(["logits", "fixtures/qwen35-tiny", "--ids", "5,17,300"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["logits"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r.as_array().unwrap().len() == 1024));
    // The same ids again give the same numbers (no hidden state between runs).
    let again = bin().args(["logits", "fixtures/qwen35-tiny", "--ids", "5,17,300"]).output().unwrap();
    assert_eq!(out.stdout, again.stdout);
}

#[test]
fn greedy_run_is_deterministic_and_chat_mode_uses_the_template() {
    let run = |extra: &[&str]| {
        let mut args =
            vec!["run", "fixtures/qwen35-tiny", "-p", "Hello there", "--temperature", "0", "--max-tokens", "8"];
        args.extend_from_slice(extra);
        let out = bin().args(&args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let a = run(&[]);
    assert_eq!(a, run(&[]));
    assert!(!a.trim().is_empty());
    assert_ne!(a, run(&["--chat"]), "the chat template changes the prompt and so the output");
}

#[test]
fn bad_input_is_a_one_line_error_naming_the_problem() {
    let out = bin().args(["logits", "fixtures/qwen35-tiny", "--ids", "1,99999"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("token id 99999 is out of vocabulary"), "{err}");
    let out = bin().args(["run", "fixtures/does-not-exist", "-p", "x"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does-not-exist"));
    let out = bin().args(["run", "fixtures/qwen35-tiny", "-p", "x", "--top-p", "0"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("top_p"));
    let out = bin().args(["run", "fixtures/qwen35-tiny", "-p", "x", "--quant", "q3"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected q8_0 or q4_k"));
}

#[test]
fn quant_on_load_runs_and_stays_close_to_the_float_model() {
    let run = |extra: &[&str]| {
        let mut args =
            vec!["run", "fixtures/qwen35-tiny", "-p", "Hello there", "--temperature", "0", "--max-tokens", "4"];
        args.extend_from_slice(extra);
        let out = bin().args(&args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    // Q8_0 keeps 8 bits per weight: the first greedy tokens of the float model survive.
    let f = run(&[]);
    let q = run(&["--quant", "q8_0"]);
    assert_eq!(f.chars().next(), q.chars().next(), "float {f:?} vs q8_0 {q:?}");
    // Q4_K generates too (its numbers are checked by the logits test below).
    assert!(!run(&["--quant", "q4_k"]).trim().is_empty());
}

/// `frognano logits MODEL --ids … [--quant Q]`: the logits, flattened, and the reported weight
/// bytes.
fn logits(model: &str, extra: &[&str]) -> (Vec<f32>, u64) {
    let mut args = vec!["logits", model, "--ids", "5,17,300,42,9"];
    args.extend_from_slice(extra);
    let out = bin().args(&args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows: Vec<f32> = v["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32))
        .collect();
    (rows, v["weight_bytes"].as_u64().unwrap())
}

/// `max |a − b| / max |b|`: how far quantization moved the logits, relative to their scale.
fn moved(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// `logits --quant` really quantizes the f32 fixture: the logits move by a non-zero amount
/// bounded by 8-bit precision, and the weights shrink to about a quarter. Every matrix of the
/// tiny fixture is 64 or 192 wide, not a whole number of 256-wide Q4_K blocks, so `q4_k` falls
/// back to Q8_0 throughout (as llama.cpp's quantizer does); the demo-model test below runs real
/// Q4_K blocks.
#[test]
fn quant_on_load_moves_the_logits_by_a_bounded_amount_and_shrinks_the_weights() {
    let (float, float_bytes) = logits("fixtures/qwen35-tiny", &[]);
    for quant in ["q8_0", "q4_k"] {
        let (q, bytes) = logits("fixtures/qwen35-tiny", &["--quant", quant]);
        let rel = moved(&q, &float);
        let size = bytes as f64 / float_bytes as f64;
        eprintln!(
            "qwen35-tiny {quant}: max |Δ| / max |logit| = {rel:.5}, weight bytes {bytes} / {float_bytes} = {size:.3}"
        );
        // Measured: 0.048 of the logits' scale (32.1), and 0.264 of the bytes (Q8_0 stores 34
        // bytes per 32 weights, f32 128; the norms stay f32).
        assert!(rel > 0.005, "{quant}: logits moved by only {rel} of their scale: the flag looks ignored");
        assert!(rel < 0.15, "{quant}: logits moved by {rel} of their scale");
        assert!(size < 0.35, "{quant}: weights {bytes} bytes vs float {float_bytes} ({size:.3})");
    }
}

/// `--quant q4_k` on the demo model (a Q4_1 GGUF, re-quantized on load) writes real Q4_K blocks
/// for its 1536-wide matrices: the logits move by a bounded amount, differently from Q8_0's, and
/// the weights are smaller than Q8_0's.
#[test]
fn quant_q4_k_on_load_runs_real_q4_k_blocks_on_the_demo_model() {
    let Some(demo) = frognano_testkit::demo_model() else { return };
    let demo = demo.to_str().unwrap();
    let (file, _) = logits(demo, &[]);
    let (q8, q8_bytes) = logits(demo, &["--quant", "q8_0"]);
    let (q4, q4_bytes) = logits(demo, &["--quant", "q4_k"]);
    let (rel8, rel4, rel84) = (moved(&q8, &file), moved(&q4, &file), moved(&q4, &q8));
    eprintln!(
        "demo: q8_0 moved {rel8:.5}, q4_k {rel4:.5}, q4_k vs q8_0 {rel84:.5}; bytes q8_0 {q8_bytes}, q4_k {q4_bytes}"
    );
    // Measured: q8_0 0.050 and q4_k 0.064 of the logits' scale (32.6) from the Q4_1 file's
    // logits, 0.075 between the two.
    for (what, rel) in [("q8_0 vs file", rel8), ("q4_k vs file", rel4), ("q4_k vs q8_0", rel84)] {
        assert!(rel > 0.005 && rel < 0.25, "{what}: logits moved by {rel} of their scale");
    }
    assert!((q4_bytes as f64) < Q4K_OVER_Q8_BYTES * q8_bytes as f64, "q4_k {q4_bytes} bytes vs q8_0 {q8_bytes}");
}

/// Largest `q4_k / q8_0` weight-byte ratio the demo-model test accepts.
const Q4K_OVER_Q8_BYTES: f64 = 0.95;

/// `frognano run NAME:TAG` runs a model pulled with Ollama from Ollama's store
/// (`$OLLAMA_MODELS`), as `run` on the same GGUF file does; an unknown name says where it
/// looked.
#[test]
fn run_takes_an_ollama_model_by_its_name() {
    let store = tempfile::tempdir().unwrap();
    let hex = "0f".repeat(32);
    std::fs::create_dir_all(store.path().join("blobs")).unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::copy(root.join("fixtures/arch/qwen3-tiny.gguf"), store.path().join(format!("blobs/sha256-{hex}")))
        .unwrap();
    let manifest = store.path().join("manifests/registry.ollama.ai/library/tiny-coder/1b");
    std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
    let layer =
        serde_json::json!({"mediaType": "application/vnd.ollama.image.model", "digest": format!("sha256:{hex}")});
    std::fs::write(&manifest, serde_json::json!({"layers": [layer]}).to_string()).unwrap();
    let run = |model: &str| {
        bin()
            .env("OLLAMA_MODELS", store.path())
            .args(["run", model, "-p", "Hello there", "--temperature", "0", "--max-tokens", "6"])
            .output()
            .unwrap()
    };
    let by_name = run("tiny-coder:1b");
    assert!(by_name.status.success(), "{}", String::from_utf8_lossy(&by_name.stderr));
    let by_file = run("fixtures/arch/qwen3-tiny.gguf");
    assert_eq!(by_name.stdout, by_file.stdout);
    assert!(!by_name.stdout.is_empty());
    // A bare name is its `latest` tag, as in Ollama.
    let latest = store.path().join("manifests/registry.ollama.ai/library/tiny-coder/latest");
    std::fs::copy(&manifest, &latest).unwrap();
    let by_bare_name = run("tiny-coder");
    assert!(by_bare_name.status.success(), "{}", String::from_utf8_lossy(&by_bare_name.stderr));
    assert_eq!(by_bare_name.stdout, by_file.stdout);
    let missing = run("tiny-coder:7b");
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("tiny-coder:7b") && err.contains("no Ollama model of that name"), "{err}");
}
