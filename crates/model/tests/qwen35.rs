//! Qwen3.5 numerics against transformers 5.23 (fixtures from scripts/make_qwen35_fixtures.py).

use std::path::PathBuf;

use frognano_model::qwen35::Qwen35;
use frognano_model::tensor::{to_f32_vec, DType};
use frognano_model::CausalLm;
use safetensors::SafeTensors;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

struct Golden(Vec<u8>);

impl Golden {
    fn open(name: &str) -> Self {
        Golden(std::fs::read(fixture(&format!("{name}.golden.safetensors"))).unwrap())
    }
    fn f32(&self, key: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        let t = st.tensor(key).unwrap();
        assert_eq!(t.dtype(), safetensors::Dtype::F32);
        to_f32_vec(t.data(), DType::F32)
    }
    fn ids(&self, key: &str) -> Vec<u32> {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        let t = st.tensor(key).unwrap();
        t.data().chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32).collect()
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32
}

fn check_f32_fixture(name: &str) {
    let m = Qwen35::from_safetensors(&fixture(name)).unwrap();
    let g = Golden::open(name);
    let ids = g.ids("input_ids");
    let vocab = m.vocab_size();

    // One uncached pass over 150 tokens (chunked delta rule, 3 chunks with a ragged tail).
    let mut cache = m.new_cache();
    let full = m.forward(&ids, &mut cache, true).unwrap();
    // transformers' f32 run is itself some distance from the exact (f64) result; with logits
    // near 50 that noise exceeds 1e-4. We must be within 1e-4 or within that noise, and at
    // least as close to the exact result as transformers is.
    let tf = g.f32("logits_full");
    let exact = g.f32("logits_full_f64");
    let tf_noise = max_abs_diff(&tf, &exact);
    let d = max_abs_diff(&full, &tf);
    let tol = f32_tolerance(name);
    assert!(d < tol, "{name}: full logits differ from transformers by {d} (tolerance {tol})");
    let ours_err = max_abs_diff(&full, &exact);
    assert!(ours_err <= tf_noise.max(1e-4), "{name}: {ours_err} from f64, transformers is {tf_noise}");

    // Greedy decode with the cache (recurrent delta rule) reproduces tokens and logits.
    let want_tokens = g.ids("greedy_tokens");
    let want_decode = g.f32("logits_decode");
    let mut next = argmax(&full[(ids.len() - 1) * vocab..]);
    for (step, want) in want_tokens.iter().enumerate() {
        assert_eq!(next, *want, "{name}: greedy token {step}");
        let lg = m.forward(&[next], &mut cache, false).unwrap();
        let d = max_abs_diff(&lg, &want_decode[step * vocab..(step + 1) * vocab]);
        assert!(d < tol, "{name}: decode step {step} logits differ by {d}");
        next = argmax(&lg);
    }
    assert_eq!(cache.len(), ids.len() + want_tokens.len());

    // A prefill split in two (100 + 50) equals one pass.
    let mut c2 = m.new_cache();
    let mut split = m.forward(&ids[..100], &mut c2, true).unwrap();
    split.extend(m.forward(&ids[100..], &mut c2, true).unwrap());
    let d = max_abs_diff(&split, &g.f32("logits_split_prefill"));
    assert!(d < tol, "{name}: split prefill differs by {d}");
    let d = max_abs_diff(&split, &full);
    assert!(d < tol, "{name}: split prefill differs from one pass by {d}");
}

#[test]
fn tiny_f32_matches_transformers_full_cached_split_and_greedy() {
    check_f32_fixture("qwen35-tiny");
}

#[test]
fn wrapper_untied_irregular_layers_dk_ne_dv_sharded_matches_transformers() {
    check_f32_fixture("qwen35-wrapper-untied");
}

/// f32 noise of transformers on a fixture (its distance to the f64 run), floored at 1e-4.
fn f32_tolerance(name: &str) -> f32 {
    let g = Golden::open(name);
    1e-4f32.max(1.5 * max_abs_diff(&g.f32("logits_full"), &g.f32("logits_full_f64")))
}

#[test]
fn cached_prefill_plus_decode_equals_uncached_run() {
    let tol = f32_tolerance("qwen35-tiny");
    let m = Qwen35::from_safetensors(&fixture("qwen35-tiny")).unwrap();
    let ids: Vec<u32> = (0..70).map(|i| (i * 37 % 1000 + 3) as u32).collect();
    let mut c = m.new_cache();
    let all = m.forward(&ids, &mut c, true).unwrap();
    let mut c2 = m.new_cache();
    m.forward(&ids[..60], &mut c2, false).unwrap();
    let vocab = m.vocab_size();
    for (i, &id) in ids[60..].iter().enumerate() {
        let lg = m.forward(&[id], &mut c2, false).unwrap();
        let d = max_abs_diff(&lg, &all[(60 + i) * vocab..(61 + i) * vocab]);
        assert!(d < tol, "position {}: {d} (tolerance {tol})", 60 + i);
    }
}

/// bf16 runs differ by rounding order; compare each position's logits relative to that
/// row's largest logit (bf16 keeps 8 bits of mantissa), and the argmax.
fn check_bf16(model: &Qwen35, golden: &[f32], ids: &[u32]) {
    let mut c = model.new_cache();
    let lg = model.forward(ids, &mut c, true).unwrap();
    let vocab = model.vocab_size();
    let (mut within, mut agree, mut worst) = (0, 0, 0f32);
    for t in 0..ids.len() {
        let (a, b) = (&lg[t * vocab..(t + 1) * vocab], &golden[t * vocab..(t + 1) * vocab]);
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let rel = max_abs_diff(a, b) / scale;
        worst = worst.max(rel);
        within += (rel <= 2e-2) as usize;
        agree += (argmax(a) == argmax(b)) as usize;
    }
    let n = ids.len();
    assert!(within * 100 >= 95 * n, "only {within}/{n} positions within 2e-2 relative");
    assert!(worst < 5e-2, "worst position is {worst} relative");
    assert!(agree * 100 >= 95 * n, "top-1 agrees on only {agree}/{n} positions");
}

#[test]
fn bf16_checkpoint_matches_transformers_bf16_run() {
    let m = Qwen35::from_safetensors(&fixture("qwen35-tiny-bf16")).unwrap();
    assert_eq!(m.embed_tokens.dtype, DType::BF16);
    let g = Golden::open("qwen35-tiny-bf16");
    check_bf16(&m, &g.f32("logits_full_bf16"), &g.ids("input_ids"));
}
