#!/usr/bin/env bash
# Issue 19's agent benchmark: an agent-style conversation through `frognano serve` and through
# llama_cpp.server (llama-cpp-python, same GGUF, same threads): the time to first token of
# turns at about 2K, 4K and 8K tokens of history (bench/agent_ttft.py says how the
# conversation grows). Appends a table to bench/RESULTS.md.
#
#   bench/agent_ttft.sh [MODEL.gguf] [--marks 2048,4096,8192] [--threads 2] [--no-llama]
#
# Default model: the Qwen3.5-4B-shape Q4_K_M (bench/make_random_qwen35_4b_gguf.py makes it).
# Needs scripts/setup-llama-reference.sh for the peer; the server extras go into
# .venv-llama-server (a venv on top of .venv-llama), made here. Prints the CPU model, its SIMD
# flags and the load average before and after: rerun on a busy machine.
set -euo pipefail
cd "$(dirname "$0")/.."
model=bench/out/qwen35-4b-random-Q4_K_M.gguf
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then model=$1; shift; fi
marks=2048,4096,8192 threads=2 llama=1
while [ $# -gt 0 ]; do
    case $1 in
        --marks) marks=${2:?--marks needs a value}; shift 2 ;;
        --threads) threads=${2:?--threads needs a value}; shift 2 ;;
        --no-llama) llama=0; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -f "$model" ] || { echo "no model at $model (bench/make_random_qwen35_4b_gguf.py makes the 4B-shape one)" >&2; exit 1; }
out=bench/out/agent-ttft
mkdir -p "$out"
cargo build --release -q -p frognano
ours=target/release/frognano
name=bench-model
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
wait_up() { for _ in $(seq 1 1200); do curl -sf "$1/v1/models" >/dev/null && return 0; sleep 0.5; done; echo "server at $1 did not start" >&2; return 1; }

if [ "$llama" = 1 ]; then
    .venv-llama/bin/python -c 'import llama_cpp' 2>/dev/null || { echo "run scripts/setup-llama-reference.sh first (or --no-llama)" >&2; exit 1; }
    if ! .venv-llama-server/bin/python -c 'import llama_cpp.server.app' 2>/dev/null; then
        python3 -m venv .venv-llama-server
        site=$(.venv-llama/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        echo "$site" >"$(.venv-llama-server/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/llama-venv.pth"
        .venv-llama-server/bin/pip install --quiet fastapi uvicorn sse-starlette starlette-context pydantic-settings pyyaml
    fi
fi

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) ($(nproc) logical CPUs)"
echo "SIMD flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512bw|avx512_vnni|avx512_bf16|amx_tile|avx_vnni)$' | sort -u | xargs)"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
echo "load average at start: $load_start"
: >"$out/results.jsonl"

# Ours first; it stays up afterwards as the token counter of the peer's conversation.
"$ours" serve "$model" --port 8111 --model-name "$name" --max-concurrent 1 -t "$threads" >"$out/frognano.log" 2>&1 &
pids+=($!)
wait_up http://127.0.0.1:8111
python3 bench/agent_ttft.py --url http://127.0.0.1:8111 --count-url http://127.0.0.1:8111 --model "$name" \
    --label frognano --marks "$marks" | tee -a "$out/results.jsonl"

if [ "$llama" = 1 ]; then
    ctx=$(( $(echo "$marks" | tr ',' '\n' | sort -n | tail -1) + 2048 ))
    .venv-llama-server/bin/python -m llama_cpp.server --model "$model" --model_alias "$name" --port 8112 \
        --n_threads "$threads" --n_threads_batch "$threads" --n_ctx "$ctx" >"$out/llama.log" 2>&1 &
    pids+=($!)
    wait_up http://127.0.0.1:8112
    python3 bench/agent_ttft.py --url http://127.0.0.1:8112 --count-url http://127.0.0.1:8111 --model "$name" \
        --label llama.cpp --marks "$marks" | tee -a "$out/results.jsonl"
fi
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
echo "load average at end: $load_end"

python3 - "$out/results.jsonl" "$model" "$threads" "$load_start" "$load_end" >>bench/RESULTS.md <<'PY'
import json, sys, datetime
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
model, threads, l0, l1 = sys.argv[2:6]
by = {}
for r in rows:
    by.setdefault(r["label"], []).append(r)
print(f"\n## Agent turns: time to first token as the history grows ({datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, bench/agent_ttft.sh)\n")
print(f"{model}, {threads} threads each, greedy, 8-token replies; load average {l0} -> {l1}.\n")
print("| turn | history (tokens) | frognano TTFT (s) | llama_cpp.server TTFT (s) | llama.cpp / frognano |")
print("|---:|---:|---:|---:|---:|")
ours = by.get("frognano", [])
peer = {r["turn"]: r for r in by.get("llama.cpp", [])}
for r in ours:
    p = peer.get(r["turn"])
    mark = "" if r["measured"] else " (grows the history)"
    pc = f"{p['ttft_s']:.2f}" if p else "—"
    ratio = f"{p['ttft_s'] / r['ttft_s']:.1f}x" if p and r["ttft_s"] > 0 else "—"
    print(f"| {r['turn']}{mark} | {r['history_tokens']} | {r['ttft_s']:.2f} | {pc} | {ratio} |")
PY
echo "appended to bench/RESULTS.md"
