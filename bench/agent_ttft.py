#!/usr/bin/env python3
"""An agent's conversation against an OpenAI-compatible server: time to first token of each
turn as the history grows (stdlib only; run by bench/agent_ttft.sh).

The conversation is the shape of a coding agent's: a system prompt and an issue, then turns of
[assistant reply, tool result]. Turn 1 carries a file of about --first tokens (the history the
agent has read so far); every later turn adds the model's short reply and a tool result of
about --step tokens, the way a Read or a test run adds a little to a long conversation. The
turns whose history first reaches each of --marks (tokens) are the measured ones, together with
the turn after each (so "from the second turn on" has two figures per mark). Between marks the
history is grown in one turn of the missing size (not measured), to keep the peer's work within
reach on a small CPU.

History sizes are counted by the server under test when it has /tokenize (FrogNano does) and
estimated at 4 characters a token otherwise; both servers get the same messages, so their
figures are for the same conversation. Prints one JSON object per turn.
"""

import argparse
import json
import random
import time
import urllib.request

WORDS = ("def return self value index result items config path error check update parse "
         "count total name data list dict string number line file module test assert raise "
         "import from class while for if else elif try except finally with open read write").split()


def code_block(rng, tokens):
    """Python-looking text of about `tokens` tokens (≈ 4 characters a token)."""
    lines, size = [], 0
    while size < tokens * 4:
        indent = "    " * rng.randint(0, 2)
        line = indent + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    return urllib.request.urlopen(req, timeout=7200)


def turn(url, model, messages, max_tokens):
    """Streams one reply: (seconds to the first token, seconds in all, the reply's text)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    t = time.perf_counter()
    first, text = None, []
    with post(url, "/v1/chat/completions", body) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for ch in chunk.get("choices", []):
                d = ch.get("delta", {})
                piece = d.get("content") or d.get("reasoning_content")
                if piece:
                    if first is None:
                        first = time.perf_counter() - t
                    text.append(d.get("content") or "")
    total = time.perf_counter() - t
    return (first if first is not None else total), total, "".join(text)


def count_tokens(count_url, model, messages):
    if count_url:
        try:
            with post(count_url, "/tokenize", {"model": model, "messages": messages}) as r:
                return len(json.loads(r.read())["tokens"])
        except Exception:
            pass
    return sum(len(m["content"]) for m in messages) // 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--count-url", default=None, help="a FrogNano server whose /tokenize counts the history")
    ap.add_argument("--marks", default="2048,4096,8192")
    ap.add_argument("--step", type=int, default=200, help="tokens a measured turn adds (a tool result)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    messages = [
        {"role": "system", "content": "You are a coding agent. Read the files you are given and fix the issue."},
        {"role": "user", "content": "Issue: parse() drops the last line of the config file.\n\nFile config.py:\n"},
    ]
    marks = [int(m) for m in a.marks.split(",")]
    history = count_tokens(a.count_url, a.model, messages)
    k = 0
    for mark in marks:
        # Grow the history to the mark in one unmeasured turn, then two measured small turns.
        grow = max(mark - history - a.step, 16)
        for size, measured in ((grow, False), (a.step, True), (a.step, True)):
            if k == 0:
                messages[-1]["content"] += code_block(rng, size)
            else:
                messages.append({"role": "user", "content": "Tool result:\n" + code_block(rng, size)})
            k += 1
            history = count_tokens(a.count_url, a.model, messages)
            first, total, reply = turn(a.url, a.model, messages, a.max_tokens)
            messages.append({"role": "assistant", "content": reply or "ok"})
            print(json.dumps({"label": a.label, "turn": k, "mark": mark, "measured": measured,
                              "history_tokens": history, "ttft_s": round(first, 3),
                              "total_s": round(total, 3)}), flush=True)


if __name__ == "__main__":
    main()
