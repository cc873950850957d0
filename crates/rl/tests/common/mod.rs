//! Helpers the policy tests share: a tensor as plain numbers, the inference engine's logits,
//! and the largest difference of two.

// Each test binary uses its own subset.
#![allow(dead_code)]

use candle_core::{DType, Tensor};
use frognano_model::CausalLm;

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
