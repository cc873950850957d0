//! `CausalLm::forward_batch` (one decode step for several sequences, weights read once) gives
//! the same logits and leaves the same caches as running each sequence on its own.

use std::path::PathBuf;

use frognano_model::{load, CausalLm};

fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Sequences with prompts of different lengths (one empty) decode `steps` tokens greedily,
/// once all together through `forward_batch` and once each through `forward`; every step's
/// logits must agree within `tol` and pick the same token, and the caches must end equal.
fn batch_matches_single(model: &dyn CausalLm, prompts: &[Vec<u32>], first: &[u32], steps: usize, tol: f32) {
    let mut batched = prefilled(model, prompts);
    let mut single = prefilled(model, prompts);
    let mut next_b = first.to_vec();
    let mut next_s = first.to_vec();
    for step in 0..steps {
        let mut batch: Vec<(u32, &mut _)> = next_b.iter().copied().zip(batched.iter_mut()).collect();
        let out_b = model.forward_batch(&mut batch).unwrap();
        assert_eq!(out_b.len(), prompts.len());
        for (i, (id, cache)) in next_s.iter_mut().zip(single.iter_mut()).enumerate() {
            let out_s = model.forward(&[*id], cache, false).unwrap();
            let d = max_abs_diff(&out_b[i], &out_s);
            assert!(d <= tol, "step {step}, sequence {i}: batched logits differ by {d} (tolerance {tol})");
            assert_eq!(argmax(&out_b[i]), argmax(&out_s), "step {step}, sequence {i}: different greedy token");
            *id = argmax(&out_s) as u32;
            next_b[i] = argmax(&out_b[i]) as u32;
        }
    }
    for (i, (b, s)) in batched.iter().zip(&single).enumerate() {
        assert_eq!(b.pos, s.pos, "sequence {i}: position");
        assert_eq!(b.pos, prompts[i].len() + steps);
    }
}

/// A cache per prompt, each holding its prompt (an empty prompt: an empty cache).
fn prefilled(model: &dyn CausalLm, prompts: &[Vec<u32>]) -> Vec<frognano_model::Cache> {
    prompts
        .iter()
        .map(|p| {
            let mut c = model.new_cache();
            if !p.is_empty() {
                model.forward(p, &mut c, false).unwrap();
            }
            c
        })
        .collect()
}

fn prompts(lens: &[usize]) -> Vec<Vec<u32>> {
    lens.iter().enumerate().map(|(s, &n)| (0..n).map(|i| ((i * 131 + s * 71) % 900 + 5) as u32).collect()).collect()
}

#[test]
fn qwen35_batched_decode_matches_per_sequence_decode() {
    let m = load(repo("fixtures/qwen35-tiny").to_str().unwrap()).unwrap().model;
    batch_matches_single(m.as_ref(), &prompts(&[0, 1, 9, 70]), &[11, 12, 13, 14], 6, 1e-5);
}

#[test]
fn qwen35_gguf_batched_decode_matches_per_sequence_decode() {
    let m = load(repo("fixtures/qwen35-tiny-bf16.gguf").to_str().unwrap()).unwrap().model;
    batch_matches_single(m.as_ref(), &prompts(&[3, 20, 1]), &[7, 8, 9], 4, 1e-4);
}

#[test]
fn an_out_of_vocabulary_id_fails_the_batch_and_changes_no_cache() {
    let m = load(repo("fixtures/qwen35-tiny").to_str().unwrap()).unwrap().model;
    let (mut a, mut b) = (m.new_cache(), m.new_cache());
    m.forward(&[5, 6], &mut a, false).unwrap();
    let bad = m.vocab_size() as u32;
    let err = m.forward_batch(&mut [(3, &mut a), (bad, &mut b)]).unwrap_err();
    assert!(err.to_string().contains("out of vocabulary"), "{err}");
    assert_eq!((a.pos, b.pos), (2, 0));
    assert!(m.forward_batch(&mut []).unwrap().is_empty());
}

