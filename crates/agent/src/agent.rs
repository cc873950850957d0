//! The agent loop: ask the model, run every tool call in order, feed the results back, until
//! the model answers without a tool call or a limit ends the run. Exit reasons and limits
//! are the Leaf harness's; the drift guards ([`Guards`]) are additions, each switchable, all
//! off under [`Guards::leaf_exact`].

use crate::tools::{self, ToolBox, Truncation};
use crate::trajectory::{ExitReason, Observation, Step, StepUsage, Trajectory, FORMAT};
use frognano_protocol::{
    ChatRequest, Completion, FinishReason, Llm, LlmError, Message, Sampling, ToolCall, ToolChoice,
};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Mitigations against drift in long runs of a small model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guards {
    /// Retries of a reply with malformed tool-call text, each on a throw-away copy of the
    /// history, so the broken turn never enters the context (0 = off).
    pub malformed_retries: u32,
    /// A reply cut by the per-turn token limit gets a notice asking for a shorter answer
    /// (at most twice in a row) instead of ending the run.
    pub cut_notice: bool,
    /// The same calls made three steps in a row earn a notice in the observation.
    pub repeat_notice: bool,
    /// Over-long observations keep head and tail instead of only the head.
    pub head_tail_truncation: bool,
    /// In the last steps, the observation says how many steps remain.
    pub steps_left_notice: bool,
    /// A reply without a tool call before any file has changed (no Edit or Write succeeded and
    /// `git status` shows nothing: a small model's essay with the fix in a code block, nothing
    /// applied) earns a notice asking it
    /// to do the work with the tools, at most twice a run, instead of ending the run; the
    /// reply to the notice is asked for exactly one tool call ([`ToolChoice::One`]).
    pub act_notice: bool,
    /// Edit and Write refuse an existing file the run has not Read yet
    /// ([`ToolBox::require_read_before_edit`]).
    pub read_before_edit: bool,
}

impl Guards {
    /// Exactly the Leaf harness: no guard at all.
    pub fn leaf_exact() -> Self {
        Guards {
            malformed_retries: 0,
            cut_notice: false,
            repeat_notice: false,
            head_tail_truncation: false,
            steps_left_notice: false,
            act_notice: false,
            read_before_edit: false,
        }
    }
}

impl Default for Guards {
    fn default() -> Self {
        Guards {
            malformed_retries: 3,
            cut_notice: true,
            repeat_notice: true,
            head_tail_truncation: true,
            steps_left_notice: true,
            act_notice: true,
            read_before_edit: true,
        }
    }
}

/// Limits and settings of one run. Defaults are the model card's.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Sampling settings sent with every request.
    pub sampling: Sampling,
    /// Steps (model calls) at most.
    pub max_steps: usize,
    /// Context limit in tokens (0 = none).
    pub max_context_tokens: u64,
    /// Wall-clock budget.
    pub max_time: Option<Duration>,
    /// Drift guards.
    pub guards: Guards,
    /// System prompt (the Leaf one by default).
    pub system_prompt: String,
    /// The tool list offered (the five Leaf tools by default).
    pub tools: Vec<Value>,
    /// Id recorded in the trajectory.
    pub instance_id: String,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            sampling: Sampling::default(),
            max_steps: 100,
            max_context_tokens: 65_536,
            max_time: None,
            guards: Guards::default(),
            system_prompt: tools::SYSTEM_PROMPT.to_string(),
            tools: tools::tool_schemas(),
            instance_id: "task".to_string(),
        }
    }
}

/// Notice sent (on the throw-away copy) after a malformed reply.
pub const MALFORMED_NOTICE: &str = "Your last reply contained a malformed tool call";
/// Notice sent after a reply cut by the token limit.
pub const CUT_NOTICE: &str = "Your last reply was cut off";
/// Notice appended to repeated identical actions.
pub const REPEAT_NOTICE: &str = "[Notice: you made exactly the same call";

/// Start of the notice that answers a reply without a tool call when nothing was done yet.
pub const ACT_NOTICE: &str = "You replied without a tool call, but no file in the repository has changed yet";

