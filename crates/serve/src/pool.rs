//! The request scheduler: one thread that runs every generation, and a pool of engine
//! sessions routed by shared prefix, so a request that extends an earlier conversation lands
//! on the session that already holds its state and only runs the new tokens.
//!
//! The scheduler loop admits at most one waiting job per iteration (its prompt is prefilled
//! and its first token sampled), then advances every running sequence by one token with a
//! single batched decode step ([`frognano_engine::decode_step`], one `forward_batch`), so
//! the weights are read once per step for all sequences. `--max-concurrent` bounds the batch.
//! Results stream back to the HTTP side through a channel per job; when the client goes away
//! its receiver is dropped, and the scheduler sees the closed channel at the sequence's next
//! token and drops it from the batch.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use frognano_engine::{decode_step, Decoding, FinishReason, GenerateRequest, Generation, Session, TokenChoice};
use frognano_model::tokenizer::Tokenizer;
use frognano_model::CausalLm;
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::output::{Delta, OutputMode, ReplyAssembler};

/// What a job sends back.
#[derive(Debug)]
pub enum JobEvent {
    /// New output.
    Delta(Delta),
    /// Generation ended.
    Done(JobSummary),
    /// Generation failed; nothing more follows.
    Failed(ApiError),
}

/// How a finished job went.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSummary {
    /// OpenAI's `finish_reason`: `stop`, `length` or `tool_calls`.
    pub finish_reason: &'static str,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (an end-of-sequence token included).
    pub completion_tokens: usize,
    /// Prompt tokens whose state came from an earlier request.
    pub cached_tokens: usize,
}

/// One generation to run.
pub struct Job {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Sampling, length and stop ids.
    pub request: GenerateRequest,
    /// How the output is shaped.
    pub mode: OutputMode,
    /// Stop strings.
    pub stop_strings: Vec<String>,
    /// `Some(k)`: report log-probabilities with `k` alternatives.
    pub logprobs: Option<usize>,
    /// Where events go; a closed channel cancels the job.
    pub events: mpsc::UnboundedSender<JobEvent>,
}

/// Counters, for `/health` and tests.
#[derive(Debug, Default)]
pub struct PoolStats {
    /// Sequences being generated now (the decode batch).
    pub running: AtomicUsize,
    /// Jobs waiting to be admitted.
    pub waiting: AtomicUsize,
    /// Jobs that ran to their end.
    pub completed: AtomicU64,
    /// Jobs stopped because their client went away.
    pub cancelled: AtomicU64,
    /// Jobs that failed in the engine.
    pub failed: AtomicU64,
    /// Tokens generated, all jobs together.
    pub generated_tokens: AtomicU64,
    /// Prompt tokens, all jobs together.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens served from a session's cached state.
    pub cached_tokens: AtomicU64,
}

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Most sequences generated at once: the largest decode batch.
    pub max_batch: usize,
    /// Sessions kept in all (busy and idle); idle ones hold earlier conversations for reuse.
    pub sessions: usize,
    /// Route requests to the session with the longest shared prefix (false: every request
    /// starts from an empty state, for measuring what reuse saves).
    pub prefix_reuse: bool,
    /// Most jobs waiting to be admitted before new ones are refused.
    pub max_waiting: usize,
}

struct IdleSession {
    session: Session,
    last_used: u64,
}

struct Shared {
    model: Arc<dyn CausalLm>,
    tokenizer: Arc<Tokenizer>,
    config: PoolConfig,
    queue: Mutex<VecDeque<Job>>,
    queue_signal: Condvar,
    idle: Mutex<Vec<IdleSession>>,
    /// Sessions in existence (idle + in use).
    session_count: AtomicUsize,
    clock: AtomicU64,
    shutdown: AtomicBool,
    stats: PoolStats,
}

/// The scheduler. Dropping it stops the scheduler thread; sequences still running end
/// without a summary (their clients see the stream close).
pub struct EnginePool {
    shared: Arc<Shared>,
    scheduler: Option<JoinHandle<()>>,
}

