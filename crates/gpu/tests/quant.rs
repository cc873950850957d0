//! Weight matrices in their stored formats (quant.rs, kernels/quant.cu) against the CPU code of
//! frognano-model, on the CPU simulator (or on a real GPU when `FROGNANO_TEST_DEVICE` names
//! one): the GEMVs (n ≤ 8, and the batched one for 8 < n ≤ 32, each row's bits independent of
//! n), the GEMM path (dequantize to f16 + matmul_nt, in one chunk and in several) and the row
//! gather, for every dtype.

use frognano_gpu::quant::{DeviceMatrix, MatmulScratch, GEMV_MAX_N};
use frognano_gpu::{Buffer, Gpu};
use frognano_model::quant::QuantType;
use frognano_model::tensor::{round_bf16, round_f16, Bytes, DType, Matrix};
use half::{bf16, f16};

use crate::common;
use common::{device, values};

fn lcg(s: &mut u64) -> u64 {
    *s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *s >> 33
}

/// `nblocks` random blocks of `ty`: random bytes with sane f16 scales (every bit of the
/// values, scales and minimums is exercised; the scales are small, as real ones are).
fn random_blocks(ty: QuantType, nblocks: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut b: Vec<u8> = (0..nblocks * ty.block_bytes()).map(|_| lcg(&mut s) as u8).collect();
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

/// A `[rows, cols]` matrix of `dtype` with random contents.
fn matrix(dtype: DType, rows: usize, cols: usize, seed: u32) -> Matrix {
    let w = values(rows * cols, seed);
    let bytes: Vec<u8> = match dtype {
        DType::F32 => return Matrix::from_f32(rows, cols, w),
        DType::F16 => w.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect(),
        DType::BF16 => w.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect(),
        DType::Quant(q) => random_blocks(q, rows * cols / q.block_size(), seed as u64),
    };
    Matrix::new(rows, cols, dtype, Bytes::from_vec(bytes))
}

/// `Σ_k x[j,k]·w[r,k]` in f64 and `Σ_k |x[j,k]·w[r,k]|`, `[n, rows]` each.
fn reference(w: &[f32], x: &[f32], rows: usize, cols: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; n * rows];
    let mut mag = vec![0.0; n * rows];
    for j in 0..n {
        for r in 0..rows {
            for k in 0..cols {
                let p = x[j * cols + k] as f64 * w[r * cols + k] as f64;
                y[j * rows + r] += p;
                mag[j * rows + r] += p.abs();
            }
        }
    }
    (y, mag)
}

/// Checks `got` against `want` elementwise, within `tol · mag` (plus a tiny absolute floor).
fn check(what: &str, got: &[f32], want: &[f64], mag: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((g, w), m)) in got.iter().zip(want).zip(mag).enumerate() {
        let d = (*g as f64 - w).abs();
        assert!(d <= tol * m + 1e-6, "{what}: element {i}: got {g}, want {w} (|Δ| {d:e}, Σ|w·x| {m:e})");
    }
}

/// Runs `m.matmul` on the device for `n` rows of `x`.
fn device_matmul(dev: &Gpu, dm: &DeviceMatrix, x: &[f32], n: usize, scratch: &mut MatmulScratch) -> Vec<f32> {
    let bx = Buffer::from_f32(dev, x).unwrap();
    let by = Buffer::from_f32(dev, &vec![f32::NAN; n * dm.rows]).unwrap();
    dm.matmul(dev, bx.ptr(), by.ptr(), n, scratch).unwrap();
    by.to_f32().unwrap()
}

