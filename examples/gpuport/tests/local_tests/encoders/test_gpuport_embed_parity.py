"""GpuPort embed parity: token plus position embeddings.

coverage_scope: implementation_subcomponent -- the port's embedding is built
directly from converted weights, not through a production loader.
"""

import pytest

torch = pytest.importorskip("torch")

from fastvideo.models.encoders.gpuport import GpuPortArchConfig, GpuPortEmbedding, load_submodule  # noqa: E402
from fastvideo.models.loader.gpuport_mapping import convert_official_state_dict, official_weights  # noqa: E402
from gpuport_official import build_official  # noqa: E402

COVERAGE_SCOPE = "implementation_subcomponent"


def test_gpuport_embed_parity(device, input_ids, capture, repeat_parity, assert_parity):
    official = build_official(device)
    port_sd = convert_official_state_dict(official_weights(official))
    port = load_submodule(GpuPortEmbedding(GpuPortArchConfig.from_official(official.config)), port_sd, "embed.")
    port = port.to(device).eval()

    def check(i):
        ids = input_ids(i)
        # The official embedding output is what enters dropout (a no-op in
        # eval mode) inside the official forward.
        _, seen = capture(official, ids, ["drop"])
        expected = seen["drop"][1]
        with torch.no_grad():
            actual = port(ids)
        # Both sides look up the same float32 values and add them once, so
        # they should agree bit for bit; 1e-6 (values are ~0.05) only
        # leaves room for a differently ordered add. A wrong table, a
        # missing position term or an off-by-one position moves values by
        # the size of an embedding entry, ~0.03.
        assert_parity(actual, expected, rtol=0, atol=1e-6)

    repeat_parity("embed", check)
