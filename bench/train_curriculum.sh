#!/usr/bin/env bash
# Benchmark (not CI): what the frontier curriculum buys, at two scales.
#
#   bench/train_curriculum.sh [toy|smol|coder|all] [STEPS]
#
# toy (default): the graded toy (crates/rl/src/graded_toy.rs): frontier vs uniform vs uniform
#   with DAPO dynamic sampling from one warm-started tiny policy, the same rollout-token budget,
#   SEEDS seeds each (default 5); held-out expected solve rate against rollout tokens. Writes
#   bench/out/train-curriculum/graded/{table.md,curves.svg}, copies the plot to
#   docs/train-curriculum-toy.svg and puts the table with the machine's conditions into
#   bench/RESULTS.md between the "graded toy" markers. Resumable (finished runs are read back).
#   env: SEEDS, BUDGET, B, G, LR, WARM_STEPS, PARALLEL, PROFILE (release | dev)
# smol: `frognano train` with the frontier curriculum vs uniform task sampling, same budget,
#   on tasks synthesized from a small fixture repository; held-out solve rate of
#   SmolLM2-135M-Instruct (dequantized to f32 from the demo GGUF, LoRA rank 8) before and
#   after (env: B, G, EVAL_ATTEMPTS, MAX_STEPS, LR, …).
# coder: the same on a real coding model and real packages: Qwen2.5-Coder-1.5B-Instruct
#   (Q4_K_M GGUF, scripts/fetch-coder-model.sh; LoRA on the dequantized file, rollouts on the
#   quantized file with the adapters unmerged) on tasks `frognano synth batch` makes from
#   PACKAGES (default three small PyPI releases), split by package (HELD_OUT, default
#   jsonpointer). The base model's pass rate per training task is measured first (G attempts
#   each; the frontier arm starts from those counts), then frontier vs uniform for STEPS steps,
#   then the held-out solve rate of each. Writes bench/out/train-curriculum/coder/{table.md,
#   calibration.json, frontier/, uniform/} and the coder section of bench/RESULTS.md.
#   env: PACKAGES, TASKS_PER_PACKAGE (10), HELD_OUT, B, G, EVAL_ATTEMPTS, PARALLEL, LORA_RANK,
#   LR, MAX_STEPS, MAX_TOKENS_PER_TURN, MAX_CONTEXT, ATTEMPT_TIMEOUT, TEMPERATURE (1.0),
#   HARNESS (leaf | small-model), HINTS (none | file | function | line: where the fix goes,
#   appended to each issue text) (see crates/rl/examples/curriculum_bench.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
PART="${1:-toy}"
STEPS="${2:-4}"
PROFILE="${PROFILE:-release}"
OUT=bench/out/train-curriculum

# "CPU (N cores; SIMD: …)" of this machine, for the conditions line of a report.
machine() {
  local cpu flags
  cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  flags="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512_vnni|avx512_bf16|amx_tile)$' | tr '\n' ' ')"
  echo "$cpu ($(nproc) cores; SIMD: $flags)"
}

# Puts "$2" (a report file) into bench/RESULTS.md between the markers named "$1".
put_in_results() {
  python3 - "$1" "$2" <<'PY'
import sys
name, report = sys.argv[1], open(sys.argv[2]).read().strip()
begin, end = f"<!-- train_curriculum.sh {name}: begin -->", f"<!-- train_curriculum.sh {name}: end -->"
path = "bench/RESULTS.md"
text = open(path).read()
if begin in text and end in text:
    head, rest = text.split(begin, 1)
    text = head + begin + "\n" + report + "\n" + end + rest.split(end, 1)[1]
else:
    text = text.rstrip("\n") + f"\n\n## Curriculum: {name} (`bench/train_curriculum.sh`)\n\n" + begin + "\n" + report + "\n" + end + "\n"
open(path, "w").write(text)
PY
}

run_toy() {
  local out="$OUT/graded"
  mkdir -p "$out"
  cargo build -q --profile "$PROFILE" -p frognano-rl --example graded_curriculum
  local dir=release
  [ "$PROFILE" = dev ] && dir=debug
  local load_start started
  load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
  started="$(date -u +%Y-%m-%dT%H:%MZ)"
  echo "load average at start: $load_start"
  nice -n 10 "./target/$dir/examples/graded_curriculum" "$out"
  local load_end
  load_end="$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "load average at end: $load_end"
  cp "$out/curves.svg" docs/train-curriculum-toy.svg
  {
    echo "**Conditions.** $(machine), started $started, profile \`$PROFILE\`, one process under \`nice -n 10\`; load average $load_start at start, $load_end at end (the machine was shared)."
    echo
    cat "$out/table.md"
  } > "$out/report.md"
  put_in_results "graded toy" "$out/report.md"
  echo "wrote $out/table.md, docs/train-curriculum-toy.svg and the graded-toy section of bench/RESULTS.md"
}

