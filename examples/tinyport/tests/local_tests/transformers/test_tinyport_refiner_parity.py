"""TinyPort refiner parity: three pre-norm residual MLP blocks, official
float64 against the FastVideo float32 port run as two sequence-parallel
ranks (each takes half of the tokens; the blocks work per token).

coverage_scope: implementation_subcomponent -- the refiner alone, on
seeded inputs.

Red on purpose: the port's checkpoint mapping never converts the last
block's norm scale. With FASTVIDEO_TRACE_ACTIVATIONS=1 both sides are
traced: the port through FASTVIDEO_TRACE_* (one file per rank), the
reference by this harness into FVD_TRACE_DIR with FVD_TRACE_REFERENCE_LAYERS
(the reference has no hooks of its own, like an upstream repository).
"""

import os

import numpy as np
from fastvideo.hooks.activation_trace import attach
from fastvideo.models.dits.tinyport_refiner import RefinerArchConfig, TinyPortRefiner
from fastvideo.models.loader.tinyport_refiner_mapping import convert_refiner_state_dict
from tinyport_official.refiner import Refiner, RefinerConfig, init_refiner_weights

COVERAGE_SCOPE = "implementation_subcomponent"
WORLD_SIZE = 2


def reference_output():
    folder = os.environ.get("FVD_TRACE_DIR")
    return os.path.join(folder, "reference_rank<rank>.jsonl") if folder else None


def test_tinyport_refiner_parity():
    cfg = RefinerConfig()
    sd = init_refiner_weights(cfg, seed=5)
    x = np.random.default_rng(6).standard_normal((cfg.tokens, cfg.dim))

    official = Refiner(sd, cfg)
    with attach(official, output=reference_output(), layers=os.environ.get("FVD_TRACE_REFERENCE_LAYERS")):
        expected = official(x)

    port = TinyPortRefiner(convert_refiner_state_dict(sd, cfg.layers), RefinerArchConfig())
    shards = []
    for rank, part in enumerate(np.array_split(x.astype(np.float32), WORLD_SIZE)):
        with attach(port, rank=rank, world_size=WORLD_SIZE):
            shards.append(port(part))
    actual = np.concatenate(shards)

    assert actual.shape == expected.shape
    # float32 against float64 through three small blocks: rounding stays
    # below 1e-5; 1e-4 leaves an order of magnitude of margin.
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)
