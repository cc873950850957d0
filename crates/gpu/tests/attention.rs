//! The attention kernels (kernels/attention.cu, src/attention.rs) against the CPU: RoPE
//! against frognano-model's and llama.rs's formulas, the KV cache round trip (Q8_0/Q4_0 blocks
//! byte for byte against frognano-model's `KvRows`), and causal GQA
//! attention (both the split-K decoding and the tiled prefill path) against a plain f64
//! reference, on the CPU simulator (or `FROGNANO_TEST_DEVICE`).

use frognano_gpu::attention::{self, AttnPath, AttnScratch, DeviceKv, KvDtype};
use frognano_gpu::{Buffer, Gpu};
use frognano_model::cache::{KvRows, KvType};

use crate::common;
use common::{device, max_diff, values};

const ALL: [KvDtype; 4] = [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0];

/// The CPU cache type of a device one.
/// `x` (`[rows, width]`) stored in a CPU cache of type `ty` (heads of `head_dim`).
fn cpu_rows(ty: KvDtype, width: usize, head_dim: usize, x: &[f32]) -> KvRows {
    let mut r = KvRows::new(KvType::from(ty), width, head_dim);
    r.push(x);
    r
}

fn f16_round(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// The `[rows, rot_dim/2, 2]` (cos, sin) table of positions `pos[r]`, as frognano-model's
/// `Rope` computes its angles (`inv_freq[j] = theta^(-2j/R)` in f32).
fn rope_table(pos: &[usize], rot_dim: usize, theta: f32) -> Vec<f32> {
    let mut t = Vec::new();
    for &p in pos {
        for j in 0..rot_dim / 2 {
            let inv = 1.0 / theta.powf((2 * j) as f32 / rot_dim as f32);
            let a = p as f32 * inv;
            t.extend([a.cos(), a.sin()]);
        }
    }
    t
}

#[test]
fn rope_matches_the_cpu_rotations() {
    let dev = device();
    let (rows, heads) = (3, 4);
    for (head_dim, rot_dim) in [(64, 64), (256, 64), (128, 96)] {
        let pos: Vec<usize> = (0..rows).map(|r| 7 + 13 * r).collect();
        let table = rope_table(&pos, rot_dim, 10000.0);
        let x = values(rows * heads * head_dim, 3);
        for halves in [true, false] {
            // llama.rs's rotation, fused the same way: bit for bit.
            let mut want = x.clone();
            let half = rot_dim / 2;
            for (idx, head) in want.chunks_exact_mut(head_dim).enumerate() {
                let r = idx / heads;
                for i in 0..half {
                    let (c, s) = (table[(r * half + i) * 2], table[(r * half + i) * 2 + 1]);
                    let (a, b) = if halves { (i, i + half) } else { (2 * i, 2 * i + 1) };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0.mul_add(c, -(x1 * s));
                    head[b] = x0.mul_add(s, x1 * c);
                }
            }
            let bx = Buffer::from_f32(&dev, &x).unwrap();
            let bt = Buffer::from_f32(&dev, &table).unwrap();
            attention::rope(&dev, bx.ptr(), bt.ptr(), rows, heads, head_dim, rot_dim, halves).unwrap();
            let got = bx.to_f32().unwrap();
            let same = got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits());
            assert!(same, "head_dim {head_dim} rot_dim {rot_dim} halves {halves}: max |Δ| {}", max_diff(&got, &want));
            // Qwen3.5's rotation (frognano-model's Rope, unfused f32 products): to rounding.
            if halves {
                let rope = frognano_model::kernels::Rope::new(rot_dim, 10000.0);
                let mut cpu = x.clone();
                for (idx, head) in cpu.chunks_exact_mut(head_dim).enumerate() {
                    rope.apply(head, pos[idx / heads], frognano_model::kernels::Act::F32);
                }
                let d = max_diff(&got, &cpu);
                assert!(d < 1e-6, "head_dim {head_dim} rot_dim {rot_dim}: against Rope::apply max |Δ| {d}");
            }
            // The dims past rot_dim are untouched.
            for (g, x) in got.chunks_exact(head_dim).zip(x.chunks_exact(head_dim)) {
                assert_eq!(g[rot_dim..], x[rot_dim..]);
            }
        }
    }
}