run_smol() {
local OUT="$OUT/smol"
./scripts/fetch-demo-model.sh >/dev/null
cargo build --release -q -p frognano -p frognano-rl --example curriculum_bench
BIN=./target/release/frognano

REPO="$OUT/repo"
if [ ! -d "$REPO/.git" ]; then
  rm -rf "$REPO" && mkdir -p "$REPO"
  cat > "$REPO/textkit.py" <<'PY'
"""Small text and number helpers."""


def mean(values):
    if not values:
        raise ValueError("mean() of an empty sequence")
    return sum(values) / len(values)


def median(values):
    if not values:
        raise ValueError("median() of an empty sequence")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2 == 0:
        return (ordered[middle - 1] + ordered[middle]) / 2
    return ordered[middle]


def clamp(x, low, high):
    if low > high:
        raise ValueError("low must not exceed high")
    if x < low:
        return low
    if x > high:
        return high
    return x


def count_words(text):
    count = 0
    for word in text.split():
        if word.strip(".,;:!?"):
            count += 1
    return count


def is_palindrome(text):
    letters = [c.lower() for c in text if c.isalnum()]
    i, j = 0, len(letters) - 1
    while i < j:
        if letters[i] != letters[j]:
            return False
        i += 1
        j -= 1
    return True


def running_max(values):
    out = []
    best = None
    for v in values:
        if best is None or v > best:
            best = v
        out.append(best)
    return out
PY
  cat > "$REPO/test_textkit.py" <<'PY'
import unittest

from textkit import clamp, count_words, is_palindrome, mean, median, running_max


class TestTextkit(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3, 4]), 2.5)

    def test_mean_empty(self):
        with self.assertRaises(ValueError):
            mean([])

    def test_median_odd(self):
        self.assertEqual(median([3, 1, 2]), 2)

    def test_median_even(self):
        self.assertEqual(median([4, 1, 3, 2]), 2.5)

    def test_clamp(self):
        self.assertEqual(clamp(5, 0, 3), 3)
        self.assertEqual(clamp(-1, 0, 3), 0)
        self.assertEqual(clamp(2, 0, 3), 2)

    def test_clamp_bad_range(self):
        with self.assertRaises(ValueError):
            clamp(1, 3, 0)

    def test_count_words(self):
        self.assertEqual(count_words("a b, c ... d!"), 4)

    def test_palindrome(self):
        self.assertTrue(is_palindrome("A man, a plan, a canal: Panama"))
        self.assertFalse(is_palindrome("frog"))

    def test_running_max(self):
        self.assertEqual(running_max([1, 3, 2, 5, 4]), [1, 3, 3, 5, 5])


if __name__ == "__main__":
    unittest.main()
PY
  git -C "$REPO" init -q && git -C "$REPO" add -A && git -C "$REPO" -c user.name=bench -c user.email=bench@localhost commit -qm "textkit"
fi

TASKS="$OUT/tasks"
if [ ! -s "$TASKS/tasks.jsonl" ]; then
  "$BIN" synth "$REPO" --out "$TASKS" --min-complexity 1 --max-candidates 60 --max-f2p-fraction 0.5
fi
echo "tasks: $(wc -l < "$TASKS/tasks.jsonl")"
rm -rf "$OUT/frontier" "$OUT/uniform"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
./target/release/examples/curriculum_bench models/SmolLM2-135M-Instruct.Q4_1.gguf "$TASKS" "$OUT" "$STEPS" | tee "$OUT/table.md"
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
}

run_coder() {
  local out="$OUT/coder"
  mkdir -p "$out"
  ./scripts/fetch-coder-model.sh >/dev/null
  cargo build --release -q -p frognano -p frognano-rl --example curriculum_bench
  local packages="${PACKAGES:-pypi:inflection==0.5.1 pypi:semver==3.0.2 pypi:jsonpointer==2.4}"
  printf '%s 10m\n' $packages > "$out/manifest.txt"
  ./target/release/frognano synth batch "$out/manifest.txt" --out "$out/synth" --jobs 1 \
    --max-tasks "${TASKS_PER_PACKAGE:-10}"
  echo "tasks: $(wc -l < "$out/synth/tasks.jsonl")"
  rm -rf "$out/frontier" "$out/uniform"
  local load_start started
  load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
  started="$(date -u +%Y-%m-%dT%H:%MZ)"
  echo "load average at start: $load_start"
  HELD_OUT="${HELD_OUT:-jsonpointer}" ./target/release/examples/curriculum_bench \
    models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf "$out/synth/tasks.jsonl" "$out" "$STEPS" 2> "$out/run.log"
  local load_end
  load_end="$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "load average at end: $load_end"
  {
    echo "**Conditions.** $(machine), started $started; packages: $packages (held out: ${HELD_OUT:-jsonpointer}); $STEPS steps per arm, B=${B:-2}, G=${G:-4}, LoRA rank ${LORA_RANK:-8}, lr ${LR:-1e-4}, at most ${MAX_STEPS:-10} agent steps of ${MAX_TOKENS_PER_TURN:-512} tokens, temperature ${TEMPERATURE:-1.0}, harness ${HARNESS:-leaf}, hints ${HINTS:-none}; load average $load_start at start, $load_end at end."
    echo
    cat "$out/table.md"
  } > "$out/report.md"
  put_in_results "coder" "$out/report.md"
  echo "wrote $out/table.md and the coder section of bench/RESULTS.md"
}

case "$PART" in
  toy) run_toy ;;
  smol) run_smol ;;
  coder) run_coder ;;
  all) run_toy; run_smol; run_coder ;;
  *) echo "usage: bench/train_curriculum.sh [toy|smol|coder|all] [STEPS]; got part \"$PART\"" >&2; exit 2 ;;
esac
