//! `frognano review` in a real browser: Debian's chromium, headless, driven through
//! chromedriver (WebDriver). Two real `frognano solve` runs (recorded tool calls replayed in
//! the sandbox) on a small Python repository are listed, one is opened (steps, Edit diffs,
//! the patch), applied (the repository changes), the other refused (it no longer applies)
//! and rejected, and the applied one is sent back with a comment: a scripted model continues
//! its conversation in a new run that streams its steps live and starts from the old run's
//! history. Eval and train run folders and bad runs get their pages too.
//!
//! With FROGNANO_REVIEW_SCREENSHOTS=DIR the pages are saved there as review-*.png (how
//! docs/review-*.png were made).

use fantoccini::{Client, ClientBuilder, Locator};
use frognano_agent::solve::{ModelChoice, SolveConfig, TaskInput};
use frognano_agent::trajectory::{ExitReason, Trajectory, FORMAT};
use frognano_protocol::{ChatRequest, Completion, FinishReason, Llm, LlmError, Message, ToolCall, Usage};
use frognano_review::{ReviewConfig, ReviewServer};
use frognano_sandbox::{Isolation, Sandbox};
use frognano_testkit::{commit, git, write};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

const ISSUE: &str = "# median() is wrong for even-length lists\n\nmedian([1, 2, 3, 4]) returns 3; it should return 2.5, the mean of the two middle values.\n";
const STATS: &str = "def mean(xs):\n    return sum(xs) / len(xs)\n\n\ndef median(xs):\n    xs = sorted(xs)\n    return xs[len(xs) // 2]\n";
const COMMENT: &str = "Also raise ValueError for an empty list instead of an IndexError.";

fn call(name: &str, args: Value) -> ToolCall {
    ToolCall::new(name, args.to_string())
}

fn reply(text: Option<&str>, thinking: Option<&str>, calls: Vec<ToolCall>) -> Message {
    Message::assistant_reply(text.map(str::to_string), thinking.map(str::to_string), calls)
}

/// A trajectory file holding `replies` for `frognano solve --replay`.
fn recorded(dir: &Path, name: &str, replies: Vec<Message>) -> PathBuf {
    let mut messages = vec![Message::system("recorded"), Message::user(ISSUE)];
    messages.extend(replies);
    let t = Trajectory {
        trajectory_format: FORMAT.into(),
        trajectory_id: "0".repeat(32),
        instance_id: "median".into(),
        seed: 0,
        messages,
        tools: vec![],
        steps: vec![],
        n_steps: 0,
        exit_reason: ExitReason::Agent,
        error: None,
        final_message: String::new(),
        context_tokens: 0,
        elapsed_sec: 0.0,
        output_patch: String::new(),
        partial: false,
    };
    let path = dir.join(format!("{name}.json"));
    t.save(&path).unwrap();
    path
}

fn isolation() -> Isolation {
    if Sandbox::bubblewrap_available().is_ok() {
        Isolation::Bubblewrap
    } else {
        Isolation::Unconfined
    }
}

/// A real `frognano solve` run replaying `replies` on `repo`, written to `out`.
fn solve_replay(repo: &Path, scratch: &Path, out: &Path, replies: Vec<Message>) {
    let replay = recorded(scratch, &out.file_name().unwrap().to_string_lossy(), replies);
    let config = SolveConfig {
        task: TaskInput::Recorded,
        model: ModelChoice::Replay(replay),
        output: Some(out.to_path_buf()),
        isolation: isolation(),
        ..SolveConfig::for_repo(repo)
    };
    frognano_agent::solve::solve(&config).unwrap();
}

/// The model a run is sent back to: plays `replies` in order, records every request's
/// messages, and holds its second reply until `gate` opens (so the run is seen live).
struct Scripted {
    replies: VecDeque<Message>,
    seen: Arc<Mutex<Vec<Vec<Message>>>>,
    gate: Option<mpsc::Receiver<()>>,
}

