#!/usr/bin/env bash
# Creates the git-ignored venv .venv-ref-torch (override with FROGNANO_REF_VENV) with
# transformers==5.23.0, torch (CPU), safetensors, numpy and tokenizers: about 4 GB of wheels.
# Used by scripts/make-qwen35-fixtures.sh (the transformers reference outputs), by
# bench/qwen35_4b_cpu.sh (transformers' speed) and, as the Python that runs llama.cpp's
# convert_hf_to_gguf.py (it imports torch and transformers), by scripts/llama_reference.py and
# bench/gguf_speed.sh --qwen35-4b. Never needed by the tests. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${FROGNANO_REF_VENV:-.venv-ref-torch}
if "$VENV/bin/python" -c 'import torch, transformers; assert transformers.__version__ == "5.23.0"' 2>/dev/null; then
    echo "transformers 5.23.0 + torch already in $VENV"
    exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "transformers==5.23.0" torch safetensors numpy tokenizers
