#!/usr/bin/env bash
# Speculative decoding (docs/speculative.md): greedy decode speed with --speculative none,
# lookup and auto on two workloads, alternating runs, plus whether every mode's text equals
# plain decoding's. `edit`: the model rewrites a 60-line Python file with one change (an
# agent's Write); `free`: an essay that copies nothing. Prints the CPU, its SIMD flags and
# the load average before and after.
#   bench/speculative.sh [MODEL.gguf] [TOKENS] [REPEATS]
#   (default: models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf, 700, 3)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf}
tokens=${2:-700}
repeats=${3:-3}
cargo build --release -q -p frognano-engine --example speculative_speed
bin=target/release/examples/speculative_speed
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') ($(nproc) threads)"
echo "simd: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512bw|avx512vnni|avx512_bf16|amx_tile)$' | tr '\n' ' ')"
for workload in edit free; do
  echo "load before $workload: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "command: $bin $model $workload $tokens $repeats none lookup auto"
  "$bin" "$model" "$workload" "$tokens" "$repeats" none lookup auto
  echo "load after $workload: $(cut -d' ' -f1-3 /proc/loadavg)"
done
