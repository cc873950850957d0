#!/usr/bin/env bash
# `frognano synth` (a unit: one candidate) and `frognano train --toy` (a unit: one rollout
# group) through Ray vs locally: overhead per unit and the speed-up from 1 to 2 Ray nodes
# (both on this machine). Prints the CPU model, SIMD flags and load average before and after.
# Usage: bench/ray_units.sh [CANDIDATES] [STEPS]   (figures go in bench/RESULTS.md by hand)
# Needs .venv-ray (scripts/setup-ray.sh) and a built frognano (FROGNANO=…, default target/debug).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-ray.sh
flags="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512(f|bw|vl|vnni|_bf16)|amx_(tile|int8|bf16))$' | tr '\n' ' ')"
echo "CPU: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; SIMD flags: ${flags:-none}"
echo "commit: $(git rev-parse --short HEAD); command: bench/ray_units.sh ${1:-12} ${2:-4}; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
.venv-ray/bin/python bench/ray_units.py "${1:-12}" "${2:-4}"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
