"""FG006 planted: loops over dicts passed into forward."""

import torch
from torch import nn


class Fusion(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.ModuleDict({"image": nn.Linear(dim, dim), "depth": nn.Linear(dim, dim)})

    def forward(self, inputs: dict[str, torch.Tensor], **extra):
        total = 0
        for name, t in inputs.items():  # expect: FG006
            total = total + self.proj[name](t)
        for name in inputs:  # expect: FG006
            total = total + inputs[name].mean()
        for t in extra.values():  # expect: FG006
            total = total + t
        for name in extra:  # expect: FG006
            total = total + extra[name].sum()
        return total


class Heads(nn.Module):
    def forward(self, feats):
        return torch.cat(list(feats.values()), dim=-1)  # expect: FG006
