"""Official TinyPort checkpoint -> FastVideo parameter names and layouts.

Renames follow regex -> template rules; linear weights go from torch's
(out, in) to the port's (in, out); the separate q/k/v projections are fused
into one (in, 3*out) matrix; everything is cast to float32.
"""

import re

import numpy as np

# (official name regex, fastvideo template, transpose)
RENAMES = [
    (r"^embed\.tokens\.weight$", "embedder.token_table", False),
    (r"^blocks\.(\d+)\.norm1\.weight$", r"layers.\1.attn_norm.scale", False),
    (r"^blocks\.(\d+)\.norm2\.weight$", r"layers.\1.ffn_norm.scale", False),
    (r"^blocks\.(\d+)\.attn\.to_out\.weight$", r"layers.\1.attention.out_proj.weight", True),
    (r"^blocks\.(\d+)\.attn\.to_out\.bias$", r"layers.\1.attention.out_proj.bias", False),
    (r"^blocks\.(\d+)\.mlp\.fc1\.weight$", r"layers.\1.ffn.up.weight", True),
    (r"^blocks\.(\d+)\.mlp\.fc1\.bias$", r"layers.\1.ffn.up.bias", False),
    (r"^blocks\.(\d+)\.mlp\.fc2\.weight$", r"layers.\1.ffn.down.weight", True),
    (r"^blocks\.(\d+)\.mlp\.fc2\.bias$", r"layers.\1.ffn.down.bias", False),
    (r"^final_norm\.weight$", "norm_out.scale", False),
    (r"^vae\.decoder\.conv_in\.(weight|bias)$", r"decoder.proj_in.\1", False),
    (r"^vae\.decoder\.norm_out\.weight$", "decoder.out_norm.scale", False),
    (r"^vae\.decoder\.conv_out\.(weight|bias)$", r"decoder.proj_out.\1", False),
]

_QKV = re.compile(r"^blocks\.(\d+)\.attn\.to_([qkv])\.weight$")


def convert_official_state_dict(official: dict) -> dict:
    """Map every official tensor; an unmapped name is an error, not a silent drop."""
    out, qkv = {}, {}
    for name, value in official.items():
        m = _QKV.match(name)
        if m:
            qkv.setdefault(m.group(1), {})[m.group(2)] = value
            continue
        for pattern, template, transpose in RENAMES:
            if re.match(pattern, name):
                target = re.sub(pattern, template, name)
                out[target] = np.ascontiguousarray(value.T if transpose else value, np.float32)
                break
        else:
            raise KeyError(f"no fastvideo mapping for official parameter {name!r}")
    for layer, parts in qkv.items():
        fused = np.concatenate([parts["q"].T, parts["k"].T, parts["v"].T], axis=1)
        out[f"layers.{layer}.attention.qkv_proj.weight"] = fused.astype(np.float32)
    return out
