//! The gated delta rule (docs/model.md §3.4 step 6 and §3.5), per value head, all f32.
//!
//! Layouts: `q`, `k` are `[T, Hk, dk]` (key heads, already l2-normalised, q scaled);
//! `v` is `[T, Hv, dv]`; `g` (log decay) and `beta` are `[T, Hv]`; the state is
//! `[Hv, dk, dv]`; the output is `[T, Hv, dv]`. Value head `h` reads key head
//! `key_head[h]` — grouped (`h / r`) for HF weights, tiled (`h % Hk`) for GGUF.
//!
//! Two forms: [`recurrent`] (one step at a time, for decode) and [`chunked`] (the WY form with
//! chunk 64, for prefill). They are the same function; a test holds them equal.

use rayon::prelude::*;

/// Shapes of one delta-rule call.
#[derive(Debug, Clone)]
pub struct DeltaShape {
    /// Tokens.
    pub t: usize,
    /// Key heads.
    pub hk: usize,
    /// Value heads.
    pub hv: usize,
    /// Key dim.
    pub dk: usize,
    /// Value dim.
    pub dv: usize,
    /// Key head read by each value head.
    pub key_head: Vec<usize>,
}

/// Chunk length of the WY form (as transformers and FLA).
pub const CHUNK: usize = 64;

/// Inputs of one call.
pub struct DeltaInputs<'a> {
    /// `[T, Hk, dk]`.
    pub q: &'a [f32],
    /// `[T, Hk, dk]`.
    pub k: &'a [f32],
    /// `[T, Hv, dv]`.
    pub v: &'a [f32],
    /// `[T, Hv]` log decay (≤ 0).
    pub g: &'a [f32],
    /// `[T, Hv]`.
    pub beta: &'a [f32],
}

fn head_rows<'a>(x: &'a [f32], t: usize, heads: usize, h: usize, d: usize) -> impl Iterator<Item = &'a [f32]> + 'a {
    (0..t).map(move |i| &x[(i * heads + h) * d..(i * heads + h + 1) * d])
}

/// Runs `head(h, key_head, state_h)` for every value head in parallel (each returns its
/// `[T, dv]` output) and interleaves the results into `[T, Hv, dv]`.
fn per_head(state: &mut [f32], s: &DeltaShape, head: impl Fn(usize, usize, &mut [f32]) -> Vec<f32> + Sync) -> Vec<f32> {
    let o_heads: Vec<Vec<f32>> =
        state.par_chunks_mut(s.dk * s.dv).enumerate().map(|(h, st)| head(h, s.key_head[h], st)).collect();
    let mut out = vec![0.0f32; s.t * s.hv * s.dv];
    for (h, oh) in o_heads.into_iter().enumerate() {
        for i in 0..s.t {
            out[(i * s.hv + h) * s.dv..(i * s.hv + h + 1) * s.dv].copy_from_slice(&oh[i * s.dv..(i + 1) * s.dv]);
        }
    }
    out
}

/// Step-by-step recurrence; updates `state` and returns the output.
pub fn recurrent(x: &DeltaInputs, state: &mut [f32], s: &DeltaShape) -> Vec<f32> {
    per_head(state, s, |h, kh, st| {
        #[cfg(target_arch = "x86_64")]
        if has_avx2_fma() && !super::plain_kernels() {
            // SAFETY: AVX2 and FMA were detected just above.
            return unsafe { recurrent_head_avx2(x, s, h, kh, st) };
        }
        flush_subnormals(|| recurrent_head::<false>(x, s, h, kh, st))
    })
}

/// Whether this CPU has AVX2 and FMA, what the fused forms (`recurrent_head_avx2`,
/// `chunk_step_avx2`) are compiled for.
#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// [`recurrent_head`] compiled for AVX2 + FMA: the loops over the value dimension become
/// 8-wide fused multiply-adds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn recurrent_head_avx2(x: &DeltaInputs, s: &DeltaShape, h: usize, kh: usize, st: &mut [f32]) -> Vec<f32> {
    flush_subnormals(|| recurrent_head::<true>(x, s, h, kh, st))
}

