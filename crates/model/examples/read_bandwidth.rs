//! The read bandwidth a decode step can reach at best: `THREADS` threads (argument, default 1)
//! each stream their own 256 MiB buffer with 256-bit loads (AVX2 where the CPU has it) into a
//! running sum, all at once; best of five passes, in GB/s of bytes read. A one-token matmul
//! reads every weight once and writes almost nothing, so this — not a copy, which also writes
//! — is the ceiling its weight bandwidth is measured against (bench/gguf_speed.sh prints both).
//! `cargo run --release -p frognano-model --example read_bandwidth [THREADS] [--patterns]`.
//!
//! With `--patterns` it also times two other ways to read the same bytes, one line each: the
//! plain loop with each line prefetched into L2 4 KiB ahead (what the one-token kernels do),
//! and two far-apart streams of the buffer read in turn, each prefetched so. The plain loop
//! is the number printed without the flag; the others show how far this machine's ceiling
//! depends on how it is read (on a 2-vCPU Xeon VM the prefetched patterns read 1.1–1.5× the
//! plain loop: bench/RESULTS.md, session 23).
use std::sync::Barrier;
use std::time::Instant;

const BYTES: usize = 256 << 20;

/// How a thread reads its buffer.
#[derive(Clone, Copy, Debug)]
enum Pattern {
    /// Front to back.
    Plain,
    /// Front to back, each line prefetched into L2 (`prefetcht1`) 4 KiB ahead.
    Prefetched,
    /// The two halves in turn, 128 bytes of each at a time, both prefetched so.
    TwoStreams,
}

/// Sum of the buffer as u64 lanes: every byte is loaded once, and the sum keeps the loads live.
fn stream(buf: &[u64], pattern: Pattern) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected just before.
        return unsafe { stream_avx2(buf, pattern) };
    }
    let _ = pattern;
    buf.chunks_exact(4).fold([0u64; 4], |a, c| std::array::from_fn(|i| a[i].wrapping_add(c[i]))).iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_avx2(buf: &[u64], pattern: Pattern) -> u64 {
    use std::arch::x86_64::*;
    // Four independent sums so the loads are not serialized behind one add.
    let mut acc = [_mm256_setzero_si256(); 4];
    let p = buf.as_ptr() as *const __m256i;
    // 128 bytes (four 256-bit loads) starting at register `i`, their two lines prefetched
    // 4 KiB ahead when asked (a prefetch never faults, hence the wrapping arithmetic).
    let mut step = |i: usize, prefetch: bool| {
        if prefetch {
            let ahead = (p.wrapping_add(i) as *const i8).wrapping_add(4096);
            _mm_prefetch::<_MM_HINT_T1>(ahead);
            _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64));
        }
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_add_epi64(*a, _mm256_loadu_si256(p.add(i + k)));
        }
    };
    let regs = buf.len() / 4;
    match pattern {
        Pattern::Plain | Pattern::Prefetched => {
            for i in (0..regs).step_by(4) {
                step(i, matches!(pattern, Pattern::Prefetched));
            }
        }
        Pattern::TwoStreams => {
            let half = regs / 2;
            for i in (0..half).step_by(4) {
                step(i, true);
                step(half + i, true);
            }
        }
    }
    let mut lanes = [0u64; 4];
    let total = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, total);
    lanes.iter().fold(0u64, |s, v| s.wrapping_add(*v))
}

fn main() {
    let mut threads = 1;
    let mut patterns = false;
    for a in std::env::args().skip(1) {
        match (a.as_str(), a.parse()) {
            ("--patterns", _) => patterns = true,
            (_, Ok(n)) if n >= 1 => threads = n,
            _ => {
                eprintln!("read_bandwidth: expected THREADS (a whole number ≥ 1) or --patterns, got {a:?}");
                std::process::exit(2);
            }
        }
    }
    // Every page written (faulted in) before any timing.
    let bufs: Vec<Vec<u64>> = (0..threads).map(|t| vec![t as u64 + 1; BYTES / 8]).collect();
    let gbs = |pattern: Pattern| (threads * BYTES) as f64 / best_of_five(&bufs, pattern) / 1e9;
    if !patterns {
        println!("{:.1}", gbs(Pattern::Plain));
        return;
    }
    for (pattern, what) in [
        (Pattern::Plain, "plain loop"),
        (Pattern::Prefetched, "each line prefetched into L2 4 KiB ahead"),
        (Pattern::TwoStreams, "two streams in turn, both prefetched so"),
    ] {
        println!("{threads} threads, {what}: {:.1} GB/s", gbs(pattern));
    }
}

/// Seconds of the fastest of five passes in which every thread reads its buffer at once.
fn best_of_five(bufs: &[Vec<u64>], pattern: Pattern) -> f64 {
    let gate = Barrier::new(bufs.len() + 1);
    let mut best = f64::INFINITY;
    std::thread::scope(|s| {
        for b in bufs {
            let gate = &gate;
            s.spawn(move || {
                for _ in 0..5 {
                    gate.wait();
                    std::hint::black_box(stream(b, pattern));
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
    best
}
