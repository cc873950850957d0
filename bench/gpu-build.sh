#!/usr/bin/env bash
# Builds, on this machine, what bench/gpu.sh runs on the GPU machine (which has no Rust): the
# release `frognano`, the `gpu_speed` example and the frognano-gpu test binaries, stripped,
# into bench/gpu-bin/ (git-ignored, under the 64 MiB a device run can carry), plus the
# flash-linear-attention wheels for the transformers peer, packed into bench/gpu-bin/pack.tar.xz.
# Then, from the session:
#   run(command="bash bench/gpu.sh", carry=["bench/gpu-bin"], timeout_s=…)
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/gpu-bin
rm -rf "$out"
mkdir -p "$out/wheels"
cargo build --release -p frognano --bin frognano
cargo build --release -p frognano-gpu --example gpu_speed
cp target/release/frognano target/release/examples/gpu_speed "$out/"
# The test binaries cargo builds for frognano-gpu (the JSON names each executable).
cargo test --release -p frognano-gpu --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        name = "test-" + m["target"]["name"]
        shutil.copy(m["executable"], sys.argv[1] + "/" + name)
        print(name)
' "$out"
strip "$out"/frognano "$out"/gpu_speed "$out"/test-*
python3 -m pip download --quiet --no-deps -d "$out/wheels" "flash-linear-attention==0.6.0" "fla-core==0.6.0" ||
    echo "note: the flash-linear-attention wheels could not be fetched; the peer runs without them"
# Packed: the binaries compress about 4x, and a device run carries at most 64 MiB.
tar -C "$out" -cJf "$out.tar.xz" .
rm -rf "$out"
mkdir -p "$out"
mv "$out.tar.xz" "$out/pack.tar.xz"
ls -la "$out"
