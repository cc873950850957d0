//! The in-process [`Llm`]: the model runs inside this process, either through a [`Session`]
//! of its own or on a shared [`Scheduler`] ([`EngineLlm::on_scheduler`]: many conversations
//! batched together, as a training group's attempts are). Either way one session holds the
//! conversation, so each agent step only prefills what was added since the last one (the
//! tool results), not the whole conversation. The messages are
//! rendered with the model's chat template, and the reply text is split into reasoning,
//! content and tool calls by the protocol's codec in the model's own tool-call format
//! ([`ChatParts::tool_parser`]: detected from the chat template, or named by
//! `--tool-parser`). A reply whose calls all fail to parse is [`LlmError::Malformed`] (the
//! agent retries it); one where some parse keeps those, and the broken ones are logged.
//!
//! **Constrained tool calls** (opt-in, [`EngineLlm::constrain_tools`]): every reply to a
//! request with tools is sampled under a grammar ([`crate::tool_grammar`], `CallRule::Optional`)
//! in the tool-call format the reply is parsed with: free text, or text then calls of the
//! offered tools with arguments under their schemas, so a malformed call cannot be written.
//! The grammar is compiled once per tool list and reused every turn.
//!
//! **Recording** (opt-in, [`EngineLlm::recording`]): for RL rollouts every assistant turn is
//! kept as a [`TurnRecord`] — the prompt token ids, the sampled ids (the closing end-of-turn
//! token included) and one sampling logprob per sampled token (the engine's log-softmax of
//! the raw logits, which is the sampling distribution exactly when sampling is raw:
//! temperature 1, top-p 1, no top-k/min-p, no repetition penalty).
//!
//! While recording, turn k's prompt is built *token-in, token-out*: the previous prompt, the
//! tokens the model actually sampled, then only the tokenized text the chat template adds
//! after the previous assistant message (its closing glue, the tool results, the next
//! generation prompt). Earlier turns are never re-tokenized, so the model conditions on
//! exactly what it sampled and the rollout is one growing sequence (docs/rl.md §4). This
//! needs the template to be append-only for the conversation (rendering the conversation
//! through the previous assistant message starts with the previous prompt's text, and the
//! full rendering starts with that); when it is not (a template that drops earlier
//! reasoning, a throw-away retry history), the turn falls back to the plain re-rendered
//! prompt and its record says so ([`TurnRecord::continued`] false); whoever builds the
//! training sequence then finds the prefix property broken.

use std::ops::ControlFlow;
use std::sync::Arc;

use frognano_model::chat::ChatTemplate;
use frognano_model::tokenizer::Tokenizer;
use frognano_model::CausalLm;
use frognano_protocol::codec::{ToolCallFormat, ToolParser};
use frognano_protocol::{ChatRequest, Completion, FinishReason, Llm, LlmError, Message, ToolChoice, Usage};
use serde_json::Value;

use crate::constraint::{Constraint, LazyConstraints};
use crate::persist::SessionStore;
use crate::sampler::SamplingParams;
use crate::scheduler::Scheduler;
use crate::session::{EngineError, FinishReason as EngineFinish, GenerateRequest, Generation, Session};
use crate::tool_grammar::{tool_call_grammar, CallRule};

/// One assistant turn as the engine ran it (recording mode).
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRecord {
    /// The prompt token ids the model was run on.
    pub prompt_ids: Vec<u32>,
    /// The sampled token ids, the end-of-turn token included when one was drawn.
    pub sampled_ids: Vec<u32>,
    /// log p(token) of each sampled token under the model's raw distribution.
    pub logprobs: Vec<f32>,
    /// Whether an end-of-turn token closed the turn (false: cut by a length limit, or ended
    /// by the tool-call grammar, whose turn the next prompt closes as the template does).
    pub stopped: bool,
    /// Whether the prompt was built by token continuation of the previous turn (always
    /// true for the first turn); false when the turn fell back to re-rendering.
    pub continued: bool,
}

/// What the recorder remembers of the last turn, to continue from it.
struct LastTurn {
    /// The messages the last prompt was rendered from.
    messages: Vec<Message>,
    /// The rendered text of the last prompt (generation prompt included).
    text: String,
    /// The last prompt's ids followed by the ids sampled after it.
    tokens: Vec<u32>,
    /// Whether the last turn ended with an end-of-turn token.
    stopped: bool,
}

