"""Sampler time shift of the official TinyPort: a flow-matching timestep
t in [0, 1] is bent towards the noisy end by a factor `shift`.

The dataclass default (`TinyPortConfig.time_shift`) is 1.0, no shift; the
T2I preset the official sampler ships with uses 3.0. Which of the two a
port must match is a question for the person porting it."""

import numpy as np

T2I_PRESET = {"time_shift": 3.0}


def shift_timesteps(t, shift):
    """t' = shift * t / (1 + (shift - 1) * t), in float64."""
    t = np.asarray(t, dtype=np.float64)
    return shift * t / (1.0 + (shift - 1.0) * t)
