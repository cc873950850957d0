//! The cost side of MTP drafting on the Qwen3.5-4B shape (docs/speculative.md, "MTP
//! drafting"), for bench/mtp_verify.sh.
//!
//! Builds a model with random weights in the real 4B text shapes plus an MTP head (one
//! gated full-attention layer, fc [2560, 5120]) in memory, every matrix quantized to QUANT as
//! it is drawn (the tied embedding, which is also the output head, included), prefills a
//! PROMPT-token context, then times (median of REPEATS, each from a copy of the same state):
//!
//! * a decode step (one token, `forward_batch`): the unit (each timed step starts from a copy
//!   of the prefilled cache; the copy's own median is taken out);
//! * the verification of k = 1..4 drafts: `forward_with_hidden` over k + 1 rows, stepwise (what
//!   `Session::speculative_step` runs), i.e. the cost with every draft accepted (forced
//!   acceptance: random weights accept nothing);
//! * the rollback after a rejection on this hybrid model, both ways: a snapshot of the
//!   recurrent state (taken before every verification), its restore, and the recompute of the
//!   j + 1 kept rows; or the states kept row by row during the verification (one row's copy,
//!   into buffers reused from step to step), a rejection then being a swap;
//! * the MTP head: feeding it r = 1..5 rows of verified hidden states (the first draft of a
//!   step) and one more chained draft (one row).
//!
//! and prints one JSON line per measurement, then the expected speed-up of MTP drafting with
//! k drafts as a function of the per-draft acceptance rate a (each draft accepted with
//! probability a while the ones before it were), from those costs:
//!
//! ```text
//! E[tokens] = Σ_{j=0..k} a^j
//! E[cost]   = D(k) + V(k+1) + S + P(reject) · (R + V(j+1 | reject))
//! ```
//!
//! in decode steps (D: the head's drafts, V(n): verification of n rows, S: snapshot, R:
//! restore), and with row states `E[cost] = D(k) + V(k+1) + k · C` (C: one row's copy).
//!
//! `cargo run --release -p frognano-model --example mtp_verify -- [QUANT] [PROMPT] [REPEATS] [SCALE]`
//! (defaults q4_k 512 5 full; SCALE `tiny` builds a 4-layer, 512-wide model to try the
//! example quickly).

use std::path::{Path, PathBuf};
use std::time::Instant;

use frognano_model::config::{LayerType, Qwen35Config};
use frognano_model::kernels::Act;
use frognano_model::quant::QuantType;
use frognano_model::qwen35::Qwen35;
use frognano_model::tensor::{DType, Matrix};
use frognano_model::weights::{Role, TensorSource, WeightSpec};
use frognano_model::{CausalLm, MtpHead};

/// Random weights for every name a Qwen3.5 map asks for, matrices quantized as they are made.
struct RandomWeights {
    quant: Option<QuantType>,
    origin: PathBuf,
    made: std::cell::Cell<usize>,
    total: usize,
}

