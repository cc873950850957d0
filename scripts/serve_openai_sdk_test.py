#!/usr/bin/env python3
"""Drives `frognano serve` with the official `openai` Python SDK.

Run by crates/serve/tests/openai_sdk.rs, which starts two servers in-process:
  --plain URL  the tiny random checkpoint (ChatML template): plain chat, streaming, logprobs,
               completions, errors;
  --tool URL   a scripted model with the Qwen3.5 template that always answers with reasoning
               and one Bash tool call: the tool-call round trip, streaming tool-call deltas.
Then presence_penalty / frequency_penalty / logit_bias and a base URL without /v1 on the plain
server, and the tool server's reply sent back verbatim (`model_dump()`, content None) plus
list-of-parts content for every role, on the plain server's string-only ChatML template.
Structured outputs run on the plain server: its random weights write valid JSON and calls
only because the grammar allows nothing else (`parse()` with a pydantic model, json_object,
tool_choice required and named).
Exits non-zero on the first failed check; prints one `ok:` line per check.
"""

import argparse
import json
import sys
import urllib.error
import urllib.request

import typing

import openai
import pydantic

BASH = {
    "type": "function",
    "function": {
        "name": "Bash",
        "description": "Run a shell command in the repository workdir.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "Command to run."},
                "timeout": {"type": "integer", "description": "Seconds."},
            },
            "required": ["command"],
        },
    },
}
MODEL = "qwen35-tiny"
THINK = {"chat_template_kwargs": {"enable_thinking": True}}


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def expect_error(kind, fn, needle, what):
    try:
        fn()
    except kind as e:
        msg = str(e)
        check(needle in msg, f"{what}: {needle!r} not in {msg!r}")
        print(f"ok: error {what} -> {type(e).__name__}")
        return e
    check(False, f"{what}: expected {kind.__name__}")


def plain_checks(url):
    c = openai.OpenAI(base_url=url + "/v1", api_key="not-needed", max_retries=0)
    models = c.models.list()
    check([m.id for m in models.data] == [MODEL], f"models: {models}")
    print("ok: models.list")

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
    r = c.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=10, seed=1)
    text = r.choices[0].message.content
    check(isinstance(text, str), "content is a string")
    check(r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason)
    check(r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 10, f"usage {r.usage}")
    check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "total_tokens")
    print("ok: chat non-streaming")

    r2 = c.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=10)
    check(r2.choices[0].message.content == text, "greedy is deterministic")
    check(r2.usage.prompt_tokens_details.cached_tokens == r2.usage.prompt_tokens, f"cached {r2.usage}")
    print("ok: prompt reused (cached_tokens)")

    streamed, finish, usage = "", None, None
    for chunk in c.chat.completions.create(
        model=MODEL, messages=msgs, temperature=0, max_tokens=10, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            streamed += ch.delta.content or ""
            finish = ch.finish_reason or finish
    check(streamed == text, f"streamed {streamed!r} vs {text!r} (the same text, untrimmed)")
    check(finish == r.choices[0].finish_reason, f"finish {finish}")
    check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, f"usage {usage}")
    print("ok: chat streaming")

    r = c.chat.completions.create(
        model=MODEL, messages=msgs, temperature=0, max_tokens=6, logprobs=True, top_logprobs=2
    )
    lps = r.choices[0].logprobs.content
    check(len(lps) >= 1, "logprobs present")
    for lp in lps:
        check(lp.logprob <= 0 and len(lp.top_logprobs) == 2, f"logprob entry {lp}")
        check(lp.top_logprobs[0].token == lp.token, "greedy picks the top token")
    print("ok: chat logprobs")

    r = c.completions.create(model=MODEL, prompt="The frog", max_tokens=4, temperature=0, logprobs=2)
    check(isinstance(r.choices[0].text, str), "completion text")
    check(len(r.choices[0].logprobs.tokens) == len(r.choices[0].logprobs.token_logprobs), "completion logprobs")
    print("ok: completions with logprobs")

    streamed = "".join(
        ch.text for chunk in c.completions.create(model=MODEL, prompt="The frog", max_tokens=4, temperature=0,
                                                   stream=True) for ch in chunk.choices
    )
    check(streamed == r.choices[0].text, f"completion stream {streamed!r} vs {r.choices[0].text!r}")
    print("ok: completions streaming")

    e = expect_error(openai.NotFoundError, lambda: c.chat.completions.create(model="gpt-4o", messages=msgs),
                     "gpt-4o", "unknown model")
    check(e.code == "model_not_found", f"code {e.code}")
    long = [{"role": "user", "content": "frog " * 5000}]
    expect_error(openai.BadRequestError, lambda: c.chat.completions.create(model=MODEL, messages=long),
                 "maximum context length", "prompt too long")
    bad_tool = {"type": "function", "function": {"name": "bad name", "parameters": {"type": "object"}}}
    expect_error(openai.BadRequestError,
                 lambda: c.chat.completions.create(model=MODEL, messages=msgs, tools=[bad_tool]),
                 "tools[0].function.name", "invalid tool schema")
    expect_error(openai.BadRequestError,
                 lambda: c.chat.completions.create(model=MODEL, messages=msgs, temperature="hot"),
                 "temperature", "wrong type")
    req = urllib.request.Request(url + "/v1/chat/completions", data=b'{"messages": [', method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req)
        check(False, "malformed JSON must fail")
    except urllib.error.HTTPError as e:
        body = json.loads(e.read())
        check(e.code == 400 and "not valid JSON" in body["error"]["message"], f"malformed JSON: {body}")
    print("ok: error malformed JSON -> 400")
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2)
    check(r.choices[0].message is not None, "still serving after errors")
    print("ok: still serving after errors")

    openai_parameters(c, msgs)
    bare = openai.OpenAI(base_url=url, api_key="not-needed", max_retries=0)
    r = bare.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=10, seed=1)
    check(r.choices[0].message.content == text, "the same reply without /v1 in the base URL")
    check([m.id for m in bare.models.list().data] == [MODEL], "models without /v1")
    print("ok: base URL without /v1")


