"""Timestep embedding of the official TinyPort (float64): the sinusoidal
features a diffusion step is conditioned on, cosines first."""

import math

import numpy as np


def timestep_embedding(timesteps, dim, max_period=10000.0):
    """(N,) timesteps -> (N, dim): [cos(t * f_k), sin(t * f_k)] with
    f_k = max_period^(-k / (dim / 2)), k = 0 .. dim/2 - 1."""
    half = dim // 2
    freqs = np.exp(-math.log(max_period) * np.arange(half, dtype=np.float64) / half)
    args = np.asarray(timesteps, dtype=np.float64)[:, None] * freqs[None, :]
    return np.concatenate([np.cos(args), np.sin(args)], axis=-1)
