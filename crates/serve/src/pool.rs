//! The server's side of the engine's scheduler ([`frognano_engine::Scheduler`]): a job is
//! a prompt plus how its reply is shaped, and its sink turns each generated token into the
//! client's deltas ([`ReplyAssembler`]: streaming detokenization, stop strings, the chat
//! split) on the scheduler thread, so a stop string ends generation at the token that
//! completes it. Results stream back to the HTTP side through a channel per job; when the
//! client goes away its receiver is dropped, and the sink abandons the sequence at its next
//! token. Batching, prefix reuse and prefix sharing are the engine's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use frognano_engine::{
    EngineError, Flow, GenerateRequest, Generation, Scheduler, SchedulerConfig, SchedulerStats, TokenChoice, TokenSink,
};
use frognano_model::tokenizer::Tokenizer;
use frognano_model::CausalLm;
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::output::{Delta, OutputMode, ReplyAssembler};

pub use frognano_engine::QueueFull;

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
    /// The stop string that ended the reply, if one did.
    pub stop_sequence: Option<String>,
    /// From the job's queuing to its first generated token: any wait for a free slot, the
    /// prompt's prefill and the first draw (Ollama's `prompt_eval_duration`).
    pub prompt_eval: Duration,
    /// From the first generated token to the end (Ollama's `eval_duration`).
    pub eval: Duration,
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
    /// The grammar the reply must follow (`response_format`, a forced tool call), if any.
    pub constraint: Option<frognano_engine::Constraint>,
}

/// The scheduler of the served model, and the tokenizer its replies are decoded with.
pub struct EnginePool {
    scheduler: Scheduler,
    tokenizer: Arc<Tokenizer>,
}

impl EnginePool {
    /// Starts the scheduler thread over `model`.
    pub fn start(
        model: Arc<dyn CausalLm>,
        tokenizer: Arc<Tokenizer>,
        config: SchedulerConfig,
    ) -> std::io::Result<Self> {
        Ok(EnginePool { scheduler: Scheduler::start(model, config)?, tokenizer })
    }

    /// Queues a job.
    pub fn submit(&self, job: Job) -> Result<(), QueueFull> {
        self.submit_all(vec![job])
    }

    /// Queues several jobs (one request's prompts), all or none.
    pub fn submit_all(&self, jobs: Vec<Job>) -> Result<(), QueueFull> {
        let jobs = jobs.into_iter().map(|job| self.engine_job(job)).collect();
        self.scheduler.submit_all(jobs)
    }

    fn engine_job(&self, job: Job) -> frognano_engine::Job {
        let Job { prompt, request, mode, stop_strings, logprobs, events, constraint } = job;
        let reply =
            ReplyAssembler::new(Arc::clone(&self.tokenizer), &mode, stop_strings, request.stop_ids.clone(), logprobs);
        let sink = ReplySink { reply, events, queued: Instant::now(), first_token: None };
        frognano_engine::Job { prompt, request, sink: Box::new(sink), constraint }
    }

    /// The counters.
    pub fn stats(&self) -> &SchedulerStats {
        self.scheduler.stats()
    }

    /// The settings in force.
    pub fn config(&self) -> &SchedulerConfig {
        self.scheduler.config()
    }
}

/// Shapes one job's tokens into deltas for its client.
struct ReplySink {
    reply: ReplyAssembler,
    /// Closed once the client has gone (its receiver dropped); it stays closed.
    events: mpsc::UnboundedSender<JobEvent>,
    /// When the job was queued.
    queued: Instant,
    /// When its first token came.
    first_token: Option<Instant>,
}

impl TokenSink for ReplySink {
    fn token(&mut self, choice: &TokenChoice) -> Flow {
        if self.events.is_closed() {
            return Flow::Abandon;
        }
        self.first_token.get_or_insert_with(Instant::now);
        let (delta, stop) = self.reply.push_token(choice);
        if delta.has_output() && self.events.send(JobEvent::Delta(delta)).is_err() {
            return Flow::Abandon;
        }
        if stop {
            Flow::Stop
        } else {
            Flow::Continue
        }
    }

    fn done(self: Box<Self>, result: Result<Generation, EngineError>) {
        let ReplySink { mut reply, events, queued, first_token } = *self;
        let now = Instant::now();
        let first_token = first_token.unwrap_or(now);
        let generation = match result {
            Ok(g) => g,
            Err(e) => {
                let _ = events.send(JobEvent::Failed(ApiError::from_engine(&e)));
                return;
            }
        };
        if events.is_closed() {
            return; // nobody to tell
        }
        let tail = reply.finish();
        if !tail.is_empty() {
            let _ = events.send(JobEvent::Delta(tail));
        }
        use frognano_engine::FinishReason;
        let finish_reason = match generation.finish {
            FinishReason::Length | FinishReason::ContextFull => "length",
            FinishReason::Stop | FinishReason::Cancelled if reply.saw_tool_call => "tool_calls",
            FinishReason::Stop | FinishReason::Cancelled => "stop",
        };
        let _ = events.send(JobEvent::Done(JobSummary {
            finish_reason,
            prompt_tokens: generation.prompt_tokens,
            completion_tokens: generation.tokens.len(),
            cached_tokens: generation.cached_tokens,
            stop_sequence: reply.stop_sequence().map(str::to_string),
            prompt_eval: first_token.duration_since(queued),
            eval: now.duration_since(first_token),
        }));
    }

    fn abandoned(&self) -> bool {
        self.events.is_closed()
    }
}
