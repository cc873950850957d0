//! Bounded loopback load test: 32 concurrent streaming clients, twice; every stream completes
//! without an error and the process's resident memory does not grow in the second round.
//!
//! Uses the demo model (models/SmolLM2-135M-Instruct.Q4_1.gguf, found by the shared
//! `frognano_testkit::demo_model` lookup; it must load). Where it has not been fetched the
//! test runs on the tiny checkpoint and says so on a `SKIPPED (needs the demo model)` line;
//! with `FROGNANO_REQUIRE_FIXTURES` set (CI) a missing demo model fails the test instead.

use crate::common;

use std::io::{BufRead, BufReader};
use std::time::Instant;

use common::*;
use serde_json::{json, Value};

const CLIENTS: usize = 32;
const MAX_TOKENS: usize = 8;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// One streaming client: returns the number of content chunks; panics on any error.
fn client(url: &str, model: &str, i: usize) -> usize {
    let body = json!({"model": model, "stream": true, "max_tokens": MAX_TOKENS, "temperature": 0.8, "seed": i,
        "messages": [{"role": "user", "content": format!("Client {i}: write a short poem about frogs.")}]});
    let resp = ureq::post(&format!("{url}/v1/chat/completions")).send_json(body).expect("request accepted");
    let mut events = Vec::new();
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line.expect("stream readable");
        if let Some(d) = line.strip_prefix("data: ") {
            events.push(d.to_string());
        }
    }
    let chunks = chunks(&events);
    for c in &chunks {
        assert!(c.get("error").is_none(), "client {i} got an error: {c}");
    }
    let finish = chunks.iter().rev().find_map(|c| c["choices"].get(0)?["finish_reason"].as_str().map(str::to_string));
    assert!(matches!(finish.as_deref(), Some("stop" | "length")), "client {i}: finish {finish:?}");
    chunks.len()
}

fn round(url: &str, model: &str) -> f64 {
    let t = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..CLIENTS).map(|i| s.spawn(move || client(url, model, i))).collect();
        for h in handles {
            h.join().expect("client thread");
        }
    });
    t.elapsed().as_secs_f64()
}

#[test]
fn thirty_two_concurrent_streams_complete_and_memory_stays_flat() {
    let model_path = match frognano_testkit::demo_model() {
        Some(demo) => demo.to_string_lossy().into_owned(),
        None => {
            eprintln!("SKIPPED (needs the demo model): the load test runs on the tiny checkpoint instead");
            tiny()
        }
    };
    let mut a = args(&model_path);
    a.max_concurrent = 4;
    let server = frognano_serve::spawn_server(a).expect("server starts");
    let url = server.url();
    let (_, models) = get(&format!("{url}/v1/models"));
    let name = models["data"][0]["id"].as_str().unwrap().to_string();

    let t1 = round(&url, &name);
    let rss1 = rss_kib();
    let t2 = round(&url, &name);
    let rss2 = rss_kib();
    let health: Value = get(&format!("{url}/health")).1;
    eprintln!(
        "load test on {name}: round 1 {t1:.2}s, round 2 {t2:.2}s; VmRSS {rss1} KiB -> {rss2} KiB; {} tokens generated",
        health["generated_tokens"]
    );
    assert_eq!(health["completed"].as_u64(), Some(2 * CLIENTS as u64), "{health}");
    assert_eq!(health["failed"], 0);
    assert_eq!(health["running"], 0);
    // Flat: the second round reuses the same sessions and buffers.
    assert!(rss2 <= rss1 + 16 * 1024 + rss1 / 10, "VmRSS grew from {rss1} KiB to {rss2} KiB");
}
