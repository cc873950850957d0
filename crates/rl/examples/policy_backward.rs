//! What one training sequence costs on this machine: loads a policy (LoRA on a GGUF or a
//! checkpoint folder), checks its logits against the inference engine on the same file, and
//! times [`Policy::backward`] on sequences of the lengths given, the loss on the last quarter of
//! the tokens (an agent's own turns; prompt and tool output carry no loss), with the peak
//! resident memory.
//!
//! ```sh
//! cargo run --release -p frognano-rl --example policy_backward -- \
//!     models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf 512 2048
//! ```

use std::time::Instant;

use anyhow::Context;
use frognano_rl::optim::GradSum;
use frognano_rl::policy::{LoraConfig, Policy, PolicyOptions};

fn peak_rss_gb() -> f64 {
    frognano_testkit::peak_rss_kib() as f64 / 1e6
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().context("usage: policy_backward MODEL [TOKENS ...]")?;
    let lengths: Vec<usize> = if args.len() > 1 {
        args[1..].iter().map(|a| a.parse().with_context(|| format!("token count {a:?}"))).collect::<Result<_, _>>()?
    } else {
        vec![512]
    };
    let rank = std::env::var("LORA_RANK").ok().and_then(|v| v.parse().ok()).unwrap_or(16);
    let t = Instant::now();
    let opts = PolicyOptions {
        lora: Some(LoraConfig { rank, alpha: 2.0 * rank as f32, ..Default::default() }),
        ..Default::default()
    };
    let policy = Policy::load(std::path::Path::new(model), &opts)?;
    println!(
        "loaded {} ({}, LoRA rank {rank}) in {:.1} s; peak RSS {:.2} GB",
        model,
        policy.arch(),
        t.elapsed().as_secs_f64(),
        peak_rss_gb()
    );
    let vocab = policy.vocab_size() as u32;
    // Parity with the engine on the file itself (quantized weights, 8-bit activations).
    let engine = frognano_model::load(model)?;
    let ids: Vec<u32> =
        engine.tokenizer()?.encode("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")?;
    let got = policy.logits(&ids)?.flatten_all()?.to_vec1::<f32>()?;
    let mut cache = engine.model.new_cache();
    let want = engine.model.forward(&ids, &mut cache, true)?;
    let v = vocab as usize;
    let argmax = |r: &[f32]| r.iter().enumerate().fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0;
    let agree =
        (0..ids.len()).filter(|&i| argmax(&got[i * v..(i + 1) * v]) == argmax(&want[i * v..(i + 1) * v])).count();
    let d = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    println!("policy vs engine on {} tokens: top-1 agrees at {agree}/{}, max |Δlogit| {d:.3}", ids.len(), ids.len());
    drop(engine);
    for n in lengths {
        let input: Vec<u32> = (0..n as u32).map(|i| (i * 7919 + 13) % vocab).collect();
        let targets: Vec<u32> = (0..n as u32).map(|i| (i * 104_729 + 7) % vocab).collect();
        let needed: Vec<bool> = (0..n).map(|i| i >= n - n / 4).collect();
        let params = policy.params();
        let mut acc = GradSum::new(&params);
        let t = Instant::now();
        let (loss, ()) =
            policy.backward(&input, &targets, Some(&needed), |lp| Ok((lp.sum_all()?, ())), &mut |g| acc.add(g))?;
        let s = t.elapsed().as_secs_f64();
        let norm: f64 = acc
            .into_grads()?
            .iter()
            .map(|g| g.sqr().and_then(|x| x.sum_all()).and_then(|x| x.to_scalar::<f32>()).unwrap_or(0.0) as f64)
            .sum::<f64>()
            .sqrt();
        println!(
            "backward over {n} tokens ({} with loss): {s:.1} s ({:.0} tokens/s), loss {loss:.1}, grad norm {norm:.3e}, peak RSS {:.2} GB",
            n / 4,
            n as f64 / s,
            peak_rss_gb()
        );
    }
    Ok(())
}
