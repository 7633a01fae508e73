#!/usr/bin/env python3
"""Issue #44: where a start-up-bound parity run's time goes when K runs
share one GPU, phase by phase, and what the CPU thread pools have to do
with it.

  python3 bench/gpu_contention.py [--k 1,4] [--threads default,4,1] [--reps 3] [--out DIR]

Each configuration starts K fresh processes that import torch,
transformers' GPT-2 and GpuPort's modules first (not timed), then wait for
one common start time and do what `examples/gpuport`'s encoder test does
with GPUPORT_REPEATS=1, timing each step: CUDA context (set_device and a
first allocation), the official model built on the CPU, moved to the GPU,
the port built and loaded, the first check (first kernels) and a second
check. `--threads N` calls torch.set_num_threads(N) before the start time,
as a warm runner's child could; `default` leaves torch's pool (one thread
per core).

Results: one JSON line per process in DIR/gpu_contention.jsonl and the
medians per configuration on stdout.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = os.path.join(ROOT, "examples", "gpuport")
STEPS = ["context", "build", "to_gpu", "port", "first_check", "second_check"]

CHILD = r'''
import json, os, sys, time
sys.path[0:0] = [PORT, os.path.join(PORT, "official")]
import torch
import transformers.models.gpt2.modeling_gpt2  # noqa: F401
from fastvideo.models.encoders.gpuport import GpuPortArchConfig, GpuPortEncoder
from fastvideo.models.loader.gpuport_mapping import convert_official_state_dict, official_weights
from gpuport_official import OFFICIAL_CONFIG, build_official
threads = sys.argv[2]
if threads != "default":
    torch.set_num_threads(int(threads))
go = float(sys.argv[1])
while time.time() < go:
    time.sleep(0.001)
marks = [time.time()]
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
torch.empty(1, device=dev)
torch.cuda.synchronize(dev)
torch.backends.cuda.matmul.allow_tf32 = False
marks.append(time.time())
from transformers import GPT2Model
official = build_official("cpu")
marks.append(time.time())
official = official.to(dev)
torch.cuda.synchronize(dev)
marks.append(time.time())
port = GpuPortEncoder(GpuPortArchConfig.from_official(official.config))
port.load_state_dict(convert_official_state_dict(official_weights(official)), strict=True)
port = port.to(dev).eval()
torch.cuda.synchronize(dev)
marks.append(time.time())
for i in range(2):
    g = torch.Generator(device=dev).manual_seed(1000 + i)
    ids = torch.randint(0, OFFICIAL_CONFIG["vocab_size"], (16, 512), generator=g, device=dev)
    with torch.no_grad():
        expected = official(input_ids=ids).last_hidden_state
        actual = port(ids)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=5e-5)
    torch.cuda.synchronize(dev)
    marks.append(time.time())
print(json.dumps({"threads": torch.get_num_threads(), "steps": [b - a for a, b in zip(marks, marks[1:])],
                  "total": marks[-1] - marks[0]}))
'''


def run(k, threads, lead_s=10.0):
    go = time.time() + lead_s
    procs = [subprocess.Popen([sys.executable, "-c", CHILD.replace("PORT", repr(PORT)), str(go), threads],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(k)]
    out = []
    for p in procs:
        o, e = p.communicate(timeout=120)
        if p.returncode != 0:
            raise SystemExit(f"a child failed ({p.returncode}): {e[-2000:]}")
        out.append(json.loads(o.strip().splitlines()[-1]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", default="1,4")
    ap.add_argument("--threads", default="default,4,1")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", tempfile.mkdtemp(prefix="gpu_contention.")))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = {}
    with open(os.path.join(args.out, "gpu_contention.jsonl"), "w") as f:
        for rep in range(args.reps):
            for k in [int(x) for x in args.k.split(",")]:
                for threads in args.threads.split(","):
                    for r in run(k, threads):
                        r.update(k=k, threads_asked=threads, rep=rep)
                        f.write(json.dumps(r) + "\n")
                        rows.setdefault((k, threads), []).append(r)
                    f.flush()
                    print(f"rep {rep} k={k} threads={threads} done", flush=True)
    for (k, threads), rs in rows.items():
        meds = {s: round(statistics.median(r["steps"][i] for r in rs), 3) for i, s in enumerate(STEPS)}
        total = round(statistics.median(r["total"] for r in rs), 3)
        print(f"k={k} threads={threads} (torch {rs[0]['threads']}): total {total} s, {meds}", flush=True)


if __name__ == "__main__":
    main()
