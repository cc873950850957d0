//! The demo model with the plain kernels (`FROGNANO_PLAIN_KERNELS=1`: no eight-row packing, the
//! row-at-a-time dots) reproduces llama.cpp's CPU numerics to the bit (module docs of
//! `frognano_model::quant::ggml`): top-1 at every prompt position, logits to the 4 decimals the
//! fixture keeps, and 16 greedy tokens — the same summation order as llama.cpp's AVX-512
//! build, which is where fixtures/smollm2/llama_cpp_reference.json comes from. The default
//! kernels are held to llama.cpp's own spread in `smollm2_gguf.rs`. One test in this binary:
//! the switch is read once per process.

mod smollm2_fixture;

use frognano_model::load;
use smollm2_fixture::{argmax, cases, demo_model};

/// The 4 decimals the fixture keeps, and a little.
const LOGIT_TOL: f32 = 2e-4;

#[test]
fn smollm2_plain_kernels_match_llama_cpp_to_the_bit() {
    // SAFETY: the only test of this binary sets it before anything reads the environment.
    unsafe { std::env::set_var("FROGNANO_PLAIN_KERNELS", "1") };
    let Some(path) = demo_model("smollm2_exact") else { return };
    let m = load(path.to_str().unwrap()).unwrap();
    let vocab = m.model.vocab_size();
    let mut positions = 0;
    for case in cases() {
        let short: String = case.prompt.chars().take(40).collect();
        let mut cache = m.model.new_cache();
        let logits = m.model.forward(&case.ids, &mut cache, true).unwrap();
        for (p, row) in logits.chunks_exact(vocab).enumerate() {
            positions += 1;
            assert_eq!(
                argmax(row),
                case.argmax[p],
                "top-1 at prompt position {p} of {short:?} (llama.cpp's top-2 margin there: {})",
                case.argmax_margin[p]
            );
        }
        let last = &logits[(case.ids.len() - 1) * vocab..];
        let worst =
            case.top_ids.iter().zip(&case.top_logits).map(|(&i, &l)| (last[i as usize] - l).abs()).fold(0.0, f32::max);
        assert!(worst < LOGIT_TOL, "{short:?}: last-position logits differ from llama.cpp's by up to {worst}");
        let mut next = argmax(last);
        for (step, (&want, &margin)) in case.greedy.iter().zip(&case.greedy_margin).enumerate() {
            assert_eq!(next, want, "greedy token {step} of {short:?} (llama.cpp's top-2 margin there: {margin})");
            next = argmax(&m.model.forward(&[want], &mut cache, false).unwrap());
        }
    }
    eprintln!("plain kernels: top-1 equal to llama.cpp's at all {positions} prompt positions");
}
