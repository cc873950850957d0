//! Sessions on the tiny Qwen3.5 fixture: reuse gives the same numbers as a fresh run.

use std::sync::Arc;

use frognano_engine::{FinishReason, GenerateRequest, Session};
use frognano_model::qwen35::Qwen35;
use frognano_model::CausalLm;

fn model() -> Arc<dyn CausalLm> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen35-tiny");
    Arc::new(Qwen35::from_safetensors(&dir).unwrap())
}

fn greedy(n: usize) -> GenerateRequest {
    GenerateRequest::greedy(n)
}

fn ids(n: usize, salt: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 131 + salt * 17) % 1000 + 3) as u32).collect()
}

#[test]
fn continuing_a_conversation_runs_only_new_tokens_and_matches_a_fresh_run() {
    let m = model();
    let mut s = Session::new(m.clone());
    let turn1 = ids(40, 1);
    let g1 = s.generate(&turn1, &greedy(6), |_| std::ops::ControlFlow::Continue(())).unwrap();
    assert_eq!(g1.cached_tokens, 0);
    assert_eq!(g1.finish, FinishReason::Length);
    // Next turn = previous prompt + what the model said + new user text.
    let mut turn2 = turn1.clone();
    turn2.extend(g1.tokens.iter().map(|t| t.id));
    turn2.extend(ids(10, 2));
    let g2 = s.generate(&turn2, &greedy(5), |_| std::ops::ControlFlow::Continue(())).unwrap();
    // Everything but the last generated token (never fed back) was reused.
    assert_eq!(g2.cached_tokens, 40 + 5);
    let mut fresh = Session::new(m);
    let g2_fresh = fresh.generate(&turn2, &greedy(5), |_| std::ops::ControlFlow::Continue(())).unwrap();
    assert_eq!(g2_fresh.cached_tokens, 0);
    let a: Vec<u32> = g2.tokens.iter().map(|t| t.id).collect();
    let b: Vec<u32> = g2_fresh.tokens.iter().map(|t| t.id).collect();
    assert_eq!(a, b);
    for (x, y) in g2.tokens.iter().zip(&g2_fresh.tokens) {
        assert!((x.logprob - y.logprob).abs() < 1e-3, "{} vs {}", x.logprob, y.logprob);
    }
}

#[test]
fn a_diverging_prompt_returns_to_the_last_snapshot_of_a_hybrid_model() {
    let m = model();
    let mut s = Session::new(m.clone());
    let base = ids(30, 3);
    s.generate(&base, &greedy(4), |_| std::ops::ControlFlow::Continue(())).unwrap();
    // Same first 30 tokens, different continuation than what was generated.
    let mut other = base.clone();
    other.extend(ids(7, 9));
    let g = s.generate(&other, &greedy(3), |_| std::ops::ControlFlow::Continue(())).unwrap();
    assert_eq!(g.cached_tokens, 30, "the snapshot at the end of the first prompt is reused");
    let mut fresh = Session::new(m);
    let gf = fresh.generate(&other, &greedy(3), |_| std::ops::ControlFlow::Continue(())).unwrap();
    let ids_of = |g: &frognano_engine::Generation| g.tokens.iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids_of(&g), ids_of(&gf));
}

