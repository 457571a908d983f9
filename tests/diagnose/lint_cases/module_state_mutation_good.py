"""FG009's clean twin: state lives in buffers made in __init__ and is updated in place (the KV-cache pattern)."""

import torch
from torch import nn


class Stateful(nn.Module):
    def __init__(self, dim: int, slots: int = 4):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.calls = 0
        self.register_buffer("total", torch.zeros(()))
        self.register_buffer("last", torch.zeros(slots, dim))
        self.register_buffer("cache", torch.zeros(2, slots, dim))

    def forward(self, x):
        self.total += x.sum()
        self.last.copy_(x.detach())
        self.cache[0, : x.shape[0]] = x
        h = self.proj(x)
        if self.training:
            h = h + self.last
        return h

    def reset(self):
        self.calls = 0  # not reachable from forward: not scanned


def example():
    """The model and a maker of fresh inputs, for the compile test."""
    return Stateful(8).eval(), lambda: (torch.randn(4, 8),)
