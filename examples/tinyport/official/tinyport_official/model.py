"""The official TinyPort text transformer (float64)."""

import numpy as np

from tinyport_official.config import TinyPortConfig
from tinyport_official.layers import (
    Linear,
    RMSNorm,
    gelu_tanh,
    sinusoidal_positions,
    softmax,
)


class TokenEmbedding:
    def __init__(self, sd, cfg: TinyPortConfig):
        self.table = sd["embed.tokens.weight"]
        self.positions = sinusoidal_positions(cfg.max_len, cfg.dim)

    def __call__(self, ids):
        return self.table[ids] + self.positions[: len(ids)]


class Attention:
    def __init__(self, sd, prefix, heads):
        self.heads = heads
        self.to_q = Linear(sd[f"{prefix}.to_q.weight"])
        self.to_k = Linear(sd[f"{prefix}.to_k.weight"])
        self.to_v = Linear(sd[f"{prefix}.to_v.weight"])
        self.to_out = Linear(sd[f"{prefix}.to_out.weight"], sd[f"{prefix}.to_out.bias"])

    def __call__(self, x):
        n, d = x.shape
        hd = d // self.heads
        out = np.empty_like(x)
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        for h in range(self.heads):
            s = slice(h * hd, (h + 1) * hd)
            scores = q[:, s] @ k[:, s].T / np.sqrt(hd)
            out[:, s] = softmax(scores) @ v[:, s]
        return self.to_out(out)


class Block:
    def __init__(self, sd, i, cfg: TinyPortConfig):
        p = f"blocks.{i}"
        self.norm1 = RMSNorm(sd[f"{p}.norm1.weight"], cfg.norm_eps)
        self.attn = Attention(sd, f"{p}.attn", cfg.heads)
        self.norm2 = RMSNorm(sd[f"{p}.norm2.weight"], cfg.norm_eps)
        self.fc1 = Linear(sd[f"{p}.mlp.fc1.weight"], sd[f"{p}.mlp.fc1.bias"])
        self.fc2 = Linear(sd[f"{p}.mlp.fc2.weight"], sd[f"{p}.mlp.fc2.bias"])

    def __call__(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(gelu_tanh(self.fc1(self.norm2(x))))


class TinyPortTransformer:
    """Token ids -> contextual embeddings (n, dim)."""

    def __init__(self, sd, cfg: TinyPortConfig = TinyPortConfig()):
        self.embed = TokenEmbedding(sd, cfg)
        self.blocks = [Block(sd, i, cfg) for i in range(cfg.layers)]
        self.final_norm = RMSNorm(sd["final_norm.weight"], cfg.norm_eps)

    def __call__(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.final_norm(x)
