//! The candle Qwen3.5 policy computes what frognano-model's inference Qwen3.5 computes and what
//! transformers computed (committed golden logits), its gradients match finite differences
//! (f64) through gated attention, the conv, the delta rule and every norm, and LoRA / merged
//! saves keep Hugging Face names (including the `model.language_model.` wrapper prefix).

use candle_core::{DType, Device, Tensor};
use frognano_rl::policy::{LoraConfig, Policy, PolicyOptions, SaveFormat};

use crate::common;
use common::{engine_logits, fixture, max_abs_diff, rows};

/// `input_ids`, `logits_full` (transformers 5.23, f32, CPU) and `logits_full_f64` (the same in
/// f64: the exact result) of a golden file.
fn golden(name: &str) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
    let bytes = std::fs::read(fixture(&format!("{name}.golden.safetensors"))).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let ids = st.tensor("input_ids").unwrap();
    let ids = ids.data().chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32).collect();
    let f32s = |key: &str| -> Vec<f32> {
        let t = st.tensor(key).unwrap();
        t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
    };
    (ids, f32s("logits_full"), f32s("logits_full_f64"))
}

#[test]
fn tiny_qwen35_matches_engine_and_transformers() {
    let (ids, tf, exact) = golden("qwen35-tiny");
    let p = Policy::load(&fixture("qwen35-tiny"), &PolicyOptions::default()).unwrap();
    assert_eq!(p.arch(), "qwen3_5");
    let ids = &ids[..]; // 150 tokens: two full chunks of the delta rule and a ragged tail
    let got = rows(&p.logits(ids).unwrap());
    let n = ids.len() * p.vocab_size();
    let (tf, exact) = (&tf[..n], &exact[..n]);
    // transformers' own f32 run is this far from the exact (f64) result; logits reach ~50, so
    // f32 rounding alone exceeds 1e-4. We must be as close to the exact result as that.
    let noise = max_abs_diff(tf, exact);
    let tol = 1e-4f32.max(1.5 * noise);
    let d_exact = max_abs_diff(&got, exact);
    assert!(d_exact < tol, "candle vs exact: {d_exact} (transformers f32 is {noise} from it)");
    let d_tf = max_abs_diff(&got, tf);
    assert!(d_tf < 2.0 * tol, "candle vs transformers f32: {d_tf}");
    let reference = frognano_model::load(fixture("qwen35-tiny").to_str().unwrap()).unwrap();
    let d_engine = max_abs_diff(&got, &engine_logits(reference.model.as_ref(), ids));
    assert!(d_engine < 2.0 * tol, "candle vs frognano-model: {d_engine}");
    let d_inf = max_abs_diff(&got, &engine_logits(p.inference_model().unwrap().as_ref(), ids));
    assert!(d_inf < 2.0 * tol, "candle vs its own inference model: {d_inf}");
    // A q8_0 inference model samples from nearly the same distribution.
    let q8 = p.inference_model_quantized(Some(frognano_model::quant::QuantType::Q8_0)).unwrap();
    let d_q8 = max_abs_diff(&got, &engine_logits(q8.as_ref(), ids));
    // It is the model `frognano run --quant q8_0` runs.
    let want_q8 = frognano_model::load::load_quantized(
        fixture("qwen35-tiny").to_str().unwrap(),
        Some(frognano_model::quant::QuantType::Q8_0),
    )
    .unwrap();
    let d_same = max_abs_diff(&engine_logits(q8.as_ref(), ids), &engine_logits(want_q8.model.as_ref(), ids));
    assert!(d_q8 > 0.0 && d_same < 1e-3, "q8_0 inference model: {d_same} from --quant q8_0 ({d_q8} from f32)");
    eprintln!("qwen35-tiny, 150 tokens: |candle − f64| {d_exact}, |candle − transformers| {d_tf}, |candle − engine| {d_engine}; transformers noise {noise}");
}

