#!/usr/bin/env bash
# Regenerates fixtures/qwen35-* with transformers==5.23.0 + torch on CPU, in the venv of
# scripts/setup-torch-reference.sh (about 4 GB of wheels; only needed to change the fixtures,
# never by the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-torch-reference.sh
"${FROGNANO_REF_VENV:-.venv-ref-torch}/bin/python" scripts/make_qwen35_fixtures.py
