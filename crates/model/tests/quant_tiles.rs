//! The multi-token matmul tiles (8 and 4 tokens per weight row, then single tokens) give every
//! token exactly the bits a one-token matmul gives it, for ragged token counts and row counts,
//! across the formats that have tiles and one that has none.

use frognano_model::quant::{self, QuantType};

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|i| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let v = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            // Some large outliers, as real activations have.
            if i % 131 == 7 {
                v * 40.0
            } else {
                v
            }
        })
        .collect()
}

/// `n` random blocks of `ty` whose f16 scales are small finite numbers (where each format
/// keeps them).
fn random_blocks(ty: QuantType, n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    let mut b: Vec<u8> = (0..n * ty.block_bytes()).map(|_| next() as u8).collect();
    let f16s: &[usize] = match ty {
        QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 | QuantType::IQ4_NL | QuantType::IQ4_XS => &[0],
        QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4_K | QuantType::Q5_K => &[0, 2],
        QuantType::Q2_K => &[80, 82],
        QuantType::Q3_K => &[108],
        QuantType::Q6_K => &[208],
    };
    for blk in b.chunks_exact_mut(ty.block_bytes()) {
        for &o in f16s {
            let v = (next() % 2000) as f32 / 40000.0 - 0.025;
            blk[o..o + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
        }
    }
    b
}

#[test]
fn every_token_of_a_tiled_matmul_equals_its_one_token_matmul() {
    for (ty, cols) in [
        (QuantType::Q4_K, 512),
        (QuantType::Q6_K, 768),
        (QuantType::Q4_1, 96),
        (QuantType::Q8_0, 160),
        (QuantType::Q5_K, 256),
        (QuantType::Q4_0, 64),
        (QuantType::Q5_0, 96),
        (QuantType::Q5_1, 128),
        (QuantType::IQ4_NL, 64),
        (QuantType::Q2_K, 512),
        (QuantType::Q3_K, 256),
        (QuantType::IQ4_XS, 512),
    ] {
        for rows in [1usize, 5, 37] {
            let w = random_blocks(ty, rows * cols / ty.block_size(), rows as u64);
            for t in [2usize, 4, 7, 8, 9, 13, 16, 19, 28, 35] {
                let x = values(t * cols, 1000 + t as u64);
                let y = quant::matmul(ty, &w, rows, cols, &x, t);
                for tt in 0..t {
                    let one = quant::matmul(ty, &w, rows, cols, &x[tt * cols..(tt + 1) * cols], 1);
                    let got: Vec<u32> = y[tt * rows..(tt + 1) * rows].iter().map(|v| v.to_bits()).collect();
                    let want: Vec<u32> = one.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{ty} rows={rows} t={t} token {tt}");
                }
            }
        }
    }
}
