#!/usr/bin/env bash
# mini-swe-agent (PyPI mini-swe-agent==2.4.6, in .venv-mswea) fixing the bundled demo repository
# through `frognano serve`, the way a user points any OpenAI-compatible agent at the server.
#   scripts/mini-swe-agent-demo.sh [MODEL.gguf] [--seeds "1 2 3"] [--steps 12]
#       [--tool-choice auto|required] [--serve-flag --no-constrain-tools]
# Default model: Qwen2.5-Coder-1.5B-Instruct Q4_K_M (scripts/fetch-coder-model.sh). Prints each
# run's calls and a JSON summary per seed (calls, turns with a valid tool call, format errors,
# exit status, whether the demo's tests pass afterwards); the server log is in
# bench/out/mswea-serve.log.
set -euo pipefail
cd "$(dirname "$0")/.."
model=models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then model=$1; shift; fi
seeds=1 steps=12 choice=auto serve_flags=()
while [ $# -gt 0 ]; do
    case $1 in
        --seeds) seeds=$2; shift 2 ;; --steps) steps=$2; shift 2 ;;
        --tool-choice) choice=$2; shift 2 ;; --serve-flag) serve_flags+=("$2"); shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ "$model" = models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf ]; then ./scripts/fetch-coder-model.sh; fi
[ -f "$model" ] || { echo "$model: no such model file" >&2; exit 1; }
if ! .venv-mswea/bin/python -c 'import minisweagent' 2>/dev/null; then
    python3 -m venv .venv-mswea
    .venv-mswea/bin/pip install -q mini-swe-agent==2.4.6
fi
cargo build --release -q -p frognano
mkdir -p bench/out
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
./target/release/frognano serve "$model" --port "$port" --model-name coder "${serve_flags[@]}" \
    > bench/out/mswea-serve.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    kill -0 $server 2>/dev/null || { cat bench/out/mswea-serve.log >&2; exit 1; }
    sleep 1
done
for seed in $seeds; do
    echo "seed $seed:"
    .venv-mswea/bin/python scripts/mini_swe_agent_demo.py --url "http://127.0.0.1:$port/v1" --model coder \
        --steps "$steps" --seed "$seed" --tool-choice "$choice" --out "bench/out/mswea-s$seed-$choice.json"
done
