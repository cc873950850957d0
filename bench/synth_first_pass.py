#!/usr/bin/env python3
"""What the cheap first pass (docs/synthesis.md §5) did in a `frognano synth batch` output.

Reads OUT/packages/*/candidates.jsonl (each candidate's `seconds` and `first_pass`) and
summary.json (`reference_seconds`), and prints per package: candidates, first passes run,
first-pass rejections, the seconds those first passes took, and the estimate of the test
seconds the first pass saved: each rejection there would otherwise have cost one full-suite
run (the package's reference time), and each candidate that went on paid its first pass on
top. An estimate from one run, not a side-by-side measurement: compare with a run under
FROGNANO_SYNTH_FIRST_PASS=0 for that.

    bench/synth_first_pass.py OUT
"""
import json
import pathlib
import sys


def main(out: pathlib.Path) -> None:
    rows = []
    for pkg in sorted((out / "packages").glob("*")):
        cands = pkg / "candidates.jsonl"
        summary = pkg / "summary.json"
        if not cands.exists() or not summary.exists():
            continue
        ref = json.loads(summary.read_text()).get("reference_seconds", 0.0)
        n = passes = rejected = 0
        pass_s = saved = spent = 0.0
        for line in cands.read_text().splitlines():
            c = json.loads(line)
            n += 1
            spent += c.get("seconds", 0.0)
            fp = c.get("first_pass")
            if not fp:
                continue
            passes += 1
            pass_s += fp["seconds"]
            if fp["rejected"]:
                rejected += 1
                saved += ref - fp["seconds"]
            else:
                saved -= fp["seconds"]
        rows.append((pkg.name, n, passes, rejected, pass_s, saved, spent, ref))
    print("| package | candidates | first passes | rejected there | first-pass s | est. saved test s | candidate s | reference s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r[2]:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.0f} | {r[5]:.0f} | {r[6]:.0f} | {r[7]:.1f} |")
    tot = [sum(r[i] for r in rows) for i in range(1, 7)]
    print(f"\nall packages: {tot[0]} candidates, {tot[1]} first passes ({sum(1 for r in rows if r[2])} of "
          f"{len(rows)} packages), {tot[2]} rejected there; first passes {tot[3]:.0f} s; "
          f"estimated test seconds saved {tot[4]:.0f} of {tot[5]:.0f} spent on candidates")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
