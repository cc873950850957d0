//! The scheduler: concurrent callers share batched decode steps and prefixes, and each still
//! gets exactly the tokens it gets alone.

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use frognano_engine::{
    FinishReason, Flow, GenerateRequest, Generation, Job, SamplingParams, Scheduler, SchedulerConfig, Session,
    TokenChoice, TokenSink,
};
use frognano_model::qwen35::Qwen35;
use frognano_model::CausalLm;

fn hybrid() -> Arc<dyn CausalLm> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen35-tiny");
    Arc::new(Qwen35::from_safetensors(&dir).unwrap())
}

/// The demo model (llama architecture: a key/value cache that can be cut back anywhere).
fn rewindable() -> Option<Arc<dyn CausalLm>> {
    let path = frognano_testkit::demo_model()?;
    Some(Arc::from(frognano_model::load::load(path.to_str().unwrap()).unwrap().model))
}

fn sampled(n: usize, seed: u64) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams { temperature: 1.0, seed: Some(seed), ..Default::default() },
        max_tokens: n,
        stop_ids: vec![],
        top_logprobs: 0,
    }
}

fn ids(n: usize, salt: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 131 + salt * 17) % 1000 + 3) as u32).collect()
}

fn alone(m: &Arc<dyn CausalLm>, prompt: &[u32], req: &GenerateRequest) -> Generation {
    Session::new(m.clone()).generate(prompt, req, |_| ControlFlow::Continue(())).unwrap()
}

fn token_ids(g: &Generation) -> Vec<u32> {
    g.tokens.iter().map(|t| t.id).collect()
}

fn assert_same(a: &Generation, b: &Generation, what: &str) {
    assert_close(a, b, 1e-3, what)
}

fn assert_close(a: &Generation, b: &Generation, tolerance: f32, what: &str) {
    assert_eq!(token_ids(a), token_ids(b), "{what}");
    for (x, y) in a.tokens.iter().zip(&b.tokens) {
        assert!((x.logprob - y.logprob).abs() < tolerance, "{what}: logprob {} vs {}", x.logprob, y.logprob);
    }
}

