"""The official TinyPort decoder. Upstream uses a private fused-kernel
package for its pixel shuffle, which is not installable outside the lab that
wrote it: importing this module fails without it."""

import numpy as np
import tinyport_private_ops  # private upstream dependency

from tinyport_official.config import TinyPortConfig
from tinyport_official.layers import ChannelRMSNorm


def _silu(x):
    return x / (1.0 + np.exp(-x))


class TinyPortDecoder:
    """Latent (latent_channels, h, w) -> image (3, 2h, 2w) in [-1, 1]."""

    def __init__(self, sd, cfg: TinyPortConfig = TinyPortConfig()):
        self.cfg = cfg
        self.w_in = sd["vae.decoder.conv_in.weight"]
        self.b_in = sd["vae.decoder.conv_in.bias"]
        self.norm_out = ChannelRMSNorm(sd["vae.decoder.norm_out.weight"], cfg.decoder_norm_eps)
        self.w_out = sd["vae.decoder.conv_out.weight"]
        self.b_out = sd["vae.decoder.conv_out.bias"]

    def __call__(self, z):
        h = np.einsum("oc,chw->ohw", self.w_in, z) + self.b_in[:, None, None]
        h = self.norm_out(_silu(h))
        h = np.einsum("oc,chw->ohw", self.w_out, h) + self.b_out[:, None, None]
        return np.tanh(tinyport_private_ops.pixel_shuffle(h, self.cfg.upscale))
