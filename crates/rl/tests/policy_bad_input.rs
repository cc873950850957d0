//! Bad checkpoints, bad parameter files and bad token ids are errors that name the file and
//! the tensor (or the id); never a panic.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use frognano_rl::policy::{LlamaSpec, LoraConfig, Policy, PolicyOptions};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen35-tiny")
}

/// A copy of the tiny Qwen3.5 checkpoint whose weights pass through `edit` (name → tensor).
fn edited(edit: impl FnOnce(&mut HashMap<String, Tensor>)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture()).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    let path = dir.path().join("model.safetensors");
    let mut t = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    edit(&mut t);
    candle_core::safetensors::save(&t, &path).unwrap();
    dir
}

fn load_err(dir: &Path) -> String {
    match Policy::load(dir, &PolicyOptions::default()) {
        Ok(_) => panic!("{} loaded although it is broken", dir.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn missing_tensor_names_the_checkpoint_and_tensor() {
    let d = edited(|t| {
        t.remove("model.layers.2.linear_attn.A_log");
    });
    let e = load_err(d.path());
    assert!(e.contains("model.layers.2.linear_attn.A_log") && e.contains(d.path().to_str().unwrap()), "{e}");
}

#[test]
fn wrong_shape_names_the_file_tensor_and_shapes() {
    let d = edited(|t| {
        t.insert(
            "model.layers.3.self_attn.k_proj.weight".into(),
            Tensor::zeros((63, 64), candle_core::DType::F32, &Device::Cpu).unwrap(),
        );
    });
    let e = load_err(d.path());
    assert!(e.contains("model.layers.3.self_attn.k_proj.weight") && e.contains("model.safetensors"), "{e}");
    assert!(e.contains("63"), "found shape is named: {e}");
}

#[test]
fn unsupported_model_type_and_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), r#"{"model_type": "mamba9"}"#).unwrap();
    std::fs::copy(fixture().join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    let e = load_err(dir.path());
    assert!(e.contains("mamba9") && e.contains("config.json"), "{e}");
    let e = load_err(&dir.path().join("nope"));
    assert!(e.contains("nope"), "{e}");
    let e = match Policy::load(&dir.path().join("model.gguf"), &PolicyOptions::default()) {
        Ok(_) => panic!("loaded a missing file"),
        Err(e) => format!("{e:#}"),
    };
    assert!(e.contains("model.gguf"), "{e}");
}

#[test]
fn set_params_names_missing_and_misshapen_tensors_and_changes_nothing() {
    let spec = LlamaSpec::tiny(40);
    let opts = PolicyOptions { lora: Some(LoraConfig { rank: 2, ..Default::default() }), ..Default::default() };
    let mut p = Policy::random_llama(&spec, &opts).unwrap();
    let before: Vec<Vec<f32>> = p.params().iter().map(|(_, v)| v.flatten_all().unwrap().to_vec1().unwrap()).collect();
    let mut map: HashMap<String, Tensor> =
        p.params().into_iter().map(|(n, v)| (n, (v.as_tensor() + 1.0).unwrap())).collect();
    let victim = "base_model.model.model.layers.1.mlp.up_proj.lora_A.weight";
    let good = map.remove(victim).unwrap();
    let e = p.set_params(&map).unwrap_err().to_string();
    assert!(e.contains(victim) && e.contains("not found"), "{e}");
    map.insert(victim.into(), Tensor::zeros((3, 32), candle_core::DType::F32, &Device::Cpu).unwrap());
    let e = p.set_params(&map).unwrap_err().to_string();
    assert!(e.contains(victim) && e.contains("[3, 32]") && e.contains(&format!("{:?}", good.dims())), "{e}");
    let after: Vec<Vec<f32>> = p.params().iter().map(|(_, v)| v.flatten_all().unwrap().to_vec1().unwrap()).collect();
    assert_eq!(before, after, "a failed set_params changes nothing");
    // From a file: the error names the file as well.
    let f = tempfile::NamedTempFile::new().unwrap();
    map.remove(victim);
    candle_core::safetensors::save(&map, f.path()).unwrap();
    let e = format!("{:#}", p.load_params(f.path()).unwrap_err());
    assert!(e.contains(victim) && e.contains(f.path().to_str().unwrap()), "{e}");
    std::fs::write(f.path(), b"not safetensors").unwrap();
    let e = format!("{:#}", p.load_params(f.path()).unwrap_err());
    assert!(e.contains(f.path().to_str().unwrap()), "{e}");
}

#[test]
fn bad_token_ids_are_errors() {
    let p = Policy::random_llama(&LlamaSpec::tiny(40), &PolicyOptions::default()).unwrap();
    let e = p.token_logprobs(&[1, 40], &[2, 3]).unwrap_err().to_string();
    assert!(e.contains("40") && e.contains("vocab"), "{e}");
    let e = p.token_logprobs(&[1, 2], &[2, 99]).unwrap_err().to_string();
    assert!(e.contains("99"), "{e}");
    assert!(p.token_logprobs(&[1, 2], &[2]).is_err());
    assert!(p.token_logprobs(&[], &[]).is_err());
    let bad = LlamaSpec { num_kv_heads: 3, ..LlamaSpec::tiny(40) };
    assert!(Policy::random_llama(&bad, &PolicyOptions::default()).is_err());
}

/// The trainer's llama has no RoPE scaling, q/k norms or biases: checkpoints that need them
/// are refused by name instead of trained as something else.
#[test]
fn architectures_the_trainer_lacks_are_refused() {
    let arch = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/arch");
    let e = load_err(&arch.join("llama3-tiny"));
    assert!(e.contains("`rope_scaling`: RoPE scaling is not supported for training"), "{e}");
    let e = load_err(&arch.join("ministral3-tiny"));
    assert!(e.contains("model_type \"ministral3\" cannot be trained"), "{e}");
    let e = load_err(&arch.join("llama3-tiny.gguf"));
    assert!(e.contains("rope_freqs.weight"), "{e}");
    let e = load_err(&arch.join("ministral3-tiny.gguf"));
    assert!(e.contains("\"mistral3\" cannot be trained"), "{e}");
}
