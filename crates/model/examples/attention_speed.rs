//! Times one layer's causal attention (`kernels::attention::causal`, the kernel this CPU picks)
//! against the plain `causal_reference` at Qwen2.5-Coder-1.5B's shapes (12 query heads, 2 KV
//! heads, head_dim 128): one decode token after N cached positions, and a prefill of N tokens.
//!
//! ```text
//! cargo run --release -p frognano-model --example attention_speed -- [--threads 2] [--ctx 512,1024,4096]
//!     [--only decode|prefill] [--shape coder|smollm2|qwen35-4b|16x4x256] [--kv-cache f16|q8_0|q4_0]
//!     [--cold]
//! ```
//! Per shape it prints the milliseconds per call of each and their ratio (one layer; the
//! model has 28). The outputs are compared bit for bit as a side check (a prefill from
//! `TILED_FROM` positions on takes the tiled kernel, whose order differs: "OUTPUTS DIFFER").
//! `--cold` reads 512 MiB before each timed call, so that the cache comes from memory as in
//! a decode step (see [`COLD`]). On a CPU with AVX-512, a prefill on the tiled kernel is also
//! timed on its AVX2 steps.
//! With `--kv-cache q8_0|q4_0` the comparison is with the tiled kernel (`flash::causal_tiled`,
//! what one token on a quantized cache ran before `kernels::attention_q`), and the largest
//! output difference is printed instead.
use std::time::Instant;

use frognano_model::kernels::attention::{causal, causal_in_llama_order, causal_reference, AttnShape, TILED_FROM};
use frognano_model::kernels::attention_q::{causal_one_f16, supports_f16};
use frognano_model::kernels::flash::{causal_tiled, causal_tiled_with, TiledKernel};
use frognano_model::kernels::round_f16;
use frognano_model::quant::ggml::F16Dot;
use frognano_model::{KvRows, KvType};

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or_else(|| default.into())
}

/// Pseudo-random f16-exact values in `[-amp, amp)`.
fn f16_values(n: usize, seed: u64, amp: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            round_f16((u * 2.0 - 1.0) * amp)
        })
        .collect()
}

/// With `--cold`: a buffer larger than any last-level cache, read through before each timed
/// call so that the cache rows come from memory, as in a decode step, where the weights stream
/// through the cache between one layer's attention and the next (this Xeon's shared L3 holds
/// 260 MiB: a 4B layer's 33 MB at 8K keys stays in it between back-to-back calls).
static COLD: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();

/// Reads all of [`COLD`], if `--cold` set it, evicting what the last call left in the caches.
fn evict() {
    if let Some(buf) = COLD.get() {
        std::hint::black_box(buf.iter().fold(0u64, |a, &x| a.wrapping_add(x)));
    }
}

/// Seconds per call of `f`, timed on a thread of the pool as the model runs its forward passes
/// (`kernels::on_pool`): called from the main thread, each call would also pay for handing its
/// work to the pool and waking a worker, ~80 µs a call here, more than a short call's kernel
/// (SmolLM2's one-token attention at 512 keys: 0.13 ms from the main thread, 0.05 ms on the
/// pool). See [`time_here`].
fn time(f: impl FnMut() -> Vec<f32> + Send) -> (f64, Vec<f32>) {
    let mut out = None;
    rayon::scope(|_| out = Some(time_here(f)));
    out.expect("the scope ran its closure")
}

