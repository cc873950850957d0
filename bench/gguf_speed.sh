#!/usr/bin/env bash
# llama.cpp (llama-cpp-python 0.3.36, scripts/setup-llama-reference.sh: GGML_NATIVE=ON with
# the AMX instructions compiled out, which crash on this CPU) and FrogNano on the same GGUF,
# same thread count, alternating, in one run. Prints tok/s and FrogNano/llama.cpp ratios for
# prefill (N tokens) and greedy decode (M tokens), and decode's achieved weight bandwidth.
#   bench/gguf_speed.sh [MODEL.gguf] [--threads 2] [--prefill 512] [--decode 128] [--runs 3]
#   bench/gguf_speed.sh --qwen35-4b [--prepare-only] [...]
#   --plain also times FrogNano with FROGNANO_PLAIN_KERNELS=1 (its kernels before the tiled
#   k-quant matmuls, the vector attention and the eight-row Q4_K packing) in the same
#   alternation, for before/after ratios from one run. The load average is printed at the start and the end.
# --qwen35-4b times the random-weight Qwen3.5-4B-shape model (bench/make_random_qwen35_4b.py
# writes bench/out/qwen35-4b-random) as llama.cpp's tools make a Q4_K_M file of it: its
# convert_hf_to_gguf.py (from the llama-cpp-python sdist, --no-mtp, pre-tokenizer `qwen35`, as
# scripts/llama_reference.py runs it; bf16 output) then llama_model_quantize. Both files are
# made once, under bench/out; the bf16 one is deleted after quantizing. The converter runs with
# the transformers venv of scripts/setup-torch-reference.sh (CONVERT_PYTHON overrides it).
set -euo pipefail
cd "$(dirname "$0")/.."
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then model=$1; shift; fi
threads=2 prefill=512 decode=128 runs=3 qwen4b=0 prepare_only=0 plain=0
while [ $# -gt 0 ]; do
    case $1 in
        --threads) threads=$2; shift 2 ;; --prefill) prefill=$2; shift 2 ;;
        --decode) decode=$2; shift 2 ;; --runs) runs=$2; shift 2 ;;
        --qwen35-4b) qwen4b=1; shift ;; --prepare-only) prepare_only=1; shift ;;
        --plain) plain=1; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ "$qwen4b" = 1 ]; then
    src=bench/out/qwen35-4b-random
    model=bench/out/qwen35-4b-random-Q4_K_M.gguf
    if [ ! -f "$model" ]; then
        [ -f "$src/config.json" ] || { echo "$src missing: run bench/make_random_qwen35_4b.py" >&2; exit 1; }
        bf16=bench/out/qwen35-4b-random-bf16.gguf
        if [ ! -f "$bf16" ]; then
            convert_python=${CONVERT_PYTHON:-${FROGNANO_REF_VENV:-.venv-ref-torch}/bin/python}
            [ -x "$convert_python" ] || { echo "$convert_python missing: run scripts/setup-torch-reference.sh" >&2; exit 1; }
            .venv-llama/bin/python -c 'import llama_cpp' || { echo "run scripts/setup-llama-reference.sh first" >&2; exit 1; }
            "$convert_python" - "$src" "$bf16" <<'PY'
import os, sys
sys.path.insert(0, "scripts")
import llama_reference as lr  # finds (and unpacks) the llama-cpp-python sdist
lcpp = os.path.join(lr.sdist_root(), "vendor", "llama.cpp")
sys.path[:0] = [os.path.join(lcpp, "gguf-py"), lcpp]
import convert_hf_to_gguf as c
from conversion.base import TextModel
known = TextModel.get_vocab_base_pre
def pre(self, tokenizer):  # the random checkpoint's tokenizer hash is not in the converter's list
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return "qwen35"
TextModel.get_vocab_base_pre = pre
src, out = sys.argv[1], sys.argv[2]
sys.argv = ["convert_hf_to_gguf.py", src, "--outfile", out + ".part", "--outtype", "bf16", "--no-mtp"]
c.main()
os.rename(out + ".part", out)
PY
        fi
        .venv-llama/bin/python - "$bf16" "$model" "$threads" <<'PY'
import os, sys
import llama_cpp
src, dst, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
params.nthread = threads
rc = llama_cpp.llama_model_quantize(src.encode(), (dst + ".part").encode(), params)
if rc != 0:
    sys.exit(f"llama_model_quantize failed ({rc})")
