#!/usr/bin/env bash
# Qwen3.5-4B shapes (random weights, bf16) on CPU: FrogNano vs transformers, same thread count,
# alternating, in one run. Prints both JSON lines and the ratios. Needs ~20 GB of disk and
# ~10 GB of RAM at a time, and the reference venv of scripts/make-qwen35-fixtures.sh.
# Usage: bench/qwen35_4b_cpu.sh [PREFILL=512] [DECODE=128] [THREADS=2] [QUANT]
# QUANT (q8_0 or q4_k) has FrogNano quantize the same bf16 checkpoint on load (`--quant`);
# transformers always runs the bf16 weights.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFILL=${1:-512}; DECODE=${2:-128}; THREADS=${3:-2}; QUANT=${4:-}
PY=${FROGNANO_REF_VENV:-.venv-ref-torch}/bin/python
[ -x "$PY" ] || { echo "reference venv missing: run scripts/make-qwen35-fixtures.sh first (or set FROGNANO_REF_VENV)"; exit 1; }
OUT=bench/out/qwen35-4b-random
mkdir -p bench/out
"$PY" bench/make_random_qwen35_4b.py "$OUT"
cargo build --release -p frognano-engine --example gen_speed
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
ours=$(RAYON_NUM_THREADS=$THREADS ./target/release/examples/gen_speed "$OUT" "$PREFILL" "$DECODE" ${QUANT:+--quant "$QUANT"})
echo "$ours"
theirs=$("$PY" bench/transformers_speed.py "$OUT" "$PREFILL" "$DECODE" "$THREADS" 2>/dev/null | tail -1)
echo "$theirs"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$ours" "$theirs" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"prefill: frognano {a['prefill_tok_s']:.2f} tok/s, transformers {b['prefill_tok_s']:.2f} tok/s, ratio {a['prefill_tok_s']/b['prefill_tok_s']:.2f}x")
print(f"decode:  frognano {a['decode_tok_s']:.2f} tok/s, transformers {b['decode_tok_s']:.2f} tok/s, ratio {a['decode_tok_s']/b['decode_tok_s']:.2f}x")
print(f"peak RSS: frognano {a['peak_rss_bytes']/2**30:.2f} GiB = {a['peak_rss_bytes']/a['weight_bytes']:.2f}x weights ({a['weight_bytes']/2**30:.2f} GiB); transformers {b['peak_rss_bytes']/2**30:.2f} GiB")
PY
