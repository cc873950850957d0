#!/usr/bin/env bash
# Creates .venv-ray (git-ignored) with Ray, the Python side of `frognano eval … --ray`
# (scaleout/ray_driver.py), and the Kubernetes client whose models scaleout/validate_manifests.py
# checks the manifests in scaleout/k8s/ against. Idempotent: does nothing when both import.
# Use it with FROGNANO_RAY_PYTHON=.venv-ray/bin/python, or `source .venv-ray/bin/activate`.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-ray
# Keep in step with scaleout/Dockerfile: the driver's and the workers' Ray must be the same.
ray_version=2.40.0
k8s_version=37.0.2
if "$venv/bin/python" -c "import ray, kubernetes, yaml; assert ray.__version__ == '$ray_version'" >/dev/null 2>&1; then
    exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "ray==$ray_version" "kubernetes==$k8s_version" pyyaml
