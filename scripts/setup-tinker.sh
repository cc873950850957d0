#!/usr/bin/env bash
# Creates .venv-tinker (git-ignored) with SkyRL tx, a Tinker-compatible training server on
# JAX (CPU here), for the end-to-end run of `frognano train --trainer tinker`
# (bench/tinker_e2e.sh). Idempotent: does nothing when it imports. About 7 GB (peft pulls
# in torch). Not part of CI: the run is behind FROGNANO_TINKER_E2E (docs/scale-out.md §3).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-tinker
skyrl_version=0.3.0
if "$venv/bin/python" -c "import importlib.metadata as m, tx.tinker.api; assert m.version('skyrl-tx') == '$skyrl_version'" >/dev/null 2>&1; then
    exit 0
fi
python3 -m venv "$venv"
# The `jax` extra asks for jax[cuda12]; the CPU wheels are named directly instead.
"$venv/bin/pip" install --quiet --disable-pip-version-check "skyrl-tx[tinker]==$skyrl_version" \
    "jax>=0.8,<1.0" "flax>=0.12.2" "optax>=0.2.5"
# The API server starts its engine as `uv run --extra tinker --extra jax -m tx.tinker.engine …`,
# which needs SkyRL's source checkout; this stand-in runs the module with the venv's Python.
cat >"$venv/bin/uv" <<'SH'
#!/bin/sh
# Stand-in for `uv run … -m MODULE ARGS` (scripts/setup-tinker.sh): runs MODULE with this venv.
while [ $# -gt 0 ] && [ "$1" != "-m" ]; do shift; done
exec "$(dirname "$0")/python" "$@"
SH
chmod +x "$venv/bin/uv"
