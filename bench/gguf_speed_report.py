"""Tables of bench/gguf_speed.sh: medians over its alternating rounds, FrogNano/llama.cpp ratios,
decode's weight bandwidth against the measured copy bandwidth, and above every table the CPU
model, its SIMD flags, the thread counts and the load average.

  gguf_speed_report.py single RUNS.jsonl MODEL THREADS PREFILL DECODE COPY_GBS LOAD_START LOAD_END
  gguf_speed_report.py matrix PLAN.tsv OUT.jsonl PREFILL DECODE RUNS COPY LOAD_START LOAD_END COMMAND COMMIT LLAMA_VERSION

RUNS.jsonl holds one JSON line per engine run (gguf_bench's and bench/llama_cpp_bench.py's).
PLAN.tsv holds one matrix row a line: key, label, threads, model file, status (ok, error or
skipped; reused for an ok row that --resume took from an earlier invocation), then the
row's RUNS.jsonl for ok and reused, the message for the others. COPY is
"THREADS=GB/s,..." for the thread counts of the matrix.
"""
import json
import os
import re
import statistics
import sys

# The goals of issue 17: FrogNano/llama.cpp >= 1.0 for prefill and >= 1.3 for decode, and
# decode's weight bandwidth >= 85 % of the copy bandwidth.
GOAL_PREFILL, GOAL_DECODE, GOAL_BANDWIDTH = 1.0, 1.3, 0.85
MARK = " ✗"
SIMD = re.compile(r"^(avx2|fma|f16c|avx512f|avx512bw|avx512_vnni|avx512_bf16|avx_vnni|amx_\w+)$")


def cpu_lines():
    """The CPU model name and the SIMD flags that matter for the kernels compared."""
    name, flags = "unknown", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name == "unknown":
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = [x for x in value.split() if SIMD.match(x)]
    except OSError:
        pass
    return (f"CPU: {name} ({os.cpu_count()} logical CPUs); SIMD flags: {' '.join(flags) or 'none'} "
            f"(of avx2 fma f16c avx512f avx512bw avx512_vnni avx512_bf16 amx_* avx_vnni)")


