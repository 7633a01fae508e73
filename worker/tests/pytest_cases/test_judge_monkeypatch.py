"""A judge that patches an assertion helper inside one test, as real suites
patch what they isolate: undone at teardown, so no finding."""

import numpy as np


def test_patched_within_the_test(monkeypatch):
    calls = []
    monkeypatch.setattr(np.testing, "assert_allclose", lambda *a, **k: calls.append(a))
    np.testing.assert_allclose(1, 2)
    assert len(calls) == 1


def test_the_real_helper_is_back():
    np.testing.assert_allclose(np.ones(2), np.ones(2))
