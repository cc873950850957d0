//! Element-wise and small kernels shared by the architectures. Hot kernels with a plain
//! reference twin live in their own files ([`delta_rule`], [`conv`]).

pub mod attention;
pub mod attention_q;
pub mod conv;
pub mod delta_rule;
pub mod f16_rows;
pub mod flash;
pub mod gemm;
pub mod matmul;

use half::{bf16, f16};

/// Round an f32 to the nearest bf16 and back (what a bf16 model stores between ops).
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// Round an f32 to the nearest f16 and back.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Whether `FROGNANO_PLAIN_KERNELS=1` asks for the kernels this crate had before its tiled
/// ones (the multi-token k-quant tiles, the vector attention, the AVX2 SwiGLU, the eight-row
/// Q4_K packing), read once. For before/after benchmarks in one binary (`bench/gguf_speed.sh
/// --plain`); results are the same bits either way, except that packed Q4_K matrices sum in
/// their own (fixed) order.
pub fn plain_kernels() -> bool {
    static PLAIN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PLAIN.get_or_init(|| std::env::var("FROGNANO_PLAIN_KERNELS").is_ok_and(|v| v == "1"))
}

/// Whether the packed K-quant kernels on AVX-512 (`quant::q4k_x8`, `quant::q6k_x8`: the
/// Q4_K_M models' weights) ask for their weight stream ahead of use with `prefetch`
/// instructions (`quant::x86::prefetch_ahead`), read once. `FROGNANO_PREFETCH=on|off` decides;
/// otherwise it is on, except on AMD cores with AVX-512 (Zen 4 and later): there the hardware
/// prefetchers keep these long streams ahead by themselves and the instructions only cost. On
/// an EPYC Zen 4, one-thread Q4_K / Q6_K matmuls from memory streamed 16.6–17.7 / 19.2–21.5
/// GB/s with them and 19.5–27.0 / 26.3–27.9 without (`matmul_stream`, alternating runs), and
/// Qwen3.5-4B-shape decode after 8K took a median 7.08 tok/s with them against 7.44 without
/// (ten runs each, alternating; bench/RESULTS.md, session 25). On the
/// Xeon they doubled the stream, and the other kernels keep them everywhere (without, SmolLM2's
/// Q4_1 decode on the same Zen 4 fell from 113–120 to 59–63 tok/s: its small matrices make
/// short streams, which the hardware prefetchers take too long to pick up).
pub fn software_prefetch() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let (on, complaint) = prefetch_setting(std::env::var("FROGNANO_PREFETCH").ok().as_deref(), amd_with_avx512());
        if let Some(c) = complaint {
            eprintln!("frognano: {c}");
        }
        on
    })
}

/// [`software_prefetch`] for the value of `FROGNANO_PREFETCH` (`None`: unset) on a CPU that is
/// (`amd_avx512`) or is not an AMD one with AVX-512, and what to tell the user about a value
/// that is neither `on` nor `off` (the CPU's default is kept).
fn prefetch_setting(value: Option<&str>, amd_avx512: bool) -> (bool, Option<String>) {
    match value.map(str::trim) {
        Some("on" | "1") => (true, None),
        Some("off" | "0") => (false, None),
        None | Some("") => (!amd_avx512, None),
        Some(other) => (
            !amd_avx512,
            Some(format!(
                "FROGNANO_PREFETCH={other:?} is neither on nor off; keeping this CPU's default ({})",
                if amd_avx512 { "off" } else { "on" }
            )),
        ),
    }
}

/// Whether this is an AMD CPU with AVX-512 (Zen 4 or later).
fn amd_with_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let id = std::arch::x86_64::__cpuid(0);
        let vendor: Vec<u8> = [id.ebx, id.edx, id.ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
        vendor == b"AuthenticAMD" && is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Runs `f` on a worker of rayon's pool (on this thread when it already is one). A forward
/// pass runs dozens of parallel loops; started from outside the pool, each one wakes a worker
/// and puts the calling thread to sleep until it is done — two context switches per loop,
/// 8 % of a one-thread SmolLM2 decode step. Inside the pool they fork and join in place.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    rayon::scope(|_| f())
}

/// Runs `f` on every `width`-wide row of `x`, in parallel when there is enough work to pay for
/// it (a prefill's element-wise steps — SiLU, norms, gates — are otherwise a serial share of
/// a multi-threaded forward). `f` gets the row index and the row.
pub fn for_each_row(x: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    use rayon::prelude::*;
    const PARALLEL_FROM: usize = 1 << 15;
    if x.len() < PARALLEL_FROM || rayon::current_num_threads() <= 1 {
        x.chunks_exact_mut(width).enumerate().for_each(|(i, r)| f(i, r));
    } else {
        x.par_chunks_exact_mut(width).enumerate().for_each(|(i, r)| f(i, r));
    }
}

