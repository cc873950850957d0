//! Qwen2 (q/k/v biases) and Qwen3 (per-head q/k norms) policies — the families of the small
//! coding models people train as agents, Qwen2.5-Coder among them — compute what
//! frognano-model's inference engine computes on the same checkpoint (which
//! `crates/model/tests/arch_llama_cpp.rs` holds to llama.cpp), from the Hugging Face folder
//! and from the GGUF file, and their merged saves load back as the same model.
//!
//! [`Policy::backward`] (one layer's activations at a time, the head only at needed tokens)
//! gives the gradients the whole autograd graph gives, for llama, Qwen2 and Qwen3.5, full
//! fine-tuning and LoRA.

use candle_core::{DType, Device, Tensor};
use frognano_rl::optim::GradSum;
use frognano_rl::policy::{LlamaSpec, LoraConfig, Policy, PolicyOptions, SaveFormat};

use crate::common;
use common::{engine_logits, fixture, max_abs_diff, perturb_b, rows};

fn scale(v: &[f32]) -> f32 {
    v.iter().map(|x| x.abs()).fold(0.0, f32::max)
}

const IDS: [u32; 14] = [465, 296, 70, 70, 10, 67, 14, 327, 421, 201, 261, 798, 296, 384];

#[test]
fn qwen2_and_qwen3_policies_match_the_engine_from_folder_and_gguf() {
    for (name, model_type) in [("qwen2-tiny", "qwen2"), ("qwen3-tiny", "qwen3")] {
        let folder = fixture(&format!("arch/{name}"));
        let p = Policy::load(&folder, &PolicyOptions::default()).unwrap();
        assert_eq!(p.arch(), model_type);
        let got = rows(&p.logits(&IDS).unwrap());
        let engine = frognano_model::load(folder.to_str().unwrap()).unwrap();
        let want = engine_logits(engine.model.as_ref(), &IDS);
        // The engine's f16 KV cache bounds agreement to ~1e-3 relative.
        let d = max_abs_diff(&got, &want);
        assert!(d < 2e-3 * scale(&want), "{name}: policy vs engine {d} (scale {})", scale(&want));
        // The same model from its GGUF file (q/k rows in Hugging Face order for both families).
        let g = Policy::load(&fixture(&format!("arch/{name}.gguf")), &PolicyOptions::default()).unwrap();
        assert_eq!(g.arch(), model_type);
        let from_gguf = rows(&g.logits(&IDS).unwrap());
        let d = max_abs_diff(&from_gguf, &got);
        assert!(d < 1e-2 * scale(&got), "{name}: GGUF vs folder policy {d}");
        // A merged save is the same model, loaded by the engine as its family.
        let dir = tempfile::tempdir().unwrap();
        g.save(dir.path(), SaveFormat::Merged).unwrap();
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap()).unwrap();
        assert_eq!(cfg["model_type"], model_type);
        let saved = frognano_model::load(dir.path().to_str().unwrap()).unwrap();
        let back = engine_logits(saved.model.as_ref(), &IDS);
        let d = max_abs_diff(&back, &from_gguf);
        assert!(d < 2e-3 * scale(&from_gguf), "{name}: saved vs policy {d}");
    }
}

