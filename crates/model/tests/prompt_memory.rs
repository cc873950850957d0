//! What a long prompt's prefill holds besides its cache does not grow with the prompt: the
//! layer stack takes it in pieces of `PROMPT_PIECE` tokens (in one pass, a 131K-token prompt
//! of the 4B model would have held ~12 GB of activations). Measured with a counting allocator,
//! so this file holds a single test (tests of one binary share the allocator).

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use frognano_model::{load, CausalLm, PROMPT_PIECE};

/// The system allocator, counting the bytes held now and the most held since the last reset.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator unchanged; the counters only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            let now = HELD.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

/// Bytes held at the peak of `model.forward(prompt)` on a fresh cache, above what was held
/// before it, and the bytes its cache holds afterwards.
fn prefill_peak(model: &dyn CausalLm, prompt: &[u32]) -> (usize, usize) {
    let mut cache = model.new_cache();
    let before = HELD.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let logits = model.forward(prompt, &mut cache, false).expect("forward");
    let peak = PEAK.load(Ordering::Relaxed) - before;
    assert_eq!((logits.len(), cache.pos), (model.vocab_size(), prompt.len()));
    (peak, model.cache_bytes(prompt.len()))
}

#[test]
fn a_long_prompt_holds_no_more_than_its_cache_beyond_a_short_one() {
    // The tiny Qwen3.5 checkpoint (DeltaNet and attention layers, f32 cache) takes prompts up
    // to its 4,096 positions.
    let m = load(repo("fixtures/qwen35-tiny").to_str().unwrap()).unwrap().model;
    let prompt: Vec<u32> = (0..4000).map(|i| ((i * 131) % 1000 + 5) as u32).collect();
    let (short, _) = prefill_peak(m.as_ref(), &prompt[..PROMPT_PIECE]);
    let (long, cache) = prefill_peak(m.as_ref(), &prompt);
    // The cache may be held twice while it grows (a vector's reallocation); beyond that, the
    // long prompt may hold what one piece holds and little more. In one pass its activations
    // alone were ~8x the short prompt's.
    let allowed = 2 * cache + 2 * short;
    assert!(
        long <= allowed,
        "a {}-token prefill held {long} bytes at its peak: more than twice its {cache}-byte cache plus \
         twice the {short} bytes a {PROMPT_PIECE}-token prefill held",
        prompt.len()
    );
}
