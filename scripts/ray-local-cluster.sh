#!/usr/bin/env bash
# A two-node Ray cluster on this machine, for the tests and benchmarks of `--ray`:
#   scripts/ray-local-cluster.sh start DIR [CPUS_PER_NODE] [NODES]   head + NODES-1 worker nodes
#   scripts/ray-local-cluster.sh stop DIR                            kills every node it started
# `start` writes DIR/address (host:port of the head) and DIR/head.pgid, DIR/worker1.pgid, …:
# each node is a `ray start --block` in a session of its own, so `kill -9 -- -PGID` ends that
# node and everything it runs (raylet, workers, their `frognano unit`), as a lost machine
# would. Ray listens on the host's address (it binds every interface); nothing leaves the host.
# Worker node i listens on 127.0.0.(i+1), so that each node of this one host has an address
# of its own and a driver can be told to attach to the head (FROGNANO_RAY_NODE_IP, written to
# DIR/head-ip): otherwise Ray attaches it to any node here, and killing that node would take
# the driver with it, which is not what losing a worker machine does.
# Health checks are tightened so a killed node is declared dead in about two seconds instead
# of Ray's default half minute. Needs .venv-ray (scripts/setup-ray.sh) or RAY_PYTHON's ray.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cmd="${1:?usage: $0 start|stop DIR [CPUS_PER_NODE] [NODES]}"
dir="${2:?usage: $0 start|stop DIR [CPUS_PER_NODE] [NODES]}"
cpus="${3:-1}"
nodes="${4:-2}"
python="${RAY_PYTHON:-$root/.venv-ray/bin/python}"
ray_bin="$(dirname "$python")/ray"

stop() {
    for f in "$dir"/*.pgid; do
        [ -e "$f" ] || continue
        kill -9 -- "-$(cat "$f")" 2>/dev/null || true
        rm -f "$f"
    done
    if [ -e "$dir/ray-tmp" ]; then
        rm -rf "$(cat "$dir/ray-tmp")" "$dir/ray-tmp"
    fi
}

case "$cmd" in
stop) stop; exit 0 ;;
start) ;;
*) echo "unknown command $cmd (start or stop)" >&2; exit 2 ;;
esac

mkdir -p "$dir"
[ -x "$ray_bin" ] || { echo "no Ray at $ray_bin: run scripts/setup-ray.sh" >&2; exit 1; }
port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')"
export RAY_health_check_initial_delay_ms=1000 RAY_health_check_period_ms=500 \
    RAY_health_check_timeout_ms=500 RAY_health_check_failure_threshold=3 RAY_USAGE_STATS_ENABLED=0
# Ray's socket paths (…/session_<date>_<pid>/sockets/plasma_store.N) must fit in 107 bytes, so
# its folder is a short one of its own rather than one under DIR.
ray_tmp="$(mktemp -d /tmp/ray.XXXXXX)"
echo "$ray_tmp" >"$dir/ray-tmp"
common=(--num-cpus="$cpus" --object-store-memory=100000000 --disable-usage-stats --block)
trap 'stop' ERR
# Without job control a background job is not a group leader, so setsid runs in place and
# the PID of the job is the new session's (and process group's) id.
setsid "$ray_bin" start --head --port="$port" --include-dashboard=false --temp-dir="$ray_tmp" "${common[@]}" \
    >"$dir/head.log" 2>&1 &
echo $! >"$dir/head.pgid"
address=""
for _ in $(seq 100); do
    address="$(grep -oE "ray start --address='[^']+'" "$dir/head.log" | head -1 | sed -E "s/.*'(.+)'/\1/")" || true
    [ -n "$address" ] && break
    sleep 0.2
done
[ -n "$address" ] || { echo "the head did not start; $dir/head.log:" >&2; tail -20 "$dir/head.log" >&2; stop; exit 1; }
for i in $(seq 1 $((nodes - 1))); do
    setsid "$ray_bin" start --address="$address" --node-ip-address="127.0.0.$((i + 1))" "${common[@]}" >"$dir/worker$i.log" 2>&1 &
    echo $! >"$dir/worker$i.pgid"
done
# Ready when every node is alive.
"$python" - "$address" "$nodes" <<'PY'
import logging, sys, time
import ray
ray.init(address=sys.argv[1], logging_level=logging.ERROR, log_to_driver=False)
deadline = time.time() + 60
while sum(n["Alive"] for n in ray.nodes()) < int(sys.argv[2]):
    if time.time() > deadline:
        sys.exit(f"only {sum(n['Alive'] for n in ray.nodes())} of {sys.argv[2]} nodes came up")
    time.sleep(0.2)
PY
echo "$address" >"$dir/address"
echo "${address%:*}" >"$dir/head-ip"
trap - ERR
echo "ray cluster at $address: $nodes node(s) of $cpus CPU(s)"