def openai_parameters(c, msgs):
    """presence_penalty, frequency_penalty and logit_bias as the SDK sends them."""
    frog, piece = first_token(c, " frog")
    r = c.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=4,
                                  logit_bias={str(frog): 100})
    check(r.choices[0].message.content == piece * 4, f"logit_bias +100 forces {piece!r}: {r.choices[0].message}")
    r = c.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=6,
                                  presence_penalty=1.0, frequency_penalty=0.5)
    check(isinstance(r.choices[0].message.content, str), "penalties accepted")
    expect_error(openai.BadRequestError,
                 lambda: c.chat.completions.create(model=MODEL, messages=msgs, logit_bias={"frog": 1}),
                 'logit_bias key "frog" is not a token id', "logit_bias with a bad key")
    expect_error(openai.BadRequestError,
                 lambda: c.chat.completions.create(model=MODEL, messages=msgs, frequency_penalty=3),
                 "frequency_penalty must be in [-2, 2]", "frequency_penalty out of range")
    print("ok: presence_penalty, frequency_penalty, logit_bias")


def first_token(c, text):
    """The id of the first token of `text` and that token's text, from the server's
    /tokenize and /detokenize."""
    base = str(c.base_url).rstrip("/").removesuffix("/v1")

    def call(path, body):
        req = urllib.request.Request(base + path, method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps(body).encode())
        return json.loads(urllib.request.urlopen(req).read())
    token = call("/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"][0]
    return token, call("/detokenize", {"tokens": [token]})["prompt"]


def echo_checks(tool_url, plain_url):
    """An agent's second turn on a template without tool-call or list-content support (the
    plain server's ChatML): the tool server's reply sent back exactly as the SDK dumps it
    (`content: None`, `refusal`, `annotations`, …), and list-of-parts content for every role."""
    tool = openai.OpenAI(base_url=tool_url + "/v1", api_key="not-needed", max_retries=0)
    plain = openai.OpenAI(base_url=plain_url + "/v1", api_key="not-needed", max_retries=0)
    msgs = [{"role": "user", "content": "List files."}]
    m = tool.chat.completions.create(model=MODEL, messages=msgs, tools=[BASH], extra_body=THINK).choices[0].message
    check(m.content is None and m.tool_calls, f"a tool-only reply: {m}")
    dumped = m.model_dump()
    check("content" in dumped and dumped["content"] is None, f"the SDK sends content None: {dumped}")
    history = msgs + [dumped, {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "a.py\nb.py"}]
    r = plain.chat.completions.create(model=MODEL, messages=history, tools=[BASH], max_tokens=4)
    check(r.choices[0].message is not None, "the echoed tool-only turn is accepted")
    print("ok: a tool-only assistant turn sent back verbatim (model_dump) on a string-only template")

    def parts(text):
        return [{"type": "text", "text": text}]
    as_parts = [
        {"role": "system", "content": parts("Be brief.")},
        {"role": "user", "content": parts("List files.")},
        {**dumped, "content": parts("")},
        {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": parts("a.py\nb.py")},
    ]
    as_text = [{**x, "content": x["content"][0]["text"]} for x in as_parts]
    a = plain.chat.completions.create(model=MODEL, messages=as_parts, tools=[BASH], max_tokens=6, temperature=0)
    b = plain.chat.completions.create(model=MODEL, messages=as_text, tools=[BASH], max_tokens=6, temperature=0)
    check(a.choices[0].message.content == b.choices[0].message.content, "parts read as their text")
    expect_error(openai.BadRequestError,
                 lambda: plain.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]),
                 '"image_url"', "an image part")
    print("ok: list-of-parts content for every role")