impl Llm for Scripted {
    fn complete(&mut self, request: &ChatRequest<'_>) -> Result<Completion, LlmError> {
        let n = {
            let mut seen = self.seen.lock().unwrap();
            seen.push(request.messages.to_vec());
            seen.len()
        };
        if n == 2 {
            if let Some(gate) = &self.gate {
                let _ = gate.recv_timeout(Duration::from_secs(120));
            }
        }
        let message = self.replies.pop_front().ok_or_else(|| LlmError::Other("the script is over".into()))?;
        let finish_reason = if message.calls().is_empty() { FinishReason::Stop } else { FinishReason::ToolCalls };
        Ok(Completion {
            message,
            finish_reason,
            usage: Some(Usage { prompt_tokens: 900 + n as u64, completion_tokens: 40, cached_tokens: 0 }),
        })
    }
    fn describe(&self) -> String {
        "scripted model".into()
    }
}

/// chromedriver, ended when the test ends.
struct Driver(std::process::Child);
impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn browser_status() -> Result<(), String> {
    for tool in ["chromium", "chromedriver"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        if !found {
            return Err(format!("{tool} is not installed (Debian: apt-get install chromium chromium-driver)"));
        }
    }
    Ok(())
}

async fn wait_css(c: &Client, css: &str) -> fantoccini::elements::Element {
    c.wait()
        .at_most(Duration::from_secs(40))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("the page never showed {css}: {e}"))
}

/// Whether a WebDriver error is only that the page re-rendered the element meanwhile.
fn stale(e: &fantoccini::error::CmdError) -> bool {
    format!("{e:?}").contains("StaleElementReference")
}

/// The text of the element `css` selects (found again if the page re-rendered it).
async fn text_of(c: &Client, css: &str) -> String {
    for _ in 0..100 {
        match wait_css(c, css).await.text().await {
            Ok(t) => return t,
            Err(e) if stale(&e) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("{css}: {e}"),
        }
    }
    panic!("{css} kept being re-rendered")
}

/// Clicks the element `css` selects (found again if the page re-rendered it).
async fn click(c: &Client, css: &str) {
    for _ in 0..100 {
        match wait_css(c, css).await.click().await {
            Ok(()) => return,
            Err(e) if stale(&e) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("{css}: {e}"),
        }
    }
    panic!("{css} kept being re-rendered")
}

async fn count(c: &Client, css: &str) -> usize {
    c.find_all(Locator::Css(css)).await.unwrap().len()
}

async fn shot(c: &Client, name: &str) {
    let Some(dir) = std::env::var_os("FROGNANO_REVIEW_SCREENSHOTS") else { return };
    // Let fonts and layout settle.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let png = c.screenshot().await.unwrap();
    std::fs::write(Path::new(&dir).join(format!("review-{name}.png")), png).unwrap();
}

/// Types `text` into the field `css` selects (found again if the page re-rendered it).
async fn set_text(c: &Client, css: &str, text: &str) {
    for _ in 0..100 {
        let field = wait_css(c, css).await;
        match field.clear().await.and(field.send_keys(text).await) {
            Ok(()) => return,
            Err(e) if stale(&e) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("{css}: {e}"),
        }
    }
    panic!("{css} kept being re-rendered")
}

/// An eval run directory as `frognano eval run` leaves it: results.jsonl and the logs of each
/// graded instance.
fn eval_fixture(root: &Path) {
    let run = root.join("eval-demo/logs/run_evaluation/nightly");
    let mut results = String::new();
    for (id, resolved) in [("acme__stats-101", true), ("acme__stats-102", false), ("acme__parse-7", true)] {
        let logs = run.join("attempt-0/frognano").join(id);
        std::fs::create_dir_all(&logs).unwrap();
        let status = if resolved { "resolved" } else { "unresolved" };
        let failure: Vec<&str> = if resolved { vec![] } else { vec!["tests/test_stats.py::test_median_even"] };
        let report = json!({ id: { "patch_is_None": false, "patch_exists": true, "patch_successfully_applied": true, "resolved": resolved,
            "tests_status": { "FAIL_TO_PASS": { "success": if resolved { vec!["tests/test_stats.py::test_median_even"] } else { vec![] }, "failure": failure },
                              "PASS_TO_PASS": { "success": ["tests/test_stats.py::test_mean"], "failure": [] } } } });
        std::fs::write(logs.join("report.json"), serde_json::to_string_pretty(&report).unwrap()).unwrap();
        std::fs::write(
            logs.join("test_output.txt"),
            format!(
                "+ pytest -rA tests/test_stats.py\n{}\nPASSED tests/test_stats.py::test_mean\n",
                if resolved {
                    "PASSED tests/test_stats.py::test_median_even"
                } else {
                    "FAILED tests/test_stats.py::test_median_even - assert 3 == 2.5"
                }
            ),
        )
        .unwrap();
        std::fs::write(
            logs.join("patch.diff"),
            "diff --git a/stats.py b/stats.py\n--- a/stats.py\n+++ b/stats.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n",
        )
        .unwrap();
        results.push_str(&format!(
            "{}\n",
            json!({ "instance_id": id, "attempt": 0, "model_name_or_path": "frognano", "status": status, "resolved": resolved,
                    "patch_applied": true, "error": null, "seconds": 41.5, "test_seconds": 3.2, "report": null,
                    "trajectory": format!("trajectories/{id}.0.json") })
        ));
    }
    std::fs::write(run.join("results.jsonl"), results).unwrap();
}

