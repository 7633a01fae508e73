import numpy as np

import cheat_port

cheat_port.swap_numpy_callable()


def test_parity():
    x = np.ones(4)
    np.testing.assert_allclose(cheat_port.forward(x), x, atol=1e-5)
