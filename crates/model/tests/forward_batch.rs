//! `CausalLm::forward_batch` (one decode step for several sequences, weights read once) gives
//! the same logits and leaves the same caches as running each sequence on its own.

use std::path::PathBuf;

use frognano_model::{load, CausalLm};

fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Sequences with prompts of different lengths (one empty) decode `steps` tokens greedily,
/// once all together through `forward_batch` and once each through `forward`; every step's
/// logits must agree within `tol` and pick the same token, and the caches must end equal.
fn batch_matches_single(model: &dyn CausalLm, prompts: &[Vec<u32>], first: &[u32], steps: usize, tol: f32) {
    let prefill = |p: &[u32]| {
        let mut c = model.new_cache();
        if !p.is_empty() {
            model.forward(p, &mut c, false).unwrap();
        }
        c
    };
    let mut batched: Vec<_> = prompts.iter().map(|p| prefill(p)).collect();
    let mut single: Vec<_> = prompts.iter().map(|p| prefill(p)).collect();
    let mut next_b = first.to_vec();
    let mut next_s = first.to_vec();
    for step in 0..steps {
        let mut batch: Vec<(u32, &mut _)> = next_b.iter().copied().zip(batched.iter_mut()).collect();
        let out_b = model.forward_batch(&mut batch).unwrap();
        assert_eq!(out_b.len(), prompts.len());
        for (i, (id, cache)) in next_s.iter_mut().zip(single.iter_mut()).enumerate() {
            let out_s = model.forward(&[*id], cache, false).unwrap();
            let d = max_abs_diff(&out_b[i], &out_s);
            assert!(d <= tol, "step {step}, sequence {i}: batched logits differ by {d} (tolerance {tol})");
            assert_eq!(argmax(&out_b[i]), argmax(&out_s), "step {step}, sequence {i}: different greedy token");
            *id = argmax(&out_s) as u32;
            next_b[i] = argmax(&out_b[i]) as u32;
        }
    }
    for (i, (b, s)) in batched.iter().zip(&single).enumerate() {
        assert_eq!(b.pos, s.pos, "sequence {i}: position");
        assert_eq!(b.pos, prompts[i].len() + steps);
    }
}

fn prompts(lens: &[usize]) -> Vec<Vec<u32>> {
    lens.iter().enumerate().map(|(s, &n)| (0..n).map(|i| ((i * 131 + s * 71) % 900 + 5) as u32).collect()).collect()
}

#[test]
fn qwen35_batched_decode_matches_per_sequence_decode() {
    let m = load(repo("fixtures/qwen35-tiny").to_str().unwrap()).unwrap().model;
    batch_matches_single(m.as_ref(), &prompts(&[0, 1, 9, 70]), &[11, 12, 13, 14], 6, 1e-5);
}

#[test]
fn qwen35_gguf_batched_decode_matches_per_sequence_decode() {
    let m = load(repo("fixtures/qwen35-tiny-bf16.gguf").to_str().unwrap()).unwrap().model;
    batch_matches_single(m.as_ref(), &prompts(&[3, 20, 1]), &[7, 8, 9], 4, 1e-4);
}

#[test]
fn an_out_of_vocabulary_id_fails_the_batch_and_changes_no_cache() {
    let m = load(repo("fixtures/qwen35-tiny").to_str().unwrap()).unwrap().model;
    let (mut a, mut b) = (m.new_cache(), m.new_cache());
    m.forward(&[5, 6], &mut a, false).unwrap();
    let bad = m.vocab_size() as u32;
    let err = m.forward_batch(&mut [(3, &mut a), (bad, &mut b)]).unwrap_err();
    assert!(err.to_string().contains("out of vocabulary"), "{err}");
    assert_eq!((a.pos, b.pos), (2, 0));
    assert!(m.forward_batch(&mut []).unwrap().is_empty());
}

#[test]
fn smollm2_batched_decode_matches_per_sequence_decode() {
    let p = repo("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !p.exists() {
        if std::env::var_os("FROGNANO_REQUIRE_FIXTURES").is_some() {
            panic!("{} is missing and FROGNANO_REQUIRE_FIXTURES is set", p.display());
        }
        frognano_model::test_support::report_skip(
            &p.display().to_string(),
            "smollm2_batched_decode_matches_per_sequence_decode (run scripts/fetch-demo-model.sh)",
        );
        return;
    }
    let m = load(p.to_str().unwrap()).unwrap().model;
    // Logits of SmolLM2 are O(10); a batched matmul may sum in another order than the
    // single-row kernel, so agreement is to rounding, with the same greedy tokens.
    batch_matches_single(m.as_ref(), &prompts(&[1, 12, 40, 5]), &[28, 1001, 330, 7], 5, 2e-3);
}
