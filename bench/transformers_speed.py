#!/usr/bin/env python3
"""transformers' prefill and greedy-decode speed on CPU, for side-by-side runs with FrogNano.
Usage: MODEL_DIR PREFILL DECODE THREADS. Prints one JSON line."""
import json, resource, sys, time

import torch
from transformers import AutoModelForCausalLM
from transformers.cache_utils import DynamicCache

path, n_prefill, n_decode, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
t = time.time()
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
load_s = time.time() - t
vocab = model.config.vocab_size
ids = torch.tensor([[(i * 7919 + 13) % min(vocab, 1000) for i in range(n_prefill)]])
with torch.no_grad():
    cache = DynamicCache(config=model.config)
    t = time.time()
    logits = model(ids, past_key_values=cache, use_cache=True).logits
    prefill_s = time.time() - t
    nxt = logits[:, -1].argmax(-1, keepdim=True)
    t = time.time()
    for _ in range(n_decode):
        logits = model(nxt, past_key_values=cache, use_cache=True).logits
        nxt = logits[:, -1].argmax(-1, keepdim=True)
    decode_s = time.time() - t
print(json.dumps({"engine": "transformers", "threads": threads, "load_s": load_s,
                  "prefill_tokens": n_prefill, "prefill_tok_s": n_prefill / prefill_s,
                  "decode_tokens": n_decode, "decode_tok_s": n_decode / decode_s,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