/// xorshift64*: fast, and random enough for weights whose values do not matter.
fn fill(v: &mut [f32], seed: u64, scale: f32) {
    v.chunks_mut(1 << 16).enumerate().for_each(|(c, chunk)| {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (c as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
        for e in chunk {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
            // Sum of two uniforms in [-1, 1): a triangular bump, close enough to N(0, 0.41).
            let u1 = (r >> 40) as f32 / (1u64 << 24) as f32;
            let u2 = ((r >> 16) & 0xFF_FFFF) as f32 / (1u64 << 24) as f32;
            *e = (u1 + u2 - 1.0) * scale;
        }
    });
}

impl TensorSource for RandomWeights {
    fn origin(&self) -> &Path {
        &self.origin
    }

    fn contains(&self, name: &str) -> bool {
        // Tied head, one MTP layer sharing the model's embedding.
        name != frognano_model::weights::LM_HEAD
            && !name.starts_with("mtp.layers.1.")
            && name != "mtp.embed_tokens.weight"
    }

    fn matrix(&self, w: &WeightSpec) -> frognano_model::Result<Matrix> {
        let (rows, cols) = (w.shape[0], w.shape[1..].iter().product::<usize>());
        let mut v = vec![0.0f32; rows * cols];
        let n = self.made.get();
        fill(&mut v, n as u64 + 1, 0.02 * 2.45);
        self.made.set(n + 1);
        if n.is_multiple_of(16) {
            eprintln!("weights: {n}/{} matrices", self.total);
        }
        let m = Matrix::from_f32(rows, cols, v);
        Ok(match self.quant {
            Some(q) => m.quantized(q),
            None => m,
        })
    }

    fn stored_f32(&self, w: &WeightSpec) -> frognano_model::Result<Vec<f32>> {
        let n: usize = w.shape.iter().product();
        let mut v = vec![0.0f32; n];
        match w.role {
            // Zero-centred norms stored as 0 (scale 1), plain ones 1.
            Role::ZeroCentredNorm => {}
            Role::Norm => v.fill(1.0),
            Role::LogDecay => {
                fill(&mut v, 7, 1.0);
                v.iter_mut().for_each(|e| *e = (8.5 + 7.5 * e.clamp(-1.0, 1.0)).ln());
            }
            _ if w.name.ends_with("dt_bias") => v.fill(1.0),
            _ => fill(&mut v, 11, 0.5),
        }
        Ok(v)
    }
}

fn config(tiny: bool) -> Qwen35Config {
    let (d, ffn, layers, vocab) = if tiny { (512, 1536, 4, 32_000) } else { (2560, 9216, 32, 248_320) };
    let (heads, kv, dh, lk, lv, dk) = if tiny { (4, 2, 128, 4, 8, 64) } else { (16, 4, 256, 16, 32, 128) };
    Qwen35Config {
        vocab_size: vocab,
        hidden_size: d,
        intermediate_size: ffn,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv,
        head_dim: dh,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: true,
        linear_conv_kernel_dim: 4,
        linear_key_head_dim: dk,
        linear_value_head_dim: dk,
        linear_num_key_heads: lk,
        linear_num_value_heads: lv,
        layer_types: (0..layers).map(|i| if i % 4 == 3 { LayerType::Full } else { LayerType::Linear }).collect(),
        rope_theta: 1e7,
        partial_rotary_factor: 0.25,
        max_position_embeddings: 262_144,
        eos_token_ids: vec![],
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let quant = args.get(1).map_or("q4_k", String::as_str);
    let prompt_len: usize = args.get(2).map_or(Ok(512), |s| s.parse())?;
    let repeats: usize = args.get(3).map_or(Ok(5), |s| s.parse())?;
    let tiny = args.get(4).is_some_and(|s| s == "tiny");
    let q = match quant {
        "f32" => None,
        "q8_0" => Some(QuantType::Q8_0),
        "q4_k" => Some(QuantType::Q4_K),
        other => anyhow::bail!("QUANT {other:?}: expected q4_k, q8_0 or f32"),
    };
    let cfg = config(tiny);
    let total = 2 + cfg.num_hidden_layers * 7 + 7;
    let src = RandomWeights { quant: q, origin: PathBuf::from("<random 4B shape>"), made: 0.into(), total };
    let t0 = Instant::now();
    let mut m = Qwen35::load(cfg, &src, Some(Act::F32))?;
    m.pack_for_matmul();
    let head: &dyn MtpHead = m.mtp().ok_or_else(|| anyhow::anyhow!("no MTP head was built"))?;
    let dtype = match m.embed_tokens.dtype {
        DType::Quant(q) => format!("{q:?}"),
        other => format!("{other:?}"),
    };
    eprintln!("built in {:.0} s: {} bytes of weights ({dtype})", t0.elapsed().as_secs_f64(), m.weight_bytes());
    println!(
        "{}",
        serde_json::json!({"model": if tiny { "tiny" } else { "qwen35-4b-shape" }, "weights": dtype,
            "weight_bytes": m.weight_bytes(), "prompt": prompt_len, "repeats": repeats,
            "threads": std::env::var("RAYON_NUM_THREADS").ok(),
            "cpus": std::thread::available_parallelism().map_or(0, |n| n.get())})
    );
    let vocab = m.vocab_size() as u32;
    let prompt: Vec<u32> = (0..prompt_len as u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let mut base = m.new_cache();
    let (_, hidden) = head.forward_with_hidden(&prompt, &mut base, false)?;
    let d = head.hidden_size();
    let mut mtp_base = head.new_mtp_cache();
    head.mtp_forward(&prompt[1..], &hidden[..(prompt_len - 1) * d], &mut mtp_base, false)?;
    let last_hidden = hidden[(prompt_len - 1) * d..].to_vec();
    let ids: Vec<u32> = (0..5u32).map(|i| (i * 104_729 + 5) % vocab).collect();
    drop(hidden);

    let snap = base.snapshot();
    let mut moved = base.clone();
    m.forward_stepwise(&ids[..3], &mut moved)?;
    let hid: Vec<f32> = last_hidden.iter().copied().cycle().take(5 * d).collect();
    // Every measurement once per round, rounds repeated: load that drifts during the run
    // (this machine is shared) falls on all of them alike. Each starts from a copy of the
    // same state; copying a cache is timed too and taken out where it is part of a step.
    type Step<'a> = (&'static str, usize, Box<dyn FnMut() -> anyhow::Result<()> + 'a>);
    let mut steps: Vec<Step<'_>> = Vec::new();
    steps.push((
        "decode step",
        1,
        Box::new(|| {
            let mut c = base.clone();
            m.forward_batch(&mut [(ids[0], &mut c)])?;
            Ok(())
        }),
    ));
    for rows in 1..=5 {
        let (base, ids) = (&base, &ids);
        steps.push((
            "verify (stepwise, hidden states)",
            rows,
            Box::new(move || {
                let mut c = base.clone();
                head.forward_with_hidden(&ids[..rows], &mut c, true)?;
                Ok(())
            }),
        ));
    }
    steps.push((
        "cache copy",
        0,
        Box::new(|| {
            std::hint::black_box(base.clone());
            Ok(())
        }),
    ));
    steps.push((
        "snapshot",
        0,
        Box::new(|| {
            std::hint::black_box(base.snapshot());
            Ok(())
        }),
    ));
    steps.push((
        "restore (with a cache copy)",
        0,
        Box::new(|| {
            let mut c = moved.clone();
            c.restore(&snap).map_err(anyhow::Error::msg)
        }),
    ));
    let mut warm = base.clone();
    steps.push((
        "keep one row's states (buffers reused)",
        0,
        Box::new(move || {
            warm.keep_row_states(1);
            warm.keep_state_after_row(0);
            Ok(())
        }),
    ));
    for rows in 1..=5 {
        let (mtp_base, ids, hid) = (&mtp_base, &ids, &hid);
        steps.push((
            "mtp head, first draft",
            rows,
            Box::new(move || {
                let mut c = mtp_base.clone();
                head.mtp_forward(&ids[..rows], &hid[..rows * d], &mut c, false)?;
                Ok(())
            }),
        ));
    }
    steps.push((
        "mtp head, chained draft",
        1,
        Box::new(|| {
            let mut c = mtp_base.clone();
            head.mtp_forward(&ids[..1], &last_hidden, &mut c, false)?;
            Ok(())
        }),
    ));
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); steps.len()];
    for round in 0..repeats.max(1) {
        for (i, (_, _, f)) in steps.iter_mut().enumerate() {
            let t = Instant::now();
            f()?;
            times[i].push(t.elapsed().as_secs_f64());
        }
        eprintln!("round {}/{repeats}", round + 1);
    }
    let mut med: Vec<f64> = times.iter().map(|v| median(v.clone())).collect();
    // The decode step and the verifications start from a copy of the prefilled cache, which a
    // session's step does not make: take the copy's median out of theirs.
    let copy = med[6];
    for t in &mut med[..=5] {
        *t = (*t - copy).max(0.0);
    }
    let decode = med[0];
    for ((what, rows, _), (t, all)) in steps.iter().zip(med.iter().zip(&times)) {
        println!(
            "{}",
            serde_json::json!({"what": what, "rows": rows, "ms": t * 1e3, "decode_steps": t / decode,
                "all_ms_with_copy": all.iter().map(|x| (x * 1e4).round() / 10.0).collect::<Vec<_>>()})
        );
    }
    let verify: Vec<f64> = std::iter::once(0.0).chain(med[1..=5].iter().copied()).collect();
    let snapshot = med[7];
    let restore = (med[8] - copy).max(0.0);
    let keep_row = med[9];
    let feed: Vec<f64> = std::iter::once(0.0).chain(med[10..=14].iter().copied()).collect();
    let chained = med[15];

    // Expected speed-up per k and acceptance rate, in decode-step units.
    let u = |s: f64| s / decode;
    for k in 1..=4usize {
        let mut row = serde_json::Map::new();
        row.insert("k".into(), k.into());
        row.insert("verify_all_accepted_decode_steps".into(), u(verify[k + 1]).into());
        for a in [0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0f64] {
            // P(j accepted) = a^j (1 − a) for j < k, a^k for j = k.
            let p = |j: usize| if j < k { a.powi(j as i32) * (1.0 - a) } else { a.powi(k as i32) };
            let tokens: f64 = (0..=k).map(|j| p(j) * (j + 1) as f64).sum();
            // The head's first draft reads the previous step's kept rows (≈ this step's).
            let draft: f64 = (0..=k).map(|j| p(j) * u(feed[(j + 1).min(5)])).sum::<f64>() + (k - 1) as f64 * u(chained);
            let rollback: f64 = (0..k).map(|j| p(j) * (u(restore) + u(verify[j + 1]))).sum();
            let cost = draft + u(verify[k + 1]) + u(snapshot) + rollback;
            row.insert(format!("speedup_at_{a}"), (tokens / cost).into());
            // Keeping the states of the first k rows in the verification instead: k copies,
            // and a rejection is a swap.
            let cost = draft + u(verify[k + 1]) + k as f64 * u(keep_row);
            row.insert(format!("row_states_speedup_at_{a}"), (tokens / cost).into());
        }
        println!("{}", serde_json::Value::Object(row));
    }
    Ok(())
}
