//! `frognano run`, `frognano chat` and `frognano logits`.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use frognano_engine::{FinishReason, GenerateRequest, SamplingParams, Session, SpeculativeMode};
use frognano_protocol::Message;

use frognano_model::load::DEMO_MODEL;
use frognano_model::quant::QuantType;
use frognano_model::KvType;

/// Sampling, length and loading flags shared by `run` and `chat`. The short forms and aliases
/// are llama.cpp's (`-n`/`--n-predict`, `--temp`, `--repeat-penalty`, `-s`, `-c`, `-t`).
#[derive(Args, Clone)]
pub struct GenFlags {
    /// Most tokens to generate (per reply).
    #[arg(short = 'n', long, visible_alias = "n-predict", default_value_t = 512)]
    pub max_tokens: usize,
    /// Keep generating to -n/--max-tokens: the end-of-sequence tokens are never drawn (as
    /// llama.cpp's --ignore-eos bans them).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Context size in tokens (prompt + reply, the whole conversation in `chat`): a longer
    /// prompt is an error, and generation stops when the context is full [default and
    /// maximum: the model's].
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    pub ctx_size: Option<usize>,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, visible_alias = "temp", default_value_t = 0.7)]
    pub temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Keep only the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 20)]
    pub top_k: usize,
    /// Drop tokens below min_p × the top probability.
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Penalty on tokens already seen (1 = none).
    #[arg(long, visible_alias = "repeat-penalty", default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Seed for reproducible sampling.
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
    /// Print timing (prefill and decode tokens/s) to stderr.
    #[arg(long)]
    pub stats: bool,
    /// Quantize the weights on load (q8_0 or q4_k); for f32/bf16 checkpoints and GGUF files.
    #[arg(long, value_parser = parse_quant)]
    pub quant: Option<QuantType>,
    /// How the KV cache stores attention keys and values: f16, q8_0 or q4_0 (ggml blocks, 53 %
    /// and 28 % of f16's memory; llama.cpp's -ctk/-ctv), or f32 [default: f16; Qwen3.5
    /// checkpoint folders keep f32, their activations' numerics].
    #[arg(long = "kv-cache", value_name = "TYPE", value_parser = parse_kv_cache)]
    pub kv_cache: Option<KvType>,
    /// Speculative decoding (docs/speculative.md): `lookup` drafts tokens copied from the
    /// prompt and the reply and checks them in one forward; `auto` does so for greedy
    /// replies (`--temperature 0`) while the drafts pay and pauses while they do not; `none`
    /// decodes one token per forward. The output is the same either way (greedy: token for
    /// token; sampling under `lookup` or `mtp`: the same distribution). `mtp` drafts 1–4
    /// tokens with the checkpoint's multi-token-prediction head (Qwen3.5 `mtp.*`); `auto`
    /// uses the head when the model has one, prompt lookup otherwise.
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = parse_speculative)]
    pub speculative: SpeculativeMode,
    #[command(flatten)]
    pub threads: crate::threads::ThreadArgs,
}

/// `--speculative`'s value.
pub fn parse_speculative(s: &str) -> Result<SpeculativeMode, String> {
    s.parse()
}

/// `--kv-cache`'s value.
pub fn parse_kv_cache(s: &str) -> Result<KvType, String> {
    s.parse()
}

/// Sets the model's KV cache type (`--kv-cache`) when one was given.
pub fn apply_kv_cache(model: &mut dyn frognano_model::CausalLm, kv: Option<KvType>) -> anyhow::Result<()> {
    if let Some(ty) = kv {
        model.set_kv_type(ty).with_context(|| format!("--kv-cache {ty}"))?;
    }
    Ok(())
}

