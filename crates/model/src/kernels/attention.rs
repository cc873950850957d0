//! Causal attention of a batch of new queries against an f16-valued KV cache, in llama.cpp's
//! batch order (`F16Dot::Gemm`, see `quant::ggml`): the llama architecture's prefill.
//!
//! [`causal_reference`] is the plain version: per query and head, scores `q·k` summed in 16
//! lanes (element `e` in lane `e mod 16`) and reduced by GCC's `_mm512_reduce_add_ps` tree,
//! ggml's softmax, the weights rounded to f16, and `Σ p·v` summed in 16 slots (key `j` in slot
//! `j mod 16`) reduced by the same tree. Every product is of two f16 values, so it is exact in
//! f32 and only the order of the additions matters.
//!
//! A single new token (decode) follows `ggml_vec_dot_f16`'s order instead (`F16Dot::Vec`: four
//! 16-lane accumulators per step of 64, and 64 value slots).
//!
//! [`causal_in_llama_order`] computes the same numbers with vector code in that same order,
//! vectorised across what is independent: for a batch sixteen keys at a time for the scores
//! (one lane per key, the cache transposed into blocks of 16 keys), for one token one key at a
//! time in four 16-lane accumulators; the exponentials a register at a time; the value sum slot
//! by slot, each slot's keys in ascending order. One token on heads of whole steps of 64 reads
//! the cache once per work item, front to back: each key serves every query head of its KV
//! head, and sixteen (AVX2: eight) keys' reduction trees run together in shuffles. It picks at
//! run time the AVX-512 kernel (with FMA and F16C) where the CPU has it, else the AVX2 one
//! (FMA, F16C), which is the AVX-512 one with every 16-lane register as two 256-bit halves,
//! lane for lane (so eight keys, eight exponentials per register), else the reference;
//! `FROGNANO_PLAIN_KERNELS=1` asks for the reference. Tests hold each kernel the CPU runs to the reference bit for bit.
//!
//! [`causal`] sends one token on an f16 cache with heads of whole steps of 64 (decode) to the
//! online kernel instead ([`super::attention_q::causal_one_f16`]): the same scores, then an
//! online softmax over tiles with f32 weights, which changes the bits but reads each value row
//! into registers once, 1.5–5× faster than this order at every length from 32 to 1,024 keys
//! (`attention_speed`, SmolLM2's, Qwen2.5-Coder's and Qwen3.5-4B's heads); llama.cpp's own
//! CPU default, flash attention, does not keep this order either. [`causal_in_llama_order`]
//! keeps llama.cpp's order at every length, and `FROGNANO_PLAIN_KERNELS=1` runs it.
//!
//! A quantized cache (`--kv-cache q8_0|q4_0`) has its own one-token kernel,
//! [`super::attention_q`]: the query quantized to Q8_0 and each key scored by an integer block
//! dot (AVX-512 VNNI `vpdpbusd` or AVX2 `maddubs`), an online softmax over tiles of 32 keys for
//! all the query heads of a KV head at once, the value rows dequantized once per tile, and the
//! keys cut into chunks across the threads whose partial sums are combined in a fixed order.
//! Batches on a quantized or f32 cache, and long batches on any, take the tiled kernel
//! ([`super::flash`]).

use rayon::prelude::*;

use super::round_f16;
use crate::cache::KvRows;
use crate::quant::ggml::{self, F16Dot};

/// Shapes of one [`causal`] call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// New queries (tokens).
    pub t: usize,
    /// Cache positions before the first new token (query `i` sees keys `0..=pos0 + i`).
    pub pos0: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (`heads` a multiple of it).
    pub kv_heads: usize,
    /// Dimensions per head.
    pub head_dim: usize,
    /// Score scale (`1/√head_dim`).
    pub scale: f32,
}

/// Prompts from this many cache positions on (cached plus new) take the tiled kernel
/// ([`super::flash`]) for a batch: below it the batch-order kernels reproduce llama.cpp's
/// non-flash-attention sums to the bit at a cost that grows with the square of the length
/// (a full score row per query, the keys transposed per call); above it the tiled kernel's
/// online softmax keeps memory and per-token time flat and sums in its own order.
pub const TILED_FROM: usize = 512;

/// Causal attention of `q` (`[t, heads, head_dim]`, values already f16-rounded) against the
/// cache `k`/`v` (`[pos0 + t, kv_heads · head_dim]`). For an f16 cache it follows llama.cpp's
/// summation `order` ([`F16Dot::for_batch`]), bit-identical to [`causal_reference`], for a
/// batch below [`TILED_FROM`] positions and one token on heads that are not whole steps of 64;
/// one token on heads of 64·k runs [`super::attention_q::causal_one_f16`]. One token on
/// a quantized (Q8_0/Q4_0) cache runs [`super::attention_q::causal_one`] (integer block dots against the
/// query quantized to Q8_0). A longer batch, a batch on a quantized cache and every call on an
/// f32 cache run the tiled online-softmax kernel ([`super::flash::causal_tiled`]). `FROGNANO_PLAIN_KERNELS=1` asks for [`causal_reference`]
/// on the cache's values throughout. Returns `[t, heads · head_dim]`.
pub fn causal(q: &[f32], k: &KvRows, v: &KvRows, s: AttnShape, order: F16Dot) -> Vec<f32> {
    if super::plain_kernels() {
        return causal_reference(q, &k.to_f32(), &v.to_f32(), s, order);
    }
    if s.t == 1 && super::attention_q::supports(k, v) {
        return super::attention_q::causal_one(q, k, v, s);
    }
    let tiled = order == F16Dot::Gemm && s.pos0 + s.t >= TILED_FROM;
    if let (Some(kb), Some(vb), false) = (k.f16_bits(), v.f16_bits(), tiled) {
        if order == F16Dot::Vec && super::attention_q::supports_f16(&s) {
            return super::attention_q::causal_one_f16(q, kb, vb, s);
        }
        return causal_in_llama_order(q, k, v, s, order);
    }
    super::flash::causal_tiled(q, k, v, s)
}

/// [`causal`] on an f16 cache (`k`, `v`) always in llama.cpp's non-flash order `order`:
/// the vector kernels this CPU has, else [`causal_reference`]; bit-identical to it either way.
pub fn causal_in_llama_order(q: &[f32], k: &KvRows, v: &KvRows, s: AttnShape, order: F16Dot) -> Vec<f32> {
    let (Some(kb), Some(vb)) = (k.f16_bits(), v.f16_bits()) else {
        panic!("causal_in_llama_order takes an f16 cache, not {}/{}", k.kv_type(), v.kv_type());
    };
    #[cfg(target_arch = "x86_64")]
    if s.head_dim.is_multiple_of(16) && !super::plain_kernels() {
        if let Some(isa) = x86::Isa::best() {
            return x86::causal(isa, q, kb, vb, s, order);
        }
    }
    let _ = (kb, vb);
    causal_reference(q, &k.to_f32(), &v.to_f32(), s, order)
}

