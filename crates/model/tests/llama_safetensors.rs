//! A Hugging Face `LlamaForCausalLM` checkpoint folder (model_type `"llama"`, HF names, q/k
//! rows in `rotate_half` layout) loads through `frognano_model::load` and computes what a plain
//! f64 transcription of transformers' `LlamaForCausalLM` computes.

use std::collections::HashMap;
use std::path::Path;

use rand::{Rng, SeedableRng};

struct Spec {
    d: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    dh: usize,
    ffn: usize,
    vocab: usize,
    eps: f64,
    theta: f64,
}

const SPEC: Spec =
    Spec { d: 32, layers: 2, heads: 4, kv_heads: 2, dh: 8, ffn: 48, vocab: 64, eps: 1e-5, theta: 10000.0 };

/// Random HF-named weights (`[out, in]`), as f32.
fn weights(s: &Spec, tied: bool, seed: u64) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, scale: f32, offset: f32| {
        let n = shape.iter().product();
        let v = (0..n).map(|_| offset + rng.random_range(-scale..scale)).collect();
        out.push((name, shape, v));
    };
    add("model.embed_tokens.weight".into(), vec![s.vocab, s.d], 1.0, 0.0);
    for i in 0..s.layers {
        let p = |n: &str| format!("model.layers.{i}.{n}");
        let (q, kv) = (s.heads * s.dh, s.kv_heads * s.dh);
        add(p("input_layernorm.weight"), vec![s.d], 0.2, 1.0);
        add(p("self_attn.q_proj.weight"), vec![q, s.d], 0.3, 0.0);
        add(p("self_attn.k_proj.weight"), vec![kv, s.d], 0.3, 0.0);
        add(p("self_attn.v_proj.weight"), vec![kv, s.d], 0.3, 0.0);
        add(p("self_attn.o_proj.weight"), vec![s.d, q], 0.3, 0.0);
        add(p("post_attention_layernorm.weight"), vec![s.d], 0.2, 1.0);
        add(p("mlp.gate_proj.weight"), vec![s.ffn, s.d], 0.3, 0.0);
        add(p("mlp.up_proj.weight"), vec![s.ffn, s.d], 0.3, 0.0);
        add(p("mlp.down_proj.weight"), vec![s.d, s.ffn], 0.3, 0.0);
    }
    add("model.norm.weight".into(), vec![s.d], 0.2, 1.0);
    if !tied {
        add("lm_head.weight".into(), vec![s.vocab, s.d], 0.5, 0.0);
    }
    out
}

