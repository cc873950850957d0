#!/usr/bin/env bash
# Serve fairness under load (issue 19): N clients stream while one long prompt arrives; the
# others' inter-token latency before vs during its prefill, for several --prefill-chunk sizes
# (crates/serve/examples/serve_fairness.rs; a chunk longer than the prompt = no chunking).
#
#   bench/serve_fairness.sh [MODEL] [-- example flags]
#   e.g. bench/serve_fairness.sh models/SmolLM2-135M-Instruct.Q4_1.gguf --clients 16 --long-tokens 2048
#
# Prints the CPU, SIMD flags and load average before and after; the table goes to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
shift || true
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p frognano-serve --example serve_fairness
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; SIMD: $(grep -o -w -E 'avx512f|avx512_vnni|avx2|fma|f16c' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "commit $(git rev-parse --short HEAD); before: $(uptime)"
"$CARGO_TARGET_DIR/release/examples/serve_fairness" --model "$model" "$@"
echo "after: $(uptime)"
