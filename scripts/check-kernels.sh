#!/usr/bin/env bash
# Compiles every CUDA kernel of crates/gpu/kernels with nvcc --ptx for sm_90 (the H200) and
# sm_80, as NVRTC will on a GPU machine, so that a kernel that does not compile cannot land.
# nvcc comes from PyPI (scripts/setup-cuda-nvcc.sh); no GPU is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(./scripts/setup-cuda-nvcc.sh | tail -1)"
export CUDA_HOME="$root" PATH="$root/bin:$PATH"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# One translation unit, as the binary hands NVRTC (crates/gpu/src/kernels.rs: common.cuh, then
# every .cu with its #include lines dropped).
all="$out/all.cu"
{
    grep -v '^#pragma once' crates/gpu/kernels/common.cuh
    for f in crates/gpu/kernels/*.cu; do
        echo "// ---- $(basename "$f")"
        grep -v '^[[:space:]]*#include "' "$f"
    done
} >"$all"
for arch in 90 80; do
    nvcc --ptx -std=c++17 -arch="sm_$arch" -Werror all-warnings -o "$out/all_$arch.ptx" "$all"
done
# ptxas too (what the driver's JIT does with the PTX on the GPU machine): catches what the
# front end lets through, such as too much shared memory in one kernel.
ptxas -arch=sm_90 -o "$out/all_90.cubin" "$out/all_90.ptx"
n=$(grep -c '\.entry ' "$out/all_90.ptx" || true)
want=$(cat crates/gpu/kernels/*.cu | grep -c 'extern "C" __global__ void ' || true)
if [ "$n" != "$want" ]; then
    echo "nvcc made $n kernels, but the sources declare $want" >&2
    exit 1
fi
echo "kernels compile with nvcc $(nvcc --version | grep -o 'release [0-9.]*'): $n entry points for sm_90 and sm_80, assembled by ptxas for sm_90"
