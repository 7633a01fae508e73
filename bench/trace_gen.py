#!/usr/bin/env python3
"""Generate the inputs of the trace merge+compare benchmark into bench/out/.

A reference trace (transformers-style names, one file) and a port trace in
RANKS rank files (renamed modules) of RECORDS records each. Per block, the
norms and attention outputs are replicated on every rank (identical stats),
the MLP input projection is column-parallel: equal shard shapes, sharded on
the last dim, so the merge has to take the dim from the reference's shape.
The reference row of a sharded output is the exact merge of the shards. One
late row carries a planted bug, so there is a first divergence to find.

Usage: trace_gen.py [--ranks 8] [--records 200000] [--out bench/out]
"""

import argparse
import json
import math
import os
import random

SUBS = [  # (port name, reference name, sharded)
    ("norm1", "ln_1", False),
    ("attention", "attn", False),
    ("norm2", "ln_2", False),
    ("ffn.c_fc", "mlp.c_fc", True),
    ("ffn.c_proj", "mlp.c_proj", False),
    ("ffn", "mlp", False),
    ("", "", False),  # the block itself
    ("out_proj", "out_proj", True),
]


def shard_stats(rng, numel):
    mean = rng.uniform(-0.01, 0.01)
    std = rng.uniform(0.5, 1.5)
    return {
        "abs_mean": std * 0.8 + abs(mean),
        "sum": mean * numel,
        "min": -std * rng.uniform(3, 5),
        "max": std * rng.uniform(3, 5),
        "mean": mean,
        "std": std,
    }


def merge(shards, counts):
    n = sum(counts)
    mean = sum(s["mean"] * c for s, c in zip(shards, counts)) / n
    m2 = sum(s["std"] ** 2 * (c - 1) + c * (s["mean"] - mean) ** 2 for s, c in zip(shards, counts))
    return {
        "abs_mean": sum(s["abs_mean"] * c for s, c in zip(shards, counts)) / n,
        "sum": sum(s["sum"] for s in shards),
        "min": min(s["min"] for s in shards),
        "max": max(s["max"] for s in shards),
        "mean": mean,
        "std": math.sqrt(m2 / (n - 1)),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(0)
    blocks = 500
    per_step = blocks * len(SUBS)
    steps = max(1, a.records // per_step)
    hidden, seq = 1024, 256
    bug_at = int(a.records * 0.9)

    ref = open(os.path.join(a.out, "ref.jsonl"), "w")
    ranks = [open(os.path.join(a.out, f"port_rank{r}.jsonl"), "w") for r in range(a.ranks)]
    written = 0
    for step in range(steps):
        for b in range(blocks):
            for port_sub, ref_sub, sharded in SUBS:
                pm = f"blocks.{b}" + (f".{port_sub}" if port_sub else "")
                rm = f"transformer.h.{b}" + (f".{ref_sub}" if ref_sub else "")
                full = [1, seq, hidden * 4 if sharded else hidden]
                if sharded:
                    shard = [1, seq, full[2] // a.ranks]
                    numel = shard[0] * shard[1] * shard[2]
                    stats = [shard_stats(rng, numel) for _ in range(a.ranks)]
                    whole = merge(stats, [numel] * a.ranks)
                else:
                    shard = full
                    s = shard_stats(rng, full[0] * full[1] * full[2])
                    stats = [s] * a.ranks
                    whole = dict(s)
                if written == bug_at:
                    whole = dict(whole, abs_mean=whole["abs_mean"] * 1.5)
                base = {"module": rm, "tensor": "out", "step": step}
                ref.write(json.dumps({**base, **whole, "shape": full, "dtype": "torch.bfloat16"}) + "\n")
                for r, f in enumerate(ranks):
                    rec = {"module": pm, "tensor": "out", "step": step, **stats[r],
                           "shape": shard, "dtype": "torch.bfloat16"}
                    f.write(json.dumps(rec) + "\n")
                written += 1
    ref.close()
    for f in ranks:
        f.close()
    print(f"wrote {written} reference rows and {a.ranks} x {written} rank rows to {a.out}")


if __name__ == "__main__":
    main()