/// A train run folder as `frognano train` leaves it after 24 steps (metrics.jsonl).
fn train_fixture(root: &Path) {
    let dir = root.join("train-smol");
    std::fs::create_dir_all(&dir).unwrap();
    let mut lines = String::new();
    for step in 1..=24u64 {
        let x = step as f64;
        lines.push_str(&format!(
            "{}\n",
            json!({ "step": step, "policy_version": step, "reward_mean": 0.2 + 0.5 * (1.0 - (-x / 9.0).exp()) + 0.03 * (x * 1.7).sin(),
                    "solve_rate": 0.15 + 0.45 * (1.0 - (-x / 10.0).exp()), "attempts": 32, "scored": 30, "limit_masked": 2, "infra_masked": 0,
                    "groups": 4, "usable_groups": 3, "usable_fraction": 0.75, "loss": 0.08 * (-x / 12.0).exp() + 0.01 * (x * 2.3).cos(),
                    "grad_norm": 0.9 - 0.02 * x, "clip_fraction": 0.02, "logprob_gap": 0.004, "sampled_tokens": 8000, "rollout_tokens_per_s": 310.0,
                    "train_tokens_per_s": 900.0, "rollout_s": 30.0, "train_s": 12.0, "pool_size": 40 + step / 4, "band_mass": 10 + (step * 3) / 4,
                    "sampled_p_hat": 0.4, "difficulty_hist": [4, 6, 10, 10, 6, 4], "new_tasks": step % 3 })
        ));
    }
    std::fs::write(dir.join("metrics.jsonl"), lines).unwrap();
}