def tool_checks(url):
    c = openai.OpenAI(base_url=url + "/v1", api_key="not-needed", max_retries=0)
    msgs = [
        {"role": "system", "content": "You are a software-engineering agent."},
        {"role": "user", "content": "List files."},
    ]
    r = c.chat.completions.create(model=MODEL, messages=msgs, tools=[BASH], extra_body=THINK)
    m = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls", r.choices[0].finish_reason)
    check(m.content is None, f"content {m.content!r}")
    check(getattr(m, "reasoning_content", None) == "Let me list the files.\n", f"reasoning {m}")
    call = m.tool_calls[0]
    check(call.function.name == "Bash", call.function.name)
    check(json.loads(call.function.arguments) == {"command": "ls -la", "timeout": 30}, call.function.arguments)
    print("ok: tool call (non-streaming)")

    calls, reasoning = {}, ""
    for chunk in c.chat.completions.create(model=MODEL, messages=msgs, tools=[BASH], extra_body=THINK, stream=True):
        for ch in chunk.choices:
            reasoning += getattr(ch.delta, "reasoning_content", None) or ""
            for tc in ch.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                slot["name"] += (tc.function.name or "") if tc.function else ""
                slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
    check(reasoning == m.reasoning_content, f"streamed reasoning {reasoning!r}")
    check(len(calls) == 1 and calls[0]["name"] == "Bash" and calls[0]["id"], f"streamed calls {calls}")
    check(json.loads(calls[0]["arguments"]) == {"command": "ls -la", "timeout": 30}, calls[0]["arguments"])
    print("ok: tool call (streaming deltas)")

    history = msgs + [
        m.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.py\nb.py"},
    ]
    r2 = c.chat.completions.create(model=MODEL, messages=history, tools=[BASH], extra_body=THINK)
    check(r2.choices[0].message.tool_calls[0].function.name == "Bash", "second turn")
    check(r2.usage.prompt_tokens_details.cached_tokens > 0, f"follow-up reuses the prefix: {r2.usage}")
    print("ok: tool round trip with a tool result (prefix reused: "
          f"{r2.usage.prompt_tokens_details.cached_tokens}/{r2.usage.prompt_tokens} tokens)")


class Person(pydantic.BaseModel):
    """What `parse()` must fill in: bounded strings and integers, so even random weights end."""

    name: str = pydantic.Field(max_length=12)
    color: typing.Literal["red", "green", "blue"]
    age: int = pydantic.Field(ge=0, le=120)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    },
}


def structured_checks(url):
    c = openai.OpenAI(base_url=url + "/v1", api_key="not-needed", max_retries=0)
    msgs = [{"role": "user", "content": "Invent a person."}]
    for seed in range(3):
        r = c.chat.completions.parse(model=MODEL, messages=msgs, response_format=Person, temperature=1.0,
                                     seed=seed, max_tokens=300)
        p = r.choices[0].message.parsed
        check(isinstance(p, Person), f"parse() gave {r.choices[0].message}")
        check(r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)
    print(f"ok: chat.completions.parse with a pydantic model (last: {p!r})")

    r = c.chat.completions.create(model=MODEL, messages=msgs, response_format={"type": "json_object"},
                                  temperature=0, max_tokens=300)
    if r.choices[0].finish_reason == "stop":
        check(isinstance(json.loads(r.choices[0].message.content), dict), r.choices[0].message.content)
    else:  # any object's strings are unbounded: a random model may still be inside one
        check(r.choices[0].finish_reason == "length", r.choices[0].finish_reason)
    print(f"ok: response_format json_object ({r.choices[0].finish_reason})")

    tools = [BASH, WEATHER]
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = c.chat.completions.create(model=MODEL, messages=msgs, tools=tools, tool_choice=named, temperature=1.0,
                                  seed=3, max_tokens=300)
    check(r.choices[0].finish_reason == "tool_calls", r.choices[0].finish_reason)
    call = r.choices[0].message.tool_calls[0]
    args = json.loads(call.function.arguments)
    check(call.function.name == "get_weather" and args["unit"] in ("c", "f"), f"{call}")
    print(f"ok: tool_choice named -> {call.function.name}({call.function.arguments})")

    expect_error(openai.BadRequestError,
                 lambda: c.chat.completions.create(model=MODEL, messages=msgs, response_format={
                     "type": "json_schema", "json_schema": {"name": "X", "schema": {"type": "frog"}}}),
                 "response_format.json_schema.schema", "unenforceable schema")


