"""Sampler time shift of the TinyPort port (float32)."""

import numpy as np


def shift_timesteps(t, shift=1.0):
    """t' = shift * t / (1 + (shift - 1) * t); the default follows the
    official config's dataclass default."""
    t = np.asarray(t, dtype=np.float32)
    return (shift * t / (1.0 + (shift - 1.0) * t)).astype(np.float32)