/// What the loop reports while it works, in order, for a live display (`frognano solve`
/// prints each to stderr). Everything here also ends up in the trajectory.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum AgentEvent<'a> {
    /// Step `step` (counted from 0) begins: the model is asked.
    Asking {
        /// The step.
        step: usize,
    },
    /// The model's reply of step `step`, before any of its tool calls runs.
    Replied {
        /// The step.
        step: usize,
        /// The assistant message (reasoning, text, tool calls).
        message: &'a Message,
        /// The reply was cut by the per-turn token limit (its calls will not run).
        cut: bool,
        /// How long the model took.
        took: Duration,
    },
    /// A tool call about to run.
    ToolCall {
        /// The step.
        step: usize,
        /// The call.
        call: &'a ToolCall,
    },
    /// A tool call's result, as the model will read it (notices of the drift guards are
    /// added later, to the step's last observation).
    Observation {
        /// The step.
        step: usize,
        /// The tool that ran.
        tool: &'a str,
        /// What it returned.
        observation: &'a str,
        /// How long it ran.
        took: Duration,
    },
    /// A drift guard answered the reply of step `step` with a notice instead of running or
    /// ending (a malformed call retried, a cut reply, an answer before any work): the
    /// notice's text, as the model will read it.
    Notice {
        /// The step.
        step: usize,
        /// The notice.
        notice: &'a str,
    },
}

/// Runs the loop on `task` and returns the trajectory (its `output_patch` is left empty:
/// the patch comes from the workspace, see [`crate::workspace`]). `checkpoint` is called
/// with a partial trajectory after every step that ran tools.
pub fn run(
    llm: &mut dyn Llm,
    tools: &mut ToolBox,
    task: &str,
    config: &AgentConfig,
    cancel: &AtomicBool,
    checkpoint: &mut dyn FnMut(&Trajectory),
) -> Trajectory {
    run_with_events(llm, tools, task, config, cancel, checkpoint, &mut |_| {})
}

