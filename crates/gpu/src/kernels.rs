//! The kernels of kernels/ as Rust functions: each wrapper names its kernel, picks the launch
//! shape and passes the kernel's parameters in order. The model forwards call only these.

use crate::backend::{Arg, Gpu, Result};

include!(concat!(env!("OUT_DIR"), "/kernel_sources.rs"));

/// The source NVRTC compiles: common.cuh, then every kernels/*.cu in name order, with their
/// `#include "…"` and `#pragma once` lines dropped (everything is in one translation unit).
pub fn source() -> String {
    let mut s = String::new();
    for (name, text) in SOURCES {
        s.push_str(&format!("// ---- {name}\n"));
        for line in text.lines() {
            let l = line.trim_start();
            if !l.starts_with("#include \"") && !l.starts_with("#pragma once") {
                s.push_str(line);
                s.push('\n');
            }
        }
    }
    s
}

/// The name of every `extern "C" __global__` kernel in the sources.
pub fn names() -> Vec<String> {
    let key = "extern \"C\" __global__ void ";
    let mut out = Vec::new();
    for (_, text) in SOURCES {
        let mut rest = *text;
        while let Some(i) = rest.find(key) {
            rest = &rest[i + key.len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            out.push(name);
        }
    }
    out
}

/// Blocks of `per` items covering `n`.
pub fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per).max(1) as u32
}

/// `y[r] = x[r] / sqrt(mean(x[r]²) + eps) · w` for `rows` rows of `width` (norm.cu).
pub fn rms_norm(dev: &Gpu, x: u64, w: u64, y: u64, rows: usize, width: usize, eps: f32) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    dev.launch(
        "rms_norm",
        [rows as u32, 1, 1],
        [256, 1, 1],
        0,
        &[Arg::Ptr(x), Arg::Ptr(w), Arg::Ptr(y), Arg::I32(width as i32), Arg::F32(eps)],
    )
}

/// Launch shape of the element-wise kernels: 256 threads a block, at most 4096 blocks (the
/// kernels loop over the rest).
fn elementwise(n: usize) -> ([u32; 3], [u32; 3]) {
    ([blocks(n, 256).min(4096), 1, 1], [256, 1, 1])
}

/// `h += u` over `n` values.
pub fn add(dev: &Gpu, h: u64, u: u64, n: usize) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let (g, b) = elementwise(n);
    dev.launch("ew_add", g, b, 0, &[Arg::Ptr(h), Arg::Ptr(u), Arg::I32(n as i32)])
}

/// `g = silu(g) · u` over `n` values (SwiGLU).
pub fn silu_mul(dev: &Gpu, g: u64, u: u64, n: usize) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let (gr, b) = elementwise(n);
    dev.launch("ew_silu_mul", gr, b, 0, &[Arg::Ptr(g), Arg::Ptr(u), Arg::I32(n as i32)])
}

/// `o ·= sigmoid(gate)` over `n` values.
pub fn sigmoid_mul(dev: &Gpu, o: u64, gate: u64, n: usize) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let (g, b) = elementwise(n);
    dev.launch("ew_sigmoid_mul", g, b, 0, &[Arg::Ptr(o), Arg::Ptr(gate), Arg::I32(n as i32)])
}

/// Rows `[query | gate]` of `2·dh` (`rows` = tokens · heads) split into `q` and `gate`, rows of `dh`.
pub fn split_halves(dev: &Gpu, qg: u64, q: u64, gate: u64, rows: usize, dh: usize) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let (g, b) = elementwise(rows * dh);
    dev.launch(
        "ew_split_halves",
        g,
        b,
        0,
        &[Arg::Ptr(qg), Arg::Ptr(q), Arg::Ptr(gate), Arg::I32(rows as i32), Arg::I32(dh as i32)],
    )
}

/// `x[r] += b` for `rows` rows of `width`.
pub fn add_bias(dev: &Gpu, x: u64, b: u64, rows: usize, width: usize) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let (g, bl) = elementwise(rows * width);
    dev.launch("ew_add_bias", g, bl, 0, &[Arg::Ptr(x), Arg::Ptr(b), Arg::I32(rows as i32), Arg::I32(width as i32)])
}

/// `dst[j] = src[rows[j]]` for `m` rows of `width` (`rows`: device i32 indices).
pub fn gather_rows(dev: &Gpu, src: u64, rows: u64, dst: u64, m: usize, width: usize) -> Result<()> {
    if m == 0 {
        return Ok(());
    }
    let (g, b) = elementwise(m * width);
    dev.launch(
        "ew_gather_rows",
        g,
        b,
        0,
        &[Arg::Ptr(src), Arg::Ptr(rows), Arg::Ptr(dst), Arg::I32(m as i32), Arg::I32(width as i32)],
    )
}