/// The dtype activations are held in between operations (what transformers casts to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// Keep full f32 (f32 checkpoints, GGUF).
    F32,
    /// Round to bf16 after every op, as a bf16 transformers run does.
    BF16,
    /// Round to f16 after every op.
    F16,
}

impl Act {
    /// Round `x` in place to the activation dtype.
    #[inline]
    pub fn round(self, x: &mut [f32]) {
        match self {
            Act::F32 => {}
            Act::BF16 => x.iter_mut().for_each(|v| *v = round_bf16(*v)),
            Act::F16 => x.iter_mut().for_each(|v| *v = round_f16(*v)),
        }
    }
    /// Round one value.
    #[inline]
    pub fn r(self, v: f32) -> f32 {
        match self {
            Act::F32 => v,
            Act::BF16 => round_bf16(v),
            Act::F16 => round_f16(v),
        }
    }
}

/// RMSNorm over rows of width `scale.len()`: `y = x · rsqrt(mean(x²) + eps) · scale`.
/// Zero-centred norms pass `scale = 1 + w` (precomputed at load; GGUF stores it that way).
pub fn rms_norm(x: &[f32], scale: &[f32], eps: f32) -> Vec<f32> {
    let n = scale.len();
    let mut y = vec![0.0; x.len()];
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, v), s) in yr.iter_mut().zip(xr).zip(scale) {
            *o = v * inv * s;
        }
    }
    y
}

/// SiLU `x · σ(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Logistic sigmoid.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Softplus with PyTorch's threshold (linear above 20).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Scales `x` to unit L2 norm: `x · rsqrt(Σx² + eps)`.
pub fn l2_normalize(x: &mut [f32], eps: f32) {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Numerically stable in-place softmax.
pub fn softmax(x: &mut [f32]) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut s = 0.0;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        s += *v;
    }
    let inv = 1.0 / s;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Rotate-half (NeoX) RoPE on the first `rotary_dim` dims of a head, the rest untouched.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    /// Dims rotated per head.
    pub rotary_dim: usize,
}

impl Rope {
    /// `inv_freq[j] = theta^(-2j/R)`, computed in f32 as transformers does.
    pub fn new(rotary_dim: usize, theta: f64) -> Self {
        let inv_freq =
            (0..rotary_dim / 2).map(|j| 1.0 / (theta as f32).powf((2 * j) as f32 / rotary_dim as f32)).collect();
        Rope { inv_freq, rotary_dim }
    }

    /// `(cos, sin)` of every rotated pair at position `pos`, in f32 (unrounded): the table a
    /// device kernel rotates with.
    pub fn cos_sin(&self, pos: usize) -> Vec<(f32, f32)> {
        self.inv_freq
            .iter()
            .map(|f| (pos as f32 * f).cos())
            .zip(self.inv_freq.iter().map(|f| (pos as f32 * f).sin()))
            .collect()
    }

    /// Rotates one head vector `x` (length ≥ rotary_dim) for position `pos`; cos/sin are
    /// rounded to the activation dtype first, like transformers.
    pub fn apply(&self, x: &mut [f32], pos: usize, act: Act) {
        let half = self.rotary_dim / 2;
        for j in 0..half {
            let angle = pos as f32 * self.inv_freq[j];
            let (c, s) = (act.r(angle.cos()), act.r(angle.sin()));
            let (a, b) = (x[j], x[j + half]);
            x[j] = act.r(act.r(a * c) - act.r(b * s));
            x[j + half] = act.r(act.r(b * c) + act.r(a * s));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_prefetch_setting_follows_the_variable_and_else_the_cpu() {
        assert_eq!(super::prefetch_setting(Some("on"), true), (true, None));
        assert_eq!(super::prefetch_setting(Some("off"), false), (false, None));
        assert_eq!(super::prefetch_setting(Some(" 0 "), false), (false, None));
        assert_eq!(super::prefetch_setting(None, true), (false, None));
        assert_eq!(super::prefetch_setting(None, false), (true, None));
        let (on, complaint) = super::prefetch_setting(Some("yes"), true);
        assert!(!on);
        let c = complaint.expect("a value that is neither on nor off is reported");
        assert!(c.contains("FROGNANO_PREFETCH=\"yes\"") && c.contains("(off)"), "{c}");
    }
}