#[test]
fn stop_ids_end_generation_and_callbacks_can_cancel() {
    let m = model();
    let mut s = Session::new(m);
    let prompt = ids(20, 5);
    let first = s.generate(&prompt, &greedy(3), |_| std::ops::ControlFlow::Continue(())).unwrap();
    let stop = first.tokens[1].id;
    let req = GenerateRequest { stop_ids: vec![stop], ..greedy(10) };
    let g = s.generate(&prompt, &req, |_| std::ops::ControlFlow::Continue(())).unwrap();
    assert_eq!(g.finish, FinishReason::Stop);
    assert_eq!(g.tokens.last().unwrap().id, stop);
    assert_eq!(g.cached_tokens, 20, "the same prompt again is served from the session");
    let mut n = 0;
    let g = s
        .generate(&prompt, &greedy(10), |_| {
            n += 1;
            if n == 2 {
                std::ops::ControlFlow::Break(())
            } else {
                std::ops::ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(g.finish, FinishReason::Cancelled);
    assert_eq!(g.tokens.len(), 2);
}

#[test]
fn bad_requests_are_errors_not_panics() {
    let m = model();
    let mut s = Session::new(m);
    assert!(s.generate(&[], &greedy(1), |_| std::ops::ControlFlow::Continue(())).is_err());
    let e = s.generate(&[5000], &greedy(1), |_| std::ops::ControlFlow::Continue(())).unwrap_err();
    assert!(e.to_string().contains("out of vocabulary"), "{e}");
    let long = vec![5u32; 5000];
    let e = s.generate(&long, &greedy(1), |_| std::ops::ControlFlow::Continue(())).unwrap_err();
    assert!(e.to_string().contains("maximum context length"), "{e}");
    // The session still works afterwards.
    assert!(s.generate(&[5, 6], &greedy(1), |_| std::ops::ControlFlow::Continue(())).is_ok());
}

#[test]
fn batched_decode_steps_give_each_sequence_the_tokens_it_gets_alone() {
    use frognano_engine::decode_step;
    let m = model();
    let prompts = [ids(5, 1), ids(33, 2), ids(12, 3)];
    let lengths = [7, 3, 5]; // generations end at different steps; the batch shrinks
    let mut alone = Vec::new();
    for (p, &n) in prompts.iter().zip(&lengths) {
        let g = Session::new(m.clone()).generate(p, &greedy(n), |_| std::ops::ControlFlow::Continue(())).unwrap();
        alone.push(g.tokens.iter().map(|t| t.id).collect::<Vec<_>>());
    }
    let mut sessions: Vec<Session> = prompts.iter().map(|_| Session::new(m.clone())).collect();
    let mut decodings = Vec::new();
    let mut streamed: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    for (i, (s, p)) in sessions.iter_mut().zip(&prompts).enumerate() {
        let (d, first) = s.start(p, &greedy(lengths[i])).unwrap();
        streamed[i].push(first.unwrap().id);
        decodings.push(d);
    }
    let mut steps = 0;
    while decodings.iter().any(|d| !d.is_finished()) {
        let mut batch: Vec<_> = sessions.iter_mut().zip(decodings.iter_mut()).collect();
        for (i, t) in decode_step(&mut batch).unwrap().into_iter().enumerate() {
            if let Some(t) = t {
                streamed[i].push(t.id);
            }
        }
        steps += 1;
    }
    assert_eq!(steps, 6, "the longest generation needs 6 steps after its first token");
    for (i, d) in decodings.into_iter().enumerate() {
        let g = d.into_generation();
        assert_eq!(g.finish, FinishReason::Length);
        let batched: Vec<u32> = g.tokens.iter().map(|t| t.id).collect();
        assert_eq!(batched, alone[i], "sequence {i}");
        assert_eq!(streamed[i], alone[i], "sequence {i}: tokens returned by the steps");
        assert_eq!(sessions[i].tokens().len(), prompts[i].len() + lengths[i] - 1);
    }
}

#[test]
fn a_cancelled_generation_leaves_the_batch_and_the_others_continue() {
    use frognano_engine::decode_step;
    let m = model();
    let (mut a, mut b) = (Session::new(m.clone()), Session::new(m.clone()));
    let (mut da, _) = a.start(&ids(8, 4), &greedy(10)).unwrap();
    let (mut db, _) = b.start(&ids(9, 5), &greedy(10)).unwrap();
    decode_step(&mut [(&mut a, &mut da), (&mut b, &mut db)]).unwrap();
    da.cancel();
    let out = decode_step(&mut [(&mut a, &mut da), (&mut b, &mut db)]).unwrap();
    assert!(out[0].is_none() && out[1].is_some());
    assert_eq!(da.finish(), Some(FinishReason::Cancelled));
    assert_eq!((da.tokens().len(), db.tokens().len()), (2, 3));
    assert_eq!(a.tokens().len(), 8 + 1, "a cancelled sequence is not run again");
}

/// A long prompt prefilled in reported pieces (`generate_with_progress`, what `frognano run`
/// draws its prefill bar from) gives the reply of one whole prefill, and the report climbs
/// from the reused tokens to the whole prompt; a short new part runs in one piece.
#[test]
fn a_long_prefill_reports_its_progress_and_gives_the_reply_of_one_piece() {
    use frognano_engine::PROGRESS_PIECE;
    use std::ops::ControlFlow::Continue;
    let m = model();
    let n = 2 * PROGRESS_PIECE + 276;
    let prompt = ids(n, 3);
    let whole = Session::new(m.clone()).generate(&prompt, &greedy(4), |_| Continue(())).unwrap();
    let mut s = Session::new(m.clone());
    let mut seen = Vec::new();
    let mut report = |done: usize, total: usize| seen.push((done, total));
    let g = s.generate_with_progress(&prompt, &greedy(4), None, Some(&mut report), |_| Continue(())).unwrap();
    assert_eq!(seen, [(0, n), (PROGRESS_PIECE, n), (2 * PROGRESS_PIECE, n), (n, n)]);
    assert_eq!((g.prompt_tokens, g.cached_tokens), (n, 0));
    let pieces: Vec<(u32, f32)> = g.tokens.iter().map(|t| (t.id, t.logprob)).collect();
    let one: Vec<(u32, f32)> = whole.tokens.iter().map(|t| (t.id, t.logprob)).collect();
    assert_eq!(pieces, one, "pieces against one prefill");
    // The next turn: everything said so far is reused, the short new part is one piece.
    let mut next = prompt.clone();
    next.extend(g.tokens.iter().map(|t| t.id));
    next.extend(ids(30, 4));
    let mut seen = Vec::new();
    let mut report = |done: usize, total: usize| seen.push((done, total));
    let g2 = s.generate_with_progress(&next, &greedy(2), None, Some(&mut report), |_| Continue(())).unwrap();
    let reused = n + 4 - 1;
    assert_eq!(g2.cached_tokens, reused);
    assert_eq!(seen, [(reused, next.len()), (next.len(), next.len())]);
}
