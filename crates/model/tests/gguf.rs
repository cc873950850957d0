//! The GGUF reader and the block formats against the reference `gguf` Python package
//! (fixtures/gguf/quant-reference.gguf from scripts/make_gguf_fixtures.py), and corrupt files.

use std::path::PathBuf;
use std::sync::Arc;

use frognano_model::gguf::{GgufFile, MetaValue};
use frognano_model::quant::{self, QuantType};
use frognano_model::tensor::DType;
use rand::{Rng, SeedableRng};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

fn reference() -> GgufFile {
    GgufFile::open(fixture("gguf/quant-reference.gguf")).unwrap()
}

#[test]
fn reads_every_metadata_value_type() {
    let f = reference();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 64);
    let get = |k: &str| f.get(k).unwrap_or_else(|| panic!("{k} missing")).clone();
    assert_eq!(get("test.u8"), MetaValue::U8(200));
    assert_eq!(get("test.i8"), MetaValue::I8(-100));
    assert_eq!(get("test.u16"), MetaValue::U16(60000));
    assert_eq!(get("test.i16"), MetaValue::I16(-30000));
    assert_eq!(get("test.u32"), MetaValue::U32(4_000_000_000));
    assert_eq!(get("test.i32"), MetaValue::I32(-2_000_000_000));
    assert_eq!(get("test.f32"), MetaValue::F32(1.5));
    assert_eq!(get("test.bool"), MetaValue::Bool(true));
    assert_eq!(get("test.string"), MetaValue::String("héllo ✓".into()));
    assert_eq!(get("test.u64"), MetaValue::U64((1u64 << 63) + 5));
    assert_eq!(get("test.i64"), MetaValue::I64(-(1i64 << 62)));
    assert_eq!(get("test.f64"), MetaValue::F64(-2.25));
    assert_eq!(f.get_i64_array("test.array_i32").unwrap().unwrap(), vec![1, -2, 3]);
    assert_eq!(f.get_str_array("test.array_str").unwrap().unwrap(), vec!["a", "", "ccc"]);
    let nested = get("test.array_nested");
    let outer = nested.as_array().unwrap();
    assert_eq!(outer.len(), 2);
    assert_eq!(outer[0].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect::<Vec<_>>(), vec![1, 2]);
    // Typed getters name the key when the type is wrong.
    let e = f.get_str("test.u8").unwrap_err().to_string();
    assert!(e.contains("test.u8") && e.contains("string"), "{e}");
    assert_eq!(f.get_u64("general.alignment").unwrap(), Some(64));
    for t in f.tensors() {
        assert_eq!(t.start as u64 % 64, 0, "{} is not aligned", t.name);
    }
}

#[test]
fn dequantization_matches_gguf_py_for_every_block_format() {
    let f = reference();
    for ty in QuantType::ALL {
        let q = f.tensor(&format!("q.{ty}")).unwrap();
        assert_eq!(q.dtype, DType::Quant(ty));
        let (rows, cols) = (q.dims[1], q.dims[0]);
        let m = f.matrix(&format!("q.{ty}"), rows, cols).unwrap();
        let want = f.f32(&format!("deq.{ty}"), rows * cols).unwrap();
        let got = m.to_f32();
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-6, "{ty}: dequantized values differ from gguf-py by up to {worst}");
        // Row lookup (embeddings) agrees with the whole-matrix path.
        assert_eq!(m.row(rows - 1), want[(rows - 1) * cols..]);
    }
}

#[test]
fn q8_0_quantization_matches_gguf_py() {
    let f = reference();
    let src = f.f32("q8_0.src", 3 * 512).unwrap();
    let ours = quant::quantize::quantize(QuantType::Q8_0, &src);
    let theirs = f.tensor_bytes("q8_0.ref").unwrap();
    assert_eq!(ours.len(), theirs.len());
    let differing = ours.iter().zip(theirs).filter(|(a, b)| a != b).count();
    assert_eq!(differing, 0, "{differing} bytes differ from gguf-py's Q8_0");
}

