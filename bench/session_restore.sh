#!/usr/bin/env bash
# Restoring a long conversation from disk (issue 19 item 3): saves a TOKENS-position state of
# MODEL into a session store (random keys, values and recurrent state: the timing does not
# depend on them), then, in a new process as after a restart, loads the model, restores the
# state for the history plus one token and runs that token (crates/engine/examples/
# session_restore.rs). Prints the file size, the times, and what prefilling the history would
# take instead. Run twice: the first restore may read the file from disk, later ones from the
# page cache (both are printed; drop caches as root to see a cold read: sync; echo 3 >
# /proc/sys/vm/drop_caches).
#   bench/session_restore.sh [MODEL.gguf] [--tokens 32768] [--kv-cache f16]
set -euo pipefail
cd "$(dirname "$0")/.."
model=bench/out/qwen35-4b-random-Q4_K_M.gguf
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then model=$1; shift; fi
tokens=32768
while [ $# -gt 0 ]; do
    case $1 in
        --tokens) tokens=${2:?--tokens needs a value}; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -f "$model" ] || { echo "no model at $model (bench/make_random_qwen35_4b_gguf.py makes the 4B-shape one)" >&2; exit 1; }
cargo build --release -q -p frognano-engine --example session_restore
bin=target/release/examples/session_restore
dir=$(mktemp -d "${TMPDIR:-/tmp}/frognano-sessions.XXXXXX")
trap 'rm -rf "$dir"' EXIT
echo "model $model, $tokens tokens of history"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "simd: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512bw|avx512vnni|fma|f16c)$' | sort -u | tr '\n' ' ')"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin" save "$model" "$dir" "$tokens"
du -sh "$dir" | cut -f1 | sed 's/^/store on disk: /'
for run in 1 2; do
    echo "restore $run: $("$bin" restore "$model" "$dir" "$tokens")"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