/// Value head `h`'s steps (reading key head `kh`) on its state `st` (`[dk, dv]`); returns its
/// `[T, dv]` output. Per step, with decay `α` and `β`:
/// `d = β·(v − α·(kᵀS))`, then `S ← α·S + k ⊗ d` and `o = qᵀS` — the rule's
/// `S' = α·S; d = β·(v − kᵀS'); S' += k ⊗ d; o = qᵀS'` with the decay moved out of the sum, so
/// the state is read twice a step (once for `kᵀS`, once to update it and read it out)
/// instead of three times: a decode step of the 4B shape walks 48 MB of state. Fused
/// multiply-adds when `FUSED`.
#[inline(always)]
fn recurrent_head<const FUSED: bool>(x: &DeltaInputs, s: &DeltaShape, h: usize, kh: usize, st: &mut [f32]) -> Vec<f32> {
    let (dk, dv) = (s.dk, s.dv);
    let mut o = vec![0.0f32; s.t * dv];
    let mut d = vec![0.0f32; dv];
    let rows = head_rows(x.q, s.t, s.hk, kh, dk).zip(head_rows(x.k, s.t, s.hk, kh, dk));
    for (i, ((q, k), v)) in rows.zip(head_rows(x.v, s.t, s.hv, h, dv)).enumerate() {
        let alpha = decay_exp(x.g[i * s.hv + h]);
        let beta = x.beta[i * s.hv + h];
        // kᵀS, then d = β·(v − α·kᵀS)
        d.fill(0.0);
        for (a, srow) in k.iter().zip(st.chunks_exact(dv)) {
            for (dj, sj) in d.iter_mut().zip(srow) {
                *dj = madd::<FUSED>(*dj, *a, *sj);
            }
        }
        for (dj, vj) in d.iter_mut().zip(v) {
            *dj = beta * msub::<FUSED>(*vj, alpha, *dj);
        }
        // S ← α·S + k ⊗ d ; o = qᵀS
        let oi = &mut o[i * dv..(i + 1) * dv];
        for ((a, b), srow) in k.iter().zip(q).zip(st.chunks_exact_mut(dv)) {
            for ((sj, dj), oj) in srow.iter_mut().zip(&d).zip(oi.iter_mut()) {
                *sj = madd::<FUSED>(*sj * alpha, *a, *dj);
                *oj = madd::<FUSED>(*oj, *b, *sj);
            }
        }
    }
    o
}

/// Chunked (WY / UT-transform) form, chunk [`CHUNK`]; a ragged last chunk is processed at its
/// own length, which equals zero-padding (padded steps have g = 0, k = v = 0).
pub fn chunked(x: &DeltaInputs, state: &mut [f32], s: &DeltaShape) -> Vec<f32> {
    let dv = s.dv;
    per_head(state, s, |h, kh, st| {
        let mut o = vec![0.0f32; s.t * dv];
        let mut n0 = 0;
        while n0 < s.t {
            let c = CHUNK.min(s.t - n0);
            chunk_step(x, st, s, h, kh, n0, c, &mut o[n0 * dv..(n0 + c) * dv]);
            n0 += c;
        }
        o
    })
}

/// One chunk of `c` steps starting at `n0` for value head `h`; writes `o` (`[c, dv]`).
/// Compiled twice: for AVX2 + FMA where the CPU has them (every multiply-add fused: half the
/// instructions, and one rounding instead of two), and plain (separate multiply and add).
#[allow(clippy::too_many_arguments)]
fn chunk_step(
    x: &DeltaInputs,
    st: &mut [f32],
    s: &DeltaShape,
    h: usize,
    kh: usize,
    n0: usize,
    c: usize,
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() && !super::plain_kernels() {
        // SAFETY: AVX2 and FMA were detected just above.
        return unsafe { chunk_step_avx2(x, st, s, h, kh, n0, c, o) };
    }
    chunk_step_body::<false>(x, st, s, h, kh, n0, c, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn chunk_step_avx2(
    x: &DeltaInputs,
    st: &mut [f32],
    s: &DeltaShape,
    h: usize,
    kh: usize,
    n0: usize,
    c: usize,
    o: &mut [f32],
) {
    flush_subnormals(|| chunk_step_body::<true>(x, st, s, h, kh, n0, c, o))
}

/// Runs `f` with subnormal results flushed to zero (FTZ) and subnormal inputs read as zero
/// (DAZ), then restores the caller's MXCSR. Products of small decays with small values land
/// below 2⁻¹²⁶, and each such operation costs the CPU about a hundred cycles: a strongly
/// decaying 4B-shape prefill spent 10× longer in the delta rule without this.
#[cfg(target_arch = "x86_64")]
fn flush_subnormals<R>(f: impl FnOnce() -> R) -> R {
    let mut csr: u32 = 0;
    // SAFETY: stores MXCSR to a local; no other state is touched.
    unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags)) };
    let flush = csr | 0x8040;
    // SAFETY: loads MXCSR from a local; only the FTZ and DAZ bits differ from the caller's.
    unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &flush, options(nostack, preserves_flags, readonly)) };
    let r = f();
    // SAFETY: as above, restoring the caller's value.
    unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, preserves_flags, readonly)) };
    r
}

