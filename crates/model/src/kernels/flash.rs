//! Tiled causal attention with an online softmax (flash-attention style, docs/model.md §4):
//! what long prompts and quantized KV caches run.
//!
//! Work items are a tile of [`TILE_QUERIES`] new tokens × one KV head (all the query heads of
//! its group). An item walks the keys its last query sees in tiles of [`tile_keys`]: it
//! brings the tile's keys (transposed, one lane per key) and values into f32 buffers — from
//! f16 bits, or ggml's dequantization of Q8_0/Q4_0 blocks — and every row (query, head) of the
//! item then takes one step on them:
//!
//! ```text
//! s_j  = (Σ_e q_e·k_je, e ascending, one fused multiply-add each) · scale   (−∞ past the row's causal end)
//! m'   = max(m, max_j s_j);   α = expf(m − m');   p_j = expf(s_j − m')
//! l    = l·α + Σ_j p_j        (eight lanes, key j in lane j mod 8, then a fixed tree)
//! o_e  = o_e·α, then o_e += p_j·v_je for j ascending (fused)
//! ```
//!
//! and the output is `o / l`. Memory is the item's tile buffers and `rows · head_dim` sums,
//! whatever the length. A row's result depends only on its query, the keys and the tile size,
//! not on the query tiling or the thread count. `expf` is ggml's ([`ggml::expf`]); the AVX2
//! kernel computes exactly the steps above, eight keys or eight elements per register, and
//! tests hold it to [`causal_tiled_reference`] bit for bit. Against llama.cpp's
//! non-flash-attention order ([`super::attention::causal_reference`]) results differ by
//! rounding only (the weights are not rounded to f16, the normalisation comes last).

use rayon::prelude::*;

use super::attention::AttnShape;
use crate::cache::KvRows;
use crate::quant::ggml;

/// New tokens per work item.
pub const TILE_QUERIES: usize = 32;

/// Keys per tile for heads of `head_dim`: the transposed keys and the values of a tile take
/// 16 KiB each for heads up to 128 (both stay in L1 while every row of the item reads them),
/// 32 KiB each for Qwen3.5's heads of 256.
pub fn tile_keys(head_dim: usize) -> usize {
    if head_dim <= 64 {
        64
    } else {
        32
    }
}

/// Which code takes the tiled kernel's steps. Every one gives the same bits
/// ([`causal_tiled_reference`]'s); they differ in speed and in the CPUs that run them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TiledKernel {
    /// AVX-512F (with AVX2, FMA and F16C): sixteen keys or elements per register, up to four
    /// rows of a group sharing each load; `head_dim` a multiple of 16.
    Avx512,
    /// AVX2 with FMA and F16C: eight keys or elements per register, up to two rows at once;
    /// `head_dim` a multiple of 8.
    Avx2,
    /// Plain code, one element at a time.
    Reference,
}

impl TiledKernel {
    /// Every kernel, fastest first.
    pub const ALL: [TiledKernel; 3] = [TiledKernel::Avx512, TiledKernel::Avx2, TiledKernel::Reference];

    /// Whether this CPU runs the kernel on heads of `head_dim`.
    pub fn supported(self, head_dim: usize) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            TiledKernel::Avx512 => head_dim.is_multiple_of(16) && x86_512::supported(),
            #[cfg(target_arch = "x86_64")]
            TiledKernel::Avx2 => head_dim.is_multiple_of(8) && x86::supported(),
            TiledKernel::Reference => true,
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest kernel this CPU runs on heads of `head_dim`.
    pub fn best(head_dim: usize) -> TiledKernel {
        TiledKernel::ALL.into_iter().find(|k| k.supported(head_dim)).unwrap_or(TiledKernel::Reference)
    }
}

/// [`causal_tiled_reference`] on the fastest kernel this CPU runs ([`TiledKernel::best`]; same
/// bits).
pub fn causal_tiled(q: &[f32], k: &KvRows, v: &KvRows, s: AttnShape) -> Vec<f32> {
    causal_tiled_with(TiledKernel::best(s.head_dim), q, k, v, s)
}

/// [`causal_tiled`] on the kernel `kernel` (for benchmarks and tests that set them side by
/// side).
///
/// # Panics
/// When this CPU does not run `kernel` on heads of `s.head_dim` ([`TiledKernel::supported`]).
pub fn causal_tiled_with(kernel: TiledKernel, q: &[f32], k: &KvRows, v: &KvRows, s: AttnShape) -> Vec<f32> {
    assert!(
        kernel.supported(s.head_dim),
        "the {kernel:?} tiled attention kernel does not run here on heads of {}",
        s.head_dim
    );
    match kernel {
        #[cfg(target_arch = "x86_64")]
        TiledKernel::Avx512 => run(q, k, v, s, true, |o, ml, qg, tile, visible, scale| {
            // SAFETY: AVX-512F, AVX2, FMA and F16C were detected; head_dim is a multiple of 16.
            unsafe { x86_512::step_group(o, ml, qg, tile, visible, scale) }
        }),
        #[cfg(target_arch = "x86_64")]
        TiledKernel::Avx2 => run(q, k, v, s, true, |o, ml, qg, tile, visible, scale| {
            // SAFETY: AVX2, FMA and F16C were detected; head_dim is a multiple of 8.
            unsafe { x86::step_group(o, ml, qg, tile, visible, scale) }
        }),
        _ => causal_tiled_reference(q, k, v, s),
    }
}

