"""A strict xfail that passes: pytest fails it."""

import pytest


@pytest.mark.xfail(reason="attention mask still wrong", strict=True)
def test_attention():
    assert True
