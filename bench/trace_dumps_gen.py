#!/usr/bin/env python3
"""Generate two safetensors dumps for the dump-comparator benchmark.

Each file holds TENSORS float32 tensors adding up to about SIZE_GB; the port
file is the reference plus bf16-like noise, with one tensor rescaled (the
kind of bug the comparator must name). Written chunk by chunk so generation
itself needs little memory. The reference records the execution order in
`__metadata__["fvd_order"]`, as the fvd_trace Python package does.

Usage: trace_dumps_gen.py OUT_DIR [SIZE_GB (default 2)]
"""

import json
import os
import struct
import sys

import numpy as np

TENSORS = 16


def main():
    out = sys.argv[1]
    size_gb = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    os.makedirs(out, exist_ok=True)
    per = int(size_gb * (1 << 30) / TENSORS / 4)
    hidden = 4096
    rows = max(1, per // hidden)
    numel = rows * hidden
    keys = [f"blocks.{i}:out" for i in range(TENSORS)]
    bug = TENSORS * 3 // 4
    for name, is_port in (("ref.safetensors", False), ("port.safetensors", True)):
        header = {}
        off = 0
        for k in keys:
            header[k] = {"dtype": "F32", "shape": [1, rows, hidden], "data_offsets": [off, off + numel * 4]}
            off += numel * 4
        if not is_port:
            header["__metadata__"] = {"fvd_order": json.dumps(keys)}
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(os.path.join(out, name), "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            for i, _ in enumerate(keys):
                rng = np.random.default_rng(i)
                noise = np.random.default_rng(1000 + i)
                left = numel
                while left:
                    n = min(left, 1 << 24)
                    x = rng.standard_normal(n, dtype=np.float32)
                    if is_port:
                        x = x + noise.standard_normal(n, dtype=np.float32) * np.float32(2e-3) * x
                        if i == bug:
                            x = x * np.float32(1.3)
                    f.write(x.astype("<f4").tobytes())
                    left -= n
    print(f"wrote 2 x {TENSORS} tensors of {numel} f32 ({2 * TENSORS * numel * 4 / 2**30:.2f} GiB) to {out}")


if __name__ == "__main__":
    main()
