"""Timestep embedding of the TinyPort port (float32)."""

import math

import numpy as np


def timestep_embedding(timesteps, dim, max_period=10000.0):
    """(N,) timesteps -> (N, dim) sinusoidal features, as the official model."""
    half = dim // 2
    exponent = -math.log(max_period) * np.arange(half, dtype=np.float32) / half
    freqs = np.exp(exponent).astype(np.float32)
    args = np.asarray(timesteps, dtype=np.float32)[:, None] * freqs[None, :]
    return np.concatenate([np.sin(args), np.cos(args)], axis=-1)
