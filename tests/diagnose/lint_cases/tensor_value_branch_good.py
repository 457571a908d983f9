"""FG001's clean twin: the same gate with value-dependent choices made by torch.where and masks."""

import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(0.1)
        self.register_buffer("threshold", torch.zeros(()))
        self.use_bias = True

    def forward(self, x, mask=None):
        h = self.proj(x)
        h = torch.where(h.sum() > 0, h * 2, h)
        h = torch.where(h > 0, h.relu(), h)
        h = h / torch.clamp(h.abs().amax() / 10, min=1)
        scale = torch.where(h.mean() > 0, 2.0, 0.5)
        if mask is not None:
            h = h * mask
        h = h - self.threshold.clamp(min=0)
        if self.training:  # a Python flag: guarded, never a break
            h = self.drop(h)
        if self.use_bias and x.shape[0] > 2 and x.dim() == 2 and x.ndim == 2 and len(x) > 0:
            h = h + 1
        if x.size(-1) % 2 == 0 and not isinstance(mask, torch.Tensor) and x is not None:
            h = h * 1.5
        return h * scale


def example():
    """The model and a maker of fresh inputs, for the compile test."""
    return Gate(8).eval(), lambda: (torch.randn(4, 8),)
