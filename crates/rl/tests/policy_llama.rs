//! The candle llama policy computes what frognano-model's inference llama computes on the
//! same weights (a random tiny model, and the SmolLM2 demo GGUF), full-parameter gradients
//! match finite differences, and a merged checkpoint of a GGUF-sourced policy loads through
//! `frognano_model::load` with its tokenizer.

use candle_core::{DType, Tensor};
use frognano_rl::policy::{LlamaSpec, Policy, PolicyOptions, SaveFormat};

use crate::common;
use common::{engine_logits, max_abs_diff, rows};

/// Log-softmax of each `vocab`-wide row.
fn log_softmax(x: &[f32], vocab: usize) -> Vec<f32> {
    x.chunks(vocab)
        .flat_map(|r| {
            let m = r.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let lse = m + r.iter().map(|v| (v - m).exp()).sum::<f32>().ln();
            r.iter().map(move |v| v - lse).collect::<Vec<_>>()
        })
        .collect()
}

fn spec() -> LlamaSpec {
    LlamaSpec { tie_word_embeddings: false, ..LlamaSpec::tiny(96) }
}

#[test]
fn random_llama_matches_inference_engine_and_is_deterministic() {
    let opts = PolicyOptions { seed: 7, ..Default::default() };
    for spec in [spec(), LlamaSpec::tiny(96)] {
        let p = Policy::random_llama(&spec, &opts).unwrap();
        // Logits at init are tiny (std 0.02 weights); scale the output so the comparison means
        // something: the engine's f16 KV cache bounds agreement to ~1e-3 relative.
        let ids: Vec<u32> = (0..20).map(|i| (i * 37 + 11) % 96).collect();
        let got = rows(&p.logits(&ids).unwrap());
        let want = engine_logits(p.inference_model().unwrap().as_ref(), &ids);
        let scale = want.iter().map(|v| v.abs()).fold(0.0, f32::max);
        let diff = max_abs_diff(&got, &want);
        assert!(diff < 1e-3 * scale.max(1e-3) + 1e-6, "max diff {diff}, logit scale {scale}");
        // token_logprobs is log-softmax of those logits at the targets.
        let targets: Vec<u32> = ids[1..].iter().copied().chain([3]).collect();
        let lp = rows(&p.token_logprobs(&ids, &targets).unwrap());
        let ls = log_softmax(&got, 96);
        for (i, t) in targets.iter().enumerate() {
            assert!((lp[i] - ls[i * 96 + *t as usize]).abs() < 1e-5);
        }
    }
    let a = Policy::random_llama(&spec(), &opts).unwrap();
    let b = Policy::random_llama(&spec(), &opts).unwrap();
    let c = Policy::random_llama(&spec(), &PolicyOptions { seed: 8, ..Default::default() }).unwrap();
    let ids = [1u32, 2, 3];
    assert_eq!(rows(&a.logits(&ids).unwrap()), rows(&b.logits(&ids).unwrap()));
    assert_ne!(rows(&a.logits(&ids).unwrap()), rows(&c.logits(&ids).unwrap()));
}

#[test]
fn full_finetune_token_logprobs_gradient_matches_finite_differences() {
    let spec = LlamaSpec { num_layers: 1, hidden_size: 16, intermediate_size: 24, head_dim: 4, ..spec() };
    let p = Policy::random_llama(&spec, &PolicyOptions { dtype: DType::F64, seed: 3, ..Default::default() }).unwrap();
    let params = p.params();
    assert_eq!(params.len(), 12, "embed, 9 per layer, norm, lm_head");
    assert_eq!(params[0].0, "model.embed_tokens.weight");
    assert_eq!(params.last().unwrap().0, "lm_head.weight");
    // Larger weights than the init, so every piece has a visible effect.
    for (_, v) in &params {
        v.set(&(v.as_tensor() * 30.0).unwrap()).unwrap();
    }
    let input = [5u32, 17, 3, 60, 5, 9];
    let targets = [17u32, 3, 60, 5, 9, 1];
    let weights = Tensor::new(&[0.3f64, -1.0, 0.7, 1.1, -0.4, 0.9], &candle_core::Device::Cpu).unwrap();
    let loss =
        |p: &Policy| -> Tensor { (p.token_logprobs(&input, &targets).unwrap() * &weights).unwrap().sum_all().unwrap() };
    let grads = loss(&p).backward().unwrap();
    let eps = 1e-6;
    for (name, var) in &params {
        let g: Vec<f64> = grads
            .get(var)
            .unwrap_or_else(|| panic!("no gradient for {name}"))
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let base = var.as_tensor().copy().unwrap();
        let flat: Vec<f64> = base.flatten_all().unwrap().to_vec1().unwrap();
        // A few elements per parameter (the ones with the largest gradients, and one fixed).
        let mut idx: Vec<usize> = (0..flat.len()).collect();
        idx.sort_by(|a, b| g[*b].abs().total_cmp(&g[*a].abs()));
        idx.truncate(2);
        idx.push(flat.len() / 3);
        for i in idx {
            let at = |d: f64| -> f64 {
                let mut f = flat.clone();
                f[i] += d;
                var.set(&Tensor::from_vec(f, base.dims(), &candle_core::Device::Cpu).unwrap()).unwrap();
                let l = loss(&p).to_scalar::<f64>().unwrap();
                var.set(&base).unwrap();
                l
            };
            let fd = (at(eps) - at(-eps)) / (2.0 * eps);
            assert!(
                (fd - g[i]).abs() < 1e-5 * (1.0 + fd.abs()),
                "{name}[{i}]: autograd {} vs finite difference {fd}",
                g[i]
            );
        }
    }
}

