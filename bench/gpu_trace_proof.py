#!/usr/bin/env python3
"""fvd_trace on the gpuport model, one process against two tensor-parallel ranks.

  python3 bench/gpu_trace_proof.py reference DIR
  torchrun --standalone --nproc_per_node=2 bench/gpu_trace_proof.py port DIR [--bug]

`reference` traces the official (transformers) GPT-2 MLP of layer 0 in one
process: DIR/ref.jsonl. `port` traces the port's tensor-parallel MLP on
every rank: DIR/port_rank<N>.jsonl, each rank holding half of the hidden
features (the `up`/`act` rows are shards, `down` is replicated after the
all-reduce). `fvd trace compare` merges the rank files and walks them
against the reference (bench/gpu_proof.sh runs it). `--bug` adds the down
projection's bias on every rank before the all-reduce, a classic
tensor-parallel mistake (the bias counts `world` times), which the compare
must place at `h.0.mlp.c_proj`.

Run from the repository root; on the CPU with GPUPORT_DEVICE=cpu (gloo).
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in ("examples/gpuport", "examples/gpuport/official", "python"):
    sys.path.insert(0, os.path.join(ROOT, p))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from fastvideo.layers.tp_linear import RowParallelLinear, TensorParallelMLP  # noqa: E402
from fastvideo.models.encoders.gpuport import GpuPortArchConfig  # noqa: E402
from fastvideo.models.loader.gpuport_mapping import convert_official_state_dict, official_weights, shard_mlp  # noqa: E402
from fvd_trace import TraceConfig, attach  # noqa: E402
from gpuport_official import build_official  # noqa: E402

# std and shape too: both merge exactly across shards, so they are checked.
STATS = ("abs_mean", "sum", "min", "max", "std", "shape")
STEPS = 2
BATCH, SEQ = 16, 512


class BiasBeforeAllReduce(RowParallelLinear):
    def forward(self, x):
        partial = F.linear(x, self.weight, self.bias)
        dist.all_reduce(partial)
        return partial


def inputs(device, hidden, step):
    g = torch.Generator(device=device).manual_seed(3000 + step)
    return torch.randn(BATCH, SEQ, hidden, generator=g, device=device)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["reference", "port"])
    ap.add_argument("out_dir")
    ap.add_argument("--bug", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    cuda = os.environ.get("GPUPORT_DEVICE", "cuda") == "cuda"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
    official = build_official(device)
    cfg = GpuPortArchConfig.from_official(official.config)

    if a.mode == "reference":
        model, prefix, name = official.h[0].mlp, "h.0.mlp.", "ref.jsonl"
    else:
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
        rank, world = dist.get_rank(), dist.get_world_size()
        model = TensorParallelMLP(cfg.hidden_size, cfg.intermediate_size, world)
        if a.bug:
            model.down.__class__ = BiasBeforeAllReduce
        sd = convert_official_state_dict(official_weights(official))
        model.load_state_dict(shard_mlp(sd, "layers.0.mlp.", rank, world), strict=True)
        model = model.to(device).eval()
        prefix, name = "tp.", "port.jsonl"  # attach adds _rank<N>

    handle = attach(model, prefix=prefix, config=TraceConfig(stats=STATS, output=os.path.join(a.out_dir, name)))
    with torch.no_grad():
        for step in range(STEPS):
            handle.set_step(step)
            model(inputs(device, cfg.hidden_size, step))
    handle.close()
    print(f"{a.mode}: {handle.modules} modules traced -> {handle.output}")
    if a.mode == "port":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
