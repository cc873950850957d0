//! Prefill and decode speed of one model, for `bench/`: runs a prompt of random ids, then
//! greedy decoding, and prints one JSON line with tokens/s and peak RSS.
//!
//! `cargo run --release -p frognano-engine --example gen_speed -- MODEL PREFILL DECODE [--quant q8_0|q4_k]`

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use frognano_engine::{GenerateRequest, SamplingParams, Session, SpeculativeMode};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() >= 4, "usage: gen_speed MODEL PREFILL DECODE [--quant q8_0|q4_k]");
    let (spec, n_prefill, n_decode): (&str, usize, usize) = (&args[1], args[2].parse()?, args[3].parse()?);
    let quant = match args.iter().position(|a| a == "--quant").map(|i| args[i + 1].as_str()) {
        Some("q8_0") => Some(frognano_model::quant::QuantType::Q8_0),
        Some("q4_k") => Some(frognano_model::quant::QuantType::Q4_K),
        Some(other) => anyhow::bail!("--quant {other}: expected q8_0 or q4_k"),
        None => None,
    };
    let t = Instant::now();
    let lm = frognano_model::load::load_quantized(spec, quant)?;
    let load_s = t.elapsed().as_secs_f64();
    let weight_bytes = lm.weight_bytes;
    let vocab = lm.model.vocab_size() as u64;
    let model: Arc<dyn frognano_model::CausalLm> = Arc::from(lm.model);
    // Deterministic ids below 1000 exist in every vocabulary we bench.
    let prompt: Vec<u32> = (0..n_prefill as u64).map(|i| ((i * 7919 + 13) % vocab.min(1000)) as u32).collect();
    let mut session = Session::new(model.clone());
    // Plain decode speed, one forward per token (bench/speculative.sh measures drafting).
    session.set_speculative(SpeculativeMode::None);
    let t = Instant::now();
    session.prefill(&prompt)?;
    let prefill_s = t.elapsed().as_secs_f64();
    let req = GenerateRequest {
        sampling: SamplingParams::greedy(),
        max_tokens: n_decode + 1,
        stop_ids: vec![],
        top_logprobs: 0,
        checkpoint: None,
    };
    let mut first = None;
    let t = Instant::now();
    // The prompt is served from the session; the first token needs no forward pass, the
    // other n_decode each need one.
    let g = session.generate(&prompt, &req, |_| {
        first.get_or_insert_with(Instant::now);
        ControlFlow::Continue(())
    })?;
    let decode_s = first.map(|f| f.elapsed().as_secs_f64()).unwrap_or_else(|| t.elapsed().as_secs_f64());
    println!(
        "{}",
        serde_json::json!({
            "engine": "frognano",
            "model": spec,
            "quant": quant.map(|q| q.name()),
            "threads": rayon_threads(),
            "load_s": load_s,
            "prefill_tokens": n_prefill,
            "prefill_tok_s": n_prefill as f64 / prefill_s,
            "decode_tokens": g.tokens.len() - 1,
            "decode_tok_s": (g.tokens.len() - 1) as f64 / decode_s,
            "peak_rss_bytes": frognano_testkit::peak_rss_kib() * 1024,
            "weight_bytes": weight_bytes,
        })
    );
    Ok(())
}

fn rayon_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}
