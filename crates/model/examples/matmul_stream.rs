//! Where a one-token matmul's weight stream goes: the same packed kernel timed from each level
//! of the memory hierarchy, then over more weights than the cache holds three ways: one thread,
//! every thread of the pool splitting each matrix (what a decode step does), and independent
//! threads each streaming matrices of its own (no fork-join at all). In GB/s of packed weight
//! bytes, next to `read_bandwidth` (a plain read loop) for the ceiling.
//!
//! `cargo run --release -p frognano-model --example matmul_stream [q4_k|q6_k …] [--threads N]
//! [--mib M]` (both types by default, every core, 1,024 MiB of 9216 × 2560 matrices).
use frognano_model::quant::{self, GroupKernel, QuantType, QuantizedActs, PACK_GROUP};
use frognano_model::tensor::{Bytes, DType, Matrix};
use std::time::Instant;

/// The 4B model's MLP shape.
const ROWS: usize = 9216;
const COLS: usize = 2560;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| -> Option<usize> {
        let i = args.iter().position(|a| a == name)?;
        match args.get(i + 1).and_then(|v| v.parse().ok()) {
            Some(v) if v >= 1 => Some(v),
            _ => {
                eprintln!("matmul_stream: {name} takes a whole number ≥ 1");
                std::process::exit(2);
            }
        }
    };
    let threads = flag("--threads").unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mib = flag("--mib").unwrap_or(1024);
    let mut types = Vec::new();
    let mut skip = false;
    for a in &args {
        if std::mem::take(&mut skip) {
            continue;
        }
        match a.as_str() {
            "--threads" | "--mib" => skip = true,
            "q4_k" | "Q4_K" => types.push(QuantType::Q4_K),
            "q6_k" | "Q6_K" => types.push(QuantType::Q6_K),
            other => {
                eprintln!("matmul_stream: unknown argument {other:?} (types: q4_k, q6_k)");
                std::process::exit(2);
            }
        }
    }
    if types.is_empty() {
        types = vec![QuantType::Q4_K, QuantType::Q6_K];
    }
    rayon::ThreadPoolBuilder::new().num_threads(threads).build_global().expect("one pool");
    println!(
        "cpu: {}",
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| c.lines().find(|l| l.starts_with("model name")).map(|l| l
                .split(':')
                .nth(1)
                .unwrap_or("")
                .trim()
                .to_string()))
            .unwrap_or_default()
    );
    println!("{threads} threads, {mib} MiB of {ROWS} × {COLS} matrices per type");
    for ty in types {
        let Some(kernel) = one_token_kernel(ty) else {
            println!("{ty}: no packed kernel on this CPU");
            continue;
        };
        kernel_by_level(ty, kernel);
        streams(ty, threads, mib);
    }
}

/// The packed one-token kernel of `ty` here, if any.
fn one_token_kernel(ty: QuantType) -> Option<GroupKernel<1>> {
    match ty {
        QuantType::Q4_K => quant::q4k_x8::kernel::<1>(),
        QuantType::Q6_K => quant::q6k_x8::kernel::<1>(),
        _ => None,
    }
}

/// `rows` × [`COLS`] random blocks of `ty` with small normal scales.
fn random_weights(ty: QuantType, rows: usize, seed: u64) -> Vec<u8> {
    let n = rows * COLS / ty.block_size() * ty.block_bytes();
    let mut s = seed;
    let mut w: Vec<u8> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as u8
        })
        .collect();
    let scales: &[usize] = if ty == QuantType::Q6_K { &[208] } else { &[0, 2] };
    for b in w.chunks_exact_mut(ty.block_bytes()) {
        for &o in scales {
            b[o..o + 2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
        }
    }
    w
}

fn input() -> Vec<f32> {
    (0..COLS).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect()
}

/// The kernel alone on one thread, group after group of one packed matrix, sized for L1, L2,
/// a share of L3, and memory: the compute rate, and what each level lets it reach.
fn kernel_by_level(ty: QuantType, kernel: GroupKernel<1>) {
    let x = input();
    let acts = QuantizedActs::new(ty.act_format(), &x, 1);
    let a = [acts.row(0)];
    for (level, groups) in [("L1", 1), ("L2", 64), ("L3 share", 1024), ("memory", 65536)] {
        let rows = groups * PACK_GROUP;
        let p = quant::pack_rows8(ty, &random_weights(ty, rows, 7), rows, COLS).expect("a packed kernel runs here");
        let group_bytes = p.len() / groups;
        let passes = ((2usize << 30) / p.len()).max(1);
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t0 = Instant::now();
            for _ in 0..passes {
                for g in p.chunks_exact(group_bytes) {
                    std::hint::black_box(kernel(std::hint::black_box(g), &a));
                }
            }
            best = best.min(t0.elapsed().as_secs_f64());
        }
        println!(
            "{ty} kernel, 1 thread, {:>9} KiB ({level:<8}): {:5.1} GB/s",
            p.len() >> 10,
            (passes * p.len()) as f64 / best / 1e9
        );
    }
}

/// `mib` MiB of matrices, one pass each per round, best of five rounds: one thread; the pool
/// splitting every matrix (from a pool thread, as `kernels::on_pool` runs a forward pass); and
/// `threads` independent threads, each its own share of the matrices.
fn streams(ty: QuantType, threads: usize, mib: usize) {
    let bytes = ROWS * COLS / ty.block_size() * ty.block_bytes();
    let count = ((mib << 20) / bytes).max(threads);
    let mats: Vec<Matrix> = (0..count)
        .map(|i| {
            let mut m = Matrix::new(ROWS, COLS, DType::Quant(ty), Bytes::from_vec(random_weights(ty, ROWS, i as u64)));
            m.pack_for_matmul();
            m
        })
        .collect();
    let x = input();
    let rate = |what: &str, n: usize, mut pass: Box<dyn FnMut() + '_>| {
        pass();
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t0 = Instant::now();
            pass();
            best = best.min(t0.elapsed().as_secs_f64());
        }
        println!("{ty} {what}: {:5.1} GB/s", (n * bytes) as f64 / best / 1e9);
    };
    let one = |ms: &[Matrix]| {
        for m in ms {
            std::hint::black_box(m.matmul(&x, 1));
        }
    };
    rate(
        "matmuls, 1 thread (serial)",
        count,
        Box::new(|| rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a pool").install(|| one(&mats))),
    );
    rate(&format!("matmuls, {threads} threads of the pool"), count, Box::new(|| rayon::scope(|_| one(&mats))));
    let per = count / threads;
    rate(
        &format!("matmuls, {threads} independent threads"),
        per * threads,
        Box::new(|| {
            std::thread::scope(|s| {
                for share in mats.chunks_exact(per).take(threads) {
                    // A one-thread pool each: every matmul runs serially on its own thread.
                    s.spawn(|| {
                        rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a pool").install(|| one(share))
                    });
                }
            })
        }),
    );
}