#[test]
fn smollm2_gguf_policy_matches_engine_and_merged_save_loads_with_tokenizer() {
    let Some(gguf) = frognano_testkit::demo_model() else { return };
    let p = Policy::load(&gguf, &PolicyOptions::default()).unwrap();
    assert_eq!(p.arch(), "llama");
    let reference = frognano_model::load(gguf.to_str().unwrap()).unwrap();
    let tok = reference.tokenizer().unwrap();
    let ids = tok.encode("The frog sat on a lily pad and").unwrap();
    let vocab = p.vocab_size();
    let got = rows(&p.logits(&ids).unwrap());
    // Same f32 weights in the engine: agreement to the engine's f16 KV cache.
    let same = engine_logits(p.inference_model().unwrap().as_ref(), &ids);
    let scale = same.iter().map(|v| v.abs()).fold(0.0, f32::max);
    let d = max_abs_diff(&got, &same);
    assert!(d < 2e-3 * scale, "candle vs engine on the same f32 weights: {d} (scale {scale})");
    // The original Q4_1 engine (8-bit activations): close log-probs of its top token. Its
    // default kernels sum each dot in the packed order, and an 8-bit rounding that falls the
    // other way moves SmolLM2's logits by up to ~0.6 (llama.cpp moves by 0.8–1.2 between its
    // own batch and one-token paths); the top log-prob moved by at most 0.17 here, 0.09 with
    // the plain kernels.
    let q = engine_logits(reference.model.as_ref(), &ids);
    let (lg, lq) = (log_softmax(&got, vocab), log_softmax(&q, vocab));
    let mut worst = 0.0f32;
    for t in 0..ids.len() {
        let (a, b) = (&lg[t * vocab..(t + 1) * vocab], &lq[t * vocab..(t + 1) * vocab]);
        let am = |r: &[f32]| r.iter().enumerate().max_by(|x, y| x.1.total_cmp(y.1)).unwrap().0;
        let top = am(b);
        worst = worst.max((a[top] - b[top]).abs());
        assert!((a[top] - b[top]).abs() < 0.3, "position {t}: top log-prob {} vs {}", a[top], b[top]);
    }
    eprintln!("f32 policy vs the Q4_1 engine: top log-probs within {worst}");
    // Merged save (HF layout: q/k rows un-permuted) loads through frognano-model's HF path with
    // the tokenizer and chat template written from the GGUF metadata.
    let dir = tempfile::tempdir().unwrap();
    p.save(dir.path(), SaveFormat::Merged).unwrap();
    let back = frognano_model::load(dir.path().to_str().unwrap()).unwrap();
    let d2 = max_abs_diff(&engine_logits(back.model.as_ref(), &ids), &same);
    assert!(d2 < 1e-4 * scale, "reloaded merged checkpoint differs by {d2}");
    assert_eq!(back.tokenizer().unwrap().encode("The frog sat on a lily pad and").unwrap(), ids);
    assert!(back.chat_template.is_some(), "chat template carried over");
    assert_eq!(back.eos_ids, reference.eos_ids);
    // And the policy reloads from it to the same logits.
    let p2 = Policy::load(dir.path(), &PolicyOptions::default()).unwrap();
    assert_eq!(rows(&p2.logits(&ids[..4]).unwrap()), rows(&p.logits(&ids[..4]).unwrap()));
}
