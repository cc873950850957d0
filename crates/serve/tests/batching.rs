//! Concurrent requests are decoded together: the scheduler advances all running sequences in
//! one `forward_batch` (or, when some check drafts, one `forward_batch_stepwise`) per step,
//! and every client still gets exactly its own reply.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use frognano_model::{Cache, CausalLm};
use frognano_serve::spawn_server_with_model;
use serde_json::json;

/// Wraps a model, records the largest decode batch it was asked for; each batched step takes
/// a few milliseconds, as a real model's would, so concurrent requests overlap.
struct BatchRecorder {
    inner: Box<dyn CausalLm>,
    largest_batch: Arc<AtomicUsize>,
    steps: Arc<AtomicUsize>,
}

impl CausalLm for BatchRecorder {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn max_context(&self) -> usize {
        self.inner.max_context()
    }
    fn new_cache(&self) -> Cache {
        self.inner.new_cache()
    }
    fn forward(&self, ids: &[u32], cache: &mut Cache, all_logits: bool) -> frognano_model::Result<Vec<f32>> {
        self.inner.forward(ids, cache, all_logits)
    }
    fn forward_batch(&self, batch: &mut [(u32, &mut Cache)]) -> frognano_model::Result<Vec<Vec<f32>>> {
        self.largest_batch.fetch_max(batch.len(), Ordering::SeqCst);
        self.steps.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(4));
        self.inner.forward_batch(batch)
    }
    // A step in which some sequence checks drafts (`--speculative auto`, the default) runs
    // every sequence's rows through this one instead.
    fn forward_batch_stepwise(&self, batch: &mut [(&[u32], &mut Cache)]) -> frognano_model::Result<Vec<Vec<f32>>> {
        self.largest_batch.fetch_max(batch.len(), Ordering::SeqCst);
        self.steps.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(4));
        self.inner.forward_batch_stepwise(batch)
    }
}

#[test]
fn concurrent_requests_share_decode_steps_and_each_gets_its_own_reply() {
    let reply = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen";
    let mut loaded = scripted(frognano_model::load(tiny()).expect("tiny model loads"), reply);
    let largest_batch = Arc::new(AtomicUsize::new(0));
    let steps = Arc::new(AtomicUsize::new(0));
    let inner = std::mem::replace(&mut loaded.model, Box::new(ScriptedLm { vocab: 1, script: vec![0] }));
    loaded.model =
        Box::new(BatchRecorder { inner, largest_batch: Arc::clone(&largest_batch), steps: Arc::clone(&steps) });
    let mut a = args("scripted");
    a.max_concurrent = 4;
    let server = spawn_server_with_model(loaded, a).expect("server starts");
    let url = format!("{}/v1/chat/completions", server.url());
    let clients: Vec<_> = (0..6)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || {
                let body = json!({"messages": [{"role": "user", "content": format!("client {i}")}],
                    "max_tokens": 64, "temperature": 0});
                post(&url, &body)
            })
        })
        .collect();
    let mut completion_tokens = 0;
    for c in clients {
        let (status, body) = c.join().expect("client thread");
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["message"]["content"], reply, "{body}");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        completion_tokens += body["usage"]["completion_tokens"].as_u64().unwrap();
    }
    let largest = largest_batch.load(Ordering::SeqCst);
    assert!(
        (2..=4).contains(&largest),
        "largest decode batch {largest}: sequences were not batched (or over --max-concurrent)"
    );
    // Batched: far fewer model steps than generated tokens (each request's first token comes
    // from its prefill, the rest from shared steps).
    let steps = steps.load(Ordering::SeqCst) as u64;
    assert!(steps < completion_tokens - 6, "{steps} decode steps for {completion_tokens} tokens");
}
