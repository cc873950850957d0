//! Under load: N clients stream while one long prompt arrives; how much the long prompt's
//! prefill stretches the others' inter-token latency (docs/serve.md §6, bench/RESULTS.md
//! "Serve fairness").
//!
//! For each prefill setting it starts the server (`frognano_serve::spawn_server`, the code
//! `frognano serve` runs) on the model, starts the streaming clients, records every token's
//! arrival for a while (the "before" window), sends the long prompt (`/v1/completions`, token
//! ids, `max_tokens` 1, not streamed) and records until its answer comes back (the "during"
//! window). Inter-token latency is the gap between two content chunks of one stream; a gap
//! counts for "during" when it overlaps the window (so one stall over the whole prefill is
//! seen).
//!
//! Each client asks for `--stream-tokens` tokens (default 256) and asks again as soon as its
//! reply ends, the first replies staggered in length, so that the streams' own contexts stay
//! in the same range before and during the long prefill. Streams that only grew (4,000-token
//! replies, as before session 23) decode slower at the end of a six-minute prefill for their
//! own length alone (SmolLM2, 16 streams: 108 ms a step at its start, 164 ms after 6,000 of
//! its 8,000 tokens), which the "before" window, taken at their start, does not see.
//!
//! ```text
//! cargo run --release -p frognano-serve --example serve_fairness -- \
//!     [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--clients 16] [--long-tokens 8000] \
//!     [--chunks 256] [--stalls 0,0.75] [--before-secs 10] [--stream-tokens 256] \
//!     [--modes inside,apart]
//! ```
//! Every chunk size runs with every stall (`--prefill-stall`; 0 = fixed chunks of that size)
//! and every mode: `inside` (the default server: a chunk runs inside the streams' decode step,
//! one forward) and `apart` (`--prefill-apart`: before it, in a forward of its own).
//! A chunk larger than the long prompt with stall 0 is the old behaviour: the whole prompt at
//! once.

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

struct Args {
    model: String,
    clients: usize,
    long_tokens: usize,
    chunks: Vec<usize>,
    stalls: Vec<f64>,
    before_secs: u64,
    stream_tokens: usize,
    /// Chunks inside the decode step (true) or apart (false).
    modes: Vec<bool>,
}

