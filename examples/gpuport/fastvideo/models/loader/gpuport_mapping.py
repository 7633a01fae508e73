"""Official GPT-2 state dict → GpuPort names and layouts.

GPT-2 stores its projections as ``Conv1D`` weights of shape ``(in, out)``
and fuses q, k and v into one ``c_attn``; the port uses ``nn.Linear``
``(out, in)`` weights and three projections. Every official tensor must be
claimed by a rule: an unknown name raises instead of being dropped, so a
renamed upstream tensor cannot silently leave a port weight at its init.
"""

import re

import torch

# Non-persistent buffers some transformers versions still put in a state
# dict (the causal-mask cache); they are recomputed, not weights.
_IGNORED = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")

_RENAMES = [
    (r"^wte\.weight$", "embed.token_embed.weight"),
    (r"^wpe\.weight$", "embed.pos_embed.weight"),
    (r"^h\.(\d+)\.ln_1\.(weight|bias)$", r"layers.\1.norm1.\2"),
    (r"^h\.(\d+)\.ln_2\.(weight|bias)$", r"layers.\1.norm2.\2"),
    (r"^ln_f\.(weight|bias)$", r"final_norm.\1"),
]

# Conv1D tensors that map one-to-one onto a Linear (weights transposed).
_LINEARS = [
    (r"^h\.(\d+)\.attn\.c_proj\.(weight|bias)$", r"layers.\1.attn.o_proj.\2"),
    (r"^h\.(\d+)\.mlp\.c_fc\.(weight|bias)$", r"layers.\1.mlp.up.\2"),
    (r"^h\.(\d+)\.mlp\.c_proj\.(weight|bias)$", r"layers.\1.mlp.down.\2"),
]

_FUSED_QKV = re.compile(r"^h\.(\d+)\.attn\.c_attn\.(weight|bias)$")


def convert_official_state_dict(official_sd):
    """Returns the port's state dict (new tensors, same device and dtype)."""
    out = {}
    for name, t in official_sd.items():
        if _IGNORED.match(name):
            continue
        m = _FUSED_QKV.match(name)
        if m:
            layer, kind = m.groups()
            # c_attn output columns are [q | k | v], each hidden_size wide.
            parts = t.chunk(3, dim=-1)
            for proj, part in zip(("q_proj", "k_proj", "v_proj"), parts):
                out[f"layers.{layer}.attn.{proj}.{kind}"] = (
                    part.t().contiguous() if kind == "weight" else part.clone()
                )
            continue
        for pattern, repl in _LINEARS:
            if re.match(pattern, name):
                key = re.sub(pattern, repl, name)
                out[key] = t.t().contiguous() if name.endswith("weight") else t.clone()
                break
        else:
            for pattern, repl in _RENAMES:
                if re.match(pattern, name):
                    out[re.sub(pattern, repl, name)] = t.clone()
                    break
            else:
                raise KeyError(f"official tensor {name!r} has no mapping rule")
    return out


def shard_mlp(port_sd, prefix, rank, world_size):
    """The tensor-parallel shard of one port MLP for ``rank``.

    ``up`` is split by output features (each rank computes a slice of the
    hidden activations), ``down`` by input features (each rank's partial
    product is summed by an all-reduce). ``down``'s bias is added once,
    after the sum, so every rank keeps it whole.
    """
    up_w, up_b = port_sd[f"{prefix}up.weight"], port_sd[f"{prefix}up.bias"]
    down_w, down_b = port_sd[f"{prefix}down.weight"], port_sd[f"{prefix}down.bias"]
    if up_w.shape[0] % world_size:
        raise ValueError(f"intermediate size {up_w.shape[0]} does not split over {world_size} ranks")
    return {
        "up.weight": up_w.chunk(world_size, dim=0)[rank].contiguous(),
        "up.bias": up_b.chunk(world_size, dim=0)[rank].contiguous(),
        "down.weight": down_w.chunk(world_size, dim=1)[rank].contiguous(),
        "down.bias": down_b.clone(),
    }


def official_weights(model):
    """The official model's state dict, detached (what a checkpoint holds)."""
    with torch.no_grad():
        return {k: v.detach() for k, v in model.state_dict().items()}
