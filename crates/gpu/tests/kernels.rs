//! Every kernel against the CPU reference of frognano-model, on the CPU simulator (and on a
//! real GPU when `FROGNANO_TEST_DEVICE=cuda` names one: bench/gpu.sh).

use frognano_gpu::{kernels, Buffer};

use crate::common;
use common::{device, max_diff, values};

#[test]
fn rms_norm_matches_the_cpu_norm() {
    let dev = device();
    for (rows, width) in [(1, 64), (3, 1000), (5, 2560)] {
        let x = values(rows * width, 1);
        let w = values(width, 2);
        let want = frognano_model::kernels::rms_norm(&x, &w, 1e-6);
        let (bx, bw) = (Buffer::from_f32(&dev, &x).unwrap(), Buffer::from_f32(&dev, &w).unwrap());
        let by = Buffer::zeroed(&dev, x.len() * 4).unwrap();
        kernels::rms_norm(&dev, bx.ptr(), bw.ptr(), by.ptr(), rows, width, 1e-6).unwrap();
        let got = by.to_f32().unwrap();
        let d = max_diff(&got, &want);
        assert!(d < 1e-5, "rows {rows} width {width}: max |Δ| {d}");
    }
}
