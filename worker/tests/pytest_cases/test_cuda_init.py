"""Fails the way a broken GPU does: an infrastructure error, not a red port."""


def test_on_gpu():
    raise RuntimeError("CUDA error: initialization error")
