#!/usr/bin/env python3
"""Memory-copy baseline for the dump benchmark: GB/s of a large numpy copy
(read + write of the same bytes) on this machine, best of three."""

import sys
import time

import numpy as np

n = int(float(sys.argv[1]) * (1 << 30)) if len(sys.argv) > 1 else 1 << 30
src = np.ones(n, dtype=np.uint8)
dst = np.empty_like(src)
best = float("inf")
for _ in range(3):
    t = time.perf_counter()
    np.copyto(dst, src)
    best = min(best, time.perf_counter() - t)
print(f"{n / best / 1e9:.2f}")
