#!/usr/bin/env bash
# `frognano train --toy --trainer tinker` end to end against a real Tinker-compatible server:
# SkyRL tx (scripts/setup-tinker.sh) on JAX on this CPU, serving the toy's tiny llama.
#   1. the toy's random-init base model (seed 7, the seed of the run) is written as an HF checkpoint (a one-step toy run
#      with --lr 0 saves it: LoRA B is zero, so the merged model is the base) plus a
#      word-level tokenizer of the toy's vocabulary (the server loads a tokenizer);
#   2. the server starts on that folder (`python -m tx.tinker.api --base-model DIR`);
#   3. `frognano train --toy --lora-rank 4 --trainer tinker` trains STEPS steps: rollouts
#      here, forward_backward + optim_step there, the adapter pulled back every step;
#   4. checks: every step with usable groups moved the policy version, the adapter files were
#      downloaded and unpacked, and the policy the run saved differs from the base.
# Usage: bench/tinker_e2e.sh [STEPS]   (FROGNANO=…, default target/debug/frognano)
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
./scripts/setup-tinker.sh
frognano="${FROGNANO:-$root/target/debug/frognano}"
steps="${1:-6}"
work="$(mktemp -d /tmp/frognano-tinker.XXXXXX)"
server_pid=""
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
echo "CPU: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "skyrl-tx $(.venv-tinker/bin/python -c 'import importlib.metadata as m; print(m.version("skyrl-tx"), "jax", m.version("jax"))')"
"$frognano" train --toy --lora-rank 4 --lr 0 --steps 1 --save-every 1 --tasks-per-step 1 --group-size 2 --seed 7 \
    --out "$work/base" >/dev/null 2>&1
model="$work/base/checkpoints/step-000001/model"
.venv-tinker/bin/python bench/toy_tokenizer.py "$model"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
PATH="$root/.venv-tinker/bin:$PATH" JAX_PLATFORMS=cpu TX_DATABASE_URL="sqlite:///$work/tinker.db" \
    .venv-tinker/bin/python -m tx.tinker.api --base-model "$model" --host 127.0.0.1 --port "$port" \
    --checkpoints-base "$work/checkpoints" >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 240); do
    curl -sf "http://127.0.0.1:$port/api/v1/healthz" >/dev/null 2>&1 && break
    kill -0 "$server_pid" 2>/dev/null || { echo "the server died:"; tail -30 "$work/server.log"; exit 1; }
    sleep 0.5
done
start=$(date +%s.%N)
"$frognano" train --toy --lora-rank 4 --trainer tinker --trainer-url "http://127.0.0.1:$port" --base-model "$model" \
    --steps "$steps" --tasks-per-step 4 --group-size 4 --seed 7 --save-every "$steps" --out "$work/run"
end=$(date +%s.%N)
.venv-tinker/bin/python - "$work/run" "$model" <<'PY'
import json, sys, glob
from safetensors.numpy import load_file
run, base = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
updated = [r["step"] for r in rows if r["usable_groups"] > 0]
print("steps:", len(rows), "with usable groups:", updated, "policy version at the end:", rows[-1]["policy_version"])
print("losses (server):", [round(r["loss"], 6) for r in rows])
gaps = [r["logprob_gap"] for r in rows if r["usable_groups"] > 0]
print("mean |server logprob - sampler logprob| per updated step:", [f"{g:.2e}" for g in gaps])
assert all(g < 1e-3 for g in gaps), "the server's base model is the sampler's"
assert rows[-1]["policy_version"] == len(updated), "every update moved the policy version"
adapters = sorted(glob.glob(f"{run}/tinker/step-*/**/adapter_model.safetensors", recursive=True))
print("adapters pulled back:", len(adapters))
assert len(adapters) == len(updated) and updated, "an adapter per update"
a = load_file(adapters[-1])
moved = sum(float(abs(v).max()) > 0 for k, v in a.items() if "lora_B" in k)
print(f"lora_B tensors moved off zero: {moved} of {sum('lora_B' in k for k in a)}")
assert moved > 0
saved = load_file(glob.glob(f"{run}/checkpoints/step-*/model/model.safetensors")[0])
b = load_file(f"{base}/model.safetensors")
diff = max(float(abs(saved[k] - b[k]).max()) for k in b)
print(f"largest change of a merged weight vs the base: {diff:.3g}")
assert diff > 0
PY
echo "train wall: $(python3 -c "print(round($end - $start, 1))") s; load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
