#!/usr/bin/env bash
# Long prompts (issue 19 item 1): FrogNano (crates/model/examples/gguf_bench.rs, release) and
# llama.cpp (bench/llama_cpp_bench.py in .venv-llama) on the same GGUF, thread count and KV
# cache type, one after the other per length: prefill of N pseudo-random tokens, then M greedy
# decode steps after it. Prints tok/s, FrogNano/llama.cpp ratios, FrogNano's KV bytes, the CPU
# model, its SIMD flags and the load average before and after.
# --kv-cache q8_0|q4_0 sets both sides' cache (llama.cpp with flash attention on, which it needs
# for a quantized V; with f16 it keeps its defaults). --f16-too adds FrogNano's decode with the
# f16 cache at each length (column "f16 decode"), to see what the quantized cache costs.
#   bench/long_context.sh [MODEL.gguf] [--threads 2] [--lengths 128,512,2048,8192] [--decode 32]
#                         [--kv-cache f16|q8_0|q4_0] [--f16-too] [--no-llama]
# The machine is shared: read the load averages before trusting a ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then model=$1; shift; fi
threads=2 lengths=128,512,2048,8192 decode=32 kv=f16 llama=1 f16too=0
while [ $# -gt 0 ]; do
    case $1 in
        --threads) threads=${2:?--threads needs a value}; shift 2 ;;
        --lengths) lengths=${2:?--lengths needs a value}; shift 2 ;;
        --decode) decode=${2:?--decode needs a value}; shift 2 ;;
        --kv-cache) kv=${2:?--kv-cache needs a value}; shift 2 ;;
        --no-llama) llama=0; shift ;;
        --f16-too) f16too=1; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -f "$model" ] || { echo "no model at $model (scripts/fetch-demo-model.sh fetches the demo one)" >&2; exit 1; }
if [ "$llama" = 1 ] && ! .venv-llama/bin/python -c 'import llama_cpp' 2>/dev/null; then
    echo "run scripts/setup-llama-reference.sh first (or pass --no-llama)" >&2; exit 1
fi
cargo build --release -q -p frognano-model --example gguf_bench
bench=target/release/examples/gguf_bench
field() { python3 -c "import json,sys; v = json.loads(sys.stdin.read())['$1']; print(f'{v:.1f}' if isinstance(v, float) else v)"; }

echo "model $model, $threads threads, decode $decode tokens after each prompt, KV cache $kv (both sides)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "simd: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512bw|avx512vnni|avx512_vnni|fma|f16c)$' | sort -u | tr '\n' ' ')"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| prompt | FrogNano prefill tok/s | llama.cpp prefill tok/s | ratio | FrogNano decode tok/s | llama.cpp decode tok/s | ratio | FrogNano KV MiB | FrogNano f16 decode tok/s |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for n in ${lengths//,/ }; do
    fn=$("$bench" "$model" --prefill "$n" --decode "$decode" --threads "$threads" --kv-cache "$kv")
    # Each engine's result is printed as soon as it is known, so a peer that fails (a long
    # row takes most of an hour) loses nothing already measured.
    echo "frognano $n: $fn" >&2
    fp=$(echo "$fn" | field prefill_tok_s) fd=$(echo "$fn" | field decode_tok_s) kvb=$(echo "$fn" | field kv_bytes)
    if [ "$llama" = 1 ] && ln=$(.venv-llama/bin/python bench/llama_cpp_bench.py "$model" "$threads" "$n" "$decode" "$kv"); then
        lp=$(echo "$ln" | field prefill_tok_s) ld=$(echo "$ln" | field decode_tok_s)
        rp=$(python3 -c "print(f'{$fp / $lp:.2f}')") rd=$(python3 -c "print(f'{$fd / $ld:.2f}')")
    elif [ "$llama" = 1 ]; then
        lp=failed ld=failed rp=- rd=-
    else
        lp=- ld=- rp=- rd=-
    fi
    mib=$(python3 -c "print(f'{$kvb / 2**20:.1f}')")
    f16d=-
    if [ "$f16too" = 1 ]; then
        f16d=$("$bench" "$model" --prefill "$n" --decode "$decode" --threads "$threads" --kv-cache f16 | field decode_tok_s)
    fi
    echo "| $n | $fp | $lp | $rp | $fd | $ld | $rd | $mib | $f16d |"
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
