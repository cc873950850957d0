//! The flags a llama.cpp user types, through the binary on the demo model: `-t/--threads`,
//! `-f/--file`, `--ignore-eos`, `-c/--ctx-size`, `-n`, `--temp`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_frognano"));
    c.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    c
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn ok(out: &Output) -> (String, String) {
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "exit {:?}\nstdout: {stdout}\nstderr: {stderr}", out.status);
    (stdout.into_owned(), stderr.into_owned())
}

fn failed(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "expected a failure; stderr: {stderr}");
    stderr
}

/// The number of tokens decoded, from the `--stats` line (`… | decode N tokens …`).
fn decoded(stderr: &str) -> usize {
    let at = stderr.find("| decode ").unwrap_or_else(|| panic!("no --stats line in {stderr}"));
    stderr[at + 9..].split(' ').next().unwrap().parse().unwrap()
}

#[test]
fn ignore_eos_generates_exactly_n_tokens_where_the_model_would_have_stopped() {
    let Some(demo) = frognano_testkit::demo_model() else { return };
    let demo = demo.to_str().unwrap();
    let base = ["run", demo, "--chat", "-p", "Hi", "--temp", "0", "-n", "40", "--stats"];
    let (plain, plain_err) = ok(&run(&base));
    // The model ends its greeting well before 40 tokens.
    let stopped = decoded(&plain_err);
    assert!(stopped < 40, "the model was meant to stop early: {plain_err}");
    assert!(plain_err.contains("finish Stop"), "{plain_err}");
    let (long, long_err) = ok(&run(&[&base[..], &["--ignore-eos"]].concat()));
    assert_eq!(decoded(&long_err), 40, "{long_err}");
    assert!(long_err.contains("finish Length"), "{long_err}");
    // Greedy, the same reply up to where it stopped, and more after it.
    assert!(long.starts_with(plain.trim_end()), "--ignore-eos {long:?} does not extend {plain:?}");
    assert!(long.trim_end().len() > plain.trim_end().len(), "{long:?} vs {plain:?}");
}

#[test]
fn the_prompt_can_come_from_a_file() {
    let Some(demo) = frognano_testkit::demo_model() else { return };
    let demo = demo.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    let prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n    return";
    // An editor's trailing newline is dropped, as llama.cpp's -f does.
    std::fs::write(&file, format!("{prompt}\n")).unwrap();
    let file = file.to_str().unwrap();
    let greedy = ["--temperature", "0", "--max-tokens", "12"];
    let (from_flag, _) = ok(&run(&[&["run", demo, "-p", prompt][..], &greedy].concat()));
    let (from_file, _) = ok(&run(&[&["run", demo, "-f", file][..], &greedy].concat()));
    assert_eq!(from_file, from_flag);
    let (long_name, _) = ok(&run(&[&["run", demo, "--file", file][..], &greedy].concat()));
    assert_eq!(long_name, from_flag);

    // A missing file is named; -p and -f together are refused; an empty file is named.
    let missing = dir.path().join("no-such-prompt.txt");
    let err = failed(&run(&["run", demo, "-f", missing.to_str().unwrap()]));
    assert!(err.contains("no-such-prompt.txt") && err.contains("No such file"), "{err}");
    let err = failed(&run(&["run", demo, "-f", file, "-p", "x"]));
    assert!(err.contains("'--file <PATH>' cannot be used with '--prompt <PROMPT>'"), "{err}");
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "\n").unwrap();
    let err = failed(&run(&["run", demo, "-f", empty.to_str().unwrap()]));
    assert!(err.contains("empty.txt (-f) is empty"), "{err}");
}

#[test]
fn chat_reads_its_system_message_from_a_file() {
    let Some(demo) = frognano_testkit::demo_model() else { return };
    let demo = demo.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let system = dir.path().join("system.txt");
    // One that visibly moves a 135M model's greedy answer (a one-word instruction does not).
    std::fs::write(&system, "Always answer in French.").unwrap();
    let chat = |extra: &[&str]| {
        let mut c = bin();
        c.args([&["chat", demo, "--temp", "0", "-n", "16"][..], extra].concat());
        c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        use std::io::Write;
        // A chat refused at start (a missing -f file) exits before reading its input.
        let _ = child.stdin.take().unwrap().write_all(b"What is the capital of France?\n\n");
        child.wait_with_output().unwrap()
    };
    let (plain, _) = ok(&chat(&[]));
    let (with_file, _) = ok(&chat(&["-f", system.to_str().unwrap()]));
    let (with_flag, _) = ok(&chat(&["--system", &std::fs::read_to_string(&system).unwrap()]));
    assert_eq!(with_file, with_flag, "-f gives the same system message as --system");
    assert_ne!(with_file, plain, "the system message from the file reached the model");
    let err = failed(&chat(&["-f", dir.path().join("gone.txt").to_str().unwrap()]));
    assert!(err.contains("gone.txt"), "{err}");
}