os.rename(dst + ".part", dst)
PY
        rm -f "$bf16"
    fi
    [ "$prepare_only" = 1 ] && { ls -l "$model"; exit 0; }
fi
[ -f "$model" ] || { echo "$model missing (scripts/fetch-demo-model.sh)" >&2; exit 1; }
.venv-llama/bin/python -c 'import llama_cpp' || { echo "run scripts/setup-llama-reference.sh first" >&2; exit 1; }
cargo build --release -q -p frognano-model --example gguf_bench
ours=${CARGO_TARGET_DIR:-target}/release/examples/gguf_bench
mkdir -p bench/out
out=bench/out/gguf_speed.jsonl
: > "$out"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$runs"); do
    .venv-llama/bin/python - "$model" "$threads" "$prefill" "$decode" >> "$out" <<'PY'
import json, sys, time, os
import numpy as np
import llama_cpp
from llama_cpp import Llama
model, threads, n_pre, n_dec = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=model, n_ctx=n_pre + n_dec + 8, n_threads=threads, n_threads_batch=threads,
            n_batch=n_pre, verbose=False)
vocab = llm.n_vocab()
last = lambda: int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))))
s, prompt = 12345, []
for _ in range(n_pre):  # the same pseudo-random prompt as gguf_bench
    s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
    prompt.append(100 + (s >> 33) % (min(vocab, 30000) - 100))
t = time.perf_counter(); llm.eval(prompt); pre = time.perf_counter() - t
nxt = last()
t = time.perf_counter()
for _ in range(n_dec):
    llm.eval([nxt]); nxt = last()
dec = time.perf_counter() - t
print(json.dumps({"engine": "llama.cpp", "threads": threads, "prefill_tok_s": n_pre / pre, "decode_tok_s": n_dec / dec,
                  "weight_bytes": os.path.getsize(model)}))
PY
    "$ours" "$model" --threads "$threads" --prefill "$prefill" --decode "$decode" >> "$out"
    if [ "$plain" = 1 ]; then
        FROGNANO_PLAIN_KERNELS=1 "$ours" "$model" --threads "$threads" --prefill "$prefill" --decode "$decode" \
            | sed 's/"engine":"frognano"/"engine":"frognano-plain"/' >> "$out"
    fi
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
# One-thread copy bandwidth now (read + write bytes of a 256 MiB copy, best of 5), to set
# decode's weight bandwidth against.
copy_gbs=$(.venv-llama/bin/python - <<'PY'
import time, numpy as np
a = np.ones(1 << 25, dtype=np.float64); b = np.empty_like(a)
best = min((lambda t: (np.copyto(b, a), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(5))
print(f"{2 * a.nbytes / best / 1e9:.1f}")
PY
)
python3 - "$out" "$model" "$threads" "$prefill" "$decode" "$copy_gbs" <<'PY'
import json, statistics, sys, subprocess
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda e, k: statistics.median(r[k] for r in rows if r["engine"] == e)
model, threads, pre, dec, copy_gbs = sys.argv[2:7]
wb = next(r["weight_bytes"] for r in rows if r["engine"] == "frognano")
runs = sum(r["engine"] == "llama.cpp" for r in rows)
print(f"model {model}, {threads} threads, prefill {pre} tokens, decode {dec} tokens, median of {runs} alternating runs")
plain = any(r["engine"] == "frognano-plain" for r in rows)
head = f"{'':10} {'llama.cpp':>10} {'frognano':>10} {'ratio':>7}"
print(head + (f" {'plain':>10} {'ratio':>7} {'new/plain':>9}" if plain else ""))
for k, name in [("prefill_tok_s", "prefill"), ("decode_tok_s", "decode")]:
    a, b = med("llama.cpp", k), med("frognano", k)
    line = f"{name:10} {a:10.2f} {b:10.2f} {b / a if a else 0:7.2f}"
    if plain:
        p = med("frognano-plain", k)
        line += f" {p:10.2f} {p / a if a else 0:7.2f} {b / p if p else 0:9.2f}"
    print(line)
print(f"decode weight bandwidth: frognano {wb * med('frognano', 'decode_tok_s') / 1e9:.2f} GB/s, "
      f"llama.cpp {wb * med('llama.cpp', 'decode_tok_s') / 1e9:.2f} GB/s (weights {wb / 1e6:.1f} MB; "
      f"one-thread copy bandwidth measured just now: {copy_gbs} GB/s read + write)")
PY
