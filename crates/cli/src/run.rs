//! `frognano run`, `frognano chat` and `frognano logits`.

use std::io::Write;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use frognano_engine::{GenerateRequest, SamplingParams, Session};
use frognano_protocol::Message;

use frognano_model::load::DEMO_MODEL;
use frognano_model::quant::QuantType;

/// Sampling, length and loading flags shared by `run` and `chat`.
#[derive(Args, Clone)]
pub struct GenFlags {
    /// Most tokens to generate (per reply).
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.7)]
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
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Seed for reproducible sampling.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print timing (prefill and decode tokens/s) to stderr.
    #[arg(long)]
    pub stats: bool,
    /// Quantize the weights on load (q8_0 or q4_k); for f32/bf16 checkpoints and GGUF files.
    #[arg(long, value_parser = parse_quant)]
    pub quant: Option<QuantType>,
}

/// Arguments of `frognano run`.
#[derive(Args)]
pub struct RunArgs {
    /// Checkpoint folder, .gguf file or hub id in the local cache [default: the demo model].
    pub model: Option<String>,
    /// The prompt.
    #[arg(short, long, default_value = "Write a haiku about frogs.")]
    pub prompt: String,
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
    #[arg(long)]
    pub system: Option<String>,
    /// Ask a thinking model to think first (`enable_thinking`).
    #[arg(long)]
    pub think: bool,
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
    stats: bool,
}

impl Talker {
    fn load(model: Option<String>, gen: &GenFlags) -> anyhow::Result<Self> {
        let spec = model_spec(model)?;
        let lm = frognano_model::load::load_quantized(&spec, gen.quant).with_context(|| format!("loading {spec}"))?;
        lm.tokenizer()?;
        let sampling = SamplingParams {
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
        let req = GenerateRequest { sampling, max_tokens: gen.max_tokens, stop_ids: eos_ids.clone(), top_logprobs: 0 };
        Ok(Talker {
            session: Session::new(Arc::from(model)),
            tok: tokenizer.expect("checked above"),
            template: chat_template,
            eos_ids,
            req,
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
        let mut dec = self.tok.stream_decoder(true);
        let mut out = std::io::stdout().lock();
        let mut reply = String::new();
        let t0 = Instant::now();
        let mut first: Option<f64> = None;
        let mut err = None;
        let eos = &self.eos_ids;
        let g = self.session.generate(&prompt, &self.req, |c| {
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
        })?;
        if let Some(e) = err {
            return Err(e.into());
        }
        if let Ok(Some(rest)) = dec.finish() {
            reply.push_str(&rest);
            let _ = write!(out, "{rest}");
        }
        let _ = writeln!(out);
        if self.stats {
            let total = t0.elapsed().as_secs_f64();
            let prefill = first.unwrap_or(total);
            let n = g.tokens.len().saturating_sub(1).max(1);
            eprintln!(
                "prefill {} tokens ({} reused) {:.1} tok/s | decode {} tokens {:.1} tok/s | finish {:?}",
                g.prompt_tokens - g.cached_tokens,
                g.cached_tokens,
                (g.prompt_tokens - g.cached_tokens) as f64 / prefill,
                g.tokens.len(),
                n as f64 / (total - prefill).max(1e-9),
                g.finish
            );
        }
        Ok(reply)
    }
}

/// Generates and streams text.
pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let mut t = Talker::load(a.model.clone(), &a.gen)?;
    if a.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(Message::system(s.clone()));
        }
        msgs.push(Message::user(a.prompt.clone()));
        let text = t.render(&msgs, a.think)?;
        t.reply(&text, true)?;
    } else {
        t.reply(&a.prompt, false)?;
    }
    Ok(())
}

/// An interactive conversation on the terminal; each turn only prefills what is new.
pub fn chat(a: ChatArgs) -> anyhow::Result<()> {
    let mut t = Talker::load(a.model.clone(), &a.gen)?;
    t.template.as_ref().context("this model has no chat template; use `frognano run` instead")?;
    let mut msgs = Vec::new();
    if let Some(s) = &a.system {
        msgs.push(Message::system(s.clone()));
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
    }
}

/// Prints `{"logits": [[...], ...]}` for every input position.
pub fn logits(a: LogitsArgs) -> anyhow::Result<()> {
    let lm = frognano_model::load::load_quantized(&a.model, a.quant).with_context(|| format!("loading {}", a.model))?;
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
