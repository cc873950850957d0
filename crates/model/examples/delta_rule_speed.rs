//! Times the chunked delta rule at Qwen3.5-4B shapes (32 value heads, 16 key heads, 128 × 128)
//! for a 256-token prefill on one thread: `cargo run --release -p frognano-model --example
//! delta_rule_speed`.
use frognano_model::kernels::delta_rule::{chunked, DeltaInputs, DeltaShape};
use std::time::Instant;

fn main() {
    rayon::ThreadPoolBuilder::new().num_threads(1).build_global().expect("one pool");
    let (t, hk, hv, dk, dv) = (256, 16, 32, 128, 128);
    let unit = |n: usize, seed: usize| -> Vec<f32> {
        let mut x: Vec<f32> =
            (0..n * dk).map(|i| ((((i + seed) * 2654435761usize) >> 9) % 2001) as f32 / 1000.0 - 1.0).collect();
        for r in x.chunks_exact_mut(dk) {
            let n = r.iter().map(|v| v * v).sum::<f32>().sqrt();
            r.iter_mut().for_each(|v| *v /= n);
        }
        x
    };
    let (q, k) = (unit(t * hk, 1), unit(t * hk, 2));
    let v: Vec<f32> = (0..t * hv * dv).map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0).collect();
    let gscale: f32 = std::env::var("GSCALE").ok().and_then(|v| v.parse().ok()).unwrap_or(400.0);
    let g: Vec<f32> = (0..t * hv).map(|i| -((i * 31 % 100) as f32) / gscale).collect();
    let beta: Vec<f32> = (0..t * hv).map(|i| (i * 17 % 100) as f32 / 100.0).collect();
    let shape = DeltaShape { t, hk, hv, dk, dv, key_head: (0..hv).map(|h| h % hk).collect() };
    let x = DeltaInputs { q: &q, k: &k, v: &v, g: &g, beta: &beta };
    let mut state = vec![0.0f32; hv * dk * dv];
    let _ = chunked(&x, &mut state, &shape);
    let reps = 5;
    let t0 = Instant::now();
    let mut check = 0.0f32;
    for _ in 0..reps {
        check += chunked(&x, &mut state, &shape)[7];
    }
    let sec = t0.elapsed().as_secs_f64() / reps as f64;
    println!(
        "delta rule, {t} tokens × {hv} heads: {:.2} ms ({:.3} ms per token per layer) [{check:.4}]",
        sec * 1e3,
        sec * 1e3 / t as f64
    );
}
