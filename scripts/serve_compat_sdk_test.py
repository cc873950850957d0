#!/usr/bin/env python3
"""Drives `frognano serve` with the official `ollama` and `anthropic` Python clients.

Run by crates/serve/tests/compat_sdk.rs from the git-ignored venv `.venv-compat` that
scripts/ci-setup.sh makes. Two servers, started in-process by the test:
  --plain URL  the tiny random checkpoint (ChatML template): chat and generate, whole and
               streamed, listing, show, errors;
  --tool URL   a scripted model with the Qwen3.5 template that always answers with thinking
               and one Bash tool call: tool calls in each client's types, streamed and whole.
Exits non-zero on the first failed check; prints one `ok:` line per check.
"""

import argparse
import sys

import anthropic
import ollama

MODEL = "qwen35-tiny"
BASH = {
    "name": "Bash",
    "description": "Run a shell command in the repository workdir.",
    "input_schema": {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "Command to run."},
            "timeout": {"type": "integer", "description": "Seconds."},
        },
        "required": ["command"],
    },
}
OLLAMA_BASH = {"type": "function", "function": {**{k: BASH[k] for k in ("name", "description")},
                                                "parameters": BASH["input_schema"]}}


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def ollama_checks(plain, tool):
    c = ollama.Client(host=plain)
    names = [m.model for m in c.list().models]
    check(names == [f"{MODEL}:latest"], f"list: {names}")
    shown = c.show(MODEL)
    check("completion" in (shown.capabilities or []) and shown.template, f"show: {shown}")
    running = c.ps().models
    check([m.model for m in running] == [f"{MODEL}:latest"] and running[0].size > 0
          and running[0].expires_at is not None, f"ps: {running}")
    print("ok: ollama list, show, ps")

    msgs = [{"role": "user", "content": "Say something."}]
    opts = {"temperature": 0, "num_predict": 8}
    r = c.chat(model=MODEL, messages=msgs, options=opts, think=False)
    check(isinstance(r.message.content, str) and r.done and r.done_reason in ("stop", "length"), f"chat: {r}")
    check(r.eval_count and r.prompt_eval_count and r.total_duration, f"counts: {r}")
    streamed = "".join(part.message.content for part in c.chat(model=MODEL, messages=msgs, options=opts,
                                                               think=False, stream=True))
    check(streamed == r.message.content, f"streamed {streamed!r} vs {r.message.content!r}")
    print("ok: ollama chat, whole and streamed")

    g = c.generate(model=MODEL, prompt="Say something.", options=opts, think=False)
    check(g.response == r.message.content, f"generate {g.response!r} vs chat {r.message.content!r}")
    print("ok: ollama generate")

    try:
        c.chat(model="llama3.2", messages=msgs)
        check(False, "an unknown model must fail")
    except ollama.ResponseError as e:
        check(e.status_code == 404 and "not found" in e.error, f"unknown model: {e.status_code} {e.error}")
    print("ok: ollama unknown model -> ResponseError 404")

    t = ollama.Client(host=tool)
    r = t.chat(model=MODEL, messages=[{"role": "user", "content": "List files."}], tools=[OLLAMA_BASH], think=True)
    calls = r.message.tool_calls or []
    check(len(calls) == 1 and calls[0].function.name == "Bash", f"tool call: {r.message}")
    check(dict(calls[0].function.arguments) == {"command": "ls -la", "timeout": 30}, f"arguments {calls[0]}")
    check(r.message.thinking == "Let me list the files.\n", f"thinking {r.message.thinking!r}")
    history = [{"role": "user", "content": "List files."}, r.message,
               {"role": "tool", "content": "a.py\nb.py", "tool_name": "Bash"}]
    again = t.chat(model=MODEL, messages=history, tools=[OLLAMA_BASH], think=True)
    check(again.done, "the tool result is accepted")
    print("ok: ollama tool call round trip (the client's own Message sent back)")


def anthropic_checks(plain, tool):
    c = anthropic.Anthropic(base_url=plain, api_key="not-needed", max_retries=0)
    msgs = [{"role": "user", "content": "Say something."}]
    # The SDK no longer takes `temperature` (Anthropic's newest models fix it); the API field
    # goes in the body.
    greedy = {"temperature": 0}
    m = c.messages.create(model=MODEL, max_tokens=8, system="Be brief.", messages=msgs, extra_body=greedy)
    check(m.role == "assistant" and m.stop_reason in ("end_turn", "max_tokens"), f"message: {m}")
    check(m.usage.output_tokens > 0, f"usage {m.usage}")
    text = "".join(b.text for b in m.content if b.type == "text")
    with c.messages.stream(model=MODEL, max_tokens=8, system="Be brief.", messages=msgs, extra_body=greedy) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    check(streamed == text, f"streamed {streamed!r} vs {text!r}")
    check(final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens,
          f"final {final}")
    print("ok: anthropic messages, whole and streamed")

    n = c.messages.count_tokens(model=MODEL, system="Be brief.", messages=msgs)
    check(n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), f"count {n} vs {m.usage}")
    print("ok: anthropic count_tokens")

    for kind, call, what in [
        (anthropic.NotFoundError, lambda: c.messages.create(model="claude-sonnet-4-5", max_tokens=5, messages=msgs),
         "unknown model"),
        (anthropic.BadRequestError, lambda: c.messages.create(model=MODEL, max_tokens=5, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                        "data": "aGk="}}]}]), "an image block"),
    ]:
        try:
            call()
            check(False, f"{what} must fail")
        except kind as e:
            check(e.body["type"] == "error" and e.body["error"]["message"], f"{what}: {e.body}")
        print(f"ok: anthropic error {what} -> {kind.__name__}")

    t = anthropic.Anthropic(base_url=tool, api_key="not-needed", max_retries=0)
    ask = [{"role": "user", "content": "List files."}]
    think = {"type": "enabled", "budget_tokens": 1024}
    m = t.messages.create(model=MODEL, max_tokens=200, tools=[BASH], thinking=think, messages=ask)
    check([b.type for b in m.content] == ["thinking", "tool_use"] and m.stop_reason == "tool_use", f"{m}")
    use = m.content[1]
    check(use.name == "Bash" and use.input == {"command": "ls -la", "timeout": 30}, f"tool_use {use}")
    with t.messages.stream(model=MODEL, max_tokens=200, tools=[BASH], thinking=think, messages=ask) as s:
        final = s.get_final_message()
    check(final.content[1].input == use.input, f"streamed tool_use {final.content}")
    history = ask + [{"role": "assistant", "content": m.content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": "a.py\nb.py"}]}]
    again = t.messages.create(model=MODEL, max_tokens=200, tools=[BASH], thinking=think, messages=history)
    check(again.role == "assistant", "the tool result is accepted")
    print("ok: anthropic tool_use round trip (the SDK's own blocks sent back)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--plain", required=True)
    p.add_argument("--tool", required=True)
    a = p.parse_args()
    ollama_checks(a.plain, a.tool)
    anthropic_checks(a.plain, a.tool)
    print("all checks passed")


if __name__ == "__main__":
    main()
