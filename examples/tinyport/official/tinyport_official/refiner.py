"""The official TinyPort refiner: a stack of pre-norm residual MLP layers
applied to each token of the transformer's output (float64).

Module names as the upstream repository has them: ``layers.N``,
``layers.N.ln``, ``layers.N.ffn``, ``layers.N.ffn.w1``, ``layers.N.ffn.w2``.
"""

from dataclasses import dataclass

import numpy as np

from tinyport_official.layers import Linear, RMSNorm, gelu_tanh


@dataclass(frozen=True)
class RefinerConfig:
    dim: int = 32
    hidden: int = 64
    layers: int = 3
    norm_eps: float = 1e-6
    tokens: int = 16


def init_refiner_weights(cfg: RefinerConfig, seed=0):
    """The refiner's checkpoint: ``refiner.layers.N.{ln.weight, ffn.w1.weight, ffn.w2.weight}``."""
    rng = np.random.default_rng(seed)
    sd = {}
    for i in range(cfg.layers):
        p = f"refiner.layers.{i}"
        # Learned norm scales are far from one: a lost scale shows.
        sd[f"{p}.ln.weight"] = 1.0 + 0.5 * rng.standard_normal(cfg.dim)
        sd[f"{p}.ffn.w1.weight"] = rng.standard_normal((cfg.hidden, cfg.dim)) / np.sqrt(cfg.dim)
        sd[f"{p}.ffn.w2.weight"] = rng.standard_normal((cfg.dim, cfg.hidden)) / np.sqrt(cfg.hidden)
    return sd


class FeedForward:
    def __init__(self, w1, w2):
        self.w1 = Linear(w1)
        self.w2 = Linear(w2)

    def __call__(self, x):
        return self.w2(gelu_tanh(self.w1(x)))


class RefinerLayer:
    def __init__(self, sd, i, cfg: RefinerConfig):
        p = f"refiner.layers.{i}"
        self.ln = RMSNorm(sd[f"{p}.ln.weight"], cfg.norm_eps)
        self.ffn = FeedForward(sd[f"{p}.ffn.w1.weight"], sd[f"{p}.ffn.w2.weight"])

    def __call__(self, x):
        return x + self.ffn(self.ln(x))


class Refiner:
    def __init__(self, sd, cfg: RefinerConfig):
        self.layers = [RefinerLayer(sd, i, cfg) for i in range(cfg.layers)]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
