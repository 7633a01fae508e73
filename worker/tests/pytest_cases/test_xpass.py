"""Marked as an expected failure but passes (non-strict): a stale marker."""

import pytest


@pytest.mark.xfail(reason="norm epsilon still wrong")
def test_norm():
    assert 1 + 1 == 2
