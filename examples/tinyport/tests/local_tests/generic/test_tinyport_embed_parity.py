"""TinyPort embed parity: token table lookup plus sinusoidal positions.

coverage_scope: implementation_subcomponent -- the FastVideo embedding class is
built directly from converted weights, not through a production loader.
"""

import numpy as np
from fastvideo.models.dits.tinyport import TinyPortArchConfig, TinyPortTextEmbedding
from fastvideo.models.loader.tinyport_mapping import convert_official_state_dict
from tinyport_official import TinyPortConfig, init_weights
from tinyport_official.model import TokenEmbedding

COVERAGE_SCOPE = "implementation_subcomponent"


def test_tinyport_embed_parity():
    cfg = TinyPortConfig()
    official_sd = init_weights(cfg, seed=0)
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, size=cfg.max_len)

    expected = TokenEmbedding(official_sd, cfg)(ids)
    port = TinyPortTextEmbedding(convert_official_state_dict(official_sd), TinyPortArchConfig())
    actual = port(ids)

    assert actual.shape == expected.shape
    assert actual.dtype == np.float32
    # The port stores the table and the positions in float32: each output is
    # the sum of two values rounded to 2**-24 relative (about 6e-8) with
    # magnitudes below 3, so the fp32-vs-fp64 difference stays under 1e-6.
    # An indexing or position-formula bug moves values by O(0.1).
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)