/// G callers on their own threads with one prompt (a training group): the prompt is
/// prefilled once and forked, decode steps are batched, and every caller gets the tokens of
/// its own seed exactly as a lone session gives them.
fn group_shares_prefill_and_batches(
    m: Arc<dyn CausalLm>,
    kept_per_fork: usize,
    request: fn(u64) -> GenerateRequest,
    tolerance: f32,
) {
    let prompt = ids(70, 1);
    let g = 4;
    let expected: Vec<Generation> = (0..g).map(|j| alone(&m, &prompt, &request(100 + j as u64))).collect();
    let config = SchedulerConfig { max_batch: 8, sessions: 8, ..Default::default() };
    let scheduler = Arc::new(Scheduler::start(m, config).unwrap());
    let got: Vec<Generation> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..g)
            .map(|j| {
                let (sch, p) = (Arc::clone(&scheduler), prompt.clone());
                s.spawn(move || sch.generate(p, request(100 + j as u64), |_| ControlFlow::Continue(())).unwrap())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (j, (a, b)) in got.iter().zip(&expected).enumerate() {
        assert_close(a, b, tolerance, &format!("attempt {j}"));
        assert_eq!(a.finish, FinishReason::Length);
    }
    let st = scheduler.stats();
    let forks = st.forks.load(Ordering::Relaxed);
    assert!(forks >= 1, "later attempts start from a fork of the first one's prompt state");
    assert_eq!(
        st.cached_tokens.load(Ordering::Relaxed),
        forks * kept_per_fork as u64,
        "each fork reuses the shared prompt instead of recomputing it"
    );
    let (steps, rows) = (st.decode_steps.load(Ordering::Relaxed), st.decoded_rows.load(Ordering::Relaxed));
    assert_eq!(rows, (g * 11) as u64, "every token after the first comes from a decode step");
    assert!(steps < rows, "decode steps carried more than one sequence ({steps} steps for {rows} rows)");
    assert_eq!(st.completed.load(Ordering::Relaxed), g as u64);
}

#[test]
fn a_group_of_attempts_on_the_hybrid_model_prefills_its_prompt_once() {
    // The snapshot at the end of the prompt holds the state and the logits: all 70 reused.
    // The fork's state is the same bits, so even sampled attempts match their lone runs.
    let m = hybrid();
    let prompt = ids(70, 1);
    let (a, b) = (alone(&m, &prompt, &sampled(12, 100)), alone(&m, &prompt, &sampled(12, 101)));
    assert_ne!(token_ids(&a), token_ids(&b), "the seeds must give different attempts for this test to mean anything");
    group_shares_prefill_and_batches(m, 70, |seed| sampled(12, seed), 1e-3);
}

#[test]
fn a_group_of_attempts_on_a_rewindable_model_prefills_its_prompt_once() {
    let Some(m) = rewindable() else { return };
    // The cut-back key/value cache plus the logits kept at the prompt's end: all 70 reused,
    // and the same bits as a fresh prefill.
    group_shares_prefill_and_batches(m, 70, |seed| sampled(12, seed), 1e-3);
}

#[test]
fn a_follow_up_reuses_its_conversation_and_a_sibling_does_not_cut_it_back() {
    let m = hybrid();
    let scheduler = Scheduler::start(m.clone(), SchedulerConfig::default()).unwrap();
    let run =
        |p: &[u32], seed| scheduler.generate(p.to_vec(), sampled(6, seed), |_| ControlFlow::Continue(())).unwrap();
    let prompt = ids(40, 2);
    let first = run(&prompt, 1);
    // A sibling with the same prompt while the first conversation sits idle: it forks.
    let sibling = run(&prompt, 2);
    assert_eq!(sibling.cached_tokens, 40);
    assert_same(&sibling, &alone(&m, &prompt, &sampled(6, 2)), "sibling");
    // The first conversation goes on: its whole history is still there.
    let mut turn2 = prompt.clone();
    turn2.extend(token_ids(&first));
    turn2.extend(ids(9, 3));
    let second = run(&turn2, 3);
    assert_eq!(second.cached_tokens, 40 + 5, "everything but the last sampled token was kept");
    assert_same(&second, &alone(&m, &turn2, &sampled(6, 3)), "follow-up");
}

struct Recording {
    tokens: Vec<u32>,
    stop_after: usize,
    flow_at_stop: Flow,
    result: std::sync::mpsc::Sender<(Vec<u32>, Result<Generation, String>)>,
}

impl TokenSink for Recording {
    fn token(&mut self, choice: &TokenChoice) -> Flow {
        self.tokens.push(choice.id);
        if self.tokens.len() >= self.stop_after {
            self.flow_at_stop
        } else {
            Flow::Continue
        }
    }
    fn done(self: Box<Self>, result: Result<Generation, frognano_engine::EngineError>) {
        let _ = self.result.send((self.tokens, result.map_err(|e| e.to_string())));
    }
}

#[test]
fn sinks_stop_or_abandon_a_generation_and_errors_reach_them() {
    let scheduler = Scheduler::start(hybrid(), SchedulerConfig::default()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let job = |prompt: Vec<u32>, stop_after, flow_at_stop| Job {
        prompt,
        request: sampled(20, 7),
        sink: Box::new(Recording { tokens: vec![], stop_after, flow_at_stop, result: tx.clone() }),
        constraint: None,
    };
    scheduler.submit(job(ids(10, 4), 3, Flow::Stop)).unwrap();
    let (tokens, g) = rx.recv().unwrap();
    let g = g.unwrap();
    assert_eq!((tokens.len(), g.tokens.len(), g.finish), (3, 3, FinishReason::Cancelled));
    assert_eq!(scheduler.stats().completed.load(Ordering::Relaxed), 1, "a stop string completes a reply");
    scheduler.submit(job(ids(10, 5), 2, Flow::Abandon)).unwrap();
    let (tokens, _) = rx.recv().unwrap();
    assert_eq!(tokens.len(), 2);
    assert_eq!(scheduler.stats().cancelled.load(Ordering::Relaxed), 1);
    // An id outside the vocabulary fails the job with the model's words; the scheduler lives on.
    scheduler.submit(job(vec![5, 1_000_000], 100, Flow::Continue)).unwrap();
    let (_, err) = rx.recv().unwrap();
    assert!(err.unwrap_err().contains("out of vocabulary"));
    let after = scheduler.generate(ids(5, 6), sampled(2, 1), |_| ControlFlow::Break(())).unwrap();
    assert!(!after.tokens.is_empty());
    assert_eq!(scheduler.stats().failed.load(Ordering::Relaxed), 1);
}
