import numpy as np

import cheat_port

cheat_port.unregister_fvd()


def test_parity():
    x = np.ones(4)
    np.testing.assert_allclose(cheat_port.forward(x), x, atol=1e-5)
