#!/usr/bin/env bash
# nvcc for the kernel syntax check (scripts/check-kernels.sh) and libnvrtc for the test that
# compiles the kernels as a GPU run does (crates/gpu/tests/nvrtc.rs), from PyPI: CUDA's
# compilers and headers as wheels in a git-ignored venv (.venv-cuda), and a CUDA root under it
# whose bin/ holds hard links of the wheel's binaries (nvcc finds its headers relative to its
# own real path; libnvrtc is in its lib64/). No GPU, driver or system CUDA is needed. Prints
# the root's path last.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-cuda
root="$PWD/$venv/cuda-root"
if [ ! -x "$root/bin/nvcc" ] || [ ! -e "$root/lib64/libnvrtc.so.13" ]; then
    [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "nvidia-cuda-nvcc==13.0.88" "nvidia-cuda-runtime==13.0.96" \
        "nvidia-cuda-cccl==13.0.85" "nvidia-cuda-crt==13.0.88" "nvidia-nvvm==13.0.88" \
        "nvidia-cuda-nvrtc==13.0.88"
    cu13="$("$venv/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')"
    rm -rf "$root"
    mkdir -p "$root/bin" "$root/targets/x86_64-linux"
    cp -al "$cu13/bin/." "$root/bin/"
    ln -s "$cu13/nvvm" "$root/nvvm"
    ln -s "$cu13/include" "$root/include"
    ln -s "$cu13/lib" "$root/lib64"
    ln -s "$cu13/include" "$root/targets/x86_64-linux/include"
    ln -s "$cu13/lib" "$root/targets/x86_64-linux/lib"
fi
echo "$root"
