#!/usr/bin/env bash
# Usage: scripts/skip-summary.sh SKIP_LOG
# Prints the tests a test run skipped (the lines report_skip appended to SKIP_LOG) with the CPU's
# SIMD flags, and fails when a skip is not allowed by scripts/allowed-skips.txt.
set -euo pipefail
log="$1"
allow="$(dirname "$0")/allowed-skips.txt"
patterns="$(mktemp)"
trap 'rm -f "$patterns"' EXIT
grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$allow" > "$patterns" || true
flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512(f|bw|vl|vnni|_vnni|_bf16)|amx_(tile|int8|bf16))$' | tr '\n' ' ' || true)"
echo "=== skipped tests (CPU SIMD flags: ${flags:-unknown}) ==="
if [ ! -s "$log" ]; then
    echo "none: every compiled path ran"
    exit 0
fi
sort "$log" | uniq -c | sed 's/^ */  /'
unexpected="$(grep -v -E -f "$patterns" "$log" | sort -u || true)"
if [ -n "$unexpected" ]; then
    echo "=== skips not allowed by $allow ==="
    echo "$unexpected"
    exit 1
fi
echo "all $(sort -u "$log" | wc -l) distinct skips are allowed by $allow"
