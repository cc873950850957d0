"""The llama.cpp side of bench/gguf_speed.sh, timed as crates/model/examples/gguf_bench.rs times
FrogNano: prefill of N pseudo-random tokens (the same ids as gguf_bench), then M greedy decode
steps, one sequence. Prints one JSON line, with the M + 1 greedy token ids (`tokens`). Run it
with .venv-llama/bin/python.

Usage: llama_cpp_bench.py MODEL.gguf THREADS PREFILL DECODE [KV]
KV: the KV cache type, f16 (the default: llama.cpp's own defaults, flash attention off) or
q8_0 / q4_0 (type_k = type_v = GGML_TYPE_Q8_0 (8) / Q4_0 (2), with flash attention on, which
llama.cpp needs for a quantized V cache).
"""
import json
import os
import sys
import time

import numpy as np
import llama_cpp
from llama_cpp import Llama

if len(sys.argv) not in (5, 6):
    sys.exit(__doc__)
model, threads, n_pre, n_dec = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
kv = sys.argv[5] if len(sys.argv) == 6 else "f16"
KV_TYPES = {"q8_0": 8, "q4_0": 2}
if kv != "f16" and kv not in KV_TYPES:
    sys.exit(f"unknown KV cache type {kv!r}: expected f16, q8_0 or q4_0")
kv_args = {} if kv == "f16" else {"flash_attn": True, "type_k": KV_TYPES[kv], "type_v": KV_TYPES[kv]}
t = time.perf_counter()
# n_batch: llama-cpp-python keeps an n_batch × vocab float array of scores, 30 GiB for a
# 32K-token batch of Qwen3.5's 248K vocabulary; llama.cpp computes in micro-batches of n_ubatch
# (512) tokens whatever n_batch is, so a cap at its CLI default (2048) changes no timing.
llm = Llama(model_path=model, n_ctx=n_pre + n_dec + 8, n_threads=threads, n_threads_batch=threads,
            n_batch=min(n_pre, 2048), verbose=False, **kv_args)
load_s = time.perf_counter() - t
vocab = llm.n_vocab()


def last():
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
    return int(np.argmax(logits))


s, prompt = 12345, []
for _ in range(n_pre):  # the same pseudo-random prompt as gguf_bench
    s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
    prompt.append(100 + (s >> 33) % (min(vocab, 30000) - 100))
t = time.perf_counter()
llm.eval(prompt)
pre = time.perf_counter() - t
nxt = last()
tokens = [nxt]
t = time.perf_counter()
for _ in range(n_dec):
    llm.eval([nxt])
    nxt = last()
    tokens.append(nxt)
dec = time.perf_counter() - t
print(json.dumps({"engine": "llama.cpp", "model": model, "threads": threads, "kv_cache": kv,
                  "load_s": round(load_s, 3),
                  "prefill_tokens": n_pre, "prefill_tok_s": n_pre / pre, "decode_tokens": n_dec,
                  "decode_tok_s": n_dec / dec, "weight_bytes": os.path.getsize(model),
                  "tokens": tokens}))
