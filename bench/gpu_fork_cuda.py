#!/usr/bin/env python3
"""Issue #33 item 3: does a forked child's CUDA start-up grow when several
start at once, as warm runs on one worker do?

  python3 bench/gpu_fork_cuda.py [--levels 1,2,4] [--rounds 3] [--out DIR]

A parent imports what fvd's zygote preloads for examples/gpuport (torch,
transformers' GPT-2), freezes it (gc.freeze, as the zygote does), then for
each K forks K children and releases them together; child i sees GPU i
alone (CUDA_VISIBLE_DEVICES, as fvd sets it) and times
`torch.cuda.is_available()` (the driver's initialisation), then
`torch.cuda.set_device(0)` (the context), then a first kernel and copy.
Per K, the medians and the maximum over rounds x children. No fvd and no
pytest: only the CUDA part of a warm run's start-up.

Results: DIR/gpu_fork_cuda.json and lines on stdout.
"""

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

PRELOAD = ["torch", "transformers", "transformers.models.gpt2.modeling_gpt2"]


def child(i, go, out):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(i)
    os.read(go, 1)
    import torch

    t0 = time.perf_counter()
    ok = torch.cuda.is_available()
    t1 = time.perf_counter()
    torch.cuda.set_device(0)
    t2 = time.perf_counter()
    x = torch.ones(1024, device="cuda") * 2
    float(x.sum())
    t3 = time.perf_counter()
    with open(out, "a") as f:
        f.write(json.dumps({"gpu": i, "ok": ok, "init": t1 - t0, "context": t2 - t1, "first_kernel": t3 - t2,
                            "total": t3 - t0}) + "\n")
    os._exit(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/out/gpu_fork_cuda"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    gc.collect()
    gc.freeze()
    work = tempfile.mkdtemp(prefix="gpu_fork_cuda.")
    result = {}
    for k in [int(x) for x in args.levels.split(",")]:
        out = os.path.join(work, f"k{k}.jsonl")
        for _ in range(args.rounds):
            go_r, go_w = os.pipe()
            pids = []
            for i in range(k):
                pid = os.fork()
                if pid == 0:
                    os.close(go_w)
                    child(i, go_r, out)
                pids.append(pid)
            os.close(go_r)
            os.write(go_w, b"x" * k)
            os.close(go_w)
            for pid in pids:
                os.waitpid(pid, 0)
        with open(out) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        med = {p: round(statistics.median(r[p] for r in recs), 3) for p in ("init", "context", "first_kernel", "total")}
        result[str(k)] = {"median": med, "max_total": round(max(r["total"] for r in recs), 3), "runs": recs}
        print(f"[gpu_fork_cuda] {k} at once ({len(recs)} children): median init {med['init']:.3f} s, context "
              f"{med['context']:.3f} s, first kernel {med['first_kernel']:.3f} s, total {med['total']:.3f} s; "
              f"max total {result[str(k)]['max_total']:.3f} s", flush=True)
    with open(os.path.join(args.out, "gpu_fork_cuda.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
