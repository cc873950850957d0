//! Speculative decoding is exact: the verification forward gives each drafted position the
//! bits a decode step gives, greedy output with prompt-lookup drafts is plain decoding's token
//! for token, and the state after a rejected draft is the state plain decoding reaches
//! (SmolLM2, Q4_1 GGUF; the tiny hybrid Qwen3.5 fixture, whose recurrent state is restored
//! from the states kept row by row in the verification, or from a snapshot and recomputed).

use std::ops::ControlFlow;
use std::sync::Arc;

use frognano_engine::{GenerateRequest, SamplingParams, Session, SpeculationStats, SpeculativeMode};
use frognano_model::qwen35::{Mixer, Qwen35};
use frognano_model::tensor::Matrix;
use frognano_model::{Cache, CausalLm, LayerCache};

fn hybrid() -> Arc<dyn CausalLm> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen35-tiny");
    Arc::new(Qwen35::from_safetensors(&dir).unwrap())
}

fn smollm2() -> Option<Arc<dyn CausalLm>> {
    let path = frognano_testkit::demo_model()?;
    Some(Arc::from(frognano_model::load::load(path.to_str().unwrap()).unwrap().model))
}

/// `texts` as the demo model's tokenizer encodes them (with its start tokens).
fn smollm2_prompts(texts: &[&str]) -> Vec<Vec<u32>> {
    let path = frognano_testkit::demo_model().expect("the demo model");
    let tok = frognano_model::load::load(path.to_str().unwrap()).unwrap().tokenizer.unwrap();
    texts.iter().map(|t| tok.encode_with(t, true).unwrap()).collect()
}

fn greedy(n: usize) -> GenerateRequest {
    GenerateRequest::greedy(n)
}

/// A prompt that repeats itself, so lookup always finds something to draft.
fn repetitive(n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i % 23) * 37 + 5) as u32).collect()
}

