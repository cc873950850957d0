//! The demo model, SmolLM2-135M-Instruct Q4_1 (scripts/fetch-demo-model.sh), with the default
//! (fastest) kernels, against llama.cpp's own outputs (fixtures/smollm2/llama_cpp_reference.json
//! from scripts/llama_reference.py), to within the distance llama.cpp itself moves between its
//! batch and one-token paths; `smollm2_exact.rs` holds the plain kernels to llama.cpp's bits.
//! Without the model these tests skip loudly, or fail when `FROGNANO_REQUIRE_FIXTURES` is set
//! (CI).

use crate::smollm2_fixture;

use frognano_model::load;
use smollm2_fixture::{argmax, cases, demo_model};

/// Top-1 must be llama.cpp's wherever llama.cpp's own top-2 margin is at least this. The
/// default kernels sum each dot's integer block sums in their own float order (the eight-row
/// packings), so a value near a rounding boundary of the next layer's 8-bit activations can
/// fall the other way — as it does in llama.cpp itself between CPUs: its AVX2 build flips
/// this fixture's (AVX-512) top-1 at margins 0.013, 0.046 and 0.129. The bit-exact comparison
/// is `smollm2_exact.rs` (plain kernels).
const FAST_MARGIN: f32 = 0.25;

#[test]
fn smollm2_matches_llama_cpp() {
    let Some(path) = demo_model("smollm2_gguf") else { return };
    let m = load(path.to_str().unwrap()).unwrap();
    let vocab = m.model.vocab_size();
    assert_eq!(vocab, 49152);
    let tok = m.tokenizer().unwrap();
    let (mut positions, mut checked, mut worst_all) = (0, 0, 0.0f32);
    for case in cases() {
        let short: String = case.prompt.chars().take(40).collect();
        assert_eq!(tok.encode(&case.prompt).unwrap(), case.ids, "tokenization of {short:?}");
        let mut cache = m.model.new_cache();
        let logits = m.model.forward(&case.ids, &mut cache, true).unwrap();
        for (p, row) in logits.chunks_exact(vocab).enumerate() {
            positions += 1;
            if case.argmax_margin[p] >= FAST_MARGIN {
                checked += 1;
                assert_eq!(
                    argmax(row),
                    case.argmax[p],
                    "top-1 at prompt position {p} of {short:?} (llama.cpp's top-2 margin there: {})",
                    case.argmax_margin[p]
                );
            }
        }
        let last = &logits[(case.ids.len() - 1) * vocab..];
        let worst =
            case.top_ids.iter().zip(&case.top_logits).map(|(&i, &l)| (last[i as usize] - l).abs()).fold(0.0, f32::max);
        worst_all = worst_all.max(worst);
        assert!(
            worst <= case.spread,
            "{short:?}: last-position logits differ from llama.cpp's by up to {worst}, more than llama.cpp's own \
             batch-vs-one-token spread {}",
            case.spread
        );
        // Greedy decode one token at a time (the single-token path), up to the first step
        // where llama.cpp's margin is below the bar (past it the two texts may part).
        let mut next = argmax(last);
        for (step, (&want, &margin)) in case.greedy.iter().zip(&case.greedy_margin).enumerate() {
            if margin < FAST_MARGIN {
                break;
            }
            assert_eq!(next, want, "greedy token {step} of {short:?} (llama.cpp's top-2 margin there: {margin})");
            next = argmax(&m.model.forward(&[want], &mut cache, false).unwrap());
        }
    }
    eprintln!(
        "top-1 equal to llama.cpp's at the {checked} of {positions} prompt positions whose margin exceeds \
         {FAST_MARGIN}; last-position logits within {worst_all:.2e} of llama.cpp's (its own spread: 0.8–1.2)"
    );
}

#[test]
fn smollm2_metadata_gives_template_and_stop_tokens() {
    let Some(path) = demo_model("smollm2_gguf") else { return };
    let m = load(path.to_str().unwrap()).unwrap();
    let tok = m.tokenizer().unwrap();
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert!(m.eos_ids.contains(&im_end), "{:?}", m.eos_ids);
    let msgs = [frognano_protocol::Message::user("Hi")];
    let text = m.chat_template().unwrap().render(&msgs, None, true, None).unwrap();
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text:?}");
}
