//! Times the quantized matmul kernels on a 4B-shaped MLP weight (9216 × 2560) at one thread:
//! decode (1 token) and prefill tiles (64 tokens), in multiply-adds per second. For kernel
//! work: `cargo run --release -p frognano-model --example quant_matmul_speed [TYPE…]` (any of
//! q4_0 … iq4_xs; all when none is named). With `--reference` each type is also timed through
//! the scalar [`quant::dot_reference`] (what a format without SIMD kernels ran, row by row, with
//! the same activation quantization), for before/after figures.
use frognano_model::quant::{self, QuantType, QuantizedActs};
use frognano_model::tensor::{Bytes, DType, Matrix};
use std::time::Instant;

fn main() {
    let threads = std::env::var("THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    rayon::ThreadPoolBuilder::new().num_threads(threads).build_global().expect("one pool");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let reference = args.iter().any(|a| a == "--reference");
    let which: Vec<String> = args.into_iter().filter(|a| !a.starts_with("--")).collect();
    let (rows, cols) = (9216, 2560);
    if which.iter().any(|w| w == "quantize") {
        // What `--quant` does to every matrix on load, one thread.
        let x: Vec<f32> = (0..rows * cols).map(|i| (((i * 2654435761usize) >> 7) % 2001) as f32 / 1e5 - 0.01).collect();
        for ty in [QuantType::Q8_0, QuantType::Q4_K] {
            let t0 = Instant::now();
            let q = frognano_model::quant::quantize::quantize(ty, &x);
            let sec = t0.elapsed().as_secs_f64();
            println!(
                "quantize {ty}: {:.2} s for {} values ({:.1} M values/s), rms error {:.2e}",
                sec,
                x.len(),
                x.len() as f64 / sec / 1e6,
                {
                    let mut back = vec![0.0; x.len()];
                    frognano_model::quant::dequantize(ty, &q, &mut back);
                    (x.iter().zip(&back).map(|(a, b)| (a - b).powi(2)).sum::<f32>() / x.len() as f32).sqrt()
                }
            );
        }
        return;
    }
    for ty in QuantType::ALL {
        if !which.is_empty() && !which.iter().any(|w| w.eq_ignore_ascii_case(ty.name())) {
            continue;
        }
        let n = rows * cols / ty.block_size() * ty.block_bytes();
        let mut s = 7u64;
        let mut w: Vec<u8> = (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (s >> 33) as u8
            })
            .collect();
        // Small normal f16 scales where each format keeps them.
        let scale_at: &[usize] = match ty {
            QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4_K | QuantType::Q5_K => &[0, 2],
            QuantType::Q2_K => &[80, 82],
            QuantType::Q3_K => &[108],
            QuantType::Q6_K => &[208],
            _ => &[0],
        };
        for b in w.chunks_exact_mut(ty.block_bytes()) {
            for &o in scale_at {
                b[o..o + 2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
            }
        }
        if reference {
            let rb = ty.row_bytes(cols).expect("whole blocks");
            for t in [1usize, 64] {
                let x: Vec<f32> = (0..t * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
                let reps = if t == 1 { 3 } else { 1 };
                let t0 = Instant::now();
                for _ in 0..reps {
                    let acts = QuantizedActs::new(ty.act_format(), &x, t);
                    for tt in 0..t {
                        let a = acts.row(tt);
                        for row in w.chunks_exact(rb) {
                            std::hint::black_box(quant::dot_reference(ty, row, &a));
                        }
                    }
                }
                let sec = t0.elapsed().as_secs_f64() / reps as f64;
                println!(
                    "{ty} t={t:<3} {:8.2} ms  {:6.1} GB/s weights  {:6.1} G multiply-adds/s  (scalar reference)",
                    sec * 1e3,
                    n as f64 / sec / 1e9,
                    (rows * cols * t) as f64 / sec / 1e9
                );
            }
        }
        // As a model holds it: repacked where this CPU has a kernel for that.
        let mut m = Matrix::new(rows, cols, DType::Quant(ty), Bytes::from_vec(w.clone()));
        m.pack_for_matmul();
        for t in [1usize, 64] {
            let x: Vec<f32> = (0..t * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
            let _ = m.matmul(&x, t);
            let reps = if t == 1 { 40 } else { std::env::var("REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(3) };
            // The mean, and the fastest repetition (what a busy machine still lets one see).
            let (mut total, mut best) = (0.0f64, f64::INFINITY);
            for _ in 0..reps {
                let t0 = Instant::now();
                std::hint::black_box(m.matmul(&x, t));
                let s = t0.elapsed().as_secs_f64();
                total += s;
                best = best.min(s);
            }
            let sec = total / reps as f64;
            println!(
                "{ty} t={t:<3} {:8.2} ms  {:6.1} GB/s weights  {:6.1} G multiply-adds/s  (best of {reps}: {:6.1} G/s)",
                sec * 1e3,
                n as f64 / sec / 1e9,
                (rows * cols * t) as f64 / sec / 1e9,
                (rows * cols * t) as f64 / best / 1e9
            );
        }
    }
    if which.is_empty() || which.iter().any(|w| w.eq_ignore_ascii_case("f16")) {
        f16_speed(rows, cols, reference);
    }
}

/// The same for an f16 matrix (a tied f16 embedding/head is common): one token streams the
/// rows, 64 widen blocks of rows; `--reference` times the plain widen-then-dot per row.
fn f16_speed(rows: usize, cols: usize, reference: bool) {
    let w: Vec<u8> = (0..rows * cols)
        .flat_map(|i| half::f16::from_f32((((i * 2654435761usize) >> 7) % 2001) as f32 / 1e5 - 0.01).to_le_bytes())
        .collect();
    let n = w.len();
    let report = |what: &str, t: usize, sec: f64| {
        println!(
            "F16 t={t:<3} {:8.2} ms  {:6.1} GB/s weights  {:6.1} G multiply-adds/s{what}",
            sec * 1e3,
            n as f64 / sec / 1e9,
            (rows * cols * t) as f64 / sec / 1e9
        );
    };
    let x: Vec<f32> = (0..cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
    if reference {
        let t0 = Instant::now();
        for r in w.chunks_exact(2 * cols) {
            std::hint::black_box(frognano_model::kernels::f16_rows::dot_row_plain(r, &x));
        }
        report("  (plain widen-and-dot)", 1, t0.elapsed().as_secs_f64());
    }
    let m = Matrix::new(rows, cols, DType::F16, Bytes::from_vec(w.clone()));
    for t in [1usize, 64] {
        let x: Vec<f32> = (0..t * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
        let _ = m.matmul(&x, t);
        let reps = if t == 1 { 20 } else { 2 };
        let t0 = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(m.matmul(&x, t));
        }
        report("", t, t0.elapsed().as_secs_f64() / reps as f64);
    }
}
