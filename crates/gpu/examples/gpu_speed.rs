//! Prefill and decode speed of a model on a device, with token ids only (no tokenizer needed:
//! the random 4B-shape checkpoint of bench/make_random_qwen35_4b.py has none). One JSON line a
//! measurement. Usage: `gpu_speed MODEL [DEVICE] [PREFILL,…] [DECODE] [BATCH]`, e.g.
//! `gpu_speed /tmp/q4b cuda 2048,8192 128 32` (bench/gpu.sh).

use std::time::Instant;

use frognano_gpu::{DeviceSpec, GpuModel};
use frognano_model::CausalLm;

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(model) = args.get(1) else {
        eprintln!("usage: gpu_speed MODEL [DEVICE] [PREFILL,…] [DECODE] [BATCH]");
        std::process::exit(2);
    };
    let spec: DeviceSpec = args.get(2).map_or("cuda", String::as_str).parse().unwrap_or_else(|e| panic!("{e}"));
    let prefill: Vec<usize> =
        args.get(3).map_or("2048", String::as_str).split(',').map(|s| s.parse().expect("prefill lengths")).collect();
    let decode: usize = args.get(4).map_or(128, |s| s.parse().expect("decode steps"));
    let batch: usize = args.get(5).map_or(32, |s| s.parse().expect("batch"));
    let dev = frognano_gpu::open(spec).unwrap_or_else(|e| panic!("--device {spec}: {e}"));
    let t0 = Instant::now();
    let cpu = frognano_model::load::load_on_cpu(model, None, false).expect("loading the model");
    let m = GpuModel::from_cpu(&dev, &*cpu.model).expect("uploading the model");
    drop(cpu);
    let bytes = m.weight_bytes();
    println!(
        "{{\"device\": {:?}, \"model\": {model:?}, \"weight_bytes\": {bytes}, \"load_s\": {:.2}}}",
        dev.describe(),
        t0.elapsed().as_secs_f64()
    );
    let vocab = m.vocab_size() as u32;
    let ids = |n: usize, seed: u32| -> Vec<u32> {
        (0..n as u32).map(|i| (i.wrapping_mul(2654435761) ^ seed) % vocab.min(200_000)).collect()
    };
    for &n in &prefill {
        // Once to warm (kernels load, buffers grow), then timed.
        for round in 0..2 {
            let mut c = m.new_cache();
            let t = Instant::now();
            m.forward(&ids(n, round), &mut c, false).expect("prefill");
            dev.sync().expect("sync");
            if round == 1 {
                let s = t.elapsed().as_secs_f64();
                println!("{{\"prefill_tokens\": {n}, \"seconds\": {s:.4}, \"tok_s\": {:.1}}}", n as f64 / s);
            }
        }
    }
    // Batch-1 decode after a short prompt.
    let mut c = m.new_cache();
    let mut next = argmax(&m.forward(&ids(16, 7), &mut c, false).expect("prompt"));
    for _ in 0..4 {
        next = argmax(&m.forward(&[next], &mut c, false).expect("warm-up"));
    }
    let t = Instant::now();
    for _ in 0..decode {
        next = argmax(&m.forward(&[next], &mut c, false).expect("decode"));
    }
    let s = t.elapsed().as_secs_f64();
    let tps = decode as f64 / s;
    println!(
        "{{\"decode_batch\": 1, \"steps\": {decode}, \"tok_s\": {tps:.1}, \"weight_gb_s\": {:.0}}}",
        bytes as f64 * tps / 1e9
    );
    // Aggregate decode of `batch` sequences in one step.
    if batch > 1 {
        let mut caches: Vec<_> = (0..batch).map(|_| m.new_cache()).collect();
        let mut nexts: Vec<u32> = caches
            .iter_mut()
            .enumerate()
            .map(|(i, c)| argmax(&m.forward(&ids(16, i as u32), c, false).expect("prompt")))
            .collect();
        let steps = decode.min(64);
        let t = Instant::now();
        for _ in 0..steps {
            let mut b: Vec<(u32, &mut frognano_model::Cache)> = nexts.iter().copied().zip(caches.iter_mut()).collect();
            let out = m.forward_batch(&mut b).expect("batched decode");
            nexts = out.iter().map(|r| argmax(r)).collect();
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "{{\"decode_batch\": {batch}, \"steps\": {steps}, \"aggregate_tok_s\": {:.1}}}",
            (batch * steps) as f64 / s
        );
    }
}