#[test]
fn kv_append_round_trips() {
    let dev = device();
    let width = 2 * 64;
    for ty in ALL {
        let mut kv = DeviceKv::new(&dev, ty, width, 4).unwrap();
        assert_eq!((kv.capacity(), kv.width(), kv.dtype()), (4, width, ty));
        assert_eq!(kv.byte_len(), 2 * 4 * KvType::from(ty).row_bytes(width));
        let (k, v) = (values(6 * width, 10), values(6 * width, 11));
        let (bk, bv) = (Buffer::from_f32(&dev, &k).unwrap(), Buffer::from_f32(&dev, &v).unwrap());
        // Rows 0..3, then rows 3..6 after growing (the first 3 kept).
        attention::kv_append(&dev, &kv, bk.ptr(), bv.ptr(), 0, 3).unwrap();
        assert!(attention::kv_append(&dev, &kv, bk.at(3 * width * 4), bv.at(3 * width * 4), 3, 3).is_err());
        kv.reserve(&dev, 3, 6).unwrap();
        assert_eq!(kv.capacity(), 8);
        attention::kv_append(&dev, &kv, bk.at(3 * width * 4), bv.at(3 * width * 4), 3, 3).unwrap();
        let (gk, gv) = kv.download_rows(6).unwrap();
        let conv = |x: &[f32]| -> Vec<f32> {
            match ty {
                KvDtype::F32 => x.to_vec(),
                KvDtype::F16 => x.iter().map(|&e| f16_round(e)).collect(),
                // The CPU cache's dequantized values.
                KvDtype::Q8_0 | KvDtype::Q4_0 => cpu_rows(ty, width, 64, x).to_f32(),
            }
        };
        assert_eq!(gk, conv(&k), "{ty:?} keys");
        assert_eq!(gv, conv(&v), "{ty:?} values");
        // A fork holds the first rows, zero after.
        let fork = kv.duplicate(&dev, 2).unwrap();
        assert_eq!(fork.capacity(), kv.capacity());
        let (fk, fv) = fork.download_rows(3).unwrap();
        assert_eq!(fk[..2 * width], gk[..2 * width]);
        assert_eq!(fv[..2 * width], gv[..2 * width]);
        assert!(fk[2 * width..].iter().chain(&fv[2 * width..]).all(|&e| e == 0.0));
    }
}

/// Rows of 4 blocks of 32 with the quantizers' corner cases, then `random` rows of values().
fn awkward_rows(random: usize, seed: u32) -> Vec<f32> {
    let mut x = Vec::new();
    // Q8_0 with d = 1 (max 127): halves round away from zero; Q4_0 with d = 1 (max −8).
    let mut b: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.5).collect();
    b[31] = 127.0;
    x.extend(&b);
    b[31] = -8.0;
    x.extend(b.iter().map(|v| v.clamp(-8.0, 7.5)));
    // All zero (Q4_0's d is −0 then), and ±0 only.
    x.extend([0.0f32; 32]);
    x.extend((0..32).map(|i| if i % 2 == 0 { -0.0f32 } else { 0.0 }));
    // Ties of magnitude (the first wins Q4_0's max), either sign first.
    x.extend((0..32).map(|i| match i {
        3 => -3.0f32,
        9 => 3.0,
        _ => (i as f32) * 0.05 - 0.8,
    }));
    x.extend((0..32).map(|i| match i {
        3 => 3.0f32,
        9 => -3.0,
        _ => (i as f32) * 0.05 - 0.8,
    }));
    // A scale in f16's subnormals, one past its range (inf), a NaN and an infinity among values.
    x.extend(values(32, seed).iter().map(|v| v * 1e-6));
    x.extend(values(32, seed + 1).iter().map(|v| v * 1e7));
    let mut n = values(32, seed + 2);
    n[5] = f32::NAN;
    x.extend(&n);
    n[5] = f32::INFINITY;
    x.extend(&n);
    // Peaks: one large value among small ones.
    let mut p = values(32, seed + 3);
    p[17] = -40.0;
    x.extend(&p);
    p[17] = 40.0;
    x.extend(&p);
    x.extend(values(random * 128, seed + 4).iter().map(|v| 4.0 * v));
    x
}

