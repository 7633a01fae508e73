"""The port of GpuPort's timestep-conditioned model, FastVideo-style names:
``blocks.N.time_embed``, ``time_proj``, ``norm`` and ``mlp.fc1/act/fc2``.

Planted bug (the ``gpuport_variants`` example): the timestep sinusoid is
computed in the model's compute dtype, bfloat16 unless
``GPUPORT_TIME_DTYPE`` says otherwise, where the official model computes
it in float32. A timestep near 1000 is then rounded to a multiple of 4, so
the high frequencies' phases are wrong and every block's modulation with
them. Everything else matches the official model operation for operation.
"""

import math
import os
from dataclasses import dataclass, field

import torch
from torch import nn


def _time_dtype():
    return os.environ.get("GPUPORT_TIME_DTYPE", "bfloat16")


@dataclass(frozen=True)
class GpuPortTimedConfig:
    hidden: int = 256
    layers: int = 2
    ff: int = 1024
    freq_dim: int = 256
    max_period: float = 10000.0
    time_dtype: str = field(default_factory=_time_dtype)

    @classmethod
    def from_official(cls, cfg):
        return cls(
            hidden=cfg["hidden"],
            layers=cfg["layers"],
            ff=cfg["ff"],
            freq_dim=cfg["freq_dim"],
            max_period=cfg["max_period"],
        )


class TimestepEmbedding(nn.Module):
    def __init__(self, dim, max_period, dtype):
        super().__init__()
        self.dim = dim
        self.max_period = max_period
        self.compute_dtype = getattr(torch, dtype)

    def forward(self, t):
        half = self.dim // 2
        freqs = torch.exp(-math.log(self.max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t.to(self.compute_dtype)[:, None] * freqs.to(self.compute_dtype)[None]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1).float()


class GeluTanh(nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")


class GpuPortTimedMLP(nn.Module):
    def __init__(self, hidden, ff):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ff)
        self.act = GeluTanh()
        self.fc2 = nn.Linear(ff, hidden)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class GpuPortTimedBlock(nn.Module):
    def __init__(self, cfg: GpuPortTimedConfig):
        super().__init__()
        self.time_embed = TimestepEmbedding(cfg.freq_dim, cfg.max_period, cfg.time_dtype)
        self.time_proj = nn.Linear(cfg.freq_dim, 2 * cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = GpuPortTimedMLP(cfg.hidden, cfg.ff)

    def forward(self, x, t):
        scale, shift = self.time_proj(self.time_embed(t)).chunk(2, dim=-1)
        h = self.norm(x) * (1 + scale[:, None]) + shift[:, None]
        return x + self.mlp(h)


class GpuPortTimedDiT(nn.Module):
    def __init__(self, cfg: GpuPortTimedConfig):
        super().__init__()
        self.blocks = nn.ModuleList(GpuPortTimedBlock(cfg) for _ in range(cfg.layers))

    def forward(self, x, t):
        for block in self.blocks:
            x = block(x, t)
        return x