/// Elsewhere subnormals keep their exact (slow) arithmetic.
#[cfg(not(target_arch = "x86_64"))]
fn flush_subnormals<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn chunk_step_body<const FUSED: bool>(
    x: &DeltaInputs,
    st: &mut [f32],
    s: &DeltaShape,
    h: usize,
    kh: usize,
    n0: usize,
    c: usize,
    o: &mut [f32],
) {
    let (dk, dv) = (s.dk, s.dv);
    let row = |buf: &[f32], heads: usize, head: usize, d: usize, i: usize| -> Vec<f32> {
        buf[((n0 + i) * heads + head) * d..((n0 + i) * heads + head + 1) * d].to_vec()
    };
    let qm: Vec<Vec<f32>> = (0..c).map(|i| row(x.q, s.hk, kh, dk, i)).collect();
    let km: Vec<Vec<f32>> = (0..c).map(|i| row(x.k, s.hk, kh, dk, i)).collect();
    let vm: Vec<Vec<f32>> = (0..c).map(|i| row(x.v, s.hv, h, dv, i)).collect();
    let beta: Vec<f32> = (0..c).map(|i| x.beta[(n0 + i) * s.hv + h]).collect();
    // Cumulative log decay within the chunk.
    let cum: Vec<f32> = (0..c)
        .scan(0.0f32, |acc, i| {
            *acc += x.g[(n0 + i) * s.hv + h];
            Some(*acc)
        })
        .collect();
    // The decay between every pair i ≥ j, each `exp` once (the solve and the output both use it).
    let mut decay_table = vec![0.0f32; c * c];
    for i in 0..c {
        for j in 0..=i {
            decay_table[i * c + j] = decay_exp(cum[i] - cum[j]);
        }
    }
    let decay = |i: usize, j: usize| decay_table[i * c + j];
    // K Kᵀ and Q Kᵀ as two small matrix products (each entry summed over the key dimension
    // in order), rather than c² separate dot products.
    let kt: Vec<f32> = (0..dk).flat_map(|a| km.iter().map(move |kj| kj[a])).collect();
    let (qflat, kflat) = (qm.concat(), km.concat());
    let mut kk = vec![0.0f32; c * c];
    gemm_accumulate::<FUSED>(&mut kk, &kflat, &kt, dk, c, Sign::Plus);
    let mut qk = vec![0.0f32; c * c];
    gemm_accumulate::<FUSED>(&mut qk, &qflat, &kt, dk, c, Sign::Plus);

    // A = strictly_lower((Kβ Kᵀ) ⊙ D); solve (I + A) [U | W] = [Vβ | diag(exp c) Kβ].
    let mut u: Vec<Vec<f32>> = Vec::with_capacity(c);
    let mut w: Vec<Vec<f32>> = Vec::with_capacity(c);
    for i in 0..c {
        let mut ui: Vec<f32> = vm[i].iter().map(|v| v * beta[i]).collect();
        let eci = decay_exp(cum[i]);
        let mut wi: Vec<f32> = km[i].iter().map(|v| v * beta[i] * eci).collect();
        for j in 0..i {
            let a = beta[i] * kk[i * c + j] * decay(i, j);
            for (e, uj) in ui.iter_mut().zip(&u[j]) {
                *e = msub::<FUSED>(*e, a, *uj);
            }
            for (e, wj) in wi.iter_mut().zip(&w[j]) {
                *e = msub::<FUSED>(*e, a, *wj);
            }
        }
        u.push(ui);
        w.push(wi);
    }
    // Vnew = U − W S
    let mut vnew: Vec<f32> = u.concat();
    gemm_accumulate::<FUSED>(&mut vnew, &w.concat(), st, dk, dv, Sign::Minus);
    // O = (diag(exp c) Q) S + lower_incl((Q Kᵀ) ⊙ D) Vnew
    let qe: Vec<f32> = (0..c)
        .flat_map(|i| {
            let eci = decay_exp(cum[i]);
            qm[i].iter().map(move |a| a * eci)
        })
        .collect();
    gemm_accumulate::<FUSED>(o, &qe, st, dk, dv, Sign::Plus);
    for i in 0..c {
        let oi = &mut o[i * dv..(i + 1) * dv];
        for j in 0..=i {
            let a = qk[i * c + j] * decay(i, j);
            for (e, vj) in oi.iter_mut().zip(&vnew[j * dv..(j + 1) * dv]) {
                *e = madd::<FUSED>(*e, a, *vj);
            }
        }
    }
    // S ← exp(c_last) S + (diag(exp(c_last − c)) K)ᵀ Vnew
    let last = cum[c - 1];
    let el = decay_exp(last);
    st.iter_mut().for_each(|e| *e *= el);
    let f: Vec<f32> = (0..c).map(|j| decay_exp(last - cum[j])).collect();
    let kft: Vec<f32> = (0..dk).flat_map(|a| (0..c).map(move |j| (a, j))).map(|(a, j)| km[j][a] * f[j]).collect();
    gemm_accumulate::<FUSED>(st, &kft, &vnew, c, dv, Sign::Plus);
}

