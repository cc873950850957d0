//! Token-level recording on the real demo model (SmolLM2-135M-Instruct, Q4_1 GGUF): agent
//! rollouts of two steps turn into one training sequence S whose weights mark exactly the
//! sampled tokens, whose recorded logprobs are what the model gives when S is scored again,
//! and which decodes back to the rendered conversation. Skipped with a message when the
//! model is absent, unless FROGNANO_REQUIRE_FIXTURES is set. The checked-in f32 Qwen3.5
//! fixture's rollouts are held to the strict one-pass re-score bound everywhere.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use frognano_agent::agent::{self, AgentConfig, Guards};
use frognano_agent::tools::ToolBox;
use frognano_engine::sampler::log_softmax;
use frognano_engine::{ChatParts, Scheduler, SchedulerConfig, TurnRecord};
use frognano_model::CausalLm;
use frognano_protocol::{ChatRequest, Llm, Message, Sampling};
use frognano_rl::env::recording_llm;
use frognano_rl::rollout::{build_sequence, Outcome, Rollout, Sequence};
use frognano_sandbox::{Isolation, Sandbox, SandboxSpec};

/// The demo model on a scheduler of its own, and its chat parts.
fn demo() -> Option<(Arc<Scheduler>, ChatParts)> {
    let path = frognano_testkit::demo_model()?;
    let lm = frognano_model::load(path.to_str().unwrap()).unwrap();
    let (model, chat) = ChatParts::split(lm).unwrap();
    Some((Arc::new(Scheduler::start(model, SchedulerConfig::default()).unwrap()), chat))
}

fn raw_sampling(max_tokens: u32, seed: u64) -> Sampling {
    Sampling {
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        max_tokens,
        enable_thinking: false,
        seed: Some(seed),
        ..Sampling::default()
    }
}

/// Scores S again in one forward pass and checks every weight-1 token's logprob against
/// the recorded one, and that weights are 1 exactly on the sampled spans. `strict`: the
/// one-pass re-score must agree to 1e-3 too (models whose numerics do not depend on the
/// batch, see below).
fn check_alignment(model: &Arc<dyn CausalLm>, turns: &[TurnRecord], s: &Sequence, strict: bool) {
    let n = s.tokens.len();
    assert_eq!((s.logprobs.len(), s.weights.len()), (n, n));
    let mut expected_weights = vec![0u8; n];
    for (turn, &start) in turns.iter().zip(&s.turn_starts) {
        assert_eq!(&s.tokens[..start], &turn.prompt_ids[..], "turn prompt is everything before its sample");
        for w in &mut expected_weights[start..start + turn.sampled_ids.len()] {
            *w = 1;
        }
    }
    assert_eq!(s.weights, expected_weights, "weights are 1 on sampled tokens only");
    assert_eq!(s.weights.iter().filter(|&&w| w == 1).count(), turns.iter().map(|t| t.sampled_ids.len()).sum::<usize>());
    let vocab = model.vocab_size();
    // 1. Re-scored the way generation ran (each prompt's new part in one forward, then one
    // token at a time): every weight-1 token's logprob must match.
    let mut cache = model.new_cache();
    let mut fed = 0usize;
    let mut worst = 0f32;
    for (turn, &start) in turns.iter().zip(&s.turn_starts) {
        let mut logits = model.forward(&s.tokens[fed..start], &mut cache, false).unwrap();
        fed = start;
        for (j, &t) in turn.sampled_ids.iter().enumerate() {
            let lp = log_softmax(&logits)[t as usize];
            let i = start + j;
            assert_eq!(s.tokens[i], t);
            worst = worst.max((lp - s.logprobs[i]).abs());
            assert!((lp - s.logprobs[i]).abs() < 1e-3, "token {i}: recorded {} re-scored {lp}", s.logprobs[i]);
            if j + 1 < turn.sampled_ids.len() {
                logits = model.forward_batch(&mut [(t, &mut cache)]).unwrap().pop().unwrap();
                fed += 1;
            }
        }
    }
    // 2. Re-scored in one forward over all of S (what a trainer does). The GGUF llama path
    // reproduces llama.cpp's numerics, which depend on the batch size (f16 K·Q and softmax·V
    // summed in a batch-dependent order, 8-bit activation quantization where an ulp can flip
    // a rounding; crates/model/src/llama.rs): one-token decode steps and a many-token forward
    // differ at some (token, position) pairs (logit gaps up to ~0.6), carried on through the
    // cached keys and values. So for it this agreement is checked to 1e-3 only when
    // FROGNANO_STRICT_RESCORE is set; otherwise it is reported and bounded loosely. The f32
    // safetensors models (the Qwen3.5 fixture) compute the same sums whatever the batch, so
    // they are always checked strictly.
    let mut cache = model.new_cache();
    let logits = model.forward(&s.tokens, &mut cache, true).unwrap();
    let (mut agree, mut sampled, mut full_worst) = (0usize, 0usize, 0f32);
    for i in 0..n {
        if s.weights[i] == 0 {
            assert_eq!(s.logprobs[i], 0.0);
            continue;
        }
        assert!(i > 0);
        let lp = log_softmax(&logits[(i - 1) * vocab..i * vocab])[s.tokens[i] as usize];
        let gap = (lp - s.logprobs[i]).abs();
        full_worst = full_worst.max(gap);
        sampled += 1;
        agree += usize::from(gap < 1e-3);
    }
    eprintln!(
        "{n} tokens, {sampled} sampled; largest gap {worst:.2e} (generation-shaped re-score), {full_worst:.2e} \
         (one forward over S, {agree}/{sampled} within 1e-3)"
    );
    if strict {
        assert_eq!(agree, sampled, "one-pass re-score: largest gap {full_worst}");
    }
    assert!(full_worst < 1.0, "one-pass re-score is far off: {full_worst}");
}