fn parse_args() -> Args {
    let mut a = Args {
        model: "models/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
        clients: 16,
        long_tokens: 8000,
        chunks: vec![256],
        stalls: vec![0.0, 0.75],
        before_secs: 10,
        stream_tokens: 256,
        modes: vec![true],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => a.model = value(),
            "--clients" => a.clients = value().parse().expect("--clients N"),
            "--long-tokens" => a.long_tokens = value().parse().expect("--long-tokens N"),
            "--chunks" => a.chunks = value().split(',').map(|c| c.parse().expect("--chunks A,B,…")).collect(),
            "--stalls" => a.stalls = value().split(',').map(|c| c.parse().expect("--stalls A,B,…")).collect(),
            "--before-secs" => a.before_secs = value().parse().expect("--before-secs N"),
            "--stream-tokens" => a.stream_tokens = value().parse().expect("--stream-tokens N"),
            "--modes" => {
                a.modes = value()
                    .split(',')
                    .map(|m| match m {
                        "inside" => true,
                        "apart" => false,
                        _ => panic!("--modes takes inside and apart, not {m}"),
                    })
                    .collect()
            }
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

/// The arrival times of every content chunk, per client and request (a gap between two
/// requests of one client is not an inter-token gap).
type Arrivals = Arc<Mutex<Vec<Vec<Vec<Instant>>>>>;

/// One client: streams completions of `tokens` tokens back to back until `stop` (the first
/// one `first` tokens long, so that the clients' replies do not all end at once), logging
/// each chunk's arrival.
fn client(
    url: String,
    i: usize,
    (first, tokens): (usize, usize),
    eos: Vec<u32>,
    arrivals: Arrivals,
    stop: Arc<AtomicBool>,
) {
    let mut max_tokens = first;
    while !stop.load(Ordering::SeqCst) {
        // End-of-text ids banned, so every reply runs its full length and the decode batch
        // keeps its size (a client is out of it only between two of its requests).
        let banned: serde_json::Map<String, serde_json::Value> =
            eos.iter().map(|id| (id.to_string(), json!(-100))).collect();
        let body = json!({"prompt": format!("Client {i}. A long story about a frog who counts: one, two, three,"),
            "max_tokens": max_tokens, "temperature": 0.8, "seed": i, "stream": true, "logit_bias": banned});
        max_tokens = tokens;
        let resp = match ureq::post(&format!("{url}/v1/completions")).send_json(body) {
            Ok(r) => r,
            Err(e) => panic!("client {i}: {e}"),
        };
        let mut last: Option<Instant> = None;
        arrivals.lock().unwrap()[i].push(Vec::new());
        for line in BufReader::new(resp.into_reader()).lines() {
            let Ok(line) = line else { break };
            let Some(data) = line.strip_prefix("data: ") else { continue };
            if data == "[DONE]" {
                break;
            }
            let now = Instant::now();
            if last.is_some() {
                arrivals.lock().unwrap()[i].last_mut().expect("this request's list").push(now);
            }
            last = Some(now);
            if stop.load(Ordering::SeqCst) {
                return;
            }
        }
    }
}

/// Inter-token gaps (ms) of every stream: with `overlapping`, every gap that overlaps
/// `[from, to)` (a stall that spans the whole window counts); otherwise those inside it.
fn gaps(arrivals: &[Vec<Vec<Instant>>], from: Instant, to: Instant, overlapping: bool) -> Vec<f64> {
    let mut out = Vec::new();
    for times in arrivals.iter().flatten() {
        for w in times.windows(2) {
            let keep = if overlapping { w[1] > from && w[0] < to } else { w[0] >= from && w[1] < to };
            if keep && w[1] > w[0] {
                out.push((w[1] - w[0]).as_secs_f64() * 1e3);
            }
        }
    }
    out.sort_by(f64::total_cmp);
    out
}

fn health(url: &str) -> anyhow::Result<serde_json::Value> {
    Ok(ureq::get(&format!("{url}/health")).call()?.into_json()?)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() -> anyhow::Result<()> {
    let a = parse_args();
    eprintln!("model {}, {} streaming clients, a {}-token prompt", a.model, a.clients, a.long_tokens);
    let eos = frognano_model::load(&a.model)?.eos_ids;
    println!("| chunks | prefill chunk (most) | prefill stall | ITL before p50 / p95 (ms) | ITL during p50 / p95 (ms) | p50 ratio | p95 ratio | long prompt's prefill (s) |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut runs = Vec::new();
    for &c in &a.chunks {
        for &s in &a.stalls {
            for &m in &a.modes {
                runs.push((c, s, m));
            }
        }
    }
    for (chunk, stall, inside) in runs {
        let mode = if inside { "inside" } else { "apart" };
        let mut cfg = frognano_serve::ServeConfig::for_model(&a.model);
        cfg.port = 0;
        cfg.max_concurrent = a.clients + 1;
        cfg.prefill_chunk = chunk;
        cfg.prefill_stall = stall;
        cfg.prefill_apart = !inside;
        let server = frognano_serve::spawn_server(cfg)?;
        let url = server.url();
        let arrivals: Arrivals = Arc::new(Mutex::new(vec![Vec::new(); a.clients]));
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..a.clients)
            .map(|i| {
                let (url, arrivals, stop, eos) = (url.clone(), Arc::clone(&arrivals), Arc::clone(&stop), eos.clone());
                let lengths = (a.stream_tokens * (i + 1) / a.clients, a.stream_tokens);
                std::thread::spawn(move || client(url, i, lengths, eos, arrivals, stop))
            })
            .collect();
        // Warm-up: every client streaming.
        let warm = Instant::now();
        while arrivals.lock().unwrap().iter().any(|t| t.iter().map(Vec::len).sum::<usize>() < 3) {
            anyhow::ensure!(warm.elapsed() < Duration::from_secs(300), "the clients did not all start streaming");
            std::thread::sleep(Duration::from_millis(50));
        }
        let before_from = Instant::now();
        std::thread::sleep(Duration::from_secs(a.before_secs));
        // Token ids, so the prompt is exactly this long and shares nothing with the clients'.
        let long: Vec<u32> = (0..a.long_tokens).map(|i| 1000 + (i * 7919 % 20000) as u32).collect();
        let h0 = health(&url)?;
        let sent = Instant::now();
        let resp = ureq::post(&format!("{url}/v1/completions"))
            .send_json(json!({"prompt": long, "max_tokens": 1, "temperature": 0}))?;
        let answered = Instant::now();
        let h1 = health(&url)?;
        // Every stream's first token after the prefill ends the gap it stalled in.
        let t = Instant::now();
        while arrivals.lock().unwrap().iter().any(|r| r.iter().flatten().max().is_none_or(|&l| l < answered)) {
            anyhow::ensure!(t.elapsed() < Duration::from_secs(60), "the streams did not resume");
            std::thread::sleep(Duration::from_millis(20));
        }
        let delta = |k: &str| h1[k].as_u64().unwrap_or(0) - h0[k].as_u64().unwrap_or(0);
        let (steps, chunks) = (delta("decode_steps"), delta("prefill_chunks"));
        eprintln!(
            "{mode}, chunk {chunk}, stall {stall}: {steps} decode steps and {chunks} prefill chunks during the prefill: {:.0} ms per iteration, {:.0} tokens per chunk",
            (answered - sent).as_secs_f64() * 1e3 / steps.max(1) as f64,
            a.long_tokens as f64 / chunks.max(1) as f64
        );
        let body: serde_json::Value = resp.into_json()?;
        anyhow::ensure!(body["usage"]["prompt_tokens"] == a.long_tokens, "unexpected reply {body}");
        stop.store(true, Ordering::SeqCst);
        let all = arrivals.lock().unwrap().clone();
        anyhow::ensure!(
            all.iter().all(|r| r.iter().flatten().any(|&t| t > sent && t < answered)),
            "a stream stopped during the measurement"
        );
        let before = gaps(&all, before_from, sent, false);
        let during = gaps(&all, sent, answered, true);
        let (b50, b95, d50, d95) = (pct(&before, 0.5), pct(&before, 0.95), pct(&during, 0.5), pct(&during, 0.95));
        println!(
            "| {mode} | {chunk} | {stall} | {b50:.0} / {b95:.0} | {d50:.0} / {d95:.0} | {:.2} | {:.2} | {:.1} |",
            d50 / b50,
            d95 / b95,
            (answered - sent).as_secs_f64(),
        );
        eprintln!("{mode}, chunk {chunk}, stall {stall}: {} gaps before, {} during", before.len(), during.len());
        drop(server); // closes the streams; the clients see their end
        for h in handles {
            let _ = h.join();
        }
    }
    Ok(())
}