/// Every check for one dtype at width `cols`.
fn check_dtype(dtype: DType, rows: usize, cols: usize) {
    let dev = device();
    let name = dtype.name();
    let m = matrix(dtype, rows, cols, 7);
    let dm = DeviceMatrix::upload(&dev, &m).unwrap();
    assert_eq!(dm.byte_len(), m.bytes().len(), "{name}: uploaded bytes");
    assert_eq!((dm.rows, dm.cols, dm.dtype), (rows, cols, dtype));
    let wf = m.to_f32(); // frognano-model's dequantization
    let mut scratch = MatmulScratch::new();

    // GEMV: an f32 product of the dequantized weights (n ≤ 8 and the batched kernel above).
    for n in [1, 3, 8, 9, 17, 32] {
        let x = values(n * cols, 100 + n as u32);
        let got = device_matmul(&dev, &dm, &x, n, &mut scratch);
        let (want, mag) = reference(&wf, &x, rows, cols, n);
        check(&format!("{name} gemv n={n}"), &got, &want, &mag, 1e-5);
        // And against the CPU matmul itself, which quantizes x to 8 bits for block formats
        // (and may round it to bf16 for bf16 weights, with AVX-512 BF16).
        let cpu = m.matmul(&x, n);
        let cpu: Vec<f64> = cpu.iter().map(|&v| v as f64).collect();
        let tol = match dtype {
            DType::Quant(_) => 2e-2,
            DType::BF16 => 1e-2,
            DType::F32 | DType::F16 => 1e-5,
        };
        check(&format!("{name} gemv n={n} vs Matrix::matmul"), &got, &cpu, &mag, tol);
    }

    // Every row gets the bits it gets alone, whatever n is and whichever GEMV kernel runs.
    let x = values(GEMV_MAX_N * cols, 300);
    let alone: Vec<Vec<u32>> = (0..GEMV_MAX_N)
        .map(|j| {
            let y = device_matmul(&dev, &dm, &x[j * cols..(j + 1) * cols], 1, &mut scratch);
            y.iter().map(|v| v.to_bits()).collect()
        })
        .collect();
    for n in [5, 8, 9, 20, 31, 32] {
        let got = device_matmul(&dev, &dm, &x[..n * cols], n, &mut scratch);
        for (j, want) in alone.iter().take(n).enumerate() {
            let bits: Vec<u32> = got[j * rows..(j + 1) * rows].iter().map(|v| v.to_bits()).collect();
            assert_eq!(&bits, want, "{name} gemv n={n}: row {j} differs from its n=1 result");
        }
    }

    // GEMM (n > GEMV_MAX_N): W as f16 (quantized formats) or as stored, x rounded to the same
    // type.
    let round: fn(f32) -> f32 = match dtype {
        DType::F32 => |v| v,
        DType::BF16 => round_bf16,
        DType::F16 | DType::Quant(_) => round_f16,
    };
    let wr: Vec<f32> = wf.iter().map(|&v| round(v)).collect();
    let n = GEMV_MAX_N + 1;
    let x = values(n * cols, 200);
    let xr: Vec<f32> = x.iter().map(|&v| round(v)).collect();
    let (want, mag) = reference(&wr, &xr, rows, cols, n);
    let got = device_matmul(&dev, &dm, &x, n, &mut scratch);
    check(&format!("{name} gemm n={n}"), &got, &want, &mag, 1e-5);
    // The unrounded product is near too (the rounding of the operands only).
    let (exact, _) = reference(&wf, &x, rows, cols, n);
    let tol = if dtype == DType::BF16 { 1e-2 } else { 2e-3 };
    check(&format!("{name} gemm n={n} vs the f32 product"), &got, &exact, &mag, tol);
    // In chunks of 3 rows (the last one shorter): the same numbers.
    let mut small = MatmulScratch::with_chunk_elements(3 * cols);
    let chunked = device_matmul(&dev, &dm, &x, n, &mut small);
    check(&format!("{name} gemm n={n} in chunks"), &chunked, &want, &mag, 1e-5);

    // Gather rows.
    let ids: Vec<i32> = vec![3, 0, rows as i32 - 1, 3, 1];
    let bids = Buffer::from_i32(&dev, &ids).unwrap();
    let out = Buffer::from_f32(&dev, &vec![f32::NAN; ids.len() * cols]).unwrap();
    dm.gather_rows(&dev, bids.ptr(), out.ptr(), ids.len()).unwrap();
    let got = out.to_f32().unwrap();
    for (i, &id) in ids.iter().enumerate() {
        let want = m.row(id as usize);
        for (k, (g, w)) in got[i * cols..(i + 1) * cols].iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-6 * (w.abs() + 1.0), "{name} gather row {id} element {k}: got {g}, want {w}");
        }
    }
}

#[test]
fn f32_weights() {
    check_dtype(DType::F32, 7, 256);
    // Any width for the float formats.
    check_dtype(DType::F32, 5, 29);
}

#[test]
fn f16_weights() {
    check_dtype(DType::F16, 7, 256);
    check_dtype(DType::F16, 5, 45);
}

#[test]
fn bf16_weights() {
    check_dtype(DType::BF16, 7, 512);
    check_dtype(DType::BF16, 5, 37);
}

#[test]
fn q8_0_weights() {
    check_dtype(DType::Quant(QuantType::Q8_0), 7, 512);
}

#[test]
fn q4_0_weights() {
    check_dtype(DType::Quant(QuantType::Q4_0), 7, 512);
}

