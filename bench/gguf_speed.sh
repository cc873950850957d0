#!/usr/bin/env bash
# llama.cpp (llama-cpp-python 0.3.36, scripts/setup-llama-reference.sh: GGML_NATIVE=ON with
# the AMX instructions compiled out, which crash on this CPU) and FrogNano on the same GGUF,
# same thread count, alternating, in one run. Prints tok/s and FrogNano/llama.cpp ratios for
# prefill (N tokens) and greedy decode (M tokens), and decode's achieved weight bandwidth
# against the copy bandwidth and the read bandwidth (a 256-bit read loop, examples/read_bandwidth.rs)
# measured in the same run with as many threads. Every table comes
# with the CPU model, its SIMD flags and the load average at the start and the end.
#   bench/gguf_speed.sh [MODEL.gguf] [--threads 2] [--prefill 512] [--decode 128] [--runs 3] [--plain]
#   bench/gguf_speed.sh --qwen35-4b [--prepare-only] [...]
#   bench/gguf_speed.sh --matrix [--threads-list 1,2] [--prefill 512] [--decode 128] [--runs 3]
#                       [--only TYPE,...] [--prepare-only] [--resume]
# Each of the --runs rounds runs every engine once: odd rounds llama.cpp first, even rounds
# FrogNano first, so that neither always runs on the cooler machine; the tables give medians.
# FrogNano is crates/model/examples/gguf_bench.rs (release build), llama.cpp
# bench/llama_cpp_bench.py; both prefill the same pseudo-random token ids and print their greedy
# ids, and the report says where FrogNano's part from llama.cpp's (same weights, same prompt:
# near-ties aside, a kernel that is fast but wrong shows there).
#   --plain also times FrogNano with FROGNANO_PLAIN_KERNELS=1 (its kernels before the tiled
#   k-quant matmuls, the vector attention and the eight-row Q4_K packing) in the same
#   alternation, for before/after ratios from one run.
# --qwen35-4b times a random-weight model in the Qwen3.5-4B shapes: bench/make_random_qwen35_4b_gguf.py
# writes it as Q8_0 with the metadata, tensor names and vocabulary llama.cpp's converter writes
# for `qwen35` (numpy and the sdist's gguf-py; no torch), then llama_model_quantize makes the
# Q4_K_M file, as for every matrix row. Made once under bench/out (8 GB free needed while making
# it, 2.7 GB kept); the Q8_0 source is deleted after quantizing.
#
# --matrix (issue 17) runs the whole comparison in one invocation, one row per (model, threads):
#   Q4_K_M             models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf as published
#   Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_M Q5_K_M Q6_K IQ4_NL IQ4_XS
#                      that file re-quantized by llama.cpp's own quantizer (llama_model_quantize
#                      with allow_requantize, same llama-cpp-python build; bench/requant_gguf.py
#                      --quantizer llama.cpp), made once into bench/out/matrix/ (~13 GB for all
#                      eleven; each file's size and tensor type mix is printed; an existing
#                      file is never made again, and a killed run leaves only a .part file)
#   SmolLM2            models/SmolLM2-135M-Instruct.Q4_1.gguf
#   Qwen3.5-4B         the --qwen35-4b Q4_K_M file, made as above when its inputs exist; when
#                      they do not, its row says "skipped:" with what is missing and the command
#                      that makes it
# --only picks rows by those names (case-insensitive). --prepare-only makes the files, prints
# their sizes and stops. Thread counts come from --threads-list (default 1,2); the copy
# bandwidth is measured once per thread count before the rows. Progress lines (row, engine,
# round, elapsed) go to stderr. A row whose model fails in either engine shows the error in its
# row and the matrix goes on. The table (Markdown, for bench/RESULTS.md) is printed at the end,
# each ratio below the goal (prefill < 1.0, decode < 1.3; bandwidth < 85 % of copy) marked ✗,
# and written as JSON lines to bench/out/gguf_matrix.jsonl (a conditions line, then one line
# per row with medians and every round's figures) for diffs between runs. Each finished row is
# kept under bench/out/matrix/cells/; --resume reuses the rows an interrupted invocation
# finished with the same sizes, runs and commit instead of timing them again. The full matrix
# at the default sizes takes hours on 2 cores: run it on a quiet machine (load average below
# 0.5 at the start and the end, else the header says to rerun).
set -euo pipefail
cd "$(dirname "$0")/.."
coder=models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then model=$1; shift; fi
invocation="bench/gguf_speed.sh $*"
threads=2 threads_list="" prefill=512 decode=128 runs=3 qwen4b=0 prepare_only=0 plain=0 matrix=0 only="" resume=0 threads_given=0
while [ $# -gt 0 ]; do
    case $1 in
        --threads) threads=${2:?--threads needs a value}; threads_given=1; shift 2 ;;
        --threads-list) threads_list=${2:?--threads-list needs a value}; shift 2 ;;
        --prefill) prefill=${2:?--prefill needs a value}; shift 2 ;;
        --decode) decode=${2:?--decode needs a value}; shift 2 ;;
        --runs) runs=${2:?--runs needs a value}; shift 2 ;;
        --only) only=${2:?--only needs a value}; shift 2 ;;
        --qwen35-4b) qwen4b=1; shift ;; --prepare-only) prepare_only=1; shift ;;
        --plain) plain=1; shift ;; --matrix) matrix=1; shift ;; --resume) resume=1; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
