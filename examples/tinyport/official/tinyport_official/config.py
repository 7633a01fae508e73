"""Model hyper-parameters of the official TinyPort."""

from dataclasses import dataclass


@dataclass(frozen=True)
class TinyPortConfig:
    vocab_size: int = 512
    max_len: int = 64
    dim: int = 128
    heads: int = 4
    layers: int = 2
    mlp_ratio: int = 4
    norm_eps: float = 1e-6
    # Decoder: latent grid (latent_channels, h, w) -> image (3, 2h, 2w).
    latent_channels: int = 8
    decoder_channels: int = 48
    decoder_norm_eps: float = 1e-6
    image_channels: int = 3
    upscale: int = 2
    # Sampler time shift; the shipped T2I preset overrides it (scheduler.py).
    time_shift: float = 1.0
