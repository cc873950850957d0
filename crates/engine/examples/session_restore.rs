//! How long a long conversation takes to come back from disk (bench/session_restore.sh).
//!
//! `session_restore save MODEL DIR TOKENS` fills a cache of TOKENS positions (random keys,
//! values and recurrent state: the timing does not depend on what they hold, and a 32K-token
//! prefill of the 4B shapes takes most of an hour on two cores), saves it into the session
//! store DIR and reports the file size and time. `session_restore restore MODEL DIR TOKENS`,
//! in a new process as after a restart, loads the model, opens the store, restores the state
//! for a prompt of those tokens plus one, and runs that token: the time to the first token
//! of the next turn, next to the time a prefill of the history would take (measured on
//! `--prefill-probe` tokens and scaled, so it is a lower bound: attention grows with length).
//! `session_restore fill MODEL DIR TOKENS [KV_TYPE]` holds a random context of TOKENS − 1
//! positions, runs one token through it (the peak resident memory of a full context), then
//! times `STEPS` (environment, 8 by default) decode steps at that length.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use frognano_engine::persist::model_identity;
use frognano_engine::{GenerateRequest, SamplingParams, Session, SessionStore};
use frognano_model::{CausalLm, KvType, LayerCache};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (mode, model_path, dir, tokens, kv) = match &args[..] {
        [_, mode, model_path, dir, tokens] => (mode, model_path, dir, tokens, None),
        [_, mode, model_path, dir, tokens, kv] => {
            (mode, model_path, dir, tokens, Some(kv.parse::<KvType>().map_err(anyhow::Error::msg)?))
        }
        _ => anyhow::bail!("usage: session_restore save|restore|fill MODEL DIR TOKENS [KV_TYPE]"),
    };
    let tokens: usize = tokens.parse()?;
    // `fill` measures a full context of TOKENS positions: TOKENS − 1 held, then one token
    // through them (holding TOKENS and running one more would measure a context one past it,
    // and the cache growing past a filled power of two: a copy no full context makes).
    let n = if mode == "fill" { tokens.saturating_sub(1).max(1) } else { tokens };
    let t = Instant::now();
    let loaded = frognano_model::load(model_path)?;
    let weight_bytes = loaded.weight_bytes;
    let mut boxed = loaded.model;
    if let Some(kv) = kv {
        boxed.set_kv_type(kv)?;
    }
    let model: Arc<dyn CausalLm> = Arc::from(boxed);
    let load_s = t.elapsed().as_secs_f64();
    let id = model_identity(Path::new(model_path));
    let history: Vec<u32> = (0..n).map(|i| (i * 7919 % 5000 + 10) as u32).collect();
    match mode.as_str() {
        "save" | "fill" => {
            let mut cache = model.new_cache();
            let mut x = 0x2545_f491_u32;
            let mut noise = |len: usize| -> Vec<f32> {
                (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        (x as f32 / u32::MAX as f32 - 0.5) * 0.2
                    })
                    .collect()
            };
            for layer in &mut cache.layers {
                match layer {
                    LayerCache::Attention { k, v } => {
                        for _ in 0..n.div_ceil(1024) {
                            let rows = 1024.min(n - k.len());
                            k.push(&noise(rows * k.width()));
                            v.push(&noise(rows * v.width()));
                        }
                    }
                    LayerCache::Linear { conv, state } => {
                        *conv = noise(conv.len());
                        *state = noise(state.len());
                    }
                }
            }
            cache.pos = n;
            let logits = noise(model.vocab_size());
            let mut session = Session::from_state(Arc::clone(&model), cache, history.clone(), Some(logits));
            if mode == "fill" {
                // A real allocation of the whole context, then one token through it: the peak
                // resident memory of a full context (bench/session_restore.sh --fill).
                let prompt: Vec<u32> = history.iter().copied().chain([42]).collect();
                let req = GenerateRequest {
                    sampling: SamplingParams::greedy(),
                    max_tokens: 1,
                    stop_ids: vec![],
                    top_logprobs: 0,
                    checkpoint: None,
                };
                let t = Instant::now();
                let first = session.generate(&prompt, &req, |_| ControlFlow::Continue(()))?;
                let first_s = t.elapsed().as_secs_f64();
                let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
                let hwm = status.lines().find(|l| l.starts_with("VmHWM")).unwrap_or("VmHWM: ?").to_string();
                // Then steady decode at this length: the first token above also grew the
                // cache's buffers past the filled size (a copy that a live session pays once
                // per doubling, not per token).
                // STEPS=N for a longer measurement (8 by default).
                let steps = std::env::var("STEPS").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
                let prompt: Vec<u32> = prompt.iter().copied().chain(first.tokens.iter().map(|c| c.id)).collect();
                let t = Instant::now();
                let more = session
                    .generate(&prompt, &GenerateRequest { max_tokens: steps, ..req }, |_| ControlFlow::Continue(()))?;
                let decode = more.tokens.len() as f64 / t.elapsed().as_secs_f64();
                let state = model.cache_bytes(n + 1);
                println!(
                    "KV cache {}; {n} positions held, {} with the next token ({:.2} GB of state); one token through \
                     them in {first_s:.2} s; then {decode:.2} tok/s decode over {} tokens; peak {}; read per token: \
                     {weight_bytes} weight bytes + {state} state bytes",
                    model.kv_type(),
                    n + 1,
                    state as f64 / 1e9,
                    more.tokens.len(),
                    hwm.split_whitespace().skip(1).collect::<Vec<_>>().join(" ")
                );
                return Ok(());
            }
            let store = SessionStore::open(Path::new(dir), &id, model.as_ref(), u64::MAX)?;
            let t = Instant::now();
            store.save(&session);
            store.flush();
            let st = store.stats();
            println!(
                "KV cache {}; saved {n} tokens: {} file(s), {:.1} MB in {:.2} s",
                model.kv_type(),
                st.files,
                st.bytes as f64 / 1e6,
                t.elapsed().as_secs_f64()
            );
        }
        "restore" => {
            let t = Instant::now();
            let store = SessionStore::open(Path::new(dir), &id, model.as_ref(), u64::MAX)?;
            let open_s = t.elapsed().as_secs_f64();
            let prompt: Vec<u32> = history.iter().copied().chain([42]).collect();
            let t = Instant::now();
            let (mut session, kept) =
                store.restore(&prompt, 0, &model).ok_or_else(|| anyhow::anyhow!("no saved state in {dir}"))?;
            let restore_s = t.elapsed().as_secs_f64();
            let req = GenerateRequest {
                sampling: SamplingParams::default(),
                max_tokens: 1,
                stop_ids: vec![],
                top_logprobs: 0,
                checkpoint: None,
            };
            let g = session.generate(&prompt, &req, |_| ControlFlow::Continue(()))?;
            let first_s = t.elapsed().as_secs_f64();
            // What re-prefilling would cost: a 512-token prefill's rate, scaled to the history.
            let probe: Vec<u32> = history[..512.min(n)].to_vec();
            let t = Instant::now();
            Session::new(Arc::clone(&model)).generate(&probe, &req, |_| ControlFlow::Continue(()))?;
            let per_token = t.elapsed().as_secs_f64() / probe.len() as f64;
            println!(
                "model load {load_s:.2} s; store open {open_s:.3} s; restore of {kept} tokens {restore_s:.3} s; \
                 first token after {first_s:.3} s (cached {}); prefilling the history instead: ≥ {:.0} s \
                 (at the 512-token rate of {:.1} tok/s)",
                g.cached_tokens,
                per_token * n as f64,
                1.0 / per_token
            );
        }
        other => anyhow::bail!("unknown mode {other:?}: save or restore"),
    }
    Ok(())
}
