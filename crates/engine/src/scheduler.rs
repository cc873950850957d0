//! The request scheduler: one thread runs every generation of a model, so concurrent callers
//! (the HTTP server's clients, the G attempts of a training group, parallel evaluation jobs)
//! share one batched decode step and one pool of sessions.
//!
//! - **Batching.** Each loop iteration advances every running sequence with a single
//!   [`speculative_decode_step`] (one [`frognano_model::CausalLm::forward_batch_stepwise`]):
//!   the weights are read once per step for the whole batch. A sequence takes one token, or
//!   several when its drafts ([`SchedulerConfig::speculative`]) are accepted.
//!   [`SchedulerConfig::max_batch`] bounds the batch.
//! - **Chunked prefill.** A new job's prompt is run a chunk per iteration, so one long prompt
//!   delays each running sequence's next token by one chunk's time instead of the whole
//!   prompt's. While sequences are decoding, the chunk runs inside their decode step
//!   ([`speculative_decode_step_with_prompt`]: one forward, the weights read once for the
//!   streams' rows and the chunk's), cut so that the step takes about
//!   `1 + `[`SchedulerConfig::prefill_stall`] times its time alone (both timed as the
//!   scheduler goes); otherwise it runs apart, of [`SchedulerConfig::prefill_chunk`] tokens. Several
//!   prompts may be under way, taking chunks in turn, so a short prompt does not wait for a
//!   long one; a job that shares more than a few chunks of prefix with one under way waits
//!   for it instead and forks its finished state. Before each chunk the job's sink is asked
//!   whether its caller is still there; a job whose caller left is dropped at that chunk.
//! - **Fault isolation.** The work of one job (its prefill chunks, its sampling, its sink) runs
//!   under `catch_unwind`: a panic fails that job with [`EngineError::Failed`] naming the
//!   panic, its session is dropped, and the scheduler goes on with the others. A panic inside
//!   the batched forward of a decode step cannot be pinned on one sequence; it fails the
//!   sequences of that step only.
//! - **Prefix reuse.** Sessions are kept between jobs and routed by shared prefix: a request
//!   that extends an earlier conversation lands on the session that already holds its state
//!   and only runs the new tokens.
//! - **Prefix sharing.** When the session sharing the longest prefix is busy, or holds a
//!   longer conversation that reusing it would cut back, the new job starts from a *fork* of
//!   it ([`Session::fork`]: a copy of the state at the shared prefix) instead of recomputing
//!   the prefix. G attempts of one task submitted together prefill their common prompt once.
//!
//! Output goes to a [`TokenSink`] per job, called on the scheduler thread; the sink decides
//! whether the generation goes on (a stop string ends it; a caller that went away abandons it).
//! [`Scheduler::generate`] is the blocking convenience for callers on their own thread.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use frognano_model::CausalLm;

use crate::constraint::Constraint;
use crate::persist::SessionStore;
use crate::sampler::TokenChoice;
use crate::session::{
    speculative_decode_step_with_prompt, ChunkOutcome, Decoding, EngineError, FinishReason, GenerateRequest,
    Generation, PromptChunk, Session,
};
use crate::speculative::SpeculativeMode;

/// What a sink says after each token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep generating.
    Continue,
    /// The output is complete (a stop string matched): end the generation; it counts as
    /// completed.
    Stop,
    /// Nobody wants the output any more (the client went away): drop the sequence; it counts
    /// as cancelled.
    Abandon,
}

/// Where a job's output goes. Called on the scheduler thread, so it must not block.
pub trait TokenSink: Send {
    /// A new token. The returned [`Flow`] decides whether generation goes on.
    fn token(&mut self, choice: &TokenChoice) -> Flow;
    /// The generation ended (or failed; a job abandoned during its prefill ends as
    /// [`FinishReason::Cancelled`] with no tokens). Called exactly once, last, unless the job
    /// was abandoned before it started.
    fn done(self: Box<Self>, result: Result<Generation, EngineError>);
    /// True when nobody waits for the output any more (checked before a queued job starts and
    /// before each of its prefill chunks).
    fn abandoned(&self) -> bool {
        false
    }
}

/// One generation to run.
pub struct Job {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Sampling, length and stop ids.
    pub request: GenerateRequest,
    /// Where the tokens and the result go.
    pub sink: Box<dyn TokenSink>,
    /// A grammar every token is sampled under (structured outputs, forced tool calls); its
    /// masks are computed on the constraint's own thread during the decode steps.
    pub constraint: Option<Constraint>,
}

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most sequences generated at once: the largest decode batch.
    pub max_batch: usize,
    /// Sessions kept in all (busy and idle); idle ones hold earlier conversations for reuse.
    /// At least `max_batch`.
    pub sessions: usize,
    /// Route requests to the session with the longest shared prefix and fork shared
    /// prefixes (false: every request starts from an empty state, for measuring what reuse
    /// saves).
    pub prefix_reuse: bool,
    /// Most jobs waiting to be admitted before new ones are refused.
    pub max_waiting: usize,
    /// The most prompt tokens prefilled per scheduler iteration (between two decode steps of
    /// the running sequences), and the chunk when no sequence is decoding. At least
    /// [`MIN_PREFILL_CHUNK`] (smaller values run as that).
    pub prefill_chunk: usize,
    /// While sequences are decoding: the time one prefill chunk may add to their decode
    /// step, as a fraction of the step's time alone, so their inter-token latency during a
    /// long prefill stays within about `1 + prefill_stall` times its normal value. The chunk
    /// is cut from the measured times of recent steps with and without a chunk (of chunks
    /// apart: per token), between [`MIN_PREFILL_CHUNK`] and `prefill_chunk`. 0: always
    /// `prefill_chunk` tokens. Smaller: streams stall less; larger: the long prompt goes
    /// faster.
    pub prefill_stall: f64,
    /// Run a prompt's chunks inside the running sequences' decode steps (one forward, the
    /// weights read once; [`speculative_decode_step_with_prompt`]) rather than apart before
    /// them (false: for measuring what that saves).
    pub prefill_inside_step: bool,
    /// Conversation states on disk (`serve --session-dir`): every finished reply's state is
    /// saved there, and a prompt that extends a saved state further than any session in
    /// memory starts from it (after a restart, or once its session has been let go).
    pub store: Option<Arc<SessionStore>>,
    /// Drafting in the decode steps (`--speculative`; docs/speculative.md): each sequence
    /// whose reply copies its context checks its drafts within the batched step
    /// ([`speculative_decode_step`]). `auto` (the default) drafts for greedy replies while
    /// the drafts pay; sampled replies decode plainly.
    pub speculative: SpeculativeMode,
}