#[test]
fn wrapper_untied_checkpoint_keeps_its_prefix_and_round_trips() {
    let (ids, tf, exact) = golden("qwen35-wrapper-untied");
    let opts = PolicyOptions {
        lora: Some(LoraConfig {
            rank: 2,
            alpha: 4.0,
            targets: vec!["q_proj".into(), "in_proj_qkv".into(), "out_proj".into(), "gate_proj".into()],
        }),
        seed: 1,
        ..Default::default()
    };
    let p = Policy::load(&fixture("qwen35-wrapper-untied"), &opts).unwrap();
    let ids = &ids[..40];
    let vocab = p.vocab_size();
    let got = rows(&p.logits(ids).unwrap());
    let n = ids.len() * vocab;
    // f32 through five layers (candle's summation order, the chunked delta rule) lands ~1e-4
    // from the exact result on this fixture; transformers' f32 run is closer only by luck of order.
    let tol = 2e-4f32.max(1.5 * max_abs_diff(&tf[..n], &exact[..n]));
    let d = max_abs_diff(&got, &exact[..n]);
    assert!(d < tol, "LoRA starts at the base model: {d} from the exact logits (tolerance {tol})");
    let names: Vec<String> = p.params().into_iter().map(|x| x.0).collect();
    assert!(names.iter().all(|n| n.starts_with("base_model.model.model.language_model.layers.")), "{names:?}");
    assert!(names.iter().any(|n| n.contains("linear_attn.in_proj_qkv.lora_A")));
    assert!(names.iter().any(|n| n.contains("linear_attn.out_proj.lora_B")));
    // Non-zero adapters, then merged save → frognano-model sees the same model.
    for (i, (n, v)) in p.params().iter().enumerate() {
        if n.ends_with("lora_B.weight") {
            let data: Vec<f32> = (0..v.elem_count()).map(|j| (((i + j * 7) % 11) as f32 - 5.0) * 0.02).collect();
            v.set(&Tensor::from_vec(data, v.dims(), &Device::Cpu).unwrap()).unwrap();
        }
    }
    let adapted = rows(&p.logits(ids).unwrap());
    assert!(max_abs_diff(&adapted, &got) > 1e-3);
    // Saved over a copy of the sharded source: the old index and shards must go.
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture("qwen35-wrapper-untied")).unwrap() {
        let src = e.unwrap().path();
        std::fs::copy(&src, dir.path().join(src.file_name().unwrap())).unwrap();
    }
    p.save(dir.path(), SaveFormat::Merged).unwrap();
    assert!(!dir.path().join("model-00001-of-00002.safetensors").exists());
    assert!(!dir.path().join("model.safetensors.index.json").exists());
    let back = frognano_model::load(dir.path().to_str().unwrap()).unwrap();
    let d = max_abs_diff(&engine_logits(back.model.as_ref(), ids), &adapted);
    assert!(d < 1e-4, "merged checkpoint vs policy: {d}");
    let header = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&header).unwrap();
    assert!(st.names().iter().any(|n| n.starts_with("model.language_model.layers.")));
    assert!(st.names().contains(&"lm_head.weight"));
    // Full fine-tuning names of the wrapper keep its prefix too.
    let full = Policy::load(dir.path(), &PolicyOptions::default()).unwrap();
    assert_eq!(full.params()[0].0, "model.language_model.embed_tokens.weight");
    assert!(max_abs_diff(&rows(&full.logits(ids).unwrap()), &adapted) < 1e-4);
}