/// Gradients of `Σ wᵢ·lpᵢ` (wᵢ = 0 where `needed` is false) through the whole graph, and
/// through [`Policy::backward`]; asserts they agree for every parameter.
fn assert_backward_matches(p: &Policy, input: &[u32], targets: &[u32], tol: f64, what: &str) {
    let dtype = p.params()[0].1.dtype();
    let w: Vec<f64> = (0..input.len()).map(|i| if i % 3 == 1 { 0.0 } else { 0.5 + (i % 5) as f64 * 0.3 }).collect();
    let needed: Vec<bool> = w.iter().map(|&x| x != 0.0).collect();
    let weights = Tensor::new(w.as_slice(), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
    let params = p.params();
    let whole = (p.token_logprobs(input, targets).unwrap() * &weights).unwrap().sum_all().unwrap();
    let want_loss = whole.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap();
    let whole = whole.backward().unwrap();
    let mut acc = GradSum::new(&params);
    let (loss, ()) = p
        .backward(input, targets, Some(&needed), |lp| Ok(((lp * &weights)?.sum_all()?, ())), &mut |g| acc.add(g))
        .unwrap();
    assert!((loss - want_loss).abs() < tol * (1.0 + want_loss.abs()), "{what}: loss {loss} vs {want_loss}");
    let got = acc.into_grads().unwrap();
    let mut reached = 0;
    for ((name, var), g) in params.iter().zip(got) {
        let want: Vec<f64> = match whole.get(var.as_tensor()) {
            Some(t) => t.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1().unwrap(),
            None => vec![0.0; var.elem_count()],
        };
        let g: Vec<f64> = g.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let big = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        if big > 0.0 {
            reached += 1;
        }
        let d = want.iter().zip(&g).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(d <= tol * (1.0 + big), "{what}: {name}: max |Δgrad| {d}, gradient scale {big}");
    }
    assert!(reached * 2 >= params.len(), "{what}: only {reached} of {} parameters got a gradient", params.len());
}

/// Every parameter set to deterministic non-zero values (LoRA `B` starts at zero, which
/// would leave `A` without gradient).
fn perturb(p: &Policy, amplitude: f64) {
    for (i, (_, v)) in p.params().iter().enumerate() {
        let n = v.elem_count();
        let data: Vec<f64> = (0..n).map(|j| (((i * 131 + j * 17) % 97) as f64 / 97.0 - 0.5) * amplitude).collect();
        let t = Tensor::from_vec(data, v.dims(), &Device::Cpu).unwrap().to_dtype(v.dtype()).unwrap();
        let t = if v.dims().len() == 1 { (t + 1.0).unwrap() } else { t };
        v.set(&t).unwrap();
    }
}

#[test]
fn layerwise_backward_gives_the_whole_graph_gradients() {
    let lora = |rank| Some(LoraConfig { rank, alpha: 2.0 * rank as f32, ..Default::default() });
    // Full fine-tuning of an untied llama, in f64: embedding, norms, head all reached.
    let spec = LlamaSpec { tie_word_embeddings: false, ..LlamaSpec::tiny(96) };
    let p = Policy::random_llama(&spec, &PolicyOptions { dtype: DType::F64, seed: 3, ..Default::default() }).unwrap();
    perturb(&p, 0.6);
    let input: Vec<u32> = (0..23).map(|i| (i * 37 + 11) % 96).collect();
    let targets: Vec<u32> = (0..23).map(|i| (i * 53 + 5) % 96).collect();
    assert_backward_matches(&p, &input, &targets, 1e-9, "llama full f64");
    // Tied head: the embedding's gradient comes from both ends.
    let p =
        Policy::random_llama(&LlamaSpec::tiny(96), &PolicyOptions { dtype: DType::F64, ..Default::default() }).unwrap();
    perturb(&p, 0.6);
    assert_backward_matches(&p, &input, &targets, 1e-9, "llama tied full f64");
    // Qwen2 with LoRA, f32 as training runs.
    let p = Policy::load(&fixture("arch/qwen2-tiny"), &PolicyOptions { lora: lora(4), ..Default::default() }).unwrap();
    perturb(&p, 0.4);
    assert_backward_matches(&p, &IDS[..13], &IDS[1..], 1e-4, "qwen2 lora f32");
    // Qwen3.5 (DeltaNet and gated attention layers) with LoRA, f64.
    let opts = PolicyOptions { lora: lora(2), dtype: DType::F64, ..Default::default() };
    let p = Policy::load(&fixture("qwen35-tiny"), &opts).unwrap();
    perturb(&p, 0.3);
    let ids: Vec<u32> = (0..40).map(|i| (i * 29 + 3) % 200).collect();
    assert_backward_matches(&p, &ids[..39], &ids[1..], 1e-9, "qwen35 lora f64");
}

#[test]
fn backward_rejects_bad_input_by_name() {
    let p = Policy::random_llama(&LlamaSpec::tiny(50), &PolicyOptions::default()).unwrap();
    let run = |input: &[u32], targets: &[u32], needed: Option<&[bool]>| {
        p.backward(input, targets, needed, |lp| Ok((lp.sum_all()?, ())), &mut |_| Ok(())).unwrap_err().to_string()
    };
    assert!(run(&[], &[], None).contains("no input tokens"));
    assert!(run(&[1, 2], &[2], None).contains("2 input tokens but 1 targets"));
    assert!(run(&[1, 2], &[2, 50], None).contains("target id 50 is out of vocabulary (vocab_size 50)"));
    assert!(run(&[1, 50], &[2, 3], None).contains("token id 50 is out of vocabulary (vocab_size 50)"));
    assert!(run(&[1, 2], &[2, 3], Some(&[true])).contains("2 targets but 1 entries in `needed`"));
}

#[test]
fn lora_on_a_gguf_samples_from_the_quantized_file_with_unmerged_adapters() {
    let lora =
        PolicyOptions { lora: Some(LoraConfig { rank: 4, alpha: 8.0, ..Default::default() }), ..Default::default() };
    // qwen2 (rows in Hugging Face order) and a llama-architecture file (q/k rows permuted by
    // llama.cpp's converter, so the q/k adapters must be permuted to land on the right rows).
    let files = [(fixture("arch/qwen2-tiny.gguf"), IDS.to_vec()), (fixture("arch/mistral-tiny.gguf"), IDS.to_vec())];
    for (file, ids) in files {
        let p = Policy::load(&file, &lora).unwrap();
        let base = engine_logits(p.inference_model().unwrap().as_ref(), &ids);
        let policy_base = rows(&p.logits(&ids).unwrap());
        perturb_b(&p, 0.3);
        let adapted = engine_logits(p.inference_model().unwrap().as_ref(), &ids);
        let policy_adapted = rows(&p.logits(&ids).unwrap());
        // The adapter's effect on the engine's logits is its effect on the trainer's: both
        // differences are taken within one side, so the file's quantization cancels.
        let engine_delta: Vec<f32> = adapted.iter().zip(&base).map(|(a, b)| a - b).collect();
        let policy_delta: Vec<f32> = policy_adapted.iter().zip(&policy_base).map(|(a, b)| a - b).collect();
        let effect = scale(&policy_delta);
        assert!(effect > 0.05, "{}: the adapters change the logits by only {effect}", file.display());
        let d = max_abs_diff(&engine_delta, &policy_delta);
        assert!(d < 0.1 * effect, "{}: engine's adapter effect differs by {d} (effect {effect})", file.display());
        // The sampler is the file's quantized model, not merged f32 weights.
        let merged = engine_logits(p.inference_model_quantized(None).unwrap().as_ref(), &ids);
        let d = max_abs_diff(&merged, &policy_adapted);
        assert!(d < 2e-3 * scale(&merged), "{}: merged f32 engine vs policy {d}", file.display());
    }
}
