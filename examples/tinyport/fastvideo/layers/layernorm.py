"""Normalisation layers (float32)."""

import numpy as np


class RMSNorm:
    def __init__(self, scale, eps=1e-6):
        self.scale = np.asarray(scale, dtype=np.float32)
        self.eps = np.float32(eps)

    def forward(self, x):
        inv = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps)
        return (x * inv) * self.scale

    __call__ = forward
