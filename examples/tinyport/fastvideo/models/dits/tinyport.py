"""FastVideo port of the TinyPort text transformer.

Runs in float32 with a fused QKV projection and (in, out) weight layout; the
official checkpoint is converted by fastvideo.models.loader.tinyport_mapping.
"""

from dataclasses import dataclass

import numpy as np

from fastvideo.layers.layernorm import RMSNorm


@dataclass
class TinyPortArchConfig:
    num_embeddings: int = 512
    max_seq_len: int = 64
    hidden_size: int = 128
    num_attention_heads: int = 4
    num_layers: int = 2
    ffn_multiplier: int = 4
    rms_eps: float = 1e-6


def _sinusoid_table(seq_len, hidden):
    # Same sinusoid table as upstream, computed in closed form.
    inv_freq = np.exp(-np.log(10000.0) * np.arange(0, hidden, 2) / hidden)
    angles = np.arange(seq_len)[:, None] * inv_freq[None, :]
    table = np.empty((seq_len, hidden))
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table.astype(np.float32)


class TinyPortTextEmbedding:
    def __init__(self, weights, cfg: TinyPortArchConfig):
        self.token_table = weights["embedder.token_table"]
        self.pos_table = _sinusoid_table(cfg.max_seq_len, cfg.hidden_size)

    def forward(self, input_ids):
        ids = np.asarray(input_ids)
        return np.take(self.token_table, ids, axis=0) + self.pos_table[: ids.shape[0]]

    __call__ = forward


def _gelu(x):
    c = np.float32(0.7978845608028654)  # sqrt(2 / pi)
    return 0.5 * x * (1.0 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


class TinyPortLayer:
    def __init__(self, weights, idx, cfg: TinyPortArchConfig):
        p = f"layers.{idx}"
        self.heads = cfg.num_attention_heads
        self.attn_norm = RMSNorm(weights[f"{p}.attn_norm.scale"], cfg.rms_eps)
        self.qkv = weights[f"{p}.attention.qkv_proj.weight"]
        self.out_w = weights[f"{p}.attention.out_proj.weight"]
        self.out_b = weights[f"{p}.attention.out_proj.bias"]
        self.ffn_norm = RMSNorm(weights[f"{p}.ffn_norm.scale"], cfg.rms_eps)
        self.up_w = weights[f"{p}.ffn.up.weight"]
        self.up_b = weights[f"{p}.ffn.up.bias"]
        self.down_w = weights[f"{p}.ffn.down.weight"]
        self.down_b = weights[f"{p}.ffn.down.bias"]

    def _attention(self, h):
        n, d = h.shape
        hd = d // self.heads
        q, k, v = np.split(h @ self.qkv, 3, axis=-1)
        # (heads, n, hd): all heads at once instead of a loop.
        q, k, v = (t.reshape(n, self.heads, hd).transpose(1, 0, 2) for t in (q, k, v))
        logits = np.einsum("hqd,hkd->hqk", q, k) * np.float32(1.0 / np.sqrt(hd))
        logits -= logits.max(axis=-1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=-1, keepdims=True)
        ctx = np.einsum("hqk,hkd->qhd", probs, v).reshape(n, d)
        return ctx @ self.out_w + self.out_b

    def forward(self, x):
        x = x + self._attention(self.attn_norm(x))
        h = _gelu(self.ffn_norm(x) @ self.up_w + self.up_b)
        return x + (h @ self.down_w + self.down_b)

    __call__ = forward


class TinyPortDiT:
    def __init__(self, weights, cfg: TinyPortArchConfig = TinyPortArchConfig()):
        self.embedder = TinyPortTextEmbedding(weights, cfg)
        self.layers = [TinyPortLayer(weights, i, cfg) for i in range(cfg.num_layers)]
        self.norm_out = RMSNorm(weights["norm_out.scale"], cfg.rms_eps)

    def forward(self, input_ids):
        x = self.embedder(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm_out(x)

    __call__ = forward
