//! Parity with the official grader: every case in `tests/parity/golden.json` was graded by
//! `swebench==5.0.2` (scripts/swe_parity.py); FrogNano must produce identical maps, verdicts
//! and byte-identical report files.

use std::path::{Path, PathBuf};

use frognano_swe::eval_script::rewrite_eval_script;
use frognano_swe::grading::{
    classify_infra_failure, compute_fail_to_pass, compute_pass_to_pass, eval_report, logs_eval_with,
    parse_test_exit_code, resolution_status, InfraTier,
};
use frognano_swe::instance::{parse_predictions, SweInstance};
use frognano_swe::parsers::{parse_log_with, ParseContext};
use frognano_swe::pytext::{before_first, read_text_strict};
use frognano_swe::report::{make_run_report, predictions_by_id, run_report_text, LOG_REPORT};
use serde_json::Value;

fn parity_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/parity")
}

fn golden() -> Value {
    let text = std::fs::read_to_string(parity_dir().join("golden.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn is_error(v: &Value) -> bool {
    v.get("error").is_some()
}

fn pairs(map: &frognano_swe::StatusMap) -> Value {
    map.iter().map(|(k, v)| Value::from(vec![k.clone(), v.clone()])).collect::<Vec<_>>().into()
}

/// Raw-parser keys are a registry name, or `name#instance_id#version` for a run with a spec.
fn check_raw(case: &str, key: &str, what: &str, text: &str, expected: &Value) -> usize {
    let mut parts = key.split('#');
    let parser = parts.next().unwrap();
    let ctx = match (parts.next(), parts.next()) {
        (Some(id), Some(v)) => ParseContext { instance_id: Some(id.into()), version: Some(v.into()) },
        _ => ParseContext::default(),
    };
    match (parse_log_with(parser, text, &ctx), is_error(expected)) {
        (Ok(m), false) => {
            assert_eq!(&pairs(&m), expected, "{case}: {parser} on {what}");
            0
        }
        (Err(_), true) => 0,
        (got, _) => panic!("{case}: {parser} on {what}: got {got:?}, swebench gave {expected}"),
    }
}

#[test]
fn parsers_grading_and_reports_match_swebench() {
    let g = golden();
    let cases = g["cases"].as_array().unwrap();
    assert!(cases.len() >= 30, "corpus too small");
    let mut compared = 0usize;
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let bytes = std::fs::read(parity_dir().join("logs").join(case["log"].as_str().unwrap())).unwrap();
        let text = read_text_strict(&bytes);
        if case.get("read_error").is_some() {
            assert!(text.is_err(), "{name}: Python could not read the log, we could");
        } else {
            let text = text.expect("log decodes");
            for (parser, exp) in case["raw"].as_object().unwrap() {
                compared += check_raw(name, parser, "whole log", &text, &exp["whole"]);
                if !exp["slice"].is_null() {
                    let after = text.split(">>>>> Start Test Output").nth(1).unwrap();
                    let slice = before_first(after, ">>>>> End Test Output");
                    compared += check_raw(name, parser, "slice", slice, &exp["slice"]);
                }
                compared += 1;
            }
            assert_eq!(
                parse_test_exit_code(&text).map(Value::from).unwrap_or(Value::Null),
                case["exit_code"],
                "{name}: exit code"
            );
            let classify = classify_infra_failure(&text).map(|(r, t)| {
                let tier = if t == InfraTier::Environment { "environment" } else { "ambiguous" };
                Value::from(vec![r, tier])
            });
            assert_eq!(classify.unwrap_or(Value::Null), case["classify"], "{name}: infra class");
        }
        for exp in case["instances"].as_array().unwrap() {
            let variant = exp["variant"].as_str().unwrap();
            let err = |field: &str, problem: String| frognano_swe::instance::InstanceError {
                source_name: name.into(),
                line: None,
                field: field.into(),
                problem,
            };
            let inst = SweInstance::from_json(exp["instance"].clone(), &err).unwrap();
            let spec = inst.grading_spec().unwrap();
            assert_eq!(
                rewrite_eval_script(inst.eval_script.as_deref().unwrap()),
                exp["eval_script"].as_str().unwrap(),
                "{name}/{variant}: eval script rewrite"
            );
            let le = &exp["logs_eval"];
            match read_text_strict(&bytes)
                .map_err(|_| ())
                .and_then(|t| logs_eval_with(&t, &spec.log_parser, &spec.context).map_err(|_| ()))
            {
                Ok((map, found)) => {
                    assert!(!is_error(le), "{name}/{variant}: swebench raised, we did not");
                    assert_eq!(pairs(&map), le["map"], "{name}/{variant}: logs_eval map");
                    assert_eq!(Value::from(found), le["found"], "{name}/{variant}: found");
                    if found {
                        let tr = frognano_swe::grading::eval_tests_report(
                            &map,
                            &spec.fail_to_pass,
                            &spec.pass_to_pass,
                            spec.eval_type,
                        );
                        assert_eq!(
                            serde_json::to_value(&tr).unwrap(),
                            exp["tests_report"],
                            "{name}/{variant}: tests report"
                        );
                        assert_eq!(resolution_status(&tr).as_str(), exp["resolution"], "{name}/{variant}: resolution");
                        // serde_json parses floats to within 1 ulp; the verdict itself is compared exactly above.
                        assert!((compute_fail_to_pass(&tr) - exp["f2p"].as_f64().unwrap()).abs() < 1e-12);
                        assert!((compute_pass_to_pass(&tr) - exp["p2p"].as_f64().unwrap()).abs() < 1e-12);
                    }
                }
                Err(()) => assert!(is_error(le), "{name}/{variant}: we raised, swebench did not: {le}"),
            }
            for (key, patch) in [("report_with_patch", Some("diff --git a/x b/x\n")), ("report_null_patch", None)] {
                let mut spec = spec.clone();
                spec.instance_id = inst.instance_id.clone();
                match (eval_report(&spec, patch, &bytes), &exp[key]) {
                    (Ok(grade), Value::String(text)) => assert_eq!(
                        &frognano_swe::report::instance_report_text(&grade.report),
                        text,
                        "{name}/{variant}: {key}"
                    ),
                    (Err(_), e) if is_error(e) => {}
                    (got, e) => panic!("{name}/{variant}: {key}: got {got:?}, swebench gave {e}"),
                }
            }
            compared += 1;
        }
    }
    assert!(compared > 300, "only {compared} comparisons");
}

#[test]
fn prediction_files_load_as_swebench_loads_them() {
    let g = golden();
    for case in g["predictions"].as_array().unwrap() {
        let file = case["file"].as_str().unwrap();
        let got = parse_predictions(case["content"].as_str().unwrap(), file);
        let want = &case["result"];
        match got {
            Ok(preds) => {
                let want = want.as_array().unwrap_or_else(|| panic!("{file}: swebench raised {want}"));
                assert_eq!(preds.len(), want.len(), "{file}");
                for (p, w) in preds.iter().zip(want) {
                    assert_eq!(p.instance_id, w["instance_id"].as_str().unwrap());
                    assert_eq!(p.model_patch.as_deref(), w["model_patch"].as_str());
                    assert_eq!(p.model_name_or_path, w["model_name_or_path"].as_str().unwrap());
                }
            }
            Err(e) => assert!(is_error(want), "{file}: we failed ({e}), swebench did not"),
        }
    }
}

#[test]
fn run_report_is_byte_identical() {
    let g = golden();
    let case = &g["run_report"];
    let run_id = case["run_id"].as_str().unwrap();
    let root = tempfile::tempdir().unwrap();
    let base = root.path().join("logs/run_evaluation").join(run_id).join("org__m");
    for (rel, content) in case["files"].as_object().unwrap() {
        let p = base.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content.as_str().unwrap()).unwrap();
    }
    let preds_text = serde_json::to_string(&case["predictions"]).unwrap();
    let preds = parse_predictions(&preds_text, "p.json").unwrap();
    let ids: Vec<String> =
        case["dataset"].as_array().unwrap().iter().map(|d| d["instance_id"].as_str().unwrap().to_string()).collect();
    let (report, file) = make_run_report(&predictions_by_id(&preds), &ids, run_id, root.path());
    assert_eq!(file, case["report_file"].as_str().unwrap());
    assert_eq!(run_report_text(&report), case["report_text"].as_str().unwrap());
    assert!(base.join("p__q-1").join(LOG_REPORT).exists());
}
