#!/usr/bin/env bash
# Qwen3.5-4B shapes (random weights, bf16) on CPU: FrogNano vs transformers, same thread count,
# alternating in one run: ROUNDS rounds (default 3), each running both engines once, the order
# swapped every round (FrogNano first in odd rounds, transformers first in even ones) so that
# neither always runs on the cooler machine. Prints every JSON line, then the median tok/s of
# each engine and their ratios, the largest peak RSS, the CPU model and SIMD flags, and the load
# average before and after. Needs ~20 GB of disk and ~10 GB of RAM at a time, and the
# transformers venv of scripts/setup-torch-reference.sh.
# Usage: bench/qwen35_4b_cpu.sh [PREFILL=512] [DECODE=128] [THREADS=2] [QUANT]   (ROUNDS=3)
#        bench/qwen35_4b_cpu.sh --dry-run [...]   prints the commands of every round, runs nothing
# QUANT (q8_0 or q4_k) has FrogNano quantize the same bf16 checkpoint on load (`--quant`);
# transformers always runs the bf16 weights.
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=0
if [ "${1:-}" = --dry-run ]; then DRY=1; shift; fi
PREFILL=${1:-512}; DECODE=${2:-128}; THREADS=${3:-2}; QUANT=${4:-}; ROUNDS=${ROUNDS:-3}
PY=${FROGNANO_REF_VENV:-.venv-ref-torch}/bin/python
OUT=bench/out/qwen35-4b-random
ours_cmd=(env "RAYON_NUM_THREADS=$THREADS" ./target/release/examples/gen_speed "$OUT" "$PREFILL" "$DECODE" ${QUANT:+--quant "$QUANT"})
theirs_cmd=("$PY" bench/transformers_speed.py "$OUT" "$PREFILL" "$DECODE" "$THREADS")
if [ "$DRY" = 1 ]; then
    echo "$PY bench/make_random_qwen35_4b.py $OUT"
    echo "cargo build --release -p frognano-engine --example gen_speed"
    for r in $(seq "$ROUNDS"); do
        if [ $((r % 2)) = 1 ]; then order="ours theirs"; else order="theirs ours"; fi
        for who in $order; do
            if [ "$who" = ours ]; then echo "round $r: ${ours_cmd[*]}"; else echo "round $r: ${theirs_cmd[*]}"; fi
        done
    done
    exit 0
fi
[ -x "$PY" ] || { echo "reference venv missing: run scripts/setup-torch-reference.sh first (or set FROGNANO_REF_VENV)"; exit 1; }
mkdir -p bench/out
"$PY" bench/make_random_qwen35_4b.py "$OUT"
cargo build --release -p frognano-engine --example gen_speed
flags="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512(f|bw|vl|vnni|_bf16)|amx_(tile|int8|bf16))$' | tr '\n' ' ')"
echo "CPU: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); SIMD flags: ${flags:-none}"
echo "command: bench/qwen35_4b_cpu.sh $PREFILL $DECODE $THREADS${QUANT:+ $QUANT} (ROUNDS=$ROUNDS)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT
for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then order="ours theirs"; else order="theirs ours"; fi
    for who in $order; do
        if [ "$who" = ours ]; then
            line=$("${ours_cmd[@]}")
        else
            line=$("${theirs_cmd[@]}" 2>/dev/null | tail -1)
        fi
        echo "round $r $who: $line"
        echo "$who $line" >> "$lines"
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$lines" <<'PY'
import json, statistics, sys
rows = {"ours": [], "theirs": []}
for l in open(sys.argv[1]):
    who, js = l.split(" ", 1)
    rows[who].append(json.loads(js))
med = lambda who, k: statistics.median(r[k] for r in rows[who])
n = len(rows["ours"])
for k, name in [("prefill_tok_s", "prefill"), ("decode_tok_s", "decode ")]:
    a, b = med("ours", k), med("theirs", k)
    print(f"{name}: frognano {a:.2f} tok/s, transformers {b:.2f} tok/s (medians of {n}), ratio {a / b:.2f}x")
a = max(r["peak_rss_bytes"] for r in rows["ours"])
w = rows["ours"][0]["weight_bytes"]
b = max(r["peak_rss_bytes"] for r in rows["theirs"])
print(f"peak RSS (largest of {n}): frognano {a/2**30:.2f} GiB = {a/w:.2f}x weights ({w/2**30:.2f} GiB); transformers {b/2**30:.2f} GiB")
PY