/// The tiled kernel in plain code, one element at a time (the vector kernel's test reference).
pub fn causal_tiled_reference(q: &[f32], k: &KvRows, v: &KvRows, s: AttnShape) -> Vec<f32> {
    run(q, k, v, s, false, |o, ml, qg, tile, visible, scale| {
        let dh = tile.dh;
        for ((or, (m, l)), qr) in o.chunks_exact_mut(dh).zip(ml.iter_mut()).zip(qg.chunks_exact(dh)) {
            let mut st = RowState { m: *m, l: *l, o: or };
            step_reference(&mut st, qr, tile, visible, scale);
            (*m, *l) = (st.m, st.l);
        }
    })
}

/// What the driver calls for the rows of one query (its KV head's `group` query heads, which
/// see the same keys): their sums `o` (`rows · dh`), `(m, l)` pairs and queries `qg`, on a
/// tile of which the first `visible` keys are in their causal window.
type GroupStep<'a> = dyn Fn(&mut [f32], &mut [(f32, f32)], &[f32], &Tile, usize, f32) + Sync + 'a;

/// One row's running state: the maximum score so far, the sum of weights and the weighted
/// value sums (`head_dim`).
struct RowState<'a> {
    m: f32,
    l: f32,
    o: &'a mut [f32],
}

/// A tile's keys and values as f32: `kt[e·tk + j]` is element `e` of key `j`, `vt[j·dh + e]`
/// element `e` of value `j`; keys and values past the tile's end are zero.
struct Tile {
    kt: Vec<f32>,
    vt: Vec<f32>,
    tk: usize,
    dh: usize,
    /// The KV head the tile holds.
    kvh: usize,
}

/// The weight sum's lane tree: `[l0..l7]` as `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`
/// (the AVX2 kernel's halves, then `movehl`, then `movehdup`).
#[inline(always)]
pub(super) fn tree8(l: &[f32; 8]) -> f32 {
    let s: [f32; 4] = std::array::from_fn(|i| l[i + 4] + l[i]);
    (s[2] + s[0]) + (s[3] + s[1])
}

/// The online-softmax update once a row's running maximum `m` meets the tile's maximum `mt`:
/// returns `α = expf(m − m')`, the factor for the old sums, and the new maximum `m'`.
#[inline(always)]
fn rescale(m: f32, mt: f32) -> (f32, f32) {
    let m_new = m.max(mt);
    (ggml::expf(m - m_new), m_new)
}

/// One row's step on a tile (keys `0..visible` of it are in its causal window), plain.
fn step_reference(st: &mut RowState, qr: &[f32], tile: &Tile, visible: usize, scale: f32) {
    let (tk, dh) = (tile.tk, tile.dh);
    let mut sc = vec![f32::NEG_INFINITY; tk];
    for (j, out) in sc.iter_mut().enumerate().take(visible) {
        let mut acc = 0.0f32;
        for (e, &qe) in qr.iter().enumerate() {
            acc = qe.mul_add(tile.kt[e * tk + j], acc);
        }
        *out = acc * scale;
    }
    let mt = sc.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let (alpha, m_new) = rescale(st.m, mt);
    st.m = m_new;
    let mut lanes = [0.0f32; 8];
    for (j, x) in sc.iter_mut().enumerate() {
        *x = if j < visible { ggml::expf(*x - m_new) } else { 0.0 };
        lanes[j % 8] += *x;
    }
    st.l = st.l * alpha + tree8(&lanes);
    for (e, o) in st.o.iter_mut().enumerate() {
        let mut acc = *o * alpha;
        for (j, &p) in sc.iter().enumerate().take(visible) {
            acc = p.mul_add(tile.vt[j * dh + e], acc);
        }
        *o = acc;
    }
}