/// The plain version of [`causal`] (what the llama forward computed before the vector kernels,
/// kept as their test reference and for CPUs without AVX2, FMA and F16C).
pub fn causal_reference(q: &[f32], kc: &[f32], vc: &[f32], s: AttnShape, order: F16Dot) -> Vec<f32> {
    let AttnShape { t, pos0, heads: hq, kv_heads: hkv, head_dim: dh, scale } = s;
    let group = hq / hkv;
    let mut o = vec![0.0f32; t * hq * dh];
    o.par_chunks_mut(dh).enumerate().for_each(|(idx, oh)| {
        let (i, h) = (idx / hq, idx % hq);
        let kvh = h / group;
        let qh = &q[idx * dh..(idx + 1) * dh];
        let n = pos0 + i + 1;
        let mut sc: Vec<f32> =
            (0..n).map(|j| order.dot(qh, &kc[(j * hkv + kvh) * dh..(j * hkv + kvh + 1) * dh], dh) * scale).collect();
        ggml::softmax(&mut sc);
        let slots = if order == F16Dot::Gemm { 16 } else { 64 };
        let mut acc = vec![0.0f32; slots * dh];
        for (j, p) in sc.iter().enumerate() {
            let p = round_f16(*p);
            let vr = &vc[(j * hkv + kvh) * dh..(j * hkv + kvh + 1) * dh];
            let slot = &mut acc[(j % slots) * dh..(j % slots + 1) * dh];
            for (e, vv) in slot.iter_mut().zip(vr) {
                *e += p * vv;
            }
        }
        for (e, out) in oh.iter_mut().enumerate() {
            *out = if order == F16Dot::Gemm {
                ggml::reduce16(&std::array::from_fn(|l| acc[l * dh + e]))
            } else {
                F16Dot::combine_vec(&std::array::from_fn(|l| acc[l * dh + e]))
            };
        }
    });
    o
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    //! One driver and the key transpose for both vector kernels; [`avx512`] and [`avx2`] hold
    //! the four steps (scores, softmax, f16 weights, value sum) of the query heads of one work
    //! item in each ISA. The AVX2 kernel is the AVX-512 one with every 16-lane register split
    //! into two 256-bit halves, lane for lane, so both sum in the reference's order.

    use std::arch::x86_64::*;

    use rayon::prelude::*;

    use super::{AttnShape, F16Dot};

    /// Which vector kernel runs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(in crate::kernels) enum Isa {
        /// AVX-512F with FMA and F16C.
        Avx512,
        /// AVX2 with FMA and F16C.
        Avx2,
    }

    impl Isa {
        /// Every kernel, fastest first.
        pub(in crate::kernels) const ALL: [Isa; 2] = [Isa::Avx512, Isa::Avx2];

        /// Whether this CPU runs the kernel.
        pub(in crate::kernels) fn supported(self) -> bool {
            let wide = match self {
                // (AVX2 too: parts of the online kernel are AVX2 code; every AVX-512 CPU has it.)
                Isa::Avx512 => is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx2"),
                Isa::Avx2 => is_x86_feature_detected!("avx2"),
            };
            wide && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
        }

        /// The fastest kernel this CPU runs, if any.
        pub(in crate::kernels) fn best() -> Option<Isa> {
            Isa::ALL.into_iter().find(|isa| isa.supported())
        }
    }

    /// One KV head of the cache, and for the batch order its keys transposed.
    struct Kv<'a> {
        /// Key rows, f16 bits.
        kc: &'a [u16],
        /// Value rows, f16 bits.
        vc: &'a [u16],
        /// [`transpose_keys`] of this head (batch order only, else empty).
        kt: &'a [f32],
        hkv: usize,
        kvh: usize,
        dh: usize,
    }

    impl Kv<'_> {
        #[inline(always)]
        fn row(&self, j: usize) -> usize {
            (j * self.hkv + self.kvh) * self.dh
        }
    }

    /// A worker's buffers, reused across the query heads it takes.
    #[derive(Default)]
    struct Scratch {
        /// Scores, then weights, of the item's heads, one after the other, each `n` rounded up
        /// to whole blocks of 16.
        sc: Vec<f32>,
        /// The value-sum slots of the item's heads, `slots · dh` each (every element is stored
        /// before it is read).
        acc: Vec<f32>,
    }

    impl Scratch {
        /// Sizes the buffers for `heads` heads of `n` keys, the scores zeroed.
        fn prepare(&mut self, heads: usize, n: usize, slots: usize, dh: usize) {
            self.sc.clear();
            self.sc.resize(heads * n.div_ceil(16) * 16, 0.0);
            if self.acc.len() < heads * slots * dh {
                self.acc.resize(heads * slots * dh, 0.0);
            }
        }
    }

    /// How many query heads of one KV head a work item of the AVX2 kernel takes: as many of the
    /// `group` as leave at least one item per thread (the heads then share every key and
    /// value row they read, which the cache would otherwise stream once per head).
    fn heads_per_item(heads_total: usize, group: usize) -> usize {
        let threads = rayon::current_num_threads();
        (1..=group).rev().find(|&m| group.is_multiple_of(m) && heads_total / m >= threads).unwrap_or(1)
    }

    /// Keys of one KV head transposed into blocks of 16: `kt[(b·dh + e)·16 + l]` is element
    /// `e` of key `16b + l` (zero past the last key).
    fn transpose_keys(kc: &[u16], n: usize, hkv: usize, kvh: usize, dh: usize) -> Vec<f32> {
        let nb = n.div_ceil(16);
        let mut kt = vec![0.0f32; nb * dh * 16];
        for j in 0..n {
            let (b, l) = (j / 16, j % 16);
            let key = &kc[(j * hkv + kvh) * dh..(j * hkv + kvh + 1) * dh];
            for (e, &v) in key.iter().enumerate() {
                kt[(b * dh + e) * 16 + l] = half::f16::from_bits(v).to_f32();
            }
        }
        kt
    }

    /// Scores of the query heads `qg` (`m · dh`, all on KV head `kvh`; `dh` a multiple of 64)
    /// against the keys `keys` of `0..n` (`keys.start` a multiple of 16) of the f16 key rows
    /// `kc` (`hkv` heads a row), in `ggml_vec_dot_f16`'s order and `· scale`, as the one-token
    /// kernels here score: head `h`'s score of key `j` at `sc[h·stride + j − keys.start]`, in
    /// whole blocks of 16 (0 past `n`), so `stride` is at least `keys.len()` rounded up to 16.
    /// On the kernel `isa`. What [`crate::kernels::attention_q`]'s online kernel scores an f16
    /// cache with.
    ///
    /// # Safety
    ///
    /// The CPU runs `isa` ([`Isa::supported`]), and `sc` holds `m` rows of `stride`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::kernels) unsafe fn scores_one_token(
        isa: Isa,
        qg: &[f32],
        kc: &[u16],
        (hkv, kvh, dh): (usize, usize, usize),
        n: usize,
        keys: std::ops::Range<usize>,
        scale: f32,
        sc: *mut f32,
        stride: usize,
    ) {
        debug_assert!(dh.is_multiple_of(64) && keys.start.is_multiple_of(16) && keys.end <= n);
        let kv = Kv { kc, vc: &[], kt: &[], hkv, kvh, dh };
        match isa {
            Isa::Avx512 => avx512::scores_range(qg, &kv, n, keys, scale, sc, stride),
            Isa::Avx2 => avx2::scores_vec(qg, &kv, keys, scale, sc, stride),
        }
    }

    /// [`super::causal`] on the kernel `isa` (which this CPU must run: checked).
    pub(super) fn causal(isa: Isa, q: &[f32], kc: &[u16], vc: &[u16], s: AttnShape, order: F16Dot) -> Vec<f32> {
        // The AVX-512 kernel takes one head per item (its loads do not share rows between
        // heads); the AVX2 one as many of a KV head's as the threads leave.
        let m = match isa {
            Isa::Avx512 if !avx512::multi_head(order, s.head_dim) => 1,
            _ => heads_per_item(s.t * s.heads, s.heads / s.kv_heads),
        };
        causal_items(isa, m, q, kc, vc, s, order)
    }

    /// [`causal`] in work items of `m` consecutive query heads of one token, all on one KV
    /// head (`m` divides `heads / kv_heads`; checked).
    pub(super) fn causal_items(
        isa: Isa,
        m: usize,
        q: &[f32],
        kc: &[u16],
        vc: &[u16],
        s: AttnShape,
        order: F16Dot,
    ) -> Vec<f32> {
        assert!(isa.supported(), "the {isa:?} attention kernel needs a CPU that has it");
        let AttnShape { t, pos0, heads: hq, kv_heads: hkv, head_dim: dh, scale } = s;
        let group = hq / hkv;
        assert!(dh.is_multiple_of(16), "the vector attention kernels take head_dim a multiple of 16, not {dh}");
        assert!(m > 0 && group.is_multiple_of(m), "{m} heads per item do not divide a group of {group}");
        let n_all = pos0 + t;
        let kts: Vec<Vec<f32>> = if order == F16Dot::Gemm {
            (0..hkv).into_par_iter().map(|kvh| transpose_keys(kc, n_all, hkv, kvh, dh)).collect()
        } else {
            Vec::new()
        };
        let slots = if order == F16Dot::Gemm { 16 } else { 64 };
        let mut o = vec![0.0f32; t * hq * dh];
        o.par_chunks_mut(m * dh).enumerate().for_each_init(Scratch::default, |scratch, (item, og)| {
            let first = item * m;
            let (i, kvh) = (first / hq, first % hq / group);
            let qg = &q[first * dh..(first + m) * dh];
            let n = pos0 + i + 1;
            let kt = kts.get(kvh).map_or(&[][..], |v| &v[..]);
            let kv = Kv { kc, vc, kt, hkv, kvh, dh };
            // SAFETY: `isa.supported()` was checked above; `prepare` sizes the buffers.
            unsafe {
                match isa {
                    Isa::Avx512 if avx512::multi_head(order, dh) => {
                        scratch.prepare(m, n, slots, dh);
                        avx512::heads_vec(qg, &kv, n, scale, scratch, og);
                    }
                    Isa::Avx512 => {
                        for (qh, oh) in qg.chunks_exact(dh).zip(og.chunks_exact_mut(dh)) {
                            scratch.prepare(1, n, slots, dh);
                            avx512::head(qh, &kv, n, scale, order, scratch, oh);
                        }
                    }
                    Isa::Avx2 => {
                        scratch.prepare(m, n, slots, dh);
                        avx2::heads(qg, &kv, n, scale, order, scratch, og);
                    }
                }
            }
        });
        o
    }

    /// The largest of the scores (the softmax's first pass; comparisons round nothing).
    fn max_score(sc: &[f32]) -> f32 {
        let mut max = f32::NEG_INFINITY;
        for &v in sc {
            if v > max {
                max = v;
            }
        }
        max
    }

    /// The end of a one-token score: the body's tree sum plus, for a head not a multiple of
    /// 64, the products past the last whole step added in f64; then `· scale`.
    #[inline(always)]
    fn vec_score(qh: &[f32], k: &[u16], np: usize, body: f32, scale: f32) -> f32 {
        if np == qh.len() {
            body * scale
        } else {
            let tail: f64 = qh[np..]
                .iter()
                .zip(&k[np..qh.len()])
                .map(|(x, y)| (x * half::f16::from_bits(*y).to_f32()) as f64)
                .sum();
            (body as f64 + tail) as f32 * scale
        }
    }

    /// GCC's `_mm512_reduce_add_ps` of a 16-lane register given as its two 256-bit halves
    /// (lanes 0–7, 8–15): `hi + lo`, then the 128-bit halves, then `movehl`, then `movehdup`.
    #[inline]
    #[target_feature(enable = "avx,sse3")]
    unsafe fn reduce16_halves(lo: __m256, hi: __m256) -> f32 {
        let t = _mm256_add_ps(hi, lo);
        let s = _mm_add_ps(_mm256_extractf128_ps::<1>(t), _mm256_castps256_ps128(t));
        let u = _mm_add_ps(_mm_movehl_ps(s, s), s); // [s0 + s2, s1 + s3, ..]
        _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)))
    }

    /// The AVX-512 kernel: for a batch sixteen keys at a time for the scores (one lane per
    /// key), for one token one key at a time in four registers; the exponentials sixteen at a
    /// time; the value sum one 16-wide chunk of the head at a time with four slots in flight.
    mod avx512 {
        use std::arch::x86_64::*;

        use super::{max_score, reduce16_halves, vec_score, Kv, Scratch};
        use crate::quant::ggml::{tree16, x86::expf16, F16Dot};

        /// Scores, softmax, f16 weights and value sum of one query head.
        #[target_feature(enable = "avx512f,fma,f16c")]
        pub(super) unsafe fn head(
            qh: &[f32],
            kv: &Kv,
            n: usize,
            scale: f32,
            order: F16Dot,
            s: &mut Scratch,
            oh: &mut [f32],
        ) {
            let slots = if order == F16Dot::Gemm { 16 } else { 64 };
            if order == F16Dot::Gemm {
                scores_gemm(qh, kv.kt, n, kv.dh, scale, &mut s.sc);
            } else {
                scores_vec(qh, kv, n, scale, &mut s.sc);
            }
            softmax_f16(&mut s.sc, n);
            weighted_values(kv, &s.sc, n, slots, &mut s.acc, oh);
        }

        /// Whether a work item of this kernel takes several query heads at once
        /// ([`heads_vec`]): one token's order on heads of whole steps of 64. Otherwise it takes
        /// one head ([`head`]).
        pub(super) fn multi_head(order: F16Dot, dh: usize) -> bool {
            order == F16Dot::Vec && dh.is_multiple_of(64)
        }

        /// One token's attention for the query heads `qg` (`m · dh`, all on the KV head of `kv`,
        /// `dh` a multiple of 64) into `og`, in `ggml_vec_dot_f16`'s order like [`head`], but
        /// reading the cache once per item, front to back: each key is converted once for all
        /// the heads, sixteen keys' score sums are reduced together ([`reduce16_each`]), and
        /// the value sums take the rows in streams ([`weighted_values_heads`]).
        /// [`super::super::causal_in_llama_order`] for one token.
        #[target_feature(enable = "avx512f,fma,f16c")]
        pub(super) unsafe fn heads_vec(qg: &[f32], kv: &Kv, n: usize, scale: f32, s: &mut Scratch, og: &mut [f32]) {
            let ns = n.div_ceil(16) * 16;
            scores_range(qg, kv, n, 0..n, scale, s.sc.as_mut_ptr(), ns);
            for sc in s.sc.chunks_exact_mut(ns) {
                softmax_f16(sc, n);
            }
            values_range(kv, &s.sc, n, 0..64, s.acc.as_mut_ptr(), og.len() / kv.dh);
            combine_slots(&mut s.acc, n, kv.dh, og);
        }

        /// [`scores_vec_heads`] for the query heads `qg` (any number, four at a time) and
        /// the keys `keys` (starting at a multiple of 16) of `0..n`: head `h`'s score of key `j`
        /// at `sc[h·ns + j − keys.start]`, which must hold `qg.len() / dh` rows of `ns`.
        #[target_feature(enable = "avx512f,fma,f16c")]
        pub(super) unsafe fn scores_range(
            qg: &[f32],
            kv: &Kv,
            n: usize,
            keys: std::ops::Range<usize>,
            scale: f32,
            sc: *mut f32,
            ns: usize,
        ) {
            let dh = kv.dh;
            if keys.is_empty() {
                return;
            }
            let mut h0 = 0;
            while h0 < qg.len() / dh {
                let hn = (qg.len() / dh - h0).min(4);
                let (q, out) = (&qg[h0 * dh..(h0 + hn) * dh], sc.add(h0 * ns));
                let keys = keys.clone();
                match hn {
                    4 => scores_vec_heads::<4>(q, kv, n, keys, scale, out, ns),
                    3 => scores_vec_heads::<3>(q, kv, n, keys, scale, out, ns),
                    2 => scores_vec_heads::<2>(q, kv, n, keys, scale, out, ns),
                    _ => scores_vec_heads::<1>(q, kv, n, keys, scale, out, ns),
                }
                h0 += hn;
            }
        }

        /// Scores of `M` query heads (`q`, `M · dh`) against the keys `keys` of `0..n`
        /// (`keys.start` a multiple of 16) in `ggml_vec_dot_f16`'s order (head `h`'s score of
        /// key `j` at `sc[h·ns + j − keys.start]`): per key the four 16-lane accumulators of each head over steps of 64,
        /// combined `(a0 + a2) + (a1 + a3)`; per block of sixteen keys the trees of all sixteen
        /// at once; then `· scale`. Lanes past `n` get a score of 0 (never read as a weight:
        /// the softmax masks them).
        #[target_feature(enable = "avx512f,fma,f16c")]
        unsafe fn scores_vec_heads<const M: usize>(
            q: &[f32],
            kv: &Kv,
            n: usize,
            keys: std::ops::Range<usize>,
            scale: f32,
            sc: *mut f32,
            ns: usize,
        ) {
            let dh = kv.dh;
            let scale_v = _mm512_set1_ps(scale);
            let mut lanes = [[_mm512_setzero_ps(); 16]; M];
            for b in keys.start / 16..keys.end.div_ceil(16) {
                let live = (n - 16 * b).min(16);
                for l in 0..16 {
                    if l >= live {
                        lanes.iter_mut().for_each(|lh| lh[l] = _mm512_setzero_ps());
                        continue;
                    }
                    let k = kv.kc.as_ptr().add(kv.row(16 * b + l));
                    let mut a = [[_mm512_setzero_ps(); 4]; M];
                    for step in (0..dh).step_by(64) {
                        let kk: [__m512; 4] =
                            std::array::from_fn(|g| _mm512_cvtph_ps(_mm256_loadu_si256(k.add(step + 16 * g).cast())));
                        for (h, ah) in a.iter_mut().enumerate() {
                            let qh = q.as_ptr().add(h * dh + step);
                            for (g, ag) in ah.iter_mut().enumerate() {
                                *ag = _mm512_fmadd_ps(_mm512_loadu_ps(qh.add(16 * g)), kk[g], *ag);
                            }
                        }
                    }
                    for (lh, ah) in lanes.iter_mut().zip(&a) {
                        lh[l] = _mm512_add_ps(_mm512_add_ps(ah[0], ah[2]), _mm512_add_ps(ah[1], ah[3]));
                    }
                }
                for (h, lh) in lanes.iter().enumerate() {
                    let out = _mm512_mul_ps(reduce16_each(lh), scale_v);
                    _mm512_storeu_ps(sc.add(h * ns + 16 * b - keys.start), out);
                }
            }
        }

        /// Lane `i` of the result is [`reduce16`] of `v[i]` (GCC's tree: halves, then
        /// quarters, then `s0 + s2` and `s1 + s3`, then their sum), all sixteen at once: each
        /// level adds two shuffles of a pair of vectors, so every addition is one of the
        /// tree's, on the same two operands.
        #[inline]
        #[target_feature(enable = "avx512f,fma,f16c")]
        unsafe fn reduce16_each(v: &[__m512; 16]) -> __m512 {
            // Level 1: x[p] = [t(v[2p]), t(v[2p+1])], t(a)[i] = a[i + 8] + a[i].
            let x: [__m512; 8] = std::array::from_fn(|p| {
                let (a, b) = (v[2 * p], v[2 * p + 1]);
                _mm512_add_ps(_mm512_shuffle_f32x4::<0b11_10_11_10>(a, b), _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b))
            });
            // Level 2: 128-bit lane k of y[p] is s(v[4p + k]), s(a)[i] = t(a)[i + 4] + t(a)[i].
            let y: [__m512; 4] = std::array::from_fn(|p| {
                let (a, b) = (x[2 * p], x[2 * p + 1]);
                _mm512_add_ps(_mm512_shuffle_f32x4::<0b11_01_11_01>(a, b), _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b))
            });
            // Level 3: lane k of z[p] is [s0 + s2, s1 + s3] of y[2p]'s lane k, then of y[2p + 1]'s.
            let z: [__m512; 2] = std::array::from_fn(|p| {
                let (a, b) = (y[2 * p], y[2 * p + 1]);
                _mm512_add_ps(_mm512_shuffle_ps::<0x44>(a, b), _mm512_shuffle_ps::<0xEE>(a, b))
            });
            // Level 4: element e of lane k is the sum for y[e]'s lane k, that is v[4e + k].
            let w = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(z[0], z[1]), _mm512_shuffle_ps::<0xDD>(z[0], z[1]));
            _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), w)
        }

        /// `Σ p·v` over keys `0..n` for each head (weights at `sc[h·ns..]`, 64 slots at
        /// `acc[h·64·dh..]`, result at `og[h·dh..]`) in `ggml_vec_dot_f16`'s order: slot
        /// `j mod 64` sums its keys in ascending order, then the slots are combined and reduced
        /// per element. The keys go in tiles of [`ROUNDS`] · 64: each slot adds its `ROUNDS`
        /// keys of the tile in one pass over its sums (one load and store per `ROUNDS`
        /// multiply-adds), the rows read as `ROUNDS` streams front to back, every head taking
        /// them while they are in L1.
        /// Only the slots `slots` are summed (the others' sums are not touched), into `acc`,
        /// which holds `64 · dh` sums for each of the `m` heads; [`combine_slots`] finishes.
        #[target_feature(enable = "avx512f,fma,f16c")]
        unsafe fn values_range(kv: &Kv, sc: &[f32], n: usize, slots: std::ops::Range<usize>, acc: *mut f32, m: usize) {
            const SLOTS: usize = 64;
            let (dh, ns) = (kv.dh, n.div_ceil(16) * 16);
            for t0 in (0..n).step_by(ROUNDS * SLOTS) {
                for s in slots.start..slots.end.min(n - t0) {
                    let j0 = t0 + s;
                    let rounds = (n - j0).div_ceil(SLOTS).min(ROUNDS);
                    let rows: [*const u16; ROUNDS] = std::array::from_fn(|r| {
                        let j = if r < rounds { j0 + r * SLOTS } else { j0 };
                        kv.vc.as_ptr().add(kv.row(j))
                    });
                    let mut h0 = 0;
                    while h0 < m {
                        let hn = (m - h0).min(HEADS);
                        let p: [[__m512; ROUNDS]; HEADS] = std::array::from_fn(|h| {
                            std::array::from_fn(|r| {
                                if h < hn && r < rounds {
                                    _mm512_set1_ps(*sc.get_unchecked((h0 + h) * ns + j0 + r * SLOTS))
                                } else {
                                    _mm512_setzero_ps()
                                }
                            })
                        });
                        let a = acc.add((h0 * SLOTS + s) * dh);
                        let first = t0 == 0;
                        match rounds {
                            4 => add_rounds::<4>(a, SLOTS * dh, hn, &p, &rows, dh, first),
                            3 => add_rounds::<3>(a, SLOTS * dh, hn, &p, &rows, dh, first),
                            2 => add_rounds::<2>(a, SLOTS * dh, hn, &p, &rows, dh, first),
                            _ => add_rounds::<1>(a, SLOTS * dh, hn, &p, &rows, dh, first),
                        }
                        h0 += hn;
                    }
                }
            }
        }

        /// Heads [`values_range`] takes per pass over a slot's rows (their weights stay in
        /// registers, each row chunk is converted once for all of them).
        const HEADS: usize = 4;

        /// The end of [`values_range`] once every slot is summed: per head (`og`, `m · dh`;
        /// its 64 slots at `acc[h·64·dh..]`) the slots `l`, `l + 16`, `l + 32`, `l + 48`
        /// combined as `ggml_vec_dot_f16` does, then the tree over `l` (slots no key reached
        /// count as 0).
        #[target_feature(enable = "avx512f,fma,f16c")]
        unsafe fn combine_slots(acc: &mut [f32], n: usize, dh: usize, og: &mut [f32]) {
            const SLOTS: usize = 64;
            for (h, oh) in og.chunks_exact_mut(dh).enumerate() {
                let acc_h = &mut acc[h * SLOTS * dh..(h + 1) * SLOTS * dh];
                acc_h[n.min(SLOTS) * dh..].fill(0.0);
                let slot = |l: usize, c: usize| _mm512_loadu_ps(acc_h.as_ptr().add(l * dh + 16 * c));
                for c in 0..dh / 16 {
                    let lanes: [__m512; 16] = std::array::from_fn(|l| {
                        _mm512_add_ps(
                            _mm512_add_ps(slot(l, c), slot(32 + l, c)),
                            _mm512_add_ps(slot(16 + l, c), slot(48 + l, c)),
                        )
                    });
                    _mm512_storeu_ps(oh.as_mut_ptr().add(16 * c), reduce16_lanes(&lanes));
                }
            }
        }

        /// Keys of one slot taken together by [`weighted_values_heads`]: `ROUNDS` keys 64 apart.
        const ROUNDS: usize = 4;

        /// For each of the first `heads` heads `h` (sums at `a + h·stride`):
        /// `a_h[..dh] += Σ_r p[h][r]·rows[r][..dh]` for `r` in `0..R` in that order (from 0
        /// when `first`: a slot's first key adds to 0, as the reference's slots start). Each
        /// 16-wide chunk of the rows is converted once for all the heads.
        #[inline]
        #[target_feature(enable = "avx512f,fma,f16c")]
        unsafe fn add_rounds<const R: usize>(
            a: *mut f32,
            stride: usize,
            heads: usize,
            p: &[[__m512; ROUNDS]; HEADS],
            rows: &[*const u16; ROUNDS],
            dh: usize,
            first: bool,
        ) {
            for i in (0..dh).step_by(16) {
                let v: [__m512; R] =
                    std::array::from_fn(|r| _mm512_cvtph_ps(_mm256_loadu_si256(rows[r].add(i).cast())));
                for (h, ph) in p.iter().enumerate().take(heads) {
                    let at = a.add(h * stride + i);
                    let mut sum = if first { _mm512_setzero_ps() } else { _mm512_loadu_ps(at) };
                    for r in 0..R {
                        sum = _mm512_fmadd_ps(ph[r], v[r], sum);
                    }
                    _mm512_storeu_ps(at, sum);
                }
            }
        }

        /// [`tree16`] of sixteen vectors, lane by lane.
        #[inline]
        #[target_feature(enable = "avx512f,fma,f16c")]
        unsafe fn reduce16_lanes(v: &[__m512; 16]) -> __m512 {
            tree16(v, |a, b| _mm512_add_ps(a, b))
        }

        /// GCC's `_mm512_reduce_add_ps` of one vector (the tree of `ggml::reduce16`).
        #[inline]
        #[target_feature(enable = "avx512f,fma,f16c")]
        unsafe fn reduce16(v: __m512) -> f32 {
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            reduce16_halves(_mm512_castps512_ps256(v), hi)
        }

        /// Scores of one query against keys `0..n` in the batch order, sixteen keys at a time:
        /// lane `l` of `a[e mod 16]` accumulates `q[e]·k[e]` of key `16b + l` over `e`
        /// ascending, exactly the lanes of the reference's dot for that key; then the reduction
        /// tree and `· scale`.
        #[target_feature(enable = "avx512f,fma,f16c")]
        unsafe fn scores_gemm(qh: &[f32], kt: &[f32], n: usize, dh: usize, scale: f32, sc: &mut [f32]) {
            let scale_v = _mm512_set1_ps(scale);
            for b in 0..n.div_ceil(16) {
                let kb = kt.as_ptr().add(b * dh * 16);
                let mut a = [_mm512_setzero_ps(); 16];
                for c in 0..dh / 16 {
                    for (l, al) in a.iter_mut().enumerate() {
                        let e = 16 * c + l;
                        *al =
                            _mm512_fmadd_ps(_mm512_set1_ps(*qh.get_unchecked(e)), _mm512_loadu_ps(kb.add(e * 16)), *al);
                    }
                }
                _mm512_storeu_ps(sc.as_mut_ptr().add(16 * b), _mm512_mul_ps(reduce16_lanes(&a), scale_v));
            }
        }

        /// Scores of one query against keys `0..n` in `ggml_vec_dot_f16`'s order: four 16-lane
        /// accumulators over steps of 64, combined `(a0 + a2) + (a1 + a3)`, the tree, a tail
        /// past the last whole step added in f64; then `· scale`.
        #[target_feature(enable = "avx512f,fma,f16c")]
        unsafe fn scores_vec(qh: &[f32], kv: &Kv, n: usize, scale: f32, sc: &mut [f32]) {
            let dh = kv.dh;
            let np = dh / 64 * 64;
            for (j, out) in sc.iter_mut().enumerate().take(n) {
                let k = &kv.kc[kv.row(j)..kv.row(j) + dh];
                let mut a = [_mm512_setzero_ps(); 4];
                for step in (0..np).step_by(64) {
                    for (g, ag) in a.iter_mut().enumerate() {
                        let e = step + 16 * g;
                        *ag = _mm512_fmadd_ps(
                            _mm512_loadu_ps(qh.as_ptr().add(e)),
                            _mm512_cvtph_ps(_mm256_loadu_si256(k.as_ptr().add(e).cast())),
                            *ag,
                        );
                    }
                }
                let lanes = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
                *out = vec_score(qh, k, np, reduce16(lanes), scale);
            }
        }

        /// `ggml::softmax` of `sc[..n]` (max, exp in blocks of 16 reduced by the tree, block
        /// sums in f64, one multiply by 1/sum), then every weight rounded to f16; lanes past
        /// `n` are zero.
        #[target_feature(enable = "avx512f,fma,f16c")]
        unsafe fn softmax_f16(sc: &mut [f32], n: usize) {
            let nb = n.div_ceil(16);
            let max_v = _mm512_set1_ps(max_score(&sc[..n]));
            let mut sum = 0.0f64;
            for b in 0..nb {
                let p = sc.as_mut_ptr().add(16 * b);
                let live = if 16 * b + 16 <= n { 0xFFFF } else { ((1u32 << (n - 16 * b)) - 1) as u16 };
                let e = _mm512_maskz_mov_ps(live, expf16(_mm512_sub_ps(_mm512_loadu_ps(p), max_v)));
                _mm512_storeu_ps(p, e);
                sum += reduce16(e) as f64;
            }
            let inv = _mm512_set1_ps((1.0 / sum) as f32);
            for b in 0..nb {
                let p = sc.as_mut_ptr().add(16 * b);
                let w = _mm512_mul_ps(_mm512_loadu_ps(p), inv);
                let r = _mm512_cvtph_ps(_mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(w));
                _mm512_storeu_ps(p, r);
            }
        }

        /// `Σ p·v` over keys `0..n`: slot `j mod slots` sums its keys in ascending order (four
        /// slots in flight per 16-wide chunk of the head), then the slots are reduced per
        /// element: by the tree (16 slots, batch order) or `ggml_vec_dot_f16`'s combine and
        /// tree (64 slots).
        #[target_feature(enable = "avx512f,fma,f16c")]
        unsafe fn weighted_values(kv: &Kv, sc: &[f32], n: usize, slots: usize, acc: &mut [f32], oh: &mut [f32]) {
            let dh = kv.dh;
            for c in 0..dh / 16 {
                for g in 0..slots / 4 {
                    let mut s4 = [_mm512_setzero_ps(); 4];
                    let mut j0 = 0;
                    while j0 < n {
                        for (k, sk) in s4.iter_mut().enumerate() {
                            let j = j0 + 4 * g + k;
                            if j < n {
                                let p = _mm512_set1_ps(*sc.get_unchecked(j));
                                let v = kv.vc.as_ptr().add(kv.row(j) + 16 * c);
                                *sk = _mm512_fmadd_ps(p, _mm512_cvtph_ps(_mm256_loadu_si256(v.cast())), *sk);
                            }
                        }
                        j0 += slots;
                    }
                    for (k, sk) in s4.iter().enumerate() {
                        _mm512_storeu_ps(acc.as_mut_ptr().add((4 * g + k) * dh + 16 * c), *sk);
                    }
                }
            }
            let slot = |l: usize, c: usize| _mm512_loadu_ps(acc.as_ptr().add(l * dh + 16 * c));
            for c in 0..dh / 16 {
                let lanes: [__m512; 16] = if slots == 16 {
                    std::array::from_fn(|l| slot(l, c))
                } else {
                    std::array::from_fn(|l| {
                        _mm512_add_ps(
                            _mm512_add_ps(slot(l, c), slot(32 + l, c)),
                            _mm512_add_ps(slot(16 + l, c), slot(48 + l, c)),
                        )
                    })
                };
                _mm512_storeu_ps(oh.as_mut_ptr().add(16 * c), reduce16_lanes(&lanes));
            }
        }
    }

    /// The AVX2 kernel: the AVX-512 kernel's steps with each 16-lane register as two 256-bit
    /// halves (lanes 0–7 and 8–15). For a batch the scores take eight keys at a time (one half
    /// of a transposed block of 16), for one token one key at a time in eight registers; the
    /// exponentials eight at a time ([`expf8`]); the value sum a few keys of one slot at a
    /// time, its sums in memory. A work item holds several query heads of one KV head (GQA)
    /// and takes every key and value row for all of them at once, so the cache is read once
    /// per item, front to back, where the AVX-512 kernel reads it once per head, in strides.
    mod avx2 {
        use std::arch::x86_64::*;

        use super::{max_score, reduce16_halves, vec_score, Kv, Scratch};
        use crate::quant::ggml::{tree16, x86::expf8, F16Dot};

        /// Scores, softmax, f16 weights and value sum of the query heads `qg` (`m · dh`, all on
        /// the KV head of `kv`), into `og` (`m · dh`).
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn heads(
            qg: &[f32],
            kv: &Kv,
            n: usize,
            scale: f32,
            order: F16Dot,
            s: &mut Scratch,
            og: &mut [f32],
        ) {
            let ns = n.div_ceil(16) * 16;
            if order == F16Dot::Gemm {
                scores_gemm(qg, kv.kt, n, kv.dh, scale, &mut s.sc);
            } else {
                scores_vec(qg, kv, 0..n, scale, s.sc.as_mut_ptr(), ns);
            }
            for sc in s.sc.chunks_exact_mut(ns) {
                softmax_f16(sc, n);
            }
            let slots = if order == F16Dot::Gemm { 16 } else { 64 };
            let m = og.len() / kv.dh;
            weighted_values(kv, &s.sc, n, slots, 0..slots, s.acc.as_mut_ptr(), m);
            combine_slots(&mut s.acc, n, slots, kv.dh, og);
        }

        /// [`tree16`] of sixteen vectors, lane by lane.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn reduce16_lanes(v: &[__m256; 16]) -> __m256 {
            tree16(v, |a, b| _mm256_add_ps(a, b))
        }

        /// Scores of each query head of `qg` against keys `0..n` in the batch order (head `h`'s
        /// at `sc[h·ns..]`): each transposed block of 16 keys in two halves of eight, lane `l`
        /// of `a[e mod 16]` accumulating `q[e]·k[e]` of its key over `e` ascending (the AVX-512
        /// kernel's lanes, eight at a time); then the tree and `· scale`. Every head takes a
        /// half while it is in L1.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scores_gemm(qg: &[f32], kt: &[f32], n: usize, dh: usize, scale: f32, sc: &mut [f32]) {
            let ns = n.div_ceil(16) * 16;
            let scale_v = _mm256_set1_ps(scale);
            for b in 0..n.div_ceil(16) {
                for half in 0..2 {
                    if 16 * b + 8 * half >= n {
                        break; // a half of padding keys: its lanes are never read
                    }
                    let kb = kt.as_ptr().add(b * dh * 16 + 8 * half);
                    for (h, qh) in qg.chunks_exact(dh).enumerate() {
                        let mut a = [_mm256_setzero_ps(); 16];
                        for c in 0..dh / 16 {
                            for (l, al) in a.iter_mut().enumerate() {
                                let e = 16 * c + l;
                                let k = _mm256_loadu_ps(kb.add(e * 16));
                                *al = _mm256_fmadd_ps(_mm256_set1_ps(*qh.get_unchecked(e)), k, *al);
                            }
                        }
                        let out = _mm256_mul_ps(reduce16_lanes(&a), scale_v);
                        _mm256_storeu_ps(sc.as_mut_ptr().add(h * ns + 16 * b + 8 * half), out);
                    }
                }
            }
        }

        /// Scores of each query head of `qg` against the keys `keys` in `ggml_vec_dot_f16`'s
        /// order (head `h`'s score of key `j` at `sc[h·ns + j − keys.start]`): the four 16-lane
        /// accumulators as eight halves,
        /// combined `(a0 + a2) + (a1 + a3)` half by half, the tree, the f64 tail; then
        /// `· scale`. Every head takes a key while it is in L1.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn scores_vec(
            qg: &[f32],
            kv: &Kv,
            keys: std::ops::Range<usize>,
            scale: f32,
            sc: *mut f32,
            ns: usize,
        ) {
            let dh = kv.dh;
            let np = dh / 64 * 64;
            if keys.is_empty() {
                return;
            }
            if np == dh && keys.start.is_multiple_of(8) {
                return scores_vec_blocks(qg, kv, keys, scale, sc, ns);
            }
            for j in keys.clone() {
                let k = &kv.kc[kv.row(j)..kv.row(j) + dh];
                for (h, qh) in qg.chunks_exact(dh).enumerate() {
                    let mut a = [[_mm256_setzero_ps(); 2]; 4];
                    for step in (0..np).step_by(64) {
                        for (g, ag) in a.iter_mut().enumerate() {
                            for (hf, agh) in ag.iter_mut().enumerate() {
                                let e = step + 16 * g + 8 * hf;
                                let x = _mm256_loadu_ps(qh.as_ptr().add(e));
                                let y = _mm256_cvtph_ps(_mm_loadu_si128(k.as_ptr().add(e).cast()));
                                *agh = _mm256_fmadd_ps(x, y, *agh);
                            }
                        }
                    }
                    let half =
                        |hf: usize| _mm256_add_ps(_mm256_add_ps(a[0][hf], a[2][hf]), _mm256_add_ps(a[1][hf], a[3][hf]));
                    *sc.add(h * ns + j - keys.start) = vec_score(qh, k, np, reduce16_halves(half(0), half(1)), scale);
                }
            }
        }

        /// [`scores_vec`] for heads of whole steps of 64 (no f64 tail) and keys from a multiple
        /// of 8: the same sums per key, but the trees of eight keys reduced together
        /// ([`reduce8_each`]) instead of one horizontal reduction per key. Up to four heads and
        /// two keys at a time, so that each key value is converted from f16 once for every
        /// head and each query load serves two keys: a loop over one head and one key was
        /// bound by its loads and conversions (two loads per multiply-add; this way a Qwen3.5-4B
        /// layer's one-token attention runs about 1.2× faster from cache on a Zen 3). Lanes past
        /// the last key of a block get a score of 0.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scores_vec_blocks(
            qg: &[f32],
            kv: &Kv,
            keys: std::ops::Range<usize>,
            scale: f32,
            sc: *mut f32,
            ns: usize,
        ) {
            let heads = qg.len() / kv.dh;
            let mut h0 = 0;
            while h0 < heads {
                let m = (heads - h0).min(4);
                let (q, out) = (&qg[h0 * kv.dh..(h0 + m) * kv.dh], sc.add(h0 * ns));
                match m {
                    4 => scores_blocks_heads::<4>(q, kv, keys.clone(), scale, out, ns),
                    3 => scores_blocks_heads::<3>(q, kv, keys.clone(), scale, out, ns),
                    2 => scores_blocks_heads::<2>(q, kv, keys.clone(), scale, out, ns),
                    _ => scores_blocks_heads::<1>(q, kv, keys.clone(), scale, out, ns),
                }
                h0 += m;
            }
        }

        /// [`scores_vec_blocks`] for `M` heads (`q`, `M · dh`; head `h`'s scores at
        /// `sc[h·ns..]`). Per key, eight-lane slice `(g, hf)` of the four 16-lane accumulators
        /// is one chain of FMAs over the steps of 64, as in the one-head loop; the slices are
        /// then added as that loop's tree adds them, `(a0 + a2) + (a1 + a3)` per half, then
        /// `hi + lo`, so each head gets the same bits.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scores_blocks_heads<const M: usize>(
            q: &[f32],
            kv: &Kv,
            keys: std::ops::Range<usize>,
            scale: f32,
            sc: *mut f32,
            ns: usize,
        ) {
            let dh = kv.dh;
            let scale_v = _mm256_set1_ps(scale);
            // Slice (g, hf) of two keys for every head: Σ over the steps, in order, from 0;
            // each query load serves both keys.
            let slice = |k0: *const u16, k1: *const u16, e: usize| -> [[__m256; M]; 2] {
                let (mut a0, mut a1) = ([_mm256_setzero_ps(); M], [_mm256_setzero_ps(); M]);
                for step in (0..dh).step_by(64) {
                    let y0 = _mm256_cvtph_ps(_mm_loadu_si128(k0.add(step + e).cast()));
                    let y1 = _mm256_cvtph_ps(_mm_loadu_si128(k1.add(step + e).cast()));
                    for (h, (s0, s1)) in a0.iter_mut().zip(&mut a1).enumerate() {
                        let x = _mm256_loadu_ps(q.as_ptr().add(h * dh + step + e));
                        *s0 = _mm256_fmadd_ps(x, y0, *s0);
                        *s1 = _mm256_fmadd_ps(x, y1, *s1);
                    }
                }
                [a0, a1]
            };
            let add = |x: [[__m256; M]; 2], y: [[__m256; M]; 2]| -> [[__m256; M]; 2] {
                std::array::from_fn(|i| std::array::from_fn(|h| _mm256_add_ps(x[i][h], y[i][h])))
            };
            for b in keys.start / 8..keys.end.div_ceil(8) {
                let live = (keys.end - 8 * b).min(8);
                let mut t = [[_mm256_setzero_ps(); 8]; M];
                for l in (0..live).step_by(2) {
                    // (An odd last key is scored twice; the copy is not kept.)
                    let k0 = kv.kc.as_ptr().add(kv.row(8 * b + l));
                    let k1 = kv.kc.as_ptr().add(kv.row(8 * b + (l + 1).min(live - 1)));
                    // Slice (g, hf) starts at element 16g + 8hf of each step.
                    let half = |hf: usize| {
                        let s02 = add(slice(k0, k1, 8 * hf), slice(k0, k1, 32 + 8 * hf));
                        let s13 = add(slice(k0, k1, 16 + 8 * hf), slice(k0, k1, 48 + 8 * hf));
                        add(s02, s13)
                    };
                    let lo = half(0);
                    // The tree's first level (`hi + lo`, as `reduce16_halves` starts).
                    let tl = add(half(1), lo);
                    for (i, tk) in tl.iter().enumerate().take(live - l) {
                        for (th, v) in t.iter_mut().zip(tk) {
                            th[l + i] = *v;
                        }
                    }
                }
                for (h, th) in t.iter().enumerate() {
                    _mm256_storeu_ps(sc.add(h * ns + 8 * b - keys.start), _mm256_mul_ps(reduce8_each(th), scale_v));
                }
            }
        }

        /// Lane `i` of the result is the rest of `reduce16_halves`'s tree on `t[i]` (its upper
        /// and lower four lanes added, then `s0 + s2` and `s1 + s3`, then their sum), all eight
        /// at once: every addition is one of the tree's, on the same two operands.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn reduce8_each(t: &[__m256; 8]) -> __m256 {
            // 128-bit lane k of y[p] is s(t[2p + k]), s[i] = t[i + 4] + t[i].
            let y: [__m256; 4] = std::array::from_fn(|p| {
                let (a, b) = (t[2 * p], t[2 * p + 1]);
                _mm256_add_ps(_mm256_permute2f128_ps::<0x31>(a, b), _mm256_permute2f128_ps::<0x20>(a, b))
            });
            // Lane k of z[p]: [s0 + s2, s1 + s3] of y[2p]'s lane k, then of y[2p + 1]'s.
            let z: [__m256; 2] = std::array::from_fn(|p| {
                let (a, b) = (y[2 * p], y[2 * p + 1]);
                _mm256_add_ps(_mm256_shuffle_ps::<0x44>(a, b), _mm256_shuffle_ps::<0xEE>(a, b))
            });
            // Element e of lane k: the sum for y[e]'s lane k, that is t[2e + k].
            let w = _mm256_add_ps(_mm256_shuffle_ps::<0x88>(z[0], z[1]), _mm256_shuffle_ps::<0xDD>(z[0], z[1]));
            _mm256_permutevar8x32_ps(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
        }

        /// `ggml::softmax` of `sc[..n]` as the AVX-512 kernel computes it, each block of 16 as
        /// two halves (lanes past `n` zeroed by a mask, the block's sum by the tree from the two
        /// halves), then every weight rounded to f16.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn softmax_f16(sc: &mut [f32], n: usize) {
            let nb = n.div_ceil(16);
            let max_v = _mm256_set1_ps(max_score(&sc[..n]));
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let mut sum = 0.0f64;
            for b in 0..nb {
                let mut e = [_mm256_setzero_ps(); 2];
                for (h, eh) in e.iter_mut().enumerate() {
                    let first = 16 * b + 8 * h;
                    let p = sc.as_mut_ptr().add(first);
                    let live = _mm256_cmpgt_epi32(_mm256_set1_epi32(n.saturating_sub(first).min(8) as i32), lane);
                    *eh = _mm256_and_ps(_mm256_castsi256_ps(live), expf8(_mm256_sub_ps(_mm256_loadu_ps(p), max_v)));
                    _mm256_storeu_ps(p, *eh);
                }
                sum += reduce16_halves(e[0], e[1]) as f64;
            }
            let inv = _mm256_set1_ps((1.0 / sum) as f32);
            for i in (0..16 * nb).step_by(8) {
                let p = sc.as_mut_ptr().add(i);
                let w = _mm256_mul_ps(_mm256_loadu_ps(p), inv);
                let r = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(w));
                _mm256_storeu_ps(p, r);
            }
        }

        /// `Σ p·v` over keys `0..n` for each head (weights at `sc[h·ns..]`, slots at
        /// `acc[h·slots·dh..]`, result at `og[h·dh..]`): slot `j mod slots` sums its keys in
        /// ascending order, then the slots are reduced per element by the tree (16 slots, batch
        /// order) or `ggml_vec_dot_f16`'s combine and tree (64 slots). The keys go in tiles of
        /// [`ROUNDS`] · `slots`: each slot adds its `ROUNDS` keys of the tile in one pass over
        /// its sums in `acc` (one load and store per four multiply-adds), the value rows read
        /// as `ROUNDS` streams front to back, and every head of the item takes them while they
        /// are in L1.
        ///
        /// Only the slots `range` are summed (the others' sums are not touched), into `acc`,
        /// which holds `slots · dh` sums for each of the `m` heads; [`combine_slots`] finishes.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn weighted_values(
            kv: &Kv,
            sc: &[f32],
            n: usize,
            slots: usize,
            range: std::ops::Range<usize>,
            acc: *mut f32,
            m: usize,
        ) {
            let (dh, ns) = (kv.dh, n.div_ceil(16) * 16);
            let tile = ROUNDS * slots;
            for t0 in (0..n).step_by(tile) {
                for s in range.start..range.end.min(n - t0) {
                    let j0 = t0 + s;
                    let rounds = (n - j0).div_ceil(slots).min(ROUNDS);
                    let rows: [*const u16; ROUNDS] = std::array::from_fn(|r| {
                        let j = if r < rounds { j0 + r * slots } else { j0 };
                        kv.vc.as_ptr().add(kv.row(j))
                    });
                    for h in 0..m {
                        let p: [__m256; ROUNDS] = std::array::from_fn(|r| {
                            if r < rounds {
                                _mm256_set1_ps(*sc.get_unchecked(h * ns + j0 + r * slots))
                            } else {
                                _mm256_setzero_ps()
                            }
                        });
                        let a = acc.add((h * slots + s) * dh);
                        match rounds {
                            4 => add_rounds::<4>(a, &p, &rows, dh, t0 == 0),
                            3 => add_rounds::<3>(a, &p, &rows, dh, t0 == 0),
                            2 => add_rounds::<2>(a, &p, &rows, dh, t0 == 0),
                            _ => add_rounds::<1>(a, &p, &rows, dh, t0 == 0),
                        }
                    }
                }
            }
        }

        /// The end of [`weighted_values`] once every slot is summed: per head (`og`, `m · dh`;
        /// its slots at `acc[h·slots·dh..]`) the slots reduced per element by the tree (16
        /// slots) or `ggml_vec_dot_f16`'s combine and tree (64); slots no key reached count
        /// as 0.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn combine_slots(acc: &mut [f32], n: usize, slots: usize, dh: usize, og: &mut [f32]) {
            for (h, oh) in og.chunks_exact_mut(dh).enumerate() {
                let acc_h = &mut acc[h * slots * dh..(h + 1) * slots * dh];
                acc_h[n.min(slots) * dh..].fill(0.0);
                let slot = |l: usize, c: usize| _mm256_loadu_ps(acc_h.as_ptr().add(l * dh + 8 * c));
                for c in 0..dh / 8 {
                    let lanes: [__m256; 16] = if slots == 16 {
                        std::array::from_fn(|l| slot(l, c))
                    } else {
                        std::array::from_fn(|l| {
                            _mm256_add_ps(
                                _mm256_add_ps(slot(l, c), slot(32 + l, c)),
                                _mm256_add_ps(slot(16 + l, c), slot(48 + l, c)),
                            )
                        })
                    };
                    _mm256_storeu_ps(oh.as_mut_ptr().add(8 * c), reduce16_lanes(&lanes));
                }
            }
        }

        /// Keys of one slot taken together by [`weighted_values`]: `ROUNDS` keys `slots` apart.
        const ROUNDS: usize = 4;

        /// `a[..dh] += Σ_r p[r]·rows[r][..dh]` for `r` in `0..R` in that order (from 0 when
        /// `first`: a slot's first key adds to 0, as the reference's slots start).
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn add_rounds<const R: usize>(
            a: *mut f32,
            p: &[__m256; ROUNDS],
            rows: &[*const u16; ROUNDS],
            dh: usize,
            first: bool,
        ) {
            for i in (0..dh).step_by(8) {
                let mut sum = if first { _mm256_setzero_ps() } else { _mm256_loadu_ps(a.add(i)) };
                for r in 0..R {
                    sum = _mm256_fmadd_ps(p[r], _mm256_cvtph_ps(_mm_loadu_si128(rows[r].add(i).cast())), sum);
                }
                _mm256_storeu_ps(a.add(i), sum);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn f16_values(n: usize, seed: u64, amp: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n).map(|_| round_f16(lcg(&mut s) * amp)).collect()
    }

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

    /// `(t, pos0, heads, kv_heads, head_dim, amplitude of q and k)`.
    const CASES: [(usize, usize, usize, usize, usize, f32); 13] = [
        (1, 0, 2, 1, 16, 1.0),
        (5, 0, 9, 3, 64, 2.0),
        (17, 3, 4, 2, 32, 4.0),
        (33, 40, 6, 2, 64, 8.0),
        (20, 0, 3, 3, 48, 30.0), // wide scores: exponentials that underflow to subnormals and 0
        (7, 100, 2, 1, 128, 0.5),
        (1, 300, 9, 3, 64, 3.0),    // decode at a longer position
        (1, 169, 4, 2, 64, 2.0),    // decode, the value tile of 256 keys three quarters full
        (1, 1030, 6, 1, 128, 4.0),  // decode, Coder-1.5B's head (dh 128, 6 heads per KV head)
        (1, 1100, 9, 3, 64, 3.0),   // decode past 1,024 keys
        (2, 70, 4, 1, 80, 1.0),     // a head of 80: the f64 tail of the one-token order
        (24, 509, 12, 2, 128, 2.0), // a prefill chunk past 512 cached positions, GQA 6:1
        (6, 2, 2, 1, 40, 1.0),      // head_dim not a multiple of 16: the plain path
    ];

    fn inputs(t: usize, pos0: usize, hq: usize, hkv: usize, dh: usize, amp: f32) -> [Vec<f32>; 3] {
        let n = pos0 + t;
        [
            f16_values(t * hq * dh, 1 + t as u64, amp),
            f16_values(n * hkv * dh, 2 + n as u64, amp),
            f16_values(n * hkv * dh, 3 + dh as u64, 1.0),
        ]
    }

    fn shape(t: usize, pos0: usize, hq: usize, hkv: usize, dh: usize) -> AttnShape {
        AttnShape { t, pos0, heads: hq, kv_heads: hkv, head_dim: dh, scale: 1.0 / (dh as f32).sqrt() }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_vector_kernel_equals_the_reference_bit_for_bit() {
        for isa in x86::Isa::ALL {
            if !isa.supported() {
                let what = format!("kernels::attention {isa:?} causal attention");
                let needs = if isa == x86::Isa::Avx512 { "avx512f" } else { "avx2+fma+f16c" };
                crate::test_support::report_skip(needs, &what);
                continue;
            }
            for (t, pos0, hq, hkv, dh, amp) in CASES.into_iter().filter(|c| c.4 % 16 == 0) {
                let [q, k, v] = inputs(t, pos0, hq, hkv, dh, amp);
                let s = shape(t, pos0, hq, hkv, dh);
                let group = hq / hkv;
                for order in [F16Dot::Gemm, F16Dot::Vec] {
                    let want = causal_reference(&q, &k, &v, s, order);
                    // Every grouping of a KV head's query heads into work items gives the same
                    // bits (what the thread count picks must not matter).
                    for m in (1..=group).filter(|m| group % m == 0) {
                        let got = x86::causal_items(isa, m, &q, &bits(&k), &bits(&v), s, order);
                        let what =
                            format!("{isa:?} {order:?} t={t} pos0={pos0} hq={hq} hkv={hkv} dh={dh}, {m} per item");
                        assert_same_bits(&got, &want, &what);
                    }
                }
            }
        }
    }

    /// The f16 bits of f16-exact values.
    fn bits(x: &[f32]) -> Vec<u16> {
        x.iter().map(|&e| half::f16::from_f32(e).to_bits()).collect()
    }

    /// An f16 cache holding `x` (`[n, hkv · dh]`).
    fn f16_cache(x: &[f32], hkv: usize, dh: usize) -> KvRows {
        let mut r = KvRows::new(crate::cache::KvType::F16, hkv * dh, dh);
        r.push(x);
        r
    }

    #[test]
    fn causal_equals_the_reference_on_every_shape() {
        // Whatever `causal` picks here for an f16 cache (a vector kernel, or the plain path for
        // a head of 40 or a CPU without one), it returns the reference's bits, except that a
        // batch from `TILED_FROM` positions on takes the tiled kernel (its own order) and one
        // token on heads of 64·k the online kernel (the bits of its own reference).
        let plain = crate::kernels::plain_kernels();
        for (t, pos0, hq, hkv, dh, amp) in CASES {
            let [q, k, v] = inputs(t, pos0, hq, hkv, dh, amp);
            let s = shape(t, pos0, hq, hkv, dh);
            let (kc, vc) = (f16_cache(&k, hkv, dh), f16_cache(&v, hkv, dh));
            for order in [F16Dot::Gemm, F16Dot::Vec] {
                let online = order == F16Dot::Vec && t == 1 && dh % 64 == 0 && !plain;
                let want = if online {
                    crate::kernels::attention_q::causal_one_f16_reference(&q, &bits(&k), &bits(&v), s)
                } else {
                    causal_reference(&q, &k, &v, s, order)
                };
                let got = causal(&q, &kc, &vc, s, order);
                let what = format!("{order:?} t={t} pos0={pos0} dh={dh}");
                if order == F16Dot::Gemm && pos0 + t >= TILED_FROM {
                    let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                    assert!(worst < 2e-3, "{what}: the tiled kernel is {worst} off");
                } else {
                    assert_same_bits(&got, &want, &what);
                }
            }
        }
    }

    #[test]
    fn attention_is_causal_and_weights_the_values() {
        // Key j scores 2j against every query and carries the value j: query i averages the
        // values 0..=i, mostly i (weight ≈ 0.86), so its output lies in (i − 1, i + 0.5); the
        // key after it would outscore the rest and pull the output to about i + 0.85.
        let (dh, n) = (64, 20);
        let s = AttnShape { t: n, pos0: 0, heads: 1, kv_heads: 1, head_dim: dh, scale: 1.0 / 8.0 };
        let q = vec![1.0f32; n * dh];
        let k: Vec<f32> = (0..n * dh).map(|i| (i / dh) as f32 / 4.0).collect();
        let v: Vec<f32> = (0..n * dh).map(|i| (i / dh) as f32).collect();
        for order in [F16Dot::Gemm, F16Dot::Vec] {
            let o = causal(&q, &f16_cache(&k, 1, dh), &f16_cache(&v, 1, dh), s, order);
            for (i, row) in o.chunks_exact(dh).enumerate() {
                let (lo, hi) = (i as f32 - 1.0, i as f32 + 0.5);
                assert!(row.iter().all(|&x| x > lo && x < hi), "{order:?}: query {i} gave {}", row[0]);
            }
        }
    }
}
