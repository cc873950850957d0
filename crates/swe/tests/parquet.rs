//! Parquet instance files: small fixtures written by pyarrow / Hugging Face `datasets`
//! (scripts/swe_parquet_fixtures.py) in the SWE-bench Verified and v5 layouts.

use std::path::{Path, PathBuf};

use frognano_swe::load_instances;
use frognano_swe::parquet::read_rows;
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parquet").join(name)
}

#[test]
fn rows_match_what_pyarrow_reads() {
    let expected: Value = serde_json::from_str(&std::fs::read_to_string(fixture("expected.json")).unwrap()).unwrap();
    for (name, rows) in expected.as_object().unwrap() {
        let got = read_rows(&std::fs::read(fixture(&format!("{name}.parquet"))).unwrap()).unwrap();
        let got: Vec<Value> = got.into_iter().map(Value::Object).collect();
        assert_eq!(&Value::Array(got), rows, "{name}.parquet");
    }
}

#[test]
fn verified_layout_loads_as_instances() {
    let insts = load_instances(&fixture("verified.parquet")).unwrap();
    assert_eq!(insts.len(), 6);
    let i = &insts[1];
    assert_eq!(i.instance_id, "django__django-12908");
    assert_eq!(i.repo, "django/django");
    assert_eq!(i.version, "3.0");
    assert_eq!(i.fail_to_pass, vec!["tests/test_m1.py::test_fix[1]"]);
    assert_eq!(i.pass_to_pass, vec!["tests/test_m1.py::test_keep_0"]);
    assert_eq!(i.extra["difficulty"], "15 min - 1 hour");
    assert!(i.problem_statement.contains("ünïcode — 😀"));
    assert_eq!(i.parser_name().unwrap(), "parse_log_django");
}

#[test]
fn v5_fields_lists_and_nulls_load() {
    for f in ["v5_lists.parquet", "v5_legacy_lists.parquet"] {
        let insts = load_instances(&fixture(f)).unwrap();
        assert_eq!(insts.len(), 7, "{f}");
        assert_eq!(insts[2].pass_to_pass, vec!["tests/test_m2.py::test_keep_0", "tests/test_m2.py::test_keep_1"]);
        assert_eq!(insts[0].pass_to_pass, Vec::<String>::new());
        assert_eq!(insts[1].eval_type.as_deref(), Some("fail_only"));
        assert_eq!(insts[1].log_parser.as_deref(), Some("parse_log_gotest"));
        assert_eq!(insts[2].hints_text, "");
        assert_eq!(insts[1].extra["image_assets"], Value::Null);
        assert!(insts[0].extra["image_assets"].as_str().unwrap().contains("a.png"));
        assert_eq!(insts[3].extra["num_tests"], Value::Null);
        assert!(insts[6].image.as_deref().unwrap().contains("_1776_"));
    }
}

#[test]
fn malformed_row_names_row_index_and_field() {
    let e = load_instances(&fixture("malformed.parquet")).unwrap_err().to_string();
    assert!(e.contains("malformed.parquet row 2: field `FAIL_TO_PASS`: JSON-encoded string does not parse"), "{e}");
}

#[test]
fn unsupported_codec_and_non_parquet_are_errors() {
    let e = load_instances(&fixture("zstd.parquet")).unwrap_err().to_string();
    assert!(e.contains("compression ZSTD is not supported"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.parquet");
    std::fs::write(&p, b"not parquet at all").unwrap();
    assert!(load_instances(&p).unwrap_err().to_string().contains("no PAR1 magic"));
    // Truncations anywhere never panic.
    let bytes = std::fs::read(fixture("verified.parquet")).unwrap();
    for cut in (0..bytes.len()).step_by(97) {
        let mut b = bytes[..cut].to_vec();
        b.extend_from_slice(&bytes[bytes.len() - 8..]);
        let _ = read_rows(&b);
    }
}