positive() { [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "$1 $2: expected a positive whole number" >&2; exit 2; }; }
positive --threads "$threads"; positive --prefill "$prefill"; positive --decode "$decode"; positive --runs "$runs"
if [ "$matrix" = 1 ]; then
    [ "$qwen4b" = 0 ] && [ "$plain" = 0 ] || { echo "--matrix: --qwen35-4b and --plain are for the single-model mode" >&2; exit 2; }
    [ "$threads_given" = 0 ] || { echo "--matrix takes --threads-list, not --threads" >&2; exit 2; }
    threads_list=${threads_list:-1,2}
    for t in ${threads_list//,/ }; do positive --threads-list "$t"; done
else
    [ -z "$threads_list$only" ] && [ "$resume" = 0 ] || { echo "--threads-list, --only and --resume need --matrix" >&2; exit 2; }
fi

t_start=$SECONDS
# progress MESSAGE: a time-stamped line on stderr with the seconds since the start.
progress() { printf '[%s +%ds] %s\n' "$(date +%H:%M:%S)" $((SECONDS - t_start)) "$*" >&2; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
human_size() { numfmt --to=si --suffix=B --format=%.2f "$(stat -c %s "$1")"; }

# need_llama: llama-cpp-python importable from .venv-llama (scripts/setup-llama-reference.sh).
need_llama() { .venv-llama/bin/python -c 'import llama_cpp' 2>/dev/null || { echo "run scripts/setup-llama-reference.sh first" >&2; exit 1; }; }

# copy_bandwidth THREADS: GB/s (read + write bytes) of THREADS numpy copies of 256 MiB arrays,
# one per thread, all at once (numpy releases the GIL while copying), best of 5.
copy_bandwidth() {
    .venv-llama/bin/python - "$1" <<'PY'
import sys, threading, time
import numpy as np
n = int(sys.argv[1])
src = [np.ones(1 << 25) for _ in range(n)]
dst = [np.empty_like(a) for a in src]
for a, b in zip(src, dst):
    np.copyto(b, a)  # fault every page in before timing
gate = threading.Barrier(n + 1)
def copy(i):
    for _ in range(5):
        gate.wait(); np.copyto(dst[i], src[i]); gate.wait()
workers = [threading.Thread(target=copy, args=(i,)) for i in range(n)]
for w in workers:
    w.start()
best = float("inf")
for _ in range(5):
    gate.wait(); t = time.perf_counter(); gate.wait(); best = min(best, time.perf_counter() - t)
for w in workers:
    w.join()
print(f"{2 * n * src[0].nbytes / best / 1e9:.1f}")
PY
}

# read_bandwidth THREADS: GB/s of bytes read by THREADS threads streaming their own 256 MiB
# buffers with 256-bit loads, all at once, best of 5 (crates/model/examples/read_bandwidth.rs):
# the ceiling of a one-token matmul, which reads every weight once and writes almost nothing.
read_bandwidth() { "${CARGO_TARGET_DIR:-target}/release/examples/read_bandwidth" "$1"; }

# prepare_qwen35_4b: makes bench/out/qwen35-4b-random-Q4_K_M.gguf (see --qwen35-4b above) unless
# it exists. Returns 1 with what is missing, and the command that makes it, in $qwen4b_missing,
# or 2 when a step failed.
qwen4b_model=bench/out/qwen35-4b-random-Q4_K_M.gguf
prepare_qwen35_4b() {
    local q8=bench/out/qwen35-4b-random-Q8_0.gguf free
    [ -f "$qwen4b_model" ] && return 0
    .venv-llama/bin/python -c 'import llama_cpp, numpy' 2>/dev/null || { qwen4b_missing="llama-cpp-python missing: run scripts/setup-llama-reference.sh"; return 1; }
    [ -f models/qwen35-tokenizer/tokenizer.json ] || { qwen4b_missing="models/qwen35-tokenizer missing: run scripts/setup-qwen35-tokenizer.sh"; return 1; }
    mkdir -p bench/out
    if [ ! -f "$q8" ]; then
        free=$(df --output=avail -B1 bench/out | tail -n 1)
        if [ "$free" -lt 8000000000 ]; then
            qwen4b_missing="$qwen4b_model not made: $((free / 1000000000)) GB free under bench/out, 8 GB needed (4.5 GB of Q8_0 source, 2.7 GB of Q4_K_M)"
            return 1
        fi
        progress "writing $q8 (bench/make_random_qwen35_4b_gguf.py: random weights, real shapes and vocabulary)"
        .venv-llama/bin/python bench/make_random_qwen35_4b_gguf.py "$q8" >&2 || return 2
    fi
    progress "quantizing $q8 to $qwen4b_model (llama_model_quantize)"
    .venv-llama/bin/python bench/requant_gguf.py --quantizer llama.cpp --nthread "$(nproc)" \
        "$q8" "$qwen4b_model" Q4_K_M 2> bench/out/qwen35-4b-random-Q4_K_M.gguf.log \
        || { tail -n 3 bench/out/qwen35-4b-random-Q4_K_M.gguf.log >&2; return 2; }
    rm -f "$q8"
}

# run_engine ENGINE MODEL THREADS: one timed run, one JSON line on stdout.
ours=${CARGO_TARGET_DIR:-target}/release/examples/gguf_bench
run_engine() {
    case $1 in
        llama.cpp) .venv-llama/bin/python bench/llama_cpp_bench.py "$2" "$3" "$prefill" "$decode" ;;
        frognano) "$ours" "$2" --threads "$3" --prefill "$prefill" --decode "$decode" ;;
        frognano-plain) FROGNANO_PLAIN_KERNELS=1 "$ours" "$2" --threads "$3" --prefill "$prefill" --decode "$decode" \
            | sed 's/"engine":"frognano"/"engine":"frognano-plain"/' ;;
    esac
}

