"""Uses CUDA through the stand-in torch of `tests/fake_torch` (on
PYTHONPATH only for the test that runs this case): its peak is what
FAKE_TORCH_PEAK_MIB says."""

import torch


def test_on_gpu():
    torch.cuda.init()
