#!/usr/bin/env bash
# Regenerates the frognano-swe grader-parity goldens with the official swebench==5.0.2
# and re-checks FrogNano against them. Idempotent: the venv (.venv-swe, git-ignored) is
# created once. CI does not need this: `cargo test -p frognano-swe` checks the committed
# goldens; run this when the corpus or the pinned swebench version changes, then review
# `git diff crates/swe/tests/parity`.
# The non-Python real logs need node + npm (jest, vitest and mocha are installed once into
# .venv-swe/js from scripts/swe_parity_fixtures/jsproj/package.json), g++ with googletest
# (Debian libgtest-dev) and doctest (doctest-dev), and mvn; a missing tool drops its cases
# from the regenerated goldens, so check `git status` before committing them.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-swe
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import swebench, pytest' 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q 'swebench==5.0.2' 'pytest>=8'
fi
PYTHONUTF8=1 "$VENV/bin/python" scripts/swe_parity.py
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-swe}" cargo test -p frognano-swe --test parity
