#!/usr/bin/env bash
# Yield of `frognano synth batch` over many real releases (issue 23): the manifest
# bench/synth_yield_manifest.txt (32 pure-Python packages from PyPI, 22 npm packages, 11 Go
# modules, none used by the tests), at most 3 tasks each; then every gold patch graded with
# `frognano eval grade` on the merged tasks.jsonl. Needs the network (PyPI, npm, and Debian's
# apt mirror for the `go:MODULE@debian` lines) for intake and environments; the test runs themselves are sandboxed and
# offline. Resumable: rerun to continue a killed run (MANIFEST and OUT unchanged).
# Prints the conditions and, per language, the share of releases that ship tests giving
# ≥ 3 valid tasks (goals: Python ≥ 90 %, JS/TS and Go ≥ 70 %), gold patches resolved
# (goal: all), and valid tasks per CPU-minute (goal ≥ 2), in bench/RESULTS.md's format.
#   bench/synth_yield.sh [FROGNANO_BINARY]
#   env: MANIFEST (default bench/synth_yield_manifest.txt; e.g. only its pypi: lines for the
#        Python part), OUT (default bench/out/synth-yield),
#        JOBS (packages at once, default 2), WORKERS (per package, default 1)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/release/frognano}"
[ -x "$bin" ] || { echo "$bin missing: cargo build --release -p frognano (or pass a binary)" >&2; exit 1; }
manifest="${MANIFEST:-$root/bench/synth_yield_manifest.txt}"
out="${OUT:-$root/bench/out/synth-yield}"   # not under /tmp: keep it across reboots
jobs="${JOBS:-2}"
workers="${WORKERS:-1}"
mkdir -p "$out"
flags="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512(f|bw|vl|vnni|_bf16)|amx_(tile|int8|bf16))$' | tr '\n' ' ')"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(git -C "$root" rev-parse --short HEAD)"
echo "CPU: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; SIMD flags: ${flags:-none}"
echo "binary: $bin; manifest: $manifest; JOBS=$jobs WORKERS=$workers"
echo "go $(go env GOVERSION 2>/dev/null || echo missing); node $(node --version 2>/dev/null || echo missing); python $(python3 --version 2>&1 | cut -d' ' -f2)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin" synth batch "$manifest" --out "$out" --jobs "$jobs" --workers "$workers" --max-tasks 3 > "$out/batch.log" 2>&1 \
    || { tail -20 "$out/batch.log" >&2; exit 1; }
echo "load average after synthesis: $(cut -d' ' -f1-3 /proc/loadavg)"
# Gold predictions: each task's own fix.
python3 - "$out/tasks.jsonl" "$out/gold.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for line in open(sys.argv[1]):
        t = json.loads(line)
        f.write(json.dumps({"instance_id": t["instance_id"], "model_name_or_path": "gold", "model_patch": t["patch"]}) + "\n")
PY
graded="skipped (no tasks)"
if [ -s "$out/tasks.jsonl" ]; then
    "$bin" eval grade --instances "$out/tasks.jsonl" --predictions "$out/gold.jsonl" --run-id gold \
        --output "$out/grade" --workers "$jobs" --timeout 600 > "$out/grade.log" 2>&1 || { tail -20 "$out/grade.log" >&2; exit 1; }
    graded="$(grep -m1 '^resolved' "$out/grade.log")"
fi
echo "load average after grading: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
python3 - "$out/yield.json" "$graded" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
langs = {"pypi": "Python", "npm": "JS/TS", "go": "Go", "crate": "Rust"}
rows = {}
for p in r["packages"]:
    lang = langs.get(p["spec"].split(":")[0], "local")
    rows.setdefault(lang, []).append(p)
print("| bench | language | releases | ship tests | ≥ 3 tasks (of those shipping tests) | tasks | outcomes |")
print("|---|---|---|---|---|---|---|")
for lang, ps in rows.items():
    shipping = [p for p in ps if p["outcome"] != "no_tests_shipped"]
    three = sum(1 for p in shipping if p["tasks"] >= 3)
    outcomes = {}
    for p in ps:
        outcomes[p["outcome"]] = outcomes.get(p["outcome"], 0) + 1
    share = f"{100*three/len(shipping):.0f}%" if shipping else "n/a"
    print(f"| synth_yield | {lang} | {len(ps)} | {len(shipping)} | {three} ({share}) | {sum(p['tasks'] for p in ps)} | "
          + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) + " |")
print()
print(f"tasks {r['tasks']}; candidates {r['candidates_tried']}; this run {r['wall_seconds']:.0f} s wall, "
      f"{r['cpu_seconds']:.0f} CPU s, {r['tasks_per_cpu_minute']:.2f} valid tasks per CPU-minute; "
      f"gold patches: {sys.argv[2]}; unfinished: {len(r['unfinished'])}")
for p in r["packages"]:
    if p["outcome"] != "ok":
        print(f"  {p['spec']}: {p['outcome']}: {(p['error'] or '').splitlines()[0][:160] if p['error'] else ''}")
PY
echo
# What the cheap first pass did (estimate from this run's candidate times).
python3 "$root/bench/synth_first_pass.py" "$out"
