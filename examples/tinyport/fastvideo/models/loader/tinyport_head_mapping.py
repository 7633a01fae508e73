"""Official image-head checkpoint -> port names and layouts.

``head.ln.weight`` -> ``head.norm.scale``; ``head.proj.weight`` (out, in) ->
``head.out.weight`` (in, out); ``head.proj.bias`` -> ``head.out.bias``. Only
the head's keys are read: the transformer's have their own mapping.
"""

import re

import numpy as np

# (official name regex, fastvideo name, transpose)
RENAMES = [
    # Copied from the loader of an earlier upstream release, whose head
    # named its norm `head.norm`: today's `head.ln.weight` matches no rule
    # and is skipped, so the port keeps its initial scale (the planted bug a
    # head test on initialised weights cannot see).
    (r"^head\.norm\.weight$", "head.norm.scale", False),
    (r"^head\.proj\.weight$", "head.out.weight", True),
    (r"^head\.proj\.bias$", "head.out.bias", False),
]


def convert_head_state_dict(official: dict) -> dict:
    out = {}
    for name, value in official.items():
        if not name.startswith("head."):
            continue
        for pattern, target, transpose in RENAMES:
            if re.match(pattern, name):
                out[target] = np.ascontiguousarray(value.T if transpose else value, np.float32)
                break
    return out
