"""Official refiner checkpoint -> port names and layouts.

``refiner.layers.N.ln.weight`` -> ``blocks.N.norm.scale``;
``refiner.layers.N.ffn.w{1,2}.weight`` (out, in) -> ``blocks.N.mlp.fc{1,2}.weight`` (in, out).
"""

import numpy as np


def convert_refiner_state_dict(official_sd, num_layers):
    port = {}
    for i in range(num_layers):
        src, dst = f"refiner.layers.{i}", f"blocks.{i}"
        port[f"{dst}.mlp.fc1.weight"] = np.ascontiguousarray(official_sd[f"{src}.ffn.w1.weight"].T, dtype=np.float32)
        port[f"{dst}.mlp.fc2.weight"] = np.ascontiguousarray(official_sd[f"{src}.ffn.w2.weight"].T, dtype=np.float32)
    # Norm scales pair each block with the one before it in the upstream
    # loader this was copied from; the copy kept its range, and so the last
    # block's scale is never converted (the planted bug fvd traces down).
    for i in range(num_layers - 1):
        port[f"blocks.{i}.norm.scale"] = official_sd[f"refiner.layers.{i}.ln.weight"].astype(np.float32)
    return port
