//! The Gated DeltaNet mixer's kernels (kernels/deltanet.cu; docs/model.md §3.4–3.5), all f32,
//! in the order a layer runs them for one sequence: [`conv1d_silu`] → [`split_qkv`] →
//! [`gates`] → [`delta_rule`] → [`gated_rms_norm`]. The math is frognano-model's CPU code:
//! `kernels::conv::causal_conv1d`, `kernels::delta_rule::{recurrent, chunked}` and
//! `qwen35::GatedDeltaNet::step`.
//!
//! Layouts as the CPU's: the rows after `in_proj_qkv` are `[t, conv_dim]` with
//! `conv_dim = 2·Hk·dk + Hv·dv` (q | k | v); the conv state is `[K-1, conv_dim]` (oldest first),
//! the conv weight `[conv_dim, K]`; the recurrent state is `[Hv, dk, dv]`; value head `h`
//! reads key head `key_head[h]`.

use crate::backend::{Arg, Gpu, GpuError, Result};
use crate::kernels::blocks;

/// Largest conv kernel width [`conv1d_silu`] takes (its window lives in registers).
pub const MAX_CONV_KERNEL: usize = 8;
/// Tokens a conv thread walks (`DELTA_CONV_TOKENS` in deltanet.cu).
const CONV_TOKENS: usize = 16;
/// Channels a conv block covers.
const CONV_THREADS: usize = 128;
/// Chunk length of the WY form (as `delta_rule::CHUNK`).
pub const CHUNK: usize = 64;
/// [`delta_rule`] runs the recurrent form up to this many tokens, the chunked one above.
pub const RECURRENT_MAX_T: usize = 16;
/// Largest key dim of the chunked form (`DELTA_MAX_DK`: its state slice is in shared memory).
pub const CHUNKED_MAX_DK: usize = 128;
/// State columns a delta-rule block owns (`DELTA_BV`; the recurrent kernel's lanes, too).
const COLUMNS: usize = 32;
/// Threads of a chunked block (`DELTA_CHUNK_THREADS`).
const CHUNK_THREADS: u32 = 256;

fn i32_of(n: usize, what: &str) -> Result<i32> {
    i32::try_from(n).map_err(|_| GpuError::Unsupported(format!("{what} = {n} does not fit a kernel's int")))
}

/// Causal depthwise conv with SiLU over one sequence's `t` rows, carrying the state:
/// `y[i, c] = silu(Σ_j w[c, j] · ext[i + j, c])` with `ext = [state ; x]` (`[K-1 + t, C]`),
/// then `state` (`[K-1, C]`, oldest first) becomes the last `K-1` rows of `ext`.
/// `x`, `y`: `[t, C]`; `w`: `[C, K]`, `w[c][K-1]` multiplying the current token. `k` is at most
/// [`MAX_CONV_KERNEL`]. Launch: grid `(ceil(C/128), ceil(t/16))`, 128 threads (one channel
/// each, 16 tokens a thread); the first token tile also rewrites the state.
#[allow(clippy::too_many_arguments)]
pub fn conv1d_silu(dev: &Gpu, x: u64, state: u64, w: u64, y: u64, t: usize, channels: usize, k: usize) -> Result<()> {
    if k == 0 || k > MAX_CONV_KERNEL {
        return Err(GpuError::Unsupported(format!("conv kernel width {k}: 1 to {MAX_CONV_KERNEL} are supported")));
    }
    if t == 0 || channels == 0 {
        return Ok(());
    }
    dev.launch(
        "delta_conv1d_silu",
        [blocks(channels, CONV_THREADS), blocks(t, CONV_TOKENS), 1],
        [CONV_THREADS as u32, 1, 1],
        0,
        &[
            Arg::Ptr(x),
            Arg::Ptr(state),
            Arg::Ptr(w),
            Arg::Ptr(y),
            Arg::I32(i32_of(t, "t")?),
            Arg::I32(i32_of(channels, "channels")?),
            Arg::I32(k as i32),
        ],
    )
}

