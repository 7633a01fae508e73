"""Never finishes; fvd must kill it at the timeout."""

import time


def test_hangs():
    time.sleep(3600)