/// [`SchedulerConfig::prefill_stall`]'s default (bench/RESULTS.md, "Serve fairness").
pub const DEFAULT_PREFILL_STALL: f64 = 0.5;

/// The chunk of a prompt whose prefill starts while sequences are decoding and no prefill has
/// been timed yet: small, so the first piece does not stall them while it measures the pace.
const FIRST_TIMED_CHUNK: usize = 16;

/// The smallest prefill chunk: a one-token chunk would run through the model's one-token
/// kernels, whose rounding differs from a prompt's (quantized models), so a chunked prefill
/// would no longer give the logits of a one-shot one.
pub const MIN_PREFILL_CHUNK: usize = 2;

/// [`SchedulerConfig::prefill_chunk`]'s default (bench/RESULTS.md, "Serve fairness").
pub const DEFAULT_PREFILL_CHUNK: usize = 256;

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_batch: 8,
            sessions: 16,
            prefix_reuse: true,
            max_waiting: 1024,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            prefill_stall: DEFAULT_PREFILL_STALL,
            prefill_inside_step: true,
            store: None,
            speculative: SpeculativeMode::default(),
        }
    }
}

/// Counters, for `/health`, metrics and tests.
#[derive(Debug, Default)]
pub struct SchedulerStats {
    /// Sequences being generated now (the decode batch).
    pub running: AtomicUsize,
    /// Jobs waiting to be admitted.
    pub waiting: AtomicUsize,
    /// Jobs that ran to their end.
    pub completed: AtomicU64,
    /// Jobs abandoned by their caller.
    pub cancelled: AtomicU64,
    /// Jobs that failed in the engine (panics included).
    pub failed: AtomicU64,
    /// Jobs failed by a panic in their own work or in the decode step they were part of.
    pub panics: AtomicU64,
    /// Jobs whose prompt is being prefilled now.
    pub prefilling: AtomicUsize,
    /// Prefill chunks run, all jobs together.
    pub prefill_chunks: AtomicU64,
    /// Prefill chunks that ran inside a decode step's forward, beside the running sequences'
    /// rows (part of `prefill_chunks`).
    pub fused_prefill_chunks: AtomicU64,
    /// Tokens in the last prefill chunk.
    pub last_prefill_chunk: AtomicUsize,
    /// Tokens generated, all jobs together.
    pub generated_tokens: AtomicU64,
    /// Prompt tokens, all jobs together.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens served from a kept or forked state instead of being recomputed.
    pub cached_tokens: AtomicU64,
    /// Jobs that started from a fork of another session's state.
    pub forks: AtomicU64,
    /// Jobs that started from a state restored from the session store
    /// ([`SchedulerConfig::store`]).
    pub restored: AtomicU64,
    /// Decode steps run, and the sequences they advanced (their ratio is the mean batch).
    pub decode_steps: AtomicU64,
    /// Sequences advanced by decode steps, all steps together.
    pub decoded_rows: AtomicU64,
    /// Tokens drafted by speculation ([`SchedulerConfig::speculative`]), all steps together.
    pub drafted_tokens: AtomicU64,
    /// Drafted tokens the model agreed with (each one a token with no forward of its own).
    pub accepted_tokens: AtomicU64,
}

/// A job refused because too many are waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the scheduler queue is full ({waiting} jobs waiting)")]
pub struct QueueFull {
    /// Jobs waiting.
    pub waiting: usize,
}

struct IdleSession {
    session: Session,
    last_used: u64,
}

struct Shared {
    model: Arc<dyn CausalLm>,
    config: SchedulerConfig,
    queue: Mutex<VecDeque<Job>>,
    queue_signal: Condvar,
    idle: Mutex<Vec<IdleSession>>,
    /// Sessions in existence (idle + in use).
    session_count: AtomicUsize,
    clock: AtomicU64,
    shutdown: AtomicBool,
    stats: SchedulerStats,
}

