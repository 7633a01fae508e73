"""FastVideo port of the TinyPort decoder (float32), with a plain numpy pixel
shuffle in place of upstream's private fused kernel."""

from dataclasses import dataclass

import numpy as np


@dataclass
class TinyPortVAEConfig:
    latent_channels: int = 8
    block_out_channels: int = 48
    out_channels: int = 3
    upscale_factor: int = 2
    norm_eps: float = 1e-2


class ChannelNorm:
    """RMS norm over the channel axis of a (C, H, W) map."""

    def __init__(self, scale, eps):
        self.scale = np.asarray(scale, dtype=np.float32).reshape(-1, 1, 1)
        self.eps = np.float32(eps)

    def forward(self, x):
        rms = np.sqrt(np.mean(x * x, axis=0, keepdims=True) + self.eps)
        return x / rms * self.scale

    __call__ = forward


def pixel_shuffle(x, r):
    """(C*r*r, H, W) -> (C, H*r, W*r), channel-major like torch's."""
    c, h, w = x.shape
    out_c = c // (r * r)
    return x.reshape(out_c, r, r, h, w).transpose(0, 3, 1, 4, 2).reshape(out_c, h * r, w * r)


class TinyPortVAEDecoder:
    def __init__(self, weights, cfg: TinyPortVAEConfig = TinyPortVAEConfig()):
        self.cfg = cfg
        self.proj_in_w = weights["decoder.proj_in.weight"]
        self.proj_in_b = weights["decoder.proj_in.bias"]
        self.out_norm = ChannelNorm(weights["decoder.out_norm.scale"], cfg.norm_eps)
        self.proj_out_w = weights["decoder.proj_out.weight"]
        self.proj_out_b = weights["decoder.proj_out.bias"]

    def forward(self, latents):
        c, h, w = latents.shape
        x = (self.proj_in_w @ latents.reshape(c, h * w)).reshape(-1, h, w)
        x = x + self.proj_in_b[:, None, None]
        x = x * (1.0 / (1.0 + np.exp(-x)))
        x = self.out_norm(x)
        x = np.tensordot(self.proj_out_w, x, axes=([1], [0])) + self.proj_out_b[:, None, None]
        return np.tanh(pixel_shuffle(x, self.cfg.upscale_factor))

    __call__ = forward
