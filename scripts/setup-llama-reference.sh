#!/usr/bin/env bash
# Builds llama-cpp-python 0.3.36 (llama.cpp from source, ~20 min on 2 cores) into the
# git-ignored venv .venv-llama, for scripts/llama_reference.py and bench/gguf_speed.sh, and
# keeps its source distribution in .venv-llama/sdist: its vendored llama.cpp has the
# convert_hf_to_gguf.py those scripts run, and the gguf-py that scripts/make_arch_fixtures.py
# writes GGUF files with (it imports yaml: pyyaml is installed too).
# Needs cmake and build-essential (installed with apt-get when missing). The AMX path crashes on this CPU (docs/peers.md), so
# it is compiled out; every figure measured with this build says so. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
if .venv-llama/bin/python -c 'import llama_cpp, yaml' 2>/dev/null && ls .venv-llama/sdist/llama_cpp_python-0.3.36.tar.gz >/dev/null 2>&1; then
    echo "llama-cpp-python already built in .venv-llama"
    exit 0
fi
if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    echo "installing cmake and build-essential (apt-get)" >&2
    $sudo apt-get update -qq && $sudo apt-get install -y -qq cmake build-essential ||
        { echo "needs cmake and build-essential: apt-get install cmake build-essential failed" >&2; exit 1; }
fi
[ -x .venv-llama/bin/python ] || python3 -m venv .venv-llama
.venv-llama/bin/pip install --quiet --upgrade pip
mkdir -p .venv-llama/sdist
.venv-llama/bin/pip download --quiet --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d .venv-llama/sdist
export CMAKE_ARGS="-DGGML_NATIVE=ON"
export CFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
export CXXFLAGS="$CFLAGS"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
.venv-llama/bin/python -c 'import llama_cpp' 2>/dev/null ||
    .venv-llama/bin/pip install --no-binary llama-cpp-python .venv-llama/sdist/llama_cpp_python-0.3.36.tar.gz numpy
.venv-llama/bin/python -c 'import yaml' 2>/dev/null || .venv-llama/bin/pip install --quiet pyyaml
# The Qwen3.5 conversions (scripts/llama_reference.py, bench/gguf_speed.sh --qwen35-4b) also
# need torch + transformers: scripts/setup-torch-reference.sh.
