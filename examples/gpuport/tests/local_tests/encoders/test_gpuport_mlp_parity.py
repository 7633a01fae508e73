"""GpuPort MLP parity: the feed-forward of every layer.

coverage_scope: implementation_subcomponent -- each port MLP is fed the exact
input the official MLP received inside the official forward.
"""

import pytest

torch = pytest.importorskip("torch")

from fastvideo.models.encoders.gpuport import GpuPortArchConfig, GpuPortMLP, load_submodule  # noqa: E402
from fastvideo.models.loader.gpuport_mapping import convert_official_state_dict, official_weights  # noqa: E402
from gpuport_official import build_official  # noqa: E402

COVERAGE_SCOPE = "implementation_subcomponent"


def test_gpuport_mlp_parity(device, input_ids, capture, repeat_parity, assert_parity):
    official = build_official(device)
    cfg = GpuPortArchConfig.from_official(official.config)
    port_sd = convert_official_state_dict(official_weights(official))
    ports = [
        load_submodule(GpuPortMLP(cfg), port_sd, f"layers.{i}.mlp.").to(device).eval()
        for i in range(cfg.num_layers)
    ]
    names = [f"h.{i}.mlp" for i in range(cfg.num_layers)]

    def check(i):
        _, seen = capture(official, input_ids(i), names)
        for name, port in zip(names, ports):
            x, expected = seen[name]
            with torch.no_grad():
                actual = port(x)
            # GPT-2's Conv1D is addmm on an (in, out) weight, the port's
            # Linear a matmul on the transposed copy: same float32 products,
            # possibly summed in another order over 256 and 1024 terms
            # (~1e-6 relative on outputs ~0.1), and the official tanh-GELU
            # is written out by hand where the port calls the fused kernel
            # (~1e-7). Swapping exact for tanh GELU alone moves outputs by
            # ~1e-4, a missing transpose by O(0.1).
            assert_parity(actual, expected, rtol=1e-4, atol=1e-5)

    repeat_parity("mlp", check)
