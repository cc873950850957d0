#!/usr/bin/env bash
# Fetches llama.cpp's tokenizer test vocabularies into models/llama-vocabs/ (git-ignored):
# `ggml-vocab-NAME.gguf` (the tokenizer metadata of a real model, no weights) with its
# `.inp` (texts) and `.out` (the token ids the model's own Hugging Face tokenizer gives them),
# as llama.cpp keeps them in models/ for its test-tokenizer-0. They come from the llama.cpp
# vendored in the llama-cpp-python 0.3.36 sdist on PyPI (76 MB, ~8 s), or from the copy
# scripts/setup-llama-reference.sh already downloaded. crates/model/tests/llama_cpp_vocabs.rs
# reads them. Also llama.cpp's collection of real models' chat templates (models/templates/,
# ~70 files) into models/llama-templates/, for crates/model/tests/llama_cpp_templates.rs.
# Idempotent: does nothing when the last file is there.
set -euo pipefail
cd "$(dirname "$0")/.."
out=models/llama-vocabs
names=(gpt-2 mpt starcoder refact command-r llama-bpe qwen2 qwen35 deepseek-coder deepseek-llm
    llama-spm phi-3)
templates=models/llama-templates
last="$templates/.complete"
[ -f "$last" ] && exit 0

sdist=.venv-llama/sdist/llama_cpp_python-0.3.36.tar.gz
tmp=""
if [ ! -f "$sdist" ]; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
        llama-cpp-python==0.3.36 -d "$tmp"
    sdist="$tmp/llama_cpp_python-0.3.36.tar.gz"
fi
mkdir -p "$out"
members=()
for n in "${names[@]}"; do
    for ext in gguf gguf.inp gguf.out; do
        members+=("llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-$n.$ext")
    done
done
tar -xzf "$sdist" -C "$out" --strip-components=4 "${members[@]}"
mkdir -p "$templates"
tar -xzf "$sdist" -C "$templates" --strip-components=5 --wildcards \
    'llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/*.jinja'
# Written last, so a download cut short is fetched again next time.
touch "$last"
echo "llama.cpp tokenizer vocabularies in $out, chat templates in $templates"