#[test]
fn quantized_matmul_tracks_the_dequantized_product() {
    let f = reference();
    for ty in QuantType::ALL {
        let q = f.tensor(&format!("q.{ty}")).unwrap();
        let (rows, cols) = (q.dims[1], q.dims[0]);
        let m = f.matrix(&format!("q.{ty}"), rows, cols).unwrap();
        let w = f.f32(&format!("deq.{ty}"), rows * cols).unwrap();
        let x: Vec<f32> = (0..2 * cols).map(|i| ((i * 7 % 23) as f32 - 11.0) / 9.0).collect();
        let y = m.matmul(&x, 2);
        for t in 0..2 {
            for r in 0..rows {
                let terms = w[r * cols..(r + 1) * cols].iter().zip(&x[t * cols..(t + 1) * cols]);
                let exact: f32 = terms.clone().map(|(a, b)| a * b).sum();
                let scale: f32 = terms.map(|(a, b)| (a * b).abs()).sum();
                let got = y[t * rows + r];
                assert!((got - exact).abs() <= 0.02 * scale + 1e-6, "{ty} t={t} r={r}: {got} vs {exact}");
            }
        }
    }
}

fn parse(bytes: Vec<u8>) -> Result<GgufFile, String> {
    GgufFile::from_bytes(Arc::new(bytes), "corrupt.gguf").map_err(|e| e.to_string())
}

#[test]
fn corrupt_headers_are_clear_errors() {
    let good = std::fs::read(fixture("gguf/quant-reference.gguf")).unwrap();
    let mut bad = good.clone();
    bad[0] = b'X';
    assert!(parse(bad).unwrap_err().contains("not a GGUF file"));
    let mut bad = good.clone();
    bad[4..8].copy_from_slice(&7u32.to_le_bytes());
    assert!(parse(bad).unwrap_err().contains("unknown GGUF version 7"));
    let mut bad = good.clone();
    bad[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(parse(bad).unwrap_err().contains("big-endian"));
    let mut bad = good.clone();
    bad[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = parse(bad).unwrap_err();
    assert!(e.contains("tensor count") && e.contains("corrupt.gguf"), "{e}");
    let mut bad = good.clone();
    bad[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(parse(bad).unwrap_err().contains("metadata count"));
    // Cut in the data section: the last tensor runs past the end.
    let data_end = reference().tensors().iter().map(|t| t.start + t.len).max().unwrap();
    let e = parse(good[..data_end - 1].to_vec()).unwrap_err();
    assert!(e.contains("runs past the end") && e.contains("q8_0.ref"), "{e}");
    // Cut in the header.
    let e = parse(good[..100].to_vec()).unwrap_err();
    assert!(e.contains("truncated"), "{e}");
    assert!(parse(Vec::new()).unwrap_err().contains("truncated"));
}

#[test]
fn unknown_tensor_types_name_the_tensor_and_type() {
    let f = reference();
    let good = std::fs::read(fixture("gguf/quant-reference.gguf")).unwrap();
    // Find the type field of the first tensor info: name, n_dims, dims, then the type.
    let first = &f.tensors()[0];
    let needle = first.name.as_bytes();
    let at = good.windows(needle.len()).position(|w| w == needle).unwrap() + needle.len();
    let n_dims = u32::from_le_bytes(good[at..at + 4].try_into().unwrap()) as usize;
    let type_at = at + 4 + 8 * n_dims;
    for (id, want) in [(16u32, "IQ2_XXS"), (200, "unknown")] {
        let mut bad = good.clone();
        bad[type_at..type_at + 4].copy_from_slice(&id.to_le_bytes());
        let e = parse(bad).unwrap_err();
        assert!(e.contains(&first.name) && e.contains(want) && e.contains("not supported"), "{e}");
    }
    let mut bad = good.clone();
    bad[type_at + 4..type_at + 12].copy_from_slice(&3u64.to_le_bytes());
    assert!(parse(bad).unwrap_err().contains("not a multiple of the alignment"));
}

/// Randomized corruption: truncations at every header length and thousands of random byte
/// edits never panic; every failure is an error that names the file.
#[test]
fn random_corruption_never_panics() {
    let good = std::fs::read(fixture("gguf/quant-reference.gguf")).unwrap();
    let header_end = reference().tensors().iter().map(|t| t.start).min().unwrap();
    for cut in 0..header_end.min(4096) {
        let e = parse(good[..cut].to_vec()).unwrap_err();
        assert!(e.starts_with("corrupt.gguf"), "{e}");
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    for _ in 0..3000 {
        let mut b = good[..header_end].to_vec();
        for _ in 0..rng.random_range(1..4) {
            let i = rng.random_range(0..b.len());
            b[i] = match rng.random_range(0..3) {
                0 => rng.random(),
                1 => 0xFF,
                _ => b[i] ^ (1 << rng.random_range(0..8)),
            };
        }
        b.extend_from_slice(&good[header_end..]);
        if let Err(e) = parse(b) {
            assert!(e.starts_with("corrupt.gguf"), "{e}");
        }
    }
}
