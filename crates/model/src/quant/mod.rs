//! Block-quantized weights in ggml's formats (what GGUF files hold) and the matmul over them.
//!
//! A row of `n` weights is `n / block_size` blocks laid out exactly as ggml lays them out
//! (little-endian, no padding), so a memory-mapped GGUF tensor is used in place:
//!
//! | type | elements / block | bytes / block | value |
//! |---|---|---|---|
//! | Q4_0 | 32 | 18 | `d·(q − 8)`, q 4-bit |
//! | Q4_1 | 32 | 20 | `d·q + m` |
//! | Q5_0 | 32 | 22 | `d·(q − 16)`, q 5-bit |
//! | Q5_1 | 32 | 24 | `d·q + m` |
//! | Q8_0 | 32 | 34 | `d·q`, q int8 |
//! | Q2_K | 256 | 84 | `d·s·q − dmin·m`, 16 groups of 16, q 2-bit, s/m 4-bit |
//! | Q3_K | 256 | 110 | `d·(s − 32)·q`, q 3-bit signed, s 6-bit |
//! | Q4_K | 256 | 144 | `d·s·q − dmin·m`, 8 groups of 32, s/m 6-bit |
//! | Q5_K | 256 | 176 | as Q4_K with a fifth bit |
//! | Q6_K | 256 | 210 | `d·s·(q − 32)`, 16 groups of 16, s int8 |
//! | IQ4_NL | 32 | 18 | `d·K[q]`, q a 4-bit index into the 16-entry table K ([`KVALUES_IQ4NL`]) |
//! | IQ4_XS | 256 | 136 | `d·(s − 32)·K[q]`, 8 groups of 32, s 6-bit |
//!
//! Matmul follows llama.cpp: each activation row is quantized to 8-bit blocks ([`ActFormat`]:
//! Q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL, Q8_1 for Q4_1/Q5_1, Q8_K for the k-quants and IQ4_XS) and
//! every weight row is dotted with it in integer arithmetic, so our logits track llama.cpp's,
//! not an f32 dequantized product. [`dot_reference`] is the plain version of every dot; on
//! x86-64 with AVX2, FMA and F16C every format has SIMD kernels (`x86`, `x86_legacy` for the
//! 32-element blocks, `x86_kquant` for the k-quants and IQ4_XS), picked at run time: a single
//! dot, a 4-token tile for prefill, and for the 32-element blocks a 4-row form for decode.

pub mod ggml;
pub mod iq4xs_x8;
pub mod legacy_x8;
pub mod q2k_x8;
pub mod q4k_x8;
pub mod q6k_x8;
pub mod quantize;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use half::f16;
use rayon::prelude::*;

/// A ggml block-quantized weight format.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    /// 32 × 4-bit, one f16 scale, offset 8.
    Q4_0,
    /// 32 × 4-bit, f16 scale and minimum.
    Q4_1,
    /// 32 × 5-bit, one f16 scale, offset 16.
    Q5_0,
    /// 32 × 5-bit, f16 scale and minimum.
    Q5_1,
    /// 32 × int8, one f16 scale.
    Q8_0,
    /// 256-element super-block, 2-bit values, 4-bit scales and minimums.
    Q2_K,
    /// 256-element super-block, 3-bit values, 6-bit scales.
    Q3_K,
    /// 256-element super-block, 4-bit values, 6-bit scales and minimums.
    Q4_K,
    /// 256-element super-block, 5-bit values, 6-bit scales and minimums.
    Q5_K,
    /// 256-element super-block, 6-bit values, int8 scales.
    Q6_K,
    /// 32 × 4-bit indices into the non-linear table [`KVALUES_IQ4NL`], one f16 scale.
    IQ4_NL,
    /// 256-element super-block of IQ4_NL indices, 6-bit scales per 32.
    IQ4_XS,
}

/// The sixteen values a 4-bit IQ4_NL/IQ4_XS index selects (ggml's `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// How activations are quantized to meet a weight format in an integer dot.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActFormat {
    /// 32 × int8 with an f16-rounded scale.
    Q8_0,
    /// Q8_0 plus `d·Σq` (f16-rounded) per block, for formats with a minimum.
    Q8_1,
    /// 256 × int8 with an f32 scale and the sum of every 16 values.
    Q8_K,
}

/// Elements per super-block of the k-quants.
pub const QK_K: usize = 256;

impl QuantType {
    /// Every format, in ggml type-id order.
    pub const ALL: [QuantType; 12] = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q2_K,
        QuantType::Q3_K,
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
        QuantType::IQ4_NL,
        QuantType::IQ4_XS,
    ];

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q5_0
            | QuantType::Q5_1
            | QuantType::Q8_0
            | QuantType::IQ4_NL => 32,
            _ => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::Q4_0 => 18,
            QuantType::Q4_1 => 20,
            QuantType::Q5_0 => 22,
            QuantType::Q5_1 => 24,
            QuantType::Q8_0 => 34,
            QuantType::Q2_K => 84,
            QuantType::Q3_K => 110,
            QuantType::Q4_K => 144,
            QuantType::Q5_K => 176,
            QuantType::Q6_K => 210,
            QuantType::IQ4_NL => 18,
            QuantType::IQ4_XS => 136,
        }
    }

    /// ggml's name (`Q4_K`).
    pub fn name(self) -> &'static str {
        match self {
            QuantType::Q4_0 => "Q4_0",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q5_0 => "Q5_0",
            QuantType::Q5_1 => "Q5_1",
            QuantType::Q8_0 => "Q8_0",
            QuantType::Q2_K => "Q2_K",
            QuantType::Q3_K => "Q3_K",
            QuantType::Q4_K => "Q4_K",
            QuantType::Q5_K => "Q5_K",
            QuantType::Q6_K => "Q6_K",
            QuantType::IQ4_NL => "IQ4_NL",
            QuantType::IQ4_XS => "IQ4_XS",
        }
    }

    /// ggml type id (`enum ggml_type`).
    pub fn ggml_id(self) -> u32 {
        match self {
            QuantType::Q4_0 => 2,
            QuantType::Q4_1 => 3,
            QuantType::Q5_0 => 6,
            QuantType::Q5_1 => 7,
            QuantType::Q8_0 => 8,
            QuantType::Q2_K => 10,
            QuantType::Q3_K => 11,
            QuantType::Q4_K => 12,
            QuantType::Q5_K => 13,
            QuantType::Q6_K => 14,
            QuantType::IQ4_NL => 20,
            QuantType::IQ4_XS => 23,
        }
    }

    /// The activation format llama.cpp pairs with this weight format.
    pub fn act_format(self) -> ActFormat {
        match self {
            QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 | QuantType::IQ4_NL => ActFormat::Q8_0,
            QuantType::Q4_1 | QuantType::Q5_1 => ActFormat::Q8_1,
            _ => ActFormat::Q8_K,
        }
    }

    /// Bytes of a row of `n` elements, or `None` when `n` is not a whole number of blocks or
    /// the byte count does not fit a `usize`.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_size()).then(|| (n / self.block_size()).checked_mul(self.block_bytes())).flatten()
    }
}

impl std::fmt::Display for QuantType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[inline]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

#[inline]
fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

// ---------------------------------------------------------------------------------------------
// k-quant super-blocks unpacked to integers: value, per-16 scale and minimum.

