"""Official timestep-conditioned state dict → GpuPort's timed DiT names.
Every official tensor must be claimed by a rule: an unknown name raises."""

import re

_RENAMES = [
    (r"^layers\.(\d+)\.ada\.(weight|bias)$", r"blocks.\1.time_proj.\2"),
    (r"^layers\.(\d+)\.ff\.(fc1|fc2)\.(weight|bias)$", r"blocks.\1.mlp.\2.\3"),
]


def convert_timed_state_dict(official_sd):
    out = {}
    for name, t in official_sd.items():
        for pattern, repl in _RENAMES:
            if re.match(pattern, name):
                out[re.sub(pattern, repl, name)] = t.clone()
                break
        else:
            raise KeyError(f"official tensor {name} has no rule in gpuport_timed_mapping")
    return out
