"""GpuPort timestep-conditioned DiT parity, red on purpose (family
``gpuport_variants``: fvd's hypothesis variants on GPUs).

coverage_scope: both -- the whole port model, loaded from the converted
official state dict, against the official model end to end.

The port computes its timestep sinusoid in bfloat16 (see
``fastvideo/models/dits/gpuport_timed.py``); the official model in float32.
Everything else is the same arithmetic, so with ``GPUPORT_TIME_DTYPE=float32``
the port matches bit for bit and the test passes, while TF32 or
deterministic-kernel settings change nothing: the variants of the port's
``port.toml`` test exactly these hypotheses.

With ``FASTVIDEO_TRACE_ACTIVATIONS`` set (fvd's traced reruns), the port is
traced through ``fvd_trace.attach`` and the official model into
``FVD_TRACE_DIR`` with ``FVD_TRACE_REFERENCE_LAYERS``.
"""

import os

import pytest

torch = pytest.importorskip("torch")

import fvd_trace  # noqa: E402
from fastvideo.models.dits.gpuport_timed import GpuPortTimedConfig, GpuPortTimedDiT  # noqa: E402
from fastvideo.models.loader.gpuport_timed_mapping import convert_timed_state_dict  # noqa: E402
from gpuport_official.timed import TIMED_CONFIG, build_official_timed  # noqa: E402

COVERAGE_SCOPE = "both"
BATCH = 16
TOKENS = 256


def reference_tracer(official):
    folder = os.environ.get("FVD_TRACE_DIR")
    if not folder:
        return None
    config = fvd_trace.TraceConfig.from_env()
    config = fvd_trace.TraceConfig(
        enabled=config.enabled,
        layers=os.environ.get("FVD_TRACE_REFERENCE_LAYERS", ""),
        stats=config.stats,
        output=os.path.join(folder, "reference_rank0.jsonl"),
    )
    return fvd_trace.attach(official, config=config, rank=0, world_size=1)


def test_gpuport_timed_dit_parity(device, assert_parity):
    official = build_official_timed(device)
    port = GpuPortTimedDiT(GpuPortTimedConfig.from_official(TIMED_CONFIG))
    port.load_state_dict(convert_timed_state_dict(official.state_dict()), strict=True)
    port = port.to(device).eval()

    g = torch.Generator(device=device).manual_seed(7)
    x = torch.randn(BATCH, TOKENS, TIMED_CONFIG["hidden"], generator=g, device=device)
    # Late denoising steps: timesteps in [500, 1000).
    t = 500 + 500 * torch.rand(BATCH, generator=g, device=device)

    ref = reference_tracer(official)
    with torch.no_grad():
        expected = official(x, t)
    if ref is not None:
        ref.close()
    handle = fvd_trace.attach(port, rank=0, world_size=1)
    with torch.no_grad():
        actual = port(x, t)
    if handle is not None:
        handle.close()
    # Same float32 arithmetic on both sides once the sinusoid is float32.
    assert_parity(actual, expected, rtol=1e-4, atol=5e-5)