fn write_checkpoint(dir: &Path, s: &Spec, w: &[(String, Vec<usize>, Vec<f32>)], tied: bool) {
    let cfg = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": s.d,
        "intermediate_size": s.ffn,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.dh,
        "vocab_size": s.vocab,
        "rms_norm_eps": s.eps,
        "rope_theta": s.theta,
        "max_position_embeddings": 256,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "eos_token_id": 2,
        "rope_scaling": null,
    });
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = w
        .iter()
        .map(|(n, shape, v)| (n.clone(), shape.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = bytes
        .iter()
        .map(|(n, shape, b)| {
            (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), b).unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

/// transformers' LlamaForCausalLM forward, transcribed in f64: logits `[T, vocab]`.
fn reference(s: &Spec, w: &HashMap<String, Vec<f64>>, ids: &[u32], tied: bool) -> Vec<f64> {
    let t = ids.len();
    let linear = |x: &[f64], name: &str, rows: usize, cols: usize| -> Vec<f64> {
        let m = &w[name];
        let mut y = vec![0.0; t * rows];
        for i in 0..t {
            for r in 0..rows {
                y[i * rows + r] = (0..cols).map(|c| x[i * cols + c] * m[r * cols + c]).sum();
            }
        }
        y
    };
    let norm = |x: &[f64], name: &str| -> Vec<f64> {
        let g = &w[name];
        x.chunks(s.d)
            .flat_map(|r| {
                let inv = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / s.d as f64 + s.eps).sqrt();
                r.iter().zip(g).map(move |(v, g)| v * inv * g).collect::<Vec<_>>()
            })
            .collect()
    };
    let rope = |x: &mut [f64], heads: usize| {
        let half = s.dh / 2;
        for i in 0..t {
            for h in 0..heads {
                let v = &mut x[(i * heads + h) * s.dh..(i * heads + h + 1) * s.dh];
                for j in 0..half {
                    let a = i as f64 / s.theta.powf(2.0 * j as f64 / s.dh as f64);
                    let (c, sn) = (a.cos(), a.sin());
                    let (x0, x1) = (v[j], v[j + half]);
                    v[j] = x0 * c - x1 * sn;
                    v[j + half] = x1 * c + x0 * sn;
                }
            }
        }
    };
    let emb = &w["model.embed_tokens.weight"];
    let mut h: Vec<f64> = ids.iter().flat_map(|&id| emb[id as usize * s.d..(id as usize + 1) * s.d].to_vec()).collect();
    let (qd, kvd) = (s.heads * s.dh, s.kv_heads * s.dh);
    for l in 0..s.layers {
        let p = |n: &str| format!("model.layers.{l}.{n}");
        let x = norm(&h, &p("input_layernorm.weight"));
        let mut q = linear(&x, &p("self_attn.q_proj.weight"), qd, s.d);
        let mut k = linear(&x, &p("self_attn.k_proj.weight"), kvd, s.d);
        let v = linear(&x, &p("self_attn.v_proj.weight"), kvd, s.d);
        rope(&mut q, s.heads);
        rope(&mut k, s.kv_heads);
        let mut o = vec![0.0; t * qd];
        let g = s.heads / s.kv_heads;
        for i in 0..t {
            for hq in 0..s.heads {
                let kh = hq / g;
                let qv = &q[(i * s.heads + hq) * s.dh..][..s.dh];
                let sc: Vec<f64> = (0..=i)
                    .map(|j| {
                        let kv = &k[(j * s.kv_heads + kh) * s.dh..][..s.dh];
                        qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f64>() / (s.dh as f64).sqrt()
                    })
                    .collect();
                let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, p) in e.iter().enumerate() {
                    for c in 0..s.dh {
                        o[(i * s.heads + hq) * s.dh + c] += p / z * v[(j * s.kv_heads + kh) * s.dh + c];
                    }
                }
            }
        }
        let a = linear(&o, &p("self_attn.o_proj.weight"), s.d, qd);
        h.iter_mut().zip(&a).for_each(|(h, a)| *h += a);
        let x = norm(&h, &p("post_attention_layernorm.weight"));
        let gt = linear(&x, &p("mlp.gate_proj.weight"), s.ffn, s.d);
        let up = linear(&x, &p("mlp.up_proj.weight"), s.ffn, s.d);
        let act: Vec<f64> = gt.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
        let y = linear(&act, &p("mlp.down_proj.weight"), s.d, s.ffn);
        h.iter_mut().zip(&y).for_each(|(h, y)| *h += y);
    }
    let x = norm(&h, "model.norm.weight");
    linear(&x, if tied { "model.embed_tokens.weight" } else { "lm_head.weight" }, s.vocab, s.d)
}

fn check(tied: bool, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let w = weights(&SPEC, tied, seed);
    write_checkpoint(dir.path(), &SPEC, &w, tied);
    let m = frognano_model::load(dir.path().to_str().unwrap()).unwrap();
    assert_eq!(m.eos_ids, vec![2]);
    let ids: Vec<u32> = (0..12).map(|i| (i * 29 + 5) % SPEC.vocab as u32).collect();
    let mut cache = m.model.new_cache();
    let got = m.model.forward(&ids, &mut cache, true).unwrap();
    let wf: HashMap<String, Vec<f64>> =
        w.iter().map(|(n, _, v)| (n.clone(), v.iter().map(|&x| x as f64).collect())).collect();
    let want = reference(&SPEC, &wf, &ids, tied);
    let diff = got.iter().zip(&want).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
    let scale = want.iter().map(|v| v.abs()).fold(0.0, f64::max);
    // The llama path keeps llama.cpp's f16 KV cache, so agreement is to f16 precision.
    assert!(diff < 2e-3 * scale.max(1.0), "max |logit diff| {diff} (logit scale {scale})");
    // Decoding token by token after a prefix continues the same computation.
    let mut c2 = m.model.new_cache();
    m.model.forward(&ids[..8], &mut c2, false).unwrap();
    let last = m.model.forward(&ids[8..], &mut c2, false).unwrap();
    let v = SPEC.vocab;
    let full_last = &got[(ids.len() - 1) * v..];
    let d2 = last.iter().zip(full_last).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    assert!(d2 < 1e-3 * scale.max(1.0) as f32, "cached continuation differs by {d2}");
}

#[test]
fn hf_llama_folder_matches_transformers_math_tied() {
    check(true, 1);
}

#[test]
fn hf_llama_folder_matches_transformers_math_untied() {
    check(false, 2);
}

#[test]
fn hf_llama_without_lm_head_when_untied_names_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = weights(&SPEC, false, 3);
    w.retain(|(n, _, _)| n != "lm_head.weight");
    write_checkpoint(dir.path(), &SPEC, &w, false);
    let e = frognano_model::load(dir.path().to_str().unwrap()).err().expect("must fail").to_string();
    assert!(e.contains("lm_head.weight"), "{e}");
}

#[test]
fn hf_llama_wrong_shape_names_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = weights(&SPEC, true, 4);
    let e = w.iter_mut().find(|(n, _, _)| n == "model.layers.1.mlp.up_proj.weight").unwrap();
    e.1 = vec![SPEC.ffn - 1, SPEC.d];
    e.2.truncate((SPEC.ffn - 1) * SPEC.d);
    write_checkpoint(dir.path(), &SPEC, &w, true);
    let e = frognano_model::load(dir.path().to_str().unwrap()).err().expect("must fail").to_string();
    assert!(e.contains("model.layers.1.mlp.up_proj.weight") && e.contains("model.safetensors"), "{e}");
}