#[derive(Default)]
struct Recorder {
    turns: Vec<TurnRecord>,
    last: Option<LastTurn>,
}

/// What an in-process chat model needs besides the network: the tokenizer, the chat template,
/// the ids that end a turn and the tool-call format its replies are read in. Cheap to clone
/// (the tokenizer and template are shared), so every conversation on a shared scheduler (a
/// training attempt, an eval instance) takes its own copy.
#[derive(Clone)]
pub struct ChatParts {
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template.
    pub template: Arc<ChatTemplate>,
    /// Ids that end an assistant turn.
    pub eos_ids: Vec<u32>,
    /// The tool-call format of the model's replies.
    pub tool_parser: ToolParser,
}

impl ChatParts {
    /// Splits a loaded checkpoint into the network and its chat parts; a checkpoint without
    /// a tokenizer or chat template is an error that says which is missing. The tool-call
    /// format is the template's ([`ChatTemplate::tool_parser`]); a template without tool
    /// support is said so once, in the log.
    pub fn split(lm: frognano_model::LoadedModel) -> anyhow::Result<(Arc<dyn CausalLm>, ChatParts)> {
        lm.tokenizer()?;
        lm.chat_template()?;
        let frognano_model::LoadedModel { model, tokenizer, chat_template, eos_ids, path, .. } = lm;
        let (Some(tokenizer), Some(template)) = (tokenizer, chat_template) else {
            anyhow::bail!("{}: the checkpoint has no tokenizer or no chat template", path.display());
        };
        if !template.supports_tools() {
            tracing::warn!(
                "{}: the chat template does not show the model its tools; FrogNano describes them in the \
                 system prompt in the Hermes form and reads <tool_call> JSON replies",
                path.display()
            );
        }
        let tool_parser = template.tool_parser();
        let parts = ChatParts { tokenizer: Arc::new(tokenizer), template: Arc::new(template), eos_ids, tool_parser };
        Ok((Arc::from(model), parts))
    }

    /// The grammar-constraint factory for this tokenizer and its end-of-turn ids, over a
    /// model of `vocab_size` logits (built when first used).
    pub fn lazy_constraints(&self, vocab_size: usize) -> LazyConstraints {
        LazyConstraints::new(Arc::clone(&self.tokenizer), vocab_size, self.eos_ids.clone())
    }

    /// These parts with replies read in `parser` instead of the template's format (`None`
    /// keeps it).
    pub fn with_tool_parser(mut self, parser: Option<ToolParser>) -> Self {
        if let Some(parser) = parser {
            self.tool_parser = parser;
        }
        self
    }
}

/// A model loaded in this process.
pub struct EngineLlm {
    name: String,
    runner: Runner,
    chat: ChatParts,
    max_context: usize,
    recorder: Option<Recorder>,
    /// The checkpoint's architecture (`qwen35`, `llama`, …), when loaded by [`EngineLlm::load`].
    architecture: Option<String>,
    /// Tool calls constrained by a grammar ([`EngineLlm::constrain_tools`]): the factory,
    /// which keeps the grammars of the last tool lists compiled.
    tool_constraint: Option<Arc<LazyConstraints>>,
}

impl EngineLlm {
    /// Loads `spec` (checkpoint folder, `.gguf` file or cached hub id). The model must have a
    /// tokenizer and a chat template.
    pub fn load(spec: &str) -> anyhow::Result<Self> {
        Self::load_with_kv_cache(spec, None)
    }

    /// [`load`](Self::load), with attention keys and values stored as `kv_cache` (`--kv-cache`;
    /// `None`: the model's default, f16).
    pub fn load_with_kv_cache(spec: &str, kv_cache: Option<frognano_model::KvType>) -> anyhow::Result<Self> {
        let mut loaded = frognano_model::load(spec)?;
        if let Some(ty) = kv_cache {
            loaded.model.set_kv_type(ty).map_err(|e| anyhow::anyhow!("--kv-cache {ty}: {e}"))?;
        }
        let architecture = loaded.architecture.clone();
        let (model, chat) = ChatParts::split(loaded)?;
        let mut llm = Self::from_parts(spec, model, chat);
        llm.architecture = Some(architecture);
        Ok(llm)
    }

