"""TinyPort timestep_embed parity: the sinusoidal timestep features of the
port against the official ones, over the timesteps a sampler visits.

coverage_scope: implementation_subcomponent -- the embedding is compared
alone; it has no weights.
"""

import numpy as np
from fastvideo.layers.timestep import timestep_embedding
from tinyport_official.timestep import timestep_embedding as official_timestep_embedding

COVERAGE_SCOPE = "implementation_subcomponent"


def test_tinyport_timestep_embed_parity():
    timesteps = np.linspace(0.0, 999.0, 50)
    expected = official_timestep_embedding(timesteps, 32)
    actual = timestep_embedding(timesteps.astype(np.float32), 32)

    assert actual.shape == expected.shape
    assert actual.dtype == np.float32
    # sin/cos of fp32 arguments up to ~1e3: the argument itself is only
    # exact to ~6e-5 (1e3 * 2^-24), so 1e-4 absolute is the honest bound.
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-4)
