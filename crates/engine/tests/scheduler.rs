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
        checkpoint: None,
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
        assert!((x.logprob - y.logprob).abs() <= tolerance, "{what}: logprob {} vs {}", x.logprob, y.logprob);
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

fn greedy(n: usize) -> GenerateRequest {
    GenerateRequest::greedy(n)
}

/// A long prompt prefilled in chunks of any size gives the tokens and the log-probabilities of
/// a one-shot prefill: for the hybrid model the recurrent and conv states
/// carry from chunk to chunk, for the key/value cache the positions do.
fn chunked_prefill_matches_one_shot(m: Arc<dyn CausalLm>, what: &str) {
    let prompt = ids(300, 8);
    let expected = alone(&m, &prompt, &greedy(8));
    for chunk in [1, 2, 7, 16, 64, 299] {
        let config = SchedulerConfig { prefill_chunk: chunk, ..Default::default() };
        // A chunk of one would take the one-token kernels, whose rounding differs (the demo
        // model's greedy reply then changes at its third token): the scheduler runs two.
        let chunk = chunk.max(2);
        let scheduler = Scheduler::start(m.clone(), config).unwrap();
        let got = scheduler.generate(prompt.clone(), greedy(8), |_| ControlFlow::Continue(())).unwrap();
        assert_close(&got, &expected, 1e-3, &format!("{what}, chunks of {chunk}"));
        let chunks = scheduler.stats().prefill_chunks.load(Ordering::Relaxed);
        // A piece never leaves a lone token behind, so 300 tokens in pieces of 299 are one.
        let (mut left, mut want) = (300, 0);
        while left > 0 {
            left -= if left <= chunk + 1 { left } else { chunk };
            want += 1;
        }
        assert_eq!(chunks, want, "{what}: {chunks} chunks of {chunk} for 300 tokens");
    }
}

#[test]
fn chunked_prefill_on_the_hybrid_model_matches_one_shot() {
    chunked_prefill_matches_one_shot(hybrid(), "qwen35 tiny");
}

#[test]
fn chunked_prefill_on_the_demo_model_matches_one_shot() {
    let Some(m) = rewindable() else { return };
    chunked_prefill_matches_one_shot(m, "SmolLM2");
}

/// A prompt that arrives while another reply streams is prefilled inside that reply's decode
/// steps (one forward for the stream's row and the prompt's chunk, the weights read once),
/// and both replies are still exactly what each gets alone: the same tokens, the same
/// log-probabilities. With the pace on (chunks cut to the measured step) and off (fixed
/// chunks); with a sampled stream (plain decode steps) and a greedy one whose steps verify
/// drafts (prompt lookup, on by default for greedy replies), so the chunk shares steps of both
/// kinds.
fn a_prompt_prefilled_beside_a_stream_gets_its_tokens_alone(m: Arc<dyn CausalLm>, stream_tokens: usize, what: &str) {
    for (stream_req, drafts) in [(sampled(stream_tokens, 5), false), (greedy(stream_tokens), true)] {
        beside_a_stream(&m, stream_req, drafts, what);
    }
}

