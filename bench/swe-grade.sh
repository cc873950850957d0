#!/usr/bin/env bash
# frognano eval grading throughput on generated fixture instances, 1 and 2 workers.
# Prints the CPU model and SIMD flags and the load average before and after the timed runs.
# Usage: bench/swe-grade.sh [N_INSTANCES]   (figures go in bench/RESULTS.md by hand)
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}" cargo build -q -p frognano-swe --example grade_bench
flags="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512(f|bw|vl|vnni|_bf16)|amx_(tile|int8|bf16))$' | tr '\n' ' ')"
echo "CPU: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; SIMD flags: ${flags:-none}"
echo "command: bench/swe-grade.sh ${1:-12}; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"${CARGO_TARGET_DIR:-target}/debug/examples/grade_bench" "${1:-12}"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