#[test]
fn ctx_size_refuses_a_prompt_that_does_not_fit_and_stops_a_reply_that_fills_it() {
    let Some(demo) = frognano_testkit::demo_model() else { return };
    let demo = demo.to_str().unwrap();
    let prompt = "1, 2, 3, 4, 5, 6,"; // 17 tokens
    let err = failed(&run(&["run", demo, "-p", prompt, "-c", "17"]));
    assert!(
        err.contains("the prompt is 17 tokens, but the context holds 17 (-c/--ctx-size): no room to generate"),
        "{err}"
    );
    // 17 prompt tokens in a context of 25: 8 tokens of reply, though -n allows 50.
    let (_, stderr) = ok(&run(&["run", demo, "-p", prompt, "--ctx-size", "25", "--temp", "0", "-n", "50", "--stats"]));
    assert_eq!(decoded(&stderr), 8, "{stderr}");
    assert!(stderr.contains("[context full: 25 tokens (-c/--ctx-size); generation stopped]"), "{stderr}");
    // When -n ends the reply first, nothing is said about the context.
    let (_, stderr) = ok(&run(&["run", demo, "-p", prompt, "-c", "25", "--temp", "0", "-n", "5", "--stats"]));
    assert_eq!(decoded(&stderr), 5, "{stderr}");
    assert!(!stderr.contains("context full"), "{stderr}");
    // Beyond the model's own context, or zero: named errors.
    let err = failed(&run(&["run", demo, "-p", prompt, "-c", "100000000"]));
    assert!(err.contains("-c/--ctx-size 100000000 is larger than the model's context of 8192 tokens"), "{err}");
    let err = failed(&run(&["run", demo, "-p", prompt, "-c", "0"]));
    assert!(err.contains("-c/--ctx-size must be at least 1"), "{err}");
}

/// `--stats` gives no decode rate with fewer than two tokens: the rate is the tokens after the
/// first over the time after it, and `-n 0` / `-n 1` printed 10⁹ tok/s.
#[test]
fn stats_give_no_decode_rate_without_two_tokens() {
    let Some(demo) = frognano_testkit::demo_model() else { return };
    let demo = demo.to_str().unwrap();
    for (n, want) in [("0", "| decode 0 tokens - tok/s |"), ("1", "| decode 1 tokens - tok/s |")] {
        let (_, stderr) = ok(&run(&["run", demo, "-p", "Hi", "--temp", "0", "--ignore-eos", "-n", n, "--stats"]));
        assert!(stderr.contains(want), "-n {n}: {stderr}");
    }
    let (_, stderr) = ok(&run(&["run", demo, "-p", "Hi", "--temp", "0", "--ignore-eos", "-n", "3", "--stats"]));
    let rate = stderr.split("| decode 3 tokens ").nth(1).and_then(|r| r.split(' ').next()).unwrap_or("");
    assert!(rate.parse::<f64>().is_ok_and(|r| r > 0.0 && r < 1e6), "-n 3: {stderr}");
}

#[test]
fn threads_size_the_pool_the_model_runs_on() {
    let Some(demo) = frognano_testkit::demo_model() else { return };
    let demo = demo.to_str().unwrap();
    for (flag, n, said) in [("-t", "1", "| 1 thread"), ("--threads", "3", "| 3 threads")] {
        let (_, stderr) = ok(&run(&["run", demo, "-p", "Hi", "-n", "2", flag, n, "--stats"]));
        assert!(stderr.contains(said), "{flag} {n}: {stderr}");
    }
    // Every command that runs a model takes the flag, and checks it.
    for cmd in [
        &["run", demo][..],
        &["chat", demo],
        &["logits", demo, "--ids", "1"],
        &["serve", demo],
        &["solve", "--model", demo],
        &["eval", "run", "--model", demo],
        &["synth", "calibrate", "--model", demo, "--tasks", "t.jsonl"],
        &["train", "--toy"],
    ] {
        let err = failed(&run(&[cmd, &["-t", "0"]].concat()));
        assert!(
            err.contains("invalid value '0' for '--threads <N>': the thread count must be at least 1"),
            "{cmd:?}: {err}"
        );
    }
}

