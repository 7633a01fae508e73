"""TinyPort decoder_norm parity: the channel RMS norm at the end of the
decoder, fed with realistic decoder activations (conv_in + SiLU of small
latents).

coverage_scope: implementation_subcomponent -- the norm is compared alone,
which does not need the official decoder's private kernels.
"""

import numpy as np
from fastvideo.models.loader.tinyport_mapping import convert_official_state_dict
from fastvideo.models.vaes.tinyport_vae import ChannelNorm, TinyPortVAEConfig
from tinyport_official import TinyPortConfig, init_weights
from tinyport_official.layers import ChannelRMSNorm

COVERAGE_SCOPE = "implementation_subcomponent"


def test_tinyport_decoder_norm_parity():
    cfg = TinyPortConfig()
    official_sd = init_weights(cfg, seed=0)
    latents = 0.1 * np.random.default_rng(4).standard_normal((cfg.latent_channels, 16, 16))
    pre = np.einsum("oc,chw->ohw", official_sd["vae.decoder.conv_in.weight"], latents)
    pre += official_sd["vae.decoder.conv_in.bias"][:, None, None]
    features = pre / (1.0 + np.exp(-pre))

    official_norm = ChannelRMSNorm(official_sd["vae.decoder.norm_out.weight"], cfg.decoder_norm_eps)
    expected = official_norm(features)
    port_sd = convert_official_state_dict(official_sd)
    port_norm = ChannelNorm(port_sd["decoder.out_norm.scale"], TinyPortVAEConfig().norm_eps)
    actual = port_norm(features.astype(np.float32))

    assert actual.shape == expected.shape
    # A single elementwise norm in fp32: rounding is below 1e-6 relative,
    # so 1e-5 is already generous.
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