def read_runs(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def median(rows, engine, key):
    values = [r[key] for r in rows if r["engine"] == engine]
    return statistics.median(values) if values else None


def weight_bytes(rows):
    """FrogNano's weight bytes (what it reads per decoded token)."""
    return next(r["weight_bytes"] for r in rows if r["engine"] == "frognano")


def greedy_agreement(rows):
    """(steps equal from the start, steps) of the first round's greedy ids, FrogNano vs llama.cpp;
    None when a run did not record its ids. A kernel that is fast but wrong shows here: the two
    engines read the same weights and the same prompt, so only near-ties may part them."""
    a = next((r.get("tokens") for r in rows if r["engine"] == "llama.cpp"), None)
    b = next((r.get("tokens") for r in rows if r["engine"] == "frognano"), None)
    if not a or not b:
        return None
    same = 0
    while same < min(len(a), len(b)) and a[same] == b[same]:
        same += 1
    return same, len(a)


def greedy_text(agree):
    if agree is None:
        return "greedy ids not recorded"
    same, n = agree
    return f"greedy ids equal to llama.cpp's for all {n} steps" if same == n else \
        f"greedy ids part from llama.cpp's at step {same} of {n}"


def single(args):
    path, model, threads, pre, dec, copy_gbs, load_start, load_end, read_gbs = args
    rows = read_runs(path)
    copy_gbs, read_gbs = float(copy_gbs), float(read_gbs)
    wb = weight_bytes(rows)
    runs = sum(r["engine"] == "llama.cpp" for r in rows)
    print(cpu_lines())
    print(f"load average (1, 5, 15 min): start {load_start}, end {load_end}")
    print(f"model {model}, {threads} thread{'' if threads == '1' else 's'}, prefill {pre} tokens, decode {dec} tokens, "
          f"median of {runs} alternating rounds")
    plain = any(r["engine"] == "frognano-plain" for r in rows)
    head = f"{'':10} {'llama.cpp':>10} {'frognano':>10} {'ratio':>7}"
    print(head + (f" {'plain':>10} {'ratio':>7} {'new/plain':>9}" if plain else ""))
    for k, name in [("prefill_tok_s", "prefill"), ("decode_tok_s", "decode")]:
        a, b = median(rows, "llama.cpp", k), median(rows, "frognano", k)
        line = f"{name:10} {a:10.2f} {b:10.2f} {b / a if a else 0:7.2f}"
        if plain:
            p = median(rows, "frognano-plain", k)
            line += f" {p:10.2f} {p / a if a else 0:7.2f} {b / p if p else 0:9.2f}"
        print(line)
    ours = wb * median(rows, "frognano", "decode_tok_s") / 1e9
    print(f"decode weight bandwidth: frognano {ours:.2f} GB/s ({100 * ours / copy_gbs:.0f} % of copy, "
          f"{100 * ours / read_gbs:.0f} % of the {read_gbs} GB/s a 256-bit read loop reaches on {threads} thread(s)), "
          f"llama.cpp {wb * median(rows, 'llama.cpp', 'decode_tok_s') / 1e9:.2f} GB/s (weights {wb / 1e6:.1f} MB; "
          f"copy bandwidth measured just now, numpy copies of 256 MiB arrays on {threads} thread(s) at once: "
          f"{copy_gbs} GB/s read + write)")
    print(f"{greedy_text(greedy_agreement(rows))} (first round)")


def matrix(args):
    plan, out, pre, dec, runs, copy, load_start, load_end, command, commit, llama_version, readbw = args
    copy_gbs = {int(t): float(g) for t, g in (x.split("=") for x in copy.split(",") if x)}
    read_gbs = {int(t): float(g) for t, g in (x.split("=") for x in readbw.split(",") if x)}
    threads_list = sorted(copy_gbs)
    records, lines, parted = [], [], []
    for raw in open(plan):
        key, label, threads, model, status, rest = raw.rstrip("\n").split("\t", 5)
        threads = int(threads)
        rec = {"kind": "row", "key": key, "label": label, "threads": threads, "model": model,
               "prefill_tokens": int(pre), "decode_tokens": int(dec), "status": status}
        if status in ("ok", "reused"):
            rec["status"], rec["reused"] = "ok", status == "reused"
            rows = read_runs(rest)
            meta_path = rest + ".meta"
            if os.path.exists(meta_path):
                rec.update(json.load(open(meta_path)))
            wb = weight_bytes(rows)
            lp, fp = median(rows, "llama.cpp", "prefill_tok_s"), median(rows, "frognano", "prefill_tok_s")
            ld, fd = median(rows, "llama.cpp", "decode_tok_s"), median(rows, "frognano", "decode_tok_s")
            gbs = wb * fd / 1e9
            # A reused row keeps the copy bandwidth measured in its own invocation.
            row_copy = rec.get("copy_gb_s") or copy_gbs.get(threads)
            share = gbs / row_copy if row_copy else None
            row_read = rec.get("read_gb_s") or read_gbs.get(threads)
            read_share = gbs / row_read if row_read else None
            rec.update({"weight_bytes": wb, "file_bytes": os.path.getsize(model),
                        "llama_prefill_tok_s": lp, "frognano_prefill_tok_s": fp, "prefill_ratio": fp / lp,
                        "llama_decode_tok_s": ld, "frognano_decode_tok_s": fd, "decode_ratio": fd / ld,
                        "frognano_decode_gb_s": gbs, "copy_gb_s": row_copy,
                        "copy_share": share, "read_gb_s": row_read, "read_share": read_share, "runs": rows})
            agree = greedy_agreement(rows)
            rec["greedy_same_steps"], rec["greedy_steps"] = agree if agree else (None, None)
            if agree is None or agree[0] < agree[1]:
                parted.append(f"{label}, {threads} thread{'s' if threads > 1 else ''}: {greedy_text(agree)}")
            pr, dr = fp / lp, fd / ld
            cells = [f"{label} ({wb / 1e9:.2f} GB)", str(threads),
                     f"{lp:.2f}", f"{fp:.2f}", f"{pr:.2f}" + (MARK if pr < GOAL_PREFILL else ""),
                     f"{ld:.2f}", f"{fd:.2f}", f"{dr:.2f}" + (MARK if dr < GOAL_DECODE else ""),
                     f"{gbs:.2f}",
                     "" if share is None else f"{100 * share:.0f} %" + (MARK if share < GOAL_BANDWIDTH else ""),
                     "" if read_share is None else f"{100 * read_share:.0f} %"]
        else:
            rest = rest.strip()
            rec["message"] = rest
            cells = [label, str(threads), f"{status}: {rest}"] + [""] * 8
        records.append(rec)
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    header = ["model/type", "threads", "llama.cpp prefill tok/s", "FrogNano prefill tok/s", "ratio",
              "llama.cpp decode tok/s", "FrogNano decode tok/s", "ratio", "FrogNano decode GB/s",
              "% of copy bandwidth", "% of read bandwidth"]
    quiet = all(float(x.split()[0]) <= 0.5 for x in (load_start, load_end))
    print()
    print(cpu_lines())
    print(f"threads: {', '.join(map(str, threads_list))}; prefill {pre} tokens, decode {dec} tokens; "
          f"median of {runs} alternating rounds (odd rounds llama.cpp first, even ones FrogNano first)")
    print(f"load average (1, 5, 15 min): start {load_start}, end {load_end}"
          + ("" if quiet else " -- above 0.5: rerun on a quiet machine before recording"))
    print("copy bandwidth (numpy copies of 256 MiB arrays, one per thread, all threads at once, "
          "read + write bytes, best of 5): "
          + ", ".join(f"{t} thread{'s' if t > 1 else ''} {copy_gbs[t]:.1f} GB/s" for t in threads_list))
    print("read bandwidth (256-bit loads streaming a 256 MiB buffer per thread, all threads at once, best of 5; "
          "crates/model/examples/read_bandwidth.rs): "
          + ", ".join(f"{t} thread{'s' if t > 1 else ''} {read_gbs[t]:.1f} GB/s" for t in threads_list if t in read_gbs))
    print(f"llama.cpp: llama-cpp-python {llama_version} (scripts/setup-llama-reference.sh, AMX compiled out); "
          f"FrogNano: gguf_bench at {commit}")
    print(f"command: {command}")
    reused = sum(r.get("reused", False) for r in records)
    if reused:
        print(f"{reused} of {len(records)} rows reused from an earlier invocation (--resume); "
              "each row's own start time and load average are in the JSON lines")
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    print("\n".join(lines))
    print()
    print(f"{MARK.strip()} below the goal: prefill ratio < {GOAL_PREFILL}, decode ratio < {GOAL_DECODE}, "
          f"decode weight bandwidth < {GOAL_BANDWIDTH:.0%} of the copy bandwidth with as many threads. "
          "GB/s = FrogNano's weight bytes x its decode tok/s.")
    n_ok = sum(r["status"] == "ok" for r in records)
    print(f"Greedy ids (first round, FrogNano vs llama.cpp, same prompt): equal for every step in "
          f"{n_ok - len(parted)} of {n_ok} timed rows" + ("." if not parted else "; not in:"))
    for p in parted:
        print(f"  {p}")
    conditions = {"kind": "conditions", "cpu": cpu_lines(), "threads": threads_list, "prefill_tokens": int(pre),
                  "decode_tokens": int(dec), "runs": int(runs), "load_start": load_start, "load_end": load_end,
                  "copy_gb_s": {str(t): g for t, g in copy_gbs.items()},
                  "read_gb_s": {str(t): g for t, g in read_gbs.items()}, "command": command, "commit": commit,
                  "llama_cpp_python": llama_version}
    with open(out + ".part", "w") as f:
        for rec in [conditions] + records:
            f.write(json.dumps(rec) + "\n")
    os.replace(out + ".part", out)
    print(f"JSON lines: {out}")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("single", "matrix"):
        sys.exit(__doc__)
    {"single": single, "matrix": matrix}[sys.argv[1]](sys.argv[2:])
