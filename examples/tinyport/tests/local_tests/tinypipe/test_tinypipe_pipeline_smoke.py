"""TinyPipe pipeline smoke test: the port's pipeline loads the released
checkpoint and turns a prompt into an image of the right shape, finite,
every pixel in (0, 1). It compares nothing with the official pipeline."""

import numpy as np
from fastvideo.pipelines.tinypipe import TinyPipePipeline
from tinyport_official.head import prompt_ids, released_weights


def test_tinypipe_pipeline_smoke():
    image = TinyPipePipeline(released_weights(seed=0))(prompt_ids(seed=0))
    assert image.shape == (16, 16, 3)
    assert image.dtype == np.float32
    assert np.isfinite(image).all()
    assert (image > 0).all() and (image < 1).all()
