//! What the kernel tests share: the device they run on and their inputs.

#![allow(dead_code)]

use frognano_gpu::Gpu;

/// The device the tests run on ([`frognano_gpu::test_device`]: the simulator unless told).
pub fn device() -> Gpu {
    frognano_gpu::test_device()
}

/// `n` values in [−1, 1], the same for the same `seed` (xorshift).
pub fn values(n: usize, seed: u32) -> Vec<f32> {
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

/// max |a − b|.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}
