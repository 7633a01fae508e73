"""Deterministic "checkpoint" of the official model.

A real port downloads weights; this toy draws them from a seeded generator so
that the official model and the port can load identical values offline.
"""

import numpy as np

from tinyport_official.config import TinyPortConfig


def init_weights(cfg: TinyPortConfig = TinyPortConfig(), seed: int = 0) -> dict:
    """Official state dict: parameter name -> float64 array."""
    rng = np.random.default_rng(seed)
    d, hidden = cfg.dim, cfg.dim * cfg.mlp_ratio
    sd = {}

    def linear(name, out_f, in_f, bias=True):
        sd[f"{name}.weight"] = rng.standard_normal((out_f, in_f)) / np.sqrt(in_f)
        if bias:
            sd[f"{name}.bias"] = 0.02 * rng.standard_normal(out_f)

    sd["embed.tokens.weight"] = 0.5 * rng.standard_normal((cfg.vocab_size, d))
    for i in range(cfg.layers):
        p = f"blocks.{i}"
        sd[f"{p}.norm1.weight"] = 1.0 + 0.1 * rng.standard_normal(d)
        for proj in ("to_q", "to_k", "to_v"):
            linear(f"{p}.attn.{proj}", d, d, bias=False)
        linear(f"{p}.attn.to_out", d, d)
        sd[f"{p}.norm2.weight"] = 1.0 + 0.1 * rng.standard_normal(d)
        linear(f"{p}.mlp.fc1", hidden, d)
        linear(f"{p}.mlp.fc2", d, hidden)
    sd["final_norm.weight"] = 1.0 + 0.1 * rng.standard_normal(d)

    c = cfg.decoder_channels
    linear("vae.decoder.conv_in", c, cfg.latent_channels)
    sd["vae.decoder.norm_out.weight"] = 1.0 + 0.1 * rng.standard_normal(c)
    linear("vae.decoder.conv_out", cfg.image_channels * cfg.upscale**2, c)
    return sd