/// Arguments of `frognano run`.
#[derive(Args)]
pub struct RunArgs {
    /// Checkpoint folder, .gguf file or hub id in the local cache [default: the demo model].
    pub model: Option<String>,
    /// The prompt [default: "Write a haiku about frogs."].
    #[arg(short, long, conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from this file (one trailing newline dropped, as llama.cpp's -f does).
    #[arg(short = 'f', long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Apply the model's chat template (a user message, then the assistant's turn).
    #[arg(long)]
    pub chat: bool,
    /// System message (with --chat).
    #[arg(long)]
    pub system: Option<String>,
    /// Ask a thinking model to think first (`enable_thinking`, with --chat).
    #[arg(long)]
    pub think: bool,
    #[command(flatten)]
    pub gen: GenFlags,
}

/// Arguments of `frognano chat`.
#[derive(Args)]
pub struct ChatArgs {
    /// Checkpoint folder, .gguf file or hub id in the local cache [default: the demo model].
    pub model: Option<String>,
    /// System message.
    #[arg(long, conflicts_with = "file")]
    pub system: Option<String>,
    /// Read the system message from this file (llama-cli's conversation mode takes -f as
    /// the system prompt; one trailing newline dropped).
    #[arg(short = 'f', long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Ask a thinking model to think first (`enable_thinking`).
    #[arg(long)]
    pub think: bool,
    /// Keep the conversation in FILE: its messages and the model's state after each reply.
    /// Run again with the same FILE to go on where it stopped, without prefilling the history
    /// again (docs/serve.md §9).
    #[arg(long, value_name = "FILE")]
    pub session: Option<PathBuf>,
    #[command(flatten)]
    pub gen: GenFlags,
}

/// `q8_0` / `q4_k` → the block format (the ones `--quant` produces).
pub fn parse_quant(s: &str) -> Result<QuantType, String> {
    match s.to_ascii_lowercase().as_str() {
        "q8_0" => Ok(QuantType::Q8_0),
        "q4_k" => Ok(QuantType::Q4_K),
        other => Err(format!("unknown quantization {other:?}; expected q8_0 or q4_k")),
    }
}

/// Arguments of `frognano logits`.
#[derive(Args)]
pub struct LogitsArgs {
    /// Checkpoint folder, .gguf file or hub id in the local cache.
    pub model: String,
    /// Comma-separated token ids.
    #[arg(long, value_delimiter = ',', required = true)]
    pub ids: Vec<u32>,
    /// Quantize the weights on load (q8_0 or q4_k), as `run --quant` does.
    #[arg(long, value_parser = parse_quant)]
    pub quant: Option<QuantType>,
    /// KV cache type, as `run --kv-cache`.
    #[arg(long = "kv-cache", value_name = "TYPE", value_parser = parse_kv_cache)]
    pub kv_cache: Option<KvType>,
    #[command(flatten)]
    pub threads: crate::threads::ThreadArgs,
}

/// The text of a prompt file given with `-f`: an error names the path; one trailing newline
/// (what an editor leaves) is dropped, as llama.cpp does.
pub fn read_prompt_file(path: &Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading the prompt file {} (-f)", path.display()))?;
    let mut text = String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("the prompt file {} (-f) is not UTF-8 text: {e}", path.display()))?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        bail!("the prompt file {} (-f) is empty", path.display());
    }
    Ok(text)
}

fn model_spec(m: Option<String>) -> anyhow::Result<String> {
    match m {
        Some(m) => Ok(m),
        None if std::path::Path::new(DEMO_MODEL).exists() => Ok(DEMO_MODEL.into()),
        None => bail!("no MODEL given and the demo model {DEMO_MODEL} is missing; run scripts/fetch-demo-model.sh"),
    }
}

/// A loaded model ready to talk: one session kept across turns.
struct Talker {
    session: Session,
    tok: frognano_model::tokenizer::Tokenizer,
    template: Option<frognano_model::chat::ChatTemplate>,
    eos_ids: Vec<u32>,
    req: GenerateRequest,
    /// The context cap (`-c/--ctx-size`, or the model's own length).
    ctx: usize,
    stats: bool,
}

