"""TinyPipe quality regression: the port's image for seeded prompts against
the official pipeline's images a person seeded into fastvideo/tests/ssim/reference/
(`python3 -B fastvideo/tests/ssim/seed_tinypipe_references.py` writes them), by SSIM.

A missing reference is a skip, never a pass: fvd asks a person to seed it.
"""

import json
import os

import numpy as np
import pytest
from fastvideo.pipelines.tinypipe import TinyPipePipeline
from tinyport_official.head import prompt_ids, released_weights

REFERENCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference")
SEEDS = (0, 1, 2)
MIN_SSIM = 0.99


def ssim(a, b, data_range=1.0):
    """Mean structural similarity over 4x4 windows (stride 2), per channel."""
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    scores = []
    for ch in range(a.shape[-1]):
        for i in range(0, a.shape[0] - 3, 2):
            for j in range(0, a.shape[1] - 3, 2):
                x = a[i : i + 4, j : j + 4, ch].astype(np.float64)
                y = b[i : i + 4, j : j + 4, ch].astype(np.float64)
                mx, my = x.mean(), y.mean()
                vx, vy = x.var(), y.var()
                cov = ((x - mx) * (y - my)).mean()
                scores.append(((2 * mx * my + c1) * (2 * cov + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2)))
    return float(np.mean(scores))


@pytest.mark.parametrize("seed", SEEDS)
def test_tinypipe_similarity(seed):
    path = os.path.join(REFERENCES, f"tinypipe_seed{seed}.json")
    if not os.path.isfile(path):
        pytest.skip(f"reference image not seeded: {path}")
    with open(path) as f:
        reference = np.asarray(json.load(f)["image"], dtype=np.float64)
    image = TinyPipePipeline(released_weights(seed=0))(prompt_ids(seed=seed))
    score = ssim(image, reference)
    assert score >= MIN_SSIM, f"SSIM {score:.4f} < {MIN_SSIM} against {path}"