/// The scheduler of one model. Dropping it stops its thread; sequences still running end
/// without a result (their sinks are dropped).
pub struct Scheduler {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A sink that panicked mid-job leaves plain data behind; keep serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Scheduler {
    /// Starts the scheduler thread over `model`.
    pub fn start(model: Arc<dyn CausalLm>, config: SchedulerConfig) -> std::io::Result<Self> {
        let max_batch = config.max_batch.max(1);
        let config = SchedulerConfig {
            max_batch,
            sessions: config.sessions.max(max_batch),
            prefill_chunk: config.prefill_chunk.max(MIN_PREFILL_CHUNK),
            ..config
        };
        let shared = Arc::new(Shared {
            model,
            config,
            queue: Mutex::new(VecDeque::new()),
            queue_signal: Condvar::new(),
            idle: Mutex::new(Vec::new()),
            session_count: AtomicUsize::new(0),
            clock: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            stats: SchedulerStats::default(),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new().name("frognano-scheduler".into()).spawn(move || run(&s))?;
        Ok(Scheduler { shared, thread: Some(thread) })
    }

    /// Queues a job.
    pub fn submit(&self, job: Job) -> Result<(), QueueFull> {
        let mut q = lock(&self.shared.queue);
        if q.len() >= self.shared.config.max_waiting {
            return Err(QueueFull { waiting: q.len() });
        }
        q.push_back(job);
        self.shared.stats.waiting.store(q.len(), Ordering::Relaxed);
        drop(q);
        self.shared.queue_signal.notify_one();
        Ok(())
    }

    /// Queues several jobs at once, or none of them: when they do not all fit under
    /// [`SchedulerConfig::max_waiting`] none is queued (a request with many prompts is taken
    /// whole or refused whole).
    pub fn submit_all(&self, jobs: Vec<Job>) -> Result<(), QueueFull> {
        let mut q = lock(&self.shared.queue);
        if q.len() + jobs.len() > self.shared.config.max_waiting {
            return Err(QueueFull { waiting: q.len() });
        }
        q.extend(jobs);
        self.shared.stats.waiting.store(q.len(), Ordering::Relaxed);
        drop(q);
        self.shared.queue_signal.notify_one();
        Ok(())
    }

    /// Runs one generation and waits for it, calling `on_token` (on this thread) for every
    /// token as it arrives; `ControlFlow::Break` ends the generation (as a stop string does).
    pub fn generate(
        &self,
        prompt: Vec<u32>,
        request: GenerateRequest,
        on_token: impl FnMut(&TokenChoice) -> ControlFlow<()>,
    ) -> Result<Generation, EngineError> {
        self.generate_constrained(prompt, request, None, on_token)
    }

    /// [`generate`](Self::generate) with every token sampled under `constraint`'s grammar.
    pub fn generate_constrained(
        &self,
        prompt: Vec<u32>,
        request: GenerateRequest,
        constraint: Option<Constraint>,
        mut on_token: impl FnMut(&TokenChoice) -> ControlFlow<()>,
    ) -> Result<Generation, EngineError> {
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let sink = ChannelSink { events: tx, stop: Arc::clone(&stop) };
        self.submit(Job { prompt, request, sink: Box::new(sink), constraint })
            .map_err(|e| EngineError::Request(e.to_string()))?;
        loop {
            match rx.recv() {
                Ok(Event::Token(choice)) => {
                    if on_token(&choice).is_break() {
                        stop.store(true, Ordering::SeqCst);
                    }
                }
                Ok(Event::Done(result)) => return result,
                Err(_) => return Err(EngineError::Request("the scheduler stopped before the generation ended".into())),
            }
        }
    }

    /// The counters.
    pub fn stats(&self) -> &SchedulerStats {
        &self.shared.stats
    }

    /// The settings in force.
    pub fn config(&self) -> &SchedulerConfig {
        &self.shared.config
    }

    /// The model it runs.
    pub fn model(&self) -> &Arc<dyn CausalLm> {
        &self.shared.model
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.queue_signal.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

enum Event {
    Token(TokenChoice),
    Done(Result<Generation, EngineError>),
}

/// The sink behind [`Scheduler::generate`]: tokens go over a channel to the waiting caller,
/// which asks for a stop through a flag (its callback runs a token late, on its own thread).
struct ChannelSink {
    events: mpsc::Sender<Event>,
    stop: Arc<AtomicBool>,
}

impl TokenSink for ChannelSink {
    fn token(&mut self, choice: &TokenChoice) -> Flow {
        if self.stop.load(Ordering::SeqCst) {
            return Flow::Stop;
        }
        match self.events.send(Event::Token(choice.clone())) {
            Ok(()) => Flow::Continue,
            Err(_) => Flow::Abandon,
        }
    }
    fn done(self: Box<Self>, result: Result<Generation, EngineError>) {
        let _ = self.events.send(Event::Done(result));
    }
}

/// A sequence in the decode batch.
struct Running {
    session: Session,
    decoding: Decoding,
    sink: Box<dyn TokenSink>,
    abandoned: bool,
    /// Set when the job's own work panicked (its sink, its sampling); it then fails.
    failure: Option<EngineError>,
}

impl Running {
    /// Hands a step's tokens to the sink in order; when it stops the generation, the tokens
    /// after the one that stopped it were never seen and are not part of the reply.
    fn take_tokens(&mut self, new: &[TokenChoice]) {
        for (i, choice) in new.iter().enumerate() {
            if !self.take_token(choice) {
                self.decoding.cancel_unseen(new.len() - i - 1);
                break;
            }
        }
    }

    /// Hands one token to the sink; false when the sink ended the generation with it.
    fn take_token(&mut self, choice: &TokenChoice) -> bool {
        let flow = catch_unwind(AssertUnwindSafe(|| self.sink.token(choice)));
        match flow {
            Ok(Flow::Continue) => return true,
            Ok(Flow::Stop) => {}
            Ok(Flow::Abandon) => self.abandoned = true,
            Err(panic) => self.failure = Some(panicked("while handing out a token", panic.as_ref())),
        }
        self.decoding.cancel();
        false
    }
}

/// A job whose prompt is being prefilled, a chunk per scheduler iteration.
struct Prefilling {
    session: Session,
    prompt: Vec<u32>,
    request: GenerateRequest,
    sink: Box<dyn TokenSink>,
    constraint: Option<Constraint>,
    /// Prompt tokens reused from the session's earlier state.
    cached_tokens: usize,
    /// Run its chunks apart from the decode steps: a step with one of its chunks inside
    /// panicked, and apart a panic fails only the job it belongs to.
    apart: bool,
}

/// The error of a job whose work panicked: what it was doing and the panic's message.
fn panicked(doing: &str, payload: &(dyn std::any::Any + Send)) -> EngineError {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    EngineError::Failed(format!("the engine panicked {doing}: {message}"))
}

/// Recent timings the prefill chunk is cut from while sequences are decoding
/// ([`SchedulerConfig::prefill_stall`]); moving averages, as both change with the batch and
/// the position.
#[derive(Default)]
struct Pace {
    /// Seconds per batched decode step without a prompt chunk in it.
    decode_secs: Option<f64>,
    /// Sequences in the last decode step timed in `decode_secs`.
    decode_rows: usize,
    /// Seconds per prefilled prompt token, of chunks run apart from a decode step.
    prefill_secs_per_token: Option<f64>,
    /// The chunk a decode step takes in beside its sequences (0: none timed yet).
    fused_chunk: usize,
    /// Decode steps with a chunk in them since the last one without.
    fused_steps: usize,
}

/// Decode steps with a prompt chunk in them before one without, which times the step again:
/// the running sequences' contexts grow, and what a step costs with them.
const RETIME_AFTER: usize = 16;

/// Whether chunks are cut to the measured pace (`prefill_stall` above 0) rather than fixed.
fn paced(config: &SchedulerConfig) -> bool {
    config.prefill_stall > 0.0 // NaN is not
}

/// How the next prompt chunk runs ([`Pace::beside`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkMode {
    /// Apart from the decode step (no sequence is decoding): this many tokens.
    Apart(usize),
    /// Inside the decode step: this many tokens.
    Inside(usize),
    /// Not this iteration: the decode step runs alone, to be timed.
    Wait,
}

impl Pace {
    fn update(old: &mut Option<f64>, new: f64) {
        *old = Some(old.map_or(new, |o| 0.7 * o + 0.3 * new));
    }

    /// How the next chunk runs when `rows` sequences are decoding. A chunk inside the decode
    /// step shares its read of the weights, so it is cut from what the step costs with it
    /// against what it costs alone ([`Pace::after_inside`]); that needs a recent time of the
    /// step alone at about this batch, and when there is none the step first runs alone.
    fn beside(&self, config: &SchedulerConfig, rows: usize) -> ChunkMode {
        if rows == 0 || !config.prefill_inside_step {
            return ChunkMode::Apart(self.chunk(config, rows > 0));
        }
        if !paced(config) {
            return ChunkMode::Inside(config.prefill_chunk);
        }
        let timed = self.decode_secs.is_some() && rows.abs_diff(self.decode_rows) <= self.decode_rows / 4;
        if !timed || self.fused_steps >= RETIME_AFTER {
            return ChunkMode::Wait;
        }
        let chunk = if self.fused_chunk == 0 { FIRST_TIMED_CHUNK } else { self.fused_chunk };
        ChunkMode::Inside(chunk.clamp(MIN_PREFILL_CHUNK, config.prefill_chunk))
    }

    /// After a decode step that took `asked` tokens of a prompt in (`ran` of them ran) in
    /// `secs`: the next chunk grows or shrinks toward the size whose extra time over the step
    /// alone is `prefill_stall` of that step. The step's time is not linear in the chunk
    /// (while the weights' read bounds it, rows cost almost nothing; then each costs its
    /// arithmetic), so the size moves by the square root of the ratio, at most ×1.4 or ÷1.4
    /// a step, and settles instead of swinging between the two regimes.
    fn after_inside(&mut self, config: &SchedulerConfig, secs: f64, asked: usize, ran: usize) {
        self.fused_steps += 1;
        let Some(alone) = self.decode_secs else { return };
        if ran < asked || ran == 0 {
            return; // the prompt's end or a checkpoint cut it: it says nothing of the size
        }
        let extra = (secs - alone).max(0.02 * alone);
        let ratio = (config.prefill_stall * alone / extra).clamp(0.5, 2.0);
        self.fused_chunk =
            ((ran as f64 * ratio.sqrt()).round() as usize).clamp(MIN_PREFILL_CHUNK, config.prefill_chunk);
    }

    /// After a decode step with no prompt chunk in it, of `rows` sequences, in `secs`.
    fn after_alone(&mut self, secs: f64, rows: usize) {
        if self.decode_rows != rows {
            self.decode_secs = None; // another batch: its own time, not an average with the old one's
        }
        Pace::update(&mut self.decode_secs, secs);
        self.decode_rows = rows;
        self.fused_steps = 0;
    }

    /// The chunk to run apart from the decode step now; `decoding`: some sequence will take a
    /// decode step after it.
    fn chunk(&self, config: &SchedulerConfig, decoding: bool) -> usize {
        if !decoding || !paced(config) {
            return config.prefill_chunk;
        }
        match (self.decode_secs, self.prefill_secs_per_token) {
            (Some(step), Some(per_token)) if per_token > 0.0 => {
                let fits = (step * config.prefill_stall / per_token) as usize;
                fits.clamp(MIN_PREFILL_CHUNK, config.prefill_chunk)
            }
            _ => FIRST_TIMED_CHUNK.clamp(MIN_PREFILL_CHUNK, config.prefill_chunk),
        }
    }
}

/// The scheduler loop: when the batch has room, start the next waiting job's prefill; run one
/// chunk of the prompt whose turn it is (a finished prompt samples its first token and joins
/// the batch); then one batched decode step for every running sequence; finished sequences
/// leave.
fn run(shared: &Arc<Shared>) {
    let mut running: Vec<Running> = Vec::new();
    // Prompts being prefilled, in turn: the front one runs a chunk and goes to the back.
    let mut prefilling: VecDeque<Prefilling> = VecDeque::new();
    // Jobs whose starting state is being read from the session store on a thread of its own.
    let mut restoring: Vec<Restoring> = Vec::new();
    let mut pace = Pace::default();
    loop {
        let job = {
            let mut q = lock(&shared.queue);
            loop {
                if shared.shutdown.load(Ordering::SeqCst) {
                    return;
                }
                if running.len() + prefilling.len() + restoring.len() < shared.config.max_batch
                    && q.front().is_some_and(|job| may_start_beside(shared, job, &prefilling))
                {
                    let job = q.pop_front();
                    shared.stats.waiting.store(q.len(), Ordering::Relaxed);
                    break job;
                }
                if !running.is_empty() || !prefilling.is_empty() || restoring.iter().any(Restoring::is_done) {
                    break None;
                }
                // A restore thread signals when it is done.
                q = shared.queue_signal.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        if let Some(job) = job {
            match begin(shared, job, &running) {
                Begun::Prefill(p) => prefilling.push_back(p),
                Begun::Restoring(r) => restoring.push(r),
                Begun::Ended => {}
            }
        }
        let (done, waiting): (Vec<Restoring>, Vec<Restoring>) = restoring.into_iter().partition(Restoring::is_done);
        restoring = waiting;
        for r in done {
            prefilling.extend(r.finish(shared, &running));
        }
        let rows = running.iter().filter(|r| !r.decoding.is_finished()).count();
        // The prompt whose next chunk runs inside this iteration's decode step, and its size.
        let mut inside: Option<(Prefilling, usize)> = None;
        if let Some(p) = prefilling.pop_front() {
            let mode = match pace.beside(&shared.config, rows) {
                ChunkMode::Inside(_) | ChunkMode::Wait if p.apart => ChunkMode::Apart(pace.chunk(&shared.config, true)),
                mode => mode,
            };
            match mode {
                ChunkMode::Apart(chunk) => {
                    prefill_step(shared, p, chunk, &mut pace).place(&mut running, &mut prefilling)
                }
                ChunkMode::Inside(chunk) => inside = still_wanted(shared, p).map(|p| (p, chunk)),
                ChunkMode::Wait => prefilling.push_front(p),
            }
        }
        shared.stats.prefilling.store(prefilling.len() + usize::from(inside.is_some()), Ordering::Relaxed);
        shared.stats.running.store(running.len(), Ordering::Relaxed);
        // A chunk that the step ran (with its outcome and size), or one it left to run apart.
        let (mut ran_inside, mut left_over) = (None, None);
        if rows > 0 {
            let mut batch: Vec<(&mut Session, &mut Decoding)> =
                running.iter_mut().map(|r| (&mut r.session, &mut r.decoding)).collect();
            let speculated = |batch: &[(&mut Session, &mut Decoding)]| {
                batch.iter().fold((0, 0), |(d, a), (s, _)| {
                    let st = s.speculation_stats();
                    (d + st.drafted, a + st.accepted)
                })
            };
            let before = speculated(&batch);
            let prompt_before = inside.as_ref().map_or(0, |(p, _)| p.session.tokens().len());
            let chunk = inside.as_mut().map(|(p, chunk)| PromptChunk {
                session: &mut p.session,
                prompt: &p.prompt,
                max_tokens: *chunk,
                checkpoint: p.request.checkpoint,
            });
            let started = std::time::Instant::now();
            let step = catch_unwind(AssertUnwindSafe(|| speculative_decode_step_with_prompt(&mut batch, chunk)));
            let secs = started.elapsed().as_secs_f64();
            let after = speculated(&batch);
            drop(batch);
            match step {
                Ok(Ok((tokens, outcome))) => {
                    let stats = &shared.stats;
                    stats.decode_steps.fetch_add(1, Ordering::Relaxed);
                    stats.decoded_rows.fetch_add(rows as u64, Ordering::Relaxed);
                    stats.drafted_tokens.fetch_add(after.0.saturating_sub(before.0), Ordering::Relaxed);
                    stats.accepted_tokens.fetch_add(after.1.saturating_sub(before.1), Ordering::Relaxed);
                    match (outcome, inside.take()) {
                        (Some(outcome), Some((p, chunk))) => {
                            let ran = p.session.tokens().len().saturating_sub(prompt_before);
                            pace.after_inside(&shared.config, secs, chunk, ran);
                            stats.fused_prefill_chunks.fetch_add(1, Ordering::Relaxed);
                            ran_inside = Some((p, outcome, ran));
                        }
                        (_, p) => {
                            pace.after_alone(secs, rows);
                            left_over = p.map(|(p, _)| p);
                        }
                    }
                    for (r, new) in running.iter_mut().zip(tokens) {
                        r.take_tokens(&new);
                    }
                }
                Ok(Err(e)) => {
                    // The step changed no state, but it cannot go on; every sequence fails,
                    // and the prompt whose chunk was in it.
                    for r in running.drain(..) {
                        fail(shared, r.session, r.sink, e.for_batch_member());
                    }
                    if let Some((p, _)) = inside.take() {
                        fail(shared, p.session, p.sink, e.for_batch_member());
                    }
                }
                Err(panic) => {
                    let e = panicked("in a batched decode step", panic.as_ref());
                    match inside.take() {
                        // With a prompt's chunk inside, the panic may be the prompt's or the
                        // streams'. Each session goes back to its state before the step
                        // (`Session::recover`); the streams go on, and the prompt runs its
                        // chunks apart from now on, so a panic that comes again fails only the
                        // job it belongs to.
                        Some((mut p, _)) => {
                            let mut kept = Vec::with_capacity(running.len());
                            for mut r in running.drain(..) {
                                let prompt_len = r.decoding.prompt_tokens();
                                let back = r.decoding.is_finished()
                                    || matches!(
                                        catch_unwind(AssertUnwindSafe(|| r.session.recover(prompt_len))),
                                        Ok(Ok(()))
                                    );
                                if back {
                                    kept.push(r);
                                } else {
                                    fail_panicked(shared, r.session, r.sink, e.for_batch_member());
                                }
                            }
                            running = kept;
                            let prompt_len = p.prompt.len();
                            match catch_unwind(AssertUnwindSafe(|| p.session.recover(prompt_len))) {
                                Ok(Ok(())) => {
                                    p.apart = true;
                                    left_over = Some(p);
                                }
                                _ => fail_panicked(shared, p.session, p.sink, e.for_batch_member()),
                            }
                        }
                        // The caches of the step's sequences may be half updated: their
                        // sessions are dropped, and only the sequences of this step fail.
                        None => {
                            for r in running.drain(..) {
                                fail_panicked(shared, r.session, r.sink, e.for_batch_member());
                            }
                        }
                    }
                }
            }
        }
        // A chunk the step did not take in (longer than a prompt piece; or its step panicked
        // and every session came back) runs apart, cut as chunks beside a step always were.
        if let Some(p) = left_over.or(inside.map(|(p, _)| p)) {
            let chunk = pace.chunk(&shared.config, running.iter().any(|r| !r.decoding.is_finished()));
            prefill_step(shared, p, chunk, &mut pace).place(&mut running, &mut prefilling);
        }
        if let Some((p, outcome, ran)) = ran_inside {
            after_chunk(shared, p, Ok(outcome), ran).place(&mut running, &mut prefilling);
        }
        let (done, still): (Vec<_>, Vec<_>) = running.into_iter().partition(|r| r.decoding.is_finished());
        running = still;
        // Counted before the callers hear their end, so `/health` agrees with them.
        shared.stats.running.store(running.len(), Ordering::Relaxed);
        for r in done {
            finish(shared, r);
        }
    }
}

/// Whether `job` may start its prefill while `prefilling` ones are under way (they take
/// chunks in turn, so a short prompt need not wait for a long one). Not when it shares more
/// than a chunk's worth of prefix with one of them: it then waits for that one to finish and
/// forks its state, which saves more than it costs (the G attempts of one task, submitted
/// together, prefill their prompt once).
fn may_start_beside(shared: &Shared, job: &Job, prefilling: &VecDeque<Prefilling>) -> bool {
    let worth_a_fork = shared.config.prefill_chunk.min(FIRST_TIMED_CHUNK * 4);
    prefilling.iter().all(|p| shared_prefix(&p.prompt, &job.prompt) <= worth_a_fork)
}

/// What became of a job taken from the queue.
enum Begun {
    /// Its prefill is under way.
    Prefill(Prefilling),
    /// Its starting state is being read from the session store.
    Restoring(Restoring),
    /// It ended right away (abandoned while waiting, or refused); its sink has been told.
    Ended,
}

/// A job waiting for its starting state from the session store
/// ([`SchedulerConfig::store`]). The store reads it on a thread of its own (a 32K-token state
/// of the 4B shapes takes about half a second), so the running sequences keep decoding
/// meanwhile.
struct Restoring {
    job: Job,
    result: mpsc::Receiver<Option<(Session, usize)>>,
    /// The restored state (or `None`: nothing could be restored), once it has arrived.
    arrived: std::cell::OnceCell<Option<Session>>,
}

impl Restoring {
    fn is_done(&self) -> bool {
        if self.arrived.get().is_some() {
            return true;
        }
        match self.result.try_recv() {
            Ok(restored) => self.arrived.set(restored.map(|(session, _)| session)).is_ok(),
            // The thread ended without an answer (it panicked): start without a restore.
            Err(mpsc::TryRecvError::Disconnected) => self.arrived.set(None).is_ok(),
            Err(mpsc::TryRecvError::Empty) => false,
        }
    }

    /// Starts the job's prefill from the restored state, or as any job starts when none
    /// arrived.
    fn finish(self, shared: &Shared, running: &[Running]) -> Option<Prefilling> {
        let restored = self.arrived.into_inner().flatten();
        let session = match restored {
            Some(session) => {
                shared.stats.restored.fetch_add(1, Ordering::Relaxed);
                let mut idle = lock(&shared.idle);
                if shared.session_count.load(Ordering::SeqCst) >= shared.config.sessions && !idle.is_empty() {
                    let lru = least_recently_used(&idle);
                    idle.swap_remove(lru);
                } else {
                    shared.session_count.fetch_add(1, Ordering::SeqCst);
                }
                session
            }
            None => take_session(shared, &self.job.prompt, running),
        };
        start_prefill(shared, self.job, session)
    }
}

/// Starts a job: checks it, then takes the session for its prompt and begins the prefill, or
/// first has the session store read a saved state when that reaches further into the prompt
/// than any state in memory.
fn begin(shared: &Arc<Shared>, job: Job, running: &[Running]) -> Begun {
    let Job { prompt, request, sink, constraint } = job;
    if sink.abandoned() {
        shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
        return Begun::Ended; // the caller left while waiting
    }
    // Checked before any chunk runs, so a bad id at the end of a long prompt costs nothing
    // (the model would refuse it only at its chunk).
    let vocab = shared.model.vocab_size();
    let bad_id = prompt.iter().find(|&&t| t as usize >= vocab);
    let checked = match (request.sampling.validate(), bad_id) {
        (Err(e), _) => Err(EngineError::Request(e)),
        (_, Some(bad)) => {
            Err(EngineError::Request(format!("token id {bad} is out of vocabulary (vocab_size {vocab})")))
        }
        _ => Ok(()),
    };
    if let Err(e) = checked {
        shared.stats.failed.fetch_add(1, Ordering::Relaxed);
        report(shared, sink, Err(e));
        return Begun::Ended;
    }
    let job = Job { prompt, request, sink, constraint };
    if let Some(store) = shared.config.store.as_ref().filter(|_| shared.config.prefix_reuse) {
        let in_memory = in_memory_prefix(shared, &job.prompt, running);
        if store.can_restore(&job.prompt, in_memory) {
            let (tx, result) = mpsc::channel();
            let (store, model, prompt) = (Arc::clone(store), Arc::clone(&shared.model), job.prompt.clone());
            let signal = Arc::clone(shared);
            let spawned = std::thread::Builder::new().name("session-restore".into()).spawn(move || {
                let restored = catch_unwind(AssertUnwindSafe(|| store.restore(&prompt, in_memory, &model)));
                let _ = tx.send(restored.unwrap_or(None));
                // Wakes the scheduler if it waits for work.
                let _q = lock(&signal.queue);
                signal.queue_signal.notify_all();
            });
            if spawned.is_ok() {
                return Begun::Restoring(Restoring { job, result, arrived: std::cell::OnceCell::new() });
            }
        }
    }
    let session = take_session(shared, &job.prompt, running);
    match start_prefill(shared, job, session) {
        Some(p) => Begun::Prefill(p),
        None => Begun::Ended,
    }
}

/// Begins the prefill of `job`'s prompt on `session`. `None` when it failed (its sink has been
/// told).
fn start_prefill(shared: &Shared, job: Job, mut session: Session) -> Option<Prefilling> {
    let Job { prompt, request, sink, constraint } = job;
    if session.speculative() != shared.config.speculative {
        session.set_speculative(shared.config.speculative);
    }
    match catch_unwind(AssertUnwindSafe(|| session.begin_prefill(&prompt))) {
        Ok(Ok(cached_tokens)) => {
            Some(Prefilling { session, prompt, request, sink, constraint, cached_tokens, apart: false })
        }
        Ok(Err(e)) => {
            fail(shared, session, sink, e);
            None
        }
        Err(panic) => {
            fail_panicked(shared, session, sink, panicked("while preparing the prompt", panic.as_ref()));
            None
        }
    }
}

/// Where a prefilling job goes after one of its chunks. A return value placed at once (no
/// collection holds it), so its variants' sizes do not matter and boxing would only allocate.
#[allow(clippy::large_enum_variant)]
enum AfterChunk {
    /// Its prompt is all in and its first token sampled: it joins the decode batch.
    Decoding(Running),
    /// Some of its prompt is left: it takes its next chunk in turn.
    MoreToRun(Prefilling),
    /// It ended (its caller left, it failed, or its first token ended it); its sink was told.
    Ended,
}

impl AfterChunk {
    fn place(self, running: &mut Vec<Running>, prefilling: &mut VecDeque<Prefilling>) {
        match self {
            AfterChunk::Decoding(r) => running.push(r),
            AfterChunk::MoreToRun(p) => prefilling.push_back(p),
            AfterChunk::Ended => {}
        }
    }
}

/// Runs one chunk of `p`'s prompt ([`after_chunk`] says where the job goes then). A job whose
/// caller has left is dropped here, before its chunk runs.
fn prefill_step(shared: &Shared, p: Prefilling, chunk: usize, pace: &mut Pace) -> AfterChunk {
    let Some(mut p) = still_wanted(shared, p) else { return AfterChunk::Ended };
    let (before, started) = (p.session.tokens().len(), std::time::Instant::now());
    let checkpoint = p.request.checkpoint;
    let step = catch_unwind(AssertUnwindSafe(|| p.session.prefill_chunk(&p.prompt, chunk, checkpoint)));
    let ran = p.session.tokens().len().saturating_sub(before);
    if ran > 0 {
        Pace::update(&mut pace.prefill_secs_per_token, started.elapsed().as_secs_f64() / ran as f64);
    }
    after_chunk(shared, p, step, ran)
}

/// `p`, unless its caller has left: then its job ends here (cancelled) and its session, a
/// valid prefix of the prompt, goes back for reuse.
fn still_wanted(shared: &Shared, p: Prefilling) -> Option<Prefilling> {
    let abandoned = catch_unwind(AssertUnwindSafe(|| p.sink.abandoned())).unwrap_or(true);
    if !abandoned {
        return Some(p);
    }
    let Prefilling { session, prompt, sink, cached_tokens, .. } = p;
    shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
    shared.stats.prompt_tokens.fetch_add(prompt.len() as u64, Ordering::Relaxed);
    return_session(shared, session);
    let generation = Generation {
        tokens: Vec::new(),
        finish: FinishReason::Cancelled,
        prompt_tokens: prompt.len(),
        cached_tokens,
        constraint: None,
    };
    report(shared, sink, Ok(generation));
    None
}

/// After a chunk of `p`'s prompt ran (`ran` tokens; `step`: how it ended, or its panic):
/// when the prompt is all in, samples the first token and the job joins the batch (unless that
/// token ended it); while some is left, it waits for its next chunk; a failed chunk fails it.
fn after_chunk(shared: &Shared, p: Prefilling, step: std::thread::Result<ChunkOutcome>, ran: usize) -> AfterChunk {
    shared.stats.prefill_chunks.fetch_add(1, Ordering::Relaxed);
    shared.stats.last_prefill_chunk.store(ran, Ordering::Relaxed);
    let logits = match step {
        Ok(Ok(Some(logits))) => logits,
        Ok(Ok(None)) => return AfterChunk::MoreToRun(p),
        Ok(Err(e)) => {
            fail(shared, p.session, p.sink, e);
            return AfterChunk::Ended;
        }
        Err(panic) => {
            fail_panicked(shared, p.session, p.sink, panicked("while prefilling the prompt", panic.as_ref()));
            return AfterChunk::Ended;
        }
    };
    let Prefilling { mut session, prompt, request, sink, constraint, cached_tokens, .. } = p;
    let started = catch_unwind(AssertUnwindSafe(|| {
        session.start_decoding(prompt.len(), cached_tokens, &logits, &request, constraint)
    }));
    let (decoding, first) = match started {
        Ok(started) => started,
        Err(panic) => {
            fail_panicked(shared, session, sink, panicked("while sampling the first token", panic.as_ref()));
            return AfterChunk::Ended;
        }
    };
    let mut r = Running { session, decoding, sink, abandoned: false, failure: None };
    if let Some(first) = first {
        r.take_token(&first);
    }
    if r.decoding.is_finished() {
        finish(shared, r);
        return AfterChunk::Ended;
    }
    AfterChunk::Decoding(r)
}

/// Tells a sink how its job ended; a sink that panics doing so is only counted.
fn report(shared: &Shared, sink: Box<dyn TokenSink>, result: Result<Generation, EngineError>) {
    if catch_unwind(AssertUnwindSafe(|| sink.done(result))).is_err() {
        shared.stats.panics.fetch_add(1, Ordering::Relaxed);
    }
}

/// Fails a job whose work panicked: its session, whose state cannot be trusted, is dropped.
fn fail_panicked(shared: &Shared, session: Session, sink: Box<dyn TokenSink>, e: EngineError) {
    shared.stats.panics.fetch_add(1, Ordering::Relaxed);
    shared.stats.failed.fetch_add(1, Ordering::Relaxed);
    drop(session);
    shared.session_count.fetch_sub(1, Ordering::SeqCst);
    report(shared, sink, Err(e));
}

/// Reports an engine failure; the session, whose state may be partial, goes back empty.
fn fail(shared: &Shared, mut session: Session, sink: Box<dyn TokenSink>, e: EngineError) {
    shared.stats.failed.fetch_add(1, Ordering::Relaxed);
    session.reset();
    return_session(shared, session);
    report(shared, sink, Err(e));
}

/// Ends a finished sequence: counts it, returns its session to the pool, then tells the sink.
/// The session goes back before the caller hears the end, so a follow-up request sent right
/// after the answer finds it.
fn finish(shared: &Shared, r: Running) {
    let Running { session, mut decoding, sink, abandoned, failure } = r;
    if let Some(e) = failure.or_else(|| decoding.take_failure().map(EngineError::Failed)) {
        fail_panicked(shared, session, sink, e);
        return;
    }
    let generation: Generation = decoding.into_generation();
    if let Some(store) = &shared.config.store {
        // A failure to save costs only the reuse after a restart: the reply still goes out.
        if !abandoned && catch_unwind(AssertUnwindSafe(|| store.save(&session))).is_err() {
            tracing::warn!("session store: saving a state panicked; it was not saved");
        }
    }
    return_session(shared, session);
    let stats = &shared.stats;
    stats.generated_tokens.fetch_add(generation.tokens.len() as u64, Ordering::Relaxed);
    stats.prompt_tokens.fetch_add(generation.prompt_tokens as u64, Ordering::Relaxed);
    stats.cached_tokens.fetch_add(generation.cached_tokens as u64, Ordering::Relaxed);
    if abandoned {
        stats.cancelled.fetch_add(1, Ordering::Relaxed);
    } else {
        stats.completed.fetch_add(1, Ordering::Relaxed);
    }
    report(shared, sink, Ok(generation));
}

fn shared_prefix(tokens: &[u32], prompt: &[u32]) -> usize {
    tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count()
}

/// Picks the session for `prompt`:
/// 1. the idle session sharing the longest prefix, taken as it is when its whole history is a
///    prefix of the prompt (nothing is lost);
/// 2. otherwise, while under the session limit, a fork of the session (idle or running)
///    sharing the longest prefix, so no other conversation's state is cut back;
/// 3. otherwise that idle session itself (it rewinds), a new empty session while under the
///    limit, or the least recently used idle one.
fn take_session(shared: &Shared, prompt: &[u32], running: &[Running]) -> Session {
    let mut idle = lock(&shared.idle);
    let under_limit = shared.session_count.load(Ordering::SeqCst) < shared.config.sessions;
    let new_session = || {
        shared.session_count.fetch_add(1, Ordering::SeqCst);
        Session::new(Arc::clone(&shared.model))
    };
    if !shared.config.prefix_reuse {
        // Idle sessions are already empty (return_session resets them).
        if under_limit || idle.is_empty() {
            return new_session();
        }
        return idle.swap_remove(0).session;
    }
    let best_idle = idle
        .iter()
        .enumerate()
        .map(|(i, s)| (shared_prefix(s.session.tokens(), prompt), s.last_used, i))
        .filter(|(lcp, _, _)| *lcp > 0)
        .max();
    if let Some((lcp, _, i)) = best_idle {
        if lcp == idle[i].session.tokens().len() {
            return idle.swap_remove(i).session;
        }
    }
    let best_running = running
        .iter()
        .map(|r| (shared_prefix(r.session.tokens(), prompt), &r.session))
        .filter(|(lcp, _)| *lcp > 0)
        .max_by_key(|(lcp, _)| *lcp);
    let idle_lcp = best_idle.map_or(0, |(lcp, _, _)| lcp);
    if under_limit {
        let source = match best_running {
            Some((lcp, s)) if lcp >= idle_lcp => Some((lcp, s)),
            _ => best_idle.map(|(lcp, _, i)| (lcp, &idle[i].session)),
        };
        if let Some(fork) = source.and_then(|(lcp, s)| s.fork(lcp)) {
            shared.session_count.fetch_add(1, Ordering::SeqCst);
            shared.stats.forks.fetch_add(1, Ordering::Relaxed);
            return fork;
        }
    }
    if let Some((_, _, i)) = best_idle {
        return idle.swap_remove(i).session;
    }
    if under_limit || idle.is_empty() {
        return new_session();
    }
    let lru = least_recently_used(&idle);
    idle.swap_remove(lru).session
}

/// The longest prefix of `prompt` that a session in memory (idle or running) holds.
fn in_memory_prefix(shared: &Shared, prompt: &[u32], running: &[Running]) -> usize {
    let idle = lock(&shared.idle).iter().map(|s| shared_prefix(s.session.tokens(), prompt)).max().unwrap_or(0);
    let busy = running.iter().map(|r| shared_prefix(r.session.tokens(), prompt)).max().unwrap_or(0);
    idle.max(busy)
}

/// The index of the idle session used longest ago (0 for an empty list).
fn least_recently_used(idle: &[IdleSession]) -> usize {
    idle.iter().enumerate().min_by_key(|(_, s)| s.last_used).map_or(0, |(i, _)| i)
}

fn return_session(shared: &Shared, mut session: Session) {
    if !shared.config.prefix_reuse {
        session.reset();
    }
    let last_used = shared.clock.fetch_add(1, Ordering::Relaxed);
    let mut idle = lock(&shared.idle);
    idle.push(IdleSession { session, last_used });
    // A job admitted while every session was busy got a new one beyond the limit: let the
    // least recently used idle ones go.
    while shared.session_count.load(Ordering::SeqCst) > shared.config.sessions && idle.len() > 1 {
        let lru = least_recently_used(&idle);
        idle.swap_remove(lru);
        shared.session_count.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step bound by reading the weights (`read` seconds) until its rows' arithmetic
    /// (`per_row` each) takes longer: one decoding sequence plus `chunk` prompt rows.
    fn step_secs(read: f64, per_row: f64, chunk: usize) -> f64 {
        read.max(per_row * (1 + chunk) as f64)
    }

    /// Drives the pace with the step times of a memory-bound model (the 4B shapes on two cores:
    /// 180 ms to read the weights, 25 ms of arithmetic a row): the chunk inside the step settles
    /// where the step takes about 1.5× its time alone, that is 9–11 rows, where the chunk cut
    /// apart from the step (paying its own read of the weights) could never fit the stall.
    #[test]
    fn the_chunk_inside_a_memory_bound_step_settles_where_the_step_takes_one_and_a_half_times_as_long() {
        let config = SchedulerConfig::default();
        let (read, per_row) = (0.180, 0.025);
        let mut pace = Pace::default();
        assert_eq!(pace.beside(&config, 1), ChunkMode::Wait, "no step timed yet");
        pace.after_alone(step_secs(read, per_row, 0), 1);
        let mut sizes = Vec::new();
        for _ in 0..60 {
            match pace.beside(&config, 1) {
                ChunkMode::Inside(n) => {
                    pace.after_inside(&config, step_secs(read, per_row, n), n, n);
                    sizes.push(n);
                }
                ChunkMode::Wait => pace.after_alone(step_secs(read, per_row, 0), 1),
                ChunkMode::Apart(n) => panic!("a chunk of {n} apart while a sequence decodes"),
            }
        }
        let settled = &sizes[sizes.len() - 10..];
        assert!(settled.iter().all(|&n| (9..=11).contains(&n)), "chunk sizes {sizes:?}");
        // Every RETIME_AFTER steps with a chunk, one without, to time the step alone again.
        assert!(sizes.len() >= 60 * RETIME_AFTER / (RETIME_AFTER + 1) - 1, "{} steps had a chunk", sizes.len());
    }

    /// While the weights' read bounds the step, rows are nearly free: the chunk grows to the
    /// configured most. A batch of another size is timed alone first; with no sequence
    /// decoding, chunks run apart at full size.
    #[test]
    fn the_chunk_grows_while_rows_are_free_and_a_new_batch_is_timed_first() {
        let config = SchedulerConfig { prefill_chunk: 256, ..Default::default() };
        let mut pace = Pace::default();
        pace.after_alone(0.180, 4);
        for _ in 0..RETIME_AFTER - 1 {
            let ChunkMode::Inside(n) = pace.beside(&config, 4) else { panic!("timed: the chunk goes inside") };
            pace.after_inside(&config, 0.181, n, n);
        }
        assert!(pace.fused_chunk >= 128, "rows cost nothing, yet the chunk is {}", pace.fused_chunk);
        assert_eq!(pace.beside(&config, 8), ChunkMode::Wait, "a batch of 8 was never timed");
        assert_eq!(pace.beside(&config, 0), ChunkMode::Apart(256));
        let off = SchedulerConfig { prefill_stall: 0.0, ..config };
        assert_eq!(Pace::default().beside(&off, 3), ChunkMode::Inside(256), "no pace: fixed chunks");
    }
}
