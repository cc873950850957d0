//! The request scheduler: a fixed set of worker threads (`--max-concurrent`) that run
//! generation jobs, and a pool of engine sessions routed by shared prefix, so a request that
//! extends an earlier conversation lands on the session that already holds its state and
//! only runs the new tokens.
//!
//! Each worker runs one sequence at a time with the model's per-sequence forward; sequences
//! of different workers interleave on the CPU. Results stream back to the HTTP side through
//! a channel per job; when the client goes away its receiver is dropped, the worker sees the
//! closed channel at the next token and stops that generation.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use frognano_engine::{FinishReason, GenerateRequest, Session};
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
    /// Jobs running now.
    pub running: AtomicUsize,
    /// Jobs waiting for a worker.
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
    /// Worker threads (sequences generated at once).
    pub workers: usize,
    /// Sessions kept in all (busy and idle); idle ones hold earlier conversations for reuse.
    pub sessions: usize,
    /// Route requests to the session with the longest shared prefix (false: every request
    /// starts from an empty state, for measuring what reuse saves).
    pub prefix_reuse: bool,
    /// Most jobs waiting for a worker before new ones are refused.
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

/// The worker pool. Dropping it stops the workers after their current jobs.
pub struct EnginePool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

/// A job refused because too many are waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull {
    /// Jobs waiting.
    pub waiting: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A worker that panicked mid-job leaves plain data behind; keep serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl EnginePool {
    /// Starts `config.workers` worker threads over `model`.
    pub fn start(model: Arc<dyn CausalLm>, tokenizer: Arc<Tokenizer>, config: PoolConfig) -> std::io::Result<Self> {
        let workers_n = config.workers.max(1);
        let config = PoolConfig { workers: workers_n, sessions: config.sessions.max(workers_n), ..config };
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
        let mut workers = Vec::with_capacity(workers_n);
        for i in 0..workers_n {
            let s = Arc::clone(&shared);
            workers.push(std::thread::Builder::new().name(format!("frognano-gen-{i}")).spawn(move || worker(&s))?);
        }
        Ok(EnginePool { shared, workers })
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
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(shared: &Shared) {
    loop {
        let job = {
            let mut q = lock(&shared.queue);
            loop {
                if shared.shutdown.load(Ordering::SeqCst) {
                    return;
                }
                if let Some(job) = q.pop_front() {
                    shared.stats.waiting.store(q.len(), Ordering::Relaxed);
                    break job;
                }
                q = shared.queue_signal.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        if job.events.is_closed() {
            shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            continue; // the client left while waiting
        }
        shared.stats.running.fetch_add(1, Ordering::Relaxed);
        let mut session = take_session(shared, &job.prompt);
        let events = job.events.clone();
        let last = run_job(shared, &mut session, job);
        // The session goes back before the client hears the end, so a follow-up request sent
        // right after the answer finds it.
        return_session(shared, session);
        shared.stats.running.fetch_sub(1, Ordering::Relaxed);
        for event in last {
            let _ = events.send(event);
        }
    }
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

/// Runs one job, streaming its deltas; returns the last events (the final delta and the
/// summary, or the failure) for the caller to send once the session is back in the pool.
fn run_job(shared: &Shared, session: &mut Session, job: Job) -> Vec<JobEvent> {
    let Job { prompt, request, mode, stop_strings, logprobs, events } = job;
    let tokenizer: &Tokenizer = &shared.tokenizer;
    let mut reply = ReplyAssembler::new(tokenizer, &mode, stop_strings, request.stop_ids.clone(), logprobs);
    let mut client_gone = false;
    let result = session.generate(&prompt, &request, |choice| {
        if events.is_closed() {
            client_gone = true;
            return ControlFlow::Break(());
        }
        let (delta, stop) = reply.push_token(choice);
        if delta.has_output() && events.send(JobEvent::Delta(delta)).is_err() {
            client_gone = true;
            return ControlFlow::Break(());
        }
        if stop {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    let generation = match result {
        Ok(g) => g,
        Err(e) => {
            shared.stats.failed.fetch_add(1, Ordering::Relaxed);
            // The session's state may be partial; start it afresh next time.
            session.reset();
            return vec![JobEvent::Failed(ApiError::from_engine(&e))];
        }
    };
    let stats = &shared.stats;
    stats.generated_tokens.fetch_add(generation.tokens.len() as u64, Ordering::Relaxed);
    stats.prompt_tokens.fetch_add(generation.prompt_tokens as u64, Ordering::Relaxed);
    stats.cached_tokens.fetch_add(generation.cached_tokens as u64, Ordering::Relaxed);
    if client_gone || (generation.finish == FinishReason::Cancelled && !reply.stopped_by_string) {
        stats.cancelled.fetch_add(1, Ordering::Relaxed);
        return Vec::new();
    }
    let mut last = Vec::new();
    let tail = reply.finish();
    if !tail.is_empty() {
        last.push(JobEvent::Delta(tail));
    }
    let finish_reason = match generation.finish {
        FinishReason::Length | FinishReason::ContextFull => "length",
        FinishReason::Stop | FinishReason::Cancelled if reply.saw_tool_call => "tool_calls",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    };
    stats.completed.fetch_add(1, Ordering::Relaxed);
    last.push(JobEvent::Done(JobSummary {
        finish_reason,
        prompt_tokens: generation.prompt_tokens,
        completion_tokens: generation.tokens.len(),
        cached_tokens: generation.cached_tokens,
    }));
    last
}