/// Every layer's state, as f32 values (keys and values widened), for bit comparison.
fn state_bits(c: &Cache) -> Vec<Vec<u32>> {
    c.layers
        .iter()
        .flat_map(|l| match l {
            LayerCache::Attention { k, v } => [k.to_f32(), v.to_f32()],
            LayerCache::Linear { conv, state } => [conv.clone(), state.clone()],
        })
        .map(|v| v.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// The logits `forward_stepwise` gives for a run of tokens are those of one decode step per
/// token, to the bit; a multi-token `forward` (the prompt path) is not held to that.
fn stepwise_matches_decode_steps(m: Arc<dyn CausalLm>, what: &str) {
    let prompt = repetitive(40);
    let next: Vec<u32> = (0..6).map(|i| 100 + 7 * i).collect();
    let mut base = m.new_cache();
    m.forward(&prompt, &mut base, false).unwrap();
    let mut stepped = base.clone();
    let mut one_by_one = Vec::new();
    for &id in &next {
        one_by_one.extend(m.forward_batch(&mut [(id, &mut stepped)]).unwrap().concat());
    }
    let mut verified = base.clone();
    let all = m.forward_stepwise(&next, &mut verified).unwrap();
    assert_eq!(all.len(), one_by_one.len(), "{what}");
    let differing = all.iter().zip(&one_by_one).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    assert_eq!(differing, 0, "{what}: {differing} of {} logits differ from decode steps", all.len());
    assert_eq!(state_bits(&verified), state_bits(&stepped), "{what}: the states differ");
    assert_eq!(verified.pos, stepped.pos);
}

#[test]
fn stepwise_verification_gives_decode_step_bits_on_smollm2() {
    if let Some(m) = smollm2() {
        stepwise_matches_decode_steps(m, "SmolLM2 Q4_1");
    }
}

#[test]
fn stepwise_verification_gives_decode_step_bits_on_the_hybrid_fixture() {
    stepwise_matches_decode_steps(hybrid(), "qwen35 tiny");
}

/// Greedy generation with drafts (some accepted, some rejected) gives plain decoding's tokens
/// and log-probabilities, and leaves the session in plain decoding's state.
fn greedy_is_unchanged(m: Arc<dyn CausalLm>, prompt: &[u32], n: usize, what: &str) -> SpeculationStats {
    greedy_is_unchanged_with(m, prompt, n, what, SpeculativeMode::Lookup)
}

fn greedy_is_unchanged_with(
    m: Arc<dyn CausalLm>,
    prompt: &[u32],
    n: usize,
    what: &str,
    mode: SpeculativeMode,
) -> SpeculationStats {
    greedy_is_unchanged_rolling_back(m, prompt, n, what, mode, frognano_engine::ROW_STATE_BUDGET)
}

/// [`greedy_is_unchanged_with`] with a row-state budget: the default keeps a hybrid model's
/// states row by row in each verification; 0 rolls back from a snapshot and reruns.
fn greedy_is_unchanged_rolling_back(
    m: Arc<dyn CausalLm>,
    prompt: &[u32],
    n: usize,
    what: &str,
    mode: SpeculativeMode,
    budget: usize,
) -> SpeculationStats {
    let mut plain = Session::new(Arc::clone(&m));
    plain.set_speculative(SpeculativeMode::None);
    let a = plain.generate(prompt, &greedy(n), |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(plain.speculation_stats().verifications, 0);
    let mut spec = Session::new(m);
    spec.set_speculative(mode);
    spec.set_row_state_budget(budget);
    let b = spec.generate(prompt, &greedy(n), |_| ControlFlow::Continue(())).unwrap();
    let stats = spec.speculation_stats();
    let ids = |g: &frognano_engine::Generation| g.tokens.iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(&b), ids(&a), "{what}: speculation changed the greedy tokens ({stats:?})");
    for (x, y) in a.tokens.iter().zip(&b.tokens) {
        assert_eq!(x.logprob.to_bits(), y.logprob.to_bits(), "{what}: log-probabilities differ");
    }
    assert_eq!(b.finish, a.finish);
    assert!(stats.accepted > 0, "{what}: no draft was accepted ({stats:?})");
    assert!(stats.drafted > stats.accepted, "{what}: no draft was rejected ({stats:?})");
    assert!(stats.verifications < n as u64, "{what}: speculation saved no forward ({stats:?})");
    assert_eq!(spec.tokens(), plain.tokens(), "{what}: the sessions hold different tokens");
    assert_eq!(state_bits(spec.cache()), state_bits(plain.cache()), "{what}: states after a rejected draft differ");
    // The session goes on from there as a plain one does.
    let mut more = plain.tokens().to_vec();
    more.push(b.tokens.last().unwrap().id);
    more.extend(repetitive(5));
    let c = plain.generate(&more, &greedy(8), |_| ControlFlow::Continue(())).unwrap();
    let d = spec.generate(&more, &greedy(8), |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(ids(&d), ids(&c), "{what}: the next turn differs");
    stats
}

#[test]
fn greedy_tokens_and_states_are_unchanged_by_lookup_on_smollm2() {
    let Some(m) = smollm2() else { return };
    // Real text that the reply copies: a list the model is asked to repeat.
    let text = "Copy this list exactly.\nalpha, beta, gamma, delta, epsilon, zeta, eta, theta, iota, kappa.\n\
                Copy: alpha, beta, gamma, delta,";
    let prompt = smollm2_prompts(&[text]).remove(0);
    greedy_is_unchanged(m, &prompt, 40, "SmolLM2 Q4_1");
}

#[test]
fn greedy_tokens_and_states_are_unchanged_by_lookup_on_the_hybrid_fixture() {
    let m = hybrid();
    // Every id of the fixture's 1024 once, in a scrambled order, then a repeating run: any
    // token the model writes has been followed by a random one in the prompt, so the first
    // drafts are mostly rejected, and the reply's own repeats give drafts that hold.
    let mut prompt: Vec<u32> = (0..1024u32).map(|i| (i * 389 + 11) % 1024).collect();
    prompt.extend(repetitive(60));
    // Rejected drafts return to the row states kept in the verification ...
    let rows = greedy_is_unchanged(Arc::clone(&m), &prompt, 48, "qwen35 tiny");
    assert!(rows.returned_to_row > 0 && rows.recomputed == 0, "{rows:?}");
    // ... or, without a budget for them, to a snapshot with the kept rows run again.
    let snap = greedy_is_unchanged_rolling_back(m, &prompt, 48, "qwen35 tiny, snapshots", SpeculativeMode::Lookup, 0);
    assert!(snap.recomputed > 0 && snap.returned_to_row == 0, "{snap:?}");
}

/// With sampling the output follows the sampler's distribution either way; with a seed the
/// random stream differs, so what is checked here is that a stop callback and the length
/// limit hold, and that every token's log-probability is the model's.
#[test]
fn sampled_generation_with_drafts_keeps_the_limits_and_the_models_logprobs() {
    sampled_generation_keeps_the_limits_and_the_models_logprobs(hybrid(), SpeculativeMode::Lookup);
    // The repeating MTP head's drafts are often the sampled token at temperature 0.8.
    sampled_generation_keeps_the_limits_and_the_models_logprobs(hybrid_with_repeating_mtp_head(), SpeculativeMode::Mtp);
}

fn sampled_generation_keeps_the_limits_and_the_models_logprobs(m: Arc<dyn CausalLm>, mode: SpeculativeMode) {
    let req = GenerateRequest {
        sampling: SamplingParams { temperature: 0.8, seed: Some(7), ..Default::default() },
        max_tokens: 30,
        stop_ids: vec![],
        top_logprobs: 0,
        checkpoint: None,
    };
    let mut s = Session::new(Arc::clone(&m));
    s.set_speculative(mode);
    let prompt = repetitive(50);
    let g = s.generate(&prompt, &req, |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(g.tokens.len(), 30);
    assert!(s.speculation_stats().verifications > 0, "{mode}: {:?}", s.speculation_stats());
    // Replaying the tokens one decode step at a time gives the recorded log-probabilities.
    let mut cache = m.new_cache();
    let mut logits = m.forward(&prompt, &mut cache, false).unwrap();
    for t in &g.tokens {
        let lp = frognano_engine::sampler::log_softmax(&logits);
        assert_eq!(lp[t.id as usize].to_bits(), t.logprob.to_bits());
        logits = m.forward_batch(&mut [(t.id, &mut cache)]).unwrap().concat();
    }
    // A callback that stops after 5 tokens gets a reply of 5, even when a verification
    // accepted more at once.
    let mut s = Session::new(m);
    s.set_speculative(mode);
    let mut seen = 0;
    let g = s
        .generate(&prompt, &req, |_| {
            seen += 1;
            if seen == 5 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(g.tokens.len(), 5);
}

/// `forward_batch_stepwise` over segments of different lengths gives every segment the bits
/// its own `forward_stepwise` gives, and leaves each cache as that does.
fn batch_stepwise_matches_alone(m: Arc<dyn CausalLm>, what: &str) {
    let prompts = [repetitive(30), (0..25u32).map(|i| (i * 13 + 3) % 200).collect(), repetitive(12)];
    let runs: [Vec<u32>; 3] = [vec![101, 7, 55, 9], vec![42], vec![8, 8, 8, 8, 8, 8, 8]];
    let mut alone = Vec::new();
    let mut batch_caches = Vec::new();
    for (p, ids) in prompts.iter().zip(&runs) {
        let mut c = m.new_cache();
        m.forward(p, &mut c, false).unwrap();
        batch_caches.push(c.clone());
        let logits = m.forward_stepwise(ids, &mut c).unwrap();
        alone.push((logits, c));
    }
    let mut rows: Vec<(&[u32], &mut Cache)> = runs.iter().map(|r| &r[..]).zip(batch_caches.iter_mut()).collect();
    let together = m.forward_batch_stepwise(&mut rows).unwrap();
    for (i, ((logits, cache), batched)) in alone.iter().zip(&together).enumerate() {
        let differing = logits.iter().zip(batched).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(logits.len(), batched.len(), "{what}: segment {i}");
        assert_eq!(differing, 0, "{what}: segment {i}: {differing} logits differ from its own stepwise forward");
        assert_eq!(state_bits(&batch_caches[i]), state_bits(cache), "{what}: segment {i}: states differ");
    }
    // A bad id anywhere changes no cache.
    let before: Vec<_> = batch_caches.iter().map(state_bits).collect();
    let bad = [1u32, m.vocab_size() as u32];
    let (first, rest) = batch_caches.split_at_mut(1);
    let mut rows: Vec<(&[u32], &mut Cache)> = vec![(&runs[0][..], &mut first[0]), (&bad[..], &mut rest[0])];
    assert!(m.forward_batch_stepwise(&mut rows).is_err());
    assert_eq!(
        batch_caches.iter().map(state_bits).collect::<Vec<_>>(),
        before,
        "{what}: a refused batch moved a cache"
    );
}

#[test]
fn batched_stepwise_segments_give_their_own_bits_on_smollm2() {
    if let Some(m) = smollm2() {
        batch_stepwise_matches_alone(m, "SmolLM2 Q4_1");
    }
}

#[test]
fn batched_stepwise_segments_give_their_own_bits_on_the_hybrid_fixture() {
    batch_stepwise_matches_alone(hybrid(), "qwen35 tiny");
}

/// Several generations advanced together by `speculative_decode_step`, some drafting and
/// some not, each give the tokens, log-probabilities and final state of the same generation
/// decoded plainly on its own; drafts were accepted and rejected on the way.
fn batched_speculation_is_plain_decoding(m: Arc<dyn CausalLm>, prompts: &[Vec<u32>], n: usize, what: &str) {
    let modes = [SpeculativeMode::Lookup, SpeculativeMode::None, SpeculativeMode::Auto];
    let sessions = batched_speculation_is_plain_decoding_with(m, prompts, &modes, n, what);
    assert_eq!(sessions[1].speculation_stats().drafted, 0, "{what}: a session set to none drafted");
}

/// [`batched_speculation_is_plain_decoding`] with one mode per prompt (cycled); returns the
/// sessions as they ended.
fn batched_speculation_is_plain_decoding_with(
    m: Arc<dyn CausalLm>,
    prompts: &[Vec<u32>],
    modes: &[SpeculativeMode],
    n: usize,
    what: &str,
) -> Vec<Session> {
    use frognano_engine::speculative_decode_step;
    let mut plain = Vec::new();
    for p in prompts {
        let mut s = Session::new(Arc::clone(&m));
        s.set_speculative(SpeculativeMode::None);
        let g = s.generate(p, &greedy(n), |_| ControlFlow::Continue(())).unwrap();
        plain.push((g, s));
    }
    let mut sessions: Vec<Session> = prompts
        .iter()
        .zip(modes.iter().cycle())
        .map(|(_, &mode)| {
            let mut s = Session::new(Arc::clone(&m));
            s.set_speculative(mode);
            s
        })
        .collect();
    let mut decodings = Vec::new();
    let mut tokens: Vec<Vec<frognano_engine::sampler::TokenChoice>> = Vec::new();
    for (s, p) in sessions.iter_mut().zip(prompts) {
        let (d, first) = s.start(p, &greedy(n)).unwrap();
        decodings.push(d);
        tokens.push(first.into_iter().collect());
    }
    let mut steps = 0;
    while decodings.iter().any(|d| !d.is_finished()) {
        let mut batch: Vec<(&mut Session, &mut frognano_engine::Decoding)> =
            sessions.iter_mut().zip(decodings.iter_mut()).collect();
        for (t, new) in tokens.iter_mut().zip(speculative_decode_step(&mut batch).unwrap()) {
            t.extend(new);
        }
        steps += 1;
    }
    let (mut drafted, mut accepted) = (0, 0);
    for (i, ((g, alone), (s, t))) in plain.iter().zip(sessions.iter().zip(&tokens)).enumerate() {
        let ids = |ts: &[frognano_engine::sampler::TokenChoice]| ts.iter().map(|t| t.id).collect::<Vec<_>>();
        assert_eq!(ids(t), ids(&g.tokens), "{what}: sequence {i}: batched speculation changed the tokens");
        for (x, y) in g.tokens.iter().zip(t) {
            assert_eq!(x.logprob.to_bits(), y.logprob.to_bits(), "{what}: sequence {i}: log-probabilities differ");
        }
        assert_eq!(s.tokens(), alone.tokens(), "{what}: sequence {i}: the sessions hold different tokens");
        assert_eq!(state_bits(s.cache()), state_bits(alone.cache()), "{what}: sequence {i}: states differ");
        drafted += s.speculation_stats().drafted;
        accepted += s.speculation_stats().accepted;
    }
    assert!(accepted > 0 && drafted > accepted, "{what}: drafts {drafted}, accepted {accepted}");
    assert!(steps < n, "{what}: {steps} batched steps for {n} tokens: speculation saved nothing");
    sessions
}

#[test]
fn batched_speculation_gives_plain_decodings_tokens_and_states_on_smollm2() {
    let Some(m) = smollm2() else { return };
    let texts = [
        "Copy this list exactly.\nalpha, beta, gamma, delta, epsilon, zeta, eta, theta, iota, kappa.\nCopy: alpha, beta,",
        "Write a short poem about the sea.",
        "Repeat: one two three four five six seven eight nine ten. Again: one two three four",
    ];
    let prompts = smollm2_prompts(&texts);
    batched_speculation_is_plain_decoding(m, &prompts, 32, "SmolLM2 Q4_1");
}

#[test]
fn batched_speculation_gives_plain_decodings_tokens_and_states_on_the_hybrid_fixture() {
    let mut scrambled: Vec<u32> = (0..1024u32).map(|i| (i * 389 + 11) % 1024).collect();
    scrambled.extend(repetitive(60));
    let prompts = [scrambled, (0..40u32).map(|i| (i * 71 + 5) % 1000).collect(), repetitive(70)];
    batched_speculation_is_plain_decoding(hybrid(), &prompts, 40, "qwen35 tiny");
}

/// The scheduler speculates inside its batched decode steps (`serve`): concurrent greedy
/// requests get plain decoding's tokens, drafted tokens are counted, and the sequences take
/// fewer steps. (Steps of the whole batch are not compared: how the three requests share
/// steps depends on when each arrives, which a loaded machine changes; a CI run saw 47
/// speculative steps against 42 plain ones.)
#[test]
fn the_scheduler_speculates_within_its_batch_and_gives_plain_tokens() {
    use frognano_engine::{Scheduler, SchedulerConfig};
    use std::sync::atomic::Ordering;
    let Some(m) = smollm2() else { return };
    let texts = [
        "Copy this list exactly.\nred, orange, yellow, green, blue, indigo, violet.\nCopy: red, orange,",
        "Repeat: one two three four five six seven eight nine ten. Again: one two three",
        "Say something about cats.",
    ];
    let prompts = smollm2_prompts(&texts);
    let run = |mode: SpeculativeMode| {
        let config = SchedulerConfig { speculative: mode, ..Default::default() };
        let scheduler = Arc::new(Scheduler::start(Arc::clone(&m), config).unwrap());
        let got: Vec<Vec<u32>> = std::thread::scope(|s| {
            let handles: Vec<_> = prompts
                .iter()
                .map(|p| {
                    let (sch, p) = (Arc::clone(&scheduler), p.clone());
                    s.spawn(move || {
                        let g = sch.generate(p, greedy(32), |_| ControlFlow::Continue(())).unwrap();
                        g.tokens.iter().map(|t| t.id).collect::<Vec<u32>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let st = scheduler.stats();
        let counts = (
            st.decoded_rows.load(Ordering::Relaxed),
            st.drafted_tokens.load(Ordering::Relaxed),
            st.accepted_tokens.load(Ordering::Relaxed),
        );
        (got, counts)
    };
    let (plain, (plain_rows, plain_drafted, _)) = run(SpeculativeMode::None);
    let (spec, (spec_rows, drafted, accepted)) = run(SpeculativeMode::Auto);
    assert_eq!(spec, plain, "speculation in the scheduler changed greedy replies");
    assert_eq!(plain_drafted, 0);
    assert!(accepted > 0 && drafted >= accepted, "drafted {drafted}, accepted {accepted}");
    assert!(spec_rows < plain_rows, "sequences took {spec_rows} speculative steps vs {plain_rows} plain ones");
}

/// The tiny fixture with its MTP head's weights set so that the head drafts the token it is
/// given again (fc passes the embedding half through, the layer adds nothing, unit norms; a
/// tied head then ranks a token's own embedding first). The random-weight model repeats
/// tokens in runs, so these drafts hold inside a run and fail where it changes. The head's
/// numerics are checked against the torch reference in crates/model/tests/qwen35.rs; this
/// checks the drafting around it.
fn hybrid_with_repeating_mtp_head() -> Arc<dyn CausalLm> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen35-tiny");
    let mut m = Qwen35::from_safetensors(&dir).unwrap();
    let d = m.cfg.hidden_size;
    let mtp = m.mtp.as_mut().unwrap();
    let mut fc = vec![0.0f32; d * 2 * d];
    for r in 0..d {
        fc[r * 2 * d + r] = 1.0;
    }
    mtp.fc = Matrix::from_f32(d, 2 * d, fc);
    mtp.pre_fc_norm_embedding = vec![1.0; d];
    mtp.norm = vec![1.0; d];
    let Mixer::Attention(attn) = &mut mtp.layer.mixer else { panic!("the MTP layer is full attention") };
    attn.o_proj = Matrix::from_f32(attn.o_proj.rows, attn.o_proj.cols, vec![0.0; attn.o_proj.rows * attn.o_proj.cols]);
    let down = &mtp.layer.mlp.down;
    mtp.layer.mlp.down = Matrix::from_f32(down.rows, down.cols, vec![0.0; down.rows * down.cols]);
    Arc::new(m)
}

/// Greedy generation with the tiny fixture's MTP head drafting 1–4 tokens gives plain
/// decoding's tokens and log-probabilities; after rejected drafts every layer's state (keys,
/// values, conv and recurrent state, restored from a snapshot and recomputed) is bit-equal to
/// plain decoding's. With the fixture's random head nothing is accepted; with the repeating
/// head drafts are both accepted and rejected. `auto` drafts with the head.
#[test]
fn greedy_tokens_and_states_are_unchanged_by_mtp_drafts_on_the_hybrid_fixture() {
    // The model answers this prompt with runs of one token: 260 ×3, 346 ×3, 22 …
    let prompt: Vec<u32> = (0..50).map(|i| (i % 2) * 5 + 3).collect();
    let m = hybrid();
    assert!(m.mtp().is_some(), "the fixture has an MTP head");
    let mut random = Session::new(Arc::clone(&m));
    random.set_speculative(SpeculativeMode::Mtp);
    let plain = {
        let mut s = Session::new(Arc::clone(&m));
        s.set_speculative(SpeculativeMode::None);
        s.generate(&prompt, &greedy(24), |_| ControlFlow::Continue(())).unwrap()
    };
    let g = random.generate(&prompt, &greedy(24), |_| ControlFlow::Continue(())).unwrap();
    assert!(g.tokens.iter().map(|t| t.id).eq(plain.tokens.iter().map(|t| t.id)));
    let st = random.speculation_stats();
    assert!(st.drafted > 0 && st.returned_to_row > 0, "{st:?}");

    let m = hybrid_with_repeating_mtp_head();
    let stats = greedy_is_unchanged_with(Arc::clone(&m), &prompt, 40, "qwen35 tiny, mtp", SpeculativeMode::Mtp);
    assert!(stats.returned_to_row > 0, "{stats:?}");
    assert!(stats.drafted <= 4 * stats.verifications, "{stats:?}");
    let what = "qwen35 tiny, mtp, snapshots";
    let stats = greedy_is_unchanged_rolling_back(Arc::clone(&m), &prompt, 40, what, SpeculativeMode::Mtp, 0);
    assert!(stats.recomputed > 0, "{stats:?}");
    let auto = Session::new(m);
    assert_eq!(auto.speculative(), SpeculativeMode::Auto);
    assert!(auto.drafts_with_mtp(), "auto drafts with the model's MTP head");
    assert!(!Session::new(hybrid_without_head()).drafts_with_mtp());
}

/// Sessions drafting with the MTP head inside a batch of several (as `serve` runs them) give
/// plain decoding's tokens, log-probabilities and states, next to a session set to `none` and
/// one in `auto`; the `mtp` sessions drafted with the head (they take no lookup drafts) and
/// had drafts accepted and rejected.
#[test]
fn mtp_drafts_inside_a_batch_give_plain_decodings_tokens_and_states() {
    let m = hybrid_with_repeating_mtp_head();
    let prompts: Vec<Vec<u32>> = vec![
        (0..50).map(|i| (i % 2) * 5 + 3).collect(),
        (0..40u32).map(|i| (i * 71 + 5) % 1000).collect(),
        (0..30).map(|i| (i % 3) * 7 + 2).collect(),
        (0..45).map(|i| (i % 2) * 11 + 6).collect(),
    ];
    let modes = [SpeculativeMode::Mtp, SpeculativeMode::None, SpeculativeMode::Mtp, SpeculativeMode::Auto];
    let sessions = batched_speculation_is_plain_decoding_with(m, &prompts, &modes, 40, "qwen35 tiny, mtp in a batch");
    assert_eq!(sessions[1].speculation_stats().drafted, 0);
    for i in [0, 2] {
        let st = sessions[i].speculation_stats();
        assert!(st.drafted > 0 && st.accepted > 0 && st.accepted < st.drafted, "session {i}: {st:?}");
        assert!(st.returned_to_row > 0, "session {i}: a rejected head draft returns to a kept row: {st:?}");
    }
}

/// A model without an MTP head.
fn hybrid_without_head() -> Arc<dyn CausalLm> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen35-tiny");
    let mut m = Qwen35::from_safetensors(&dir).unwrap();
    m.mtp = None;
    Arc::new(m)
}

/// Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, a real coding model; `scripts/fetch-coder-model.sh`)
/// on an edit, where the reply copies the code it changes: greedy tokens, log-probabilities
/// and the final state with lookup drafts equal plain decoding's (drafts accepted and
/// rejected), and `auto` gives the same text. Opt-in (a 1.1 GB model, minutes in a debug
/// build): `cargo test --release -p frognano-engine --test integration speculative:: -- --ignored`.
#[test]
#[ignore = "needs models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf and a release build"]
fn greedy_tokens_and_states_are_unchanged_by_lookup_on_qwen25_coder() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf");
    assert!(path.exists(), "{} is missing: run scripts/fetch-coder-model.sh", path.display());
    let loaded = frognano_model::load::load(path.to_str().unwrap()).unwrap();
    let tok = loaded.tokenizer.unwrap();
    let model: Arc<dyn CausalLm> = Arc::from(loaded.model);
    let text = "<|im_start|>user\nRename `total` to `acc` in this function. Reply with the whole function only.\n\
                ```python\ndef mean(values):\n    total = 0\n    count = 0\n    for v in values:\n        total += v\n        \
                count += 1\n    if count == 0:\n        return 0.0\n    return total / count\n```<|im_end|>\n\
                <|im_start|>assistant\n";
    let prompt = tok.encode_with(text, false).unwrap();
    greedy_is_unchanged(Arc::clone(&model), &prompt, 64, "Qwen2.5-Coder-1.5B Q4_K_M, lookup");
    let ids = |mode: SpeculativeMode| {
        let mut s = Session::new(Arc::clone(&model));
        s.set_speculative(mode);
        let g = s.generate(&prompt, &greedy(64), |_| ControlFlow::Continue(())).unwrap();
        (g.tokens.iter().map(|t| t.id).collect::<Vec<_>>(), s.speculation_stats())
    };
    let (plain, _) = ids(SpeculativeMode::None);
    let (auto, stats) = ids(SpeculativeMode::Auto);
    assert_eq!(auto, plain, "auto changed the greedy text ({stats:?})");
    assert!(stats.accepted > 0, "auto drafted nothing that held on an edit: {stats:?}");
}
