//! Decode speed with and without speculative decoding (docs/speculative.md), for
//! bench/speculative.sh: a chat prompt, greedy decoding under each `--speculative` mode given,
//! alternating runs, and per run one JSON line with the decode tokens/s, the drafting counts
//! and whether the text equals the first mode's.
//!
//! Workloads: `edit` (the model rewrites a 60-line Python file with one change, as an agent's
//! Write does) and `free` (an essay that copies nothing from its prompt).
//!
//! Without modes it measures the verification itself: the time of one
//! `forward_stepwise` over 1..=TOKENS rows after the prompt, relative to one row (a decode
//! step), median of REPEATS.
//!
//! `cargo run --release -p frognano-engine --example speculative_speed -- MODEL WORKLOAD TOKENS REPEATS [MODE...]`

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use frognano_engine::{GenerateRequest, SamplingParams, Session, SpeculativeMode};
use frognano_protocol::Message;

/// A 60-line file for the edit workload.
fn source_file() -> String {
    let mut s = String::from("\"\"\"Inventory bookkeeping for a small shop.\"\"\"\n\nimport json\nfrom dataclasses import dataclass, field\n\n\n");
    s.push_str("@dataclass\nclass Item:\n    name: str\n    price_cents: int\n    quantity: int = 0\n    tags: list[str] = field(default_factory=list)\n\n    def total_cents(self) -> int:\n        return self.price_cents * self.quantity\n\n\n");
    s.push_str("class Inventory:\n    def __init__(self) -> None:\n        self.items: dict[str, Item] = {}\n\n");
    s.push_str("    def add(self, item: Item) -> None:\n        if item.name in self.items:\n            raise ValueError(f\"duplicate item {item.name}\")\n        self.items[item.name] = item\n\n");
    s.push_str("    def remove(self, name: str) -> Item:\n        return self.items.pop(name)\n\n");
    s.push_str("    def restock(self, name: str, amount: int) -> None:\n        if amount <= 0:\n            raise ValueError(\"amount must be positive\")\n        self.items[name].quantity += amount\n\n");
    s.push_str("    def sell(self, name: str, amount: int) -> int:\n        item = self.items[name]\n        if amount > item.quantity:\n            raise ValueError(f\"only {item.quantity} left\")\n        item.quantity -= amount\n        return amount * item.price_cents\n\n");
    s.push_str(
        "    def value_cents(self) -> int:\n        return sum(i.total_cents() for i in self.items.values())\n\n",
    );
    s.push_str("    def tagged(self, tag: str) -> list[Item]:\n        return [i for i in self.items.values() if tag in i.tags]\n\n");
    s.push_str("    def to_json(self) -> str:\n        rows = [vars(i) for i in self.items.values()]\n        return json.dumps(rows, indent=2)\n\n\n");
    s.push_str("def load(text: str) -> Inventory:\n    inv = Inventory()\n    for row in json.loads(text):\n        inv.add(Item(**row))\n    return inv\n");
    s
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() >= 5, "usage: speculative_speed MODEL edit|free TOKENS REPEATS [MODE...]");
    let (spec, workload, tokens, repeats) = (&args[1], args[2].as_str(), args[3].parse::<usize>()?, args[4].parse()?);
    let modes: Vec<SpeculativeMode> =
        args[5..].iter().map(|m| m.parse()).collect::<Result<_, String>>().map_err(anyhow::Error::msg)?;
    let lm = frognano_model::load::load(spec)?;
    let tok = lm.tokenizer.ok_or_else(|| anyhow::anyhow!("{spec}: no tokenizer"))?;
    let template = lm.chat_template.ok_or_else(|| anyhow::anyhow!("{spec}: no chat template"))?;
    let user = match workload {
        "edit" => format!(
            "Rename the method `tagged` to `with_tag` in this file and change nothing else. Reply with the whole \
             new file in one ```python block and nothing after it.\n\n```python\n{}```",
            source_file()
        ),
        "free" => "Write a long essay about the history of bread-making across the world, from the first \
                   flatbreads to modern industrial bakeries."
            .to_string(),
        other => anyhow::bail!("workload {other:?}: expected edit or free"),
    };
    let text = template.render(&[Message::user(user)], None, true, None)?;
    let prompt = tok.encode_with(&text, false)?;
    let model: Arc<dyn frognano_model::CausalLm> = Arc::from(lm.model);
    if modes.is_empty() {
        return verify_cost(&*model, &prompt, tokens.max(1), repeats);
    }
    let req = GenerateRequest {
        sampling: SamplingParams::greedy(),
        max_tokens: tokens,
        stop_ids: lm.eos_ids.clone(),
        top_logprobs: 0,
        checkpoint: None,
    };
    let mut reference: Option<Vec<u32>> = None;
    for run in 0..repeats {
        for &mode in &modes {
            // A fresh session per run: every run prefills the prompt and decodes from the
            // same state.
            let mut session = Session::new(Arc::clone(&model));
            session.set_speculative(mode);
            let mut first = None;
            let g = session.generate(&prompt, &req, |_| {
                first.get_or_insert_with(Instant::now);
                ControlFlow::Continue(())
            })?;
            let decode_s = first.map(|f| f.elapsed().as_secs_f64()).unwrap_or(0.0);
            let ids: Vec<u32> = g.tokens.iter().map(|t| t.id).collect();
            let same = reference.get_or_insert_with(|| ids.clone()) == &ids;
            let st = session.speculation_stats();
            println!(
                "{}",
                serde_json::json!({
                    "run": run,
                    "mode": mode.to_string(),
                    "workload": workload,
                    "prompt_tokens": prompt.len(),
                    "tokens": ids.len(),
                    "decode_tok_s": ids.len().saturating_sub(1) as f64 / decode_s.max(1e-9),
                    "verifications": st.verifications,
                    "drafted": st.drafted,
                    "accepted": st.accepted,
                    "recomputed": st.recomputed,
                    "same_text_as_first_mode": same,
                })
            );
            if run == 0 && mode == modes[0] {
                eprintln!("--- reply ({mode}) ---\n{}\n---", tok.decode(&ids, true)?);
            }
        }
    }
    Ok(())
}

/// Prints, for each row count 1..=`max_rows`, the median time of a stepwise forward over that
/// many tokens after `prompt`, and its ratio to one row.
fn verify_cost(
    model: &dyn frognano_model::CausalLm,
    prompt: &[u32],
    max_rows: usize,
    repeats: usize,
) -> anyhow::Result<()> {
    let mut base = model.new_cache();
    model.forward(prompt, &mut base, false)?;
    let ids: Vec<u32> = prompt.iter().copied().cycle().take(max_rows).collect();
    let mut one = 0.0;
    for rows in 1..=max_rows {
        let mut times = Vec::new();
        for _ in 0..repeats.max(1) {
            let mut cache = base.clone();
            let t = Instant::now();
            model.forward_stepwise(&ids[..rows], &mut cache)?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        if rows == 1 {
            one = median;
        }
        println!("{}", serde_json::json!({"rows": rows, "ms": median * 1e3, "relative_to_one_row": median / one}));
    }
    Ok(())
}