#[test]
fn quantized_kv_append_gives_the_cpu_bytes() {
    let dev = device();
    let width = 128; // 2 heads of 64: 4 blocks a row
    for ty in [KvDtype::Q8_0, KvDtype::Q4_0] {
        let (k, v) = (awkward_rows(7, 30), awkward_rows(7, 40));
        let rows = k.len() / width;
        let mut kv = DeviceKv::new(&dev, ty, width, 2).unwrap();
        let (bk, bv) = (Buffer::from_f32(&dev, &k).unwrap(), Buffer::from_f32(&dev, &v).unwrap());
        // Two rows, then the rest at position 2 (after growing), as a prefill and more.
        attention::kv_append(&dev, &kv, bk.ptr(), bv.ptr(), 0, 2).unwrap();
        kv.reserve(&dev, 2, rows).unwrap();
        attention::kv_append(&dev, &kv, bk.at(2 * width * 4), bv.at(2 * width * 4), 2, rows - 2).unwrap();
        let (gk, gv) = kv.download_raw(rows).unwrap();
        let (ck, cv) = (cpu_rows(ty, width, 64, &k), cpu_rows(ty, width, 64, &v));
        for (name, got, want) in [("keys", &gk, ck.raw_rows(0..rows)), ("values", &gv, cv.raw_rows(0..rows))] {
            assert_eq!(got.len(), want.len(), "{ty:?} {name}");
            let bb = if ty == KvDtype::Q8_0 { 34 } else { 18 };
            if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
                let b = i / bb;
                panic!(
                    "{ty:?} {name}: byte {i} (block {b}, row {}) differs: device {:?}, CPU {:?}",
                    b / (width / 32),
                    &got[b * bb..][..bb],
                    &want[b * bb..][..bb]
                );
            }
        }
    }
}

#[test]
fn block_caches_need_widths_in_blocks_of_32() {
    let dev = device();
    for ty in [KvDtype::Q8_0, KvDtype::Q4_0] {
        let e = DeviceKv::new(&dev, ty, 2 * 40, 4).unwrap_err().to_string();
        assert!(e.contains("width 80") && e.contains("32"), "{e}");
        assert!(DeviceKv::new(&dev, ty, 3 * 32, 4).is_ok());
    }
    assert!(DeviceKv::new(&dev, KvDtype::F16, 2 * 40, 4).is_ok());
}

#[test]
fn reserve_keeps_the_first_rows() {
    let dev = device();
    let width = 4 * 32;
    let mut kv = DeviceKv::new(&dev, KvDtype::F16, width, 5).unwrap();
    let (k, v) = (values(5 * width, 20), values(5 * width, 21));
    let (bk, bv) = (Buffer::from_f32(&dev, &k).unwrap(), Buffer::from_f32(&dev, &v).unwrap());
    attention::kv_append(&dev, &kv, bk.ptr(), bv.ptr(), 0, 5).unwrap();
    let before = kv.download_rows(5).unwrap();
    kv.reserve(&dev, 5, 3).unwrap(); // fits: nothing changes
    assert_eq!(kv.capacity(), 5);
    kv.reserve(&dev, 4, 23).unwrap();
    assert_eq!(kv.capacity(), 23);
    let (gk, gv) = kv.download_rows(5).unwrap();
    assert_eq!(gk[..4 * width], before.0[..4 * width]);
    assert_eq!(gv[..4 * width], before.1[..4 * width]);
    // Row 4 was not kept.
    assert!(gk[4 * width..].iter().chain(&gv[4 * width..]).all(|&e| e == 0.0));
}

