"""`frognano synth` and `frognano train` through Ray vs locally (bench/ray_units.sh runs this).

Timed one after the other in one run, each Ray run on a fresh cluster from
scripts/ray-local-cluster.sh (started before the clock starts) and a fresh output folder:

  synth: the pyproj fixture (crates/synth/tests/fixtures/pyproj, unittest with the system
         python3), --max-candidates N, seed 1; a unit is one candidate's validation.
         local --workers 1 | Ray, 1 node of 1 CPU      (overhead per unit)
         local --workers 2 | Ray, 2 nodes of 1 CPU     (speed-up 1 -> 2 nodes)
         local, 1 candidate | Ray, 1 candidate          (fixed cost of a --ray run)
  train: the toy (--toy), S steps of 4 tasks x 4 attempts; a unit is one rollout group.
         local | Ray, 1 node | Ray, 2 nodes; the Ray runs pay a driver start per step.

Per-unit overhead = ((ray N) - (local N) - (fixed cost)) / (N - 1) for synth, and
((ray) - (local)) / groups for train (there the fixed cost recurs every step: it is reported
per step too).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ray_scaleout import FROGNANO, PYTHON, ROOT, git, with_cluster  # noqa: E402


def pyproj(root):
    repo = os.path.join(root, "pyproj")
    shutil.copytree(os.path.join(ROOT, "crates/synth/tests/fixtures/pyproj"), repo)
    with open(os.path.join(repo, ".gitignore"), "w") as f:
        f.write("__pycache__/\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "fixture")
    return repo


def timed(args):
    t0 = time.monotonic()
    p = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, FROGNANO_RAY_PYTHON=PYTHON))
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{p.stdout}\n{p.stderr}")
    return wall, p.stdout


def synth(repo, out, n, extra):
    args = [FROGNANO, "synth", repo, "--out", out, "--python", "python3", "--seed", "1"]
    wall, stdout = timed(args + ["--max-candidates", str(n), *extra])
    return wall, stdout.splitlines()[0]


def train(out, steps, extra):
    args = [FROGNANO, "train", "--toy", "--steps", str(steps), "--tasks-per-step", "4", "--group-size", "4"]
    wall, _ = timed(args + ["--seed", "7", "--out", out, *extra])
    return wall, open(os.path.join(out, "metrics.jsonl")).read().count("\n")


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    sandbox = [] if subprocess.run(["bwrap", "--ro-bind", "/", "/", "true"], capture_output=True).returncode == 0 else ["--no-sandbox"]
    root = tempfile.mkdtemp(prefix="frognano-ray-units")
    try:
        repo = pyproj(root)
        o = lambda name: os.path.join(root, name)  # noqa: E731
        s = {}
        s["local w1"] = synth(repo, o("s1"), n, ["--workers", "1", *sandbox])
        s["ray 1 node"] = with_cluster(root, 1, lambda r: synth(repo, o("s2"), n, [*r, *sandbox]))
        s["local w2"] = synth(repo, o("s3"), n, ["--workers", "2", *sandbox])
        s["ray 2 nodes"] = with_cluster(root, 2, lambda r: synth(repo, o("s4"), n, [*r, *sandbox]))
        s["local 1 cand"] = synth(repo, o("s5"), 1, ["--workers", "1", *sandbox])
        s["ray 1 cand"] = with_cluster(root, 1, lambda r: synth(repo, o("s6"), 1, [*r, *sandbox]))
        t = {}
        t["local"] = train(o("t1"), steps, [])
        t["ray 1 node"] = with_cluster(root, 1, lambda r: train(o("t2"), steps, r))
        t["ray 2 nodes"] = with_cluster(root, 2, lambda r: train(o("t3"), steps, r))
        print(f"synth: {n} candidates of pyproj; sandbox: {'bubblewrap' if not sandbox else 'none'}; binary: {FROGNANO}")
        for name, (wall, line) in s.items():
            print(f"  {name:13s} wall {wall:7.2f} s  {line}")
        fixed = s["ray 1 cand"][0] - s["local 1 cand"][0]
        per_unit = (s["ray 1 node"][0] - s["local w1"][0] - fixed) / (n - 1)
        print(f"  fixed cost of a --ray run: {fixed:.2f} s")
        print(f"  local per candidate (--workers 1): {s['local w1'][0] / n * 1000:.0f} ms")
        print(f"  overhead per candidate through Ray (1 node of 1 CPU vs --workers 1): {per_unit * 1000:.0f} ms")
        print(f"  speed-up 1 -> 2 Ray nodes: {s['ray 1 node'][0] / s['ray 2 nodes'][0]:.2f}x; local 1 -> 2 workers: {s['local w1'][0] / s['local w2'][0]:.2f}x")
        groups = steps * 4
        print(f"train: --toy, {steps} steps x 4 groups of 4 attempts ({groups} units)")
        for name, (wall, rows) in t.items():
            print(f"  {name:13s} wall {wall:7.2f} s  ({rows} steps)")
        print(f"  local per step: {t['local'][0] / steps:.2f} s; Ray (1 node) per step: {t['ray 1 node'][0] / steps:.2f} s")
        print(f"  overhead per group through Ray (1 node): {(t['ray 1 node'][0] - t['local'][0]) / groups * 1000:.0f} ms")
        print(f"  speed-up 1 -> 2 Ray nodes: {t['ray 1 node'][0] / t['ray 2 nodes'][0]:.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
