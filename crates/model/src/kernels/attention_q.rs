//! One new token's attention (decode) with an online softmax: against a quantized KV cache
//! (keys and values stored as ggml Q8_0 or Q4_0 blocks, `--kv-cache q8_0|q4_0`,
//! [`crate::cache::KvRows`]) the way llama.cpp's CPU flash attention treats a quantized K, and
//! against a long f16 cache ([`causal_one_f16`]), the cache read once.
//!
//! - Each query head is quantized once to Q8_0 ([`QuantizedActs`], as a matmul quantizes its
//!   activations), and a key's score is the integer block dot of its Q8_0 (or Q4_0) blocks with
//!   it: `s = (Σ_b fma(d_k·d_q, Σ_i k_i·q_i)) · scale`, the integer sums exact, the blocks added
//!   in order with one fused multiply-add each.
//! - A work item is one KV head and one chunk of keys (all of [`chunk_len`] but the last). It
//!   walks its keys in tiles of [`TILE`]: the tile's key blocks are unpacked and its value rows
//!   dequantized (`d·q`, exact in f32) once, and every query head of the KV head (GQA) then takes
//!   an online-softmax step on them: `m' = max(m, max_j s_j)`, `α = expf(m − m')`,
//!   `p_j = expf(s_j − m')`, `l = l·α + Σp` (eight lanes, key `j` in lane `j mod 8`, then a
//!   fixed tree), `o = o·α`, then `o += p_j·v_j` for `j` ascending (fused).
//! - The chunks of a KV head are combined in order: `M = max m_c`, `f_c = expf(m_c − M)`,
//!   `L = Σ fma(l_c, f_c)`, `O = Σ fma(o_c, f_c)`, output `O / L`. Chunks make long contexts run
//!   on every thread when the KV heads are fewer than the threads (SmolLM2 has 3 KV heads,
//!   Qwen3.5-4B 4); their length depends only on the context length, so a result does not depend
//!   on the thread count.
//!
//! On an f16 cache ([`causal_one_f16`], what one token takes on heads of 64·k) the query
//! stays f32 (for Qwen3.5 rounded to f16 first, as llama.cpp's f16 K·Q does) and a key's
//! score is `ggml_vec_dot_f16`'s sum, the bits of llama.cpp's non-flash decode; the value
//! rows are converted from f16 as they are loaded, and the rest is the steps above. Its vector kernel takes one chunk of keys of
//! every KV head per work item, so that an item reads whole cache rows as they lie in memory
//! (a KV head's share of a Qwen3.5-4B row is a quarter of it), and asks for the next tile's
//! rows ahead. Against llama.cpp's order (64 value sums per head, kept in L2 for a head of
//! 256) it runs a Qwen3.5-4B layer at 32K keys about 2× faster on two threads.
//!
//! [`causal_one_reference`] is the plain version; the vector kernels (AVX-512 VNNI `vpdpbusd`,
//! or AVX2 `maddubs`, for the integer dots, the repo's matmul dots in `quant::x86`; AVX2 FMA
//! for the rest, but the softmax step in 512-bit registers where the CPU has AVX-512F)
//! compute the same operations in the same order, so tests hold them to it bit for bit.
//! Against exact attention on the dequantized cache the differences are the query's 8-bit
//! rounding and f32 rounding (tests state the bounds).

use std::ops::Range;

use rayon::prelude::*;

use super::attention::AttnShape;
use super::flash::tree8;
use crate::cache::KvRows;
use crate::quant::{f16_at, ggml, ActFormat, QuantType, QuantizedActs};

/// Keys per tile: the unit of the online softmax (a tile's value rows, dequantized, take
/// `TILE · head_dim · 4` bytes: 32 KiB at a head of 256, in L1 while every head reads them).
pub const TILE: usize = 32;

/// A chunk for every this many keys: short contexts too are cut in a few chunks, so that
/// every thread takes a share (with one chunk below 512 keys, SmolLM2's decode at 150
/// positions on two threads ran 10 % slower than llama.cpp's order, which cuts by heads; with
/// chunks of 128 it runs 6 % faster, and 4 % faster than chunks of 512 after 8K). Shorter
/// work items would not pay for their partial sums.
pub const KEYS_PER_CHUNK: usize = 128;

/// Chunks of one KV head at most (their partial sums are kept until the combination).
pub const MAX_CHUNKS: usize = 64;

/// Keys per chunk for a context of `n` keys: `n` cut into `⌈n / KEYS_PER_CHUNK⌉` chunks (at
/// most [`MAX_CHUNKS`]) of equal length, rounded up to whole tiles (the last chunk shorter).
pub fn chunk_len(n: usize) -> usize {
    let chunks = n.div_ceil(KEYS_PER_CHUNK).clamp(1, MAX_CHUNKS);
    n.max(1).div_ceil(chunks).div_ceil(TILE) * TILE
}

/// Whether [`causal_one`] takes this cache: keys and values both in ggml blocks.
pub fn supports(k: &KvRows, v: &KvRows) -> bool {
    k.blocks().is_some() && v.blocks().is_some()
}

/// One token's causal attention (`s.t == 1`) of `q` (`[heads · head_dim]`) against the
/// quantized cache `k`/`v` (`pos0 + 1` rows, Q8_0 or Q4_0 blocks): the vector kernel this CPU
/// has (AVX-512 VNNI, else AVX2 with FMA and F16C), else [`causal_one_reference`]; the same
/// bits either way. Returns `[heads · head_dim]`.
pub fn causal_one(q: &[f32], k: &KvRows, v: &KvRows, s: AttnShape) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if let Some(isa) = x86::Isa::best() {
        return x86::causal_one(isa, q, k, v, s);
    }
    causal_one_reference(q, k, v, s)
}

/// [`causal_one`] in plain code, one element at a time (the vector kernels' test reference,
/// and what CPUs without AVX2 run).
pub fn causal_one_reference(q: &[f32], k: &KvRows, v: &KvRows, s: AttnShape) -> Vec<f32> {
    run(&Ctx::new(q, k, v, s), s, item_reference, |p, dh, og| combine(p, dh, 0, og))
}

/// Whether [`causal_one_f16`] takes a call of shape `s`: one token on heads of whole steps of
/// 64 (the step of `ggml_vec_dot_f16`'s order, which its scores keep).
pub fn supports_f16(s: &AttnShape) -> bool {
    s.t == 1 && s.head_dim.is_multiple_of(64)
}

/// One token's causal attention of `q` (`[heads · head_dim]`) against an f16 cache (`kc`/`vc`,
/// f16 bits, `pos0 + 1` rows of `kv_heads · head_dim`), online: each key scored in
/// `ggml_vec_dot_f16`'s order (the bits of llama.cpp's non-flash f16 K·Q), then the tiles,
/// chunks and combination of the quantized kernel, with the weights and value sums in f32. The
/// vector kernel this CPU has (512-bit with AVX-512, else AVX2 with FMA and F16C), else
/// [`causal_one_f16_reference`]; the same bits either way. `s` must pass [`supports_f16`].
pub fn causal_one_f16(q: &[f32], kc: &[u16], vc: &[u16], s: AttnShape) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if let Some(isa) = super::attention::x86::Isa::best() {
        return x86::causal_one_f16(isa, q, kc, vc, s);
    }
    causal_one_f16_reference(q, kc, vc, s)
}

/// [`causal_one_f16`] in plain code (the vector kernels' test reference).
pub fn causal_one_f16_reference(q: &[f32], kc: &[u16], vc: &[u16], s: AttnShape) -> Vec<f32> {
    run(&F16Ctx::new(q, kc, vc, s), s, item_reference, |p, dh, og| combine(p, dh, 0, og))
}

/// What one work item leaves for the combination, per query head of its KV head: the running
/// maximum `m`, the weight sum `l` and the unnormalised value sums `acc` (`head_dim` each).
struct Partial {
    m: Vec<f32>,
    l: Vec<f32>,
    acc: Vec<f32>,
}

impl Partial {
    fn new(heads: usize, dh: usize) -> Self {
        Partial { m: vec![f32::NEG_INFINITY; heads], l: vec![0.0; heads], acc: vec![0.0; heads * dh] }
    }
}

