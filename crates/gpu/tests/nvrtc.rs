//! The kernels compiled by NVRTC — CUDA's runtime compiler, what `--device cuda` compiles them
//! with — for the H200 (sm_90) and the A100 (sm_80), with the options of a GPU run. NVRTC needs
//! no GPU: scripts/test.sh puts the PyPI build of libnvrtc on LD_LIBRARY_PATH
//! (scripts/setup-cuda-nvcc.sh). nvcc (scripts/check-kernels.sh) sees CUDA's headers; NVRTC
//! does not, so this is the check that a kernel needs nothing NVRTC lacks.

#[test]
fn nvrtc_compiles_every_kernel() {
    if !frognano_gpu::cuda::nvrtc_present() {
        if std::env::var_os("FROGNANO_REQUIRE_FIXTURES").is_some() {
            panic!("libnvrtc.so.13 is not on LD_LIBRARY_PATH and FROGNANO_REQUIRE_FIXTURES is set: run scripts/setup-cuda-nvcc.sh");
        }
        frognano_model::test_support::report_skip(
            "libnvrtc",
            "nvrtc_compiles_every_kernel (scripts/setup-cuda-nvcc.sh)",
        );
        return;
    }
    let names = frognano_gpu::kernels::names();
    for arch in [(9, 0), (8, 0)] {
        let ptx = frognano_gpu::cuda::compile_kernels(arch).unwrap_or_else(|e| panic!("sm_{}{}: {e}", arch.0, arch.1));
        for name in &names {
            assert!(ptx.contains(&format!(".entry {name}(")), "sm_{}{}: no entry point {name}", arch.0, arch.1);
        }
    }
}
