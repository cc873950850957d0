//! The read bandwidth a decode step can reach at best: `THREADS` threads (argument, default 1)
//! each stream their own 256 MiB buffer with 256-bit loads (AVX2 where the CPU has it) into a
//! running sum, all at once; best of five passes, in GB/s of bytes read. A one-token matmul
//! reads every weight once and writes almost nothing, so this — not a copy, which also writes
//! — is the ceiling its weight bandwidth is measured against (bench/gguf_speed.sh prints both).
//! `cargo run --release -p frognano-model --example read_bandwidth [THREADS]`.
use std::sync::Barrier;
use std::time::Instant;

const BYTES: usize = 256 << 20;

/// Sum of the buffer as u64 lanes: every byte is loaded once, and the sum keeps the loads live.
fn stream(buf: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected just before.
        return unsafe { stream_avx2(buf) };
    }
    buf.chunks_exact(4).fold([0u64; 4], |a, c| std::array::from_fn(|i| a[i].wrapping_add(c[i]))).iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_avx2(buf: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    // Four independent sums so the loads are not serialized behind one add.
    let mut acc = [_mm256_setzero_si256(); 4];
    let p = buf.as_ptr() as *const __m256i;
    for i in (0..buf.len() / 4).step_by(4) {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_add_epi64(*a, _mm256_loadu_si256(p.add(i + k)));
        }
    }
    let mut lanes = [0u64; 4];
    let total = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, total);
    lanes.iter().fold(0u64, |s, v| s.wrapping_add(*v))
}

fn main() {
    let threads: usize = match std::env::args().nth(1) {
        None => 1,
        Some(a) => match a.parse() {
            Ok(n) if n >= 1 => n,
            _ => {
                eprintln!("read_bandwidth: THREADS must be a whole number ≥ 1, got {a:?}");
                std::process::exit(2);
            }
        },
    };
    // Every page written (faulted in) before any timing.
    let bufs: Vec<Vec<u64>> = (0..threads).map(|t| vec![t as u64 + 1; BYTES / 8]).collect();
    let gate = Barrier::new(threads + 1);
    let mut best = f64::INFINITY;
    std::thread::scope(|s| {
        for b in &bufs {
            let gate = &gate;
            s.spawn(move || {
                for _ in 0..5 {
                    gate.wait();
                    std::hint::black_box(stream(b));
                    gate.wait();
                }
            });
        }
        for _ in 0..5 {
            gate.wait();
            let t0 = Instant::now();
            gate.wait();
            best = best.min(t0.elapsed().as_secs_f64());
        }
    });
    println!("{:.1}", (threads * BYTES) as f64 / best / 1e9);
}