/// `serve -t 3 -c 64` says so when it starts (the old `--ctx` still works).
#[test]
fn serve_reports_its_threads_and_context() {
    let Some(demo) = frognano_testkit::demo_model() else { return };
    let demo = demo.to_str().unwrap();
    for ctx_flag in ["-c", "--ctx"] {
        let mut child = bin()
            .args(["serve", demo, "--port", "0", "-t", "3", ctx_flag, "64"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Warnings about the template may come first; the startup line is the one naming the URL.
        let line = BufReader::new(child.stderr.take().unwrap())
            .lines()
            .map(Result::unwrap)
            .find(|l| l.starts_with("frognano serve: model"))
            .unwrap_or_default();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(line.contains("(context 64 tokens, 4 concurrent, 3 threads,"), "{ctx_flag}: {line}");
    }
}

/// `chat --session FILE`: a second run with the same file goes on with the conversation
/// (its messages and the model's state, nothing prefilled again) and says the same as one
/// sitting; a FILE saved with another cache type is refused and left as it is.
#[test]
fn chat_with_a_session_file_goes_on_where_it_stopped() {
    let Some(demo) = frognano_testkit::demo_model() else { return };
    let demo = demo.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("talk.fnstate");
    let chat = |input: &str, extra: &[&str]| {
        let mut c = bin();
        c.args([&["chat", demo, "--temp", "0", "-n", "12"][..], extra].concat());
        c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        use std::io::Write;
        // A chat refused at start exits before reading its input.
        let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
        child.wait_with_output().unwrap()
    };
    let session = ["--session", file.to_str().unwrap()];
    let (first, _) = ok(&chat("What is the capital of France?\n\n", &session));
    assert!(file.exists(), "the conversation is saved after the reply");
    let (second, said) = ok(&chat("And of Italy?\n\n", &session));
    assert!(said.contains("resumed 2 messages") && said.contains("nothing prefilled again"), "{said}");
    let (together, _) = ok(&chat("What is the capital of France?\nAnd of Italy?\n\n", &[]));
    assert_eq!(format!("{first}{second}"), together, "two sittings say what one does");

    let before = std::fs::read(&file).unwrap();
    let err = failed(&chat("Hi\n\n", &[&session[..], &["--kv-cache", "q8_0"]].concat()));
    assert!(err.contains("talk.fnstate") && err.contains("cannot resume") && err.contains("kv-cache"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), before, "the refused file is untouched");
}

/// `--speculative`: greedy text is the same with lookup drafts as without, `--stats` says how
/// many drafts held; `mtp` drafts with the tiny Qwen3.5 fixture's MTP head and keeps its greedy
/// text, is refused by name for a model without a head, and unknown modes are refused.
#[test]
fn speculative_lookup_and_mtp_keep_the_greedy_text() {
    let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/qwen35-tiny");
    let base = ["run", tiny, "-p", "alpha beta alpha beta", "--temp", "0", "-n", "24", "--stats"];
    let (plain, _) = ok(&run(&[&base[..], &["--speculative", "none"]].concat()));
    let (mtp, mtp_err) = ok(&run(&[&base[..], &["--speculative", "mtp"]].concat()));
    assert_eq!(mtp, plain, "mtp changed the greedy text");
    let line = mtp_err.lines().find(|l| l.starts_with("speculative mtp:")).unwrap_or_else(|| panic!("{mtp_err}"));
    assert!(line.contains("drafted tokens accepted"), "{line}");
    let err = failed(&run(&[&base[..], &["--speculative", "fast"]].concat()));
    assert!(err.contains("none, lookup, mtp or auto"), "{err}");

    let Some(demo) = frognano_testkit::demo_model() else { return };
    let demo = demo.to_str().unwrap();
    let prompt = "Repeat this line twice: the quick brown fox jumps over the lazy dog.";
    let base = ["run", demo, "--chat", "-p", prompt, "--temp", "0", "-n", "40", "--stats"];
    let (plain, plain_err) = ok(&run(&[&base[..], &["--speculative", "none"]].concat()));
    assert!(!plain_err.contains("speculative none"), "{plain_err}");
    let (spec, spec_err) = ok(&run(&[&base[..], &["--speculative", "lookup"]].concat()));
    assert_eq!(spec, plain, "lookup changed the greedy text");
    let line = spec_err.lines().find(|l| l.starts_with("speculative lookup:")).unwrap_or_else(|| panic!("{spec_err}"));
    assert!(line.contains("drafted tokens accepted"), "{line}");
    let err = failed(&run(&[&base[..], &["--speculative", "mtp"]].concat()));
    assert!(err.contains("no multi-token-prediction head") && err.contains("lookup or auto"), "{err}");
}
