"""The official TinyPort image head and text-to-image pipeline (float64).

The head turns each token's state into a 2x2 patch of RGB pixels (an RMS
norm, a linear map to 12 values, a sigmoid); the 64 tokens tile a 16x16
image in row order. `TinyPortPipeline` runs the transformer, then the head.

Upstream has two ways to get the head's weights: `init_head_weights` is the
head's initialisation (its norm scale all ones, as a freshly built torch
module has it), which unit tests start from; `released_weights` is the
published checkpoint of the whole pipeline, whose trained norm scale is far
from one.

Module names as upstream has them: ``transformer.*`` (model.py),
``head``, ``head.ln``, ``head.proj``.
"""

from dataclasses import dataclass

import numpy as np

from tinyport_official.config import TinyPortConfig
from tinyport_official.layers import Linear, RMSNorm
from tinyport_official.model import TinyPortTransformer
from tinyport_official.weights import init_weights


@dataclass(frozen=True)
class HeadConfig:
    dim: int = 128
    patch: int = 2
    channels: int = 3
    grid: int = 8  # tokens per side of the image
    norm_eps: float = 1e-6


def init_head_weights(cfg: HeadConfig = HeadConfig(), seed: int = 0) -> dict:
    """The head as initialised: ``head.{ln.weight, proj.weight, proj.bias}``."""
    rng = np.random.default_rng(seed)
    out = cfg.channels * cfg.patch**2
    return {
        "head.ln.weight": np.ones(cfg.dim),
        "head.proj.weight": rng.standard_normal((out, cfg.dim)) / np.sqrt(cfg.dim),
        "head.proj.bias": 0.1 * rng.standard_normal(out),
    }


def released_weights(seed: int = 0) -> dict:
    """The published checkpoint: the transformer's weights and the trained head."""
    cfg = HeadConfig()
    sd = init_weights(TinyPortConfig(), seed=seed)
    sd.update(init_head_weights(cfg, seed=seed + 1))
    sd["head.ln.weight"] = 1.0 + 0.5 * np.random.default_rng(seed + 2).standard_normal(cfg.dim)
    return sd


def prompt_ids(seed: int, cfg: TinyPortConfig = TinyPortConfig()):
    """A prompt's token ids (the toy has no tokenizer: a seed stands for the text)."""
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, size=cfg.max_len)


class ImageHead:
    def __init__(self, sd, cfg: HeadConfig = HeadConfig()):
        self.cfg = cfg
        self.ln = RMSNorm(sd["head.ln.weight"], cfg.norm_eps)
        self.proj = Linear(sd["head.proj.weight"], sd["head.proj.bias"])

    def __call__(self, h):
        c = self.cfg
        patches = 1.0 / (1.0 + np.exp(-self.proj(self.ln(h))))
        img = patches.reshape(c.grid, c.grid, c.patch, c.patch, c.channels)
        return img.transpose(0, 2, 1, 3, 4).reshape(c.grid * c.patch, c.grid * c.patch, c.channels)


class TinyPortPipeline:
    """Prompt ids -> a (16, 16, 3) image with values in (0, 1)."""

    def __init__(self, sd, cfg: TinyPortConfig = TinyPortConfig(), head: HeadConfig = HeadConfig()):
        self.transformer = TinyPortTransformer(sd, cfg)
        self.head = ImageHead(sd, head)

    def __call__(self, ids):
        return self.head(self.transformer(ids))