# tok_s prefill|decode JSON_LINE: that figure of an engine's JSON line, two decimals.
tok_s() { printf '%.2f' "$(grep -oE "\"$1_tok_s\": ?[0-9.]+" <<< "$2" | grep -oE '[0-9.]+$')"; }

# bench_pair MODEL THREADS OUT.jsonl LABEL: $runs alternating rounds of llama.cpp and FrogNano
# (and FrogNano plain with --plain) on MODEL, every run's JSON line appended to OUT.jsonl. On a
# failure returns 1 with the failing engine and its last error line in OUT.jsonl.err.
bench_pair() {
    local model=$1 threads=$2 out=$3 label=$4 r who order t0 line
    : > "$out"; rm -f "$out.err"
    for r in $(seq "$runs"); do
        if [ $((r % 2)) = 1 ]; then order="llama.cpp frognano"; else order="frognano llama.cpp"; fi
        [ "$plain" = 1 ] && order="$order frognano-plain"
        for who in $order; do
            progress "$label, $threads thread(s), round $r/$runs: $who ..."
            t0=$SECONDS
            if ! line=$(run_engine "$who" "$model" "$threads" 2> "$out.stderr") || [ -z "$line" ]; then
                printf '%s: %s\n' "$who" "$(grep -v '^\s*$' "$out.stderr" | tail -n 1 | cut -c1-300)" > "$out.err"
                progress "$label, $threads thread(s): $who failed: $(cat "$out.err")"
                return 1
            fi
            echo "$line" >> "$out"
            progress "$label, $threads thread(s), round $r/$runs: $who $(tok_s prefill "$line") prefill, $(tok_s decode "$line") decode tok/s, $((SECONDS - t0)) s"
        done
    done
    rm -f "$out.stderr"
}