#[test]
fn smollm2_batched_decode_matches_per_sequence_decode() {
    let p = repo("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !p.exists() {
        if std::env::var_os("FROGNANO_REQUIRE_FIXTURES").is_some() {
            panic!("{} is missing and FROGNANO_REQUIRE_FIXTURES is set", p.display());
        }
        frognano_model::test_support::report_skip(
            &p.display().to_string(),
            "smollm2_batched_decode_matches_per_sequence_decode (run scripts/fetch-demo-model.sh)",
        );
        return;
    }
    let m = load(p.to_str().unwrap()).unwrap().model;
    // Logits of SmolLM2 are O(10); a batched matmul may sum in another order than the
    // single-row kernel, so agreement is to rounding, with the same greedy tokens.
    batch_matches_single(m.as_ref(), &prompts(&[1, 12, 40, 5]), &[28, 1001, 330, 7], 5, 2e-3);
}

/// `forward_batch_stepwise_and_prompt` (a decode step, with drafts or without, and a prompt
/// piece in one pass) against the calls apart, on fresh caches of the same states: the decode
/// rows' logits, the prompt's last logits and every cache afterwards must be the same bits,
/// through the prompt's second piece too (a piece after a prefix) and with a prompt piece of
/// two tokens (the smallest a server prefills). `drafts`: the sequences' entries hold 1, 3
/// and 2 ids (a verification step), else one each (a plain decode step, whose bits are
/// `forward_batch`'s).
fn fused_matches_apart(model: &dyn CausalLm, name: &str, drafts: bool) {
    let running = prompts(&[5, 17, 1]);
    let prompt: Vec<u32> = (0..40).map(|i| ((i * 37 + 3) % 700 + 2) as u32).collect();
    let (mut fused, mut apart) = (prefilled(model, &running), prefilled(model, &running));
    let (mut fused_prompt, mut apart_prompt) = (model.new_cache(), model.new_cache());
    let mut next = vec![9u32, 10, 11];
    for (step, piece) in [&prompt[..16], &prompt[16..38], &prompt[38..]].into_iter().enumerate() {
        let entries: Vec<Vec<u32>> = next
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                let n = if drafts { [1, 3, 2][i] } else { 1 };
                (0..n).map(|k| id + 7 * k as u32).collect()
            })
            .collect();
        let mut batch: Vec<(&[u32], &mut _)> = entries.iter().map(Vec::as_slice).zip(fused.iter_mut()).collect();
        let (rows, last) = model.forward_batch_stepwise_and_prompt(&mut batch, (piece, &mut fused_prompt)).unwrap();
        let rows_apart = if drafts {
            let mut batch: Vec<(&[u32], &mut _)> = entries.iter().map(Vec::as_slice).zip(apart.iter_mut()).collect();
            model.forward_batch_stepwise(&mut batch).unwrap()
        } else {
            let mut batch: Vec<(u32, &mut _)> = next.iter().copied().zip(apart.iter_mut()).collect();
            model.forward_batch(&mut batch).unwrap()
        };
        let last_apart = model.forward(piece, &mut apart_prompt, false).unwrap();
        assert_eq!(rows.len(), running.len(), "{name}: logits for each decoding sequence");
        for (i, (a, b)) in rows.iter().zip(&rows_apart).enumerate() {
            assert_eq!(a.len(), entries[i].len() * model.vocab_size(), "{name}: a row of logits per id");
            assert!(a == b, "{name}, step {step}: sequence {i}'s logits differ by {}", max_abs_diff(a, b));
        }
        assert!(
            last == last_apart,
            "{name}, step {step}: the prompt's logits differ by {}",
            max_abs_diff(&last, &last_apart)
        );
        next = rows.iter().map(|r| argmax(&r[r.len() - model.vocab_size()..]) as u32).collect();
    }
    // The caches hold the same state: one more decode step on each gives the same bits.
    let after = |caches: &mut Vec<frognano_model::Cache>, prompt_cache: &mut frognano_model::Cache| {
        let mut batch: Vec<(u32, &mut _)> =
            next.iter().copied().zip(caches.iter_mut()).chain([(5, prompt_cache)]).collect();
        model.forward_batch(&mut batch).unwrap()
    };
    assert_eq!(fused_prompt.pos, prompt.len(), "{name}: the prompt's cache advanced by the whole prompt");
    assert!(after(&mut fused, &mut fused_prompt) == after(&mut apart, &mut apart_prompt), "{name}: the caches differ");
}

