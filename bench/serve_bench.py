#!/usr/bin/env python3
"""Measures an OpenAI-compatible server (stdlib only; run by bench/serve_bench.sh).

  throughput: aggregate decode tokens/s with C concurrent chat clients (C = 1, 4, 16), each
              asking for --max-tokens tokens; tokens counted from `usage.completion_tokens`.
  ttft:       time to first streamed token of a follow-up agent turn on a ~4K-token
              conversation, after the earlier part of it was sent once ("reuse"), and after an
              unrelated conversation ran in between ("cold" for single-slot servers; our server
              is started with --no-prefix-reuse for its cold figure).

Prints one JSON object per figure.
"""

import argparse
import json
import threading
import time
import urllib.request


def post(url, body, stream=False):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    return urllib.request.urlopen(req, timeout=3600)


def chat(url, model, messages, max_tokens, seed=0):
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.8, "seed": seed}
    with post(url, body) as r:
        return json.loads(r.read())


def first_token_seconds(url, model, messages):
    body = {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0, "stream": True}
    t = time.perf_counter()
    with post(url, body, stream=True) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for ch in chunk.get("choices", []):
                d = ch.get("delta", {})
                if d.get("content") or d.get("reasoning_content"):
                    return time.perf_counter() - t
    return time.perf_counter() - t


def throughput(url, model, clients, max_tokens):
    results = [None] * clients

    def run(i):
        msgs = [{"role": "user", "content": f"Story {i}: tell me a long story about a frog named Bob."}]
        results[i] = chat(url, model, msgs, max_tokens, seed=i)["usage"]["completion_tokens"]

    t = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t
    return sum(results), wall


def conversation(words):
    """An agent-like conversation of roughly `words` words, and its follow-up turn."""
    code = "\n".join(f"def handler_{i}(request):\n    return process(request, retries={i % 7})" for i in range(words // 8))
    base = [
        {"role": "system", "content": "You are a careful software-engineering agent."},
        {"role": "user", "content": "Here is the module:\n" + code + "\nFind the bug."},
        {"role": "assistant", "content": "I will read the handlers and compare their retry counts."},
    ]
    follow = base + [{"role": "user", "content": "Which handler retries the most? Answer briefly."}]
    return base, follow


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--ttft-words", type=int, default=2400, help="conversation size (~4K tokens)")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-ttft", action="store_true")
    a = ap.parse_args()
    if not a.skip_throughput:
        chat(a.url, a.model, [{"role": "user", "content": "warm up"}], 4)
        for c in map(int, a.clients.split(",")):
            tokens, wall = throughput(a.url, a.model, c, a.max_tokens)
            print(json.dumps({"label": a.label, "figure": "decode_tok_s", "clients": c, "tokens": tokens,
                              "seconds": round(wall, 3), "tok_s": round(tokens / wall, 2)}), flush=True)
    if not a.skip_ttft:
        base, follow = conversation(a.ttft_words)
        other_base, _ = conversation(a.ttft_words // 4)
        # Reuse: the earlier part was just answered; the follow-up extends it.
        chat(a.url, a.model, base, 1)
        reuse = first_token_seconds(a.url, a.model, follow)
        # Cold: an unrelated conversation ran in between.
        chat(a.url, a.model, base, 1)
        chat(a.url, a.model, other_base, 1)
        cold = first_token_seconds(a.url, a.model, follow)
        print(json.dumps({"label": a.label, "figure": "followup_ttft_s", "after_other_conversation": round(cold, 3),
                          "right_after": round(reuse, 3)}), flush=True)


if __name__ == "__main__":
    main()