if [ "$matrix" = 0 ]; then
    if [ "$qwen4b" = 1 ]; then
        model=$qwen4b_model
        qwen4b_missing=""
        prepare_qwen35_4b || { rc=$?; [ -n "$qwen4b_missing" ] && echo "$qwen4b_missing" >&2; exit 1; }
        [ "$prepare_only" = 1 ] && { ls -l "$model"; exit 0; }
    fi
    [ -f "$model" ] || { echo "$model missing (scripts/fetch-demo-model.sh)" >&2; exit 1; }
    need_llama
    cargo build --release -q -p frognano-model --example gguf_bench --example read_bandwidth
    mkdir -p bench/out
    out=bench/out/gguf_speed.jsonl
    load_start=$(loadavg)
    progress "load average at start: $load_start"
    bench_pair "$model" "$threads" "$out" "$(basename "$model")" || { cat "$out.err" >&2; exit 1; }
    load_end=$(loadavg)
    copy_gbs=$(copy_bandwidth "$threads") read_gbs=$(read_bandwidth "$threads")
    python3 bench/gguf_speed_report.py single "$out" "$model" "$threads" "$prefill" "$decode" "$copy_gbs" "$load_start" "$load_end" "$read_gbs"
    exit 0
fi

# ---- --matrix ----
requant_types="Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_M Q5_K_M Q6_K IQ4_NL IQ4_XS"
all_keys="Q4_K_M $requant_types SmolLM2 Qwen3.5-4B"
keys=$all_keys
if [ -n "$only" ]; then
    keys=""
    for want in ${only//,/ }; do
        hit=""
        for k in $all_keys; do [ "${k,,}" = "${want,,}" ] && hit=$k; done
        [ -n "$hit" ] || { echo "--only $want: expected some of $all_keys" >&2; exit 2; }
        keys="$keys $hit"
    done
fi
matrix_dir=bench/out/matrix
mkdir -p "$matrix_dir/cells"
need_llama
declare -A row_file row_label row_problem
row_label[Q4_K_M]="Coder-1.5B Q4_K_M as published"
row_file[Q4_K_M]=$coder
row_label[SmolLM2]="SmolLM2-135M Q4_1"
row_file[SmolLM2]=models/SmolLM2-135M-Instruct.Q4_1.gguf
row_label[Qwen3.5-4B]="Qwen3.5-4B shape Q4_K_M (random)"
row_file[Qwen3.5-4B]=$qwen4b_model
for t in $requant_types; do
    row_label[$t]="Coder-1.5B $t"
    row_file[$t]=$matrix_dir/Qwen2.5-Coder-1.5B-Instruct.$t.gguf
done

# type_mix LOG: the tensor types of a file from llama_model_quantize's log (f32 norms left out).
type_mix() {
    awk '/^\[ *[0-9]+\/ *[0-9]+\]/ {
            if (match($0, /converting to [A-Za-z0-9_]+/)) t = substr($0, RSTART + 14, RLENGTH - 14)
            else if (match($0, /type = +[A-Za-z0-9_]+/)) { t = substr($0, RSTART, RLENGTH); sub(/type = +/, "", t) }
            if (t != "f32") n[t]++ }
         END { for (t in n) print n[t], t }' "$1" | sort -k1,1nr -k2 | paste -sd, - | sed 's/,/, /g'
}

# prepare_row KEY: makes the row's file if it is one of the re-quantized ones (or the 4B one)
# and is not there yet; a row that cannot be timed gets "skipped: ..." or "error: ..." in
# row_problem[KEY].
prepare_row() {
    local k=$1 f=${row_file[$1]} free need
    case $k in
        SmolLM2|Q4_K_M)
            [ -f "$f" ] || row_problem[$k]="error: $f missing (scripts/fetch-demo-model.sh or scripts/fetch-coder-model.sh)" ;;
        Qwen3.5-4B)
            qwen4b_missing=""
            if prepare_qwen35_4b; then :; else
                case $? in
                    1) row_problem[$k]="skipped: $qwen4b_missing" ;;
                    *) row_problem[$k]="error: making $qwen4b_model failed (see the lines above)" ;;
                esac
            fi ;;
        *)
            [ -f "$f" ] && return 0
            if [ ! -f "$coder" ]; then
                row_problem[$k]="error: $coder missing (scripts/fetch-coder-model.sh), so $f cannot be made"
                return 0
            fi
            free=$(df --output=avail -B1 "$matrix_dir" | tail -n 1)
            need=$((2 * $(stat -c %s "$coder") + 1000000000))
            if [ "$free" -lt "$need" ]; then
                row_problem[$k]="error: $f not made: $(numfmt --to=si "$free")B free on the disk of $matrix_dir, want $(numfmt --to=si "$need")B"
                return 0
            fi
            progress "quantizing $coder to $k with llama.cpp's quantizer -> $f"
            if ! .venv-llama/bin/python bench/requant_gguf.py --quantizer llama.cpp --nthread "$(nproc)" \
                    "$coder" "$f" "$k" 2> "$f.log"; then
                row_problem[$k]="error: quantizing to $k failed: $(grep -v '^\s*$' "$f.log" | tail -n 1 | cut -c1-300)"
                rm -f "$f.part"
            fi ;;
    esac
}