/// [`run`], telling `on_event` what happens as it happens ([`AgentEvent`]).
pub fn run_with_events(
    llm: &mut dyn Llm,
    tools: &mut ToolBox,
    task: &str,
    config: &AgentConfig,
    cancel: &AtomicBool,
    checkpoint: &mut dyn FnMut(&Trajectory),
    on_event: &mut dyn FnMut(AgentEvent<'_>),
) -> Trajectory {
    run_from(llm, tools, new_trajectory(task, config), config, cancel, checkpoint, on_event)
}

/// Goes on with the conversation of a finished run: `previous`'s messages, then `comment` as
/// the next user message, and the loop runs from there for up to `config.max_steps` more
/// steps, as if the model had never stopped. The new trajectory (fresh id, partial until it
/// ends) keeps `previous`'s messages and steps first, and numbers its own steps after them.
/// `tools` should work on a workspace that already holds `previous`'s changes.
#[allow(clippy::too_many_arguments)]
pub fn continue_with_events(
    llm: &mut dyn Llm,
    tools: &mut ToolBox,
    previous: &Trajectory,
    comment: &str,
    config: &AgentConfig,
    cancel: &AtomicBool,
    checkpoint: &mut dyn FnMut(&Trajectory),
    on_event: &mut dyn FnMut(AgentEvent<'_>),
) -> Trajectory {
    let mut t = new_trajectory("", config);
    t.instance_id = previous.instance_id.clone();
    t.messages = previous.messages.clone();
    t.messages.push(Message::user(comment));
    t.tools = if previous.tools.is_empty() { config.tools.clone() } else { previous.tools.clone() };
    t.steps = previous.steps.clone();
    t.n_steps = previous.steps.len();
    run_from(llm, tools, t, config, cancel, checkpoint, on_event)
}

/// The loop over `t`, whose messages end with the user message the model answers next.
fn run_from(
    llm: &mut dyn Llm,
    tools: &mut ToolBox,
    mut t: Trajectory,
    config: &AgentConfig,
    cancel: &AtomicBool,
    checkpoint: &mut dyn FnMut(&Trajectory),
    on_event: &mut dyn FnMut(AgentEvent<'_>),
) -> Trajectory {
    let started = Instant::now();
    if config.guards.head_tail_truncation {
        tools.truncation = Truncation::HeadTail;
    }
    tools.require_read_before_edit(config.guards.read_before_edit);
    for step in &t.steps {
        for call in step.assistant.calls() {
            tools.mark_seen(&call.function.name, &call.function.arguments);
        }
    }
    // Steps of a continued run are numbered after the ones it continues.
    let first = t.steps.len();
    let mut drift = DriftState::default();
    t.exit_reason = 'run: {
        for turn in 0..config.max_steps {
            let step = first + turn;
            if cancel.load(Ordering::Relaxed) {
                break 'run ExitReason::Cancelled;
            }
            if config.max_time.is_some_and(|m| started.elapsed() >= m) {
                break 'run ExitReason::MaxTime;
            }
            t.n_steps += 1;
            on_event(AgentEvent::Asking { step });
            let asked = Instant::now();
            // Right after the act notice the reply must be one tool call (enforced where replies
            // are sampled under the tools' grammar).
            let choice = if drift.act_notice_pending { ToolChoice::One } else { ToolChoice::Auto };
            drift.act_notice_pending = false;
            let reply = match query(llm, &t.messages, config, choice, &mut |notice| {
                on_event(AgentEvent::Notice { step, notice })
            }) {
                Ok(reply) => reply,
                Err(LlmError::ContextOverflow(_)) => break 'run ExitReason::MaxContextLen,
                Err(e @ LlmError::MalformedRepeatedly { .. }) => {
                    // The model did reply: its last reply is the run's last step, so the record
                    // shows what it wrote (the history stays without it, as for every retry).
                    if let LlmError::MalformedRepeatedly { text, .. } = &e {
                        let usage = StepUsage { model_sec: asked.elapsed().as_secs_f64(), ..StepUsage::default() };
                        let assistant = Message::assistant(text.clone());
                        t.steps.push(Step { step, assistant, observations: vec![], usage: Some(usage) });
                    }
                    t.error = Some(e.to_string());
                    break 'run ExitReason::LlmQueryError;
                }
                Err(e) => {
                    t.error = Some(e.to_string());
                    break 'run ExitReason::LlmQueryError;
                }
            };
            let mut assistant = reply.message.clone();
            let mut usage = StepUsage {
                prompt_tokens: reply.usage.map(|u| u.prompt_tokens),
                completion_tokens: reply.usage.map(|u| u.completion_tokens),
                cached_tokens: reply.usage.map(|u| u.cached_tokens),
                model_sec: asked.elapsed().as_secs_f64(),
                tools_sec: 0.0,
            };
            t.context_tokens = reply.usage.map_or_else(
                || estimate_tokens(&t.messages) + estimate_tokens(std::slice::from_ref(&assistant)),
                |u| u.prompt_tokens + u.completion_tokens,
            );
            let cut = reply.finish_reason == FinishReason::Length;
            on_event(AgentEvent::Replied { step, message: &assistant, cut, took: asked.elapsed() });
            if cut && drift.may_send_cut_notice(config, &reply) {
                assistant.tool_calls = None; // incomplete calls never run
                let notice = cut_notice(config);
                on_event(AgentEvent::Notice { step, notice: &notice.text() });
                t.messages.extend([assistant.clone(), notice]);
                t.steps.push(Step { step, assistant, observations: vec![], usage: Some(usage) });
                continue;
            }
            if !cut && assistant.calls().is_empty() && drift.may_send_act_notice(config, tools) {
                let notice = act_notice();
                on_event(AgentEvent::Notice { step, notice: &notice.text() });
                t.messages.extend([assistant.clone(), notice]);
                t.steps.push(Step { step, assistant, observations: vec![], usage: Some(usage) });
                continue;
            }
            t.messages.push(assistant.clone());
            if cut || assistant.calls().is_empty() {
                t.final_message = assistant.text().to_string();
                t.steps.push(Step { step, assistant, observations: vec![], usage: Some(usage) });
                break 'run match cut {
                    false => ExitReason::Agent,
                    true if context_full(&reply, config) => ExitReason::MaxContextLen,
                    true => ExitReason::MaxTokensPerTurn,
                };
            }
            let mut observations: Vec<Observation> = Vec::with_capacity(assistant.calls().len());
            for call in assistant.calls() {
                on_event(AgentEvent::ToolCall { step, call });
                let ran = Instant::now();
                let observation = tools.execute(&call.function.name, &call.function.arguments);
                let took = ran.elapsed();
                usage.tools_sec += took.as_secs_f64();
                on_event(AgentEvent::Observation { step, tool: &call.function.name, observation: &observation, took });
                observations.push(Observation { tool: call.function.name.clone(), observation });
            }
            drift.annotate(&mut observations, &assistant, config, turn);
            let first_new = t.messages.len();
            for (call, obs) in assistant.calls().iter().zip(&observations) {
                t.messages.push(Message::tool(&call.id, &obs.observation));
            }
            t.context_tokens += estimate_tokens(&t.messages[first_new..]);
            t.steps.push(Step { step, assistant, observations, usage: Some(usage) });
            t.elapsed_sec = started.elapsed().as_secs_f64();
            checkpoint(&t);
            if config.max_context_tokens > 0 && t.context_tokens >= config.max_context_tokens {
                break 'run ExitReason::MaxContextLen;
            }
        }
        ExitReason::MaxTurns
    };
    t.elapsed_sec = started.elapsed().as_secs_f64();
    t.partial = false;
    t
}

fn new_trajectory(task: &str, config: &AgentConfig) -> Trajectory {
    Trajectory {
        trajectory_format: FORMAT.into(),
        trajectory_id: format!("{:032x}", rand::random::<u128>()),
        instance_id: config.instance_id.clone(),
        seed: config.sampling.seed.unwrap_or(0),
        messages: vec![Message::system(&config.system_prompt), Message::user(task)],
        tools: config.tools.clone(),
        steps: Vec::new(),
        n_steps: 0,
        exit_reason: ExitReason::Running,
        error: None,
        final_message: String::new(),
        context_tokens: 0,
        elapsed_sec: 0.0,
        output_patch: String::new(),
        partial: true,
    }
}

fn cut_notice(config: &AgentConfig) -> Message {
    Message::user(format!(
        "{CUT_NOTICE} at the limit of {} tokens per reply. Reply again more briefly: keep the \
         reasoning short and make one tool call at a time.",
        config.sampling.max_tokens
    ))
}

fn act_notice() -> Message {
    Message::user(format!(
        "{ACT_NOTICE}. Do the work with the tools: Read the relevant files, change them with \
         Edit or Write, and check with Bash (for example by running the tests). Make one tool \
         call now. Reply without a tool call only when the task is done."
    ))
}

/// What the cut-reply, repeated-action and act guards remember between steps.
#[derive(Default)]
struct DriftState {
    cuts_in_a_row: u32,
    last_calls: String,
    repeats: u32,
    /// An Edit or Write has changed a file.
    acted: bool,
    act_notices: u32,
    /// The act notice was just sent: the next reply must be one tool call.
    act_notice_pending: bool,
}

impl DriftState {
    /// A cut reply earns a notice (instead of ending the run) at most twice in a row, and
    /// never when the context itself is full.
    fn may_send_cut_notice(&mut self, config: &AgentConfig, reply: &Completion) -> bool {
        let ok = config.guards.cut_notice && self.cuts_in_a_row < 2 && !context_full(reply, config);
        self.cuts_in_a_row = if ok { self.cuts_in_a_row + 1 } else { 0 };
        ok
    }

    /// A reply without a tool call earns the act notice (instead of ending the run) while no
    /// Edit or Write has changed a file and the workspace shows no change, at most twice a run.
    fn may_send_act_notice(&mut self, config: &AgentConfig, tools: &mut ToolBox) -> bool {
        if !config.guards.act_notice || self.acted || self.act_notices >= 2 {
            return false;
        }
        // A change made some other way (a Bash `sed -i`), or a workspace that cannot be
        // inspected, gets no notice.
        self.acted = tools.workspace_changed() != Some(false);
        let ok = !self.acted;
        self.act_notices += u32::from(ok);
        self.act_notice_pending = ok;
        ok
    }

    /// Appends the repeated-action and steps-left notices to the step's last observation.
    fn annotate(&mut self, observations: &mut [Observation], assistant: &Message, config: &AgentConfig, turn: usize) {
        self.cuts_in_a_row = 0;
        // Changed a file: an Edit or Write that succeeded (their success lines, tools.rs).
        self.acted |= observations.iter().any(|o| {
            (o.tool == "Edit" && o.observation.starts_with("Edited "))
                || (o.tool == "Write" && o.observation.starts_with("Wrote "))
        });
        let calls: Vec<_> = assistant.calls().iter().map(|c| (&c.function.name, &c.function.arguments)).collect();
        let signature = serde_json::to_string(&calls).unwrap_or_default();
        self.repeats = if signature == self.last_calls { self.repeats + 1 } else { 0 };
        self.last_calls = signature;
        let Some(last) = observations.last_mut() else { return };
        if config.guards.repeat_notice && self.repeats >= 2 {
            last.observation.push_str(&format!(
                "\n\n{REPEAT_NOTICE} {} times in a row; the result will not change. Try a different approach.]",
                self.repeats + 1
            ));
        }
        // `turn` counts this run's steps (a continued run has the whole budget again).
        let left = config.max_steps - turn - 1;
        if config.guards.steps_left_notice && (1..=3).contains(&left) {
            last.observation
                .push_str(&format!("\n\n[{left} step(s) left: finish the work and give your final answer.]"));
        }
    }
}

/// Asks the model; a malformed reply is retried on a throw-away copy of the history that
/// shows the model its broken reply and what was wrong, so the broken turn never enters the
/// real history. Under Leaf rules (no retries) the raw text becomes a plain answer, as an
/// OpenAI server without a tool parser would return it.
fn query(
    llm: &mut dyn Llm,
    messages: &[Message],
    config: &AgentConfig,
    tool_choice: ToolChoice,
    on_notice: &mut dyn FnMut(&str),
) -> Result<Completion, LlmError> {
    let retries = config.guards.malformed_retries;
    let mut scratch: Option<Vec<Message>> = None;
    let mut attempt = 0;
    loop {
        let msgs = scratch.as_deref().unwrap_or(messages);
        // A retry must be one tool call: the broken reply meant to call, and where calls are
        // sampled under the tools' grammar this makes the retry well formed.
        let tool_choice = if attempt > 0 && tool_choice == ToolChoice::Auto { ToolChoice::One } else { tool_choice };
        let request = ChatRequest { messages: msgs, tools: &config.tools, sampling: &config.sampling, tool_choice };
        match llm.complete(&request) {
            Err(LlmError::Malformed { text, .. }) if retries == 0 => {
                return Ok(Completion {
                    message: Message::assistant(text),
                    finish_reason: FinishReason::Stop,
                    usage: None,
                });
            }
            Err(LlmError::Malformed { text, error, call_syntax }) if attempt < retries => {
                attempt += 1;
                let mut copy = messages.to_vec();
                copy.push(Message::assistant(text));
                let notice =
                    format!("{MALFORMED_NOTICE} ({error}). Reply again; write each call exactly as {call_syntax}");
                on_notice(&notice);
                copy.push(Message::user(notice));
                scratch = Some(copy);
            }
            Err(LlmError::Malformed { text, error, .. }) => {
                return Err(LlmError::MalformedRepeatedly { attempts: retries + 1, text, error });
            }
            other => return other,
        }
    }
}

/// Whether a cut reply was cut by the context limit rather than the per-turn limit.
fn context_full(reply: &Completion, config: &AgentConfig) -> bool {
    match reply.usage {
        Some(u) => {
            (config.max_context_tokens > 0 && u.prompt_tokens + u.completion_tokens >= config.max_context_tokens)
                || u.completion_tokens < u64::from(config.sampling.max_tokens)
        }
        None => false,
    }
}

/// Leaf's fallback token estimate: UTF-8 bytes of the compact JSON, divided by 4.
pub fn estimate_tokens(messages: &[Message]) -> u64 {
    let bytes = serde_json::to_string(messages).map(|s| s.len()).unwrap_or(0) as u64;
    bytes.div_ceil(4)
}
