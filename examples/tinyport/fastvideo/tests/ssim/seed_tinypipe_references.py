#!/usr/bin/env python3
"""Writes the TinyPipe quality references: the official pipeline's image
for each seeded prompt, as JSON under fastvideo/tests/ssim/reference/. A
person runs it once from the example's folder (`python3 -B
fastvideo/tests/ssim/seed_tinypipe_references.py`); fvd never does."""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "official"))

from tinyport_official.head import TinyPortPipeline, prompt_ids, released_weights  # noqa: E402

pipeline = TinyPortPipeline(released_weights(seed=0))
for seed in (0, 1, 2):
    image = pipeline(prompt_ids(seed=seed))
    path = os.path.join(HERE, "reference", f"tinypipe_seed{seed}.json")
    with open(path, "w") as f:
        json.dump({"pipeline": "tinyport_official TinyPortPipeline", "checkpoint": "released_weights(seed=0)",
                   "prompt_seed": seed, "image": [[[round(float(v), 6) for v in px] for px in row] for row in image]}, f)
        f.write("\n")
    print(f"wrote {path}")
