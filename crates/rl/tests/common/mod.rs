//! Helpers the policy tests share: fixture paths, a tensor as plain numbers, the inference
//! engine's logits, the largest difference of two, and deterministic LoRA `B` values.

// Each test binary uses its own subset.
#![allow(dead_code)]

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use frognano_model::CausalLm;
use frognano_rl::policy::Policy;

/// `fixtures/REL` of the repository.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(rel)
}

/// Every element of `t` as f32, flattened.
pub fn rows(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

/// The engine's logits `[ids.len(), vocab]` for `ids` from an empty cache.
pub fn engine_logits(m: &dyn CausalLm, ids: &[u32]) -> Vec<f32> {
    let mut cache = m.new_cache();
    m.forward(ids, &mut cache, true).unwrap()
}

/// `max |a − b|` over equal-length slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Gives every adapter's `B` deterministic non-zero values of magnitude up to `amplitude / 2`
/// (`B` starts at zero, which leaves the adapted model equal to its base and `A` without
/// gradient).
pub fn perturb_b(p: &Policy, amplitude: f32) {
    for (i, (name, v)) in p.params().iter().enumerate() {
        if name.ends_with("lora_B.weight") {
            let n = v.elem_count();
            let data: Vec<f32> = (0..n).map(|j| (((i * 131 + j * 17) % 97) as f32 / 97.0 - 0.5) * amplitude).collect();
            v.set(&Tensor::from_vec(data, v.dims(), &Device::Cpu).unwrap().to_dtype(v.dtype()).unwrap()).unwrap();
        }
    }
}
