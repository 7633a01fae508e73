"""The comparison passes but a fixture breaks while cleaning up."""

import pytest


@pytest.fixture
def workspace():
    yield "scratch"
    raise RuntimeError("could not release the workspace")


def test_uses_workspace(workspace):
    assert workspace == "scratch"
