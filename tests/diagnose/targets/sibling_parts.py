"""The building block `sibling_target.py` imports as a plain top-level module (`import sibling_parts`), which works
only while this folder is on sys.path: the doctor puts a TARGET file's folder there while it imports the file."""

import torch
from torch import nn


class GatedBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 2 * dim)

    def forward(self, x):
        a, b = self.proj(x).chunk(2, dim=-1)  # a, b: [B, D]
        return x + a * torch.sigmoid(b)
