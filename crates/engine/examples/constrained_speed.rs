//! Decode speed with and without a JSON-schema constraint, for `bench/constrained_speed.sh`:
//! one chat prompt, one seed, alternating runs; prints one JSON line per run and a summary
//! line with the medians, the mean mask time per token (on the helper thread) and the mean
//! time the sampler waited for a mask (what the constraint adds to the critical path).
//!
//! `cargo run --release -p frognano-engine --example constrained_speed -- MODEL [REPEATS]`
//!
//! The schema asks for a list of exactly 6 people (bounded strings and integers), so a
//! constrained reply is long enough to time (~150 tokens); the unconstrained run generates the
//! same number of tokens with the end-of-turn ids ignored.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use frognano_engine::{ChatParts, ConstraintFactory, GenerateRequest, Grammar, SamplingParams, Session};
use frognano_protocol::Message;
use serde_json::json;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() >= 2, "usage: constrained_speed MODEL [REPEATS]");
    let repeats: usize = args.get(2).map(|r| r.parse()).transpose()?.unwrap_or(5);
    let (model, chat) = ChatParts::split(frognano_model::load(&args[1])?)?;
    let t = Instant::now();
    let factory = ConstraintFactory::new(Arc::clone(&chat.tokenizer), model.vocab_size(), &chat.eos_ids)?;
    let factory_ms = t.elapsed().as_secs_f64() * 1e3;
    let person = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 16},
        "color": {"enum": ["red", "green", "blue"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "color", "age"], "additionalProperties": false});
    let schema = json!({"type": "array", "items": person, "minItems": 6, "maxItems": 6});
    let t = Instant::now();
    let grammar = factory.compile(&Grammar::JsonSchema(schema))?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let messages = [Message::user("List six people as JSON: each with a name, a favourite color and an age.")];
    let text = chat.template.render(&messages, None, true, None).map_err(|e| anyhow::anyhow!("{e}"))?;
    let prompt = chat.tokenizer.encode_with(&text, false)?;
    let mut session = Session::new(model);
    let request = |max_tokens: usize, stop_ids: Vec<u32>| GenerateRequest {
        sampling: SamplingParams { temperature: 1.0, seed: Some(1), ..Default::default() },
        max_tokens,
        stop_ids,
        top_logprobs: 0,
        checkpoint: None,
    };
    // Tokens/s of the decode: from the first token (sampled after the prefill) to the last.
    let decode = |session: &mut Session, req: &GenerateRequest, constrained: bool| -> anyhow::Result<_> {
        session.reset(); // the same prefill every run
        let mut first = None;
        let constraint = constrained.then(|| grammar.start());
        let g = session.generate_constrained(&prompt, req, constraint, |_| {
            first.get_or_insert_with(Instant::now);
            ControlFlow::Continue(())
        })?;
        let secs = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
        Ok((g.tokens.len(), (g.tokens.len() - 1) as f64 / secs, g.constraint))
    };
    // The constrained reply's length sets the unconstrained run's.
    let (n, _, _) = decode(&mut session, &request(400, chat.eos_ids.clone()), true)?;
    let (mut with, mut without, mut mask_us, mut wait_us) = (vec![], vec![], vec![], vec![]);
    for run in 0..repeats {
        let (tokens, tok_s, stats) = decode(&mut session, &request(400, chat.eos_ids.clone()), true)?;
        let stats = stats.expect("constrained run has stats");
        let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / stats.masks.max(1) as f64;
        println!(
            "{}",
            json!({"run": run, "constrained": true, "tokens": tokens, "decode_tok_s": tok_s,
                   "mask_us_per_token": per(stats.mask_time), "wait_us_per_token": per(stats.wait_time),
                   "completed": stats.completed})
        );
        with.push(tok_s);
        mask_us.push(per(stats.mask_time));
        wait_us.push(per(stats.wait_time));
        let (tokens, tok_s, _) = decode(&mut session, &request(n, vec![]), false)?;
        println!("{}", json!({"run": run, "constrained": false, "tokens": tokens, "decode_tok_s": tok_s}));
        without.push(tok_s);
    }
    let (w, wo) = (median(with), median(without));
    println!(
        "{}",
        json!({"summary": true, "model": args[1], "repeats": repeats, "reply_tokens": n,
               "factory_ms": factory_ms, "compile_ms": compile_ms,
               "median_decode_tok_s_constrained": w, "median_decode_tok_s_free": wo,
               "constrained_over_free": w / wo,
               "median_mask_us_per_token": median(mask_us), "median_wait_us_per_token": median(wait_us)})
    );
    Ok(())
}
