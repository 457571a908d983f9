"""FG007's clean twin: the same work vectorized; loops only over fixed counts and the module's blocks."""

import torch
from torch import nn


class RowLoop(nn.Module):
    def __init__(self, dim: int, num_layers: int = 2):
        super().__init__()
        self.num_layers = num_layers
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(num_layers))

    def forward(self, x):
        out = (x * 2 + 1).relu()
        batch, width = x.shape
        out = out / width
        out = out.reshape(batch * width).reshape(batch, width)
        for block in self.blocks:
            out = block(out)
        for _ in range(self.num_layers):
            out = out * 0.5
        for _ in range(3):
            out = out + 1
        halves = out[: x.shape[0] // 2]
        if x.shape[0] > 10:
            out = out * 2
        return out, halves


def example():
    """The model and a maker of fresh inputs, for the compile test."""
    return RowLoop(8).eval(), lambda: (torch.randn(4, 8),)
