//! Qwen3.5 numerics against transformers 5.23 (fixtures from scripts/make_qwen35_fixtures.py).

use std::path::PathBuf;

use frognano_model::qwen35::Qwen35;
use frognano_model::tensor::{to_f32_vec, DType};
use frognano_model::CausalLm;
use safetensors::SafeTensors;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

struct Golden(Vec<u8>);

impl Golden {
    fn open(name: &str) -> Self {
        Golden(std::fs::read(fixture(&format!("{name}.golden.safetensors"))).unwrap())
    }
    fn f32(&self, key: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        let t = st.tensor(key).unwrap();
        assert_eq!(t.dtype(), safetensors::Dtype::F32);
        to_f32_vec(t.data(), DType::F32)
    }
    fn ids(&self, key: &str) -> Vec<u32> {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        let t = st.tensor(key).unwrap();
        t.data().chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32).collect()
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32
}

fn check_f32_fixture(name: &str) {
    let m = Qwen35::from_safetensors(&fixture(name)).unwrap();
    let g = Golden::open(name);
    let ids = g.ids("input_ids");
    let vocab = m.vocab_size();

    // One uncached pass over 150 tokens (chunked delta rule, 3 chunks with a ragged tail).
    let mut cache = m.new_cache();
    let full = m.forward(&ids, &mut cache, true).unwrap();
    // transformers' f32 run is itself some distance from the exact (f64) result; with logits
    // near 50 that noise exceeds 1e-4. We must be within 1e-4 or within that noise, and at
    // least as close to the exact result as transformers is.
    let tf = g.f32("logits_full");
    let exact = g.f32("logits_full_f64");
    let tf_noise = max_abs_diff(&tf, &exact);
    let d = max_abs_diff(&full, &tf);
    let tol = f32_tolerance(name);
    assert!(d < tol, "{name}: full logits differ from transformers by {d} (tolerance {tol})");
    let ours_err = max_abs_diff(&full, &exact);
    assert!(ours_err <= tf_noise.max(1e-4), "{name}: {ours_err} from f64, transformers is {tf_noise}");

    // Greedy decode with the cache (recurrent delta rule) reproduces tokens and logits.
    let want_tokens = g.ids("greedy_tokens");
    let want_decode = g.f32("logits_decode");
    let mut next = argmax(&full[(ids.len() - 1) * vocab..]);
    for (step, want) in want_tokens.iter().enumerate() {
        assert_eq!(next, *want, "{name}: greedy token {step}");
        let lg = m.forward(&[next], &mut cache, false).unwrap();
        let d = max_abs_diff(&lg, &want_decode[step * vocab..(step + 1) * vocab]);
        assert!(d < tol, "{name}: decode step {step} logits differ by {d}");
        next = argmax(&lg);
    }
    assert_eq!(cache.len(), ids.len() + want_tokens.len());

    // A prefill split in two (100 + 50) equals one pass.
    let mut c2 = m.new_cache();
    let mut split = m.forward(&ids[..100], &mut c2, true).unwrap();
    split.extend(m.forward(&ids[100..], &mut c2, true).unwrap());
    let d = max_abs_diff(&split, &g.f32("logits_split_prefill"));
    assert!(d < tol, "{name}: split prefill differs by {d}");
    let d = max_abs_diff(&split, &full);
    assert!(d < tol, "{name}: split prefill differs from one pass by {d}");
}

#[test]
fn tiny_f32_matches_transformers_full_cached_split_and_greedy() {
    check_f32_fixture("qwen35-tiny");
}

#[test]
fn wrapper_untied_irregular_layers_dk_ne_dv_sharded_matches_transformers() {
    check_f32_fixture("qwen35-wrapper-untied");
}

/// f32 noise of transformers on a fixture (its distance to the f64 run), floored at 1e-4.
fn f32_tolerance(name: &str) -> f32 {
    let g = Golden::open(name);
    1e-4f32.max(1.5 * max_abs_diff(&g.f32("logits_full"), &g.f32("logits_full_f64")))
}