/// The inputs every work item reads.
struct Ctx<'a> {
    /// The query heads quantized to Q8_0, one row per head.
    qa: QuantizedActs,
    kt: QuantType,
    kb: &'a [u8],
    vt: QuantType,
    vb: &'a [u8],
    hkv: usize,
    dh: usize,
    group: usize,
    scale: f32,
}

impl<'a> Ctx<'a> {
    fn new(q: &[f32], k: &'a KvRows, v: &'a KvRows, s: AttnShape) -> Self {
        let AttnShape { t, pos0, heads: hq, kv_heads: hkv, head_dim: dh, scale } = s;
        let ((kt, kb), (vt, vb)) = match (k.blocks(), v.blocks()) {
            (Some(kb), Some(vb)) => (kb, vb),
            _ => panic!("causal_one takes a Q8_0/Q4_0 cache, not {}/{}", k.kv_type(), v.kv_type()),
        };
        assert!(t == 1 && dh.is_multiple_of(32), "causal_one takes one token and heads of 32·k, not t={t} dh={dh}");
        assert_eq!(q.len(), hq * dh, "query of {hq} heads of {dh}");
        assert!(hkv > 0 && hq.is_multiple_of(hkv), "{hq} query heads on {hkv} KV heads");
        assert_eq!((k.len(), v.len()), (pos0 + 1, pos0 + 1), "the cache holds pos0 + 1 rows");
        assert_eq!((k.width(), v.width(), k.head_dim()), (hkv * dh, hkv * dh, dh), "cache rows do not match the shape");
        let qa = QuantizedActs::new(ActFormat::Q8_0, q, hq);
        Ctx { qa, kt, kb, vt, vb, hkv, dh, group: hq / hkv, scale }
    }

    /// Byte offset of KV head `kvh` of row `j` in blocks of `ty`.
    #[inline(always)]
    fn at(&self, ty: QuantType, j: usize, kvh: usize) -> usize {
        (j * self.hkv + kvh) * (self.dh / 32) * ty.block_bytes()
    }
}

/// The inputs every work item of [`causal_one_f16`] reads.
struct F16Ctx<'a> {
    /// The query heads (for Qwen3.5 already rounded to f16, as llama.cpp's f16 K·Q does).
    q: &'a [f32],
    /// Key rows, f16 bits.
    kc: &'a [u16],
    /// Value rows, f16 bits.
    vc: &'a [u16],
    /// Keys in the context.
    n: usize,
    hkv: usize,
    dh: usize,
    group: usize,
    scale: f32,
}

impl<'a> F16Ctx<'a> {
    fn new(q: &'a [f32], kc: &'a [u16], vc: &'a [u16], s: AttnShape) -> Self {
        let AttnShape { pos0, heads: hq, kv_heads: hkv, head_dim: dh, scale, .. } = s;
        assert!(supports_f16(&s), "causal_one_f16 takes one token and heads of 64·k, not t={} dh={dh}", s.t);
        assert_eq!(q.len(), hq * dh, "query of {hq} heads of {dh}");
        assert!(hkv > 0 && hq.is_multiple_of(hkv), "{hq} query heads on {hkv} KV heads");
        let n = pos0 + 1;
        assert_eq!((kc.len(), vc.len()), (n * hkv * dh, n * hkv * dh), "the cache holds pos0 + 1 rows of {hkv}·{dh}");
        F16Ctx { q, kc, vc, n, hkv, dh, group: hq / hkv, scale }
    }

    /// Element offset of KV head `kvh` of row `j`.
    #[inline(always)]
    fn at(&self, j: usize, kvh: usize) -> usize {
        (j * self.hkv + kvh) * self.dh
    }
}

/// What the plain work item ([`item_reference`]) reads of a cache: scores and value rows.
trait PlainRows: Sync {
    /// Query heads per KV head, and dimensions per head.
    fn group_dh(&self) -> (usize, usize);
    /// Query head `qh`'s score against key `j` (KV head `kvh`), scaled.
    fn score(&self, qh: usize, kvh: usize, j: usize) -> f32;
    /// The value row of key `j` (KV head `kvh`) in f32 (exact).
    fn value_row(&self, kvh: usize, j: usize, out: &mut [f32]);
}

impl PlainRows for Ctx<'_> {
    fn group_dh(&self) -> (usize, usize) {
        (self.group, self.dh)
    }

    fn score(&self, qh: usize, kvh: usize, j: usize) -> f32 {
        score_reference(self, qh, kvh, j)
    }

    fn value_row(&self, kvh: usize, j: usize, out: &mut [f32]) {
        let (at, len) = (self.at(self.vt, j, kvh), self.dh / 32 * self.vt.block_bytes());
        crate::quant::dequantize(self.vt, &self.vb[at..at + len], out);
    }
}

impl PlainRows for F16Ctx<'_> {
    fn group_dh(&self) -> (usize, usize) {
        (self.group, self.dh)
    }

    fn score(&self, qh: usize, kvh: usize, j: usize) -> f32 {
        let dh = self.dh;
        let at = self.at(j, kvh);
        let k: Vec<f32> = self.kc[at..at + dh].iter().map(|&b| half::f16::from_bits(b).to_f32()).collect();
        ggml::F16Dot::Vec.dot(&self.q[qh * dh..(qh + 1) * dh], &k, dh) * self.scale
    }

    fn value_row(&self, kvh: usize, j: usize, out: &mut [f32]) {
        let at = self.at(j, kvh);
        for (o, &b) in out.iter_mut().zip(&self.vc[at..at + self.dh]) {
            *o = half::f16::from_bits(b).to_f32();
        }
    }
}

/// A worker's buffers, reused across the items it takes.
#[derive(Default)]
struct Scratch {
    /// The tile's key blocks unpacked to 32 bytes each, `[block][key]` (vector kernels).
    kq: Vec<u8>,
    /// The tile's key block scales (f16 bits), `[block][key]` (vector kernels).
    kd: Vec<u16>,
    /// The tile's value rows dequantized, `[key][head_dim]`.
    vt: Vec<f32>,
    /// Scores, then weights, of the tile, `[head][TILE]`.
    sc: Vec<f32>,
    /// Each head's `α` of the tile (the f16 kernels).
    alpha: Vec<f32>,
}

impl Scratch {
    fn prepare(&mut self, group: usize, dh: usize) {
        self.kq.resize(dh * TILE, 0);
        self.kd.resize(dh / 32 * TILE, 0);
        self.vt.resize(TILE * dh, 0.0);
        self.sc.resize(group * TILE, 0.0);
        self.alpha.resize(group, 1.0);
    }
}

/// The driver: work items (KV head, chunk) in parallel on the cache `c`, then each KV head's
/// chunks combined.
fn run<X, I, C>(c: &X, s: AttnShape, item: I, combine: C) -> Vec<f32>
where
    X: Sync,
    I: Fn(&X, usize, Range<usize>, &mut Scratch) -> Partial + Sync,
    C: Fn(&[Partial], usize, &mut [f32]) + Sync,
{
    let (group, dh) = (s.heads / s.kv_heads, s.head_dim);
    let n = s.pos0 + 1;
    let cl = chunk_len(n);
    let nc = n.div_ceil(cl);
    let parts: Vec<Partial> = (0..s.kv_heads * nc)
        .into_par_iter()
        .map_init(Scratch::default, |w, i| {
            let (kvh, ch) = (i / nc, i % nc);
            item(c, kvh, ch * cl..((ch + 1) * cl).min(n), w)
        })
        .collect();
    let mut o = vec![0.0f32; s.heads * dh];
    o.par_chunks_mut(group * dh).zip(parts.par_chunks(nc)).for_each(|(og, pg)| combine(pg, dh, og));
    o
}

