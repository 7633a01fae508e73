"""TinyPipe image-head parity: RMS norm, linear map to 2x2 RGB patches,
sigmoid, official float64 against the FastVideo float32 port.

coverage_scope: implementation_subcomponent -- the head alone, built from
its initialised weights (upstream's `init_head_weights`) on seeded token
states, not from the released checkpoint.
"""

import numpy as np
from fastvideo.models.heads.tinyport_head import HeadArchConfig, TinyPortImageHead
from fastvideo.models.loader.tinyport_head_mapping import convert_head_state_dict
from tinyport_official.head import HeadConfig, ImageHead, init_head_weights

COVERAGE_SCOPE = "implementation_subcomponent"


def test_tinypipe_head_parity():
    cfg = HeadConfig()
    sd = init_head_weights(cfg, seed=3)
    h = np.random.default_rng(4).standard_normal((cfg.grid * cfg.grid, cfg.dim))

    expected = ImageHead(sd, cfg)(h)
    actual = TinyPortImageHead(convert_head_state_dict(sd), HeadArchConfig())(h)

    assert actual.shape == expected.shape == (16, 16, 3)
    assert actual.dtype == np.float32
    # float32 against float64 through a 128-term matmul and a sigmoid:
    # rounding stays below 1e-6 on values in (0, 1); a wrong layout, patch
    # order or norm moves pixels by O(0.01) or more.
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
