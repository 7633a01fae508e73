"""Tensor-parallel linear layers over ``torch.distributed`` (Megatron style).

A column-parallel layer holds a slice of the output features, so its output
is a slice of the full activation; a row-parallel layer holds the matching
slice of the input features, and the all-reduce of the partial products
gives every rank the full output. A column layer followed by a row layer
needs one all-reduce per MLP.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from fastvideo.models.encoders.gpuport import GeluTanh


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features, out_features, world_size):
        super().__init__()
        local = out_features // world_size
        self.weight = nn.Parameter(torch.empty(local, in_features))
        self.bias = nn.Parameter(torch.empty(local))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, in_features, out_features, world_size):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features // world_size))
        self.bias = nn.Parameter(torch.empty(out_features))

    def forward(self, x):
        partial = F.linear(x, self.weight)
        dist.all_reduce(partial)
        return partial + self.bias


class TensorParallelMLP(nn.Module):
    """``GpuPortMLP`` split over the ranks of the default process group;
    loads a shard made by ``gpuport_mapping.shard_mlp``."""

    def __init__(self, hidden_size, intermediate_size, world_size):
        super().__init__()
        self.up = ColumnParallelLinear(hidden_size, intermediate_size, world_size)
        self.act = GeluTanh()
        self.down = RowParallelLinear(intermediate_size, hidden_size, world_size)

    def forward(self, x):
        return self.down(self.act(self.up(x)))