/// Causal GQA attention in f64 over the cache's values `kc`/`vc` (`[pos0+t, kv_heads·dh]`).
#[allow(clippy::too_many_arguments)]
fn reference(q: &[f32], kc: &[f32], vc: &[f32], t: usize, pos0: usize, hq: usize, hkv: usize, dh: usize) -> Vec<f32> {
    let (group, width, scale) = (hq / hkv, hkv * dh, 1.0 / (dh as f64).sqrt());
    let mut out = vec![0.0f32; t * hq * dh];
    for i in 0..t {
        for h in 0..hq {
            let qh = &q[(i * hq + h) * dh..][..dh];
            let kvh = h / group;
            let n = pos0 + i + 1;
            let s: Vec<f64> = (0..n)
                .map(|j| {
                    let kr = &kc[j * width + kvh * dh..][..dh];
                    qh.iter().zip(kr).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = p.iter().sum();
            for d in 0..dh {
                let o: f64 = (0..n).map(|j| p[j] * vc[j * width + kvh * dh + d] as f64).sum();
                out[(i * hq + h) * dh + d] = (o / l) as f32;
            }
        }
    }
    out
}

struct Case {
    ty: KvDtype,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    t: usize,
    pos0: usize,
}

/// Fills a cache with `pos0 + t` rows (appended in two calls, as a prefill then a step), runs
/// every path on it and checks each against [`reference`] over the cache's own (f16-rounded
/// for an f16 cache, dequantized for Q8_0/Q4_0) values. Returns the worst relative error.
fn check(dev: &Gpu, c: &Case, paths: &[AttnPath], seed: u32) -> f32 {
    let Case { ty, heads, kv_heads, head_dim, t, pos0 } = *c;
    let (width, total) = (kv_heads * head_dim, pos0 + t);
    // Larger queries than values() gives, for peakier softmaxes.
    let q: Vec<f32> = values(t * heads * head_dim, seed).iter().map(|x| 3.0 * x).collect();
    let (k, v) = (values(total * width, seed + 1), values(total * width, seed + 2));
    let mut kv = DeviceKv::new(dev, ty, width, pos0.max(1)).unwrap();
    let (bk, bv) = (Buffer::from_f32(dev, &k).unwrap(), Buffer::from_f32(dev, &v).unwrap());
    attention::kv_append(dev, &kv, bk.ptr(), bv.ptr(), 0, pos0).unwrap();
    kv.reserve(dev, pos0, total).unwrap();
    attention::kv_append(dev, &kv, bk.at(pos0 * width * 4), bv.at(pos0 * width * 4), pos0, t).unwrap();
    let (kc, vc) = kv.download_rows(total).unwrap();
    if ty.block_type().is_some() {
        // The values the device holds are the CPU cache's.
        assert_eq!(kc, cpu_rows(ty, width, head_dim, &k).to_f32(), "{ty:?} keys");
        assert_eq!(vc, cpu_rows(ty, width, head_dim, &v).to_f32(), "{ty:?} values");
    }
    let want = reference(&q, &kc, &vc, t, pos0, heads, kv_heads, head_dim);
    let peak = want.iter().fold(0.0f32, |a, &b| a.max(b.abs()));
    let bq = Buffer::from_f32(dev, &q).unwrap();
    let out = Buffer::zeroed(dev, want.len() * 4).unwrap();
    let mut scratch = AttnScratch::new();
    let mut worst = 0.0f32;
    for &path in paths {
        out.write_f32(&vec![f32::NAN; want.len()]).unwrap();
        let scale = 1.0 / (head_dim as f32).sqrt();
        attention::attention_with(
            dev,
            bq.ptr(),
            &kv,
            out.ptr(),
            t,
            pos0,
            heads,
            kv_heads,
            head_dim,
            scale,
            path,
            &mut scratch,
        )
        .unwrap();
        let got = out.to_f32().unwrap();
        let rel = max_diff(&got, &want) / peak;
        let at = format!("{ty:?} heads {heads}/{kv_heads} head_dim {head_dim} t {t} pos0 {pos0} {path:?}");
        assert!(rel < 1e-4, "{at}: max |Δ| / max |want| = {rel}");
        worst = worst.max(rel);
    }
    worst
}

const BOTH: [AttnPath; 2] = [AttnPath::SplitK { chunk: None }, AttnPath::Tiled];

#[test]
fn attention_matches_the_reference_at_head_dim_64() {
    let dev = device();
    for ty in ALL {
        for (t, pos0) in [(1, 0), (1, 37), (5, 0), (20, 11)] {
            let c = Case { ty, heads: 8, kv_heads: 2, head_dim: 64, t, pos0 };
            check(&dev, &c, &BOTH, 100 + t as u32);
        }
    }
}

#[test]
fn attention_matches_the_reference_at_head_dim_256() {
    let dev = device();
    for ty in ALL {
        for (t, pos0) in [(1, 0), (1, 37), (5, 0), (20, 11)] {
            // Qwen3.5's full-attention shape: 16 query heads on 4 KV heads of 256.
            let c = Case { ty, heads: 16, kv_heads: 4, head_dim: 256, t, pos0 };
            check(&dev, &c, &BOTH, 200 + t as u32);
        }
    }
}

#[test]
fn attention_takes_other_shapes() {
    let dev = device();
    // head_dim 128 (llama), 8:1 GQA (8 heads a block), MQA with 12 heads (6 a block, 2 blocks),
    // and the automatic choice.
    for (heads, kv_heads, head_dim) in [(8, 2, 128), (16, 2, 64), (12, 1, 96)] {
        for (t, pos0) in [(1, 9), (3, 4), (17, 2)] {
            let c = Case { ty: KvDtype::F16, heads, kv_heads, head_dim, t, pos0 };
            check(&dev, &c, &[AttnPath::Auto, AttnPath::SplitK { chunk: Some(8) }, AttnPath::Tiled], 300);
        }
    }
}

#[test]
fn split_k_decoding_over_several_chunks_matches() {
    let dev = device();
    // 300 keys: chunks of 128 (three), of 100 (not a tile's multiple), of 1000 (one block, three
    // tiles of its online softmax), the default; the tiled kernel over 19 key tiles.
    let c = Case { ty: KvDtype::F16, heads: 8, kv_heads: 2, head_dim: 256, t: 1, pos0: 299 };
    let paths = [
        AttnPath::SplitK { chunk: Some(128) },
        AttnPath::SplitK { chunk: Some(100) },
        AttnPath::SplitK { chunk: Some(1000) },
        AttnPath::Auto,
        AttnPath::Tiled,
    ];
    check(&dev, &c, &paths, 400);
    // Three rows over 257 keys in chunks of 128: the first row's third chunk is empty.
    let c = Case { ty: KvDtype::F32, heads: 4, kv_heads: 1, head_dim: 64, t: 3, pos0: 254 };
    check(&dev, &c, &[AttnPath::SplitK { chunk: Some(128) }, AttnPath::Tiled], 500);
    // Block caches over several chunks and key tiles, head_dim 128 (llama's).
    for ty in [KvDtype::Q8_0, KvDtype::Q4_0] {
        let c = Case { ty, heads: 8, kv_heads: 2, head_dim: 128, t: 2, pos0: 150 };
        check(&dev, &c, &[AttnPath::SplitK { chunk: Some(64) }, AttnPath::Tiled], 600);
    }
}

#[test]
fn attention_rejects_bad_shapes() {
    let dev = device();
    let kv = DeviceKv::new(&dev, KvDtype::F32, 2 * 64, 8).unwrap();
    let buf = Buffer::zeroed(&dev, 16 * 4 * 64 * 4).unwrap();
    let mut s = AttnScratch::new();
    let run = |t, pos0, heads, kv_heads, dh, s: &mut AttnScratch| {
        attention::attention(&dev, buf.ptr(), &kv, buf.ptr(), t, pos0, heads, kv_heads, dh, 0.125, s)
    };
    assert!(run(2, 7, 4, 2, 64, &mut s).is_err(), "past the capacity");
    assert!(run(1, 0, 3, 2, 64, &mut s).is_err(), "heads not a multiple of kv_heads");
    assert!(run(1, 0, 4, 2, 32, &mut s).is_err(), "width mismatch");
    assert!(run(1, 0, 4, 1, 64, &mut s).is_err(), "width mismatch");
    let wide = DeviceKv::new(&dev, KvDtype::F32, 512, 8).unwrap();
    assert!(attention::attention(&dev, buf.ptr(), &wide, buf.ptr(), 1, 0, 1, 1, 512, 0.1, &mut s).is_err());
}
