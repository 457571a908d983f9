"""The doctor's built-in demo: a small image classifier written with two classic mistakes, so that
`fullgraph doctor` with no TARGET shows a full report in one command on a CPU.

- `if h.mean() > 0:` branches on a tensor's value: a graph break (use torch.where).
- `.item()` pulls a value to the host: a graph break (keep it a tensor).
Run with `--vary batch` (the default for the demo), a new batch size also recompiles it.
"""

from __future__ import annotations

import torch
from torch import nn

DEMO_INPUTS = ("8x3x64x64:float32",)


class DemoNet(nn.Module):
    def __init__(self, dim: int = 256, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1),
            nn.GELU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1),
            nn.GELU(),
        )
        self.proj = nn.Linear(64, dim)
        self.mlp = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        h = self.proj(self.stem(x).mean((2, 3)))  # h: [B, dim]
        if h.mean() > 0:  # a branch on a tensor value: graph break
            h = h * 0.5
        scale = h.abs().amax().item()  # a host sync: graph break
        h = h + self.mlp(h / (scale + 1e-6))
        return self.head(h)


def demo() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """TARGET-style builder: the model and example inputs."""
    return DemoNet(), (torch.randn(8, 3, 64, 64),)
