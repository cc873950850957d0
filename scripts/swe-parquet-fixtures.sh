#!/usr/bin/env bash
# Regenerates crates/swe/tests/fixtures/parquet/ (small SWE-bench-shaped parquet files) with
# pyarrow and Hugging Face `datasets` in the git-ignored venv .venv-swe (shared with scripts/swe-parity.sh). Not needed
# for CI: the files are committed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-swe
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import pyarrow, datasets' 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q 'pyarrow>=15' 'datasets>=3'
fi
"$VENV/bin/python" scripts/swe_parquet_fixtures.py
