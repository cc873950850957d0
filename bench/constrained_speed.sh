#!/usr/bin/env bash
# Decode speed with and without a JSON-schema constraint (docs/structured.md): the same chat
# prompt and seed, alternating constrained / free runs, medians; plus the per-token mask time
# on the constraint's helper thread and the time the sampler waited for it. Prints the CPU,
# its SIMD flags and the load average before and after.
#   bench/constrained_speed.sh [MODEL.gguf] [REPEATS]      (default: the demo model, 5)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
repeats=${2:-5}
cargo build --release -q -p frognano-engine --example constrained_speed
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') ($(nproc) threads)"
echo "simd: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512bw|avx512vnni|avx512_bf16|amx_tile)$' | tr '\n' ' ')"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "command: target/release/examples/constrained_speed $model $repeats"
target/release/examples/constrained_speed "$model" "$repeats"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
