//! Every kernel against the CPU reference of frognano-model, on the CPU simulator (and on a
//! real GPU when `FROGNANO_TEST_DEVICE=cuda` names one: bench/gpu.sh).

use frognano_gpu::{kernels, Buffer, Gpu};

/// The device the tests run on: the simulator, or `FROGNANO_TEST_DEVICE`.
pub fn device() -> Gpu {
    frognano_gpu::test_device()
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn rms_norm_matches_the_cpu_norm() {
    let dev = device();
    for (rows, width) in [(1, 64), (3, 1000), (5, 2560)] {
        let x = values(rows * width, 1);
        let w = values(width, 2);
        let want = frognano_model::kernels::rms_norm(&x, &w, 1e-6);
        let (bx, bw) = (Buffer::from_f32(&dev, &x).unwrap(), Buffer::from_f32(&dev, &w).unwrap());
        let by = Buffer::zeroed(&dev, x.len() * 4).unwrap();
        kernels::rms_norm(&dev, bx.ptr(), bw.ptr(), by.ptr(), rows, width, 1e-6).unwrap();
        let got = by.to_f32().unwrap();
        let d = max_diff(&got, &want);
        assert!(d < 1e-5, "rows {rows} width {width}: max |Δ| {d}");
    }
}
