#!/usr/bin/env bash
# Regenerates fixtures/qwen35-* with transformers==5.23.0 + torch on CPU (about 4 GB of
# wheels; only needed to change the fixtures, never by the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${FROGNANO_REF_VENV:-.venv-ref-torch}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "transformers==5.23.0" torch safetensors numpy tokenizers
fi
"$VENV/bin/python" scripts/make_qwen35_fixtures.py
