import numpy as np

import cheat_port

cheat_port.swap_numpy()


def test_parity():
    x = np.ones(4)
    np.testing.assert_allclose(cheat_port.forward(x), x, atol=1e-5)