    /// The checkpoint's architecture as it names it (GGUF `general.architecture` or
    /// `config.json`'s `model_type`), when loaded by [`EngineLlm::load`].
    pub fn architecture(&self) -> Option<&str> {
        self.architecture.as_deref()
    }

    /// Samples every reply to a request with tools under a grammar of the tool calls (see
    /// the module docs), so a malformed call cannot be produced. The grammar's token masks
    /// are computed on a helper thread while the model runs. Not for RL recording: masked
    /// tokens are not drawn from the model's own distribution.
    pub fn constrain_tools(self) -> Self {
        let constraints = self.chat.lazy_constraints(self.runner.model().vocab_size());
        self.constrain_tools_with(Arc::new(constraints))
    }

    /// [`EngineLlm::constrain_tools`] with a factory shared by other conversations on the
    /// same model (built once, on the first constrained turn of any of them).
    pub fn constrain_tools_with(mut self, constraints: Arc<LazyConstraints>) -> Self {
        self.tool_constraint = Some(constraints);
        self
    }

    /// Whether the model is a Qwen3.5-family one (FrogNano's), by its architecture.
    pub fn is_qwen35(&self) -> bool {
        self.architecture.as_deref().is_some_and(frognano_model::load::is_qwen35_architecture)
    }

    /// Whether tool calls are constrained ([`EngineLlm::constrain_tools`]).
    pub fn constrains_tools(&self) -> bool {
        self.tool_constraint.is_some()
    }

    /// An engine with a session of its own over an already-loaded model. Recording is off.
    pub fn from_parts(name: impl Into<String>, model: Arc<dyn CausalLm>, chat: ChatParts) -> Self {
        let max_context = model.max_context();
        EngineLlm {
            name: name.into(),
            runner: Runner::Own(Session::new(model), None),
            chat,
            max_context,
            recorder: None,
            architecture: None,
            tool_constraint: None,
        }
    }

    /// An engine whose generations run on a shared [`Scheduler`] (the HTTP server's, or one
    /// per training step): concurrent conversations over one model share batched decode
    /// steps, and a conversation sharing a prefix with another starts from a fork of its
    /// state. The scheduler routes each turn back to the session holding the conversation.
    pub fn on_scheduler(name: impl Into<String>, scheduler: Arc<Scheduler>, chat: ChatParts) -> Self {
        let max_context = scheduler.model().max_context();
        EngineLlm {
            name: name.into(),
            runner: Runner::Shared(scheduler),
            chat,
            max_context,
            recorder: None,
            architecture: None,
            tool_constraint: None,
        }
    }

    /// Saves the conversation's state in `store` after every reply, and starts a turn from
    /// the longest saved state its prompt extends when that is more than the session holds:
    /// an agent run that is continued later (another process) does not prefill its history
    /// again. No effect on an engine [on a scheduler](Self::on_scheduler), whose own
    /// [`SchedulerConfig::store`](crate::SchedulerConfig::store) does this.
    pub fn with_session_store(mut self, store: Arc<SessionStore>) -> Self {
        if let Runner::Own(_, slot) = &mut self.runner {
            *slot = Some(store);
        }
        self
    }

    /// The model.
    pub fn model(&self) -> &Arc<dyn CausalLm> {
        self.runner.model()
    }

    /// Caps the context at `max_context` tokens (never above the model's own limit).
    pub fn with_max_context(mut self, max_context: usize) -> Self {
        self.max_context = max_context.min(self.runner.model().max_context());
        self
    }

    /// Reads replies in `parser` instead of the chat template's format (`None` keeps it).
    pub fn with_tool_parser(mut self, parser: Option<ToolParser>) -> Self {
        self.chat = self.chat.with_tool_parser(parser);
        self
    }

    /// The tool-call format replies are read in.
    pub fn tool_parser(&self) -> ToolParser {
        self.chat.tool_parser
    }

    /// Turns recording of every assistant turn on (see the module docs).
    pub fn recording(mut self) -> Self {
        self.recorder = Some(Recorder::default());
        self
    }

    /// The turns recorded so far (empty when not recording).
    pub fn turns(&self) -> &[TurnRecord] {
        self.recorder.as_ref().map_or(&[], |r| &r.turns)
    }