/// One k-quant super-block as integers: element `e` is `d·scale[e/16]·q[e] − dmin·min[e/16]`.
#[derive(Debug, Clone)]
pub struct UnpackedK {
    /// Values (Q2_K 0..3, Q3_K −4..3, Q4_K 0..15, Q5_K 0..31, Q6_K −32..31, IQ4_XS the
    /// table's −127..113).
    pub q: [i8; QK_K],
    /// Scale per group of 16 (IQ4_XS: its scale per 32 twice, less its offset of 32).
    pub scale: [i32; 16],
    /// Minimum per group of 16 (zero for Q3_K, Q6_K and IQ4_XS).
    pub min: [i32; 16],
    /// Super-block scale.
    pub d: f32,
    /// Super-block scale of the minimums.
    pub dmin: f32,
}

/// The 6-bit scale and minimum of sub-block `j` (0..8) of a Q4_K/Q5_K `scales[12]` field.
#[inline]
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// The sixteen 6-bit scales (still offset by 32) of a Q3_K `scales[12]` field.
pub(crate) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// Unpacks one super-block `b` (`block_bytes` long) of k-quant type `ty`.
pub fn unpack_k(ty: QuantType, b: &[u8]) -> UnpackedK {
    let mut u = UnpackedK { q: [0; QK_K], scale: [0; 16], min: [0; 16], d: 0.0, dmin: 0.0 };
    match ty {
        QuantType::Q2_K => {
            let (scales, qs) = (&b[0..16], &b[16..80]);
            u.d = f16_at(b, 80);
            u.dmin = f16_at(b, 82);
            for e in 0..QK_K {
                let (half, j, l) = (e / 128, (e % 128) / 32, e % 32);
                u.q[e] = ((qs[half * 32 + l] >> (2 * j)) & 3) as i8;
            }
            for (g, s) in scales.iter().enumerate() {
                u.scale[g] = (s & 0xF) as i32;
                u.min[g] = (s >> 4) as i32;
            }
        }
        QuantType::Q3_K => {
            let (hmask, qs, scales) = (&b[0..32], &b[32..96], &b[96..108]);
            u.d = f16_at(b, 108);
            for e in 0..QK_K {
                let (half, j, l) = (e / 128, (e % 128) / 32, e % 32);
                let low = ((qs[half * 32 + l] >> (2 * j)) & 3) as i8;
                let high_set = hmask[l] & (1 << (half * 4 + j)) != 0;
                u.q[e] = low - if high_set { 0 } else { 4 };
            }
            for (g, s) in q3k_scales(scales).iter().enumerate() {
                u.scale[g] = *s as i32;
            }
        }
        QuantType::Q4_K | QuantType::Q5_K => {
            u.d = f16_at(b, 0);
            u.dmin = f16_at(b, 2);
            let scales = &b[4..16];
            let (qh, qs) = if ty == QuantType::Q5_K { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
            for e in 0..QK_K {
                let (chunk, l) = (e / 64, e % 64);
                let byte = qs[chunk * 32 + l % 32];
                let mut v = if l < 32 { byte & 0xF } else { byte >> 4 };
                if let Some(qh) = qh {
                    v |= ((qh[e % 32] >> (e / 32)) & 1) << 4;
                }
                u.q[e] = v as i8;
            }
            for g in 0..16 {
                let (s, m) = scale_min_k4(g / 2, scales);
                u.scale[g] = s as i32;
                u.min[g] = m as i32;
            }
        }
        QuantType::Q6_K => {
            let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
            u.d = f16_at(b, 208);
            for e in 0..QK_K {
                let (n, quarter, l) = (e / 128, (e % 128) / 32, e % 32);
                let (ql, qh) = (&ql[n * 64..], &qh[n * 32..]);
                let low = match quarter {
                    0 => ql[l] & 0xF,
                    1 => ql[l + 32] & 0xF,
                    2 => ql[l] >> 4,
                    _ => ql[l + 32] >> 4,
                };
                let high = (qh[l] >> (2 * quarter)) & 3;
                u.q[e] = (low | (high << 4)) as i8 - 32;
            }
            for (g, s) in scales.iter().enumerate() {
                u.scale[g] = *s as i8 as i32;
            }
        }
        QuantType::IQ4_XS => {
            u.d = f16_at(b, 0);
            let scales_h = u16::from_le_bytes([b[2], b[3]]);
            let (scales_l, qs) = (&b[4..8], &b[8..136]);
            for sb in 0..8 {
                let low = (scales_l[sb / 2] >> (4 * (sb % 2))) & 0xF;
                let high = ((scales_h >> (2 * sb)) & 3) as u8;
                let s = (low | (high << 4)) as i32 - 32;
                u.scale[2 * sb] = s;
                u.scale[2 * sb + 1] = s;
                for j in 0..16 {
                    let q = qs[16 * sb + j];
                    u.q[32 * sb + j] = KVALUES_IQ4NL[(q & 0xF) as usize];
                    u.q[32 * sb + 16 + j] = KVALUES_IQ4NL[(q >> 4) as usize];
                }
            }
        }
        _ => unreachable!("unpack_k called with {ty}"),
    }
    u
}

// ---------------------------------------------------------------------------------------------
// Dequantization.

/// Dequantizes `out.len()` elements (a whole number of blocks) of type `ty` from `bytes`,
/// with the same float operations as ggml's `dequantize_row_*`.
pub fn dequantize(ty: QuantType, bytes: &[u8], out: &mut [f32]) {
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    assert_eq!(out.len() % bs, 0, "dequantize: {} elements is not a whole number of {ty} blocks", out.len());
    for (b, y) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bs)) {
        match ty {
            QuantType::Q4_0 => {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    y[j] = ((b[2 + j] & 0xF) as i32 - 8) as f32 * d;
                    y[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
                }
            }
            QuantType::Q4_1 => {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                for j in 0..16 {
                    y[j] = (b[4 + j] & 0xF) as f32 * d + m;
                    y[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
                }
            }
            QuantType::Q5_0 | QuantType::Q5_1 => {
                let (d, m, hoff) =
                    if ty == QuantType::Q5_0 { (f16_at(b, 0), 0.0, 2) } else { (f16_at(b, 0), f16_at(b, 2), 4) };
                let qh = u32::from_le_bytes([b[hoff], b[hoff + 1], b[hoff + 2], b[hoff + 3]]);
                let qs = &b[hoff + 4..hoff + 20];
                let off = if ty == QuantType::Q5_0 { 16 } else { 0 };
                for j in 0..16 {
                    let x0 = ((qs[j] & 0xF) as u32 | (((qh >> j) & 1) << 4)) as i32 - off;
                    let x1 = ((qs[j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4)) as i32 - off;
                    if ty == QuantType::Q5_0 {
                        y[j] = x0 as f32 * d;
                        y[j + 16] = x1 as f32 * d;
                    } else {
                        y[j] = x0 as f32 * d + m;
                        y[j + 16] = x1 as f32 * d + m;
                    }
                }
            }
            QuantType::Q8_0 => {
                let d = f16_at(b, 0);
                for j in 0..32 {
                    y[j] = b[2 + j] as i8 as f32 * d;
                }
            }
            QuantType::IQ4_NL => {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    y[j] = d * KVALUES_IQ4NL[(b[2 + j] & 0xF) as usize] as f32;
                    y[j + 16] = d * KVALUES_IQ4NL[(b[2 + j] >> 4) as usize] as f32;
                }
            }
            _ => {
                let u = unpack_k(ty, b);
                for (e, (o, q)) in y.iter_mut().zip(u.q).enumerate() {
                    let g = e / 16;
                    *o = (u.d * u.scale[g] as f32) * q as f32 - u.dmin * u.min[g] as f32;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Activation quantization.

/// Rows of activations quantized to 8 bits in the format a weight type dots against.
#[derive(Debug, Clone)]
pub struct QuantizedActs {
    /// The format.
    pub format: ActFormat,
    /// Elements per row.
    pub cols: usize,
    /// All values, row-major.
    pub qs: Vec<i8>,
    /// Scale per block.
    pub d: Vec<f32>,
    /// `d·Σq` per block (Q8_1 only), f16-rounded as ggml stores it.
    pub s: Vec<f32>,
    /// Sum of every 16 values (Q8_K only).
    pub bsums: Vec<i16>,
    /// Sum of every 32 values: one per block for Q8_0 and Q8_1 (the offsets of the packed
    /// Q4_0/Q5_0 kernels, [`legacy_x8`]), and for Q8_K eight per block in the order
    /// `[B0, B1, B4, B5, B2, B3, B6, B7]` the packed Q4_K kernel ([`q4k_x8`]) reads.
    pub sums32: Vec<i16>,
}

/// One quantized activation row.
#[derive(Debug, Clone, Copy)]
pub struct ActRow<'a> {
    /// Values.
    pub qs: &'a [i8],
    /// Scale per block.
    pub d: &'a [f32],
    /// `d·Σq` per block (Q8_1).
    pub s: &'a [f32],
    /// Sums of 16 (Q8_K).
    pub bsums: &'a [i16],
    /// Sums of 32 (per block for Q8_0/Q8_1; in [`q4k_x8`]'s order for Q8_K).
    pub sums32: &'a [i16],
}

impl ActFormat {
    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            ActFormat::Q8_0 | ActFormat::Q8_1 => 32,
            ActFormat::Q8_K => QK_K,
        }
    }
}

/// Round half to even, as ggml's activation quantizers do (`_mm256_round_ps` with
/// `_MM_ROUND_NEAREST` for Q8_0/Q8_1, the `+ 1.5·2²³` trick of `nearest_int` for Q8_K).
#[inline]
fn round_i8(v: f32) -> i8 {
    rne(v).clamp(-128.0, 127.0) as i8
}

/// Round half to even without a libm call: adding and removing 1.5·2²³ leaves the nearest
/// integer (ties to even) for `|v| < 2²²`; larger magnitudes (outside any int8 range) are
/// passed to `round_ties_even`.
#[inline]
fn rne(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    if v.abs() < 4_194_304.0 {
        (v + MAGIC) - MAGIC
    } else {
        v.round_ties_even()
    }
}

impl QuantizedActs {
    /// Quantizes `t` rows of `x` (`cols` wide; `cols` a multiple of the block size).
    pub fn new(format: ActFormat, x: &[f32], t: usize) -> Self {
        // A prefill's activations are quantized in parallel, eight rows per task.
        const ROWS_PER_TASK: usize = 8;
        if t >= 2 * ROWS_PER_TASK && x.len() >= 1 << 15 && rayon::current_num_threads() > 1 {
            let cols = x.len() / t;
            let parts: Vec<QuantizedActs> =
                x.par_chunks(cols * ROWS_PER_TASK).map(|xc| Self::new_serial(format, xc, xc.len() / cols)).collect();
            let mut a = QuantizedActs {
                format,
                cols,
                qs: Vec::with_capacity(x.len()),
                d: Vec::new(),
                s: Vec::new(),
                bsums: Vec::new(),
                sums32: Vec::new(),
            };
            for p in parts {
                a.qs.extend(p.qs);
                a.d.extend(p.d);
                a.s.extend(p.s);
                a.bsums.extend(p.bsums);
                a.sums32.extend(p.sums32);
            }
            return a;
        }
        Self::new_serial(format, x, t)
    }

    /// [`QuantizedActs::new`] on this thread.
    fn new_serial(format: ActFormat, x: &[f32], t: usize) -> Self {
        let cols = x.len() / t.max(1);
        let bs = format.block_size();
        assert_eq!(cols % bs, 0, "activation width {cols} is not a multiple of {bs}");
        let nb = x.len() / bs;
        #[allow(unused_mut)]
        let mut a = QuantizedActs {
            format,
            cols,
            qs: vec![0; x.len()],
            d: vec![0.0; nb],
            s: if format == ActFormat::Q8_1 { vec![0.0; nb] } else { Vec::new() },
            bsums: if format == ActFormat::Q8_K { vec![0; x.len() / 16] } else { Vec::new() },
            sums32: vec![0; x.len() / 32],
        };
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 (which implies SSE4.1's rounding instructions) was detected.
            unsafe { a.fill_avx2(x) };
            return a;
        }
        a.fill(x);
        a
    }

    /// [`QuantizedActs::fill`] compiled for AVX2: the ties-to-even rounding becomes `vroundps`
    /// instead of a `rintf` call per element, and the block loops vectorise. Same results.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn fill_avx2(&mut self, x: &[f32]) {
        self.fill(x)
    }

    /// Quantizes `x` into the (zeroed, correctly sized) buffers.
    #[inline(always)]
    fn fill(&mut self, x: &[f32]) {
        let (format, bs) = (self.format, self.format.block_size());
        let a = self;
        let qs_chunks = a.qs.chunks_mut(bs);
        match format {
            ActFormat::Q8_0 | ActFormat::Q8_1 => {
                let with_sum = format == ActFormat::Q8_1;
                let mut s_iter = a.s.iter_mut();
                for (((xb, qb), d), s32) in
                    x.chunks_exact(bs).zip(qs_chunks).zip(a.d.iter_mut()).zip(a.sums32.iter_mut())
                {
                    let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    let dd = amax / 127.0;
                    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
                    let mut sum = 0i32;
                    for (q, v) in qb.iter_mut().zip(xb) {
                        *q = round_i8(v * id);
                        sum += *q as i32;
                    }
                    *d = round_f16(dd);
                    *s32 = sum as i16;
                    if with_sum {
                        *s_iter.next().expect("one sum per block") = round_f16(sum as f32 * dd);
                    }
                }
            }
            ActFormat::Q8_K => {
                for (((xb, qb), d), sums) in
                    x.chunks_exact(bs).zip(qs_chunks).zip(a.d.iter_mut()).zip(a.bsums.chunks_exact_mut(16))
                {
                    let (mut amax, mut max) = (0.0f32, 0.0f32);
                    for &v in xb {
                        if v.abs() > amax {
                            amax = v.abs();
                            max = v;
                        }
                    }
                    if amax == 0.0 {
                        continue;
                    }
                    let iscale = -127.0 / max;
                    for (q, v) in qb.iter_mut().zip(xb) {
                        *q = rne(iscale * v).min(127.0) as i8;
                    }
                    for (s, g) in sums.iter_mut().zip(qb.chunks_exact(16)) {
                        *s = g.iter().map(|&q| q as i16).sum();
                    }
                    *d = 1.0 / iscale;
                }
                for (s32, s16) in a.sums32.chunks_exact_mut(8).zip(a.bsums.chunks_exact(16)) {
                    for (slot, j) in [0, 1, 4, 5, 2, 3, 6, 7].into_iter().enumerate() {
                        s32[slot] = s16[2 * j] + s16[2 * j + 1];
                    }
                }
            }
        }
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> ActRow<'_> {
        let bs = self.format.block_size();
        let nb = self.cols / bs;
        ActRow {
            qs: &self.qs[i * self.cols..(i + 1) * self.cols],
            d: &self.d[i * nb..(i + 1) * nb],
            s: if self.s.is_empty() { &[] } else { &self.s[i * nb..(i + 1) * nb] },
            bsums: if self.bsums.is_empty() { &[] } else { &self.bsums[i * self.cols / 16..(i + 1) * self.cols / 16] },
            sums32: if self.sums32.is_empty() {
                &[]
            } else {
                &self.sums32[i * self.cols / 32..(i + 1) * self.cols / 32]
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Dot products.

/// Integer dot of one weight row (`w`, whole blocks of `ty`) with one quantized activation row,
/// the plain way (the reference every SIMD kernel is tested against).
pub fn dot_reference(ty: QuantType, w: &[u8], a: &ActRow) -> f32 {
    let bb = ty.block_bytes();
    let mut sum = 0.0f32;
    for (ib, b) in w.chunks_exact(bb).enumerate() {
        match ty {
            QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q5_0
            | QuantType::Q5_1
            | QuantType::Q8_0
            | QuantType::IQ4_NL => {
                let y = &a.qs[ib * 32..(ib + 1) * 32];
                let mut vals = [0i32; 32];
                let (d, m) = match ty {
                    QuantType::Q4_0 => {
                        for j in 0..16 {
                            vals[j] = (b[2 + j] & 0xF) as i32 - 8;
                            vals[j + 16] = (b[2 + j] >> 4) as i32 - 8;
                        }
                        (f16_at(b, 0), 0.0)
                    }
                    QuantType::Q4_1 => {
                        for j in 0..16 {
                            vals[j] = (b[4 + j] & 0xF) as i32;
                            vals[j + 16] = (b[4 + j] >> 4) as i32;
                        }
                        (f16_at(b, 0), f16_at(b, 2))
                    }
                    QuantType::Q5_0 | QuantType::Q5_1 => {
                        let hoff = if ty == QuantType::Q5_0 { 2 } else { 4 };
                        let qh = u32::from_le_bytes([b[hoff], b[hoff + 1], b[hoff + 2], b[hoff + 3]]);
                        let off = if ty == QuantType::Q5_0 { 16 } else { 0 };
                        for j in 0..16 {
                            let q = b[hoff + 4 + j];
                            vals[j] = ((q & 0xF) as u32 | (((qh >> j) & 1) << 4)) as i32 - off;
                            vals[j + 16] = ((q >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4)) as i32 - off;
                        }
                        (f16_at(b, 0), if ty == QuantType::Q5_1 { f16_at(b, 2) } else { 0.0 })
                    }
                    QuantType::IQ4_NL => {
                        for j in 0..16 {
                            vals[j] = KVALUES_IQ4NL[(b[2 + j] & 0xF) as usize] as i32;
                            vals[j + 16] = KVALUES_IQ4NL[(b[2 + j] >> 4) as usize] as i32;
                        }
                        (f16_at(b, 0), 0.0)
                    }
                    _ => {
                        for j in 0..32 {
                            vals[j] = b[2 + j] as i8 as i32;
                        }
                        (f16_at(b, 0), 0.0)
                    }
                };
                let sumi: i32 = vals.iter().zip(y).map(|(v, q)| v * *q as i32).sum();
                sum += sumi as f32 * (d * a.d[ib]);
                if matches!(ty, QuantType::Q4_1 | QuantType::Q5_1) {
                    sum += m * a.s[ib];
                }
            }
            _ => {
                let u = unpack_k(ty, b);
                let y = &a.qs[ib * QK_K..(ib + 1) * QK_K];
                let sums = &a.bsums[ib * 16..(ib + 1) * 16];
                let (mut isum, mut msum) = (0i32, 0i32);
                for g in 0..16 {
                    let dot: i32 = (0..16).map(|l| u.q[g * 16 + l] as i32 * y[g * 16 + l] as i32).sum();
                    isum += u.scale[g] * dot;
                    msum += u.min[g] * sums[g] as i32;
                }
                sum += a.d[ib] * (u.d * isum as f32 - u.dmin * msum as f32);
            }
        }
    }
    sum
}

/// A dot kernel: one weight row against one quantized activation row.
pub type DotFn = fn(&[u8], &ActRow) -> f32;

/// The fastest dot kernel this CPU has for `ty`.
pub fn dot_kernel(ty: QuantType) -> DotFn {
    #[cfg(target_arch = "x86_64")]
    if let Some(f) = x86::kernel(ty) {
        return f;
    }
    match ty {
        QuantType::Q4_0 => |w, a| dot_reference(QuantType::Q4_0, w, a),
        QuantType::Q4_1 => |w, a| dot_reference(QuantType::Q4_1, w, a),
        QuantType::Q5_0 => |w, a| dot_reference(QuantType::Q5_0, w, a),
        QuantType::Q5_1 => |w, a| dot_reference(QuantType::Q5_1, w, a),
        QuantType::Q8_0 => |w, a| dot_reference(QuantType::Q8_0, w, a),
        QuantType::Q2_K => |w, a| dot_reference(QuantType::Q2_K, w, a),
        QuantType::Q3_K => |w, a| dot_reference(QuantType::Q3_K, w, a),
        QuantType::Q4_K => |w, a| dot_reference(QuantType::Q4_K, w, a),
        QuantType::Q5_K => |w, a| dot_reference(QuantType::Q5_K, w, a),
        QuantType::Q6_K => |w, a| dot_reference(QuantType::Q6_K, w, a),
        QuantType::IQ4_NL => |w, a| dot_reference(QuantType::IQ4_NL, w, a),
        QuantType::IQ4_XS => |w, a| dot_reference(QuantType::IQ4_XS, w, a),
    }
}

/// A 4-token dot kernel: one weight row against four activation rows.
pub type Dot4Fn = fn(&[u8], &[ActRow; 4]) -> [f32; 4];

/// The 4-token kernel for `ty`, where one exists on this CPU (each result bit-identical to
/// [`dot_kernel`]'s for that token).
pub fn dot_kernel_x4(ty: QuantType) -> Option<Dot4Fn> {
    #[cfg(target_arch = "x86_64")]
    {
        x86::kernel_x4(ty)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        None
    }
}

/// An 8-token dot kernel: one weight row against eight activation rows.
pub type Dot8Fn = fn(&[u8], &[ActRow; 8]) -> [f32; 8];

/// The 8-token kernel for `ty`, where one exists on this CPU (each result bit-identical to
/// [`dot_kernel`]'s for that token).
pub fn dot_kernel_x8(ty: QuantType) -> Option<Dot8Fn> {
    #[cfg(target_arch = "x86_64")]
    {
        x86::kernel_x8(ty)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        None
    }
}

/// A 4-row kernel: four consecutive weight rows (`w` holds all four) against one activation row.
pub type DotRows4Fn = fn(&[u8], &ActRow) -> [f32; 4];

/// The 4-row kernel for `ty`, where one exists on this CPU (each result bit-identical to
/// [`dot_kernel`]'s for that row).
pub fn dot_kernel_rows4(ty: QuantType) -> Option<DotRows4Fn> {
    #[cfg(target_arch = "x86_64")]
    {
        x86::kernel_rows4(ty)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        None
    }
}

/// Whether this CPU has AVX2 with FMA and F16C, what every AVX2 kernel here needs.
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU has AVX-512 F with byte/word instructions (BW) and 256-bit forms (VL).
pub(crate) fn has_avx512bw() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU has AVX-512 VNNI with 256-bit forms (F, VL, VNNI).
pub(crate) fn has_avx512vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The fifth bits of the four weight registers of half `h` of a five-bit packing (Q5_K, Q5_0,
/// Q5_1), as `0x10` in each byte that has one, from its 256-bit plane `hb`: register `k`'s bit
/// sits at bit `4 + k` for rows 0..4 (half 0) and at bit `k` for rows 4..8 (half 1).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fifth_bits(hb: std::arch::x86_64::__m256i, h: usize) -> [std::arch::x86_64::__m256i; 4] {
    use std::arch::x86_64::*;
    let moved = if h == 0 {
        [hb, _mm256_srli_epi16::<1>(hb), _mm256_srli_epi16::<2>(hb), _mm256_srli_epi16::<3>(hb)]
    } else {
        [_mm256_slli_epi16::<4>(hb), _mm256_slli_epi16::<3>(hb), _mm256_slli_epi16::<2>(hb), _mm256_slli_epi16::<1>(hb)]
    };
    moved.map(|m| _mm256_and_si256(m, _mm256_set1_epi8(0x10)))
}

/// The dots of four rows from an eight-row packing's register of `(row, half)` lanes:
/// `lanes[2r] + lanes[2r + 1]` (the last float step of every packed kernel, one order).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn row_pair_sums(v: std::arch::x86_64::__m256) -> [f32; 4] {
    let mut lanes = [0.0f32; 8];
    std::arch::x86_64::_mm256_storeu_ps(lanes.as_mut_ptr(), v);
    std::array::from_fn(|r| lanes[2 * r] + lanes[2 * r + 1])
}

/// The eight dots of a packed group from its two accumulators of `(row, half)` lanes (rows
/// 0..4 in `lo`, 4..8 in `hi`).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn group_sums(lo: std::arch::x86_64::__m256, hi: std::arch::x86_64::__m256) -> [f32; 8] {
    let (a, b) = (row_pair_sums(lo), row_pair_sums(hi));
    std::array::from_fn(|r| if r < 4 { a[r] } else { b[r - 4] })
}

/// The eight dots of a packed group from one 512-bit accumulator of `(row, half)` lanes: the
/// AVX-512 kernels' form of [`group_sums`], in the same order.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn group_sums512(v: std::arch::x86_64::__m512) -> [f32; 8] {
    let mut lanes = [0.0f32; 16];
    std::arch::x86_64::_mm512_storeu_ps(lanes.as_mut_ptr(), v);
    std::array::from_fn(|r| lanes[2 * r] + lanes[2 * r + 1])
}

/// Four rows' f16 scales at `p` (one half of a packed group's eight) widened to f32, each in
/// both `(row, half)` lanes of its row: what every packed kernel's float step multiplies by.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn row_scales4(p: *const u8) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let four = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_loadl_epi64(p as *const __m128i)));
    _mm256_permutevar8x32_ps(four, _mm256_set_epi32(3, 3, 2, 2, 1, 1, 0, 0))
}

/// Eight rows (one packed group, `nb` blocks) against `N` tokens: `out[k][r]`, the kernel of
/// an eight-row packing ([`q4k_x8`], [`q6k_x8`], [`q2k_x8`], [`iq4xs_x8`], [`legacy_x8`]).
pub type GroupKernel<const N: usize> = fn(&[u8], &[ActRow; N]) -> [[f32; 8]; N];

/// Rows interleaved by every eight-row packing.
pub const PACK_GROUP: usize = 8;

/// The eight-row packing of `ty` this CPU has a kernel for: its bytes per packed super-block
/// (eight rows' worth) and its 1-, 4- and 8-token kernels.
#[allow(clippy::type_complexity)]
fn packing(ty: QuantType) -> Option<(usize, (GroupKernel<1>, GroupKernel<4>, GroupKernel<8>))> {
    match ty {
        QuantType::Q2_K => {
            Some((q2k_x8::BLOCK_BYTES_Q2K, (q2k_x8::kernel_q2k()?, q2k_x8::kernel_q2k()?, q2k_x8::kernel_q2k()?)))
        }
        QuantType::Q3_K => {
            Some((q2k_x8::BLOCK_BYTES_Q3K, (q2k_x8::kernel_q3k()?, q2k_x8::kernel_q3k()?, q2k_x8::kernel_q3k()?)))
        }
        QuantType::Q4_K => Some((q4k_x8::BLOCK_BYTES, (q4k_x8::kernel()?, q4k_x8::kernel()?, q4k_x8::kernel()?))),
        QuantType::Q5_K => {
            Some((q4k_x8::BLOCK_BYTES_Q5K, (q4k_x8::kernel_q5k()?, q4k_x8::kernel_q5k()?, q4k_x8::kernel_q5k()?)))
        }
        QuantType::Q6_K => Some((q6k_x8::BLOCK_BYTES, (q6k_x8::kernel()?, q6k_x8::kernel()?, q6k_x8::kernel()?))),
        QuantType::IQ4_XS => {
            Some((iq4xs_x8::BLOCK_BYTES, (iq4xs_x8::kernel()?, iq4xs_x8::kernel()?, iq4xs_x8::kernel()?)))
        }
        ty if legacy_x8::handles(ty) => {
            Some((legacy_x8::block_bytes(ty), (legacy_x8::kernel(ty)?, legacy_x8::kernel(ty)?, legacy_x8::kernel(ty)?)))
        }
        _ => None,
    }
}

/// A zeroed buffer for a packed matrix. On Linux the kernel is asked to back it with 2 MiB
/// pages (`MADV_HUGEPAGE`; transparent huge pages are often in `madvise` mode) before anything
/// is written: a 2.7 GB model then takes ~1,300 page faults at load instead of ~660,000, and
/// the decode's weight stream walks 512 times fewer page-table entries. A hint only: where it
/// is refused, the buffer is the same.
pub(crate) fn pack_buffer(len: usize) -> Vec<u8> {
    let v = vec![0u8; len];
    #[cfg(target_os = "linux")]
    if len >= 4 << 20 {
        const PAGE: usize = 4096;
        let (start, end) = ((v.as_ptr() as usize).next_multiple_of(PAGE), (v.as_ptr() as usize + len) / PAGE * PAGE);
        // SAFETY: [start, end) lies inside `v`'s allocation and is page-aligned; MADV_HUGEPAGE
        // changes how its pages are backed, never their contents.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
    v
}

/// Whether a `rows`-row matrix of `ty` is repacked eight rows at a time on this CPU.
pub fn packs(ty: QuantType, rows: usize) -> bool {
    rows.is_multiple_of(PACK_GROUP) && packing(ty).is_some()
}

/// The eight-row packed copy of a row-major `[rows, cols]` matrix of `ty`, when [`packs`].
pub fn pack_rows8(ty: QuantType, w: &[u8], rows: usize, cols: usize) -> Option<Vec<u8>> {
    if !packs(ty, rows) {
        return None;
    }
    match ty {
        QuantType::Q2_K => Some(q2k_x8::pack_q2k(w, rows, cols)),
        QuantType::Q3_K => Some(q2k_x8::pack_q3k(w, rows, cols)),
        QuantType::Q4_K => Some(q4k_x8::pack(w, rows, cols)),
        QuantType::Q5_K => Some(q4k_x8::pack_q5k(w, rows, cols)),
        QuantType::Q6_K => Some(q6k_x8::pack(w, rows, cols)),
        QuantType::IQ4_XS => Some(iq4xs_x8::pack(w, rows, cols)),
        ty if legacy_x8::handles(ty) => Some(legacy_x8::pack(ty, w, rows, cols)),
        _ => None,
    }
}

/// Row `r` of a [`pack_rows8`] copy (`rows` rows) widened to f32 into `out`: the values
/// [`dequantize`] gives for the original row.
pub fn unpack_row8(ty: QuantType, packed: &[u8], rows: usize, r: usize, out: &mut [f32]) {
    let group_bytes = packed.len() / (rows / PACK_GROUP);
    let group = &packed[r / PACK_GROUP * group_bytes..][..group_bytes];
    match ty {
        QuantType::Q2_K => q2k_x8::dequantize_row_q2k(group, r % PACK_GROUP, out),
        QuantType::Q3_K => q2k_x8::dequantize_row_q3k(group, r % PACK_GROUP, out),
        QuantType::Q4_K => q4k_x8::dequantize_row(group, r % PACK_GROUP, out),
        QuantType::Q5_K => q4k_x8::dequantize_row_q5k(group, r % PACK_GROUP, out),
        QuantType::Q6_K => q6k_x8::dequantize_row(group, r % PACK_GROUP, out),
        QuantType::IQ4_XS => iq4xs_x8::dequantize_row(group, r % PACK_GROUP, out),
        ty if legacy_x8::handles(ty) => legacy_x8::dequantize_row(ty, group, r % PACK_GROUP, out),
        _ => panic!("unpack_row8: no eight-row packing of {ty}"),
    }
}

/// Rows of the weight matrix handled by one parallel task.
const ROW_BLOCK: usize = 16;

/// Below this many multiply-adds a matmul runs on the calling thread: waking the pool costs
/// more than it saves.
const SERIAL_WORK: usize = 1 << 17;

/// `y[t, r] = Σ_k x[t, k] · W[r, k]` for a `[rows, cols]` weight matrix of type `ty` stored
/// row-major in `w`; returns `[t, rows]`.
pub fn matmul(ty: QuantType, w: &[u8], rows: usize, cols: usize, x: &[f32], t: usize) -> Vec<f32> {
    matmul_many(&[QuantMat { ty, w, rows, packed: None }], cols, x, t).pop().expect("one matrix in, one product out")
}

/// One weight matrix of a [`matmul_many`]: `rows` rows of type `ty`, row-major in `w`.
#[derive(Debug, Clone, Copy)]
pub struct QuantMat<'a> {
    /// Block format.
    pub ty: QuantType,
    /// The blocks.
    pub w: &'a [u8],
    /// Rows (output features).
    pub rows: usize,
    /// The same matrix packed by [`pack_rows8`], if it was (then used instead of `w`).
    pub packed: Option<&'a [u8]>,
}

/// One parallel task: rows `r0..r0 + nr` of matrix `m`.
struct Task {
    m: usize,
    r0: usize,
    nr: usize,
}

/// A `[t, rows]` product that the tasks of one [`matmul_many`] fill together, each its own
/// rows (columns of the product), so no two tasks ever write the same element.
struct SharedOut {
    ptr: *mut f32,
    rows: usize,
    len: usize,
}

// SAFETY: tasks write disjoint elements (their own rows) and the buffer outlives them all.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// Writes element `[tt, r]`.
    ///
    /// # Safety
    /// No other task may write row `r`; `tt · rows + r` must be in bounds (asserted in debug).
    #[inline(always)]
    unsafe fn put(&self, tt: usize, r: usize, v: f32) {
        debug_assert!(tt * self.rows + r < self.len);
        unsafe { *self.ptr.add(tt * self.rows + r) = v };
    }

    /// Writes elements `[tt, r..r + 8]`: one packed group's results for one token, one copy (a
    /// store per element, with its index arithmetic, cost prefill on a small model ~4 %).
    ///
    /// # Safety
    /// No other task may write rows `r..r + 8`; `tt · rows + r + 8` must be in bounds (asserted
    /// in debug).
    #[inline(always)]
    unsafe fn put8(&self, tt: usize, r: usize, v: &[f32; PACK_GROUP]) {
        debug_assert!(tt * self.rows + r + PACK_GROUP <= self.len);
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(tt * self.rows + r), PACK_GROUP) };
    }
}

