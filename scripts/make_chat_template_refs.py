#!/usr/bin/env python3
"""Reference chat-template renders for crates/model/tests/chat_template.rs.

Renders each case with transformers' own `apply_chat_template(..., tokenize=False)` (jinja2)
and writes fixtures/tokenizer/{qwen35,chatml}_renders.json: a list of
  {"name", "messages", "tools", "add_generation_prompt", "kwargs", "expected"}
or, for conversations the template rejects, "error" (the exception's message) instead of
"expected". The Rust tests render the same inputs with minijinja and compare byte for byte.

Qwen3.5 uses fixtures/tokenizer/qwen35/ (template + tokenizer_config.json); when
models/qwen35-tokenizer/tokenizer.json exists (scripts/make_qwen35_tokenizer.py) it is loaded
with AutoTokenizer, else a stand-in tokenizer with the same special tokens is used (the
rendered text does not depend on the vocabulary). ChatML uses fixtures/tokenizer/chatml/.

Needs transformers==5.23.0 (torch not required). Developer tool; the outputs are committed.
Usage: python scripts/make_chat_template_refs.py
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures" / "tokenizer"

BASH = {
    "type": "function",
    "function": {
        "name": "Bash",
        "description": "Run a shell command in the repository workdir.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "Command to run."}},
            "required": ["command"],
        },
    },
}
READ = {
    "type": "function",
    "function": {
        "name": "Read",
        "description": "Read a file; <path> & \"quotes\" stay literal — ünïcödé too.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "offset": {"type": "integer", "minimum": 0, "default": 0},
                "ratio": {"type": "number", "default": 0.5},
                "flags": {"type": "array", "items": {"type": "boolean"}},
            },
            "required": ["path"],
        },
    },
}


def call(name, arguments, id_="call_1"):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def qwen_cases():
    sys_agent = {"role": "system", "content": "You are a software-engineering agent."}
    tool_round = [
        {"role": "user", "content": "List files."},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I should run ls.",
            "tool_calls": [call("Bash", {"command": "ls -la", "timeout": 30})],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"},
    ]
    cases = [
        ("plain_default", [{"role": "user", "content": "Hi"}], None, True, {}),
        ("plain_thinking_true", [{"role": "user", "content": "Hi"}], None, True, {"enable_thinking": True}),
        ("plain_thinking_false", [{"role": "user", "content": "Hi"}], None, True, {"enable_thinking": False}),
        ("no_generation_prompt", [{"role": "user", "content": "  Hi there \n"}], None, False, {}),
        ("doc_example_tools_tool_round", [sys_agent] + tool_round, [BASH], True, {"enable_thinking": True}),
        ("tools_without_system", tool_round, [BASH, READ], True, {}),
        ("tools_with_blank_system", [{"role": "system", "content": "  \n"}] + tool_round, [BASH], True, {}),
        ("system_without_tools", [{"role": "system", "content": "\n Be brief. \n"}, {"role": "user", "content": "Hi"}],
         None, True, {"enable_thinking": False}),
        (
            "reasoning_dropped_from_earlier_turns",
            [
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4", "reasoning_content": "Simple sum."},
                {"role": "user", "content": "And 3+3?"},
                {"role": "assistant", "content": "<think>\nInline reasoning.\n</think>\n\nLet me check.",
                 "tool_calls": [call("Bash", {"command": "echo $((3+3))"})]},
                {"role": "tool", "content": "6"},
                {"role": "assistant", "content": "It is 6.", "reasoning_content": "  The tool said 6.  "},
            ],
            [BASH],
            True,
            {"enable_thinking": True},
        ),
        (
            "think_in_content_of_old_turn",
            [
                {"role": "user", "content": "q1"},
                {"role": "assistant", "content": "<think>old</think>answer one"},
                {"role": "user", "content": "q2"},
            ],
            None,
            True,
            {},
        ),
        (
            "consecutive_tool_responses_merged",
            [
                {"role": "user", "content": "Read both files."},
                {
                    "role": "assistant",
                    "content": "Reading them now.",
                    "tool_calls": [
                        call("Read", {"path": "a.py"}, "c1"),
                        call("Read", {"path": "b.py", "offset": 10}, "c2"),
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "print('a')\n"},
                {"role": "tool", "tool_call_id": "c2", "content": "  print('b')  "},
                {"role": "assistant", "content": "Both print."},
                {"role": "user", "content": "Thanks"},
            ],
            [READ],
            True,
            {"enable_thinking": True},
        ),
        (
            "argument_value_types",
            [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        call(
                            "Read",
                            {
                                "path": "dir/ünï.py",
                                "offset": 10,
                                "ratio": 0.5,
                                "big": 1e16,
                                "small": 1.5e-05,
                                "whole": 2.0,
                                "flag": True,
                                "off": False,
                                "nothing": None,
                                "opts": {"a": [1, 2], "b": "<x & 'y'>"},
                                "flags": [True, "é", None],
                                "multiline": "line1\nline2",
                            },
                        )
                    ],
                },
            ],
            [READ],
            False,
            {},
        ),
        (
            "string_arguments_render_no_parameters",
            [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": "", "tool_calls": [call("Bash", "{\"command\": \"ls\"}")]},
            ],
            [BASH],
            False,
            {},
        ),
        (
            "list_of_parts_content",
            [
                {"role": "system", "content": [{"type": "text", "text": "Sys from parts."}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Look: "},
                        {"type": "image_url", "image_url": {"url": "file:///tmp/x.png"}},
                        {"type": "text", "text": " and "},
                        {"type": "video", "video": "clip.mp4"},
                        {"type": "text", "text": " ok"},
                    ],
                },
            ],
            None,
            True,
            {"add_vision_id": True},
        ),
        (
            "tool_call_without_function_wrapper",
            [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": "Sure.",
                 "tool_calls": [{"name": "Bash", "arguments": {"command": "pwd"}}]},
                {"role": "tool", "content": "/repo"},
            ],
            [BASH],
            True,
            {},
        ),
        ("error_system_not_first",
         [{"role": "user", "content": "Hi"}, {"role": "system", "content": "late"}], None, True, {}),
        ("error_no_user_query",
         [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}], None, True, {}),
        ("error_unknown_role", [{"role": "user", "content": "Hi"}, {"role": "narrator", "content": "x"}], None, True, {}),
    ]
    return cases


def chatml_cases():
    return [
        ("default_system_prompt", [{"role": "user", "content": "  Hello  "}], None, True, {}),
        (
            "system_parts_and_tool_calls",
            [
                {"role": "system", "content": "Be terse."},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]},
                {
                    "role": "assistant",
                    "content": "calling",
                    "tool_calls": [call("Read", {"path": "x", "n": 3, "f": 0.25, "ok": True, "z": None,
                                                 "d": {"k": ["v", 1.0]}})],
                },
                {"role": "user", "content": "thanks"},
            ],
            [READ, BASH],
            True,
            {"prefill": "Sure"},
        ),
        ("no_generation_prompt", [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
         None, False, {}),
    ]


def render_all(tok, cases):
    out = []
    for name, messages, tools, agp, kwargs in cases:
        case = {"name": name, "messages": messages, "tools": tools, "add_generation_prompt": agp, "kwargs": kwargs}
        try:
            case["expected"] = tok.apply_chat_template(
                messages, tools=tools, add_generation_prompt=agp, tokenize=False, **kwargs
            )
        except Exception as e:  # the template's raise_exception → jinja2 TemplateError
            case["error"] = str(e)
        out.append(case)
    return out


def standin_tokenizer(config_path: Path, template: str):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    config = json.loads(config_path.read_text())
    inner = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    special = {k: config[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if config.get(k)}
    return PreTrainedTokenizerFast(tokenizer_object=inner, chat_template=template, **special)


def write(path: Path, cases):
    path.write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({len(cases)} cases)")


def main():
    import transformers

    print("transformers", transformers.__version__)
    built = ROOT / "models" / "qwen35-tokenizer"
    qwen_template = (FIX / "qwen35" / "chat_template.jinja").read_text()
    if (built / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        qwen = AutoTokenizer.from_pretrained(str(built))
        assert qwen.chat_template == qwen_template, "models/qwen35-tokenizer is stale; rerun make_qwen35_tokenizer.py"
    else:
        qwen = standin_tokenizer(FIX / "qwen35" / "tokenizer_config.json", qwen_template)
    write(FIX / "qwen35_renders.json", render_all(qwen, qwen_cases()))

    chatml = standin_tokenizer(
        FIX / "chatml" / "tokenizer_config.json", (FIX / "chatml" / "chat_template.jinja").read_text()
    )
    write(FIX / "chatml_renders.json", render_all(chatml, chatml_cases()))


if __name__ == "__main__":
    main()