/// A job refused because too many are waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull {
    /// Jobs waiting.
    pub waiting: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A thread that panicked mid-job leaves plain data behind; keep serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl EnginePool {
    /// Starts the scheduler thread over `model`.
    pub fn start(model: Arc<dyn CausalLm>, tokenizer: Arc<Tokenizer>, config: PoolConfig) -> std::io::Result<Self> {
        let max_batch = config.max_batch.max(1);
        let config = PoolConfig { max_batch, sessions: config.sessions.max(max_batch), ..config };
        let shared = Arc::new(Shared {
            model,
            tokenizer,
            config,
            queue: Mutex::new(VecDeque::new()),
            queue_signal: Condvar::new(),
            idle: Mutex::new(Vec::new()),
            session_count: AtomicUsize::new(0),
            clock: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            stats: PoolStats::default(),
        });
        let s = Arc::clone(&shared);
        let scheduler = std::thread::Builder::new().name("frognano-scheduler".into()).spawn(move || scheduler(&s))?;
        Ok(EnginePool { shared, scheduler: Some(scheduler) })
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

    /// The counters.
    pub fn stats(&self) -> &PoolStats {
        &self.shared.stats
    }

    /// The settings in force.
    pub fn config(&self) -> &PoolConfig {
        &self.shared.config
    }
}

impl Drop for EnginePool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.queue_signal.notify_all();
        if let Some(t) = self.scheduler.take() {
            let _ = t.join();
        }
    }
}

/// A sequence in the decode batch.
struct Running<'a> {
    session: Session,
    decoding: Decoding,
    reply: ReplyAssembler<'a>,
    events: mpsc::UnboundedSender<JobEvent>,
    client_gone: bool,
}

impl Running<'_> {
    /// Streams one new token to the client; cancels the generation when a stop string is hit
    /// or the client has gone.
    fn take_token(&mut self, choice: &TokenChoice) {
        if self.events.is_closed() {
            self.client_gone = true;
            self.decoding.cancel();
            return;
        }
        let (delta, stop) = self.reply.push_token(choice);
        if delta.has_output() && self.events.send(JobEvent::Delta(delta)).is_err() {
            self.client_gone = true;
            self.decoding.cancel();
            return;
        }
        if stop {
            self.decoding.cancel();
        }
    }
}

/// The scheduler loop: admit one waiting job (prefill and first token) while the batch has
/// room, then one batched decode step for every running sequence; finished sequences leave.
fn scheduler(shared: &Shared) {
    let mut running: Vec<Running<'_>> = Vec::new();
    loop {
        let job = {
            let mut q = lock(&shared.queue);
            loop {
                if shared.shutdown.load(Ordering::SeqCst) {
                    return;
                }
                if running.len() < shared.config.max_batch {
                    if let Some(job) = q.pop_front() {
                        shared.stats.waiting.store(q.len(), Ordering::Relaxed);
                        break Some(job);
                    }
                }
                if !running.is_empty() {
                    break None;
                }
                q = shared.queue_signal.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        if let Some(job) = job {
            if let Some(r) = admit(shared, job) {
                running.push(r);
                shared.stats.running.store(running.len(), Ordering::Relaxed);
            }
        }
        if running.iter().any(|r| !r.decoding.is_finished()) {
            let mut batch: Vec<(&mut Session, &mut Decoding)> =
                running.iter_mut().map(|r| (&mut r.session, &mut r.decoding)).collect();
            match decode_step(&mut batch) {
                Ok(tokens) => {
                    for (r, t) in running.iter_mut().zip(tokens) {
                        if let Some(t) = t {
                            r.take_token(&t);
                        }
                    }
                }
                Err(e) => {
                    // The step changed no state, but it cannot go on; every sequence fails.
                    for r in running.drain(..) {
                        fail(shared, r.session, &r.events, &e);
                    }
                }
            }
        }
        let (done, still): (Vec<_>, Vec<_>) = running.into_iter().partition(|r| r.decoding.is_finished());
        running = still;
        // Counted before the clients hear their end, so `/health` agrees with them.
        shared.stats.running.store(running.len(), Ordering::Relaxed);
        for r in done {
            finish(shared, r);
        }
    }
}

/// Starts a job: a session for its prompt, prefill, first token. `None` when it ended right
/// away (client gone, error, or a one-token reply); its events are then already sent.
fn admit<'a>(shared: &'a Shared, job: Job) -> Option<Running<'a>> {
    let Job { prompt, request, mode, stop_strings, logprobs, events } = job;
    if events.is_closed() {
        shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
        return None; // the client left while waiting
    }
    let mut session = take_session(shared, &prompt);
    let (decoding, first) = match session.start(&prompt, &request) {
        Ok(started) => started,
        Err(e) => {
            fail(shared, session, &events, &e);
            return None;
        }
    };
    let reply = ReplyAssembler::new(&shared.tokenizer, &mode, stop_strings, request.stop_ids.clone(), logprobs);
    let mut r = Running { session, decoding, reply, events, client_gone: false };
    if let Some(first) = first {
        r.take_token(&first);
    }
    if r.decoding.is_finished() {
        finish(shared, r);
        return None;
    }
    Some(r)
}

