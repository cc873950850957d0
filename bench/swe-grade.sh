#!/usr/bin/env bash
# frognano eval grading throughput on generated fixture instances, 1 and 2 workers.
# Usage: bench/swe-grade.sh [N_INSTANCES]   (figures go in bench/RESULTS.md by hand)
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}" cargo run -q -p frognano-swe --example grade_bench -- "${1:-12}"