    /// Hands over the recorded turns and forgets the conversation (the next turn starts a
    /// new sequence). Recording stays on if it was on.
    pub fn take_turns(&mut self) -> Vec<TurnRecord> {
        self.recorder.as_mut().map(std::mem::take).map(|r| r.turns).unwrap_or_default()
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.chat.tokenizer
    }

    /// The chat template.
    pub fn template(&self) -> &ChatTemplate {
        &self.chat.template
    }

    /// Ids that end a turn.
    pub fn eos_ids(&self) -> &[u32] {
        &self.chat.eos_ids
    }

    /// Renders `messages` as the model sees them (`add_generation_prompt` for a prompt).
    pub fn render_messages(
        &self,
        messages: &[Message],
        tools: &[Value],
        enable_thinking: bool,
        add_generation_prompt: bool,
    ) -> Result<String, LlmError> {
        let mut kwargs = serde_json::Map::new();
        kwargs.insert("enable_thinking".into(), Value::Bool(enable_thinking));
        let tools = (!tools.is_empty()).then_some(tools);
        // Content as plain text, as `frognano serve` hands it to the template: a tool-only
        // turn's null content and list-of-parts content render on every template.
        let messages = frognano_protocol::text_only_messages(messages)
            .map_err(|(i, e)| LlmError::Other(format!("message {i}: {e}")))?;
        self.chat
            .template
            .render(&messages, tools, add_generation_prompt, Some(&kwargs))
            .map_err(|e| LlmError::Other(format!("chat template: {e}")))
    }

    /// The tool-call constraint for this turn, when tools are constrained and offered: a new
    /// reply's state of the tools' grammar (compiled once per tool list and rule, by the factory).
    fn tool_constraint(
        &self,
        request: &ChatRequest<'_>,
        thinking_prompted: bool,
    ) -> Result<Option<Constraint>, LlmError> {
        let Some(constraints) = &self.tool_constraint else { return Ok(None) };
        if request.tools.is_empty() {
            return Ok(None);
        }
        let rule = match request.tool_choice {
            ToolChoice::Auto => CallRule::Optional,
            ToolChoice::Required => CallRule::Required,
            ToolChoice::One => CallRule::One,
        };
        // The grammar is written in the format the reply is parsed with (below); the factory
        // keeps it compiled for the next turn with the same tools.
        let grammar = tool_call_grammar(self.chat.tool_parser.format().name(), request.tools, &rule, thinking_prompted)
            .and_then(|g| constraints.compile(&g))
            .map_err(|e| {
                LlmError::Other(format!("constrained tool calls: {e} (run without constraining tool calls)"))
            })?;
        Ok(Some(grammar.start()))
    }

