"""The port: GpuPort's text encoder written natively in torch.

It computes what GPT-2 computes, organised the FastVideo way: separate
q/k/v projections in ``nn.Linear``'s ``(out, in)`` layout (GPT-2 fuses them
in one ``Conv1D`` stored ``(in, out)``), ``scaled_dot_product_attention``
instead of an explicit softmax, and its own module names. Weights come only
through ``fastvideo.models.loader.gpuport_mapping``.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GpuPortArchConfig:
    vocab_size: int = 4096
    max_positions: int = 512
    hidden_size: int = 256
    num_heads: int = 4
    num_layers: int = 2
    intermediate_size: int = 1024
    norm_eps: float = 1e-5

    @classmethod
    def from_official(cls, cfg):
        """From a ``GPT2Config`` (``n_inner=None`` means 4 × width)."""
        return cls(
            vocab_size=cfg.vocab_size,
            max_positions=cfg.n_positions,
            hidden_size=cfg.n_embd,
            num_heads=cfg.n_head,
            num_layers=cfg.n_layer,
            intermediate_size=cfg.n_inner or 4 * cfg.n_embd,
            norm_eps=cfg.layer_norm_epsilon,
        )


class GpuPortEmbedding(nn.Module):
    def __init__(self, cfg: GpuPortArchConfig):
        super().__init__()
        self.token_embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos_embed = nn.Embedding(cfg.max_positions, cfg.hidden_size)

    def forward(self, ids):
        pos = torch.arange(ids.shape[-1], device=ids.device)
        return self.token_embed(ids) + self.pos_embed(pos)


class GpuPortSelfAttention(nn.Module):
    """Causal multi-head self-attention."""

    def __init__(self, cfg: GpuPortArchConfig):
        super().__init__()
        d = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.o_proj = nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        h = self.num_heads

        def heads(t):
            return t.view(b, s, h, d // h).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, d))


class GeluTanh(nn.Module):
    """GELU, tanh approximation (GPT-2's ``gelu_new``). A module rather than
    a call so activation traces see it."""

    def forward(self, x):
        return F.gelu(x, approximate="tanh")


class GpuPortMLP(nn.Module):
    def __init__(self, cfg: GpuPortArchConfig):
        super().__init__()
        self.up = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = GeluTanh()
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class GpuPortLayer(nn.Module):
    """Pre-norm transformer layer."""

    def __init__(self, cfg: GpuPortArchConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = GpuPortSelfAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = GpuPortMLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GpuPortEncoder(nn.Module):
    def __init__(self, cfg: GpuPortArchConfig):
        super().__init__()
        self.embed = GpuPortEmbedding(cfg)
        self.layers = nn.ModuleList(GpuPortLayer(cfg) for _ in range(cfg.num_layers))
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.final_norm(x)


def load_submodule(module: nn.Module, port_sd, prefix: str):
    """Load the entries of ``port_sd`` under ``prefix`` into ``module``,
    strictly: a missing or extra tensor is an error, never a silent default."""
    sub = {k[len(prefix):]: v for k, v in port_sd.items() if k.startswith(prefix)}
    module.load_state_dict(sub, strict=True)
    return module