/// `exp(x)` of a log decay (x ≤ 0), flushed to zero below `e^−60` (≈ 9·10⁻²⁷). Strong decays
/// over a chunk reach `e^−90` and beyond, where `exp` and every product with it are
/// subnormal, and each subnormal operation costs the CPU a hundred cycles: a 4B-shape
/// prefill spent 10× longer in this kernel on such inputs. What is dropped is below f32's
/// resolution next to any term of ordinary size.
#[inline(always)]
fn decay_exp(x: f32) -> f32 {
    if x < -60.0 {
        0.0
    } else {
        x.exp()
    }
}

/// `acc + x·y`, in one rounding when `FUSED`.
#[inline(always)]
fn madd<const FUSED: bool>(acc: f32, x: f32, y: f32) -> f32 {
    if FUSED {
        x.mul_add(y, acc)
    } else {
        acc + x * y
    }
}

/// `acc − x·y`, in one rounding when `FUSED`.
#[inline(always)]
fn msub<const FUSED: bool>(acc: f32, x: f32, y: f32) -> f32 {
    if FUSED {
        (-x).mul_add(y, acc)
    } else {
        acc - x * y
    }
}

/// Whether [`gemm_accumulate`] adds or subtracts the products.
#[derive(Clone, Copy, PartialEq)]
enum Sign {
    Plus,
    Minus,
}