/// The driver: work items of [`TILE_QUERIES`] tokens × one KV head in parallel, each walking
/// its key tiles and taking `step` for each of its rows.
/// `f16c`: the CPU converts f16 with F16C (then an f16 tile is loaded eight values at a time;
/// the values are the same either way).
fn run<F>(q: &[f32], k: &KvRows, v: &KvRows, s: AttnShape, f16c: bool, step: F) -> Vec<f32>
where
    F: Fn(&mut [f32], &mut [(f32, f32)], &[f32], &Tile, usize, f32) + Sync,
{
    let step: &GroupStep = &step;
    let AttnShape { t, pos0, heads: hq, kv_heads: hkv, head_dim: dh, .. } = s;
    let group = hq / hkv;
    assert_eq!(k.len(), pos0 + t, "the cache holds {} keys, not pos0 + t = {}", k.len(), pos0 + t);
    assert_eq!((k.width(), v.width(), k.head_dim()), (hkv * dh, hkv * dh, dh), "cache rows do not match the shape");
    let tk = tile_keys(dh);
    let items: Vec<(usize, usize)> =
        (0..t.div_ceil(TILE_QUERIES)).flat_map(|b| (0..hkv).map(move |h| (b, h))).collect();
    let outs: Vec<Vec<f32>> = items
        .par_iter()
        .map(|&(b, kvh)| {
            let (i0, i1) = (b * TILE_QUERIES, ((b + 1) * TILE_QUERIES).min(t));
            let rows = (i1 - i0) * group;
            let mut o = vec![0.0f32; rows * dh];
            let mut ml: Vec<(f32, f32)> = vec![(f32::NEG_INFINITY, 0.0); rows];
            let mut tile = Tile { kt: vec![0.0; dh * tk], vt: vec![0.0; tk * dh], tk, dh, kvh };
            let mut row = vec![0.0f32; dh];
            let n_keys = pos0 + i1;
            for j0 in (0..n_keys).step_by(tk) {
                let nk = tk.min(n_keys - j0);
                #[cfg(target_arch = "x86_64")]
                if let (true, Some(kb), Some(vb)) = (f16c, k.f16_bits(), v.f16_bits()) {
                    // SAFETY: `f16c` says F16C (and AVX2) were detected; dh is a multiple of 8.
                    unsafe { x86::load_f16_tile(&mut tile, kb, vb, j0, nk, hkv * dh, kvh) };
                    step_rows(&mut o, &mut ml, &tile, (i0, j0, nk), q, s, &step);
                    continue;
                }
                let _ = f16c;
                for j in 0..tk {
                    if j < nk {
                        k.head_into(j0 + j, kvh, &mut row);
                        for (e, &x) in row.iter().enumerate() {
                            tile.kt[e * tk + j] = x;
                        }
                        v.head_into(j0 + j, kvh, &mut tile.vt[j * dh..(j + 1) * dh]);
                    } else {
                        for e in 0..dh {
                            tile.kt[e * tk + j] = 0.0;
                        }
                        tile.vt[j * dh..(j + 1) * dh].fill(0.0);
                    }
                }
                step_rows(&mut o, &mut ml, &tile, (i0, j0, nk), q, s, &step);
            }
            for (or, (_, l)) in o.chunks_exact_mut(dh).zip(&ml) {
                or.iter_mut().for_each(|x| *x /= l);
            }
            o
        })
        .collect();
    let mut out = vec![0.0f32; t * hq * dh];
    for (&(b, kvh), o) in items.iter().zip(&outs) {
        for (r, or) in o.chunks_exact(dh).enumerate() {
            let (i, h) = (b * TILE_QUERIES + r / group, kvh * group + r % group);
            out[(i * hq + h) * dh..(i * hq + h + 1) * dh].copy_from_slice(or);
        }
    }
    out
}

/// Every row of a work item (first token `i0`) takes `step` on the tile of `nk` keys from `j0`,
/// those it sees of them.
fn step_rows(
    o: &mut [f32],
    ml: &mut [(f32, f32)],
    tile: &Tile,
    (i0, j0, nk): (usize, usize, usize),
    q: &[f32],
    s: AttnShape,
    step: &GroupStep,
) {
    let (hq, dh, group) = (s.heads, s.head_dim, s.heads / s.kv_heads);
    for (r, (og, mlg)) in o.chunks_exact_mut(group * dh).zip(ml.chunks_exact_mut(group)).enumerate() {
        let i = i0 + r;
        let visible = nk.min((s.pos0 + i + 1).saturating_sub(j0));
        if visible == 0 {
            continue;
        }
        let h0 = tile.kvh * group;
        let qg = &q[(i * hq + h0) * dh..(i * hq + h0 + group) * dh];
        step(og, mlg, qg, tile, visible, s.scale);
    }
}