/// [`run`] with one work item per chunk of keys over every KV head (an item reads its
/// chunk's rows whole, as they lie in memory, where one KV head's rows are a quarter of each
/// row of Qwen3.5-4B's cache), then each KV head's chunks combined. The same bits as [`run`]
/// when `item` computes for each head what [`run`]'s computes for its KV head.
fn run_chunks<X, I, C>(c: &X, s: AttnShape, item: I, combine: C) -> Vec<f32>
where
    X: Sync,
    I: Fn(&X, Range<usize>, &mut Scratch) -> Partial + Sync,
    C: Fn(&[Partial], usize, usize, &mut [f32]) + Sync,
{
    let (group, dh) = (s.heads / s.kv_heads, s.head_dim);
    let n = s.pos0 + 1;
    let cl = chunk_len(n);
    let parts: Vec<Partial> = (0..n.div_ceil(cl))
        .into_par_iter()
        .map_init(Scratch::default, |w, ch| item(c, ch * cl..((ch + 1) * cl).min(n), w))
        .collect();
    let mut o = vec![0.0f32; s.heads * dh];
    o.par_chunks_mut(group * dh).enumerate().for_each(|(kvh, og)| combine(&parts, dh, kvh * group, og));
    o
}

/// The chunks (`parts`, in order) of the heads from `h0` on combined into their outputs `og`.
#[inline(always)]
fn combine(parts: &[Partial], dh: usize, h0: usize, og: &mut [f32]) {
    for (h, oh) in og.chunks_exact_mut(dh).enumerate() {
        let h = h0 + h;
        let mm = parts.iter().fold(f32::NEG_INFINITY, |a, p| a.max(p.m[h]));
        let mut l = 0.0f32;
        oh.fill(0.0);
        for p in parts {
            let f = ggml::expf(p.m[h] - mm);
            l = p.l[h].mul_add(f, l);
            for (o, a) in oh.iter_mut().zip(&p.acc[h * dh..(h + 1) * dh]) {
                *o = a.mul_add(f, *o);
            }
        }
        oh.iter_mut().for_each(|o| *o /= l);
    }
}

/// Query head `qh`'s score against key `j` (KV head `kvh`), plain.
fn score_reference(c: &Ctx, qh: usize, kvh: usize, j: usize) -> f32 {
    let (dh, nb, bb) = (c.dh, c.dh / 32, c.kt.block_bytes());
    let base = c.at(c.kt, j, kvh);
    let mut s = 0.0f32;
    for b in 0..nb {
        let blk = &c.kb[base + b * bb..base + (b + 1) * bb];
        let y = &c.qa.qs[qh * dh + 32 * b..qh * dh + 32 * (b + 1)];
        let isum: i32 = match c.kt {
            QuantType::Q8_0 => (0..32).map(|i| blk[2 + i] as i8 as i32 * y[i] as i32).sum(),
            _ => (0..16)
                .map(|i| {
                    ((blk[2 + i] & 0xF) as i32 - 8) * y[i] as i32 + ((blk[2 + i] >> 4) as i32 - 8) * y[i + 16] as i32
                })
                .sum(),
        };
        let dd = f16_at(blk, 0) * c.qa.d[qh * nb + b];
        s = dd.mul_add(isum as f32, s);
    }
    s * c.scale
}