def responses_checks(plain_url, tool_url):
    """The Responses API, what Codex speaks: create, stream, parse(), and the function-call
    round trip with the SDK's own output items sent back."""
    c = openai.OpenAI(base_url=plain_url + "/v1", api_key="not-needed", max_retries=0)
    ask = dict(model=MODEL, instructions="Be brief.", input="Say something.", temperature=0, max_output_tokens=10)
    r = c.responses.create(**ask)
    check(r.status in ("completed", "incomplete") and isinstance(r.output_text, str), f"responses.create: {r}")
    check(r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 10, f"usage {r.usage}")
    check(r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, f"usage {r.usage}")
    print("ok: responses.create")

    # A reply cut by max_output_tokens ends with `response.incomplete`, as OpenAI's does (the
    # SDK's get_final_response() wants `response.completed`), so the last event is read.
    deltas, final = "", None
    with c.responses.stream(**ask) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas += event.delta
            elif event.type in ("response.completed", "response.incomplete"):
                final = event.response
    check(final is not None and final.status == r.status, f"final {final} vs status {r.status}")
    check(deltas == r.output_text and final.output_text == r.output_text, f"streamed {deltas!r} vs {r.output_text!r}")
    if r.status == "completed":
        with c.responses.stream(**ask) as stream:
            check(stream.get_final_response().output_text == r.output_text, "get_final_response")
    print(f"ok: responses.stream ({r.status})")

    p = c.responses.parse(model=MODEL, input="Invent a person.", text_format=Person, temperature=1.0,
                          max_output_tokens=300)
    check(isinstance(p.output_parsed, Person), f"responses.parse gave {p.output}")
    print(f"ok: responses.parse with a pydantic model ({p.output_parsed!r})")

    t = openai.OpenAI(base_url=tool_url + "/v1", api_key="not-needed", max_retries=0)
    tool = {"type": "function", "name": "Bash", "description": BASH["function"]["description"],
            "parameters": BASH["function"]["parameters"]}
    r = t.responses.create(model=MODEL, input="List files.", tools=[tool], reasoning={"effort": "medium"})
    calls = [o for o in r.output if o.type == "function_call"]
    check(len(calls) == 1 and calls[0].name == "Bash", f"function calls: {r.output}")
    check(json.loads(calls[0].arguments) == {"command": "ls -la", "timeout": 30}, calls[0].arguments)
    history = ([{"role": "user", "content": "List files."}] + [o.model_dump(exclude_none=True) for o in r.output]
               + [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "a.py\nb.py"}])
    r2 = t.responses.create(model=MODEL, input=history, tools=[tool], reasoning={"effort": "medium"})
    check(r2.status == "completed", f"second turn: {r2}")
    check(r2.usage.input_tokens_details.cached_tokens > 0, f"follow-up reuses the prefix: {r2.usage}")
    print("ok: responses function_call round trip (the SDK's own items sent back)")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--plain", required=True)
    ap.add_argument("--tool", required=True)
    a = ap.parse_args()
    plain_checks(a.plain.rstrip("/"))
    structured_checks(a.plain.rstrip("/"))
    tool_checks(a.tool.rstrip("/"))
    echo_checks(a.tool.rstrip("/"), a.plain.rstrip("/"))
    responses_checks(a.plain.rstrip("/"), a.tool.rstrip("/"))
    print(f"all checks passed (openai {openai.__version__})")


if __name__ == "__main__":
    main()
