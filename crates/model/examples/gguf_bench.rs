//! Times a model the way bench/gguf_speed.sh compares it with llama.cpp: prefill of N tokens,
//! then M greedy decode steps, one sequence. Prints one JSON line, with the M + 1 greedy token
//! ids (`tokens`) so that the script can check both engines decoded the same thing.
//!
//! ```text
//! cargo run --release -p frognano-model --example gguf_bench -- MODEL [--prefill 512] [--decode 128]
//!     [--threads 2] [--quant q8_0|q4_k] [--kv-cache f16|q8_0|q4_0] [--logits-at ID,ID,…]
//! ```
//! `--logits-at` instead prints the logits of every position for those ids (debugging parity).

use std::time::Instant;

use frognano_model::quant::QuantType;

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = args.get(1).ok_or("usage: gguf_bench MODEL [--prefill N] [--decode M] [--threads T]")?;
    let threads: usize = arg(&args, "--threads", 2);
    rayon::ThreadPoolBuilder::new().num_threads(threads).build_global()?;
    let quant = match arg(&args, "--quant", String::new()).as_str() {
        "" => None,
        "q8_0" => Some(QuantType::Q8_0),
        "q4_k" => Some(QuantType::Q4_K),
        other => return Err(format!("--quant {other}: expected q8_0 or q4_k").into()),
    };
    let t0 = Instant::now();
    let mut m = frognano_model::load::load_quantized(model, quant)?;
    let kv: String = arg(&args, "--kv-cache", String::new());
    if !kv.is_empty() {
        m.model.set_kv_type(kv.parse::<frognano_model::KvType>()?)?;
    }
    let load_s = t0.elapsed().as_secs_f64();
    let vocab = m.model.vocab_size();
    let ids_arg: String = arg(&args, "--logits-at", String::new());
    if !ids_arg.is_empty() {
        let ids: Vec<u32> = ids_arg.split(',').map(|s| s.trim().parse()).collect::<Result<_, _>>()?;
        let logits = m.model.forward(&ids, &mut m.model.new_cache(), true)?;
        let rows: Vec<&[f32]> = logits.chunks_exact(vocab).collect();
        println!("{}", serde_json::to_string(&rows)?);
        return Ok(());
    }
    let n_prefill: usize = arg(&args, "--prefill", 512);
    let n_decode: usize = arg(&args, "--decode", 128);
    // Deterministic pseudo-random prompt of ordinary token ids.
    let mut s = 12345u64;
    let prompt: Vec<u32> = (0..n_prefill)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            100 + ((s >> 33) as usize % (vocab.min(30000) - 100)) as u32
        })
        .collect();
    let mut cache = m.model.new_cache();
    let t = Instant::now();
    let logits = m.model.forward(&prompt, &mut cache, false)?;
    let prefill_s = t.elapsed().as_secs_f64();
    let mut next = argmax(&logits);
    let mut tokens = Vec::with_capacity(n_decode + 1);
    tokens.push(next);
    let t = Instant::now();
    for _ in 0..n_decode {
        next = argmax(&m.model.forward(&[next], &mut cache, false)?);
        tokens.push(next);
    }
    let decode_s = t.elapsed().as_secs_f64();
    println!(
        "{{\"engine\":\"frognano\",\"model\":{:?},\"threads\":{threads},\"load_s\":{load_s:.3},\"prefill_tokens\":{n_prefill},\
         \"prefill_tok_s\":{:.2},\"decode_tokens\":{n_decode},\"decode_tok_s\":{:.3},\"kv_cache\":\"{}\",\"kv_bytes\":{},\"weight_bytes\":{},\"tokens\":{}}}",
        model,
        n_prefill as f64 / prefill_s,
        n_decode as f64 / decode_s,
        m.model.kv_type(),
        cache.byte_len(),
        m.weight_bytes,
        serde_json::to_string(&tokens)?
    );
    Ok(())
}
