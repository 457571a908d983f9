"""FG003's clean twin: the same numbers from torch ops; NumPy only at import time, outside forward."""

import math

import numpy as np
import torch
from torch import nn

EPS = float(np.finfo(np.float32).eps)  # module level runs once at import: not forward code


class Calibrate(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("ramp", torch.linspace(0.0, 1.0, dim))

    def forward(self, x):
        h = self.proj(x)
        gain = torch.special.erf(torch.tensor(0.5, device=x.device))
        bound = min(max(2.0, 0.0), 1.0)
        root = math.sqrt(2.0)
        if x.shape[-1] == self.ramp.shape[0]:
            h = h * self.ramp
        return h * gain * bound * root + EPS


def example():
    """The model and a maker of fresh inputs, for the compile test."""
    return Calibrate(8).eval(), lambda: (torch.randn(4, 8),)
