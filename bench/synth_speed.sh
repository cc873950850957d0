#!/usr/bin/env bash
# Throughput of `frognano synth`: candidates tried, valid-task yield, valid tasks per
# CPU-minute and the share of worker time spent in test runs, on the Python fixture and on
# small pinned releases from PyPI and crates.io (network needed for those). Prints the
# conditions (commit, CPU model and SIMD flags, load average before and after, the command)
# and one table row per source, in bench/RESULTS.md's format; paste them there.
#   bench/synth_speed.sh [FROGNANO_BINARY]   (default target/release/frognano; WORKERS=2)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/release/frognano}"
[ -x "$bin" ] || { echo "$bin missing: cargo build --release -p frognano (or pass a binary)" >&2; exit 1; }
workers="${WORKERS:-2}"
out_root="$root/bench/out/synth"   # not under /tmp: the sandbox hides /tmp
rm -rf "$out_root" && mkdir -p "$out_root"
fixture="$out_root/pyproj"
cp -r "$root/crates/synth/tests/fixtures/pyproj" "$fixture"
(cd "$fixture" && git init -q && git add -A && git -c user.name=b -c user.email=b@b commit -qm fixture)
flags="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512(f|bw|vl|vnni|_bf16)|amx_(tile|int8|bf16))$' | tr '\n' ' ')"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(git -C "$root" rev-parse --short HEAD)"
echo "CPU: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; SIMD flags: ${flags:-none}"
echo "binary: $bin; command: bench/synth_speed.sh${1:+ $1} (WORKERS=$workers)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| bench | source | tried | valid | yield | tasks/CPU-min | test share | notes |"
echo "|---|---|---|---|---|---|---|---|"
run() {  # label, args...
    local label="$1"; shift
    local name; name="$(echo "$label" | tr -c 'a-zA-Z0-9.\n' '-')"
    local log="$out_root/$name.log"
    "$bin" synth "$@" --out "$out_root/$name" --workers "$workers" --seed 0 > "$log" 2>&1 || { cat "$log" >&2; return 1; }
    python3 - "$out_root/$name/summary.json" "$label" "$workers" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); w = int(sys.argv[3])
tried, ok, secs = s["candidates_tried"], s["tasks_accepted"], s["seconds"]
rej = ", ".join(f"{k} {v}" for k, v in sorted(s["rejections"].items())) or "none"
print(f"| synth | {sys.argv[2]} | {tried} | {ok} | {100*ok/max(tried,1):.0f}% | {60*ok/max(secs*w,1e-9):.2f} | "
      f"{100*s['test_seconds']/max(secs*w,1e-9):.0f}% | {secs:.0f} s wall, {w} workers; reference suite "
      f"{s['reference_seconds']:.1f} s; rejected: {rej} |")
PY
}
run "fixture pyproj (unittest, python3)" "$fixture" --python python3 --max-candidates 40
run "pypi six==1.16.0 (pytest, venv from PyPI)" --pypi six==1.16.0 --max-candidates 40
run "pypi more-itertools==10.5.0 (pytest, venv from PyPI)" --pypi more-itertools==10.5.0 --max-candidates 40
run "crates.io strsim@0.11.1 (cargo test)" --crate strsim@0.11.1 --max-candidates 12 --min-complexity 1
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