/// Calls `step(o, ml, q)` on the rows of one query's group (sums `o`, `(m, l)` states `ml`,
/// queries `qg`, `dh` values a row) `most` rows at a time, the last call taking what is left.
#[cfg(target_arch = "x86_64")]
fn in_row_groups(
    o: &mut [f32],
    ml: &mut [(f32, f32)],
    qg: &[f32],
    dh: usize,
    most: usize,
    mut step: impl FnMut(&mut [f32], &mut [(f32, f32)], &[f32]),
) {
    let mut r = 0;
    while r < ml.len() {
        let n = (ml.len() - r).min(most);
        step(&mut o[r * dh..(r + n) * dh], &mut ml[r..r + n], &qg[r * dh..(r + n) * dh]);
        r += n;
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    //! [`step`]: [`super::step_reference`] eight keys (scores, weights) or eight elements
    //! (value sums) per AVX2 register.

    use std::arch::x86_64::*;

    use super::{rescale, tree8, RowState, Tile};
    use crate::quant::ggml::x86::expf8;

    /// Whether this CPU runs [`step`].
    pub(super) fn supported() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }

    /// Keys `j0..j0 + nk` of KV head `tile.kvh` from f16 rows (`width` values each) into the
    /// tile: values row by row, keys transposed, zeros past `nk` (what
    /// [`crate::cache::KvRows::head_into`] gives, eight values per conversion).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn load_f16_tile(
        tile: &mut Tile,
        kb: &[u16],
        vb: &[u16],
        j0: usize,
        nk: usize,
        width: usize,
        kvh: usize,
    ) {
        let (tk, dh) = (tile.tk, tile.dh);
        let mut row = [0.0f32; 8];
        for j in 0..tk {
            let vr = tile.vt.as_mut_ptr().add(j * dh);
            if j >= nk {
                for e in 0..dh {
                    *tile.kt.get_unchecked_mut(e * tk + j) = 0.0;
                    *vr.add(e) = 0.0;
                }
                continue;
            }
            let at = (j0 + j) * width + kvh * dh;
            assert!(at + dh <= kb.len() && at + dh <= vb.len());
            for e0 in (0..dh).step_by(8) {
                let v = _mm256_cvtph_ps(_mm_loadu_si128(vb.as_ptr().add(at + e0).cast()));
                _mm256_storeu_ps(vr.add(e0), v);
                let k = _mm256_cvtph_ps(_mm_loadu_si128(kb.as_ptr().add(at + e0).cast()));
                _mm256_storeu_ps(row.as_mut_ptr(), k);
                for (l, &x) in row.iter().enumerate() {
                    *tile.kt.get_unchecked_mut((e0 + l) * tk + j) = x;
                }
            }
        }
    }

    /// [`super::step_reference`] for each row of a query's group, two rows at a time sharing
    /// every key and value load. Not three: three rows' 12 accumulators, four key (or value)
    /// registers and a broadcast need 17 of AVX2's 16 registers, so accumulators went to the
    /// stack inside the multiply-add chains, each step then waiting on a store and a reload;
    /// in pairs the 8 chains stay in registers and the loads fold into the multiply-adds (one
    /// layer's prefill attention at 2,048 tokens on a Zen 3, one thread: 146–160 ms → 105–114
    /// for SmolLM2's groups of three, 1.4× at Qwen3.5-4B's groups of four, 1.7× at
    /// Qwen2.5-Coder's groups of six).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn step_group(
        o: &mut [f32],
        ml: &mut [(f32, f32)],
        qg: &[f32],
        tile: &Tile,
        visible: usize,
        scale: f32,
    ) {
        super::in_row_groups(o, ml, qg, tile.dh, 2, |os, mls, qs| match mls.len() {
            2 => multi::<2>(os, mls, qs, tile, visible, scale),
            _ => {
                let mut st = RowState { m: mls[0].0, l: mls[0].1, o: os };
                step(&mut st, qs, tile, visible, scale);
                mls[0] = (st.m, st.l);
            }
        });
    }

    /// [`step`] for `R` rows at once: the scores four chunks of eight keys at a time for all
    /// rows (one load of each key vector for `R` multiply-adds), the value sums four registers
    /// of the head at a time for all rows. Each row's arithmetic is [`step`]'s.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn multi<const R: usize>(
        o: &mut [f32],
        ml: &mut [(f32, f32)],
        qg: &[f32],
        tile: &Tile,
        visible: usize,
        scale: f32,
    ) {
        let (tk, dh) = (tile.tk, tile.dh);
        let chunks = visible.div_ceil(8);
        let mut acc = [[_mm256_setzero_ps(); 8]; R];
        for c0 in (0..chunks).step_by(4) {
            let mut a = [[_mm256_setzero_ps(); 4]; R];
            for e in 0..dh {
                let kr = tile.kt.as_ptr().add(e * tk + 8 * c0);
                let k: [__m256; 4] = std::array::from_fn(|c| _mm256_loadu_ps(kr.add(8 * c)));
                for (r, ar) in a.iter_mut().enumerate() {
                    let qv = _mm256_set1_ps(*qg.get_unchecked(r * dh + e));
                    for (c, ac) in ar.iter_mut().enumerate() {
                        *ac = _mm256_fmadd_ps(qv, k[c], *ac);
                    }
                }
            }
            for (r, ar) in a.iter().enumerate() {
                for (c, ac) in ar.iter().enumerate() {
                    if c0 + c < 8 {
                        acc[r][c0 + c] = *ac;
                    }
                }
            }
        }
        let mut p = [[0.0f32; 64]; R];
        let mut alpha = [_mm256_setzero_ps(); R];
        let mut alpha_s = [0.0f32; R];
        for r in 0..R {
            let al = softmax_step(&acc[r], visible, scale, &mut ml[r], &mut p[r]);
            alpha[r] = _mm256_set1_ps(al);
            alpha_s[r] = al;
        }
        let mut e0 = 0;
        while e0 + 32 <= dh {
            let mut a: [[__m256; 4]; R] = std::array::from_fn(|r| {
                std::array::from_fn(|i| _mm256_mul_ps(_mm256_loadu_ps(o.as_ptr().add(r * dh + e0 + 8 * i)), alpha[r]))
            });
            for j in 0..visible {
                let vr = tile.vt.as_ptr().add(j * dh + e0);
                let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(vr.add(8 * i)));
                for (r, ar) in a.iter_mut().enumerate() {
                    let pv = _mm256_set1_ps(*p[r].get_unchecked(j));
                    for (i, ai) in ar.iter_mut().enumerate() {
                        *ai = _mm256_fmadd_ps(pv, v[i], *ai);
                    }
                }
            }
            for (r, ar) in a.iter().enumerate() {
                for (i, ai) in ar.iter().enumerate() {
                    _mm256_storeu_ps(o.as_mut_ptr().add(r * dh + e0 + 8 * i), *ai);
                }
            }
            e0 += 32;
        }
        for r in 0..R {
            let mut e = e0;
            while e < dh {
                values::<1>(&mut o[r * dh..(r + 1) * dh], e, &p[r], tile, visible, alpha_s[r]);
                e += 8;
            }
        }
    }

    /// [`super::step_reference`] with AVX2 (`tile.dh` a multiple of 8, `tile.tk` of 8 and at
    /// most 64).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn step(st: &mut RowState, qr: &[f32], tile: &Tile, visible: usize, scale: f32) {
        let dh = tile.dh;
        let chunks = visible.div_ceil(8);
        let mut acc = [_mm256_setzero_ps(); 8];
        match chunks {
            1 => scores::<1>(qr, tile, &mut acc),
            2 => scores::<2>(qr, tile, &mut acc),
            3 => scores::<3>(qr, tile, &mut acc),
            4 => scores::<4>(qr, tile, &mut acc),
            5 => scores::<5>(qr, tile, &mut acc),
            6 => scores::<6>(qr, tile, &mut acc),
            7 => scores::<7>(qr, tile, &mut acc),
            _ => scores::<8>(qr, tile, &mut acc),
        }
        let mut p = [0.0f32; 64];
        let mut ml = (st.m, st.l);
        let alpha = softmax_step(&acc, visible, scale, &mut ml, &mut p);
        (st.m, st.l) = ml;
        let mut e0 = 0;
        while e0 < dh {
            let nv = ((dh - e0) / 8).min(8);
            match nv {
                8 => values::<8>(st.o, e0, &p, tile, visible, alpha),
                4..=7 => values::<4>(st.o, e0, &p, tile, visible, alpha),
                2 | 3 => values::<2>(st.o, e0, &p, tile, visible, alpha),
                _ => values::<1>(st.o, e0, &p, tile, visible, alpha),
            }
            e0 += 8 * match nv {
                8 => 8,
                4..=7 => 4,
                2 | 3 => 2,
                _ => 1,
            };
        }
    }

    /// One row's softmax step on its raw scores `s` (keys `8c..8c + 8` in `s[c]`; keys
    /// `0..visible` live): `· scale`, masked to −∞, the tile's maximum, `α = expf(m − m')`, the
    /// weights `expf(s − m')` into `p` (zero past `visible`), and `l = l·α + Σ p` summed over
    /// eight lanes (key `j` in lane `j mod 8`) and [`tree8`]. Updates `ml = (m, l)`; returns `α`.
    /// Both vector kernels take their softmax here, so it has one set of bits.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn softmax_step(
        s: &[__m256; 8],
        visible: usize,
        scale: f32,
        ml: &mut (f32, f32),
        p: &mut [f32; 64],
    ) -> f32 {
        let chunks = visible.div_ceil(8);
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
        let scale_v = _mm256_set1_ps(scale);
        let mut masks = [_mm256_setzero_ps(); 8];
        let mut x = [_mm256_setzero_ps(); 8];
        let mut maxv = neg_inf;
        for c in 0..chunks {
            let live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((visible - 8 * c) as i32), lane));
            masks[c] = live;
            x[c] = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(s[c], scale_v), live);
            maxv = _mm256_max_ps(maxv, x[c]);
        }
        let mut mx = [0.0f32; 8];
        _mm256_storeu_ps(mx.as_mut_ptr(), maxv);
        let mt = mx.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let (alpha, m_new) = rescale(ml.0, mt);
        let mv = _mm256_set1_ps(m_new);
        let mut sum = _mm256_setzero_ps();
        for c in 0..chunks {
            let e = _mm256_and_ps(masks[c], expf8(_mm256_sub_ps(x[c], mv)));
            sum = _mm256_add_ps(sum, e);
            _mm256_storeu_ps(p.as_mut_ptr().add(8 * c), e);
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
        *ml = (m_new, ml.1 * alpha + tree8(&lanes));
        alpha
    }

    /// `acc[c]` = the dot products of `qr` with keys `8c..8c + 8` of the tile (`c < C`), one
    /// fused multiply-add per element, `e` ascending; `C` fixed so the loop is straight code.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores<const C: usize>(qr: &[f32], tile: &Tile, acc: &mut [__m256; 8]) {
        let mut a = [_mm256_setzero_ps(); C];
        for (e, &qe) in qr.iter().enumerate() {
            let qv = _mm256_set1_ps(qe);
            let kr = tile.kt.as_ptr().add(e * tile.tk);
            for (c, ac) in a.iter_mut().enumerate() {
                *ac = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr.add(8 * c)), *ac);
            }
        }
        acc[..C].copy_from_slice(&a);
    }

    /// `o[e0..e0 + 8N] = o·α + Σ_j p_j·v_j` over the tile's visible keys, the sums in registers.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values<const N: usize>(o: &mut [f32], e0: usize, p: &[f32; 64], tile: &Tile, visible: usize, alpha: f32) {
        add_weighted_rows::<N>(o.as_mut_ptr().add(e0), p, tile.vt.as_ptr().add(e0), tile.dh, visible, alpha)
    }

    /// `acc[0..8N] = acc·α + Σ_{j < live} p_j · rows[j·stride ..][..8N]`, the sums in registers
    /// in key order: the value step of an online softmax (this tiled kernel's, and the
    /// quantized-cache decode kernel's, `super::attention_q`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::kernels) unsafe fn add_weighted_rows<const N: usize>(
        acc: *mut f32,
        p: &[f32],
        rows: *const f32,
        stride: usize,
        live: usize,
        alpha: f32,
    ) {
        let mut a: [__m256; N] = std::array::from_fn(|r| _mm256_loadu_ps(acc.add(8 * r)));
        if alpha != 1.0 {
            // (x·1 = x: skipping the product when no new maximum came changes no bit.)
            let al = _mm256_set1_ps(alpha);
            a.iter_mut().for_each(|x| *x = _mm256_mul_ps(*x, al));
        }
        for (j, &pj) in p.iter().enumerate().take(live) {
            let pv = _mm256_set1_ps(pj);
            let row = rows.add(j * stride);
            for (r, x) in a.iter_mut().enumerate() {
                *x = _mm256_fmadd_ps(pv, _mm256_loadu_ps(row.add(8 * r)), *x);
            }
        }
        for (r, x) in a.iter().enumerate() {
            _mm256_storeu_ps(acc.add(8 * r), *x);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86_512 {
    //! [`super::x86::step_group`] with 512-bit registers: the scores sixteen keys and the value
    //! sums sixteen elements per register, up to four rows of a group at once (every key and
    //! value load serves all of them). Each lane's arithmetic is the AVX2 kernel's: a key's
    //! score is its own lane's chain of multiply-adds over the elements in ascending order,
    //! an element's sum its own lane's chain over the keys, so the width changes no bit. The
    //! softmax between them takes sixteen keys to a register too, with the AVX2 step's weight
    //! sum (key `j` in lane `j mod 8`, the same lane tree) and `expf`'s bits.

    use std::arch::x86_64::*;

    use super::Tile;
    use crate::quant::ggml::x86::expf16;

    /// Whether this CPU runs [`step_group`].
    pub(super) fn supported() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    /// [`super::step_reference`] for each row of a query's group (`tile.dh` a multiple of 16,
    /// `tile.tk` of 16 and at most 64), up to four rows at a time.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn step_group(
        o: &mut [f32],
        ml: &mut [(f32, f32)],
        qg: &[f32],
        tile: &Tile,
        visible: usize,
        scale: f32,
    ) {
        super::in_row_groups(o, ml, qg, tile.dh, 4, |os, mls, qs| match mls.len() {
            4 => multi::<4>(os, mls, qs, tile, visible, scale),
            3 => multi::<3>(os, mls, qs, tile, visible, scale),
            2 => multi::<2>(os, mls, qs, tile, visible, scale),
            _ => multi::<1>(os, mls, qs, tile, visible, scale),
        });
    }

    /// One step of `R` rows on the tile: raw scores into `p`, the softmax step of each row
    /// (its weights into `p`, its `(m, l)` updated), then the value sums.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn multi<const R: usize>(
        o: &mut [f32],
        ml: &mut [(f32, f32)],
        qg: &[f32],
        tile: &Tile,
        visible: usize,
        scale: f32,
    ) {
        debug_assert!(tile.tk <= 64 && tile.tk.is_multiple_of(16) && tile.dh.is_multiple_of(16));
        let mut p = [[0.0f32; 64]; R];
        match visible.div_ceil(16) {
            1 => scores::<R, 1>(qg, tile, &mut p),
            2 => scores::<R, 2>(qg, tile, &mut p),
            3 => scores::<R, 3>(qg, tile, &mut p),
            _ => scores::<R, 4>(qg, tile, &mut p),
        }
        let mut alpha = [0.0f32; R];
        for ((pr, mlr), al) in p.iter_mut().zip(ml.iter_mut()).zip(alpha.iter_mut()) {
            let (a, m_new, sum) = softmax_step_512(pr, visible, scale, mlr.0);
            *mlr = (m_new, mlr.1 * a + sum);
            *al = a;
        }
        let dh = tile.dh;
        let mut e0 = 0;
        while e0 + 64 <= dh {
            values::<R, 4>(o, e0, &p, &alpha, tile, visible);
            e0 += 64;
        }
        while e0 < dh {
            values::<R, 1>(o, e0, &p, &alpha, tile, visible);
            e0 += 16;
        }
    }

    /// One row's online-softmax step on its raw scores `sc[..visible]`, sixteen keys to a
    /// register, with the bits of the eight-lane AVX2 steps (this kernel's
    /// [`super::x86::softmax_step`] and `attention_q`'s, which both one-token and tiled kernels
    /// take on AVX-512 CPUs): the scores times `scale` (the one-token kernels pass scaled
    /// scores and 1, which changes no bit), `m' = max(m, max_j s_j)` (exact in any order),
    /// `α = expf(m − m')`, the weights `expf(s_j − m')` lane for lane by `expf16` (which gives
    /// `expf8`'s bits) in place of the scores (zero past `visible` in its last register), and
    /// their sum with key `j` in lane `j mod 8`: each register's low eight lanes and then its
    /// high eight are added to the eight-lane sum, the AVX2 steps' order (a half past
    /// `visible` adds zeros, which changes no sum), then [`super::tree8`]. Returns
    /// `(α, m', Σ)`; the caller's weight sum becomes `l·α + Σ`. `sc` holds at least
    /// `visible` rounded up to 16, and `visible` ≤ 64.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(in crate::kernels) unsafe fn softmax_step_512(
        sc: &mut [f32],
        visible: usize,
        scale: f32,
        m: f32,
    ) -> (f32, f32, f32) {
        let chunks = visible.div_ceil(16);
        debug_assert!(chunks <= 4 && sc.len() >= 16 * chunks);
        let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
        let scale_v = _mm512_set1_ps(scale);
        let mut masks = [0 as __mmask16; 4];
        let mut x = [neg_inf; 4];
        let mut maxv = neg_inf;
        for c in 0..chunks {
            let live = (visible - 16 * c).min(16);
            masks[c] = ((1u32 << live) - 1) as __mmask16;
            x[c] = _mm512_mask_mul_ps(neg_inf, masks[c], _mm512_loadu_ps(sc.as_ptr().add(16 * c)), scale_v);
            maxv = _mm512_max_ps(maxv, x[c]);
        }
        let (alpha, m_new) = super::rescale(m, _mm512_reduce_max_ps(maxv));
        let mv = _mm512_set1_ps(m_new);
        let mut sum = _mm256_setzero_ps();
        for c in 0..chunks {
            let e = _mm512_maskz_mov_ps(masks[c], expf16(_mm512_sub_ps(x[c], mv)));
            sum = _mm256_add_ps(sum, _mm512_castps512_ps256(e));
            sum = _mm256_add_ps(sum, _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e))));
            _mm512_storeu_ps(sc.as_mut_ptr().add(16 * c), e);
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
        (alpha, m_new, super::tree8(&lanes))
    }

    /// `p[r][16c..16c + 16]` = the dot products of row `r`'s query with keys `16c..16c + 16`
    /// of the tile (`c < C`): per lane one fused multiply-add per element, `e` ascending, from
    /// zero (the AVX2 kernel's chains).
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn scores<const R: usize, const C: usize>(qg: &[f32], tile: &Tile, p: &mut [[f32; 64]; R]) {
        let (tk, dh) = (tile.tk, tile.dh);
        let mut a = [[_mm512_setzero_ps(); C]; R];
        for e in 0..dh {
            let kr = tile.kt.as_ptr().add(e * tk);
            let k: [__m512; C] = std::array::from_fn(|c| _mm512_loadu_ps(kr.add(16 * c)));
            for (r, ar) in a.iter_mut().enumerate() {
                let qv = _mm512_set1_ps(*qg.get_unchecked(r * dh + e));
                for (c, ac) in ar.iter_mut().enumerate() {
                    *ac = _mm512_fmadd_ps(qv, k[c], *ac);
                }
            }
        }
        for (pr, ar) in p.iter_mut().zip(&a) {
            for (c, ac) in ar.iter().enumerate() {
                _mm512_storeu_ps(pr.as_mut_ptr().add(16 * c), *ac);
            }
        }
    }

    /// For each row `r`: `o_r[e0..e0 + 16N] = o_r·α_r + Σ_j p_rj · v_j` over the visible keys in
    /// ascending order, the sums in registers; each value load serves every row.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn values<const R: usize, const N: usize>(
        o: &mut [f32],
        e0: usize,
        p: &[[f32; 64]; R],
        alpha: &[f32; R],
        tile: &Tile,
        visible: usize,
    ) {
        let dh = tile.dh;
        let mut a: [[__m512; N]; R] = std::array::from_fn(|r| {
            let al = _mm512_set1_ps(alpha[r]);
            std::array::from_fn(|i| _mm512_mul_ps(_mm512_loadu_ps(o.as_ptr().add(r * dh + e0 + 16 * i)), al))
        });
        for j in 0..visible {
            let vr = tile.vt.as_ptr().add(j * dh + e0);
            let v: [__m512; N] = std::array::from_fn(|i| _mm512_loadu_ps(vr.add(16 * i)));
            for (r, ar) in a.iter_mut().enumerate() {
                let pv = _mm512_set1_ps(*p[r].get_unchecked(j));
                for (i, ai) in ar.iter_mut().enumerate() {
                    *ai = _mm512_fmadd_ps(pv, v[i], *ai);
                }
            }
        }
        for (r, ar) in a.iter().enumerate() {
            for (i, ai) in ar.iter().enumerate() {
                _mm512_storeu_ps(o.as_mut_ptr().add(r * dh + e0 + 16 * i), *ai);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::KvType;
    use crate::kernels::attention::causal_reference;
    use crate::quant::ggml::F16Dot;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn values(n: usize, seed: u64, amp: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n).map(|_| crate::kernels::round_f16(lcg(&mut s) * amp)).collect()
    }

    /// `(t, pos0, heads, kv_heads, head_dim, amplitude)`.
    const CASES: [(usize, usize, usize, usize, usize, f32); 9] = [
        (1, 0, 2, 1, 64, 1.0),
        (33, 40, 8, 2, 256, 2.0), // Qwen3.5's heads of 256 in groups of four
        (9, 70, 5, 1, 64, 3.0),   // a group of five: four rows at once, then one
        (5, 0, 9, 3, 64, 2.0),
        (40, 90, 9, 3, 64, 8.0), // queries across key tiles, SmolLM2's heads
        (20, 0, 3, 3, 48, 30.0), // wide scores: weights that underflow to 0
        (17, 50, 4, 2, 128, 2.0),
        (1, 300, 6, 1, 128, 4.0), // one token far into the cache (quantized decode)
        (3, 7, 2, 1, 80, 1.0),    // a head of 80: value sums of 8 + 2 registers
    ];

    fn cache(ty: KvType, x: &[f32], hkv: usize, dh: usize) -> KvRows {
        let mut r = KvRows::new(ty, hkv * dh, dh);
        r.push(x);
        r
    }

    fn shape(t: usize, pos0: usize, hq: usize, hkv: usize, dh: usize) -> AttnShape {
        AttnShape { t, pos0, heads: hq, kv_heads: hkv, head_dim: dh, scale: 1.0 / (dh as f32).sqrt() }
    }

    #[test]
    fn every_vector_kernel_equals_the_reference_bit_for_bit() {
        for (kernel, needs) in [(TiledKernel::Avx512, "avx512f"), (TiledKernel::Avx2, "avx2+fma+f16c")] {
            if !kernel.supported(64) {
                crate::test_support::report_skip(needs, &format!("kernels::flash {kernel:?} tiled attention"));
                continue;
            }
            for (t, pos0, hq, hkv, dh, amp) in CASES {
                if !kernel.supported(dh) {
                    continue;
                }
                let n = pos0 + t;
                let q = values(t * hq * dh, 1 + t as u64, amp);
                let (k, v) = (values(n * hkv * dh, 2 + n as u64, amp), values(n * hkv * dh, 3, 1.0));
                let s = shape(t, pos0, hq, hkv, dh);
                for ty in [KvType::F16, KvType::Q8_0, KvType::F32] {
                    if ty.check_head_dim(dh).is_err() {
                        continue;
                    }
                    let (kc, vc) = (cache(ty, &k, hkv, dh), cache(ty, &v, hkv, dh));
                    let got = causal_tiled_with(kernel, &q, &kc, &vc, s);
                    let want = causal_tiled_reference(&q, &kc, &vc, s);
                    let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                    assert_eq!(
                        differ,
                        0,
                        "{kernel:?} {ty} t={t} pos0={pos0} heads={hq}/{hkv} dh={dh}: {differ} of {} outputs differ",
                        got.len()
                    );
                }
            }
        }
    }

    #[test]
    fn the_kernel_picked_is_one_this_cpu_runs() {
        for dh in [48, 64, 80, 128, 256] {
            let k = TiledKernel::best(dh);
            assert!(k.supported(dh), "{k:?} picked for heads of {dh}");
        }
        assert!(TiledKernel::Reference.supported(7));
        assert!(!TiledKernel::Avx512.supported(40), "heads of 40 are not whole 512-bit registers");
    }

    #[test]
    fn tiled_attention_matches_the_llama_cpp_order_within_rounding() {
        // Same f16 cache: the online softmax (no f16 weights) against llama.cpp's batch order.
        for (t, pos0, hq, hkv, dh, amp) in CASES {
            let n = pos0 + t;
            let q = values(t * hq * dh, 1 + t as u64, amp);
            let (k, v) = (values(n * hkv * dh, 2 + n as u64, amp), values(n * hkv * dh, 3, 1.0));
            let s = shape(t, pos0, hq, hkv, dh);
            let got = causal_tiled(&q, &cache(KvType::F16, &k, hkv, dh), &cache(KvType::F16, &v, hkv, dh), s);
            let want = causal_reference(&q, &k, &v, s, F16Dot::for_batch(t));
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            // Values are in [-1, 1]; the reference's f16 weights alone move an output by up to
            // about 2^-11 of it.
            assert!(worst < 2e-3, "t={t} pos0={pos0} dh={dh}: {worst}");
        }
    }

    #[test]
    fn results_do_not_depend_on_where_a_query_falls_in_its_tile() {
        // The last 5 of 37 tokens computed alone (after the first 32 are cached) give the
        // bits the whole prompt gave them.
        let (hq, hkv, dh, n) = (4, 2, 64, 37);
        let q = values(n * hq * dh, 9, 3.0);
        let (k, v) = (values(n * hkv * dh, 10, 3.0), values(n * hkv * dh, 11, 1.0));
        let (kc, vc) = (cache(KvType::F16, &k, hkv, dh), cache(KvType::F16, &v, hkv, dh));
        let all = causal_tiled(&q, &kc, &vc, shape(n, 0, hq, hkv, dh));
        let tail = causal_tiled(&q[32 * hq * dh..], &kc, &vc, shape(5, 32, hq, hkv, dh));
        assert!(all[32 * hq * dh..].iter().zip(&tail).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}