#[test]
fn cached_prefill_plus_decode_equals_uncached_run() {
    let tol = f32_tolerance("qwen35-tiny");
    let m = Qwen35::from_safetensors(&fixture("qwen35-tiny")).unwrap();
    let ids: Vec<u32> = (0..70).map(|i| (i * 37 % 1000 + 3) as u32).collect();
    let mut c = m.new_cache();
    let all = m.forward(&ids, &mut c, true).unwrap();
    let mut c2 = m.new_cache();
    m.forward(&ids[..60], &mut c2, false).unwrap();
    let vocab = m.vocab_size();
    for (i, &id) in ids[60..].iter().enumerate() {
        let lg = m.forward(&[id], &mut c2, false).unwrap();
        let d = max_abs_diff(&lg, &all[(60 + i) * vocab..(61 + i) * vocab]);
        assert!(d < tol, "position {}: {d} (tolerance {tol})", 60 + i);
    }
}

/// bf16 runs differ by rounding order; compare each position's logits relative to that
/// row's largest logit (bf16 keeps 8 bits of mantissa), and the argmax.
fn check_bf16(model: &Qwen35, golden: &[f32], ids: &[u32]) {
    let mut c = model.new_cache();
    let lg = model.forward(ids, &mut c, true).unwrap();
    let vocab = model.vocab_size();
    let (mut within, mut agree, mut worst) = (0, 0, 0f32);
    for t in 0..ids.len() {
        let (a, b) = (&lg[t * vocab..(t + 1) * vocab], &golden[t * vocab..(t + 1) * vocab]);
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let rel = max_abs_diff(a, b) / scale;
        worst = worst.max(rel);
        within += (rel <= 2e-2) as usize;
        agree += (argmax(a) == argmax(b)) as usize;
    }
    let n = ids.len();
    assert!(within * 100 >= 95 * n, "only {within}/{n} positions within 2e-2 relative");
    assert!(worst < 5e-2, "worst position is {worst} relative");
    assert!(agree * 100 >= 95 * n, "top-1 agrees on only {agree}/{n} positions");
}

#[test]
fn bf16_checkpoint_matches_transformers_bf16_run() {
    let m = Qwen35::from_safetensors(&fixture("qwen35-tiny-bf16")).unwrap();
    assert_eq!(m.embed_tokens.dtype, DType::BF16);
    let g = Golden::open("qwen35-tiny-bf16");
    check_bf16(&m, &g.f32("logits_full_bf16"), &g.ids("input_ids"));
}

