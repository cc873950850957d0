//! LoRA: `B` starts at zero so the adapted model equals the base; PEFT names; gradients reach
//! only the adapters and match finite differences; merged saves reload through
//! `frognano_model::load` to the same logits; adapters and parameters round-trip exactly.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use frognano_rl::policy::{LlamaSpec, LoraConfig, Policy, PolicyOptions, SaveFormat};

use crate::common;
use common::{engine_logits, max_abs_diff, perturb_b, rows};

fn spec() -> LlamaSpec {
    LlamaSpec { tie_word_embeddings: false, ..LlamaSpec::tiny(80) }
}

fn lora_opts(seed: u64) -> PolicyOptions {
    PolicyOptions { lora: Some(LoraConfig { rank: 4, alpha: 8.0, ..Default::default() }), seed, ..Default::default() }
}

const IDS: [u32; 10] = [3, 14, 15, 9, 26, 53, 58, 9, 7, 79];

#[test]
fn lora_starts_at_the_base_model_with_peft_names() {
    let base = Policy::random_llama(&spec(), &PolicyOptions { seed: 5, ..Default::default() }).unwrap();
    let p = Policy::random_llama(&spec(), &lora_opts(5)).unwrap();
    assert_eq!(rows(&p.logits(&IDS).unwrap()), rows(&base.logits(&IDS).unwrap()));
    let params = p.params();
    assert_eq!(params.len(), 2 * 7 * 2, "A and B for 7 modules in 2 layers");
    assert_eq!(params[0].0, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    assert_eq!(params[1].0, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
    assert_eq!(params[0].1.dims(), &[4, 32]);
    assert_eq!(params[1].1.dims(), &[32, 4]);
    assert_eq!(params.last().unwrap().0, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
    for (n, v) in &params {
        if n.ends_with("lora_B.weight") {
            assert_eq!(v.as_tensor().abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap(), 0.0, "{n}");
        }
    }
    // Narrower targets.
    let only_q = PolicyOptions {
        lora: Some(LoraConfig { rank: 2, alpha: 2.0, targets: vec!["q_proj".into(), "down_proj".into()] }),
        ..Default::default()
    };
    let names: Vec<String> =
        Policy::random_llama(&spec(), &only_q).unwrap().params().into_iter().map(|p| p.0).collect();
    assert_eq!(names.len(), 8);
    assert!(names.iter().all(|n| n.contains("q_proj") || n.contains("down_proj")));
    // A target that matches nothing is an error, not a silent no-op.
    let bad = PolicyOptions {
        lora: Some(LoraConfig { targets: vec!["qkv".into()], ..Default::default() }),
        ..Default::default()
    };
    let e = Policy::random_llama(&spec(), &bad).err().unwrap().to_string();
    assert!(e.contains("qkv"), "{e}");
}

#[test]
fn lora_gradients_reach_only_adapters_and_match_finite_differences() {
    let opts = PolicyOptions { dtype: DType::F64, ..lora_opts(9) };
    let p = Policy::random_llama(&LlamaSpec { num_layers: 1, ..spec() }, &opts).unwrap();
    perturb_b(&p, 0.2);
    let input = [1u32, 2, 40, 7];
    let targets = [2u32, 40, 7, 70];
    let loss = |p: &Policy| p.token_logprobs(&input, &targets).unwrap().sum_all().unwrap();
    let grads = loss(&p).backward().unwrap();
    for (name, var) in p.params() {
        let g: Vec<f64> = grads.get(&var).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let base = var.as_tensor().copy().unwrap();
        let flat: Vec<f64> = base.flatten_all().unwrap().to_vec1().unwrap();
        for i in [0, flat.len() / 2, flat.len() - 1] {
            let at = |d: f64| {
                let mut f = flat.clone();
                f[i] += d;
                var.set(&Tensor::from_vec(f, base.dims(), &Device::Cpu).unwrap()).unwrap();
                let l = loss(&p).to_scalar::<f64>().unwrap();
                var.set(&base).unwrap();
                l
            };
            let fd = (at(1e-6) - at(-1e-6)) / 2e-6;
            assert!((fd - g[i]).abs() < 1e-6 * (1.0 + fd.abs()), "{name}[{i}]: autograd {} vs fd {fd}", g[i]);
        }
    }
}

#[test]
fn merged_save_reloads_through_frognano_model_to_equal_logits() {
    let p = Policy::random_llama(&spec(), &lora_opts(11)).unwrap();
    perturb_b(&p, 0.2);
    let ours = rows(&p.logits(&IDS).unwrap());
    let base = Policy::random_llama(&spec(), &PolicyOptions { seed: 11, ..Default::default() }).unwrap();
    assert!(max_abs_diff(&ours, &rows(&base.logits(&IDS).unwrap())) > 1e-4, "the adapters change the model");
    let engine = engine_logits(p.inference_model().unwrap().as_ref(), &IDS);
    let scale = engine.iter().map(|v| v.abs()).fold(0.0, f32::max);
    assert!(max_abs_diff(&ours, &engine) < 1e-3 * scale, "merged inference model");
    let dir = tempfile::tempdir().unwrap();
    p.save(dir.path(), SaveFormat::Merged).unwrap();
    let back = frognano_model::load(dir.path().to_str().unwrap()).unwrap();
    assert_eq!(engine_logits(back.model.as_ref(), &IDS), engine, "saved merged weights are exact");
    // The merged checkpoint is a plain (full) policy again.
    let full = Policy::load(dir.path(), &PolicyOptions::default()).unwrap();
    assert!(max_abs_diff(&rows(&full.logits(&IDS).unwrap()), &ours) < 1e-5);
    assert_eq!(full.params()[0].0, "model.embed_tokens.weight");
}

#[test]
fn adapter_save_and_set_params_round_trip_exactly() {
    let p = Policy::random_llama(&spec(), &lora_opts(13)).unwrap();
    perturb_b(&p, 0.2);
    let dir = tempfile::tempdir().unwrap();
    p.save(dir.path(), SaveFormat::Adapter).unwrap();
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(cfg["peft_type"], "LORA");
    assert_eq!(cfg["r"], 4);
    assert_eq!(cfg["lora_alpha"], 8.0);
    assert_eq!(cfg["target_modules"].as_array().unwrap().len(), 7);
    // A fresh policy on the same base with other adapter values becomes identical after
    // loading the adapter.
    let mut q = Policy::random_llama(&spec(), &lora_opts(13)).unwrap();
    for (_, v) in q.params() {
        v.set(&v.as_tensor().affine(0.5, 0.01).unwrap()).unwrap();
    }
    assert_ne!(rows(&q.params()[1].1), rows(&p.params()[1].1));
    q.load_params(&dir.path().join("adapter_model.safetensors")).unwrap();
    for ((na, va), (nb, vb)) in p.params().iter().zip(q.params()) {
        assert_eq!(na, &nb);
        assert_eq!(rows(va), rows(&vb), "{na}");
    }
    assert_eq!(rows(&q.logits(&IDS).unwrap()), rows(&p.logits(&IDS).unwrap()));
    // A full policy cannot write an adapter.
    let full = Policy::random_llama(&spec(), &PolicyOptions::default()).unwrap();
    assert!(full.save(dir.path(), SaveFormat::Adapter).is_err());
}

#[test]
fn bf16_base_keeps_f32_adapters_and_its_inference_model_agrees() {
    let opts = PolicyOptions { dtype: DType::BF16, ..lora_opts(31) };
    let p = Policy::random_llama(&spec(), &opts).unwrap();
    perturb_b(&p, 0.2);
    assert!(p.params().iter().all(|(_, v)| v.dtype() == DType::F32));
    let ours = rows(&p.logits(&IDS).unwrap());
    let engine = engine_logits(p.inference_model().unwrap().as_ref(), &IDS);
    let scale = engine.iter().map(|v| v.abs()).fold(0.0, f32::max);
    // The merged weights are rounded to bf16 for the engine.
    assert!(max_abs_diff(&ours, &engine) < 2e-2 * scale, "bf16 inference model");
    let dir = tempfile::tempdir().unwrap();
    p.save(dir.path(), SaveFormat::Merged).unwrap();
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["torch_dtype"], "bfloat16");
    let back = frognano_model::load(dir.path().to_str().unwrap()).unwrap();
    assert_eq!(engine_logits(back.model.as_ref(), &IDS), engine);
}

#[test]
fn full_params_save_then_set_params_is_exact_in_f32_and_bf16() {
    for dtype in [DType::F32, DType::BF16] {
        let opts = PolicyOptions { dtype, seed: 21, ..Default::default() };
        let p = Policy::random_llama(&spec(), &opts).unwrap();
        let f = tempfile::NamedTempFile::new().unwrap();
        p.save_params(f.path()).unwrap();
        let mut q = Policy::random_llama(&spec(), &PolicyOptions { seed: 22, ..opts.clone() }).unwrap();
        q.load_params(f.path()).unwrap();
        for ((na, va), (nb, vb)) in p.params().iter().zip(q.params()) {
            assert_eq!(na, &nb);
            assert_eq!(va.dtype(), dtype);
            assert_eq!(rows(va), rows(&vb), "{na}");
        }
        // set_params from an in-memory map too.
        let map: HashMap<String, Tensor> = p.params().into_iter().map(|(n, v)| (n, v.as_tensor().clone())).collect();
        let mut r = Policy::random_llama(&spec(), &PolicyOptions { seed: 23, ..opts }).unwrap();
        r.set_params(&map).unwrap();
        assert_eq!(rows(&r.logits(&IDS).unwrap()), rows(&p.logits(&IDS).unwrap()));
    }
}

/// Log-probability of `seq[1..]` after `seq[..i]` under an engine model.
fn engine_seq_logprob(m: &dyn frognano_model::CausalLm, seq: &[u32]) -> f32 {
    let lg = engine_logits(m, &seq[..seq.len() - 1]);
    let v = m.vocab_size();
    lg.chunks(v)
        .zip(&seq[1..])
        .map(|(r, &t)| {
            let mx = r.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            r[t as usize] - mx - r.iter().map(|x| (x - mx).exp()).sum::<f32>().ln()
        })
        .sum()
}

#[test]
fn a_few_gradient_steps_raise_the_sequence_logprob_and_reach_the_inference_model() {
    let seq: Vec<u32> = vec![1, 17, 42, 17, 42, 5, 60, 61, 62, 2];
    for (opts, lr) in [(PolicyOptions { seed: 2, ..Default::default() }, 0.01), (lora_opts(2), 0.01)] {
        let p = Policy::random_llama(&spec(), &opts).unwrap();
        let before = engine_seq_logprob(p.inference_model().unwrap().as_ref(), &seq);
        for _ in 0..15 {
            let lp = p.token_logprobs(&seq[..seq.len() - 1], &seq[1..]).unwrap().sum_all().unwrap();
            let grads = lp.backward().unwrap();
            for (name, v) in p.params() {
                let g = grads.get(&v).unwrap_or_else(|| panic!("no gradient for {name}"));
                // Adam-like step size: the gradient scaled to RMS 1 per tensor.
                let rms = g.sqr().unwrap().mean_all().unwrap().sqrt().unwrap().to_scalar::<f32>().unwrap();
                v.set(&(v.as_tensor() + (g * (lr / (rms as f64 + 1e-12))).unwrap()).unwrap()).unwrap();
            }
        }
        let ours = p.token_logprobs(&seq[..seq.len() - 1], &seq[1..]).unwrap().sum_all().unwrap();
        let after = engine_seq_logprob(p.inference_model().unwrap().as_ref(), &seq);
        assert!(after > before + 5.0, "lora {}: log-prob {before} → {after}", opts.lora.is_some());
        assert!((after - ours.to_scalar::<f32>().unwrap()).abs() < 1e-2, "engine and policy agree after training");
    }
}