/// Reports an engine failure to the client; the session, whose state may be partial, goes
/// back empty.
fn fail(
    shared: &Shared,
    mut session: Session,
    events: &mpsc::UnboundedSender<JobEvent>,
    e: &frognano_engine::EngineError,
) {
    shared.stats.failed.fetch_add(1, Ordering::Relaxed);
    session.reset();
    return_session(shared, session);
    let _ = events.send(JobEvent::Failed(ApiError::from_engine(e)));
}

/// Ends a finished sequence: counts it, returns its session to the pool, then sends the last
/// delta and the summary. The session goes back before the client hears the end, so a
/// follow-up request sent right after the answer finds it.
fn finish(shared: &Shared, r: Running<'_>) {
    let Running { session, decoding, mut reply, events, client_gone } = r;
    let generation: Generation = decoding.into_generation();
    return_session(shared, session);
    let stats = &shared.stats;
    stats.generated_tokens.fetch_add(generation.tokens.len() as u64, Ordering::Relaxed);
    stats.prompt_tokens.fetch_add(generation.prompt_tokens as u64, Ordering::Relaxed);
    stats.cached_tokens.fetch_add(generation.cached_tokens as u64, Ordering::Relaxed);
    if client_gone || (generation.finish == FinishReason::Cancelled && !reply.stopped_by_string) {
        stats.cancelled.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let tail = reply.finish();
    if !tail.is_empty() {
        let _ = events.send(JobEvent::Delta(tail));
    }
    let finish_reason = match generation.finish {
        FinishReason::Length | FinishReason::ContextFull => "length",
        FinishReason::Stop | FinishReason::Cancelled if reply.saw_tool_call => "tool_calls",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    };
    stats.completed.fetch_add(1, Ordering::Relaxed);
    let _ = events.send(JobEvent::Done(JobSummary {
        finish_reason,
        prompt_tokens: generation.prompt_tokens,
        completion_tokens: generation.tokens.len(),
        cached_tokens: generation.cached_tokens,
    }));
}

/// Picks the idle session sharing the longest prefix with `prompt`; a new one while under
/// the limit and nothing is shared; else the least recently used.
fn take_session(shared: &Shared, prompt: &[u32]) -> Session {
    let mut idle = lock(&shared.idle);
    let shared_prefix = |s: &Session| s.tokens().iter().zip(prompt).take_while(|(a, b)| a == b).count();
    let best = if shared.config.prefix_reuse {
        idle.iter()
            .enumerate()
            .map(|(i, s)| (shared_prefix(&s.session), s.last_used, i))
            .filter(|(lcp, _, _)| *lcp > 0)
            .max()
            .map(|(_, _, i)| i)
    } else {
        None
    };
    if let Some(i) = best {
        return idle.swap_remove(i).session;
    }
    if shared.session_count.load(Ordering::SeqCst) < shared.config.sessions || idle.is_empty() {
        shared.session_count.fetch_add(1, Ordering::SeqCst);
        return Session::new(Arc::clone(&shared.model));
    }
    let lru = idle.iter().enumerate().min_by_key(|(_, s)| s.last_used).map(|(i, _)| i).unwrap_or(0);
    let mut session = idle.swap_remove(lru).session;
    if !shared.config.prefix_reuse {
        session.reset();
    }
    session
}

fn return_session(shared: &Shared, mut session: Session) {
    if !shared.config.prefix_reuse {
        session.reset();
    }
    let last_used = shared.clock.fetch_add(1, Ordering::Relaxed);
    lock(&shared.idle).push(IdleSession { session, last_used });
}
