"""Imports the stand-in torch but never initialises CUDA: a CPU-only run."""

import torch


def test_on_cpu():
    assert not torch.cuda.is_initialized()