impl Talker {
    fn load(model: Option<String>, gen: &GenFlags) -> anyhow::Result<Self> {
        let spec = model_spec(model)?;
        let mut lm =
            frognano_model::load::load_quantized(&spec, gen.quant).with_context(|| format!("loading {spec}"))?;
        lm.tokenizer()?;
        apply_kv_cache(&mut *lm.model, gen.kv_cache)?;
        let model_max = lm.model.max_context();
        let ctx = match gen.ctx_size {
            None => model_max,
            Some(0) => bail!("-c/--ctx-size must be at least 1 token"),
            Some(n) if n > model_max => {
                bail!("-c/--ctx-size {n} is larger than the model's context of {model_max} tokens")
            }
            Some(n) => n,
        };
        // The whole context's cache must fit before the first token is run.
        frognano_model::memory::check_context(&*lm.model, ctx).map_err(anyhow::Error::msg)?;
        let mut sampling = SamplingParams {
            temperature: gen.temperature,
            top_p: gen.top_p,
            top_k: gen.top_k,
            min_p: gen.min_p,
            repetition_penalty: gen.repetition_penalty,
            seed: gen.seed,
            ..SamplingParams::default()
        };
        sampling.validate().map_err(anyhow::Error::msg)?;
        let frognano_model::LoadedModel { model, tokenizer, chat_template, eos_ids, .. } = lm;
        let stop_ids = if gen.ignore_eos {
            // As llama.cpp's --ignore-eos: every end-of-generation token gets the lowest bias
            // there is (OpenAI's −100, in effect a ban: e^−100 underflows next to any other
            // token), so the reply runs to -n instead of continuing past an end marker.
            sampling.logit_bias.extend(eos_ids.iter().map(|&id| (id, -100.0)));
            Vec::new()
        } else {
            eos_ids.clone()
        };
        let req = GenerateRequest { sampling, max_tokens: gen.max_tokens, stop_ids, top_logprobs: 0, checkpoint: None };
        if gen.speculative == SpeculativeMode::Mtp && model.mtp().is_none() {
            anyhow::bail!(
                "--speculative mtp: this model has no multi-token-prediction head (no mtp.* weights); use lookup or auto"
            );
        }
        let mut session = Session::new(Arc::from(model));
        session.set_speculative(gen.speculative);
        Ok(Talker {
            session,
            tok: tokenizer.expect("checked above"),
            template: chat_template,
            eos_ids,
            req,
            ctx,
            stats: gen.stats,
        })
    }

    fn render(&self, msgs: &[Message], think: bool) -> anyhow::Result<String> {
        let template = self.template.as_ref().context("this model has no chat template")?;
        let mut kw = serde_json::Map::new();
        kw.insert("enable_thinking".into(), think.into());
        Ok(template.render(msgs, None, true, Some(&kw))?)
    }

