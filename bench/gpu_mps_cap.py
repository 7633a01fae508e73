#!/usr/bin/env python3
"""Issue #44 on a GPU: under `fvd worker --mps`, a run sharing its GPU is
capped at the MiB it was placed by. The four single-GPU `examples/gpuport`
tests (each peaks at about 970 MiB) declare `gpu_memory_mib = --mib`
(default 700: too little), so each runs out of memory at its cap while it
shares the GPU. fvd must record those runs as `shared_oom` (no verdict),
rerun each alone (uncapped) and take that run's verdict: the port passes,
and no run beside a capped one was harmed.

  python3 bench/gpu_mps_cap.py --fvd FVD [--mib 700] [--out DIR]

First a raw check of the cap itself (a torch client of the worker's MPS
daemon allocating past and under its limit), then the port. Results:
DIR/gpu_mps_cap.json and progress lines on stdout.
"""

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_share import port_copy, spec_for  # noqa: E402
from gpu_warm import ROOT, Fleet, bench_env, log, save_logs  # noqa: E402

RAW = """
import os, torch
try:
    x = torch.empty(int(os.environ['ALLOC_MIB']) << 20, dtype=torch.uint8, device='cuda')
    torch.cuda.synchronize()
    print('allocated', os.environ['ALLOC_MIB'], 'MiB')
except torch.OutOfMemoryError as e:
    print('out of memory:', str(e).splitlines()[0])
"""


def raw_check(work, env):
    """The cap without fvd: a daemon of our own, one client past its limit
    and one under it."""
    mps = dict(env, CUDA_MPS_PIPE_DIRECTORY=os.path.join(work, "raw-pipe"),
               CUDA_MPS_LOG_DIRECTORY=os.path.join(work, "raw-log"))
    for d in ("raw-pipe", "raw-log"):
        os.makedirs(os.path.join(work, d), exist_ok=True)
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=mps, check=True)
    out = {}
    try:
        # the limit counts the client's CUDA context (about 516 MiB on an H200)
        for alloc in (2048, 512, 256):
            r = subprocess.run([sys.executable, "-c", RAW], capture_output=True, text=True, timeout=120,
                               env=dict(mps, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=1024M", ALLOC_MIB=str(alloc)))
            out[f"limit 1024 MiB, allocate {alloc} MiB"] = (r.stdout + r.stderr).strip().splitlines()[-1:]
            log(f"raw: limit 1024 MiB, allocate {alloc} MiB: {out[f'limit 1024 MiB, allocate {alloc} MiB']}")
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=mps)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fvd", required=True)
    ap.add_argument("--mib", type=int, default=700)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "bench", "out", "gpu_mps_cap")))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gpu_mps_cap.")
    env = bench_env(work)
    os.environ.update(env)
    result = {"mib": args.mib, "raw": raw_check(work, env)}
    with open(os.path.join(ROOT, "examples", "gpuport", "tests", "local_tests", "gpuport", "port.toml")) as f:
        src = f.read()
    family = "capped"
    repo = port_copy(work, "repo", family, spec_for(src, family, "share", "300", os.path.join(work, "body.jsonl"), args.mib))
    fleet = Fleet(args.fvd, work, "mps", env, worker_args=["--mps"])
    try:
        r = fleet.submit(args.fvd, family, repo, [], timeout=args.timeout)
        result["submit"] = r
        con = sqlite3.connect(fleet.db)
        rows = con.execute("SELECT component, run_no, state, verdict, reason, peak_gpu_mib, next_gpu_mib FROM jobs "
                           "ORDER BY component, run_no").fetchall()
        con.close()
        result["jobs"] = [dict(zip(["component", "run", "state", "verdict", "reason", "peak_gpu_mib",
                                    "next_gpu_mib"], row)) for row in rows]
        for j in result["jobs"]:
            log(f"{j['component']} run {j['run']}: {j['state']} {j['verdict']} peak {j['peak_gpu_mib']} "
                f"next {j['next_gpu_mib']}: {(j['reason'] or '')[:160]}")
        log(f"submit exit {r['exit']} in {r['wall_s']:.1f} s")
    finally:
        fleet.stop()
        with open(os.path.join(args.out, "gpu_mps_cap.json"), "w") as f:
            json.dump(result, f, indent=1)
        save_logs(work, args.out, 60000)
    log("done")


if __name__ == "__main__":
    main()
