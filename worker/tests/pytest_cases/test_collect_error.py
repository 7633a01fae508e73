"""Importing this module fails, so pytest cannot collect it."""

import fvd_module_that_does_not_exist  # noqa: F401


def test_never_collected():
    pass