/// `out[i][e] ±= Σ_k a[i][k] · b[k][e]` (`a` is `[rows, kd]`, `b` `[kd, m]`, `out` `[rows, m]`),
/// each element accumulated over `k` in order (a row-by-row loop's order), four rows × 32
/// columns at a time, so `b` is read once per four rows instead of once per row (the state
/// is 64 KiB a head, more than L1 holds). Fused multiply-adds when `FUSED`.
#[inline(always)]
fn gemm_accumulate<const FUSED: bool>(out: &mut [f32], a: &[f32], b: &[f32], kd: usize, m: usize, sign: Sign) {
    const R: usize = 4;
    const W: usize = 32;
    let rows = out.len() / m;
    let step = |acc: &mut f32, x: f32, y: f32| match sign {
        Sign::Plus => *acc = madd::<FUSED>(*acc, x, y),
        Sign::Minus => *acc = msub::<FUSED>(*acc, x, y),
    };
    let mut i0 = 0;
    while i0 < rows {
        let nr = R.min(rows - i0);
        let mut e0 = 0;
        while e0 < m {
            let nc = W.min(m - e0);
            if nr == R && nc == W {
                let mut acc = [[0.0f32; W]; R];
                for (r, accr) in acc.iter_mut().enumerate() {
                    accr.copy_from_slice(&out[(i0 + r) * m + e0..][..W]);
                }
                for k in 0..kd {
                    let bk = &b[k * m + e0..][..W];
                    for (r, accr) in acc.iter_mut().enumerate() {
                        let x = a[(i0 + r) * kd + k];
                        for (ae, be) in accr.iter_mut().zip(bk) {
                            step(ae, x, *be);
                        }
                    }
                }
                for (r, accr) in acc.iter().enumerate() {
                    out[(i0 + r) * m + e0..][..W].copy_from_slice(accr);
                }
            } else {
                for r in 0..nr {
                    for k in 0..kd {
                        let x = a[(i0 + r) * kd + k];
                        for e in e0..e0 + nc {
                            step(&mut out[(i0 + r) * m + e], x, b[k * m + e]);
                        }
                    }
                }
            }
            e0 += nc;
        }
        i0 += nr;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random_case(t: usize, hk: usize, hv: usize, dk: usize, dv: usize, seed: u64) -> (Vec<Vec<f32>>, DeltaShape) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut unit = |n: usize, heads: usize, d: usize| {
            let mut x: Vec<f32> = (0..n * heads * d).map(|_| rng.random_range(-1.0..1.0)).collect();
            for r in x.chunks_exact_mut(d) {
                crate::kernels::l2_normalize(r, 1e-6);
            }
            x
        };
        let q = unit(t, hk, dk);
        let k = unit(t, hk, dk);
        let v: Vec<f32> = (0..t * hv * dv).map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0).collect();
        let g: Vec<f32> = (0..t * hv).map(|i| -((i * 31 % 100) as f32) / 100.0).collect();
        let beta: Vec<f32> = (0..t * hv).map(|i| (i * 17 % 100) as f32 / 100.0).collect();
        let r = hv / hk;
        let shape = DeltaShape { t, hk, hv, dk, dv, key_head: (0..hv).map(|h| h / r).collect() };
        (vec![q, k, v, g, beta], shape)
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    #[test]
    fn chunked_equals_recurrent_over_several_chunks_with_ragged_tail_and_dk_ne_dv() {
        let (dk, dv, hk, hv) = (16, 24, 2, 4);
        let (x, s) = random_case(150, hk, hv, dk, dv, 7);
        let inputs = DeltaInputs { q: &x[0], k: &x[1], v: &x[2], g: &x[3], beta: &x[4] };
        let s0: Vec<f32> = (0..hv * dk * dv).map(|i| ((i % 13) as f32 - 6.0) / 20.0).collect();
        let (mut sa, mut sb) = (s0.clone(), s0);
        let oa = recurrent(&inputs, &mut sa, &s);
        let ob = chunked(&inputs, &mut sb, &s);
        assert!(max_diff(&oa, &ob) < 1e-4, "outputs differ by {}", max_diff(&oa, &ob));
        assert!(max_diff(&sa, &sb) < 1e-4, "states differ by {}", max_diff(&sa, &sb));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fused_avx2_chunk_step_agrees_with_the_plain_one() {
        if !has_avx2_fma() {
            crate::test_support::report_skip("avx2+fma", "kernels::delta_rule fused AVX2 chunk step");
            return;
        }
        let (dk, dv, hk, hv) = (32, 48, 1, 2);
        let (x, s) = random_case(45, hk, hv, dk, dv, 11);
        let inputs = DeltaInputs { q: &x[0], k: &x[1], v: &x[2], g: &x[3], beta: &x[4] };
        let s0: Vec<f32> = (0..dk * dv).map(|i| ((i % 13) as f32 - 6.0) / 20.0).collect();
        let (mut sa, mut sb) = (s0.clone(), s0);
        let (mut oa, mut ob) = (vec![0.0; 45 * dv], vec![0.0; 45 * dv]);
        chunk_step_body::<false>(&inputs, &mut sa, &s, 1, 0, 0, 45, &mut oa);
        // SAFETY: AVX2 was detected above.
        unsafe { chunk_step_avx2(&inputs, &mut sb, &s, 1, 0, 0, 45, &mut ob) };
        // Fused multiply-adds round once instead of twice: agreement to f32 rounding.
        assert!(max_diff(&oa, &ob) < 1e-5, "outputs differ by {}", max_diff(&oa, &ob));
        assert!(max_diff(&sa, &sb) < 1e-5, "states differ by {}", max_diff(&sa, &sb));
        assert!(oa.iter().zip(&ob).any(|(a, b)| a != b), "the fused path should round differently somewhere");
    }

    /// The rule as docs/model.md §3.4 writes it, one step at a time: `S ← α·S`,
    /// `d = β·(v − kᵀS)`, `S ← S + k ⊗ d`, `o = qᵀS` (what `recurrent` computed before it took
    /// the decay out of the sum).
    fn recurrent_as_written(x: &DeltaInputs, st: &mut [f32], s: &DeltaShape, h: usize) -> Vec<f32> {
        let (dk, dv, kh) = (s.dk, s.dv, s.key_head[h]);
        let mut o = vec![0.0f32; s.t * dv];
        for i in 0..s.t {
            let (alpha, beta) = ((x.g[i * s.hv + h]).exp(), x.beta[i * s.hv + h]);
            let (q, k) = (&x.q[(i * s.hk + kh) * dk..][..dk], &x.k[(i * s.hk + kh) * dk..][..dk]);
            let v = &x.v[(i * s.hv + h) * dv..][..dv];
            st.iter_mut().for_each(|e| *e *= alpha);
            let d: Vec<f32> =
                (0..dv).map(|j| beta * (v[j] - (0..dk).map(|a| k[a] * st[a * dv + j]).sum::<f32>())).collect();
            for a in 0..dk {
                for j in 0..dv {
                    st[a * dv + j] += k[a] * d[j];
                    o[i * dv + j] += q[a] * st[a * dv + j];
                }
            }
        }
        o
    }

    #[test]
    fn recurrent_heads_plain_and_fused_follow_the_rule_as_written() {
        let (dk, dv, hk, hv) = (32, 48, 1, 2);
        let (x, s) = random_case(60, hk, hv, dk, dv, 19);
        let inputs = DeltaInputs { q: &x[0], k: &x[1], v: &x[2], g: &x[3], beta: &x[4] };
        let s0: Vec<f32> = (0..dk * dv).map(|i| ((i % 13) as f32 - 6.0) / 20.0).collect();
        let mut want_state = s0.clone();
        let want = recurrent_as_written(&inputs, &mut want_state, &s, 1);
        let mut plain_state = s0.clone();
        let plain = recurrent_head::<false>(&inputs, &s, 1, 0, &mut plain_state);
        // 60 steps of f32 rounding in another order: agreement to a few units in the last place.
        assert!(max_diff(&plain, &want) < 1e-5, "outputs differ by {}", max_diff(&plain, &want));
        assert!(max_diff(&plain_state, &want_state) < 1e-5, "states differ by {}", max_diff(&plain_state, &want_state));
        #[cfg(target_arch = "x86_64")]
        if has_avx2_fma() {
            let mut fused_state = s0;
            // SAFETY: AVX2 and FMA were detected just above.
            let fused = unsafe { recurrent_head_avx2(&inputs, &s, 1, 0, &mut fused_state) };
            assert!(max_diff(&fused, &want) < 1e-5, "outputs differ by {}", max_diff(&fused, &want));
            assert!(
                max_diff(&fused_state, &want_state) < 1e-5,
                "states differ by {}",
                max_diff(&fused_state, &want_state)
            );
            assert!(fused.iter().zip(&plain).any(|(a, b)| a != b), "the fused path should round differently somewhere");
        } else {
            crate::test_support::report_skip("avx2+fma", "kernels::delta_rule fused AVX2 recurrent head");
        }
    }

    #[test]
    fn chunked_in_two_pieces_equals_one_pass() {
        let (dk, dv, hk, hv) = (8, 8, 1, 2);
        let (x, s) = random_case(100, hk, hv, dk, dv, 3);
        let full_in = DeltaInputs { q: &x[0], k: &x[1], v: &x[2], g: &x[3], beta: &x[4] };
        let mut s_full = vec![0.0; hv * dk * dv];
        let o_full = chunked(&full_in, &mut s_full, &s);
        let split = 70;
        let part = |a: usize, b: usize| {
            let sl = |buf: &[f32], w: usize| buf[a * w..b * w].to_vec();
            [sl(&x[0], hk * dk), sl(&x[1], hk * dk), sl(&x[2], hv * dv), sl(&x[3], hv), sl(&x[4], hv)]
        };
        let mut st = vec![0.0; hv * dk * dv];
        let mut o = Vec::new();
        for (a, b) in [(0, split), (split, 100)] {
            let p = part(a, b);
            let inp = DeltaInputs { q: &p[0], k: &p[1], v: &p[2], g: &p[3], beta: &p[4] };
            let sh = DeltaShape { t: b - a, ..s.clone() };
            o.extend(chunked(&inp, &mut st, &sh));
        }
        assert!(max_diff(&o, &o_full) < 1e-5);
        assert!(max_diff(&st, &s_full) < 1e-5);
    }
}