    fn render(&self, request: &ChatRequest<'_>) -> Result<String, LlmError> {
        self.render_messages(request.messages, request.tools, request.sampling.enable_thinking, true)
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, LlmError> {
        self.chat.tokenizer.encode_with(text, false).map_err(|e| LlmError::Other(format!("tokenizer: {e}")))
    }

    /// The prompt ids for `request` whose full rendering is `text`; `true` when they continue
    /// the recorded previous turn token for token.
    fn prompt_ids(&self, request: &ChatRequest<'_>, text: &str) -> Result<(Vec<u32>, bool), LlmError> {
        let last = match &self.recorder {
            Some(Recorder { last: Some(last), .. }) => last,
            Some(_) => return Ok((self.encode(text)?, true)),
            None => return Ok((self.encode(text)?, false)),
        };
        match self.continuation(request, text, last)? {
            Some(delta) => {
                let mut ids = last.tokens.clone();
                ids.extend(self.encode(&delta)?);
                Ok((ids, true))
            }
            None => Ok((self.encode(text)?, false)),
        }
    }

    /// Where the generation prompt of `prompt` (rendered as `text`) begins, for
    /// [`GenerateRequest::checkpoint`]: the next turn renders this one's ending its own way and
    /// shares the prompt only up to there. `None` when the template's ending is not a plain
    /// suffix of the prompt.
    fn generation_checkpoint(&self, request: &ChatRequest<'_>, text: &str, prompt: &[u32]) -> Option<usize> {
        let s = request.sampling;
        let base = self.render_messages(request.messages, request.tools, s.enable_thinking, false).ok()?;
        generation_checkpoint(text, &base, prompt, &self.chat.tokenizer)
    }

    /// The text to append after the last turn's sampled tokens, or `None` when the
    /// conversation does not extend the last one through an append-only template.
    fn continuation(&self, request: &ChatRequest<'_>, text: &str, last: &LastTurn) -> Result<Option<String>, LlmError> {
        let m = last.messages.len();
        let msgs = request.messages;
        if msgs.len() <= m || msgs[..m] != last.messages[..] || msgs[m].role != "assistant" {
            return Ok(None);
        }
        let s = request.sampling;
        let through = self.render_messages(&msgs[..=m], request.tools, s.enable_thinking, false)?;
        let (Some(body), true) = (through.strip_prefix(last.text.as_str()), text.starts_with(&through)) else {
            return Ok(None);
        };
        // The end-of-turn token the template closes the assistant message with: the last
        // one in the rendered message.
        let close = self
            .chat
            .eos_ids
            .iter()
            .filter_map(|&id| self.chat.tokenizer.decode(&[id], false).ok().filter(|t| !t.is_empty()))
            .filter_map(|t| body.rfind(&t).map(|at| (at, t.len())))
            .max();
        let Some((at, len)) = close else { return Ok(None) };
        let glue = if last.stopped { &body[at + len..] } else { &body[at..] };
        Ok(Some(format!("{glue}{}", &text[through.len()..])))
    }
}

/// Where the generation prompt of a chat prompt begins ([`GenerateRequest::checkpoint`]):
/// `text` is the prompt rendered with it (tokenized as `ids`), `base` the same conversation
/// rendered without it. The template's ending is tokenized alone and must end `ids` token for
/// token; `None` when it is not a plain suffix of the prompt. `frognano-serve` and
/// [`EngineLlm`] both find their checkpoints here.
pub fn generation_checkpoint(text: &str, base: &str, ids: &[u32], tokenizer: &Tokenizer) -> Option<usize> {
    let suffix = text.strip_prefix(base).filter(|s| !s.is_empty())?;
    let suffix_ids = tokenizer.encode_with(suffix, false).ok()?;
    (ids.ends_with(&suffix_ids) && suffix_ids.len() < ids.len()).then(|| ids.len() - suffix_ids.len())
}

impl Llm for EngineLlm {
    fn complete(&mut self, request: &ChatRequest<'_>) -> Result<Completion, LlmError> {
        let prompt_text = self.render(request)?;
        let (prompt, continued) = self.prompt_ids(request, &prompt_text)?;
        if prompt.len() >= self.max_context {
            return Err(LlmError::ContextOverflow(format!(
                "maximum context length is {} tokens, the conversation has {}",
                self.max_context,
                prompt.len()
            )));
        }
        let s = request.sampling;
        let req = GenerateRequest {
            sampling: SamplingParams {
                temperature: s.temperature,
                top_p: s.top_p,
                top_k: s.top_k as usize,
                min_p: s.min_p,
                repetition_penalty: s.repetition_penalty,
                presence_penalty: s.presence_penalty,
                frequency_penalty: s.frequency_penalty,
                logit_bias: s.logit_bias.iter().map(|(&id, &bias)| (id, bias)).collect(),
                // While recording, each turn draws from its own stream (seed + turn index);
                // otherwise every turn would replay the first turn's random numbers.
                seed: match &self.recorder {
                    Some(rec) => s.seed.map(|seed| seed.wrapping_add(rec.turns.len() as u64)),
                    None => s.seed,
                },
            },
            max_tokens: (s.max_tokens as usize).min(self.max_context - prompt.len()),
            stop_ids: self.chat.eos_ids.clone(),
            top_logprobs: 0,
            checkpoint: self.generation_checkpoint(request, &prompt_text, &prompt),
        };
        let thinking_prompted = prompt_text.trim_end_matches('\n').ends_with("<think>");
        let constraint = self.tool_constraint(request, thinking_prompted)?;
        let g = self
            .runner
            .generate(prompt.clone(), &req, constraint)
            .map_err(|e| LlmError::Other(format!("generation: {e}")))?;
        if let Some(rec) = &mut self.recorder {
            let sampled_ids: Vec<u32> = g.tokens.iter().map(|t| t.id).collect();
            // Closed by an end-of-turn token the model drew. A reply the tool-call grammar
            // ended (finish Stop, no end token) is not: the next prompt closes it as the
            // template does, or the model would see a turn never closed.
            let stopped = sampled_ids.last().is_some_and(|id| self.chat.eos_ids.contains(id));
            let mut tokens = prompt.clone();
            tokens.extend_from_slice(&sampled_ids);
            rec.turns.push(TurnRecord {
                prompt_ids: prompt.clone(),
                sampled_ids,
                logprobs: g.tokens.iter().map(|t| t.logprob).collect(),
                stopped,
                continued,
            });
            rec.last =
                Some(LastTurn { messages: request.messages.to_vec(), text: prompt_text.clone(), tokens, stopped });
        }
        let ids: Vec<u32> = g.tokens.iter().map(|t| t.id).filter(|id| !self.chat.eos_ids.contains(id)).collect();
        let raw = self.chat.tokenizer.decode(&ids, true).map_err(|e| LlmError::Other(format!("detokenize: {e}")))?;
        let usage = Some(Usage {
            prompt_tokens: g.prompt_tokens as u64,
            completion_tokens: g.tokens.len() as u64,
            cached_tokens: g.cached_tokens as u64,
        });
        if matches!(g.finish, EngineFinish::Length | EngineFinish::ContextFull) {
            // A cut reply is not parsed: the loop tells the model and asks for less.
            return Ok(Completion { message: Message::assistant(raw), finish_reason: FinishReason::Length, usage });
        }
        let format = self.chat.tool_parser;
        let parsed = format.parse_reply(&raw, thinking_prompted, request.tools);
        if let Some(bad) = parsed.failed_call() {
            return Err(LlmError::Malformed {
                text: raw.clone(),
                error: bad.error.clone(),
                call_syntax: format.call_syntax().to_string(),
            });
        }
        for bad in &parsed.malformed {
            tracing::warn!(
                "{}: a malformed {format} tool call was dropped ({}): {:.200}",
                self.name,
                bad.error,
                bad.text
            );
        }
        let finish_reason = if parsed.tool_calls.is_empty() { FinishReason::Stop } else { FinishReason::ToolCalls };
        let content = Some(parsed.content).filter(|c| !c.is_empty());
        Ok(Completion {
            message: Message::assistant_reply(content, parsed.reasoning, parsed.tool_calls),
            finish_reason,
            usage,
        })
    }

