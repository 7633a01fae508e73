"""GpuPort's timestep-conditioned official model (the reference of the
``gpuport_variants`` example): pre-norm MLP layers modulated by sinusoidal
timestep features, the way diffusion transformers condition on the
denoising step. Written for this example; weights are drawn from seeds.

The sinusoid's arguments (``t * freq``, with ``t`` up to 1000) are
computed in float32: in bfloat16 a timestep near 1000 is rounded to a
multiple of 4 and every high frequency's phase is lost.
"""

import math

import torch
from torch import nn

__all__ = ["TIMED_CONFIG", "OfficialTimedDiT", "build_official_timed", "timestep_features"]

TIMED_CONFIG = dict(hidden=256, layers=2, ff=1024, freq_dim=256, max_period=10000.0)


def timestep_features(t, dim, max_period):
    """``[cos(t f), sin(t f)]`` over ``dim / 2`` geometric frequencies, in float32."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TimestepFeatures(nn.Module):
    def __init__(self, dim, max_period):
        super().__init__()
        self.dim = dim
        self.max_period = max_period

    def forward(self, t):
        return timestep_features(t, self.dim, self.max_period)


class Gelu(nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")


class FeedForward(nn.Module):
    def __init__(self, hidden, ff):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ff)
        self.act = Gelu()
        self.fc2 = nn.Linear(ff, hidden)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class OfficialTimedLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.t_emb = TimestepFeatures(cfg["freq_dim"], cfg["max_period"])
        self.ada = nn.Linear(cfg["freq_dim"], 2 * cfg["hidden"])
        self.ln = nn.LayerNorm(cfg["hidden"], elementwise_affine=False, eps=1e-6)
        self.ff = FeedForward(cfg["hidden"], cfg["ff"])

    def forward(self, x, t):
        scale, shift = self.ada(self.t_emb(t)).chunk(2, dim=-1)
        h = self.ln(x) * (1 + scale[:, None]) + shift[:, None]
        return x + self.ff(h)


class OfficialTimedDiT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.layers = nn.ModuleList(OfficialTimedLayer(cfg) for _ in range(cfg["layers"]))

    def forward(self, x, t):
        for layer in self.layers:
            x = layer(x, t)
        return x


def build_official_timed(device, seed=0):
    """The official model with seeded weights, every parameter moved by
    seeded noise (as ``build_official`` does), in eval mode on ``device``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = OfficialTimedDiT(TIMED_CONFIG)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(0.02 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model.to(device).eval()