/// The MTP head (`fixtures/qwen35-tiny/mtp.safetensors`) against the torch reference of
/// scripts/make_qwen35_fixtures.py: the main model's last hidden states, the head over every
/// (next token, hidden state) pair of a 150-token prompt, and a chain of 4 greedy drafts,
/// each feeding the head its own output at the next position.
#[test]
fn mtp_head_matches_the_torch_reference() {
    use frognano_model::MtpHead;
    let m = Qwen35::from_safetensors(&fixture("qwen35-tiny")).unwrap();
    assert!(m.mtp.is_some(), "the fixture's mtp.* shard was not loaded");
    let head: &dyn MtpHead = m.mtp().unwrap();
    let g = Golden::open("qwen35-tiny.mtp");
    let ids = g.ids("mtp_input_ids");
    let (t, d, vocab) = (ids.len(), m.cfg.hidden_size, m.vocab_size());
    // Relative to the values' scale: hidden states are O(1), logits O(10).
    let close = |what: &str, ours: &[f32], want: &[f32]| {
        let scale = want.iter().fold(1.0f32, |a, v| a.max(v.abs()));
        let diff = max_abs_diff(ours, want);
        assert!(diff <= 2e-5 * scale, "{what}: differs from the reference by {diff} (values up to {scale})");
    };

    // The main model's prompt pass with its hidden states: the logits `forward` gives, to
    // the bit, and the reference's hidden states after the final norm.
    let mut cache = m.new_cache();
    let (last, hidden) = head.forward_with_hidden(&ids, &mut cache, false).unwrap();
    let mut plain_cache = m.new_cache();
    let plain = m.forward(&ids, &mut plain_cache, false).unwrap();
    assert!(last.iter().zip(&plain).all(|(a, b)| a.to_bits() == b.to_bits()), "prompt logits differ from forward's");
    close("main hidden states", &hidden, &g.f32("main_hidden"));
    let next = argmax(&last);
    assert_eq!(next, g.ids("next_token")[0]);

    // The head over all 150 pairs (x[i+1], h[i]), the last pairing the next token.
    let mut pairs: Vec<u32> = ids[1..].to_vec();
    pairs.push(next);
    let mut mcache = head.new_mtp_cache();
    let (logits, out) = head.mtp_forward(&pairs, &hidden, &mut mcache, true).unwrap();
    close("MTP logits", &logits, &g.f32("mtp_logits"));
    close("MTP hidden states", &out, &g.f32("mtp_hidden"));
    assert_eq!(mcache.len(), t);

    // Four chained drafts.
    let want_drafts = g.ids("draft_tokens");
    let want_logits = g.f32("draft_logits");
    let (mut lg, mut o) = (logits[(t - 1) * vocab..].to_vec(), out[(t - 1) * d..].to_vec());
    for (i, &want) in want_drafts.iter().enumerate() {
        close(&format!("draft {i} logits"), &lg, &want_logits[i * vocab..(i + 1) * vocab]);
        let id = argmax(&lg);
        assert_eq!(id, want, "draft {i}");
        (lg, o) = head.mtp_forward(&[id], &o, &mut mcache, false).unwrap();
    }

    // Bad input is refused with the reason, before the cache moves.
    let err = head.mtp_forward(&[1, 2], &o, &mut mcache, false).unwrap_err().to_string();
    assert!(err.contains("hidden values for 2 tokens"), "{err}");
    let err = head.mtp_forward(&[vocab as u32], &o, &mut mcache, false).unwrap_err().to_string();
    assert!(err.contains("out of vocabulary"), "{err}");
    let err = head.mtp_forward(&[1], &o, &mut m.new_cache(), false).unwrap_err().to_string();
    assert!(err.contains("not an MTP head's cache"), "{err}");
}

/// A checkpoint with a stray `mtp.*` tensor (the wrapper fixture's lone `mtp.fc.weight`) has
/// no MTP head; the tiny fixture without its head shard has none either.
#[test]
fn mtp_head_is_loaded_only_when_present() {
    let w = Qwen35::from_safetensors(&fixture("qwen35-wrapper-untied")).unwrap();
    assert!(w.mtp.is_none() && w.mtp().is_none());
    let m = Qwen35::from_safetensors(&fixture("qwen35-tiny")).unwrap();
    assert!(m.mtp().is_some());
}

/// Decode on an f16 KV cache (what GGUF models and `--kv-cache f16` use) takes the one-token
/// kernel in llama.cpp's order (query and weights rounded to f16); its greedy tokens and logits
/// stay with transformers' f32 run, to f16's precision.
#[test]
fn f16_cache_decode_stays_with_transformers() {
    let name = "qwen35-tiny";
    let mut m = Qwen35::from_safetensors(&fixture(name)).unwrap();
    m.set_kv_type(frognano_model::KvType::F16).unwrap();
    let g = Golden::open(name);
    let ids = g.ids("input_ids");
    let vocab = m.vocab_size();
    let mut cache = m.new_cache();
    let full = m.forward(&ids, &mut cache, true).unwrap();
    let want_decode = g.f32("logits_decode");
    let scale = want_decode.iter().fold(0.0f32, |a, &b| a.max(b.abs()));
    let mut next = argmax(&full[(ids.len() - 1) * vocab..]);
    let mut worst = 0.0f32;
    for (step, want) in g.ids("greedy_tokens").iter().enumerate() {
        assert_eq!(next, *want, "greedy token {step} on an f16 cache");
        let lg = m.forward(&[next], &mut cache, false).unwrap();
        worst = worst.max(max_abs_diff(&lg, &want_decode[step * vocab..(step + 1) * vocab]));
        next = argmax(&lg);
    }
    eprintln!("f16 cache: decode logits within {worst} of transformers' f32 (largest logit {scale})");
    assert!(worst <= 1e-4 * scale, "decode logits {worst} off transformers' f32 run (largest logit {scale})");
}