    fn describe(&self) -> String {
        match self.tool_constraint {
            Some(_) => format!("{} (in process, tool calls constrained by a grammar)", self.name),
            None => format!("{} (in process)", self.name),
        }
    }
}

/// Where an [`EngineLlm`]'s generations run.
enum Runner {
    /// A session of its own (one conversation at a time, as `frognano solve` runs), and
    /// where its states are saved, if anywhere ([`EngineLlm::with_session_store`]).
    Own(Session, Option<Arc<SessionStore>>),
    /// A scheduler shared with other conversations.
    Shared(Arc<Scheduler>),
}

impl Runner {
    fn model(&self) -> &Arc<dyn CausalLm> {
        match self {
            Runner::Own(s, _) => s.model(),
            Runner::Shared(s) => s.model(),
        }
    }

    fn generate(
        &mut self,
        prompt: Vec<u32>,
        req: &GenerateRequest,
        constraint: Option<Constraint>,
    ) -> Result<Generation, EngineError> {
        match self {
            Runner::Own(s, store) => {
                if let Some(store) = store {
                    let held = s.tokens().iter().zip(&prompt).take_while(|(a, b)| a == b).count();
                    if let Some((restored, _)) = store.restore(&prompt, held, s.model()) {
                        *s = restored;
                    }
                }
                let g = s.generate_constrained(&prompt, req, constraint, |_| ControlFlow::Continue(()))?;
                if let Some(store) = store {
                    store.save(s);
                }
                Ok(g)
            }
            Runner::Shared(s) => s.generate_constrained(prompt, req.clone(), constraint, |_| ControlFlow::Continue(())),
        }
    }
}
