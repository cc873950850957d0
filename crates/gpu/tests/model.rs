//! The whole GPU forward (frognano_gpu::GpuModel) against transformers' and the CPU path's
//! outputs, on the CPU simulator (or on a GPU with FROGNANO_TEST_DEVICE=cuda: bench/gpu.sh).

use std::path::PathBuf;

use frognano_gpu::{Gpu, GpuModel};
use frognano_model::tensor::{to_f32_vec, DType};
use frognano_model::CausalLm;
use safetensors::SafeTensors;

fn device() -> Gpu {
    frognano_gpu::test_device()
}

fn fixture(name: &str) -> PathBuf {
    frognano_gpu::fixtures_dir().join(name)
}

/// The CPU model as loaded for a device, and the same checkpoint on the device.
fn both(name: &str) -> (Box<dyn CausalLm>, GpuModel) {
    let path = fixture(name);
    let cpu = frognano_model::load::load_on_cpu(path.to_str().unwrap(), None, false).unwrap();
    let gpu = GpuModel::from_cpu(&device(), &*cpu.model).unwrap();
    (cpu.model, gpu)
}

struct Golden(Vec<u8>);

impl Golden {
    fn open(name: &str) -> Self {
        Golden(std::fs::read(fixture(&format!("{name}.golden.safetensors"))).unwrap())
    }
    fn f32(&self, key: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        to_f32_vec(st.tensor(key).unwrap().data(), DType::F32)
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

#[test]
fn qwen35_f32_on_the_device_matches_transformers() {
    for name in ["qwen35-tiny", "qwen35-wrapper-untied"] {
        let (_, m) = both(name);
        let g = Golden::open(name);
        let ids = g.ids("input_ids");
        let vocab = m.vocab_size();
        // One prefill (the chunked delta rule over three chunks and a tail, the tiled attention).
        let mut cache = m.new_cache();
        let full = m.forward(&ids, &mut cache, true).unwrap();
        let d = max_abs_diff(&full, &g.f32("logits_full"));
        assert!(d < 1e-3, "{name}: prefill logits differ from transformers by {d}");
        // Greedy decode (the recurrent rule, split-K attention): the same tokens and logits.
        let want_decode = g.f32("logits_decode");
        let mut next = argmax(&full[(ids.len() - 1) * vocab..]);
        for (step, want) in g.ids("greedy_tokens").iter().enumerate() {
            assert_eq!(next, *want, "{name}: greedy token {step}");
            let lg = m.forward(&[next], &mut cache, false).unwrap();
            let d = max_abs_diff(&lg, &want_decode[step * vocab..(step + 1) * vocab]);
            assert!(d < 1e-3, "{name}: decode step {step} logits differ by {d}");
            next = argmax(&lg);
        }
        // A prefill in two pieces is one pass.
        let mut c2 = m.new_cache();
        let mut split = m.forward(&ids[..100], &mut c2, true).unwrap();
        split.extend(m.forward(&ids[100..], &mut c2, true).unwrap());
        let d = max_abs_diff(&split, &g.f32("logits_split_prefill"));
        assert!(d < 1e-3, "{name}: split prefill differs from transformers by {d}");
    }
}

/// Positions of `lg` whose top-1 token is `golden`'s, and positions within 2e-2 of it relative
/// to the row's largest logit.
fn bf16_agreement(lg: &[f32], golden: &[f32], vocab: usize) -> (usize, usize) {
    let (mut agree, mut within) = (0, 0);
    for (a, b) in lg.chunks_exact(vocab).zip(golden.chunks_exact(vocab)) {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        within += (max_abs_diff(a, b) / scale <= 2e-2) as usize;
        agree += (argmax(a) == argmax(b)) as usize;
    }
    (agree, within)
}

#[test]
fn qwen35_bf16_on_the_device_agrees_with_transformers_bf16() {
    // bf16 weights, f32 activations on the device; transformers computed in bf16, and the CPU
    // path rounds to bf16 where transformers does. On this tiny random model several positions
    // are near-ties between two tokens, which bf16 rounding decides either way.
    let (cpu, m) = both("qwen35-tiny-bf16");
    let g = Golden::open("qwen35-tiny-bf16");
    let ids = g.ids("input_ids");
    let golden = g.f32("logits_full_bf16");
    let vocab = m.vocab_size();
    let n = ids.len();
    let (agree, within) = bf16_agreement(&m.forward(&ids, &mut m.new_cache(), true).unwrap(), &golden, vocab);
    let (cpu_agree, _) = bf16_agreement(&cpu.forward(&ids, &mut cpu.new_cache(), true).unwrap(), &golden, vocab);
    eprintln!("top-1 agreement with transformers bf16: device {agree}/{n} ({within} within 2e-2), CPU path (bf16 rounding) {cpu_agree}/{n}");
    // The bar the CPU path's own bf16 test holds (it gets 146/150 here; the device 144/150). The
    // device keeps f32 activations, so its logits sit a bf16 rounding away from transformers'
    // at most positions (105/150 within 2e-2): what is checked is the top-1 token.
    assert!(agree * 100 >= 95 * n, "top-1 agrees on only {agree}/{n} positions (CPU path: {cpu_agree})");
    assert!(within * 2 >= n, "only {within}/{n} positions within 2e-2 relative");
}

#[test]
fn qwen35_gguf_on_the_device_follows_the_cpu_path() {
    // GGUF's layout: value heads tiled, norms stored as 1 + w, A as -exp(A_log).
    let (cpu, gpu) = both("qwen35-tiny.gguf");
    let ids: Vec<u32> = (0..70).map(|i| (i * 29 + 3) % 250).collect();
    let (mut cc, mut gc) = (cpu.new_cache(), gpu.new_cache());
    let want = cpu.forward(&ids, &mut cc, true).unwrap();
    let got = gpu.forward(&ids, &mut gc, true).unwrap();
    let vocab = cpu.vocab_size();
    // The CPU path quantizes each matmul's input to 8 bits, as llama.cpp does; where an input
    // lies a rounding from the midpoint of two levels, the two paths' last-bit differences
    // put it on different levels, and that position's logits move by a few 1e-3 (logits up
    // to 48; seen on an AVX2-only Zen 3: 1e-4 at most positions, 3.2e-3 at one of 70 — the
    // CPU path's own prefill and one-token-at-a-time passes differ by up to 5.8e-3). So: most
    // positions within 1e-3, every one within 1e-2 and on the CPU's greedy token.
    let rows: Vec<(f32, bool)> = want
        .chunks_exact(vocab)
        .zip(got.chunks_exact(vocab))
        .map(|(w, g)| (max_abs_diff(g, w), argmax(g) == argmax(w)))
        .collect();
    let close = rows.iter().filter(|r| r.0 < 1e-3).count();
    assert!(close * 10 >= rows.len() * 9, "only {close}/{} positions' logits within 1e-3 of the CPU's", rows.len());
    for (i, (d, same)) in rows.iter().enumerate() {
        assert!(*d < 1e-2 && *same, "position {i}: logits differ from the CPU's by {d} (same greedy token: {same})");
    }
    let mut next = argmax(&want[(ids.len() - 1) * vocab..]);
    for step in 0..4 {
        let a = cpu.forward(&[next], &mut cc, false).unwrap();
        let b = gpu.forward(&[next], &mut gc, false).unwrap();
        let d = max_abs_diff(&a, &b);
        assert!(d < 2e-3, "decode step {step} differs by {d}");
        next = argmax(&a);
    }
}

/// Granite's multipliers are not on the device path yet: refused, not run without them.
#[test]
fn granite_is_refused_on_the_device() {
    let path = fixture("arch/granite-tiny.gguf");
    let cpu = frognano_model::load::load_on_cpu(path.to_str().unwrap(), None, false).unwrap();
    let err = GpuModel::from_cpu(&device(), &*cpu.model).err().expect("refused").to_string();
    assert!(err.contains("Granite") && err.contains("CPU"), "{err}");
}

#[test]
fn llama_family_on_the_device_follows_the_cpu_path() {
    // GGUF files of each llama-family variant: Llama 3 RoPE, Qwen2 biases, Qwen3 q/k norms,
    // Mistral, Ministral 3's YaRN and attention temperature, Phi-3's fused projections,
    // partial RoPE and LongRoPE, SmolLM3's layers without RoPE, and a Q8_0 file.
    for name in [
        "llama3-tiny.gguf",
        "qwen2-tiny.gguf",
        "qwen3-tiny.gguf",
        "mistral-tiny.gguf",
        "ministral3-tiny.gguf",
        "phi3-tiny.gguf",
        "smollm3-tiny.gguf",
        "qwen3-tiny-q8_0.gguf",
    ] {
        let (cpu, gpu) = both(&format!("arch/{name}"));
        let ids: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 200).collect();
        let (mut cc, mut gc) = (cpu.new_cache(), gpu.new_cache());
        let want = cpu.forward(&ids, &mut cc, true).unwrap();
        let got = gpu.forward(&ids, &mut gc, true).unwrap();
        let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        let d = max_abs_diff(&got, &want);
        // The CPU path rounds the query to f16 and quantizes activations to 8 bits as llama.cpp
        // does; the device keeps them f32.
        assert!(d < 0.03 * scale, "{name}: prefill logits differ by {d} (largest {scale})");
        // Decode steps give the CPU's greedy tokens.
        let vocab = cpu.vocab_size();
        let mut next = argmax(&want[(ids.len() - 1) * vocab..]);
        for step in 0..6 {
            let a = cpu.forward(&[next], &mut cc, false).unwrap();
            let b = gpu.forward(&[next], &mut gc, false).unwrap();
            assert_eq!(argmax(&b), argmax(&a), "{name}: greedy token {step}");
            next = argmax(&a);
        }
    }
}

#[test]
fn device_caches_snapshot_fork_batch_and_verify_as_cpu_caches_do() {
    let (_, m) = both("qwen35-tiny");
    let ids: Vec<u32> = (0..40).map(|i| (i * 13 + 7) % 200).collect();
    let vocab = m.vocab_size();
    let mut a = m.new_cache();
    m.forward(&ids[..30], &mut a, false).unwrap();
    // A snapshot, three more tokens, a restore: the next forward gives the first run's logits.
    let snap = a.snapshot();
    let first = m.forward(&ids[30..33], &mut a, false).unwrap();
    a.restore(&snap).unwrap();
    assert_eq!(a.len(), 30);
    assert_eq!(m.forward(&ids[30..33], &mut a, false).unwrap(), first, "restored state");
    // A clone is a fork: both go on alike, and independently.
    let mut b = a.clone();
    let x = m.forward(&ids[33..34], &mut a, false).unwrap();
    let y = m.forward(&ids[33..34], &mut b, false).unwrap();
    assert_eq!(x, y, "fork");
    m.forward(&ids[34..36], &mut a, false).unwrap();
    assert_eq!(b.len(), 34);
    // A batched decode step gives each sequence what a step alone gives.
    let (mut c1, mut c2) = (b.clone(), a.clone());
    let alone = [m.forward(&[5], &mut c1, false).unwrap(), m.forward(&[9], &mut c2, false).unwrap()];
    let batch = m.forward_batch(&mut [(5, &mut b), (9, &mut a)]).unwrap();
    for (i, (p, q)) in alone.iter().zip(&batch).enumerate() {
        let d = max_abs_diff(p, q);
        assert!(d < 1e-4, "batch row {i} differs by {d}");
    }
    // A stepwise verification gives each row the bits of a decode step.
    let mut s = c1.clone();
    let mut steps = Vec::new();
    for &id in &ids[..5] {
        steps.extend(m.forward(&[id], &mut s, false).unwrap());
    }
    let mut v = c1.clone();
    let verified = m.forward_stepwise(&ids[..5], &mut v).unwrap();
    assert_eq!(verified.len(), 5 * vocab);
    assert_eq!(verified, steps, "stepwise rows are decode steps");
    // Another model's cache is refused, not misread.
    let (_, other) = both("qwen35-tiny");
    let err = other.forward(&[1], &mut a, false).unwrap_err();
    assert!(err.to_string().contains("different model"), "{err}");
}

#[test]
fn bad_input_is_an_error_that_names_it() {
    let (_, m) = both("qwen35-tiny");
    let mut c = m.new_cache();
    let err = m.forward(&[u32::MAX], &mut c, false).unwrap_err().to_string();
    assert!(err.contains("out of vocabulary"), "{err}");
    assert_eq!(c.len(), 0, "the cache is unchanged");
    assert!(m.forward(&[], &mut c, false).is_err());
}

/// qwen35-tiny with a `ty` cache on the CPU and on the device (set on both before any cache
/// is made): the prompt's logits within `prefill` of the CPU's; then `steps` greedy decode
/// steps, each the CPU's token, its logits within `step` of the CPU's decode step (which
/// quantizes the query to 8 bits for its integer dots; the device keeps it f32) and within
/// `pass` of one CPU pass over the whole sequence (the CPU's plain attention over the
/// dequantized cache, as the device computes it).
fn qwen35_follows_the_cpu_with_cache(ty: frognano_model::KvType, steps: usize, prefill: f32, step: f32, pass: f32) {
    let (mut cpu, mut gpu) = both("qwen35-tiny");
    cpu.set_kv_type(ty).unwrap();
    gpu.set_kv_type(ty).unwrap();
    assert_eq!(gpu.kv_type(), ty);
    let ids = Golden::open("qwen35-tiny").ids("input_ids");
    let vocab = cpu.vocab_size();
    let (mut cc, mut gc) = (cpu.new_cache(), gpu.new_cache());
    // The tiled prefill kernel on the blocks.
    let want = cpu.forward(&ids, &mut cc, true).unwrap();
    let got = gpu.forward(&ids, &mut gc, true).unwrap();
    let d = max_abs_diff(&got, &want);
    assert!(d < prefill, "{ty}: prefill logits differ from the CPU's by {d}");
    // Split-K decoding on the blocks, the rows the device quantized itself.
    let mut next = argmax(&want[(ids.len() - 1) * vocab..]);
    let mut seen = ids.clone();
    for i in 0..steps {
        let a = cpu.forward(&[next], &mut cc, false).unwrap();
        let b = gpu.forward(&[next], &mut gc, false).unwrap();
        assert_eq!(argmax(&b), argmax(&a), "{ty}: greedy token {i}");
        let d = max_abs_diff(&b, &a);
        assert!(d < step, "{ty}: decode step {i} logits differ from the CPU's step by {d}");
        seen.push(next);
        let one = cpu.forward(&seen, &mut cpu.new_cache(), false).unwrap();
        let d = max_abs_diff(&b, &one);
        assert!(d < pass, "{ty}: decode step {i} logits differ from one CPU pass by {d}");
        next = argmax(&a);
    }
}

#[test]
fn qwen35_with_a_q8_0_cache_on_the_device_follows_the_cpu_path() {
    // Seen on the simulator (logits up to 47): prefill 1.8e-4, decode steps 0.010–0.015 from
    // the CPU's steps and under 4e-5 from one CPU pass.
    qwen35_follows_the_cpu_with_cache(frognano_model::KvType::Q8_0, 6, 1e-3, 0.03, 1e-3);
}

#[test]
fn qwen35_with_a_q4_0_cache_on_the_device_follows_the_cpu_path() {
    // Looser: a key or value a rounding apart on the two paths can land on another of Q4_0's
    // 16 levels. Seen: prefill 7.5e-3, decode steps 0.010–0.013 from the CPU's steps and
    // 6e-4–3.7e-3 from one CPU pass.
    qwen35_follows_the_cpu_with_cache(frognano_model::KvType::Q4_0, 3, 0.03, 0.03, 0.02);
}

#[test]
fn block_caches_need_head_dims_in_blocks_of_32() {
    use frognano_model::KvType;
    // llama3-tiny's heads are 16 wide.
    let (_, mut m) = both("arch/llama3-tiny.gguf");
    let before = m.kv_type();
    for ty in [KvType::Q8_0, KvType::Q4_0] {
        let e = m.set_kv_type(ty).unwrap_err().to_string();
        assert!(e.contains(&format!("--kv-cache {ty}")) && e.contains("head_dim 16") && e.contains("32"), "{e}");
        assert_eq!(m.kv_type(), before, "a refused type changes nothing");
    }
    m.set_kv_type(KvType::F32).unwrap();
    assert_eq!(m.kv_type(), KvType::F32);
}
