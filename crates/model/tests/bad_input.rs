//! Broken checkpoints give a one-line error naming the file and the tensor or field; never a
//! panic.

use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen35-tiny")
}

/// A private copy of the tiny checkpoint to break.
fn copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture()).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    dir
}

fn load_err(dir: &Path) -> String {
    match frognano_model::load(dir.to_str().unwrap()) {
        Ok(_) => panic!("{} loaded although it is broken", dir.display()),
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "one line: {msg}");
            msg
        }
    }
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[test]
fn missing_weights_name_the_folder() {
    let d = copy();
    // Every shard goes (the fixture keeps its MTP head in a shard of its own).
    for entry in std::fs::read_dir(d.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let e = load_err(d.path());
    assert!(e.contains("no *.safetensors weight files") && e.contains(d.path().to_str().unwrap()), "{e}");
}

#[test]
fn a_truncated_weight_file_names_the_file() {
    let d = copy();
    let p = d.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("model.safetensors") && e.contains("not a valid safetensors file"), "{e}");
    std::fs::write(&p, &bytes[..5]).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("model.safetensors"), "{e}");
}

#[test]
fn a_shape_that_disagrees_with_config_names_the_tensor() {
    let d = copy();
    edit_config(d.path(), |v| v["intermediate_size"] = 256.into());
    let e = load_err(d.path());
    assert!(e.contains("model.layers.0.mlp.gate_proj.weight") && e.contains("[256, 64]"), "{e}");
    assert!(e.contains("config.json"), "{e}");
}

#[test]
fn a_missing_tensor_is_named() {
    let d = copy();
    edit_config(d.path(), |v| v["tie_word_embeddings"] = false.into());
    let e = load_err(d.path());
    assert!(e.contains("lm_head.weight"), "{e}");
}

#[test]
fn unknown_model_type_and_bad_fields_are_named() {
    let d = copy();
    edit_config(d.path(), |v| v["model_type"] = "mamba9".into());
    let e = load_err(d.path());
    assert!(e.contains("unknown model_type \"mamba9\"") && e.contains("config.json"), "{e}");
    let d = copy();
    edit_config(d.path(), |v| v["num_key_value_heads"] = "two".into());
    let e = load_err(d.path());
    assert!(e.contains("num_key_value_heads") && e.contains("expected a non-negative integer"), "{e}");
    let d = copy();
    edit_config(d.path(), |v| v["layer_types"] = serde_json::json!(["linear_attention"]));
    let e = load_err(d.path());
    assert!(e.contains("layer_types") && e.contains("num_hidden_layers"), "{e}");
    let d = copy();
    std::fs::write(d.path().join("config.json"), "{ not json").unwrap();
    let e = load_err(d.path());
    assert!(e.contains("config.json") && e.contains("invalid JSON"), "{e}");
}

#[test]
fn a_wrong_dtype_is_named() {
    // Rewrite the checkpoint with one tensor stored as int32.
    let d = copy();
    let p = d.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut views: Vec<(String, safetensors::tensor::TensorView)> = Vec::new();
    for (name, v) in st.tensors() {
        let dtype = if name == "model.norm.weight" { safetensors::Dtype::I32 } else { v.dtype() };
        views.push((name, safetensors::tensor::TensorView::new(dtype, v.shape().to_vec(), v.data()).unwrap()));
    }
    safetensors::tensor::serialize_to_file(views, None, &p).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("model.norm.weight") && e.contains("I32"), "{e}");
}

#[test]
fn a_missing_model_path_is_named() {
    let e = match frognano_model::load("no/such-model-folder-anywhere") {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("no/such-model-folder-anywhere"), "{e}");
}
