"""Ray driver of `frognano eval … | synth … | train … --ray ADDRESS`.

The `frognano` process that the user started (the Rust driver) runs this script with the
Python that has Ray installed, writes the units of its run to our stdin as JSON lines
`{"index": i, "unit": {...}}` and closes it. We submit one Ray task per unit; each task runs
`frognano unit` on whatever node Ray picks, feeds it the unit on stdin, and hands back
what it prints: the result and the text of every file the unit wrote. As each task finishes
we print one JSON line to stdout:

    {"index": i, "ok": ANSWER, "node": NODE_ID, "worker_seconds": S, "seconds": S}
    {"index": i, "error": "why", "node": ..., "seconds": S}

and the Rust side writes the files and result rows exactly as a local run writes them. The
first line is `{"event": "cluster", "nodes": N, "cpus": C}`.

Fault handling is Ray's: a task whose worker process or node dies is run again, up to
`--max-retries` times (Ray's `max_retries`, counting only system failures). A unit that fails
on its own (`frognano unit` exits non-zero) is not retried; it comes back as an error.
Whatever happens, each index is printed at most once, so nothing is written twice; an index
never printed (this driver killed) is simply not written, and a rerun of the same command
runs it.
"""

import argparse
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import ray

# prctl(PR_SET_PDEATHSIG, SIGKILL): the `frognano unit` child dies with the Ray worker
# that started it, so a killed node leaves no unit running on behind Ray's back.
PR_SET_PDEATHSIG = 1


def _die_with_parent():
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not glibc Linux: the child merely outlives a killed worker


class UnitFailed(Exception):
    """`frognano unit` exited non-zero: the unit's own failure, not the cluster's."""


@ray.remote
def run_unit(frognano_hint, unit_text):
    """Runs one unit with the node's `frognano`: $FROGNANO_BIN, else the driver's path when
    this node has that file, else `frognano` on PATH."""
    exe = os.environ.get("FROGNANO_BIN")
    if not exe:
        exe = frognano_hint if os.path.isfile(frognano_hint) else shutil.which("frognano")
    if not exe:
        raise UnitFailed(f"no frognano on this node: set FROGNANO_BIN or put it on PATH (driver's: {frognano_hint})")
    node = ray.get_runtime_context().get_node_id()
    env = dict(os.environ, FROGNANO_RAY_NODE=node)
    started = time.monotonic()
    proc = subprocess.run(
        [exe, "unit"],
        input=unit_text,
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=_die_with_parent,
    )
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
        raise UnitFailed(f"frognano unit exited with {proc.returncode} on node {node[:12]}: {tail}")
    return {"answer": proc.stdout, "node": node, "worker_seconds": time.monotonic() - started}


def check_reachable(address):
    """Fails at once when a `host:port` address does not answer: `ray.init` would otherwise
    retry for minutes before giving up. `auto` and `ray://` addresses are left to Ray."""
    if address == "auto" or "://" in address or ":" not in address:
        return
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except (OSError, ValueError) as e:
        sys.exit(f"cannot reach the Ray cluster at {address}: {e}")


# The answers go out on the stdout we were given; everything else that writes to fd 1 (Ray
# prints cluster events there, e.g. a node marked dead) is sent to stderr instead, so that the
# Rust side reads nothing but answers.
ANSWERS = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr


def emit(obj):
    ANSWERS.write(json.dumps(obj) + "\n")
    ANSWERS.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--address", required=True, help="Ray cluster address (host:port, ray://…, or auto)")
    ap.add_argument("--frognano", required=True, help="the driver's frognano executable")
    ap.add_argument("--num-cpus", type=float, default=1.0, help="CPUs one unit needs")
    ap.add_argument("--memory", type=int, default=0, help="bytes of memory one unit needs (0: not declared)")
    ap.add_argument("--max-retries", type=int, default=3, help="reruns of a unit whose worker or node died")
    args = ap.parse_args()

    items = [json.loads(line) for line in sys.stdin if line.strip()]
    check_reachable(args.address)
    # Several nodes on one host (scripts/ray-local-cluster.sh) share it: FROGNANO_RAY_NODE_IP
    # says which one this driver attaches to (the head's IP there), else Ray picks one.
    node_ip = os.environ.get("FROGNANO_RAY_NODE_IP") or None
    ray.init(address=args.address, _node_ip_address=node_ip, logging_level=logging.ERROR, log_to_driver=False)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    # Ray waits for ever on a task no node can hold (it may expect an autoscaler to add one):
    # refuse the run instead when no live node is big enough.
    fits = [
        n
        for n in nodes
        if n["Resources"].get("CPU", 0) >= args.num_cpus and n["Resources"].get("memory", 0) >= args.memory
    ]
    if nodes and not fits:
        largest = max(nodes, key=lambda n: (n["Resources"].get("CPU", 0), n["Resources"].get("memory", 0)))
        sys.exit(
            f"no node of the cluster can run a unit of --ray-cpus {args.num_cpus:g} and --ray-memory "
            f"{args.memory / 2**30:.2f} GiB; the largest has {largest['Resources'].get('CPU', 0):g} CPU(s) and "
            f"{largest['Resources'].get('memory', 0) / 2**30:.2f} GiB"
        )
    emit({"event": "cluster", "nodes": len(nodes), "cpus": ray.cluster_resources().get("CPU", 0)})

    options = {"num_cpus": args.num_cpus, "max_retries": args.max_retries, "retry_exceptions": False}
    if args.memory > 0:
        options["memory"] = args.memory
    task = run_unit.options(**options)
    pending = {}
    for item in items:
        ref = task.remote(args.frognano, json.dumps(item["unit"]))
        pending[ref] = (item["index"], time.monotonic())
    waiting = list(pending)
    while waiting:
        done, waiting = ray.wait(waiting, num_returns=1)
        for ref in done:
            index, submitted = pending.pop(ref)
            seconds = round(time.monotonic() - submitted, 3)
            try:
                out = ray.get(ref)
            except ray.exceptions.RayTaskError as e:
                cause = e.cause if getattr(e, "cause", None) is not None else e
                emit({"index": index, "error": str(cause).strip().splitlines()[-1], "seconds": seconds})
                continue
            except Exception as e:  # noqa: BLE001 - one unit's failure must not end the others
                # Retries exhausted after lost workers or nodes (RayError), or anything else
                # Ray raised for this task.
                emit({"index": index, "error": f"{type(e).__name__}: {e}".strip().splitlines()[0], "seconds": seconds})
                continue
            try:
                answer = json.loads(out["answer"])
            except json.JSONDecodeError as e:
                emit({"index": index, "error": f"unreadable answer from node {out['node'][:12]}: {e}", "seconds": seconds})
                continue
            emit(
                {
                    "index": index,
                    "ok": answer,
                    "node": out["node"],
                    "worker_seconds": round(out["worker_seconds"], 3),
                    "seconds": seconds,
                }
            )


if __name__ == "__main__":
    main()
