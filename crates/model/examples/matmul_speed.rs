//! Times `Matrix::matmul` on a 4B-shaped MLP weight (9216 × 2560) for decode and prefill.
use frognano_model::tensor::{Bytes, DType, Matrix};
use std::time::Instant;

fn main() {
    let (rows, cols) = (9216, 2560);
    for dtype in [DType::BF16, DType::F32] {
        let n = rows * cols * dtype.size();
        // Normal (not denormal) values: denormals would measure the FPU's slow path.
        let vals = (0..rows * cols).map(|i| (((i * 2654435761usize) >> 7) % 2001) as f32 / 1000.0 - 1.0);
        let bytes: Vec<u8> = match dtype {
            DType::BF16 => vals.flat_map(|v| half::bf16::from_f32(v).to_le_bytes()).collect(),
            _ => vals.flat_map(|v| v.to_le_bytes()).collect(),
        };
        let m = Matrix::new(rows, cols, dtype, Bytes::from_vec(bytes));
        for t in [1usize, 64] {
            let x: Vec<f32> = (0..t * cols).map(|i| (i % 7) as f32 * 0.1).collect();
            let _ = m.matmul(&x, t);
            let reps = if t == 1 { 50 } else { 5 };
            let t0 = Instant::now();
            for _ in 0..reps {
                std::hint::black_box(m.matmul(&x, t));
            }
            let s = t0.elapsed().as_secs_f64() / reps as f64;
            println!(
                "{dtype:?} t={t}: {:.2} ms  {:.1} GB/s weights  {:.1} GFLOP/s",
                s * 1e3,
                n as f64 / s / 1e9,
                2.0 * (rows * cols * t) as f64 / s / 1e9
            );
        }
    }
}