fn beside_a_stream(m: &Arc<dyn CausalLm>, stream_req: GenerateRequest, drafts: bool, what: &str) {
    let what = &format!("{what}, {} stream", if drafts { "greedy" } else { "sampled" });
    let stream_prompt = ids(12, 3);
    let (prompt, req) = (ids(300, 9), greedy(6));
    let (stream_alone, prompt_alone) = (alone(m, &stream_prompt, &stream_req), alone(m, &prompt, &req));
    for stall in [0.5, 0.0] {
        let config = SchedulerConfig { prefill_chunk: 32, prefill_stall: stall, ..Default::default() };
        let scheduler = Arc::new(Scheduler::start(m.clone(), config).unwrap());
        let (started_tx, started) = std::sync::mpsc::channel();
        let stream = {
            let (scheduler, stream_prompt, stream_req) =
                (Arc::clone(&scheduler), stream_prompt.clone(), stream_req.clone());
            std::thread::spawn(move || {
                scheduler.generate(stream_prompt, stream_req, |_| {
                    let _ = started_tx.send(());
                    ControlFlow::Continue(())
                })
            })
        };
        started.recv().unwrap();
        let got = scheduler.generate(prompt.clone(), req.clone(), |_| ControlFlow::Continue(())).unwrap();
        let streamed = stream.join().unwrap().unwrap();
        let st = scheduler.stats();
        let inside = st.fused_prefill_chunks.load(Ordering::Relaxed);
        assert!(inside >= 2, "{what}, stall {stall}: {inside} chunks of the prompt ran inside a decode step (of {} chunks; {} decode steps)", st.prefill_chunks.load(Ordering::Relaxed), st.decode_steps.load(Ordering::Relaxed));
        let drafted = st.drafted_tokens.load(Ordering::Relaxed);
        // (The prompt's own greedy reply may draft a few once it is in.)
        assert!(!drafts || drafted > 20, "{what}, stall {stall}: only {drafted} tokens drafted");
        // The prompt to the rounding of its chunks (as apart); the stream's steps keep their
        // bits exactly with a chunk in them.
        assert_same(&got, &prompt_alone, &format!("{what}, stall {stall}: the prompt prefilled beside a stream"));
        assert_close(&streamed, &stream_alone, 0.0, &format!("{what}, stall {stall}: the stream"));
    }
}

#[test]
fn a_prompt_prefilled_beside_a_stream_on_the_hybrid_model_gets_its_tokens_alone() {
    // The GGUF fixture has no MTP head; the checkpoint folder has one, so its greedy replies
    // draft with it and its sessions need hidden states from every forward, the prompt
    // chunk's included.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen35-tiny.gguf");
    let m = Arc::from(frognano_model::load::load(path.to_str().unwrap()).unwrap().model);
    a_prompt_prefilled_beside_a_stream_gets_its_tokens_alone(m, 400, "qwen35 tiny GGUF");
    let m = hybrid();
    assert!(m.mtp().is_some(), "the checkpoint fixture has its MTP head");
    a_prompt_prefilled_beside_a_stream_gets_its_tokens_alone(m, 400, "qwen35 tiny with its MTP head");
}

#[test]
fn a_prompt_prefilled_beside_a_stream_on_the_demo_model_gets_its_tokens_alone() {
    let Some(m) = rewindable() else { return };
    a_prompt_prefilled_beside_a_stream_gets_its_tokens_alone(m, 120, "SmolLM2");
}

/// What happened, in the order the scheduler thread did it.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Token(&'static str),
    Done(&'static str),
}

/// A sink that logs each token and the end of its job under a name.
struct Logging {
    name: &'static str,
    log: Arc<std::sync::Mutex<Vec<Seen>>>,
    first_token: Option<std::sync::mpsc::Sender<()>>,
}

impl TokenSink for Logging {
    fn token(&mut self, _: &TokenChoice) -> Flow {
        self.log.lock().unwrap().push(Seen::Token(self.name));
        if let Some(tx) = self.first_token.take() {
            let _ = tx.send(());
        }
        Flow::Continue
    }
    fn done(self: Box<Self>, _: Result<Generation, frognano_engine::EngineError>) {
        self.log.lock().unwrap().push(Seen::Done(self.name));
    }
}

