#!/usr/bin/env bash
# Every GPU check and benchmark in one go, on the GPU machine (docs/gpu.md §6). Build first
# with bench/gpu-build.sh on the build machine and carry bench/gpu-bin. Prints to $OUT
# (bench/out/gpu when unset): the tests of every kernel and of the whole forward on the
# device, the CLI on the device against the CPU, and speed on the Qwen3.5-4B shapes next to
# transformers (with flash-linear-attention when its wheels came along) on the same GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/out/gpu}"
mkdir -p "$out"
bin=/tmp/frognano-gpu-bin
rm -rf "$bin" && mkdir -p "$bin"
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' bench/gpu-bin/pack.tar.xz "$bin" ||
    { echo "no bench/gpu-bin/pack.tar.xz: run bench/gpu-build.sh here and carry bench/gpu-bin"; exit 1; }
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export FROGNANO_FIXTURES="$PWD/fixtures" FROGNANO_REQUIRE_GPU=1
log() { echo "== $*" | tee -a "$out/summary.txt"; }
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
log "$(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)"

# 1. Tests on the device (FROGNANO_CUDA_SYNC: a faulting kernel is named at its launch).
for t in "$bin"/test-*; do
    name=$(basename "$t")
    FROGNANO_TEST_DEVICE=cuda FROGNANO_CUDA_SYNC=1 timeout 300 "$t" --test-threads=1 >"$out/$name.log" 2>&1
    log "$name: exit $? $(grep -E '^test result' "$out/$name.log" | tail -1)"
done

# 2. The CLI on the device: logits and greedy text against the CPU path.
for dev in cpu cuda; do
    "$bin/frognano" logits fixtures/qwen35-tiny --ids 5,17,300,2 --device "$dev" >"$out/logits-$dev.json" 2>"$out/logits-$dev.err"
done
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import json, sys
o = sys.argv[1]
try:
    a, b = (json.load(open(f"{o}/logits-{d}.json"))["logits"] for d in ("cpu", "cuda"))
    print("== CLI logits, cuda vs cpu: max |diff|", max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)))
except Exception as e:
    print("== CLI logits on cuda failed:", e)
PY
for m in fixtures/arch/llama3-tiny.gguf fixtures/arch/qwen2-tiny.gguf; do
    "$bin/frognano" logits "$m" --ids 1,2,3,4,5,6,7,8 --device cuda >/dev/null 2>"$out/cli-$(basename "$m").err"
    log "logits --device cuda $m: exit $?"
done

# 3. serve on the device: 32 concurrent streams (the tiny fixture has a tokenizer and template).
"$bin/frognano" serve fixtures/qwen35-tiny --device cuda --port 8093 --max-concurrent 32 >"$out/serve.log" 2>&1 &
serve_pid=$!
python3 - <<'PY' 2>&1 | tee -a "$out/summary.txt"
import json, threading, time, urllib.request
base = "http://127.0.0.1:8093"
for _ in range(120):
    try:
        urllib.request.urlopen(base + "/health", timeout=1); break
    except Exception:
        time.sleep(0.5)
done, errors, tokens = [], [], [0]
def one(i):
    body = json.dumps({"model": "m", "stream": True, "max_tokens": 64, "temperature": 0,
                       "messages": [{"role": "user", "content": f"Stream {i}: count to twenty."}]}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            for line in r:
                if line.startswith(b"data: {"):
                    tokens[0] += 1
        done.append(i)
    except Exception as e:
        errors.append(f"{i}: {e}")
t = time.time()
ts = [threading.Thread(target=one, args=(i,)) for i in range(32)]
[x.start() for x in ts]; [x.join() for x in ts]
s = time.time() - t
print(f"== serve --device cuda, 32 streams: {len(done)} finished, {len(errors)} failed, {tokens[0]} chunks in {s:.1f} s ({tokens[0]/s:.0f} chunks/s)", errors[:3])
PY
kill "$serve_pid" 2>/dev/null

# 4. Speed on the 4B shapes (random bf16 weights made here by torch), FrogNano vs transformers.
q4b=/tmp/qwen35-4b-random
python3 bench/make_random_qwen35_4b.py "$q4b" >"$out/make4b.log" 2>&1
log "4B checkpoint: exit $?"
timeout 240 "$bin/gpu_speed" "$q4b" cuda 2048,8192 128 32 >"$out/frognano_4b.jsonl" 2>"$out/frognano_4b.err"
log "frognano 4B bf16: exit $?"; cat "$out/frognano_4b.jsonl" | tee -a "$out/summary.txt"
fla=/tmp/fla
if ls "$bin"/wheels/*.whl >/dev/null 2>&1; then
    python3 -m pip install --quiet --no-deps --target "$fla" "$bin"/wheels/*.whl >"$out/fla.log" 2>&1
fi
for with_fla in 0 1; do
    [ "$with_fla" = 1 ] && [ ! -d "$fla" ] && continue
    PYTHONPATH=$([ "$with_fla" = 1 ] && echo "$fla") timeout 300 python3 - "$q4b" "$with_fla" <<'PY' >"$out/transformers_4b_fla$with_fla.jsonl" 2>"$out/transformers_4b_fla$with_fla.err"
import json, sys, time, torch
from transformers import AutoModelForCausalLM
path, fla = sys.argv[1], sys.argv[2] == "1"
m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
def sync(): torch.cuda.synchronize()
with torch.no_grad():
    for n in (2048, 8192):
        ids = torch.randint(0, 200000, (1, n), device="cuda")
        m(ids); sync()
        t = time.time(); m(ids); sync(); s = time.time() - t
        print(json.dumps({"peer": "transformers", "fla": fla, "prefill_tokens": n, "tok_s": round(n / s, 1)}), flush=True)
    for b in (1, 32):
        ids = torch.randint(0, 200000, (b, 16), device="cuda")
        kw = dict(max_new_tokens=64, min_new_tokens=64, do_sample=False)
        m.generate(ids, **kw); sync()
        t = time.time(); m.generate(ids, **kw); sync(); s = time.time() - t
        print(json.dumps({"peer": "transformers", "fla": fla, "decode_batch": b, "tok_s": round(b * 64 / s, 1)}), flush=True)
PY
    log "transformers 4B bf16 (fla=$with_fla): exit $?"; cat "$out/transformers_4b_fla$with_fla.jsonl" | tee -a "$out/summary.txt"
done
log "done $(date -u +%FT%TZ)"
