#!/usr/bin/env python3
"""Ray's asynchronous task throughput on this machine: N no-op tasks
submitted at once, then gathered; the peer figure for fvd's scheduler
benchmark (orchestrator/benches/scheduler.rs). Prints `RESULT
ray_tasks_per_s X`.

Usage: python3 bench/ray_tasks.py [N]
"""

import os
import sys
import time

import ray


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")

    @ray.remote
    def noop():
        return None

    ray.get([noop.remote() for _ in range(500)])  # warm the worker pool
    start = time.perf_counter()
    ray.get([noop.remote() for _ in range(n)])
    secs = time.perf_counter() - start
    print(f"ray {ray.__version__}: {n} no-op tasks submitted at once on {os.cpu_count()} cores")
    print(f"  wall {secs:.2f} s, {n / secs:.0f} tasks/s")
    print(f"RESULT ray_tasks_per_s {n / secs:.1f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
