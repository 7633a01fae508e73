"""FastVideo port of the TinyPort image head (float32).

Module names follow FastVideo's conventions: ``norm``, ``out``. The
official checkpoint is converted by
fastvideo.models.loader.tinyport_head_mapping.
"""

from dataclasses import dataclass

import numpy as np

from fastvideo.layers.layernorm import RMSNorm


@dataclass
class HeadArchConfig:
    hidden_size: int = 128
    patch_size: int = 2
    out_channels: int = 3
    grid_size: int = 8
    norm_eps: float = 1e-6


class Linear:
    """``y = x @ W + b`` with the port's (in, out) weight layout."""

    def __init__(self, weight, bias):
        self.weight = np.asarray(weight, dtype=np.float32)
        self.bias = np.asarray(bias, dtype=np.float32)

    def __call__(self, x):
        return x @ self.weight + self.bias


class TinyPortImageHead:
    def __init__(self, weights, cfg: HeadArchConfig = HeadArchConfig()):
        self.cfg = cfg
        # A scale missing from the converted checkpoint keeps its
        # initialisation (ones), as a freshly built torch module would.
        scale = weights.get("head.norm.scale", np.ones(cfg.hidden_size, dtype=np.float32))
        self.norm = RMSNorm(scale, cfg.norm_eps)
        self.out = Linear(weights["head.out.weight"], weights["head.out.bias"])

    def __call__(self, h):
        c = self.cfg
        z = self.out(self.norm(np.asarray(h, dtype=np.float32)))
        patches = np.float32(1.0) / (np.float32(1.0) + np.exp(-z))
        img = patches.reshape(c.grid_size, c.grid_size, c.patch_size, c.patch_size, c.out_channels)
        side = c.grid_size * c.patch_size
        return img.transpose(0, 2, 1, 3, 4).reshape(side, side, c.out_channels)
