"""FastVideo port of the TinyPort refiner (float32).

Module names follow FastVideo's conventions: ``blocks.N``, ``blocks.N.norm``,
``blocks.N.mlp``, ``blocks.N.mlp.fc1``, ``blocks.N.mlp.fc2``. Every block
works on each token alone, so a sequence-parallel run (each rank a slice of
the tokens) computes exactly what one rank does.
"""

from dataclasses import dataclass

import numpy as np

from fastvideo.layers.layernorm import RMSNorm


@dataclass
class RefinerArchConfig:
    hidden_size: int = 32
    mlp_hidden_size: int = 64
    num_blocks: int = 3
    norm_eps: float = 1e-6


def _gelu(x):
    c = np.float32(0.7978845608028654)  # sqrt(2 / pi)
    return 0.5 * x * (1.0 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


class LinearF32:
    """``y = x @ W`` with the port's (in, out) weight layout."""

    def __init__(self, weight):
        self.weight = np.asarray(weight, dtype=np.float32)

    def __call__(self, x):
        return x @ self.weight


class MLP:
    def __init__(self, fc1, fc2):
        self.fc1 = LinearF32(fc1)
        self.fc2 = LinearF32(fc2)

    def __call__(self, x):
        return self.fc2(_gelu(self.fc1(x)))


class RefinerBlock:
    def __init__(self, weights, idx, cfg: RefinerArchConfig):
        p = f"blocks.{idx}"
        # A scale missing from the converted checkpoint keeps its
        # initialisation (ones), as a freshly built torch module would.
        scale = weights.get(f"{p}.norm.scale", np.ones(cfg.hidden_size, dtype=np.float32))
        self.norm = RMSNorm(scale, cfg.norm_eps)
        self.mlp = MLP(weights[f"{p}.mlp.fc1.weight"], weights[f"{p}.mlp.fc2.weight"])

    def __call__(self, x):
        return x + self.mlp(self.norm(x))


class TinyPortRefiner:
    def __init__(self, weights, cfg: RefinerArchConfig):
        self.blocks = [RefinerBlock(weights, i, cfg) for i in range(cfg.num_blocks)]

    def __call__(self, x):
        x = np.asarray(x, dtype=np.float32)
        for block in self.blocks:
            x = block(x)
        return x
