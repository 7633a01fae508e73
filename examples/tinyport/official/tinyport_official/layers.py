"""Building blocks of the official TinyPort (float64)."""

import math

import numpy as np


class RMSNorm:
    """Root-mean-square norm over the last axis."""

    def __init__(self, weight, eps):
        self.weight = weight
        self.eps = eps

    def __call__(self, x):
        ms = np.mean(np.square(x), axis=-1, keepdims=True)
        return x / np.sqrt(ms + self.eps) * self.weight


class ChannelRMSNorm:
    """RMS norm over the channel axis of a (C, H, W) feature map, as used at
    the end of the decoder."""

    def __init__(self, weight, eps):
        self.weight = weight
        self.eps = eps

    def __call__(self, x):
        ms = np.mean(x**2, axis=0, keepdims=True)
        return x / np.sqrt(ms + self.eps) * self.weight[:, None, None]


class Linear:
    def __init__(self, weight, bias=None):
        self.weight = weight  # (out, in), like torch.nn.Linear
        self.bias = bias

    def __call__(self, x):
        y = x @ self.weight.T
        return y if self.bias is None else y + self.bias


def sinusoidal_positions(length, dim):
    """pe[p, 2i] = sin(p / 10000^(2i/dim)), pe[p, 2i+1] = cos(same)."""
    pe = np.zeros((length, dim))
    for i in range(0, dim, 2):
        div = 10000.0 ** (i / dim)
        for p in range(length):
            pe[p, i] = math.sin(p / div)
            pe[p, i + 1] = math.cos(p / div)
    return pe


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def softmax(x, axis=-1):
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)
