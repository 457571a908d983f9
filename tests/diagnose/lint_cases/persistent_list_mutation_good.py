"""FG005's clean twin: lists local to the call (measured: one graph) and tensors returned, not stored."""

import torch
from torch import nn


class Recorder(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(3))
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x):
        outs = []
        for block in self.blocks:
            outs.append(block(x))
        pair = [x, x * 2]
        values, order = x.sort(dim=-1)  # a tensor's sort, not a list's
        self.seen += x.shape[0]
        if self.training:
            outs.pop()
        return torch.cat(outs, dim=-1), torch.cat(pair, dim=0), values, order


def example():
    """The model and a maker of fresh inputs, for the compile test."""
    return Recorder(8).eval(), lambda: (torch.randn(4, 8),)
