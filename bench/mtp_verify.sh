#!/usr/bin/env bash
# MTP drafting on the Qwen3.5-4B shape (docs/speculative.md §7): the cost of verifying k = 1..4
# drafts relative to one decode step, the rollback and the MTP head's own cost, and the
# speed-up they imply as a function of the acceptance rate. Random weights accept nothing, so
# every verification is timed as if all its drafts were accepted (forced acceptance); the
# model is built in memory (random weights in the real 4B text shapes plus an MTP head,
# quantized as drawn; no checkpoint on disk). Prints the CPU, its SIMD flags and the load
# average before and after.
#   bench/mtp_verify.sh [QUANT] [PROMPT] [REPEATS]   (default: q4_k 512 5)
set -euo pipefail
cd "$(dirname "$0")/.."
quant=${1:-q4_k}
prompt=${2:-512}
repeats=${3:-5}
cargo build --release -q -p frognano-model --example mtp_verify
bin=target/release/examples/mtp_verify
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') ($(nproc) threads)"
echo "simd: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512bw|avx512vnni|avx512_bf16|amx_tile)$' | tr '\n' ' ')"
echo "memory: $(free -g | awk '/Mem:/ {print $2 " GiB total, " $7 " GiB available"}')"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "command: $bin $quant $prompt $repeats"
"$bin" "$quant" "$prompt" "$repeats"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
