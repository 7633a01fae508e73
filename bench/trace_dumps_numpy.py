#!/usr/bin/env python3
"""numpy baseline of `fvd trace dumps`: the same per-tensor metrics in
float64 (cosine, rel_diff, max |d| with coordinate and values, mean |d|),
in the order of __metadata__["fvd_order"], written the natural numpy way
(one tensor at a time, memory-mapped, converted to float64 whole).

Usage: trace_dumps_numpy.py REF.safetensors PORT.safetensors
"""

import json
import struct
import sys

import numpy as np


def open_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    return header, mm, 8 + n


def tensor(header, mm, start, key):
    h = header[key]
    a, b = h["data_offsets"]
    assert h["dtype"] == "F32"
    return mm[start + a:start + b].view("<f4").reshape(h["shape"])


def main():
    ha, ma, sa = open_st(sys.argv[1])
    hb, mb, sb = open_st(sys.argv[2])
    order = json.loads(ha.get("__metadata__", {}).get("fvd_order", "null")) or sorted(k for k in ha if k != "__metadata__")
    out, first = [], None
    for k in order:
        x = tensor(ha, ma, sa, k).astype(np.float64)
        y = tensor(hb, mb, sb, k).astype(np.float64)
        sxy = float(np.dot(x.ravel(), y.ravel()))
        sxx = float(np.dot(x.ravel(), x.ravel()))
        syy = float(np.dot(y.ravel(), y.ravel()))
        d = np.abs(x - y)
        i = int(np.argmax(d))
        at = [int(v) for v in np.unravel_index(i, x.shape)]
        cos = sxy / (np.sqrt(sxx) * np.sqrt(syy))
        rel = 1 - 2 * sxy / (sxx + syy)
        row = {"key": k, "cosine": cos, "rel_diff": rel, "max_abs_diff": float(d.ravel()[i]),
               "max_abs_diff_at": at, "reference_value": float(x.ravel()[i]),
               "port_value": float(y.ravel()[i]), "mean_abs_diff": float(d.mean())}
        out.append(row)
        if first is None and (cos < 0.99 or rel > 1e-3):
            first = k
        del x, y, d
    json.dump({"first_divergence": first, "tensors": out}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