/// One work item in plain code: KV head `kvh`, keys `keys`.
fn item_reference<X: PlainRows>(c: &X, kvh: usize, keys: Range<usize>, w: &mut Scratch) -> Partial {
    let (g, dh) = c.group_dh();
    w.prepare(g, dh);
    let mut p = Partial::new(g, dh);
    for t0 in keys.clone().step_by(TILE) {
        let live = TILE.min(keys.end - t0);
        for jj in 0..live {
            c.value_row(kvh, t0 + jj, &mut w.vt[jj * dh..(jj + 1) * dh]);
        }
        for h in 0..g {
            let sc = &mut w.sc[h * TILE..(h + 1) * TILE];
            for (jj, s) in sc.iter_mut().enumerate().take(live) {
                *s = c.score(kvh * g + h, kvh, t0 + jj);
            }
            let mt = sc[..live].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let m_new = p.m[h].max(mt);
            let alpha = ggml::expf(p.m[h] - m_new);
            p.m[h] = m_new;
            let mut lanes = [0.0f32; 8];
            for (jj, x) in sc.iter_mut().enumerate() {
                *x = if jj < live { ggml::expf(*x - m_new) } else { 0.0 };
                lanes[jj % 8] += *x;
            }
            p.l[h] = p.l[h] * alpha + tree8(&lanes);
            for (e, o) in p.acc[h * dh..(h + 1) * dh].iter_mut().enumerate() {
                let mut acc = *o * alpha;
                for (jj, &pj) in sc.iter().enumerate().take(live) {
                    acc = pj.mul_add(w.vt[jj * dh + e], acc);
                }
                *o = acc;
            }
        }
    }
    p
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    //! The vector kernels: [`item_vnni`] and [`item_avx2`] differ only in the integer dot of
    //! the scores (`vpdpbusd` on unsigned key bytes, or `maddubs`); the tile's unpacking, the
    //! softmax step and the value sums are shared AVX2 + FMA code. Eight keys' scores at a time,
    //! one per lane: the tile's key blocks transposed once for all the heads, so that each
    //! key's block sum builds up in its own lane, the block scales one lane per key.

    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{combine, run, run_chunks, tree8, Ctx, F16Ctx, Partial, Scratch, TILE};
    use crate::cache::KvRows;
    use crate::kernels::attention::x86::{scores_one_token, Isa as F16Isa};
    use crate::kernels::attention::AttnShape;
    use crate::kernels::flash::x86::add_weighted_rows;
    use crate::kernels::flash::x86_512::softmax_step_512 as flash_step_512;
    use crate::quant::ggml::{self, x86::expf8};
    use crate::quant::x86::{dot_i8, dot_u8_i8, nibbles};
    use crate::quant::QuantType;

    /// Which vector kernel runs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Isa {
        /// AVX-512 VNNI (with VL) for the integer dots, the softmax step in 512-bit registers,
        /// AVX2, FMA and F16C for the rest.
        Vnni,
        /// AVX2 with FMA and F16C.
        Avx2,
    }

    impl Isa {
        /// Every kernel, fastest first.
        pub(crate) const ALL: [Isa; 2] = [Isa::Vnni, Isa::Avx2];

        /// Whether this CPU runs the kernel.
        pub(crate) fn supported(self) -> bool {
            let avx2 =
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
            match self {
                Isa::Vnni => {
                    avx2 && is_x86_feature_detected!("avx512f")
                        && is_x86_feature_detected!("avx512vl")
                        && is_x86_feature_detected!("avx512vnni")
                }
                Isa::Avx2 => avx2,
            }
        }

        /// The fastest kernel this CPU runs, if any.
        pub(crate) fn best() -> Option<Isa> {
            Isa::ALL.into_iter().find(|isa| isa.supported())
        }
    }

    /// [`super::causal_one`] on the kernel `isa` (which this CPU must run: checked).
    pub(crate) fn causal_one(isa: Isa, q: &[f32], k: &KvRows, v: &KvRows, s: AttnShape) -> Vec<f32> {
        assert!(isa.supported(), "the {isa:?} quantized-cache attention kernel needs a CPU that has it");
        // SAFETY (every call below): the features each kernel needs were checked just above.
        let combine = |p: &[Partial], dh: usize, og: &mut [f32]| unsafe { combine_fma(p, dh, 0, og) };
        let c = &Ctx::new(q, k, v, s);
        match isa {
            Isa::Vnni => run(
                c,
                s,
                |c, kvh, keys, w| unsafe {
                    if c.kt == QuantType::Q8_0 {
                        item_vnni::<false>(c, kvh, keys, w)
                    } else {
                        item_vnni::<true>(c, kvh, keys, w)
                    }
                },
                combine,
            ),
            Isa::Avx2 => run(
                c,
                s,
                |c, kvh, keys, w| unsafe {
                    if c.kt == QuantType::Q8_0 {
                        item_avx2::<false>(c, kvh, keys, w)
                    } else {
                        item_avx2::<true>(c, kvh, keys, w)
                    }
                },
                combine,
            ),
        }
    }

    /// [`super::causal_one_f16`] on the kernel `isa` of `kernels::attention`, whose scores it
    /// takes (which this CPU must run: checked): 512-bit steps need AVX-512F, not VNNI.
    pub(crate) fn causal_one_f16(isa: F16Isa, q: &[f32], kc: &[u16], vc: &[u16], s: AttnShape) -> Vec<f32> {
        assert!(isa.supported(), "the {isa:?} one-token attention kernel needs a CPU that has it");
        // SAFETY (every call below): the features each kernel needs were checked just above.
        let combine = |p: &[Partial], dh: usize, h0: usize, og: &mut [f32]| unsafe { combine_fma(p, dh, h0, og) };
        let c = &F16Ctx::new(q, kc, vc, s);
        match isa {
            F16Isa::Avx512 => run_chunks(c, s, |c, keys, w| unsafe { item_f16_512(c, keys, w) }, combine),
            F16Isa::Avx2 => run_chunks(c, s, |c, keys, w| unsafe { item_f16_avx2(c, keys, w) }, combine),
        }
    }

    /// One work item on an f16 cache (keys `keys` of every KV head: whole cache rows, in the
    /// order they lie in memory), written once for both widths. Per tile and KV head: the
    /// scores of the heads of its group (`scores_one_token`, the one-token order of
    /// `kernels::attention`), each head's softmax step, then the value rows read once,
    /// straight from f16, for up to four heads at a time (`$add`). Each head gets what
    /// [`super::item_reference`] computes for its KV head on these keys.
    macro_rules! item_f16_kernel {
        ($name:ident, $feat:literal, $isa:expr, $add:ident, $cols:expr, $softmax:ident) => {
            #[target_feature(enable = $feat)]
            unsafe fn $name(c: &F16Ctx, keys: Range<usize>, w: &mut Scratch) -> Partial {
                let (g, dh) = (c.group, c.dh);
                w.prepare(g, dh);
                let mut p = Partial::new(c.hkv * g, dh);
                let stride = c.hkv * dh;
                for t0 in keys.clone().step_by(TILE) {
                    let live = TILE.min(keys.end - t0);
                    let tile = t0..t0 + live;
                    // The chunk's last tile asks for the first tile of the next chunk: the
                    // same thread usually takes that item next (rayon hands each thread a run
                    // of consecutive items), and its first tile no longer starts cold (a
                    // 4B layer at 8K keys from memory: faster in 10 of 10 alternating runs,
                    // `attention_speed --cold`, about 8 %).
                    let next = (t0 + TILE).min(c.n)..(t0 + 2 * TILE).min(c.n);
                    let mut ahead = Ahead::new(c, next);
                    // Lines to ask for per value step: the next tile's spread over this one's
                    // steps (KV heads × calls × column blocks × keys).
                    let steps = c.hkv * g.div_ceil(4) * (dh / $cols) * live;
                    let per_step = ahead.left().div_ceil(steps.max(1));
                    for kvh in 0..c.hkv {
                        let qg = &c.q[kvh * g * dh..(kvh + 1) * g * dh];
                        scores_one_token(
                            $isa,
                            qg,
                            c.kc,
                            (c.hkv, kvh, dh),
                            c.n,
                            tile.clone(),
                            c.scale,
                            w.sc.as_mut_ptr(),
                            TILE,
                        );
                        for h in 0..g {
                            w.alpha[h] = $softmax(&mut p, kvh * g + h, &mut w.sc[h * TILE..(h + 1) * TILE], live);
                        }
                        let rows = c.vc.as_ptr().add(c.at(t0, kvh));
                        let mut h0 = 0;
                        while h0 < g {
                            let m = (g - h0).min(4);
                            let acc = p.acc.as_mut_ptr().add((kvh * g + h0) * dh);
                            let (sc, al) = (w.sc.as_ptr().add(h0 * TILE), &w.alpha[h0..h0 + m]);
                            match m {
                                4 => $add::<4>(acc, sc, al, rows, stride, dh, live, &mut ahead, per_step),
                                3 => $add::<3>(acc, sc, al, rows, stride, dh, live, &mut ahead, per_step),
                                2 => $add::<2>(acc, sc, al, rows, stride, dh, live, &mut ahead, per_step),
                                _ => $add::<1>(acc, sc, al, rows, stride, dh, live, &mut ahead, per_step),
                            }
                            h0 += m;
                        }
                    }
                }
                p
            }
        };
    }

    item_f16_kernel!(item_f16_512, "avx2,fma,f16c,avx512f", F16Isa::Avx512, add_f16_values_512, 64, softmax_step_512);
    item_f16_kernel!(item_f16_avx2, "avx2,fma,f16c", F16Isa::Avx2, add_f16_values, 16, softmax_step);

    /// For `M` heads (sums at `acc[h·dh..]`, the tile's weights at `sc[h·TILE..]`, `α` at
    /// `alpha[h]`): `acc = acc·α`, then `acc += p_j·v_j` for the keys `j < live` in order,
    /// the value rows f16 at `rows` (`stride` elements apart) converted as they are loaded, 64
    /// elements of each head in registers at a time (AVX-512F; the reference's operations per
    /// element).
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn add_f16_values_512<const M: usize>(
        acc: *mut f32,
        sc: *const f32,
        alpha: &[f32],
        rows: *const u16,
        stride: usize,
        dh: usize,
        live: usize,
        ahead: &mut Ahead,
        per_step: usize,
    ) {
        for col in (0..dh).step_by(64) {
            let mut a: [[__m512; 4]; M] =
                std::array::from_fn(|h| std::array::from_fn(|r| _mm512_loadu_ps(acc.add(h * dh + col + 16 * r))));
            for (ah, &al) in a.iter_mut().zip(alpha) {
                if al != 1.0 {
                    // (x·1 = x: skipping the product when no new maximum came changes no bit.)
                    let al = _mm512_set1_ps(al);
                    ah.iter_mut().for_each(|x| *x = _mm512_mul_ps(*x, al));
                }
            }
            for j in 0..live {
                ahead.ask(per_step);
                let row = rows.add(j * stride + col);
                let v: [__m512; 4] =
                    std::array::from_fn(|r| _mm512_cvtph_ps(_mm256_loadu_si256(row.add(16 * r).cast())));
                for (h, ah) in a.iter_mut().enumerate() {
                    let pj = _mm512_set1_ps(*sc.add(h * TILE + j));
                    for (x, vr) in ah.iter_mut().zip(&v) {
                        *x = _mm512_fmadd_ps(pj, *vr, *x);
                    }
                }
            }
            for (h, ah) in a.iter().enumerate() {
                for (r, x) in ah.iter().enumerate() {
                    _mm512_storeu_ps(acc.add(h * dh + col + 16 * r), *x);
                }
            }
        }
    }

    /// [`add_f16_values_512`] in AVX2, sixteen elements of each head at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn add_f16_values<const M: usize>(
        acc: *mut f32,
        sc: *const f32,
        alpha: &[f32],
        rows: *const u16,
        stride: usize,
        dh: usize,
        live: usize,
        ahead: &mut Ahead,
        per_step: usize,
    ) {
        // Sixteen keys at a time: a tile's value rows are `stride` apart (2 KiB at 4B shapes),
        // so one column's lines of all 32 fall in two L1 sets and evict each other between
        // the column blocks; sixteen fit (about 5 % faster from cache). The next tile is asked
        // for every eight keys, not every key (the asking loop was a fifth of the instructions).
        for j0 in (0..live).step_by(16) {
            for col in (0..dh).step_by(16) {
                let mut a: [[__m256; 2]; M] =
                    std::array::from_fn(|h| std::array::from_fn(|r| _mm256_loadu_ps(acc.add(h * dh + col + 8 * r))));
                for (ah, &al) in a.iter_mut().zip(alpha) {
                    if al != 1.0 && j0 == 0 {
                        let al = _mm256_set1_ps(al);
                        ah.iter_mut().for_each(|x| *x = _mm256_mul_ps(*x, al));
                    }
                }
                for j in j0..live.min(j0 + 16) {
                    if j % 8 == 0 {
                        ahead.ask(8 * per_step);
                    }
                    let row = rows.add(j * stride + col);
                    let v: [__m256; 2] =
                        std::array::from_fn(|r| _mm256_cvtph_ps(_mm_loadu_si128(row.add(8 * r).cast())));
                    for (h, ah) in a.iter_mut().enumerate() {
                        let pj = _mm256_set1_ps(*sc.add(h * TILE + j));
                        for (x, vr) in ah.iter_mut().zip(&v) {
                            *x = _mm256_fmadd_ps(pj, *vr, *x);
                        }
                    }
                }
                for (h, ah) in a.iter().enumerate() {
                    for (r, x) in ah.iter().enumerate() {
                        _mm256_storeu_ps(acc.add(h * dh + col + 8 * r), *x);
                    }
                }
            }
        }
    }

    /// The next tile's key rows, then its value rows, asked for a few cache lines at a time
    /// (`_mm_prefetch`) between the value steps of this tile. The rows lie contiguous in
    /// memory, but each KV head's pass reads a quarter of every row (Qwen3.5-4B), a pattern the
    /// hardware prefetchers follow poorly; asked for in bursts, the lines fill the line-fill
    /// buffers and stall the core. They go to L2 (`prefetcht1`), as the matmuls' weights do
    /// (`quant::x86::prefetch_ahead` says why); a tile is 128 KiB at 4B shapes, far more than
    /// L1 holds anyway.
    pub(super) struct Ahead {
        k: *const u8,
        v: *const u8,
        lines: usize,
        next: usize,
    }

    impl Ahead {
        fn new(c: &F16Ctx, keys: Range<usize>) -> Self {
            let (a, b) = (c.at(keys.start, 0) * 2, c.at(keys.end, 0) * 2);
            let (k, v) = (c.kc.as_ptr().cast::<u8>().wrapping_add(a), c.vc.as_ptr().cast::<u8>().wrapping_add(a));
            Ahead { k, v, lines: (b - a).div_ceil(64), next: 0 }
        }

        /// Lines not asked for yet.
        fn left(&self) -> usize {
            2 * self.lines - self.next
        }

        /// Asks for the next `n` lines (fewer at the end).
        #[inline(always)]
        unsafe fn ask(&mut self, n: usize) {
            let end = (self.next + n).min(2 * self.lines);
            for l in self.next..end {
                let p = if l < self.lines {
                    self.k.wrapping_add(64 * l)
                } else {
                    self.v.wrapping_add(64 * (l - self.lines))
                };
                _mm_prefetch::<_MM_HINT_T1>(p.cast());
            }
            self.next = end;
        }
    }

    /// [`super::combine`] with FMA instructions for its fused multiply-adds (the same bits).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn combine_fma(parts: &[Partial], dh: usize, h0: usize, og: &mut [f32]) {
        combine(parts, dh, h0, og)
    }

    /// One work item (KV head `kvh`, keys `keys`), written once and compiled with each ISA's
    /// integer dot: `$dot_q8` takes the unpacked Q8_0 key bytes (flipped to unsigned,
    /// `k ⊕ 0x80 = k + 128`, when `$q8_bias` is 128) and `$dot_q4` the Q4_0 nibbles (`q + 8`);
    /// the bias times the query block's sum is taken off the exact integer sums.
    /// `acc + Σ u·y` per 32-bit lane over its four (unsigned, signed) byte pairs, with VNNI.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    unsafe fn add_dot_vnni(acc: __m256i, u: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, y)
    }

    /// [`add_dot_vnni`] with AVX2 on Q4_0 nibbles (`maddubs`: no pair of products overflows).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn add_dot_u8(acc: __m256i, u: __m256i, y: __m256i) -> __m256i {
        _mm256_add_epi32(acc, dot_u8_i8(u, y))
    }

    /// `acc + Σ k·y` per 32-bit lane over its four signed byte pairs with AVX2 (Q8_0 keys: the
    /// sign trick of the matmul dots).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn add_dot_i8(acc: __m256i, k: __m256i, y: __m256i) -> __m256i {
        _mm256_add_epi32(acc, dot_i8(k, y))
    }

    /// One work item (KV head `kvh`, keys `keys`), written once and compiled with each ISA's
    /// integer dot: `$dot_q8` takes the unpacked Q8_0 key bytes (flipped to unsigned,
    /// `k ⊕ 0x80 = k + 128`, when `$q8_bias` is 128) and `$dot_q4` the Q4_0 nibbles (`q + 8`);
    /// the bias times the query block's sum is taken off the exact integer sums. The keys of a
    /// group of eight are transposed ([`unpack_keys`]): lane `l` of the `i`-th vector holds
    /// bytes `4i..4i + 4` of key `l`'s block, so eight dot-accumulates against the query's
    /// four-byte groups (each broadcast) leave each key's block sum in its own lane.
    macro_rules! item_kernel {
        ($name:ident, $feat:literal, $dot_q8:ident, $q8_bias:expr, $dot_q4:ident, $dequantize:ident, $add_values:ident, $softmax:ident) => {
            /// One work item; `Q4`: the keys are Q4_0 blocks (else Q8_0).
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $name<const Q4: bool>(
                c: &Ctx,
                kvh: usize,
                keys: Range<usize>,
                w: &mut Scratch,
            ) -> Partial {
                const GROUPS: usize = TILE / 8;
                let (g, dh, nb) = (c.group, c.dh, c.dh / 32);
                w.prepare(g, dh);
                let mut p = Partial::new(g, dh);
                let bias: i32 = if Q4 { 8 } else { $q8_bias };
                let scale = _mm256_set1_ps(c.scale);
                for t0 in keys.clone().step_by(TILE) {
                    let live = TILE.min(keys.end - t0);
                    prefetch_tile(c, kvh, (t0 + TILE)..(t0 + 2 * TILE).min(keys.end));
                    unpack_keys::<Q4>(c, kvh, t0, live, $q8_bias == 128, w);
                    $dequantize(c, kvh, t0, live, w);
                    let groups = live.div_ceil(8);
                    for h in 0..g {
                        let qh = kvh * g + h;
                        let sc = w.sc.as_mut_ptr().add(h * TILE);
                        let mut sacc = [_mm256_setzero_ps(); GROUPS];
                        for b in 0..nb {
                            let yq = c.qa.qs.as_ptr().add(qh * dh + 32 * b).cast::<i32>();
                            let y: [__m256i; 8] =
                                std::array::from_fn(|i| _mm256_set1_epi32(yq.add(i).read_unaligned()));
                            let qsum = bias * *c.qa.sums32.get_unchecked(qh * nb + b) as i32;
                            let dq = _mm256_set1_ps(*c.qa.d.get_unchecked(qh * nb + b));
                            for (g8, sg) in sacc.iter_mut().enumerate().take(groups) {
                                let kq = w.kq.as_ptr().add(((b * GROUPS + g8) * 8) * 32);
                                let mut isum = _mm256_setzero_si256();
                                for (i, yi) in y.iter().enumerate() {
                                    let x = _mm256_loadu_si256(kq.add(32 * i).cast());
                                    isum = if Q4 { $dot_q4(isum, x, *yi) } else { $dot_q8(isum, x, *yi) };
                                }
                                if bias != 0 {
                                    isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(qsum));
                                }
                                let dk = _mm256_cvtph_ps(_mm_loadu_si128(w.kd.as_ptr().add(b * TILE + 8 * g8).cast()));
                                *sg = _mm256_fmadd_ps(_mm256_mul_ps(dk, dq), _mm256_cvtepi32_ps(isum), *sg);
                            }
                        }
                        for (g8, sg) in sacc.iter().enumerate().take(groups) {
                            _mm256_storeu_ps(sc.add(8 * g8), _mm256_mul_ps(*sg, scale));
                        }
                        let alpha = $softmax(&mut p, h, std::slice::from_raw_parts_mut(sc, TILE), live);
                        $add_values(&mut p.acc[h * dh..(h + 1) * dh], &w.sc[h * TILE..], &w.vt, live, alpha);
                    }
                }
                p
            }
        };
    }

    item_kernel!(
        item_vnni,
        "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
        add_dot_vnni,
        128,
        add_dot_vnni,
        dequantize_values_512,
        add_values_512,
        softmax_step_512
    );
    item_kernel!(item_avx2, "avx2,fma,f16c", add_dot_i8, 0, add_dot_u8, dequantize_values, add_values, softmax_step);

    /// Asks for the key and value rows of KV head `kvh` of keys `keys` (the next tile) to be
    /// brought into the cache: a head's rows lie `kv_heads` heads apart, a stride the hardware
    /// prefetchers follow poorly across pages.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prefetch_tile(c: &Ctx, kvh: usize, keys: Range<usize>) {
        for (ty, bytes) in [(c.kt, c.kb), (c.vt, c.vb)] {
            let len = c.dh / 32 * ty.block_bytes();
            for j in keys.clone() {
                let row = bytes.as_ptr().wrapping_add(c.at(ty, j, kvh));
                let mut off = 0;
                while off < len + 63 {
                    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(off.min(len - 1)).cast());
                    off += 64;
                }
            }
        }
    }

    /// The key blocks of keys `t0..t0 + live` (KV head `kvh`) unpacked into `w.kq` (Q8_0's int8
    /// values, flipped to `k + 128` when `flip`, or Q4_0's nibbles), each group of eight keys of
    /// a block transposed ([`transpose8x8`]: `[block][group][dword][key]`), and their scales
    /// into `w.kd` (`[block][key]`); keys past `live` get zeros.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_keys<const Q4: bool>(c: &Ctx, kvh: usize, t0: usize, live: usize, flip: bool, w: &mut Scratch) {
        let (nb, bb) = (c.dh / 32, c.kt.block_bytes());
        let flip_v = _mm256_set1_epi8(if flip { 0x80u8 as i8 } else { 0 });
        for g8 in 0..TILE / 8 {
            let rows: [*const u8; 8] = std::array::from_fn(|l| {
                let jj = 8 * g8 + l;
                if jj < live {
                    c.kb.as_ptr().add(c.at(c.kt, t0 + jj, kvh))
                } else {
                    std::ptr::null()
                }
            });
            for b in 0..nb {
                let r: [__m256i; 8] = std::array::from_fn(|l| {
                    let kd = w.kd.as_mut_ptr().add(b * TILE + 8 * g8 + l);
                    if rows[l].is_null() {
                        *kd = 0;
                        return _mm256_setzero_si256();
                    }
                    let blk = rows[l].add(b * bb);
                    *kd = (blk as *const u16).read_unaligned();
                    if Q4 {
                        nibbles(blk.add(2))
                    } else {
                        _mm256_xor_si256(_mm256_loadu_si256(blk.add(2).cast()), flip_v)
                    }
                });
                let out = w.kq.as_mut_ptr().add(((b * (TILE / 8) + g8) * 8) * 32);
                for (i, v) in transpose8x8(&r).iter().enumerate() {
                    _mm256_storeu_si256(out.add(32 * i).cast(), *v);
                }
            }
        }
    }

    /// The 8×8 matrix of 32-bit lanes `r` transposed: lane `l` of result `i` is lane `i` of
    /// `r[l]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn transpose8x8(r: &[__m256i; 8]) -> [__m256i; 8] {
        // t[2p]: lanes 0, 1, 4, 5 of r[2p] and r[2p + 1] interleaved; t[2p + 1]: lanes 2, 3, 6, 7.
        let t: [__m256i; 8] = std::array::from_fn(|i| {
            let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
            if i % 2 == 0 {
                _mm256_unpacklo_epi32(a, b)
            } else {
                _mm256_unpackhi_epi32(a, b)
            }
        });
        // u[k] (k < 4): lanes k and k + 4 of r[0..4]; u[4 + k]: the same of r[4..8].
        let u: [__m256i; 8] = std::array::from_fn(|i| {
            let (half, k) = (i / 4, i % 4);
            let (a, b) = (t[4 * half + k / 2], t[4 * half + 2 + k / 2]);
            if k % 2 == 0 {
                _mm256_unpacklo_epi64(a, b)
            } else {
                _mm256_unpackhi_epi64(a, b)
            }
        });
        std::array::from_fn(|i| {
            let k = i % 4;
            if i < 4 {
                _mm256_permute2x128_si256::<0x20>(u[k], u[4 + k])
            } else {
                _mm256_permute2x128_si256::<0x31>(u[k], u[4 + k])
            }
        })
    }

    /// The value rows of keys `t0..t0 + live` (KV head `kvh`) dequantized into `w.vt`
    /// (`d·q`: each an exact f32 product).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dequantize_values(c: &Ctx, kvh: usize, t0: usize, live: usize, w: &mut Scratch) {
        let (dh, nb, bb) = (c.dh, c.dh / 32, c.vt.block_bytes());
        for jj in 0..live {
            let base = c.vb.as_ptr().add(c.at(c.vt, t0 + jj, kvh));
            let out = w.vt.as_mut_ptr().add(jj * dh);
            for b in 0..nb {
                let blk = base.add(b * bb);
                let d = _mm256_cvtph_ps(_mm_set1_epi16((blk as *const u16).read_unaligned() as i16));
                let x = if c.vt == QuantType::Q8_0 {
                    _mm256_loadu_si256(blk.add(2).cast())
                } else {
                    _mm256_sub_epi8(nibbles(blk.add(2)), _mm256_set1_epi8(8))
                };
                let (lo, hi) = (_mm256_castsi256_si128(x), _mm256_extracti128_si256::<1>(x));
                let parts = [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)];
                for (i, part) in parts.into_iter().enumerate() {
                    let v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part)));
                    _mm256_storeu_ps(out.add(32 * b + 8 * i), v);
                }
            }
        }
    }

    /// [`dequantize_values`] sixteen values a register (AVX-512F; the same products).
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn dequantize_values_512(c: &Ctx, kvh: usize, t0: usize, live: usize, w: &mut Scratch) {
        let (dh, nb, bb) = (c.dh, c.dh / 32, c.vt.block_bytes());
        for jj in 0..live {
            let base = c.vb.as_ptr().add(c.at(c.vt, t0 + jj, kvh));
            let out = w.vt.as_mut_ptr().add(jj * dh);
            for b in 0..nb {
                let blk = base.add(b * bb);
                let d = _mm512_cvtph_ps(_mm256_set1_epi16((blk as *const u16).read_unaligned() as i16));
                let x = if c.vt == QuantType::Q8_0 {
                    _mm256_loadu_si256(blk.add(2).cast())
                } else {
                    _mm256_sub_epi8(nibbles(blk.add(2)), _mm256_set1_epi8(8))
                };
                let parts = [_mm256_castsi256_si128(x), _mm256_extracti128_si256::<1>(x)];
                for (i, part) in parts.into_iter().enumerate() {
                    let v = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(part)));
                    _mm512_storeu_ps(out.add(32 * b + 16 * i), v);
                }
            }
        }
    }

    /// [`add_values`] sixteen elements a register (AVX-512F; the same operations per element).
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn add_values_512(acc: &mut [f32], p: &[f32], vt: &[f32], live: usize, alpha: f32) {
        let dh = acc.len();
        let mut col = 0;
        while col < dh {
            if dh - col >= 128 {
                add_columns_512::<8>(acc.as_mut_ptr().add(col), p, vt.as_ptr().add(col), dh, live, alpha);
                col += 128;
            } else if dh - col >= 64 {
                add_columns_512::<4>(acc.as_mut_ptr().add(col), p, vt.as_ptr().add(col), dh, live, alpha);
                col += 64;
            } else {
                add_columns_512::<2>(acc.as_mut_ptr().add(col), p, vt.as_ptr().add(col), dh, live, alpha);
                col += 32;
            }
        }
    }

    /// [`add_weighted_rows`] on `16·R` columns (AVX-512F).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn add_columns_512<const R: usize>(
        acc: *mut f32,
        p: &[f32],
        vt: *const f32,
        dh: usize,
        live: usize,
        alpha: f32,
    ) {
        let mut a: [__m512; R] = std::array::from_fn(|r| _mm512_loadu_ps(acc.add(16 * r)));
        if alpha != 1.0 {
            let al = _mm512_set1_ps(alpha);
            a.iter_mut().for_each(|x| *x = _mm512_mul_ps(*x, al));
        }
        for (jj, &pj) in p.iter().enumerate().take(live) {
            let pv = _mm512_set1_ps(pj);
            let row = vt.add(jj * dh);
            for (r, x) in a.iter_mut().enumerate() {
                *x = _mm512_fmadd_ps(pv, _mm512_loadu_ps(row.add(16 * r)), *x);
            }
        }
        for (r, x) in a.iter().enumerate() {
            _mm512_storeu_ps(acc.add(16 * r), *x);
        }
    }

    /// Head `h`'s online-softmax step on the tile's scores `sc` (the first `live` real):
    /// updates `m` and `l`, leaves the weights in `sc` (0 past `live`) and returns `α`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn softmax_step(p: &mut Partial, h: usize, sc: &mut [f32], live: usize) -> f32 {
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let neg = _mm256_set1_ps(f32::NEG_INFINITY);
        let mask = |g8: usize| {
            let n = live.saturating_sub(8 * g8).min(8) as i32;
            _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane))
        };
        let mut mx = neg;
        for g8 in 0..live.div_ceil(8) {
            mx = _mm256_max_ps(mx, _mm256_blendv_ps(neg, _mm256_loadu_ps(sc.as_ptr().add(8 * g8)), mask(g8)));
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), mx);
        let mt = lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let m_new = p.m[h].max(mt);
        let alpha = ggml::expf(p.m[h] - m_new);
        p.m[h] = m_new;
        let m_v = _mm256_set1_ps(m_new);
        let mut sum = _mm256_setzero_ps();
        for g8 in 0..TILE / 8 {
            let at = sc.as_mut_ptr().add(8 * g8);
            let e = if 8 * g8 < live {
                _mm256_and_ps(expf8(_mm256_sub_ps(_mm256_loadu_ps(at), m_v)), mask(g8))
            } else {
                _mm256_setzero_ps()
            };
            _mm256_storeu_ps(at, e);
            sum = _mm256_add_ps(sum, e);
        }
        _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
        p.l[h] = p.l[h] * alpha + tree8(&lanes);
        alpha
    }

    /// [`softmax_step`] sixteen keys to a register (AVX-512F), the same bits: the tiled
    /// kernel's 512-bit step (`flash::x86_512::softmax_step_512`) on the scaled scores (scale
    /// 1). Weights past `live` are left as they were (the value sums read `j < live` only).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn softmax_step_512(p: &mut Partial, h: usize, sc: &mut [f32], live: usize) -> f32 {
        let (alpha, m_new, sum) = flash_step_512(sc, live, 1.0, p.m[h]);
        p.m[h] = m_new;
        p.l[h] = p.l[h] * alpha + sum;
        alpha
    }

    /// `acc = acc·α`, then `acc += p_j·v_j` for the tile's keys `j < live` in order (weights
    /// `p`, value rows `vt`, `acc.len()` elements each), 64 (or 32) elements at a time in
    /// registers.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn add_values(acc: &mut [f32], p: &[f32], vt: &[f32], live: usize, alpha: f32) {
        let dh = acc.len();
        let mut col = 0;
        while col < dh {
            if dh - col >= 64 {
                add_weighted_rows::<8>(acc.as_mut_ptr().add(col), p, vt.as_ptr().add(col), dh, live, alpha);
                col += 64;
            } else {
                add_weighted_rows::<4>(acc.as_mut_ptr().add(col), p, vt.as_ptr().add(col), dh, live, alpha);
                col += 32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::KvType;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn values(n: usize, seed: u64, amp: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n).map(|_| lcg(&mut s) * amp).collect()
    }

    /// A cache of type `ty` holding `x` (`[n, hkv · dh]`).
    fn cache(ty: KvType, x: &[f32], hkv: usize, dh: usize) -> KvRows {
        let mut r = KvRows::new(ty, hkv * dh, dh);
        r.push(x);
        r
    }

    fn shape(pos0: usize, hq: usize, hkv: usize, dh: usize) -> AttnShape {
        AttnShape { t: 1, pos0, heads: hq, kv_heads: hkv, head_dim: dh, scale: 1.0 / (dh as f32).sqrt() }
    }

    /// `(pos0, heads, kv_heads, head_dim, amplitude of q and k)`: GQA groups 1, 2, 3, 4 and 8;
    /// contexts inside one tile, across tiles, across `KEYS_PER_CHUNK` (several chunks) and long
    /// enough for chunks longer than the minimum; heads of 32 to 256.
    const CASES: [(usize, usize, usize, usize, f32); 12] = [
        (0, 2, 2, 32, 1.0),                                 // one key
        (6, 4, 2, 64, 2.0),                                 // part of one group of eight
        (40, 8, 1, 64, 3.0),                                // a tile and a part, GQA 8
        (95, 9, 3, 64, 4.0),                                // SmolLM2's heads, three tiles
        (300, 4, 1, 96, 2.0),                               // a head of three blocks (the 32-column value path)
        (511, 16, 4, 256, 1.0),                             // Qwen3.5-4B's heads, four chunks exactly
        (512, 6, 3, 64, 8.0),                               // five chunks, the last of one key
        (1100, 12, 2, 128, 3.0),                            // nine chunks, GQA 6
        (777, 8, 1, 128, 16.0),                             // wide scores: weights that underflow to 0
        (2047, 4, 4, 32, 2.0),                              // GQA 1, sixteen chunks
        (1500, 8, 2, 64, 2.0),                              // GQA 4
        (MAX_CHUNKS * KEYS_PER_CHUNK + 700, 2, 1, 32, 1.0), // more keys than MAX_CHUNKS minimum chunks
    ];

    fn inputs(pos0: usize, hq: usize, hkv: usize, dh: usize, amp: f32) -> [Vec<f32>; 3] {
        let n = pos0 + 1;
        [
            values(hq * dh, 1 + pos0 as u64, amp),
            values(n * hkv * dh, 2 + n as u64, amp),
            values(n * hkv * dh, 3 + dh as u64, 1.0),
        ]
    }

    const TYPES: [(KvType, KvType); 4] = [
        (KvType::Q8_0, KvType::Q8_0),
        (KvType::Q4_0, KvType::Q4_0),
        (KvType::Q8_0, KvType::Q4_0),
        (KvType::Q4_0, KvType::Q8_0),
    ];

    /// Fails with the first element whose bits differ (and how many do).
    fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        let differ = got.iter().zip(want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        if let Some(i) = got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits()) {
            panic!(
                "{what}: {differ} of {} outputs differ, first [{i}]: {:e} vs reference {:e}",
                got.len(),
                got[i],
                want[i]
            );
        }
    }

    #[test]
    fn chunks_are_whole_tiles_cover_the_context_and_stay_few() {
        for n in [1, 31, 32, 33, 511, 512, 513, 1023, 1024, 5000, 32_768, 131_072, 1 << 20] {
            let cl = chunk_len(n);
            let chunks = n.div_ceil(cl);
            let want = n.div_ceil(KEYS_PER_CHUNK).min(MAX_CHUNKS);
            assert!(cl.is_multiple_of(TILE) && cl * want >= n && cl < n.div_ceil(want) + TILE, "n={n}: chunks of {cl}");
            assert!(chunks <= want && (chunks - 1) * cl < n, "n={n}: {chunks} chunks of {cl}");
        }
        assert_eq!(chunk_len(1100), 128, "1,100 keys: nine chunks of 128");
        assert_eq!(chunk_len(300), 128, "300 keys: three chunks, so two threads share them");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_vector_kernel_equals_the_reference_bit_for_bit() {
        for isa in x86::Isa::ALL {
            if !isa.supported() {
                let needs = if isa == x86::Isa::Vnni { "avx512f+avx512vl+avx512vnni" } else { "avx2+fma+f16c" };
                crate::test_support::report_skip(needs, &format!("kernels::attention_q {isa:?} kernel"));
                continue;
            }
            for (pos0, hq, hkv, dh, amp) in CASES {
                let [q, k, v] = inputs(pos0, hq, hkv, dh, amp);
                let s = shape(pos0, hq, hkv, dh);
                for (kt, vt) in TYPES {
                    let (kc, vc) = (cache(kt, &k, hkv, dh), cache(vt, &v, hkv, dh));
                    let want = causal_one_reference(&q, &kc, &vc, s);
                    let got = x86::causal_one(isa, &q, &kc, &vc, s);
                    assert_same_bits(
                        &got,
                        &want,
                        &format!("{isa:?} K {kt} V {vt} pos0={pos0} hq={hq} hkv={hkv} dh={dh}"),
                    );
                }
            }
        }
    }

    /// The f16 bits of `x`, and `x` rounded to f16.
    fn f16_of(x: &[f32]) -> (Vec<u16>, Vec<f32>) {
        let bits: Vec<u16> = x.iter().map(|&e| half::f16::from_f32(e).to_bits()).collect();
        let back = bits.iter().map(|&b| half::f16::from_bits(b).to_f32()).collect();
        (bits, back)
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_vector_kernel_equals_the_reference_bit_for_bit_on_an_f16_cache() {
        use crate::kernels::attention::x86::Isa;
        for isa in Isa::ALL {
            if !isa.supported() {
                let needs = if isa == Isa::Avx512 { "avx512f" } else { "avx2+fma+f16c" };
                crate::test_support::report_skip(needs, &format!("kernels::attention_q {isa:?} f16 kernel"));
                continue;
            }
            for (pos0, hq, hkv, dh, amp) in CASES.into_iter().filter(|c| c.3 % 64 == 0) {
                let [q, k, v] = inputs(pos0, hq, hkv, dh, amp);
                let (q, (kb, _), (vb, _)) = (f16_of(&q).1, f16_of(&k), f16_of(&v));
                let s = shape(pos0, hq, hkv, dh);
                let want = causal_one_f16_reference(&q, &kb, &vb, s);
                let got = x86::causal_one_f16(isa, &q, &kb, &vb, s);
                assert_same_bits(&got, &want, &format!("{isa:?} f16 pos0={pos0} hq={hq} hkv={hkv} dh={dh}"));
            }
        }
    }

    #[test]
    fn the_f16_reference_is_attention_on_the_cache() {
        // Scores in ggml_vec_dot_f16's order and every later step in f32: only f32 roundings
        // apart from exact attention on the same f16 values.
        for (pos0, hq, hkv, dh, amp) in CASES.into_iter().filter(|c| c.3 % 64 == 0 && c.0 < 3000) {
            let [q, k, v] = inputs(pos0, hq, hkv, dh, amp);
            let (q, (kb, _), (vb, _)) = (f16_of(&q).1, f16_of(&k), f16_of(&v));
            let s = shape(pos0, hq, hkv, dh);
            let (kc, vc) = (cache(KvType::F16, &k, hkv, dh), cache(KvType::F16, &v, hkv, dh));
            let got = causal_one_f16_reference(&q, &kb, &vb, s);
            let want = attention_f64(&q, &kc, &vc, s);
            let worst = got.iter().zip(&want).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
            let what = format!("f16 pos0={pos0} hq={hq} hkv={hkv} dh={dh} amp={amp}");
            assert!(worst <= 4e-6, "{what}: {worst} off exact attention");
        }
    }

    #[test]
    fn the_thread_count_changes_no_bit_on_an_f16_cache() {
        let (pos0, hq, hkv, dh, amp) = CASES[7];
        let [q, k, v] = inputs(pos0, hq, hkv, dh, amp);
        let (q, (kb, _), (vb, _)) = (f16_of(&q).1, f16_of(&k), f16_of(&v));
        let s = shape(pos0, hq, hkv, dh);
        let many = causal_one_f16(&q, &kb, &vb, s);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let one = pool.install(|| causal_one_f16(&q, &kb, &vb, s));
        assert_same_bits(&one, &many, "one thread against the pool");
    }

    #[test]
    fn the_thread_count_changes_no_bit() {
        let (pos0, hq, hkv, dh, amp) = CASES[7];
        let [q, k, v] = inputs(pos0, hq, hkv, dh, amp);
        let (kc, vc) = (cache(KvType::Q8_0, &k, hkv, dh), cache(KvType::Q4_0, &v, hkv, dh));
        let s = shape(pos0, hq, hkv, dh);
        let many = causal_one(&q, &kc, &vc, s);
        let one =
            rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(|| causal_one(&q, &kc, &vc, s));
        assert_same_bits(&one, &many, "one thread against the pool");
    }

    /// Exact attention in f64 of `q` against the cache's dequantized rows.
    fn attention_f64(q: &[f32], k: &KvRows, v: &KvRows, s: AttnShape) -> Vec<f64> {
        let (kc, vc) = (k.to_f32(), v.to_f32());
        let (hq, hkv, dh, n) = (s.heads, s.kv_heads, s.head_dim, s.pos0 + 1);
        let mut o = vec![0.0f64; hq * dh];
        for h in 0..hq {
            let kvh = h / (hq / hkv);
            let row = |j: usize| (j * hkv + kvh) * dh..(j * hkv + kvh + 1) * dh;
            let sc: Vec<f64> = (0..n)
                .map(|j| {
                    let dot: f64 =
                        q[h * dh..(h + 1) * dh].iter().zip(&kc[row(j)]).map(|(a, b)| *a as f64 * *b as f64).sum();
                    dot * s.scale as f64
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = w.iter().sum();
            for (j, wj) in w.iter().enumerate() {
                for (o, x) in o[h * dh..(h + 1) * dh].iter_mut().zip(&vc[row(j)]) {
                    *o += wj / l * *x as f64;
                }
            }
        }
        o
    }

    #[test]
    fn the_reference_is_attention_on_the_dequantized_cache() {
        // Two bars. With the query the kernel scores with (its Q8_0 rounding, dequantized) the
        // only differences are f32 roundings: 2e-5 of the largest value. With the query as given,
        // its 8-bit rounding moves each score by up to about |q|·|k|·dh/254·scale; at these
        // amplitudes the outputs stay within 0.03 (values within ±1; measured at most 0.026).
        for (pos0, hq, hkv, dh, amp) in CASES.into_iter().filter(|c| c.0 < 3000) {
            let [q, k, v] = inputs(pos0, hq, hkv, dh, amp);
            let s = shape(pos0, hq, hkv, dh);
            let qa = QuantizedActs::new(ActFormat::Q8_0, &q, hq);
            let q8: Vec<f32> = qa.qs.iter().enumerate().map(|(i, &x)| x as f32 * qa.d[i / 32]).collect();
            for (kt, vt) in TYPES {
                let (kc, vc) = (cache(kt, &k, hkv, dh), cache(vt, &v, hkv, dh));
                let got = causal_one_reference(&q, &kc, &vc, s);
                let what = format!("K {kt} V {vt} pos0={pos0} hq={hq} hkv={hkv} dh={dh} amp={amp}");
                let worst = |want: &[f64]| got.iter().zip(want).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
                let exact = worst(&attention_f64(&q8, &kc, &vc, s));
                let off = worst(&attention_f64(&q, &kc, &vc, s));
                eprintln!("{what}: {exact:.2e} off with the Q8_0 query, {off:.2e} with the f32 one");
                assert!(exact <= 4e-6, "{what}: {exact} off exact attention with the Q8_0 query");
                if amp <= 4.0 {
                    assert!(off <= 0.03, "{what}: {off} off exact attention with the f32 query");
                }
            }
        }
    }

    #[test]
    fn causal_takes_this_kernel_for_one_token_on_a_quantized_cache() {
        let (pos0, hq, hkv, dh, amp) = CASES[3];
        let [q, k, v] = inputs(pos0, hq, hkv, dh, amp);
        let s = shape(pos0, hq, hkv, dh);
        for (kt, vt) in TYPES {
            let (kc, vc) = (cache(kt, &k, hkv, dh), cache(vt, &v, hkv, dh));
            let got = super::super::attention::causal(&q, &kc, &vc, s, ggml::F16Dot::Vec);
            let want = if crate::kernels::plain_kernels() {
                super::super::attention::causal_reference(&q, &kc.to_f32(), &vc.to_f32(), s, ggml::F16Dot::Vec)
            } else {
                causal_one_reference(&q, &kc, &vc, s)
            };
            assert_same_bits(&got, &want, &format!("causal, K {kt} V {vt}"));
        }
    }
}
