"""FG009 planted: module attributes assigned in forward and in a method it calls."""

import torch
from torch import nn


class Stateful(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.calls = 0
        self.last = None
        self.register_buffer("total", torch.zeros(()))

    def forward(self, x):
        self.calls += 1  # expect: FG009
        self.last = x.detach()  # expect: FG009
        self.stats: dict = {}  # expect: FG009
        self.rows, self.cols = x.shape  # expect: FG009
        self.proj.scale = 2.0  # expect: FG009
        self._remember(x)
        return self.proj(x)

    def _remember(self, x):
        self.cache = x * 2  # expect: FG009
