"""`frognano eval grade` locally vs through Ray (bench/ray_scaleout.sh runs this).

N generated instances of one bash project (the eval run test's project), gold predictions,
`--no-sandbox` off when bubblewrap works. Timed, one after the other in one run:

  local, --workers 1           | Ray, 1 node of 1 CPU         (overhead per unit)
  local, --workers 2           | Ray, 2 nodes of 1 CPU each   (speed-up from 1 to 2 nodes)
  local, 1 instance            | Ray, 1 node, 1 instance      (fixed cost of a --ray run)

Each Ray run uses a fresh cluster from scripts/ray-local-cluster.sh (started before the clock
starts) and a fresh output folder, so nothing is skipped as already done. The per-unit
overhead is ((ray N) - (local N) - (fixed cost)) / (N - 1), the fixed cost being
(ray 1 instance) - (local 1 instance): connecting the driver, starting Ray's worker process.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FROGNANO = os.environ.get("FROGNANO", os.path.join(ROOT, "target/debug/frognano"))
PYTHON = os.environ.get("FROGNANO_RAY_PYTHON", os.path.join(ROOT, ".venv-ray/bin/python"))
CLUSTER = os.path.join(ROOT, "scripts/ray-local-cluster.sh")


def git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def fixture(root, n):
    repo = os.path.join(root, "greet")
    os.makedirs(os.path.join(repo, "tests"))
    runner = open(os.path.join(ROOT, "crates/testkit/src/lib.rs")).read()
    runner = runner.split('pub const GOTEST_RUNNER: &str = "', 1)[1].split('";\n', 1)[0]
    runner = runner.encode().decode("unicode_escape")
    files = {"lib.sh": 'greet() { echo "Helo, $1"; }\n', "run_tests.sh": runner, "tests/other.t.sh": "TestTrue() { true; }\n"}
    for name, text in files.items():
        with open(os.path.join(repo, name), "w") as f:
            f.write(text)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "initial")
    base = git(repo, "rev-parse", "HEAD").strip()
    with open(os.path.join(repo, "lib.sh"), "w") as f:
        f.write('greet() { echo "Hello, $1"; }\n')
    gold = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    with open(os.path.join(repo, "tests/greet.t.sh"), "w") as f:
        f.write('TestGreet() { [ "$(greet Bob)" = "Hello, Bob" ]; }\n')
    git(repo, "add", "-N", "tests/greet.t.sh")
    test_patch = git(repo, "diff")
    git(repo, "reset", "-q")
    os.remove(os.path.join(repo, "tests/greet.t.sh"))
    path = os.path.join(root, "instances.jsonl")
    with open(path, "w") as f:
        for i in range(1, n + 1):
            f.write(
                json.dumps(
                    {
                        "instance_id": f"sh__greet-{i}",
                        "repo": "sh/greet",
                        "base_commit": base,
                        "repo_path": repo,
                        "patch": gold,
                        "test_patch": test_patch,
                        "problem_statement": "greet prints Helo",
                        "version": "0.1",
                        "log_parser": "gotest",
                        "test_cmd": "bash run_tests.sh",
                        "FAIL_TO_PASS": ["TestGreet"],
                        "PASS_TO_PASS": ["TestTrue"],
                    }
                )
                + "\n"
            )
    return path


def grade(instances, out, extra):
    args = [FROGNANO, "eval", "grade", "--instances", instances, "--predictions", "gold", "--run-id", "b"]
    args += ["--output", out, "--timeout", "60", *extra]
    t0 = time.monotonic()
    p = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, FROGNANO_RAY_PYTHON=PYTHON))
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{p.stderr}")
    report = json.load(open(os.path.join(out, "gold.b.json")))
    return wall, report["resolved_instances"]


def with_cluster(root, nodes, fn):
    d = tempfile.mkdtemp(prefix="c", dir=root)
    p = subprocess.run([CLUSTER, "start", d, "1", str(nodes)], capture_output=True, text=True, env=dict(os.environ, RAY_PYTHON=PYTHON))
    try:
        if p.returncode != 0:
            logs = "".join(open(os.path.join(d, f)).read()[-3000:] for f in sorted(os.listdir(d)) if f.endswith(".log"))
            sys.exit(f"the cluster did not start:\n{p.stderr}\n{logs}")
        address = open(os.path.join(d, "address")).read().strip()
        return fn(["--ray", address])
    finally:
        subprocess.run([CLUSTER, "stop", d], capture_output=True)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    sandbox = [] if subprocess.run(["bwrap", "--ro-bind", "/", "/", "true"], capture_output=True).returncode == 0 else ["--no-sandbox"]
    root = tempfile.mkdtemp(prefix="frognano-ray-bench")
    try:
        many, one = fixture(os.path.join(root, "many"), n), fixture(os.path.join(root, "one"), 1)
        runs = {}
        runs["local w1"] = grade(many, os.path.join(root, "o1"), ["--workers", "1", *sandbox])
        runs["ray 1 node"] = with_cluster(root, 1, lambda r: grade(many, os.path.join(root, "o2"), [*r, *sandbox]))
        runs["local w2"] = grade(many, os.path.join(root, "o3"), ["--workers", "2", *sandbox])
        runs["ray 2 nodes"] = with_cluster(root, 2, lambda r: grade(many, os.path.join(root, "o4"), [*r, *sandbox]))
        runs["local 1 inst"] = grade(one, os.path.join(root, "o5"), ["--workers", "1", *sandbox])
        runs["ray 1 inst"] = with_cluster(root, 1, lambda r: grade(one, os.path.join(root, "o6"), [*r, *sandbox]))
        print(f"instances: {n}; sandbox: {'bubblewrap' if not sandbox else 'none'}; binary: {FROGNANO}")
        for name, (wall, resolved) in runs.items():
            print(f"{name:14s} wall {wall:7.2f} s  resolved {resolved}")
        fixed = runs["ray 1 inst"][0] - runs["local 1 inst"][0]
        per_unit = (runs["ray 1 node"][0] - runs["local w1"][0] - fixed) / (n - 1)
        print(f"fixed cost of a --ray run: {fixed:.2f} s")
        print(f"overhead per unit through Ray (1 node of 1 CPU vs --workers 1): {per_unit * 1000:.0f} ms")
        print(f"local per unit (--workers 1): {runs['local w1'][0] / n * 1000:.0f} ms")
        print(f"speed-up 1 -> 2 Ray nodes: {runs['ray 1 node'][0] / runs['ray 2 nodes'][0]:.2f}x")
        print(f"speed-up local 1 -> 2 workers (peer): {runs['local w1'][0] / runs['local w2'][0]:.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
