#!/usr/bin/env bash
# fvd's scheduler throughput beside Ray's asynchronous task throughput, in
# one run on the same machine. Installs the pinned ray (bench/requirements.txt)
# into a venv of its own, target/bench-ray, the first time.
#
#   bash bench/scheduler_vs_ray.sh [WORKERS] [GPUS] [JOBS] [RAY_TASKS]
#
# fvd: WORKERS simulated workers x GPUS GPUs over loopback gRPC, JOBS
# zero-length one-GPU jobs (defaults 1000 8 100000). Ray: RAY_TASKS no-op
# tasks (default 20000). Note the two measure different things: fvd leases
# GPU slots durably (SQLite, synchronous=FULL) to remote workers; Ray runs
# Python functions in its local worker pool.
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-1000}; G=${2:-8}; J=${3:-100000}; R=${4:-20000}
ray_py=target/bench-ray/bin/python
if ! "$ray_py" -c "import ray" 2>/dev/null; then
    python3 -m venv target/bench-ray
    "$ray_py" -m pip install --quiet -r bench/requirements.txt
fi
fvd_out=$(cargo bench --quiet -p fvd-orchestrator --bench scheduler -- "$W" "$G" "$J")
echo "$fvd_out"
ray_out=$("$ray_py" bench/ray_tasks.py "$R")
echo "$ray_out"
fvd=$(echo "$fvd_out" | awk '/^RESULT fvd_dispatches_per_s/ {print $3}')
ray=$(echo "$ray_out" | awk '/^RESULT ray_tasks_per_s/ {print $3}')
python3 -c "print(f'ratio fvd dispatches/s over ray tasks/s: {float($fvd) / float($ray):.1f}x')"