    /// Generates a reply to `text` (already templated if `templated`), streaming it to stdout;
    /// returns the reply text.
    fn reply(&mut self, text: &str, templated: bool) -> anyhow::Result<String> {
        // A rendered chat template already holds its special tokens (as transformers encodes it).
        let prompt = self.tok.encode_with(text, !templated)?;
        // As llama.cpp: a prompt that leaves no room in the context is an error; a reply
        // that fills it stops there.
        if prompt.len() >= self.ctx {
            bail!(
                "the prompt is {} tokens, but the context holds {} (-c/--ctx-size): no room to generate",
                prompt.len(),
                self.ctx
            );
        }
        let room = self.ctx - prompt.len();
        let req = GenerateRequest { max_tokens: self.req.max_tokens.min(room), ..self.req.clone() };
        let mut dec = self.tok.stream_decoder(true);
        let mut out = std::io::stdout().lock();
        let mut reply = String::new();
        let t0 = Instant::now();
        let mut first: Option<f64> = None;
        let mut err = None;
        let eos = &self.eos_ids;
        let spec_before = self.session.speculation_stats();
        // A bar on stderr (a terminal only) while a long prompt is prefilled, gone with the
        // first token; only when the part not reused runs in pieces.
        let bar: std::cell::OnceCell<crate::progress::PrefillBar> = std::cell::OnceCell::new();
        let mut report = |done: usize, total: usize| match bar.get() {
            Some(b) => b.show(done as u64, total as u64),
            None if frognano_engine::runs_in_pieces(total - done) => {
                let _ = bar.set(crate::progress::PrefillBar::new(total as u64, done as u64));
            }
            None => {}
        };
        let g = self.session.generate_with_progress(&prompt, &req, None, Some(&mut report), |c| {
            if let (None, Some(b)) = (first, bar.get()) {
                b.clear();
            }
            first.get_or_insert_with(|| t0.elapsed().as_secs_f64());
            if eos.contains(&c.id) {
                return ControlFlow::Continue(());
            }
            match dec.step(c.id) {
                Ok(Some(piece)) => {
                    reply.push_str(&piece);
                    // A closed stdout (`| head`) ends generation quietly.
                    if write!(out, "{piece}").and_then(|_| out.flush()).is_err() {
                        return ControlFlow::Break(());
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    err = Some(e);
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        });
        // Also when no token came (an error, `-n 0`).
        if let Some(b) = bar.get() {
            b.clear();
        }
        let g = g?;
        if let Some(e) = err {
            return Err(e.into());
        }
        if let Ok(Some(rest)) = dec.finish() {
            reply.push_str(&rest);
            let _ = write!(out, "{rest}");
        }
        let _ = writeln!(out);
        let context_full = g.finish == FinishReason::ContextFull
            || (g.finish == FinishReason::Length && g.tokens.len() == room && room < self.req.max_tokens);
        if context_full {
            eprintln!("[context full: {} tokens (-c/--ctx-size); generation stopped]", self.ctx);
        }
        if self.stats {
            let total = t0.elapsed().as_secs_f64();
            let prefill = first.unwrap_or(total);
            // The decode rate counts the tokens after the first over the time after it: none
            // with fewer than two tokens (`-n 0` or `1` printed 10⁹ tok/s).
            let decode_rate = match g.tokens.len() {
                0 | 1 => "-".to_string(),
                n => format!("{:.1}", (n - 1) as f64 / (total - prefill).max(1e-9)),
            };
            let threads = crate::threads::pool_size();
            // On a GPU the device does the model's work; the CPU threads only drive it.
            let place = match frognano_model::load::accelerator() {
                Some(acc) => format!("{} | ", acc.name()),
                None => String::new(),
            };
            eprintln!(
                "prefill {} tokens ({} reused) {:.1} tok/s | decode {} tokens {decode_rate} tok/s | finish {:?} | {place}{threads} thread{}",
                g.prompt_tokens - g.cached_tokens,
                g.cached_tokens,
                (g.prompt_tokens - g.cached_tokens) as f64 / prefill,
                g.tokens.len(),
                g.finish,
                if threads == 1 { "" } else { "s" }
            );
            let spec = self.session.speculation_stats();
            let (drafted, accepted) = (spec.drafted - spec_before.drafted, spec.accepted - spec_before.accepted);
            if self.session.speculative() != SpeculativeMode::None {
                let (rows, reruns) =
                    (spec.returned_to_row - spec_before.returned_to_row, spec.recomputed - spec_before.recomputed);
                let rollbacks = if rows + reruns > 0 {
                    format!("; state rolled back {rows}× to a kept row, {reruns}× from a snapshot with a rerun")
                } else {
                    String::new()
                };
                eprintln!(
                    "speculative {}: {} verifications, {accepted}/{drafted} drafted tokens accepted{rollbacks}",
                    self.session.speculative(),
                    spec.verifications - spec_before.verifications,
                );
            }
        }
        Ok(reply)
    }
}

/// Generates and streams text.
pub fn run(a: RunArgs) -> anyhow::Result<()> {
    // The prompt file is read before the model loads, so a wrong path fails at once.
    let prompt = match (&a.prompt, &a.file) {
        (_, Some(path)) => read_prompt_file(path)?,
        (Some(p), None) => p.clone(),
        (None, None) => "Write a haiku about frogs.".to_string(),
    };
    let mut t = Talker::load(a.model.clone(), &a.gen)?;
    if a.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(Message::system(s.clone()));
        }
        msgs.push(Message::user(prompt));
        let text = t.render(&msgs, a.think)?;
        t.reply(&text, true)?;
    } else {
        t.reply(&prompt, false)?;
    }
    Ok(())
}

/// An interactive conversation on the terminal; each turn only prefills what is new.
pub fn chat(a: ChatArgs) -> anyhow::Result<()> {
    let system = match (&a.system, &a.file) {
        (_, Some(path)) => Some(read_prompt_file(path)?),
        (s, None) => s.clone(),
    };
    let mut t = Talker::load(a.model.clone(), &a.gen)?;
    t.template.as_ref().context("this model has no chat template; use `frognano run` instead")?;
    let mut msgs = Vec::new();
    if let Some(s) = system {
        msgs.push(Message::system(s));
    }
    // The saved state belongs to these weights, quantized this way (the KV type is checked
    // from the cache layout).
    let model_id = format!(
        "{}|quant={:?}",
        frognano_engine::persist::model_identity(&frognano_model::load::resolve_path(&model_spec(a.model.clone())?)?),
        a.gen.quant
    );
    if let Some(path) = a.session.as_ref().filter(|p| p.exists()) {
        let (session, extra) = frognano_engine::persist::load_session_file(path, &model_id, t.session.model())
            .with_context(|| format!("--session {}: cannot resume (the file is left as it is)", path.display()))?;
        let saved: Vec<Message> = serde_json::from_value(extra.get("messages").cloned().unwrap_or_default())
            .with_context(|| {
                format!("--session {}: the field messages is not a list of chat messages", path.display())
            })?;
        if !msgs.is_empty() && saved.first().is_some_and(|m| m.role == "system") {
            eprintln!("note: the resumed conversation keeps its own system message; --system/-f is ignored");
        }
        eprintln!(
            "resumed {} messages from {} ({} tokens of state, nothing prefilled again)",
            saved.len(),
            path.display(),
            session.tokens().len()
        );
        msgs = saved;
        let mode = t.session.speculative();
        t.session = session;
        t.session.set_speculative(mode);
    }
    eprintln!("chatting; an empty line or end of input quits");
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.read_line(&mut line)? == 0 || line.trim().is_empty() {
            return Ok(());
        }
        msgs.push(Message::user(line.trim_end().to_string()));
        let text = t.render(&msgs, a.think)?;
        let reply = t.reply(&text, true)?;
        msgs.push(Message::assistant(reply));
        if let Some(path) = &a.session {
            let extra = serde_json::json!({ "messages": msgs });
            frognano_engine::persist::save_session_file(path, &model_id, &t.session, extra)
                .with_context(|| format!("--session {}: saving the conversation", path.display()))?;
        }
    }
}

/// Prints `{"logits": [[...], ...]}` for every input position.
pub fn logits(a: LogitsArgs) -> anyhow::Result<()> {
    let mut lm =
        frognano_model::load::load_quantized(&a.model, a.quant).with_context(|| format!("loading {}", a.model))?;
    apply_kv_cache(&mut *lm.model, a.kv_cache)?;
    let mut cache = lm.model.new_cache();
    let logits = lm.model.forward(&a.ids, &mut cache, true)?;
    let vocab = lm.model.vocab_size();
    let rows: Vec<&[f32]> = logits.chunks_exact(vocab).collect();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    // The weights' size in memory beside the logits, so that what `--quant` saves is visible.
    serde_json::to_writer(&mut out, &serde_json::json!({ "logits": rows, "weight_bytes": lm.weight_bytes }))?;
    writeln!(out)?;
    Ok(())
}
