#!/usr/bin/env python3
"""End-to-end check of fvd_trace.attach on a real torch model (needs torch;
run on a GPU machine, CPU works too). Writes into OUT_DIR:

  ref.jsonl / ref.safetensors     fp32 run, 3 steps
  noise.jsonl                     bf16 run of the same weights
  bug.jsonl / bug.safetensors     fp32 run with block 2's second norm at a wrong eps
  sp_rank{0,1}.jsonl              (under torchrun --nproc_per_node 2, SP=1) each
                                  rank traces its half of the sequence

`fvd trace compare/dumps` are then run on these files by the caller.

Usage: [D=64] gpu_check.py OUT_DIR     (single process: ref, noise, bug; D: width)
       SP=1 torchrun --nproc_per_node 2 gpu_check.py OUT_DIR
"""

import os
import sys

import torch
import torch.nn as nn

import fvd_trace
from fvd_trace import TraceConfig


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.ffn = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.proj(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class Net(nn.Module):
    def __init__(self, d=256, n=4, vocab=1000):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.final_norm = nn.LayerNorm(d)

    def forward(self, ids):
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return self.final_norm(x)


def run(out, name, dtype=torch.float32, bug=False, ids_slice=None, dump=True):
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = Net(d=int(os.environ.get("D", "256"))).to(dev)
    if bug:
        model.blocks[2].norm2.eps = 1.0
    model = model.to(dtype)
    ids = torch.randint(0, 1000, (1, 128), generator=torch.Generator().manual_seed(1)).to(dev)
    if ids_slice is not None:
        ids = ids[:, ids_slice]
    cfg = TraceConfig(
        stats=("abs_mean", "sum", "min", "max", "mean", "std", "shape", "dtype"),
        output=os.path.join(out, f"{name}.jsonl"),
        dump=os.path.join(out, f"{name}.safetensors") if dump else None,
    )
    handle = fvd_trace.attach(model, config=cfg)
    with torch.no_grad(), handle:
        for step in range(3):
            handle.set_step(step)
            model(ids)
    print(f"{name}: {handle.modules} modules traced -> {handle.output}")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    if os.environ.get("SP") == "1":
        rank = int(os.environ["RANK"])
        half = 64
        # Per-token model: each rank's half of the sequence is exact SP.
        run(out, "sp", ids_slice=slice(rank * half, (rank + 1) * half), dump=False)
        # The env-var path too: FASTVIDEO_TRACE_* as FastVideo reads them.
        env = {
            "FASTVIDEO_TRACE_ACTIVATIONS": "1",
            "FASTVIDEO_TRACE_LAYERS": r"^blocks\.\d+$",
            "FASTVIDEO_TRACE_STATS": "abs_mean,max,shape",
            "FASTVIDEO_TRACE_STEPS": "1",
            "FASTVIDEO_TRACE_OUTPUT": os.path.join(out, "env_<pid>.jsonl"),
        }
        torch.manual_seed(0)
        model = Net(d=int(os.environ.get("D", "256")))
        h = fvd_trace.attach(model, config=TraceConfig.from_env(env))
        with torch.no_grad(), h:
            for step in range(3):
                h.set_step(step)
                model(torch.zeros(1, 8, dtype=torch.long))
        print(f"env run: {h.modules} modules -> {h.output}")
        return
    run(out, "ref")
    run(out, "noise", dtype=torch.bfloat16, dump=False)
    run(out, "bug", bug=True)


if __name__ == "__main__":
    main()