/// Splits the conv output `y` (`[t, 2·hk·dk + hv·dv]`, q | k | v) into contiguous
/// `q` `[t, hk, dk]` = l2norm(q)·(1/√dk), `k` `[t, hk, dk]` = l2norm(k) and `v` `[t, hv, dv]`
/// (a copy), with l2norm(x) = x / sqrt(Σx² + 1e-6) as the CPU's `l2_normalize`. Launch: one
/// warp per head vector, 8 warps (256 threads) a block, `ceil(t·(2hk+hv)/8)` blocks.
#[allow(clippy::too_many_arguments)]
pub fn split_qkv(
    dev: &Gpu,
    y: u64,
    q: u64,
    k: u64,
    v: u64,
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
) -> Result<()> {
    let vectors = t * (2 * hk + hv);
    if vectors == 0 {
        return Ok(());
    }
    i32_of(t * (2 * hk * dk + hv * dv), "t·conv_dim")?;
    dev.launch(
        "delta_split_qkv",
        [blocks(vectors, 8), 1, 1],
        [256, 1, 1],
        0,
        &[
            Arg::Ptr(y),
            Arg::Ptr(q),
            Arg::Ptr(k),
            Arg::Ptr(v),
            Arg::I32(i32_of(t, "t")?),
            Arg::I32(i32_of(hk, "hk")?),
            Arg::I32(i32_of(hv, "hv")?),
            Arg::I32(i32_of(dk, "dk")?),
            Arg::I32(i32_of(dv, "dv")?),
            Arg::F32(1.0 / (dk as f32).sqrt()),
        ],
    )
}

/// The gates over `[t, hv]`: `beta = sigmoid(b)`, `g = neg_a[h] · softplus(a + dt_bias[h])`
/// (softplus linear above 20, as the CPU's). `neg_a` (`−exp(A_log)`) and `dt_bias` are `[hv]`.
/// Launch: one thread an element, 256 a block.
#[allow(clippy::too_many_arguments)]
pub fn gates(
    dev: &Gpu,
    b: u64,
    a: u64,
    neg_a: u64,
    dt_bias: u64,
    beta: u64,
    g: u64,
    t: usize,
    hv: usize,
) -> Result<()> {
    let n = t * hv;
    if n == 0 {
        return Ok(());
    }
    dev.launch(
        "delta_gates",
        [blocks(n, 256), 1, 1],
        [256, 1, 1],
        0,
        &[
            Arg::Ptr(b),
            Arg::Ptr(a),
            Arg::Ptr(neg_a),
            Arg::Ptr(dt_bias),
            Arg::Ptr(beta),
            Arg::Ptr(g),
            Arg::I32(i32_of(n, "t·hv")?),
            Arg::I32(i32_of(hv, "hv")?),
        ],
    )
}

/// The gated delta rule over `t` tokens of one sequence from `state` (`[hv, dk, dv]`,
/// updated in place): `out` `[t, hv, dv]`. `q`, `k`: `[t, hk, dk]` (l2-normalised, q scaled);
/// `v`: `[t, hv, dv]`; `g` (log decay, ≤ 0) and `beta`: `[t, hv]`; `key_head`: device `i32`
/// `[hv]`, the key head each value head reads. Up to [`RECURRENT_MAX_T`] tokens it runs
/// [`delta_rule_recurrent`], above that [`delta_rule_chunked`] (they compute the same
/// function, as `delta_rule::recurrent` and `chunked` do).
#[allow(clippy::too_many_arguments)]
pub fn delta_rule(
    dev: &Gpu,
    q: u64,
    k: u64,
    v: u64,
    g: u64,
    beta: u64,
    state: u64,
    out: u64,
    key_head: u64,
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
) -> Result<()> {
    // The recurrent kernel maps key rows to whole warps; narrower keys (small test models)
    // take the chunked form for a few tokens too.
    let recurrent = t <= RECURRENT_MAX_T && dk.is_multiple_of(32);
    let form = if recurrent { "delta_rule_recurrent" } else { "delta_rule_chunked" };
    delta_launch(dev, form, [q, k, v, g, beta, state, out, key_head], [t, hk, hv, dk, dv])
}