#[test]
fn q4_1_weights() {
    check_dtype(DType::Quant(QuantType::Q4_1), 7, 512);
}

#[test]
fn q4_k_weights() {
    check_dtype(DType::Quant(QuantType::Q4_K), 7, 512);
}

#[test]
fn q6_k_weights() {
    check_dtype(DType::Quant(QuantType::Q6_K), 7, 512);
}

#[test]
fn q5_k_weights() {
    check_dtype(DType::Quant(QuantType::Q5_K), 7, 512);
}

#[test]
fn q5_0_weights() {
    check_dtype(DType::Quant(QuantType::Q5_0), 7, 512);
}

#[test]
fn q5_1_weights() {
    check_dtype(DType::Quant(QuantType::Q5_1), 7, 512);
}

#[test]
fn q3_k_weights() {
    check_dtype(DType::Quant(QuantType::Q3_K), 7, 512);
}

#[test]
fn q2_k_weights() {
    check_dtype(DType::Quant(QuantType::Q2_K), 7, 512);
}

#[test]
fn iq4_nl_weights() {
    check_dtype(DType::Quant(QuantType::IQ4_NL), 7, 512);
}

#[test]
fn iq4_xs_weights() {
    check_dtype(DType::Quant(QuantType::IQ4_XS), 7, 512);
}

/// The batched GEMV over several blocks of output rows (16 a block, the last one partial) and a
/// width whose last shared-memory tile of x is partial (288 = 256 + 32; 45 for f16), against
/// the reference and against each row alone.
#[test]
fn batched_gemv_over_blocks_and_a_partial_tile() {
    let dev = device();
    let rows = 37;
    for (dtype, cols) in [(DType::Quant(QuantType::Q4_0), 288), (DType::Quant(QuantType::Q8_0), 288), (DType::F16, 45)]
    {
        let name = dtype.name();
        let m = matrix(dtype, rows, cols, 11);
        let dm = DeviceMatrix::upload(&dev, &m).unwrap();
        let wf = m.to_f32();
        let mut scratch = MatmulScratch::new();
        let n = 19;
        let x = values(n * cols, 400);
        let got = device_matmul(&dev, &dm, &x, n, &mut scratch);
        let (want, mag) = reference(&wf, &x, rows, cols, n);
        check(&format!("{name} [{rows}, {cols}] gemv n={n}"), &got, &want, &mag, 1e-5);
        for j in [0, 7, 18] {
            let one = device_matmul(&dev, &dm, &x[j * cols..(j + 1) * cols], 1, &mut scratch);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got[j * rows..(j + 1) * rows]), bits(&one), "{name} gemv n={n}: row {j} vs alone");
        }
    }
}

/// Weights quantized the way `--quant` does (frognano-model's quantizers), not random blocks.
#[test]
fn quantized_f32_weights() {
    let dev = device();
    let (rows, cols) = (6, 512);
    let f = Matrix::from_f32(rows, cols, values(rows * cols, 3));
    for q in [QuantType::Q4_K, QuantType::Q8_0] {
        let m = f.quantized(q);
        assert_eq!(m.dtype, DType::Quant(q));
        let dm = DeviceMatrix::upload(&dev, &m).unwrap();
        let wf = m.to_f32();
        let mut scratch = MatmulScratch::new();
        for n in [1, 3, 17] {
            let x = values(n * cols, 50 + n as u32);
            let got = device_matmul(&dev, &dm, &x, n, &mut scratch);
            let (want, mag) = reference(&wf, &x, rows, cols, n);
            check(&format!("{q} quantized gemv n={n}"), &got, &want, &mag, 1e-5);
        }
    }
}

/// A matrix that kept only its CPU-packed form has no stored bytes to upload: an error, not
/// garbage on the device.
#[test]
fn a_packed_only_matrix_is_refused() {
    let dev = device();
    let (rows, cols) = (16, 256);
    let ty = QuantType::Q4_K;
    let mut m = Matrix::new(rows, cols, DType::Quant(ty), Bytes::from_vec(random_blocks(ty, rows, 5)));
    m.pack_for_matmul();
    if !m.bytes().is_empty() {
        eprintln!("skipped: this CPU has no packed Q4_K kernel, so the matrix kept its bytes");
        return;
    }
    match DeviceMatrix::upload(&dev, &m) {
        Err(frognano_gpu::GpuError::Unsupported(msg)) => assert!(msg.contains("Q4_K"), "{msg}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}
