"""A scaffold: the port class does not exist yet."""

import pytest


def test_port_exists():
    pytest.skip("fastvideo TinyPort class missing")