/// The recurrent (token by token) form of [`delta_rule`], same arguments; `dk` a multiple of
/// 32, at most 1024. Launch: grid `(hv, ceil(dv/32))`, `dk` threads: lane ↔ state column,
/// warp ↔ 32 key rows held in registers; two block barriers a token.
#[allow(clippy::too_many_arguments)]
pub fn delta_rule_recurrent(
    dev: &Gpu,
    q: u64,
    k: u64,
    v: u64,
    g: u64,
    beta: u64,
    state: u64,
    out: u64,
    key_head: u64,
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
) -> Result<()> {
    delta_launch(dev, "delta_rule_recurrent", [q, k, v, g, beta, state, out, key_head], [t, hk, hv, dk, dv])
}

/// The chunked WY form of [`delta_rule`] (chunk [`CHUNK`], a ragged last chunk at its own
/// length), same arguments; `dk` a multiple of 16, at most [`CHUNKED_MAX_DK`]. Launch: grid
/// `(hv, ceil(dv/32))`, 256 threads; each block owns 32 state columns of one value head in
/// shared memory and walks the chunks in order (≈ 45 KiB of static shared memory).
#[allow(clippy::too_many_arguments)]
pub fn delta_rule_chunked(
    dev: &Gpu,
    q: u64,
    k: u64,
    v: u64,
    g: u64,
    beta: u64,
    state: u64,
    out: u64,
    key_head: u64,
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
) -> Result<()> {
    delta_launch(dev, "delta_rule_chunked", [q, k, v, g, beta, state, out, key_head], [t, hk, hv, dk, dv])
}

fn delta_launch(dev: &Gpu, name: &str, ptrs: [u64; 8], [t, hk, hv, dk, dv]: [usize; 5]) -> Result<()> {
    if t == 0 || hv == 0 || dv == 0 {
        return Ok(());
    }
    if hk == 0 || dk == 0 {
        return Err(GpuError::Unsupported(format!("{name}: hk = {hk}, dk = {dk}")));
    }
    let threads = match name {
        "delta_rule_recurrent" => {
            if dk % 32 != 0 || dk > 1024 {
                return Err(GpuError::Unsupported(format!(
                    "{name}: key dim {dk} must be a multiple of 32, at most 1024"
                )));
            }
            dk as u32
        }
        _ => {
            if dk % 16 != 0 || dk > CHUNKED_MAX_DK {
                return Err(GpuError::Unsupported(format!(
                    "{name}: key dim {dk} must be a multiple of 16, at most {CHUNKED_MAX_DK}"
                )));
            }
            CHUNK_THREADS
        }
    };
    i32_of(t * hv.max(hk) * dk.max(dv), "t·heads·dim")?;
    let [q, k, v, g, beta, state, out, key_head] = ptrs;
    dev.launch(
        name,
        [hv as u32, blocks(dv, COLUMNS), 1],
        [threads, 1, 1],
        0,
        &[
            Arg::Ptr(q),
            Arg::Ptr(k),
            Arg::Ptr(v),
            Arg::Ptr(g),
            Arg::Ptr(beta),
            Arg::Ptr(state),
            Arg::Ptr(out),
            Arg::Ptr(key_head),
            Arg::I32(t as i32),
            Arg::I32(hk as i32),
            Arg::I32(hv as i32),
            Arg::I32(dk as i32),
            Arg::I32(dv as i32),
        ],
    )
}

/// The gated RMSNorm in place over `o` (`[rows, dv]`, rows = t·hv, one value head a row) with
/// the gate `z` (`[rows, dv]`) and scale `w` (`[dv]`, plain): per row
/// `o = o / sqrt(mean(o²) + eps) · w · silu(z)`. Launch: one warp a row, 8 rows (256 threads)
/// a block.
pub fn gated_rms_norm(dev: &Gpu, o: u64, z: u64, w: u64, rows: usize, dv: usize, eps: f32) -> Result<()> {
    if rows == 0 || dv == 0 {
        return Ok(());
    }
    i32_of(rows * dv, "rows·dv")?;
    dev.launch(
        "delta_gated_rms_norm",
        [blocks(rows, 8), 1, 1],
        [256, 1, 1],
        0,
        &[Arg::Ptr(o), Arg::Ptr(z), Arg::Ptr(w), Arg::I32(rows as i32), Arg::I32(dv as i32), Arg::F32(eps)],
    )
}