/// [`matmul`] of the same input `x` (`t` rows of `cols`) with several matrices at once, as one
/// parallel dispatch: the input is quantized once per activation format and shared (q/k/v, or
/// gate/up, of a layer), and the pool is woken once. Returns one `[t, rows]` product per
/// matrix; each equals what [`matmul`] gives for that matrix alone.
pub fn matmul_many(ms: &[QuantMat], cols: usize, x: &[f32], t: usize) -> Vec<Vec<f32>> {
    assert_eq!(x.len(), t * cols, "matmul input length");
    let mut acts: Vec<QuantizedActs> = Vec::new();
    let mut plan = Vec::with_capacity(ms.len());
    for m in ms {
        let rb = m.ty.row_bytes(cols).expect("matrix width is a whole number of blocks (checked at load)");
        match m.packed {
            Some(p) => {
                let bb = packing(m.ty).expect("a packed matrix has a kernel here (packed by pack_rows8)").0;
                assert_eq!(p.len(), m.rows / PACK_GROUP * cols / m.ty.block_size() * bb, "packed length")
            }
            None => assert_eq!(m.w.len(), m.rows * rb, "matmul weight length"),
        }
        let fmt = m.ty.act_format();
        let ai = match acts.iter().position(|a| a.format == fmt) {
            Some(i) => i,
            None => {
                acts.push(QuantizedActs::new(fmt, x, t));
                acts.len() - 1
            }
        };
        let packed = m.packed.and_then(|_| packing(m.ty));
        plan.push((rb, ai, dot_kernel(m.ty), dot_kernel_x4(m.ty), dot_kernel_rows4(m.ty), dot_kernel_x8(m.ty), packed));
    }
    let act_rows: Vec<Vec<ActRow>> = acts.iter().map(|a| (0..t).map(|i| a.row(i)).collect()).collect();
    // Written in place as `[t, rows]` by the tasks (no transpose afterwards).
    let mut outs: Vec<Vec<f32>> = ms.iter().map(|m| vec![0.0f32; m.rows * t]).collect();
    let shared: Vec<SharedOut> =
        outs.iter_mut().zip(ms).map(|(o, m)| SharedOut { ptr: o.as_mut_ptr(), rows: m.rows, len: o.len() }).collect();
    let run = |task: Task| {
        let (m, (rb, ai, dot, dot4, rows4, dot8, packed)) = (&ms[task.m], plan[task.m]);
        let act_rows = &act_rows[ai];
        let (r0, nr, out) = (task.r0, task.nr, &shared[task.m]);
        // SAFETY (every `put` below): this task alone owns rows r0..r0 + nr of matrix m.
        let put = |i: usize, tt: usize, v: f32| unsafe { out.put(tt, r0 + i, v) };
        if let (Some(p), Some((bb, (k1, k4, k8)))) = (m.packed, packed) {
            // Eight rows at a time (tasks start on multiples of eight rows), every token.
            let gb = cols / m.ty.block_size() * bb;
            for g in 0..nr / PACK_GROUP {
                let pg = &p[(r0 / PACK_GROUP + g) * gb..][..gb];
                // SAFETY: this task alone owns rows r0..r0 + nr, whole groups of eight.
                let put = |tt: usize, ys: &[[f32; PACK_GROUP]]| {
                    for (k, y) in ys.iter().enumerate() {
                        unsafe { out.put8(tt + k, r0 + g * PACK_GROUP, y) };
                    }
                };
                // The tokens' rows borrowed in place, not copied into an array per call.
                let tokens = |tt: usize, n: usize| &act_rows[tt..tt + n];
                let mut tt = 0;
                while tt + 8 <= t {
                    put(tt, &k8(pg, tokens(tt, 8).try_into().expect("eight rows")));
                    tt += 8;
                }
                while tt + 4 <= t {
                    put(tt, &k4(pg, tokens(tt, 4).try_into().expect("four rows")));
                    tt += 4;
                }
                while tt < t {
                    put(tt, &k1(pg, tokens(tt, 1).try_into().expect("one row")));
                    tt += 1;
                }
            }
            return;
        }
        let mut tt = 0;
        if let Some(dot8) = dot8 {
            // Eight tokens at a time (the k-quant tiles).
            while tt + 8 <= t {
                let a8: [ActRow; 8] = std::array::from_fn(|k| act_rows[tt + k]);
                for i in 0..nr {
                    let r = r0 + i;
                    let y = dot8(&m.w[r * rb..(r + 1) * rb], &a8);
                    for (k, v) in y.into_iter().enumerate() {
                        put(i, tt + k, v);
                    }
                }
                tt += 8;
            }
        }
        if let Some(dot4) = dot4 {
            // Four tokens at a time: each weight block is unpacked once for all four.
            while tt + 4 <= t {
                let a4 = [act_rows[tt], act_rows[tt + 1], act_rows[tt + 2], act_rows[tt + 3]];
                for i in 0..nr {
                    let r = r0 + i;
                    let y = dot4(&m.w[r * rb..(r + 1) * rb], &a4);
                    for (k, v) in y.into_iter().enumerate() {
                        put(i, tt + k, v);
                    }
                }
                tt += 4;
            }
        }
        for (tt, a) in act_rows.iter().enumerate().skip(tt) {
            let mut i = 0;
            if let Some(rows4) = rows4 {
                // Four weight rows at a time: four independent streams and sums.
                while i + 4 <= nr {
                    let r = r0 + i;
                    let y = rows4(&m.w[r * rb..(r + 4) * rb], a);
                    for (k, v) in y.into_iter().enumerate() {
                        put(i + k, tt, v);
                    }
                    i += 4;
                }
            }
            for i in i..nr {
                let r = r0 + i;
                put(i, tt, dot(&m.w[r * rb..(r + 1) * rb], a));
            }
        }
    };
    let work: usize = ms.iter().map(|m| m.rows * cols * t).sum();
    let threads = rayon::current_num_threads();
    if work < SERIAL_WORK || threads <= 1 {
        for (mi, m) in ms.iter().enumerate() {
            run(Task { m: mi, r0: 0, nr: m.rows });
        }
    } else {
        // A single token has little work per row: larger blocks, fewer tasks.
        let block = if t == 1 { 4 * ROW_BLOCK } else { ROW_BLOCK };
        let mut tasks = Vec::new();
        for (mi, m) in ms.iter().enumerate() {
            for r0 in (0..m.rows).step_by(block) {
                tasks.push(Task { m: mi, r0, nr: block.min(m.rows - r0) });
            }
        }
        tasks.into_par_iter().for_each(run);
    }
    drop(shared);
    outs
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    /// Holds an eight-row packing of `ty` (its `pack`, its row `dequant` and its packed
    /// super-block size) to the reference: its 1-, 4- and 8-token kernels against
    /// [`dot_reference`] on every row and token (and one, four and eight tokens against each
    /// other, bit for bit), and every packed row against [`dequantize`]. Activations reach ±127,
    /// so the kernels' word sums meet their bounds.
    pub(crate) fn check_packing(
        ty: QuantType,
        pack: fn(&[u8], usize, usize) -> Vec<u8>,
        dequant: fn(&[u8], usize, &mut [f32]),
        packed_block_bytes: usize,
        (k1, k4, k8): (GroupKernel<1>, GroupKernel<4>, GroupKernel<8>),
    ) {
        let (rows, cols) = (16, 768);
        let rb = cols / QK_K * ty.block_bytes();
        let w = random_blocks(ty, rows * cols / QK_K, 5);
        let p = pack(&w, rows, cols);
        let gb = cols / QK_K * packed_block_bytes;
        assert_eq!(p.len(), rows / PACK_GROUP * gb, "{ty} packed length");
        let x: Vec<f32> = (0..8 * cols).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 97.0).collect();
        let acts = QuantizedActs::new(ty.act_format(), &x, 8);
        let rows8: [ActRow; 8] = std::array::from_fn(|k| acts.row(k));
        for g in 0..rows / PACK_GROUP {
            let pg = &p[g * gb..(g + 1) * gb];
            let y8 = k8(pg, &rows8);
            let y4 = k4(pg, &[rows8[4], rows8[5], rows8[6], rows8[7]]);
            for k in 0..8 {
                assert_eq!(k1(pg, &[rows8[k]])[0], y8[k], "{ty} group {g} token {k}: one token vs eight");
                if k >= 4 {
                    assert_eq!(y4[k - 4], y8[k], "{ty} group {g} token {k}: four vs eight");
                }
                for (r, got) in y8[k].iter().enumerate() {
                    let row = g * PACK_GROUP + r;
                    let want = dot_reference(ty, &w[row * rb..][..rb], &rows8[k]);
                    assert!(
                        (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "{ty} row {row} token {k}: {got} vs {want}"
                    );
                }
            }
        }
        for row in 0..rows {
            let mut want = vec![0.0; cols];
            dequantize(ty, &w[row * rb..][..rb], &mut want);
            let mut got = vec![0.0; cols];
            dequant(&p[row / PACK_GROUP * gb..][..gb], row % PACK_GROUP, &mut got);
            assert_eq!(got, want, "{ty} row {row} dequantized");
        }
    }

    /// Random blocks whose f16 scales are small finite numbers.
    pub(crate) fn random_blocks(ty: QuantType, n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut b: Vec<u8> = (0..n * ty.block_bytes()).map(|_| lcg(&mut s) as u8).collect();
        let f16s: &[usize] = match ty {
            QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 | QuantType::IQ4_NL | QuantType::IQ4_XS => &[0],
            QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4_K | QuantType::Q5_K => &[0, 2],
            QuantType::Q2_K => &[80, 82],
            QuantType::Q3_K => &[108],
            QuantType::Q6_K => &[208],
        };
        for blk in b.chunks_exact_mut(ty.block_bytes()) {
            for &o in f16s {
                let v = (lcg(&mut s) % 2000) as f32 / 40000.0 - 0.025;
                blk[o..o + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
            }
        }
        b
    }

    /// The size of the terms of `dot_reference(ty, w, a)`: `Σ |weight part|·|y|·d_y` over every
    /// element, each weight split into its scaled value and its minimum so that cancelling
    /// parts count fully. A sum of these terms in another f32 order differs from the
    /// reference by a few ulps of this, however small the dot itself is.
    pub(crate) fn dot_magnitude(ty: QuantType, w: &[u8], a: &ActRow) -> f32 {
        let (bs, bb) = (ty.block_size(), ty.block_bytes());
        let mut total = 0.0f64;
        for (ib, b) in w.chunks_exact(bb).enumerate() {
            let y = &a.qs[ib * bs..(ib + 1) * bs];
            if bs == 32 {
                let mut deq = [0.0f32; 32];
                dequantize(ty, b, &mut deq);
                let m = if matches!(ty, QuantType::Q4_1 | QuantType::Q5_1) { f16_at(b, 2).abs() } else { 0.0 };
                let s: f64 = deq.iter().zip(y).map(|(v, q)| ((v.abs() + m) * (*q as f32).abs()) as f64).sum();
                total += s * a.d[ib].abs() as f64;
            } else {
                let u = unpack_k(ty, b);
                let s: f64 = (0..QK_K)
                    .map(|e| {
                        let g = e / 16;
                        let part = (u.d * u.scale[g] as f32 * u.q[e] as f32).abs() + (u.dmin * u.min[g] as f32).abs();
                        (part * (y[e] as f32).abs()) as f64
                    })
                    .sum();
                total += s * a.d[ib].abs() as f64;
            }
        }
        total as f32
    }

    #[test]
    fn every_kernel_matches_the_reference_dot() {
        let cols = 512;
        let x: Vec<f32> = (0..cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
        for ty in QuantType::ALL {
            let w = random_blocks(ty, cols / ty.block_size(), 7);
            let acts = QuantizedActs::new(ty.act_format(), &x, 1);
            let want = dot_reference(ty, &w, &acts.row(0));
            let got = dot_kernel(ty)(&w, &acts.row(0));
            assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "{ty}: {got} vs {want}");
        }
    }

    #[test]
    fn integer_dot_tracks_the_f32_product() {
        let cols = 512;
        let x: Vec<f32> = (0..cols).map(|i| ((i * 53 % 97) as f32 - 48.0) / 31.0).collect();
        for ty in QuantType::ALL {
            let w = random_blocks(ty, cols / ty.block_size(), 3);
            let mut wf = vec![0.0; cols];
            dequantize(ty, &w, &mut wf);
            let exact: f32 = wf.iter().zip(&x).map(|(a, b)| a * b).sum();
            let norm: f32 = wf.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
            let y = matmul(ty, &w, 1, cols, &x, 1)[0];
            assert!((y - exact).abs() < 0.02 * norm, "{ty}: {y} vs {exact} (scale {norm})");
        }
    }

    #[test]
    fn rne_rounds_half_to_even() {
        for (v, want) in [(0.5, 0.0), (1.5, 2.0), (2.5, 2.0), (-0.5, -0.0), (-1.5, -2.0), (126.5, 126.0), (3.49, 3.0)] {
            assert_eq!(rne(v), want, "{v}");
        }
        for i in -3000..3000 {
            let v = i as f32 * 0.173;
            assert_eq!(rne(v), v.round_ties_even(), "{v}");
        }
        assert_eq!(rne(1e9), 1e9);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_activation_quantization_equals_the_plain_one() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            crate::test_support::report_skip("avx2", "quant AVX2 activation quantization");
            return;
        }
        let x: Vec<f32> = (0..2 * 512).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 37.0 + 0.5).collect();
        for format in [ActFormat::Q8_0, ActFormat::Q8_1, ActFormat::Q8_K] {
            let fast = QuantizedActs::new(format, &x, 2);
            let mut plain = fast.clone();
            plain.qs.fill(0);
            plain.d.fill(0.0);
            plain.s.fill(0.0);
            plain.bsums.fill(0);
            plain.sums32.fill(0);
            plain.fill(&x);
            assert_eq!((&plain.qs, &plain.d, &plain.s, &plain.bsums), (&fast.qs, &fast.d, &fast.s, &fast.bsums));
            assert_eq!(plain.sums32, fast.sums32);
        }
    }

    #[test]
    fn parallel_activation_quantization_equals_one_row_at_a_time() {
        let (t, cols) = (40, 1024);
        let x: Vec<f32> = (0..t * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 37.0).collect();
        for format in [ActFormat::Q8_0, ActFormat::Q8_1, ActFormat::Q8_K] {
            let all = QuantizedActs::new(format, &x, t);
            for tt in 0..t {
                let one = QuantizedActs::new(format, &x[tt * cols..(tt + 1) * cols], 1);
                let (a, b) = (all.row(tt), one.row(0));
                assert_eq!(
                    (a.qs, a.d, a.s, a.bsums, a.sums32),
                    (b.qs, b.d, b.s, b.bsums, b.sums32),
                    "{format:?} row {tt}"
                );
            }
        }
    }

    #[test]
    fn matmul_many_equals_separate_matmuls() {
        let cols = 256;
        for t in [1, 6] {
            let x: Vec<f32> = (0..t * cols).map(|i| ((i * 29 % 23) as f32 - 11.0) / 7.0).collect();
            let tys = [QuantType::Q4_1, QuantType::Q4_K, QuantType::Q6_K, QuantType::Q8_0];
            let ws: Vec<(QuantType, Vec<u8>, usize)> = tys
                .iter()
                .enumerate()
                .map(|(i, &ty)| {
                    let rows = 40 + 300 * i;
                    (ty, random_blocks(ty, rows * cols / ty.block_size(), i as u64), rows)
                })
                .collect();
            let ms: Vec<QuantMat> =
                ws.iter().map(|(ty, w, rows)| QuantMat { ty: *ty, w, rows: *rows, packed: None }).collect();
            let got = matmul_many(&ms, cols, &x, t);
            for ((ty, w, rows), y) in ws.iter().zip(&got) {
                assert_eq!(&matmul(*ty, w, *rows, cols, &x, t), y, "{ty} t={t}");
                let want: Vec<f32> = (0..t)
                    .flat_map(|tt| {
                        let a = QuantizedActs::new(ty.act_format(), &x[tt * cols..(tt + 1) * cols], 1);
                        w.chunks_exact(ty.row_bytes(cols).unwrap()).map(move |r| dot_kernel(*ty)(r, &a.row(0)))
                    })
                    .collect();
                assert_eq!(&want, y, "{ty} t={t} vs single dots");
            }
        }
    }

    #[test]
    fn matmul_batches_equal_single_rows() {
        let (rows, cols, t) = (37, 256, 5);
        let x: Vec<f32> = (0..t * cols).map(|i| ((i * 31 % 17) as f32 - 8.0) / 8.0).collect();
        for ty in QuantType::ALL {
            let w = random_blocks(ty, rows * cols / ty.block_size(), 11);
            let y = matmul(ty, &w, rows, cols, &x, t);
            for tt in 0..t {
                let yr = matmul(ty, &w, rows, cols, &x[tt * cols..(tt + 1) * cols], 1);
                assert_eq!(&y[tt * rows..(tt + 1) * rows], &yr[..], "{ty} t={tt}");
            }
        }
    }
}