#[test]
fn a_long_prompt_is_prefilled_between_the_decode_steps_of_running_sequences() {
    // Fixed chunks (no cutting to the measured pace), so the prompt is exactly 10 of them.
    let config = SchedulerConfig { prefill_chunk: 32, prefill_stall: 0.0, ..Default::default() };
    let scheduler = Scheduler::start(hybrid(), config).unwrap();
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (started_tx, started) = std::sync::mpsc::channel();
    let sink = |name, first_token| Box::new(Logging { name, log: Arc::clone(&log), first_token });
    scheduler
        .submit(Job {
            prompt: ids(10, 1),
            request: greedy(200),
            sink: sink("stream", Some(started_tx)),
            constraint: None,
        })
        .unwrap();
    started.recv().unwrap();
    // 320 prompt tokens: 10 chunks, each followed by a decode step of the running stream.
    scheduler
        .submit(Job { prompt: ids(320, 2), request: greedy(2), sink: sink("long", None), constraint: None })
        .unwrap();
    let t = std::time::Instant::now();
    while !log.lock().unwrap().contains(&Seen::Done("stream")) {
        assert!(t.elapsed().as_secs() < 120, "the stream did not end");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let log = log.lock().unwrap().clone();
    let long_first = log.iter().position(|e| *e == Seen::Token("long")).expect("the long prompt's first token");
    // Stream tokens between the submission of the long prompt (at the latest, the stream's
    // second token) and the long prompt's first token.
    let during = log[1..long_first].iter().filter(|e| **e == Seen::Token("stream")).count();
    assert!(during >= 9, "only {during} stream tokens while a 10-chunk prompt was prefilled: {log:?}");
}

/// A sink whose caller leaves after `checks` looks at it (the scheduler looks before it
/// starts the job and before each prefill chunk).
struct LeavesAfter {
    checks: std::sync::atomic::AtomicUsize,
    leave_at: usize,
    result: std::sync::mpsc::Sender<Result<Generation, String>>,
}

impl TokenSink for LeavesAfter {
    fn token(&mut self, _: &TokenChoice) -> Flow {
        Flow::Continue
    }
    fn done(self: Box<Self>, result: Result<Generation, frognano_engine::EngineError>) {
        let _ = self.result.send(result.map_err(|e| e.to_string()));
    }
    fn abandoned(&self) -> bool {
        self.checks.fetch_add(1, Ordering::SeqCst) + 1 >= self.leave_at
    }
}

#[test]
fn a_caller_that_leaves_during_prefill_stops_it_at_the_next_chunk() {
    let config = SchedulerConfig { prefill_chunk: 16, ..Default::default() };
    let scheduler = Scheduler::start(hybrid(), config).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // Looked at when the job starts (1) and before chunks 1 and 2 (2, 3); gone at the 4th look.
    let sink = LeavesAfter { checks: 0.into(), leave_at: 4, result: tx };
    scheduler.submit(Job { prompt: ids(400, 3), request: greedy(5), sink: Box::new(sink), constraint: None }).unwrap();
    let g = rx.recv().unwrap().unwrap();
    assert_eq!((g.finish, g.tokens.len()), (FinishReason::Cancelled, 0));
    let st = scheduler.stats();
    assert_eq!(st.prefill_chunks.load(Ordering::Relaxed), 2, "2 of the prompt's 25 chunks ran");
    assert_eq!(st.cancelled.load(Ordering::Relaxed), 1);
    // The next request runs at once, and the 32 tokens already in are reused.
    let next = scheduler.generate(ids(400, 3)[..40].to_vec(), greedy(2), |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(next.cached_tokens, 32);
    assert_eq!(st.prefilling.load(Ordering::Relaxed), 0);
}

/// The hybrid model, except that a prompt holding `poison` panics inside `forward`, as a bug
/// in a model's kernels would.
struct PanicsOn {
    inner: Arc<dyn CausalLm>,
    poison: u32,
}

impl CausalLm for PanicsOn {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn max_context(&self) -> usize {
        self.inner.max_context()
    }
    fn new_cache(&self) -> frognano_model::Cache {
        self.inner.new_cache()
    }
    fn forward(&self, ids: &[u32], cache: &mut frognano_model::Cache, all: bool) -> frognano_model::Result<Vec<f32>> {
        assert!(!ids.contains(&self.poison), "index out of bounds in a kernel (token {})", self.poison);
        self.inner.forward(ids, cache, all)
    }
    fn forward_batch(&self, batch: &mut [(u32, &mut frognano_model::Cache)]) -> frognano_model::Result<Vec<Vec<f32>>> {
        self.inner.forward_batch(batch)
    }
}

/// A sink that panics at its job's `at`-th token.
struct PanicsAt {
    at: usize,
    seen: usize,
    result: std::sync::mpsc::Sender<Result<Generation, String>>,
}

impl TokenSink for PanicsAt {
    fn token(&mut self, _: &TokenChoice) -> Flow {
        self.seen += 1;
        assert!(self.seen < self.at, "a sink bug at token {}", self.seen);
        Flow::Continue
    }
    fn done(self: Box<Self>, result: Result<Generation, frognano_engine::EngineError>) {
        let _ = self.result.send(result.map_err(|e| e.to_string()));
    }
}

/// Starts a stream of `prompt` on its own thread and, once its first token is out, submits a
/// prompt with `poison` in its 4th chunk of 8, which must fail with the kernel's panic named.
/// Returns the stream's thread.
fn stream_then_poison(
    scheduler: &Arc<Scheduler>,
    prompt: &[u32],
    req: GenerateRequest,
    poison: u32,
) -> std::thread::JoinHandle<Result<Generation, frognano_engine::EngineError>> {
    let (started_tx, started) = std::sync::mpsc::channel::<()>();
    let stream = {
        let (sch, p) = (Arc::clone(scheduler), prompt.to_vec());
        std::thread::spawn(move || {
            sch.generate(p, req, |_| {
                let _ = started_tx.send(());
                ControlFlow::Continue(())
            })
        })
    };
    started.recv().unwrap();
    let mut poisoned = ids(50, 5);
    poisoned[30] = poison; // in the prompt's 4th chunk
    let err = scheduler.generate(poisoned, greedy(3), |_| ControlFlow::Continue(())).unwrap_err().to_string();
    assert!(err.contains("panicked while prefilling") && err.contains("index out of bounds in a kernel"), "{err}");
    stream
}

#[test]
fn a_panic_in_one_jobs_work_fails_only_that_job() {
    let m = hybrid();
    let poison = 999;
    let model: Arc<dyn CausalLm> = Arc::new(PanicsOn { inner: m.clone(), poison });
    let scheduler =
        Arc::new(Scheduler::start(model, SchedulerConfig { prefill_chunk: 8, ..Default::default() }).unwrap());
    let prompt = ids(20, 4);
    let expected = alone(&m, &prompt, &greedy(200));
    // A stream runs while the other jobs fail around it.
    let stream = stream_then_poison(&scheduler, &prompt, greedy(200), poison);
    let (tx, rx) = std::sync::mpsc::channel();
    scheduler
        .submit(Job {
            prompt: ids(12, 6),
            request: greedy(10),
            sink: Box::new(PanicsAt { at: 3, seen: 0, result: tx }),
            constraint: None,
        })
        .unwrap();
    let err = rx.recv().unwrap().unwrap_err();
    assert!(err.contains("a sink bug at token 3"), "{err}");
    let got = stream.join().unwrap().unwrap();
    assert_same(&got, &expected, "the stream that ran beside the panics");
    let st = scheduler.stats();
    assert_eq!((st.panics.load(Ordering::Relaxed), st.failed.load(Ordering::Relaxed)), (2, 2));
    let after = scheduler.generate(ids(6, 7), greedy(2), |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(after.tokens.len(), 2, "the scheduler still serves");
}

/// A prompt whose chunk panics inside the streams' decode step (one forward for both) fails
/// alone: the stream's state goes back to where it was before that step (its snapshot at the
/// prompt's end, then its own tokens again, stepwise, as decode steps took them) and it goes
/// on to exactly the tokens it gets alone; the prompt's next chunk runs apart, panics again
/// there, and fails only its own job.
#[test]
fn a_prompt_chunk_that_panics_inside_a_decode_step_fails_only_its_own_job() {
    let m = hybrid();
    let poison = 999;
    let model: Arc<dyn CausalLm> = Arc::new(PanicsOn { inner: m.clone(), poison });
    let config = SchedulerConfig { prefill_chunk: 8, prefill_stall: 0.0, ..Default::default() };
    let scheduler = Arc::new(Scheduler::start(model, config).unwrap());
    let (prompt, req) = (ids(20, 4), sampled(300, 11));
    let expected = alone(&m, &prompt, &req);
    let stream = stream_then_poison(&scheduler, &prompt, req, poison);
    let st = scheduler.stats();
    let inside = st.fused_prefill_chunks.load(Ordering::Relaxed);
    assert!(inside >= 3, "the poisoned prompt's first chunks ran inside the stream's steps ({inside})");
    let got = stream.join().unwrap().unwrap();
    // Exactly: the random fixture's distributions are flat enough that a wrong state can keep
    // the sampled tokens and move the log-probabilities by less than assert_same's 1e-3.
    assert_close(&got, &expected, 0.0, "the stream whose step held the panicking chunk");
    assert_eq!((st.panics.load(Ordering::Relaxed), st.failed.load(Ordering::Relaxed)), (1, 1));
}

/// A sink that reports its generation (tokens and all) on a channel, under a name.
struct Reporting {
    name: &'static str,
    log: Arc<std::sync::Mutex<Vec<Seen>>>,
    result: std::sync::mpsc::Sender<(&'static str, Generation)>,
}

impl TokenSink for Reporting {
    fn token(&mut self, _: &TokenChoice) -> Flow {
        self.log.lock().unwrap().push(Seen::Token(self.name));
        Flow::Continue
    }
    fn done(self: Box<Self>, result: Result<Generation, frognano_engine::EngineError>) {
        self.log.lock().unwrap().push(Seen::Done(self.name));
        let _ = self.result.send((self.name, result.unwrap()));
    }
}

#[test]
fn a_short_prompt_does_not_wait_for_a_long_one_and_a_shared_long_prompt_is_forked() {
    let m = hybrid();
    let config = SchedulerConfig { prefill_chunk: 32, prefill_stall: 0.0, ..Default::default() };
    let scheduler = Scheduler::start(m.clone(), config).unwrap();
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let job = |name, prompt: Vec<u32>| Job {
        prompt,
        request: greedy(3),
        sink: Box::new(Reporting { name, log: Arc::clone(&log), result: tx.clone() }),
        constraint: None,
    };
    // Queued together: the long prompt (40 chunks) starts first, the short one beside it.
    let long = ids(1280, 9);
    scheduler.submit_all(vec![job("long", long.clone()), job("short", (500..510).collect())]).unwrap();
    let mut got: Vec<(&str, Generation)> = (0..2).map(|_| rx.recv().unwrap()).collect();
    got.sort_by_key(|(name, _)| *name);
    let log = log.lock().unwrap().clone();
    let short_done = log.iter().position(|e| *e == Seen::Done("short")).unwrap();
    let long_first = log.iter().position(|e| *e == Seen::Token("long")).unwrap();
    assert!(short_done < long_first, "the short prompt waited for the long one: {log:?}");
    assert_same(&got[0].1, &alone(&m, &long, &greedy(3)), "the long prompt, prefilled in turns");

    // Two jobs with one new long prompt: the second waits for the first and forks its state.
    let shared = ids(1280, 11);
    scheduler.submit_all(vec![job("a", shared.clone()), job("b", shared.clone())]).unwrap();
    let mut got: Vec<(&str, Generation)> = (0..2).map(|_| rx.recv().unwrap()).collect();
    got.sort_by_key(|(name, _)| *name);
    assert_eq!(got[0].1.cached_tokens, 0);
    assert_eq!(got[1].1.cached_tokens, shared.len(), "the second copy of the prompt was prefilled again");
    assert_eq!(token_ids(&got[0].1), token_ids(&got[1].1));
}