/// The GGUF demo model's one-pass re-score is checked to 1e-3 only on request (see
/// [`check_alignment`]).
fn strict_for_gguf() -> bool {
    std::env::var_os("FROGNANO_STRICT_RESCORE").is_some()
}

#[test]
fn a_qwen35_rollout_rescores_within_1e_3_in_one_pass() {
    // The checked-in f32 Qwen3.5 fixture (random weights, real architecture: gated delta
    // rule plus full attention): no download, so it runs everywhere.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen35-tiny");
    let lm = frognano_model::load(path.to_str().unwrap()).unwrap();
    let (model, chat) = ChatParts::split(lm).unwrap();
    let model = Arc::new(Scheduler::start(model, SchedulerConfig::default()).unwrap());
    let mut llm = recording_llm(&chat, &model, 2048);
    let mut messages = vec![Message::system("You are a helpful assistant."), Message::user("Say hello.")];
    // Long enough replies that the one-pass forward spans more than one 64-token chunk of
    // the delta rule while the recording decoded them one token at a time.
    for (i, max_tokens) in [(0u64, 48u32), (1, 40)] {
        let sampling = raw_sampling(max_tokens, 7 + i);
        let c = llm.complete(&ChatRequest::new(&messages, &[], &sampling)).unwrap();
        messages.push(c.message);
        messages.push(Message::user("Now say goodbye."));
    }
    let turns = llm.take_turns();
    assert_eq!(turns.len(), 2);
    assert!(turns[1].continued);
    let s = build_sequence(&turns).unwrap();
    assert!(s.tokens.len() > 64, "{} tokens: too short to span two chunks", s.tokens.len());
    check_alignment(model.model(), &turns, &s, true);
}

#[test]
fn two_step_agent_rollout_lines_up_with_a_rescore() {
    let Some((model, chat)) = demo() else { return };
    let dir = tempfile::tempdir().unwrap();
    // Replies are cut at 6 tokens; the cut-reply notice keeps the loop going for a second
    // step (no tool runs). A seed whose first reply ends early gives one step; try the next.
    for seed in 0..10u64 {
        let sandbox = Sandbox::new(SandboxSpec::new(dir.path()).isolation(Isolation::Unconfined)).unwrap();
        let mut tools = ToolBox::new(sandbox);
        let mut llm = recording_llm(&chat, &model, 2048);
        let config = AgentConfig {
            sampling: raw_sampling(6, seed),
            max_steps: 2,
            max_context_tokens: 2048,
            guards: Guards { cut_notice: true, ..Guards::leaf_exact() },
            tools: Vec::new(),
            ..AgentConfig::default()
        };
        let t = agent::run(
            &mut llm,
            &mut tools,
            "Write a Python function that adds two numbers.",
            &config,
            &AtomicBool::new(false),
            &mut |_| {},
        );
        let turns = llm.take_turns();
        if turns.len() < 2 {
            continue;
        }
        assert_eq!(t.exit_reason.as_str(), "max_turns");
        assert!(turns.iter().all(|t| t.continued && !t.stopped));
        let s = build_sequence(&turns).unwrap();
        check_alignment(model.model(), &turns, &s, strict_for_gguf());
        // S decodes to the conversation as the template renders it (through the last
        // assistant message; only that message's closing glue is missing).
        let decoded = chat.tokenizer.decode(&s.tokens, false).unwrap();
        let rendered = llm.render_messages(&t.messages[..5], &[], false, false).unwrap();
        assert!(rendered.starts_with(&decoded), "decoded:\n{decoded}\nrendered:\n{rendered}");
        assert_eq!(&rendered[decoded.len()..], "<|im_end|>\n");
        // Turn 2's prompt is exactly the re-rendered prompt, tokens continued from turn 1.
        let prompt2 = llm.render_messages(&t.messages[..4], &[], false, true).unwrap();
        assert_eq!(chat.tokenizer.decode(&turns[1].prompt_ids, false).unwrap(), prompt2);
        // The rollout record carries the same arrays; a limit exit is masked.
        let outcome = frognano_rl::rollout::outcome_of_exit("max_turns", None).unwrap();
        let r = Rollout::from_turns("demo", seed, &turns, "max_turns", outcome, 0.0);
        assert_eq!((r.tokens, r.weights, r.turn_starts), (s.tokens, s.weights, s.turn_starts));
        assert_eq!(r.outcome, Outcome::Limit { reason: "max_turns".into() });
        return;
    }
    panic!("no seed in 0..10 gave a two-step rollout");
}

