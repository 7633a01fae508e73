"""TinyPort time_shift parity: the port's sampler time shift against the
official one as the official T2I preset configures it.

coverage_scope: implementation_subcomponent -- the shift is compared alone;
it has no weights.
"""

import numpy as np
from fastvideo.layers.time_shift import shift_timesteps
from tinyport_official.scheduler import T2I_PRESET
from tinyport_official.scheduler import shift_timesteps as official_shift_timesteps

COVERAGE_SCOPE = "implementation_subcomponent"


def test_tinyport_time_shift_parity():
    t = np.linspace(0.0, 1.0, 41)
    expected = official_shift_timesteps(t, T2I_PRESET["time_shift"])
    # The port is called the way its pipeline calls it: with its default.
    actual = shift_timesteps(t.astype(np.float32))

    assert actual.shape == expected.shape
    assert actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-6)
