//! `frognano run` and `frognano logits` as a user calls them.

use std::process::Command;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_frognano"));
    c.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    c
}

#[test]
fn logits_prints_one_row_per_position_matching_the_fixture() {
    let out = bin().args(["logits", "fixtures/qwen35-tiny", "--ids", "5,17,300"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["logits"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r.as_array().unwrap().len() == 1024));
    // The same ids again give the same numbers (no hidden state between runs).
    let again = bin().args(["logits", "fixtures/qwen35-tiny", "--ids", "5,17,300"]).output().unwrap();
    assert_eq!(out.stdout, again.stdout);
}

#[test]
fn greedy_run_is_deterministic_and_chat_mode_uses_the_template() {
    let run = |extra: &[&str]| {
        let mut args =
            vec!["run", "fixtures/qwen35-tiny", "-p", "Hello there", "--temperature", "0", "--max-tokens", "8"];
        args.extend_from_slice(extra);
        let out = bin().args(&args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let a = run(&[]);
    assert_eq!(a, run(&[]));
    assert!(!a.trim().is_empty());
    assert_ne!(a, run(&["--chat"]), "the chat template changes the prompt and so the output");
}

#[test]
fn bad_input_is_a_one_line_error_naming_the_problem() {
    let out = bin().args(["logits", "fixtures/qwen35-tiny", "--ids", "1,99999"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("token id 99999 is out of vocabulary"), "{err}");
    let out = bin().args(["run", "fixtures/does-not-exist", "-p", "x"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does-not-exist"));
    let out = bin().args(["run", "fixtures/qwen35-tiny", "-p", "x", "--top-p", "0"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("top_p"));
    let out = bin().args(["run", "fixtures/qwen35-tiny", "-p", "x", "--quant", "q3"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected q8_0 or q4_k"));
}

#[test]
fn quant_on_load_runs_and_stays_close_to_the_float_model() {
    let run = |extra: &[&str]| {
        let mut args =
            vec!["run", "fixtures/qwen35-tiny", "-p", "Hello there", "--temperature", "0", "--max-tokens", "4"];
        args.extend_from_slice(extra);
        let out = bin().args(&args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    // Q8_0 keeps 8 bits per weight: the first greedy tokens of the float model survive.
    let f = run(&[]);
    let q = run(&["--quant", "q8_0"]);
    assert_eq!(f.chars().next(), q.chars().next(), "float {f:?} vs q8_0 {q:?}");
}

#[test]
fn chat_keeps_the_conversation_and_reuses_the_earlier_turn() {
    use std::io::Write;
    let mut child = bin()
        .args(["chat", "fixtures/qwen35-tiny", "--temperature", "0", "--max-tokens", "5", "--stats"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"Hello there\nAnd then?\n\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    let reused: Vec<usize> =
        err.lines().filter_map(|l| l.split(" reused)").next()?.rsplit('(').next()?.parse().ok()).collect();
    assert_eq!(reused.len(), 2, "{err}");
    assert_eq!(reused[0], 0);
    assert!(reused[1] > 5, "the second turn reuses the first turn's prompt: {err}");
}
