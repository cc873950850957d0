#!/usr/bin/env bash
# Throughput of `frognano synth`: candidates tried, valid-task yield, valid tasks per
# CPU-minute and the share of worker time spent in test runs, on the Python fixture and on
# real PyPI packages (network needed for the latter). Appends a table row per run to
# bench/RESULTS.md.  Usage: bench/synth_speed.sh [frognano binary]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/release/frognano}"
workers="${WORKERS:-2}"
out_root="$root/bench/out/synth"   # not under /tmp: the sandbox hides /tmp
rm -rf "$out_root" && mkdir -p "$out_root"
fixture="$out_root/pyproj"
cp -r "$root/crates/synth/tests/fixtures/pyproj" "$fixture"
(cd "$fixture" && git init -q && git add -A && git -c user.name=b -c user.email=b@b commit -qm fixture)
run() {  # name, args...
    local name="$1"; shift
    local log="$out_root/$name.log"
    "$bin" synth "$@" --out "$out_root/$name" --workers "$workers" --seed 0 > "$log" 2>&1 || { cat "$log"; return 1; }
    python3 - "$out_root/$name/summary.json" "$name" "$workers" >> "$root/bench/RESULTS.md" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); w = int(sys.argv[3])
tried, ok, secs = s["candidates_tried"], s["tasks_accepted"], s["seconds"]
print(f"| synth | {sys.argv[2]} | {tried} | {ok} | {100*ok/max(tried,1):.0f}% | {60*ok/max(secs*w,1e-9):.2f} | "
      f"{100*s['test_seconds']/max(secs*w,1e-9):.0f}% | {secs:.0f} s, {w} workers |")
PY
}
run fixture-python "$fixture" --python python3 --max-candidates 40
run pypi-six --pypi six==1.16.0 --max-candidates 40
run pypi-more-itertools --pypi more-itertools==10.5.0 --max-candidates 40
tail -4 "$root/bench/RESULTS.md"