/// [`time`] on the calling thread: the best of a few timed rounds after one warm-up call, or
/// that call alone when it took over a second. With `--cold`, the best of nine calls, each
/// timed alone after [`evict`].
fn time_here(mut f: impl FnMut() -> Vec<f32>) -> (f64, Vec<f32>) {
    if COLD.get().is_some() {
        let mut best = f64::INFINITY;
        let mut out = Vec::new();
        for _ in 0..9 {
            evict();
            let t = Instant::now();
            out = f();
            best = best.min(t.elapsed().as_secs_f64());
        }
        return (best, out);
    }
    let t = Instant::now();
    let out = f();
    let mut best = t.elapsed().as_secs_f64();
    if best > 1.0 {
        return (best, out);
    }
    for _ in 0..3 {
        let reps = 3;
        let t = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(f());
        }
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
    }
    (best, out)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = arg(&args, "--threads", "2").parse()?;
    rayon::ThreadPoolBuilder::new().num_threads(threads).build_global()?;
    let ctx: Vec<usize> = arg(&args, "--ctx", "512,1024,4096")
        .split(',')
        .map(|v| v.trim().parse())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--ctx: expected comma-separated token counts ({e})"))?;
    let only = arg(&args, "--only", "");
    if !["", "decode", "prefill"].contains(&only.as_str()) {
        return Err(format!("--only {only}: expected decode or prefill").into());
    }
    let (hq, hkv, dh) = match arg(&args, "--shape", "coder").as_str() {
        "coder" => (12, 2, 128),
        "smollm2" => (9, 3, 64),
        "qwen35-4b" => (16, 4, 256),
        other => match other.split('x').map(|v| v.parse::<usize>()).collect::<Result<Vec<_>, _>>().as_deref() {
            Ok(&[hq, hkv, dh]) if hkv > 0 && hq % hkv == 0 => (hq, hkv, dh),
            _ => {
                return Err(
                    format!("--shape {other}: expected coder, smollm2, qwen35-4b or HEADSxKV_HEADSxHEAD_DIM").into()
                )
            }
        },
    };
    let reference = !args.iter().any(|a| a == "--no-reference");
    if args.iter().any(|a| a == "--cold") {
        COLD.get_or_init(|| (0..(1u64 << 26)).collect());
    }
    let kv: KvType = arg(&args, "--kv-cache", "f16").parse()?;
    kv.check_head_dim(dh)?;
    println!("threads {threads}; one layer, {hq} heads / {hkv} KV heads × {dh}, {kv} cache");
    for &n in &ctx {
        for (what, t) in [("decode", 1), ("prefill", n)] {
            if !only.is_empty() && only != what {
                continue;
            }
            let pos0 = n - t;
            let s = AttnShape { t, pos0, heads: hq, kv_heads: hkv, head_dim: dh, scale: 1.0 / (dh as f32).sqrt() };
            let q = f16_values(t * hq * dh, 1, 2.0);
            let k = f16_values(n * hkv * dh, 2, 2.0);
            let v = f16_values(n * hkv * dh, 3, 1.0);
            let order = F16Dot::for_batch(t);
            let (mut kc, mut vc) = (KvRows::new(kv, hkv * dh, dh), KvRows::new(kv, hkv * dh, dh));
            kc.push(&k);
            vc.push(&v);
            drop((k, v));
            let (fast, a) = time(|| causal(&q, &kc, &vc, s, order));
            if kv != KvType::F16 {
                let (tiled, b) = time(|| causal_tiled(&q, &kc, &vc, s));
                let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
                println!(
                    "{what:>7} {n:>6}: causal {:>9.3} ms, tiled {:>9.3} ms, {:>5.1}x, outputs within {worst:.1e}",
                    fast * 1e3,
                    tiled * 1e3,
                    tiled / fast
                );
                continue;
            }
            if t > 1 && n >= TILED_FROM && TiledKernel::best(dh) == TiledKernel::Avx512 {
                // The tiled kernel's 512-bit steps against its AVX2 ones (same bits).
                let (avx2, b) = time(|| causal_tiled_with(TiledKernel::Avx2, &q, &kc, &vc, s));
                let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
                println!(
                    "{what:>7} {n:>5}: tiled AVX-512 {:>9.3} ms, tiled AVX2 {:>9.3} ms, {:>5.2}x{}",
                    fast * 1e3,
                    avx2 * 1e3,
                    avx2 / fast,
                    if same { "" } else { "  OUTPUTS DIFFER" }
                );
            }
            if let (true, Some(kb), Some(vb)) = (supports_f16(&s), kc.f16_bits(), vc.f16_bits()) {
                // The online one-token kernel against llama.cpp's non-flash order.
                let (online, b) = time(|| causal_one_f16(&q, kb, vb, s));
                let (ordered, c) = time(|| causal_in_llama_order(&q, &kc, &vc, s, order));
                let worst = c.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
                println!(
                    "{what:>7} {n:>5}: online {:>9.3} ms, llama.cpp order {:>9.3} ms, {:>5.2}x, outputs within {worst:.1e}",
                    online * 1e3,
                    ordered * 1e3,
                    ordered / online
                );
            }
            let (k, v) = (kc.to_f32(), vc.to_f32());
            let (plain, b) =
                if reference { time(|| causal_reference(&q, &k, &v, s, order)) } else { (f64::NAN, a.clone()) };
            let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
            println!(
                "{what:>7} {n:>5}: causal {:>9.3} ms, reference {:>9.3} ms, {:>5.1}x{}",
                fast * 1e3,
                plain * 1e3,
                plain / fast,
                if same { "" } else { "  OUTPUTS DIFFER" }
            );
        }
    }
    Ok(())
}
