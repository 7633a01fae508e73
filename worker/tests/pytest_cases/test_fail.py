"""A numeric mismatch: the port is red."""


def test_outputs_match():
    official, port = 1.0, 1.5
    assert official == port, "outputs differ by 0.5"