#[test]
fn qwen35_full_gradient_matches_finite_differences() {
    let p = Policy::load(&fixture("qwen35-tiny"), &PolicyOptions { dtype: DType::F64, ..Default::default() }).unwrap();
    let input = [5u32, 900, 17, 3, 250, 17, 8];
    let targets = [900u32, 17, 3, 250, 17, 8, 1];
    let w = Tensor::new(&[0.5f64, -1.0, 0.8, 1.2, -0.3, 1.0, 0.6], &Device::Cpu).unwrap();
    let loss = |p: &Policy| (p.token_logprobs(&input, &targets).unwrap() * &w).unwrap().sum_all().unwrap();
    let params = p.params();
    let grads = loss(&p).backward().unwrap();
    // Every kind of weight: DeltaNet (layer 0), gated attention (layer 3), norms, head.
    let checked = [
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.linear_attn.in_proj_qkv.weight",
        "model.layers.0.linear_attn.in_proj_z.weight",
        "model.layers.0.linear_attn.in_proj_b.weight",
        "model.layers.0.linear_attn.in_proj_a.weight",
        "model.layers.0.linear_attn.conv1d.weight",
        "model.layers.0.linear_attn.dt_bias",
        "model.layers.0.linear_attn.A_log",
        "model.layers.0.linear_attn.norm.weight",
        "model.layers.0.linear_attn.out_proj.weight",
        "model.layers.3.self_attn.q_proj.weight",
        "model.layers.3.self_attn.k_proj.weight",
        "model.layers.3.self_attn.v_proj.weight",
        "model.layers.3.self_attn.q_norm.weight",
        "model.layers.3.self_attn.k_norm.weight",
        "model.layers.3.self_attn.o_proj.weight",
        "model.layers.5.mlp.down_proj.weight",
        "model.norm.weight",
    ];
    for name in checked {
        let (_, var) = params.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no param {name}"));
        let g: Vec<f64> = grads.get(var).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let base = var.as_tensor().copy().unwrap();
        let flat: Vec<f64> = base.flatten_all().unwrap().to_vec1().unwrap();
        let mut idx: Vec<usize> = (0..flat.len()).collect();
        idx.sort_by(|a, b| g[*b].abs().total_cmp(&g[*a].abs()));
        idx.truncate(2);
        if name.ends_with("q_proj.weight") {
            // Rows dh..2·dh of each head are the output gate (head 1's gate row 5, column 7).
            let (dh, d): (usize, usize) = (32, 64);
            idx.push((2 * dh + dh + 5) * d + 7);
            idx.push(5 * d + 7); // and head 0's query row 5
        }
        for i in idx {
            let at = |d: f64| {
                let mut f = flat.clone();
                f[i] += d;
                var.set(&Tensor::from_vec(f, base.dims(), &Device::Cpu).unwrap()).unwrap();
                let l = loss(&p).to_scalar::<f64>().unwrap();
                var.set(&base).unwrap();
                l
            };
            let fd = (at(1e-6) - at(-1e-6)) / 2e-6;
            assert!(g[i].abs() > 1e-9, "{name}: zero gradient");
            assert!((fd - g[i]).abs() < 1e-5 * (1.0 + fd.abs()), "{name}[{i}]: autograd {} vs fd {fd}", g[i]);
        }
    }
}

#[test]
fn qwen35_lora_gradient_matches_finite_differences() {
    let lora = LoraConfig {
        rank: 2,
        alpha: 4.0,
        targets: ["q_proj", "v_proj", "in_proj_qkv", "in_proj_z", "in_proj_a", "out_proj", "up_proj"]
            .map(String::from)
            .to_vec(),
    };
    let opts = PolicyOptions { lora: Some(lora), dtype: DType::F64, seed: 4 };
    let p = Policy::load(&fixture("qwen35-tiny"), &opts).unwrap();
    for (i, (n, v)) in p.params().iter().enumerate() {
        if n.ends_with("lora_B.weight") {
            let data: Vec<f64> = (0..v.elem_count()).map(|j| (((i + j * 5) % 13) as f64 - 6.0) * 0.03).collect();
            v.set(&Tensor::from_vec(data, v.dims(), &Device::Cpu).unwrap()).unwrap();
        }
    }
    let input = [7u32, 300, 12, 12, 801];
    let targets = [300u32, 12, 12, 801, 2];
    let loss = |p: &Policy| p.token_logprobs(&input, &targets).unwrap().sum_all().unwrap();
    let grads = loss(&p).backward().unwrap();
    let params = p.params();
    for (name, var) in params.iter().filter(|(n, _)| n.contains("layers.0.") || n.contains("layers.3.")) {
        let g: Vec<f64> = grads.get(var).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let base = var.as_tensor().copy().unwrap();
        let flat: Vec<f64> = base.flatten_all().unwrap().to_vec1().unwrap();
        let i = (0..flat.len()).max_by(|a, b| g[*a].abs().total_cmp(&g[*b].abs())).unwrap();
        let at = |d: f64| {
            let mut f = flat.clone();
            f[i] += d;
            var.set(&Tensor::from_vec(f, base.dims(), &Device::Cpu).unwrap()).unwrap();
            let l = loss(&p).to_scalar::<f64>().unwrap();
            var.set(&base).unwrap();
            l
        };
        let fd = (at(1e-6) - at(-1e-6)) / 2e-6;
        assert!(g[i].abs() > 1e-9, "{name}: zero gradient");
        assert!((fd - g[i]).abs() < 1e-5 * (1.0 + fd.abs()), "{name}[{i}]: autograd {} vs fd {fd}", g[i]);
    }
}