#[test]
fn turns_closed_by_the_end_token_continue_with_the_template_glue() {
    let Some((model, chat)) = demo() else { return };
    let mut llm = recording_llm(&chat, &model, 2048);
    let mut messages = vec![Message::system("You are a helpful assistant."), Message::user("Say hello.")];
    let mut stopped_once = false;
    for (i, max_tokens) in [(0u64, 24u32), (1, 6)] {
        let sampling = raw_sampling(max_tokens, 40 + i);
        let c = llm.complete(&ChatRequest::new(&messages, &[], &sampling)).unwrap();
        messages.push(c.message);
        messages.push(Message::user("Now say goodbye."));
        stopped_once |= llm.turns()[0].stopped;
    }
    let turns = llm.take_turns();
    assert_eq!(turns.len(), 2);
    assert!(turns[1].continued);
    let s = build_sequence(&turns).unwrap();
    check_alignment(model.model(), &turns, &s, strict_for_gguf());
    // Whatever the first reply was, the second prompt is the first one, the sampled tokens
    // as sampled, then the template's glue, the new user turn and the generation prompt.
    let first =
        chat.tokenizer.decode(&[turns[0].prompt_ids.clone(), turns[0].sampled_ids.clone()].concat(), false).unwrap();
    let second = chat.tokenizer.decode(&turns[1].prompt_ids, false).unwrap();
    let glue = if turns[0].stopped { "\n" } else { "<|im_end|>\n" };
    assert_eq!(second, format!("{first}{glue}<|im_start|>user\nNow say goodbye.<|im_end|>\n<|im_start|>assistant\n"));
    eprintln!("first turn closed by the end token: {stopped_once}");
}

#[test]
fn a_tool_call_the_grammar_ends_is_closed_by_the_template_in_the_next_prompt() {
    let Some((model, chat)) = demo() else { return };
    // Under a tool-call grammar the reply ends when the call is complete, before the model
    // draws its end-of-turn token. The next prompt must still close that turn as the template
    // does: a small model shown `</tool_call>` followed straight by a user turn sees a
    // conversation it was never trained on.
    let mut llm = recording_llm(&chat, &model, 4096).constrain_tools();
    let tools = vec![serde_json::json!({
        "type": "function",
        "function": {
            "name": "Read",
            "description": "Read a text file.",
            "parameters": {
                "type": "object",
                "properties": {"file_path": {"type": "string"}},
                "required": ["file_path"]
            }
        }
    })];
    let mut messages = vec![Message::system("You are a coding agent."), Message::user("Read the file notes.txt.")];
    let sampling = Sampling { temperature: 0.0, ..raw_sampling(200, 5) };
    let mut request = ChatRequest::new(&messages, &tools, &sampling);
    request.tool_choice = frognano_protocol::ToolChoice::One;
    let c = llm.complete(&request).unwrap();
    let call = c.message.calls().first().cloned().expect("the grammar makes the reply a tool call");
    messages.push(c.message);
    messages.push(Message::tool(call.id.clone(), "hello from notes.txt"));
    llm.complete(&ChatRequest::new(&messages, &tools, &raw_sampling(4, 6))).unwrap();
    let turns = llm.take_turns();
    assert_eq!(turns.len(), 2);
    assert!(!turns[0].stopped, "the grammar, not an end-of-turn token, ended the first reply");
    assert!(turns[1].continued);
    // The second prompt: the first, the call as sampled, the template's end of the turn,
    // then the tool's answer and the generation prompt as the template renders them.
    let first =
        chat.tokenizer.decode(&[turns[0].prompt_ids.clone(), turns[0].sampled_ids.clone()].concat(), false).unwrap();
    let second = chat.tokenizer.decode(&turns[1].prompt_ids, false).unwrap();
    let rendered = llm.render_messages(&messages, &tools, false, true).unwrap();
    let tail = &rendered[rendered.rfind("<|im_start|>user").unwrap()..];
    assert!(first.ends_with("</tool_call>"), "{first}");
    assert_eq!(second, format!("{first}<|im_end|>\n{tail}"));
    let s = build_sequence(&turns).unwrap();
    check_alignment(model.model(), &turns, &s, strict_for_gguf());
}
