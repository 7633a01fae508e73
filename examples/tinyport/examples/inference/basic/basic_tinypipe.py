#!/usr/bin/env python3
"""TinyPipe's basic example: a prompt (a seed: the toy has no tokenizer)
through the port's text-to-image pipeline on the released checkpoint, the
image written as a PPM file.

    python3 -B examples/inference/basic/basic_tinypipe.py [--seed 0] [--output PATH]
"""

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
for path in (ROOT, os.path.join(ROOT, "official")):
    if path not in sys.path:
        sys.path.insert(0, path)

from fastvideo.pipelines.tinypipe import TinyPipePipeline  # noqa: E402
from tinyport_official.head import prompt_ids, released_weights  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", default=os.path.join(tempfile.gettempdir(), "tinypipe_seed0.ppm"))
    a = ap.parse_args()
    image = TinyPipePipeline(released_weights(seed=0))(prompt_ids(seed=a.seed))
    h, w, _ = image.shape
    with open(a.output, "w") as f:
        f.write(f"P3\n{w} {h}\n255\n")
        for row in image:
            f.write(" ".join(str(int(round(float(v) * 255))) for px in row for v in px) + "\n")
    print(f"wrote {a.output} ({w}x{h})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
