"""GpuPort encoder under torchrun, red on purpose and traced: the example of
fvd's trace actor on GPUs (family ``gpuport_traced``, its own port.toml so
the benchmarked ``gpuport`` port keeps its five green components).

coverage_scope: both -- the whole port model, loaded from the converted
official checkpoint, against the official GPT-2 end to end.

Each rank runs the port on its half of the batch (data parallel) and
compares it with the official model's output for that half. The planted
bug: the loader below drops layer 1's MLP down-projection bias (a mapping
that forgot one key and kept the zero init), so every rank fails.

With ``FASTVIDEO_TRACE_ACTIVATIONS`` set (fvd's traced reruns set it), the
port is traced through ``fvd_trace.attach`` on every rank (one
``port_rank<N>.jsonl`` each, merged by fvd on the batch dim), and rank 0
traces the official model on the whole batch into ``FVD_TRACE_DIR`` with
``FVD_TRACE_REFERENCE_LAYERS``, as one unsharded run.

Run with ``torchrun --standalone --nproc_per_node=2 -m pytest <this file>``.
"""

import os
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

import fvd_trace  # noqa: E402
import torch.distributed as dist  # noqa: E402
from fastvideo.models.encoders.gpuport import GpuPortArchConfig, GpuPortEncoder  # noqa: E402
from fastvideo.models.loader.gpuport_mapping import (  # noqa: E402
    convert_official_state_dict,
    official_weights,
)
from gpuport_official import build_official  # noqa: E402

COVERAGE_SCOPE = "both"


def load_with_dropped_bias(official):
    """The planted bug: the converted checkpoint without one bias."""
    sd = convert_official_state_dict(official_weights(official))
    sd["layers.1.mlp.down.bias"] = torch.zeros_like(sd["layers.1.mlp.down.bias"])
    return sd


def reference_tracer(official, rank):
    folder = os.environ.get("FVD_TRACE_DIR")
    if rank != 0 or not folder:
        return None
    config = fvd_trace.TraceConfig.from_env()
    config = fvd_trace.TraceConfig(
        enabled=config.enabled,
        layers=os.environ.get("FVD_TRACE_REFERENCE_LAYERS", ""),
        stats=config.stats,
        output=os.path.join(folder, "reference_rank0.jsonl"),
    )
    return fvd_trace.attach(official, config=config, rank=0, world_size=1)


def test_gpuport_traced_encoder_parity(device, input_ids, assert_parity):
    world = int(os.environ.get("WORLD_SIZE", "0"))
    if world < 2:
        pytest.skip("the traced encoder parity runs under torchrun with at least 2 ranks")
    cuda = device.type == "cuda"
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        timeout=timedelta(seconds=120),
        device_id=device if cuda else None,
    )
    try:
        rank = dist.get_rank()
        official = build_official(device)
        port = GpuPortEncoder(GpuPortArchConfig.from_official(official.config))
        port.load_state_dict(load_with_dropped_bias(official), strict=True)
        port = port.to(device).eval()

        ids = input_ids(0)
        ref = reference_tracer(official, rank)
        with torch.no_grad():
            expected = official(input_ids=ids, use_cache=False).last_hidden_state
        if ref is not None:
            ref.close()
        mine = ids.chunk(world)[rank]
        handle = fvd_trace.attach(port)
        with torch.no_grad():
            actual = port(mine)
        if handle is not None:
            handle.close()
        # Every rank has written its trace before any rank fails.
        dist.barrier()
        assert_parity(actual, expected.chunk(world)[rank], rtol=1e-4, atol=5e-5)
    finally:
        dist.destroy_process_group()
