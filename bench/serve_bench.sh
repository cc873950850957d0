#!/usr/bin/env bash
# Serving bench: aggregate decode tok/s at 1/4/16 concurrent clients, and the time to first
# token of a follow-up agent turn on a ~4K-token conversation with and without prefix reuse;
# FrogNano's server side by side with llama_cpp.server (llama-cpp-python, .venv-llama) on the
# same GGUF when that is installed. Appends a section to bench/RESULTS.md.
#
#   bench/serve_bench.sh [MODEL]      (default: models/SmolLM2-135M-Instruct.Q4_1.gguf)
#
# Measure on a quiet machine (see docs/peers.md); both servers get 2 threads.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
max_tokens=${MAX_TOKENS:-64}
out=bench/out/serve
mkdir -p "$out"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p frognano
ours=("$CARGO_TARGET_DIR/release/frognano" serve)
name=bench-model
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

wait_up() { for _ in $(seq 1 600); do curl -sf "$1/v1/models" >/dev/null && return 0; sleep 0.5; done; echo "server at $1 did not start" >&2; return 1; }
run_ours() { # $1 = label, rest = extra flags
    local label=$1; shift
    "${ours[@]}" "$model" --port 8101 --model-name "$name" --max-concurrent 16 "$@" >"$out/$label.log" 2>&1 &
    local pid=$!; pids+=("$pid")
    wait_up http://127.0.0.1:8101
    python3 bench/serve_bench.py --url http://127.0.0.1:8101 --model "$name" --label "$label" \
        --max-tokens "$max_tokens" "${BENCH_ARGS[@]}" | tee -a "$out/results.jsonl"
    kill "$pid"; wait "$pid" 2>/dev/null || true
}
: >"$out/results.jsonl"
BENCH_ARGS=()
run_ours frognano
BENCH_ARGS=(--skip-throughput)
run_ours frognano-no-prefix-reuse --no-prefix-reuse

# llama_cpp.server needs the [server] extras (fastapi, uvicorn, ...). .venv-llama holds the
# llama-cpp-python build; .venv-llama-server, if present, adds the extras on top of it
# (a .pth file pointing at .venv-llama's site-packages).
llama=no
llama_py=
for v in .venv-llama-server .venv-llama; do
    if [ -x "$v/bin/python" ] && "$v/bin/python" -c 'import llama_cpp.server.app' 2>/dev/null; then llama_py=$v/bin/python; break; fi
done
if [ -n "$llama_py" ] && [[ "$model" == *.gguf ]]; then
    llama=yes
    "$llama_py" -m llama_cpp.server --model "$model" --model_alias "$name" --port 8102 \
        --n_threads 2 --n_ctx 8192 >"$out/llama.log" 2>&1 &
    lpid=$!; pids+=("$lpid")
    wait_up http://127.0.0.1:8102
    python3 bench/serve_bench.py --url http://127.0.0.1:8102 --model "$name" --label llama.cpp \
        --max-tokens "$max_tokens" | tee -a "$out/results.jsonl"
    kill "$lpid"; wait "$lpid" 2>/dev/null || true
fi

python3 - "$out/results.jsonl" "$model" "$llama" >>bench/RESULTS.md <<'PY'
import json, sys, datetime
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
model, llama = sys.argv[2], sys.argv[3] == "yes"
tp = {(r["label"], r["clients"]): r["tok_s"] for r in rows if r["figure"] == "decode_tok_s"}
tt = {r["label"]: r for r in rows if r["figure"] == "followup_ttft_s"}
print(f"\n## serve: {model} ({datetime.date.today()}, bench/serve_bench.sh)\n")
labels = ["frognano"] + (["llama.cpp"] if llama else [])
print("| clients | " + " | ".join(f"{l} tok/s" for l in labels) + (" | frognano / llama.cpp |" if llama else " |"))
print("|---|" + "---|" * len(labels) + ("---|" if llama else ""))
for c in sorted({k[1] for k in tp}):
    cells = [f"{tp.get((l, c), float('nan')):.1f}" for l in labels]
    ratio = f" | {tp[('frognano', c)] / tp[('llama.cpp', c)]:.2f}" if llama and ('llama.cpp', c) in tp else ""
    print(f"| {c} | " + " | ".join(cells) + ratio + " |")
one = tp.get(("frognano", 1))
if one:
    print("\nBatching gain (frognano, aggregate tok/s vs 1 client): " +
          ", ".join(f"{c} clients {tp[('frognano', c)] / one:.2f}x" for c in sorted({k[1] for k in tp}) if ('frognano', c) in tp))
print("\nTime to first token of a follow-up turn on a ~4K-token conversation (seconds):\n")
print("| server | right after the earlier turn | after another conversation |")
print("|---|---|---|")
if "frognano" in tt:
    print(f"| frognano (prefix reuse) | {tt['frognano']['right_after']} | {tt['frognano']['after_other_conversation']} |")
if "frognano-no-prefix-reuse" in tt:
    r = tt["frognano-no-prefix-reuse"]
    print(f"| frognano --no-prefix-reuse | {r['right_after']} | {r['after_other_conversation']} |")
if "llama.cpp" in tt:
    print(f"| llama_cpp.server | {tt['llama.cpp']['right_after']} | {tt['llama.cpp']['after_other_conversation']} |")
if not llama:
    print("\nllama_cpp.server was not available (.venv-llama without llama_cpp, or a non-GGUF model): ours only.")
else:
    print("\nllama.cpp built with AMX disabled (see docs/peers.md).")
PY
echo "appended to bench/RESULTS.md"