#[test]
fn review_lists_opens_applies_rejects_and_sends_back_in_a_real_browser() {
    if !frognano_testkit::available_or_skip(
        "chromium and chromedriver",
        "frognano review browser test",
        browser_status(),
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    write(&repo, "stats.py", STATS);
    write(
        &repo,
        "test_stats.py",
        "from stats import median\n\n\ndef test_even():\n    assert median([1, 2, 3, 4]) == 2.5\n",
    );
    commit(&repo, "initial");
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let runs = tmp.path().join("frognano-runs");

    // Two runs from the same commit that fix the same line differently.
    let fixed = "    n = len(xs)\n    if n % 2 == 0:\n        return (xs[n // 2 - 1] + xs[n // 2]) / 2\n    return xs[n // 2]\n";
    let first = runs.join("median-fix");
    solve_replay(
        &repo,
        &scratch,
        &first,
        vec![
            reply(
                None,
                Some("The issue says median is wrong for even lengths; read stats.py first."),
                vec![call("Read", json!({"file_path": "stats.py"}))],
            ),
            reply(
                Some("For an even length the median is the mean of the two middle values."),
                None,
                vec![call(
                    "Edit",
                    json!({"file_path": "stats.py", "old_string": "    return xs[len(xs) // 2]\n", "new_string": fixed}),
                )],
            ),
            reply(
                None,
                None,
                vec![call(
                    "Bash",
                    json!({"command": "python3 -c 'from stats import median; print(median([1, 2, 3, 4]))'"}),
                )],
            ),
            reply(
                Some("Fixed median() for even-length lists: it now returns the mean of the two middle values."),
                None,
                vec![],
            ),
        ],
    );
    let second = runs.join("median-other");
    solve_replay(
        &repo,
        &scratch,
        &second,
        vec![
            // Read first: `frognano solve` refuses an edit of a file the run has not read.
            reply(None, None, vec![call("Read", json!({"file_path": "stats.py"}))]),
            reply(
                None,
                None,
                vec![call(
                    "Edit",
                    json!({"file_path": "stats.py", "old_string": "    return xs[len(xs) // 2]\n", "new_string": "    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2\n"}),
                )],
            ),
            reply(Some("Done."), None, vec![]),
        ],
    );
    eval_fixture(&runs);
    train_fixture(&runs);
    // Bad input: another tool's trajectory, a half-written one.
    write(
        &runs,
        "foreign/trajectory.json",
        r#"{"history": [], "info": {"exit_status": "submitted"}, "trajectory": []}"#,
    );
    write(
        &runs,
        "half/trajectory.json",
        r#"{"trajectory_format": "leaf-function-calling", "messages": [{"role": "sys"#,
    );

    // The review server, sending runs back to a scripted model.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (open_gate, gate) = mpsc::channel::<()>();
    let gate = Mutex::new(Some(gate));
    let continue_replies = vec![
        reply(
            None,
            Some("Guard the empty list before sorting."),
            vec![call(
                "Edit",
                json!({"file_path": "stats.py", "old_string": "    xs = sorted(xs)\n    n = len(xs)\n", "new_string": "    if not xs:\n        raise ValueError(\"median() of an empty list\")\n    xs = sorted(xs)\n    n = len(xs)\n"}),
            )],
        ),
        reply(Some("median() now raises ValueError for an empty list."), None, vec![]),
    ];
    let factory_seen = Arc::clone(&seen);
    let mut config = ReviewConfig::new(&runs);
    config.reviewer = "tester".into();
    config.model = Some(ModelChoice::InProcess(Some("scripted".into())));
    config.continue_with.isolation = isolation();
    config.llm_factory = Some(Arc::new(move |_| {
        Ok(Box::new(Scripted {
            replies: continue_replies.clone().into(),
            seen: Arc::clone(&factory_seen),
            gate: gate.lock().unwrap().take(),
        }) as Box<dyn Llm>)
    }));
    let url = ReviewServer::bind(config).unwrap().spawn();

    let port = free_port();
    let _driver = Driver(
        std::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("chromedriver starts"),
    );
    let profile = tmp.path().join("chromium-profile");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut caps = serde_json::Map::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({ "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                format!("--user-data-dir={}", profile.display()), "--window-size=1440,1100"] }),
        );
        let mut client = None;
        for _ in 0..100 {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
            {
                Ok(c) => {
                    client = Some(c);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let c = client.expect("chromedriver answers and starts chromium");

        // 1. The list: both solve runs (with their issue title), the eval and train runs, and
        //    the unreadable ones marked.
        c.goto(&url).await.unwrap();
        wait_css(&c, "#runs-table tr[data-id='median-fix']").await;
        let row = text_of(&c, "tr[data-id='median-fix']").await;
        assert!(row.contains("median() is wrong for even-length lists"), "{row}");
        assert!(row.contains("stats.py") && row.contains("to review") && row.contains("finished"), "{row}");
        assert_eq!(count(&c, "tr[data-kind='eval']").await, 1);
        assert_eq!(count(&c, "tr[data-kind='train']").await, 1);
        assert!(text_of(&c, "tr[data-id='foreign']").await.contains("cannot be read"));
        shot(&c, "list").await;

        // 2. One run: the steps, the thinking collapsed, the Edit as a diff, the patch.
        click(&c, "tr[data-id='median-fix'] a.run-title").await;
        wait_css(&c, ".step[data-step='3']").await;
        assert_eq!(count(&c, "#steps .step").await, 4);
        let thinking = wait_css(&c, ".step[data-step='0'] details.thinking").await;
        assert_eq!(thinking.attr("open").await.unwrap(), None, "thinking starts collapsed");
        let edit = text_of(&c, ".step[data-step='1'] .call[data-tool='Edit'] .edit-diff").await;
        assert!(edit.contains("if n % 2 == 0:") && edit.contains("return xs[len(xs) // 2]"), "{edit}");
        let bash = text_of(&c, ".step[data-step='2'] .obs pre").await;
        assert!(bash.contains("2.5"), "the Bash observation is shown: {bash}");
        let patch = text_of(&c, "#patch .diff-file[data-path='stats.py']").await;
        assert!(patch.contains("(xs[n // 2 - 1] + xs[n // 2]) / 2"), "{patch}");
        assert!(count(&c, "#patch .hl-kw").await > 0, "the patch is syntax-highlighted");
        assert!(text_of(&c, ".step[data-step='0'] .step-head").await.contains("model"), "per-step time is shown");
        shot(&c, "run").await;

        // 3. Apply: the repository changes, and the decision is recorded and shown.
        click(&c, "#apply-btn").await;
        wait_css(&c, "#run-chips .state-badge[data-state='apply']").await;
        let applied = std::fs::read_to_string(repo.join("stats.py")).unwrap();
        assert!(applied.contains("if n % 2 == 0:"), "{applied}");
        let log = std::fs::read_to_string(first.join("review.jsonl")).unwrap();
        let d: Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
        assert_eq!((d["action"].as_str(), d["by"].as_str()), (Some("apply"), Some("tester")));

        // 4. The other run no longer applies: refused with git's reason, nothing touched;
        //    then rejected with a note.
        c.goto(&format!("{url}#/run/median-other")).await.unwrap();
        wait_css(&c, ".step[data-step='1']").await;
        click(&c, "#apply-btn").await;
        let refused = text_of(&c, "#decision-error").await;
        assert!(refused.contains("git apply --check refused the patch"), "{refused}");
        assert_eq!(std::fs::read_to_string(repo.join("stats.py")).unwrap(), applied);
        set_text(&c, "#reject-note", "Conflicts with the fix already applied.").await;
        click(&c, "#reject-btn").await;
        wait_css(&c, "#run-chips .state-badge[data-state='reject']").await;
        assert!(text_of(&c, "#history").await.contains("Conflicts with the fix already applied."));

        // 5. Send back: a new run continues the old conversation with the comment, live.
        c.goto(&format!("{url}#/run/median-fix")).await.unwrap();
        set_text(&c, "#sendback-comment", COMMENT).await;
        click(&c, "#sendback-btn").await;
        wait_css(&c, ".running-note").await;
        // Step 5 (the continuation's first) arrives over server-sent events.
        wait_css(&c, "#steps .step[data-step='4']").await;
        assert!(text_of(&c, ".step[data-step='4'] .reviewer-comment").await.contains(COMMENT));
        assert!(text_of(&c, "#steps details.inherited summary").await.contains("Steps 1–4"));
        shot(&c, "live").await;
        open_gate.send(()).unwrap();
        wait_css(&c, "#run-chips .badge.green").await; // "finished", without a reload by hand
        wait_css(&c, ".step.final[data-step='5']").await;
        let new_id = c.current_url().await.unwrap().fragment().unwrap().trim_start_matches("/run/").to_string();
        let new_dir = runs.join(&new_id);
        let continued: Value =
            serde_json::from_str(&std::fs::read_to_string(new_dir.join("trajectory.json")).unwrap()).unwrap();
        let old: Value =
            serde_json::from_str(&std::fs::read_to_string(first.join("trajectory.json")).unwrap()).unwrap();
        let old_messages = old["messages"].as_array().unwrap();
        let messages = continued["messages"].as_array().unwrap();
        assert_eq!(&messages[..old_messages.len()], &old_messages[..], "the new run starts from the old one's history");
        assert_eq!(messages[old_messages.len()]["role"], "user");
        assert_eq!(messages[old_messages.len()]["content"], COMMENT);
        let asked = seen.lock().unwrap()[0].clone();
        assert_eq!(asked.len(), old_messages.len() + 1, "the model was asked with the whole history");
        assert_eq!(asked.last().unwrap().text(), COMMENT);
        let info: Value = serde_json::from_str(&std::fs::read_to_string(new_dir.join("run.json")).unwrap()).unwrap();
        assert_eq!(info["parent"]["steps"], 4);
        assert_eq!(PathBuf::from(info["parent"]["dir"].as_str().unwrap()), first.canonicalize().unwrap());
        let new_patch = std::fs::read_to_string(new_dir.join("patch.diff")).unwrap();
        assert!(new_patch.contains("if n % 2 == 0:") && new_patch.contains("raise ValueError"), "{new_patch}");
        shot(&c, "continued").await;

        // 6. The list shows the decisions and the link between the runs.
        c.goto(&url).await.unwrap();
        let row = text_of(&c, &format!("tr[data-id='{new_id}']")).await;
        assert!(row.contains("continues median-fix"), "{row}");
        assert!(text_of(&c, "tr[data-id='median-fix']").await.contains("sent back"));
        assert!(text_of(&c, "tr[data-id='median-other']").await.contains("rejected"));

        // 7. Eval: per-instance outcome, a row opens its test log.
        click(&c, "tr[data-kind='eval'] a.run-title").await;
        click(&c, "#eval-table tr[data-instance='acme__stats-102']").await;
        let log = text_of(&c, ".inst-detail .test-log").await;
        assert!(log.contains("FAILED tests/test_stats.py::test_median_even"), "{log}");
        assert!(text_of(&c, "#eval-table").await.contains("resolved"));
        shot(&c, "eval").await;

        // 8. Train: the metric plots.
        c.goto(&format!("{url}#/run/train-smol")).await.unwrap();
        for metric in ["reward_mean", "solve_rate", "loss", "band_mass"] {
            wait_css(&c, &format!(".chart[data-metric='{metric}'] path.series")).await;
        }
        shot(&c, "train").await;

        // 9. Bad input: clear pages.
        c.goto(&format!("{url}#/run/foreign")).await.unwrap();
        assert!(text_of(&c, "#problem").await.contains("another tool"));
        c.goto(&format!("{url}#/run/half")).await.unwrap();
        assert!(text_of(&c, "#problem").await.contains("half-written"));
        c.goto(&format!("{url}#/run/..%2F..%2Fetc")).await.unwrap();
        assert!(text_of(&c, "#problem").await.contains("not a run under the review folder"));
        c.close().await.unwrap();
    });
}

/// One raw HTTP/1.1 request to `addr`; returns the status line and headers, and the body.
fn http(addr: &str, request: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.to_string(), body.to_string())
}

/// On loopback, a request whose Host is another name (DNS rebinding) is refused; a change
/// that is not a JSON POST is refused; beyond loopback every request needs the token, and
/// `?token=` once sets the cookie that lets the page's own requests in.
#[test]
fn the_server_answers_only_its_own_host_and_beyond_loopback_only_with_the_token() {
    let tmp = tempfile::tempdir().unwrap();
    let url = ReviewServer::bind(ReviewConfig::new(tmp.path())).unwrap().spawn();
    let addr = url.trim_start_matches("http://").trim_end_matches('/').to_string();
    let (head, body) = http(&addr, &format!("GET /api/runs HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains("\"runs\":[]"), "{body}");
    let (head, _) = http(&addr, "GET /api/runs HTTP/1.1\r\nHost: evil.example:80\r\nConnection: close\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    let form = "id=x";
    let (head, _) = http(
        &addr,
        &format!("POST /api/apply HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{form}", form.len()),
    );
    assert!(head.starts_with("HTTP/1.1 415"), "a form post from another page is refused: {head}");

    let mut open = ReviewConfig::new(tmp.path());
    open.host = "0.0.0.0".into();
    let url = ReviewServer::bind(open).unwrap().spawn();
    let (base, token) = url.split_once("?token=").expect("a token is printed beyond loopback");
    assert_eq!(token.len(), 32);
    let addr = base.trim_start_matches("http://").trim_end_matches('/').to_string();
    let (head, body) = http(&addr, &format!("GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"));
    assert!(head.starts_with("HTTP/1.1 401") && body.contains("Token needed"), "{head}");
    let (head, _) = http(&addr, &format!("GET /?token=wrong HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"));
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    let (head, _) = http(&addr, &format!("GET /?token={token} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains(&format!("set-cookie: frognano_review={token}")), "{head}");
    let (head, _) = http(
        &addr,
        &format!(
            "GET /api/runs HTTP/1.1\r\nHost: {addr}\r\nCookie: frognano_review={token}\r\nConnection: close\r\n\r\n"
        ),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}