#[test]
fn a_decode_step_and_a_prompt_piece_in_one_pass_give_the_bits_of_the_two_apart() {
    for name in [
        "fixtures/qwen35-tiny",
        "fixtures/qwen35-tiny.gguf",
        "fixtures/arch/llama3-tiny-q8_0.gguf",
        "fixtures/arch/qwen3-tiny-q8_0.gguf",
    ] {
        let m = load(repo(name).to_str().unwrap()).unwrap().model;
        fused_matches_apart(m.as_ref(), name, false);
        fused_matches_apart(m.as_ref(), &format!("{name}, with drafts"), true);
    }
    let smollm2 = repo("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if smollm2.exists() {
        let m = load(smollm2.to_str().unwrap()).unwrap().model;
        fused_matches_apart(m.as_ref(), "SmolLM2 Q4_1", false);
        fused_matches_apart(m.as_ref(), "SmolLM2 Q4_1, with drafts", true);
    } else if std::env::var_os("FROGNANO_REQUIRE_FIXTURES").is_some() {
        panic!("{} is missing and FROGNANO_REQUIRE_FIXTURES is set", smollm2.display());
    }
}

#[test]
fn a_bad_id_in_the_prompt_piece_fails_the_pass_and_changes_no_cache() {
    let m = load(repo("fixtures/qwen35-tiny").to_str().unwrap()).unwrap().model;
    let (mut a, mut p) = (m.new_cache(), m.new_cache());
    m.forward(&[5, 6], &mut a, false).unwrap();
    let bad = m.vocab_size() as u32;
    let err = m.forward_batch_stepwise_and_prompt(&mut [(&[3], &mut a)], (&[4, bad], &mut p)).unwrap_err();
    assert!(err.to_string().contains(&format!("token id {bad} is out of vocabulary")), "{err}");
    let err = m.forward_batch_stepwise_and_prompt(&mut [(&[3], &mut a)], (&[], &mut p)).unwrap_err();
    assert!(err.to_string().contains("no input tokens"), "{err}");
    let err = m.forward_batch_stepwise_and_prompt(&mut [(&[], &mut a)], (&[4, 5], &mut p)).unwrap_err();
    assert!(err.to_string().contains("no input tokens"), "{err}");
    assert_eq!((a.pos, p.pos), (2, 0));
}

/// The MTP head's pass (`forward_batch_with_hidden_and_prompt`: the batch's segments with
/// their hidden states, and a prompt piece with every row's hidden state) gives the bits of
/// `forward_batch_with_hidden` and `forward_with_hidden` apart, so sessions drafting with
/// the head can share a decode step with a prompt's chunk.
#[test]
fn the_mtp_heads_pass_with_a_prompt_piece_gives_the_bits_of_the_calls_apart() {
    let m = load(repo("fixtures/qwen35-tiny").to_str().unwrap()).unwrap().model;
    let head = m.mtp().expect("the fixture has an MTP head");
    let running = prompts(&[5, 17]);
    let (mut fused, mut apart) = (prefilled(m.as_ref(), &running), prefilled(m.as_ref(), &running));
    let (mut fused_prompt, mut apart_prompt) = (m.new_cache(), m.new_cache());
    let prompt: Vec<u32> = (0..30).map(|i| ((i * 53 + 1) % 600 + 4) as u32).collect();
    let entries: [&[u32]; 2] = [&[9, 16], &[10]];
    for piece in [&prompt[..12], &prompt[12..]] {
        let mut batch: Vec<(&[u32], &mut _)> = entries.iter().copied().zip(fused.iter_mut()).collect();
        let (rows, (last, hidden)) =
            head.forward_batch_with_hidden_and_prompt(&mut batch, (piece, &mut fused_prompt)).unwrap();
        let mut batch: Vec<(&[u32], &mut _)> = entries.iter().copied().zip(apart.iter_mut()).collect();
        let rows_apart = head.forward_batch_with_hidden(&mut batch).unwrap();
        let (last_apart, hidden_apart) = head.forward_with_hidden(piece, &mut apart_prompt, false).unwrap();
        assert!(rows == rows_apart, "the segments' logits or hidden states differ");
        assert!(last == last_apart, "the prompt's logits differ by {}", max_abs_diff(&last, &last_apart));
        assert_eq!(hidden.len(), piece.len() * head.hidden_size(), "a hidden state per prompt row");
        assert!(
            hidden == hidden_apart,
            "the prompt's hidden states differ by {}",
            max_abs_diff(&hidden, &hidden_apart)
        );
    }
}