progress "preparing the files of:$keys"
for k in $keys; do
    prepare_row "$k"
    f=${row_file[$k]}
    if [ -n "${row_problem[$k]:-}" ]; then
        echo "$k: ${row_problem[$k]}"
    else
        mix=""
        [ -f "$f.log" ] && mix=$(type_mix "$f.log")
        echo "$k: $f $(human_size "$f") ($(stat -c %s "$f") bytes)${mix:+; tensors: $mix}"
    fi
done
echo "disk free on $matrix_dir: $(df -h --output=avail "$matrix_dir" | tail -n 1 | tr -d ' ')"
[ "$prepare_only" = 1 ] && exit 0

cargo build --release -q -p frognano-model --example gguf_bench --example read_bandwidth
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates Cargo.lock Cargo.toml || echo "+uncommitted")
sig="p$prefill d$decode r$runs $commit"
load_start=$(loadavg)
progress "load average at start: $load_start"
copy="," readbw=","  # ",THREADS=GB/s,...,"
for t in ${threads_list//,/ }; do
    g=$(copy_bandwidth "$t") rg=$(read_bandwidth "$t")
    progress "copy bandwidth with $t thread(s): $g GB/s; read bandwidth $rg GB/s"
    copy="$copy$t=$g," readbw="$readbw$t=$rg,"
done
plan=$matrix_dir/plan.tsv
: > "$plan"
clean() { tr '\t\n' '  ' <<< "$1"; }
for k in $keys; do
    for t in ${threads_list//,/ }; do
        label=${row_label[$k]}
        if [ -n "${row_problem[$k]:-}" ]; then
            status=${row_problem[$k]%%: *}; msg=${row_problem[$k]#*: }
            [ "$status" = skipped ] || status=error
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$k" "$label" "$t" "${row_file[$k]}" "$status" "$(clean "$msg")" >> "$plan"
            continue
        fi
        cell=$matrix_dir/cells/$k-t$t.jsonl
        if [ "$resume" = 1 ] && [ -f "$cell.meta" ] && grep -qF "\"sig\": \"$sig\"" "$cell.meta"; then
            progress "$label, $t thread(s): reusing $cell (--resume)"
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$k" "$label" "$t" "${row_file[$k]}" reused "$cell" >> "$plan"
            continue
        else
            rm -f "$cell.meta"
            cell_load=$(loadavg) cell_t0=$SECONDS cell_started=$(date -u +%FT%TZ)
            if ! bench_pair "${row_file[$k]}" "$t" "$cell" "$label"; then
                printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$k" "$label" "$t" "${row_file[$k]}" error "$(clean "$(cat "$cell.err")")" >> "$plan"
                continue
            fi
            # The copy bandwidth of this invocation goes with the row, for --resume.
            cell_copy=${copy#*",$t="} cell_read=${readbw#*",$t="}
            printf '{"sig": "%s", "started": "%s", "wall_s": %d, "load_start": "%s", "load_end": "%s", "copy_gb_s": %s, "read_gb_s": %s}\n' \
                "$sig" "$cell_started" $((SECONDS - cell_t0)) "$cell_load" "$(loadavg)" "${cell_copy%%,*}" "${cell_read%%,*}" > "$cell.meta"
        fi
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$k" "$label" "$t" "${row_file[$k]}" ok "$cell" >> "$plan"
    done
done
load_end=$(loadavg)
progress "load average at end: $load_end"
llama_version=$(.venv-llama/bin/python -c 'import llama_cpp; print(llama_cpp.__version__)')
python3 bench/gguf_speed_report.py matrix "$plan" bench/out/gguf_matrix.jsonl "$prefill" "$decode" "$runs" \
    "$copy" "$load_start" "$load_end" "$invocation" "$commit" "$llama_version" "$readbw"
