"""FG001 planted: conditions that read tensor values. Each marked line must be reported with that rule."""

import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("threshold", torch.zeros(()))

    def forward(self, x, mask=None):
        h = self.proj(x)
        if h.sum() > 0:  # expect: FG001
            h = h * 2
        if (h > 0).any():  # expect: FG001
            h = h.relu()
        while h.abs().max() > 10:  # expect: FG001
            h = h / 2
        assert h.min() > -1e6  # expect: FG001
        scale = 2.0 if h.mean() > 0 else 0.5  # expect: FG001
        if mask is not None and mask.all():  # expect: FG001
            h = h * mask
        if self.threshold > 0:  # expect: FG001
            h = h - self.threshold
        if bool(h.norm() < 1):  # expect: FG001
            h = h + 1
        if h.sum().item() > 0:  # expect: FG001
            h = h - 1
        peak = h.amax()
        if peak > 1:  # expect: FG001
            h = h / peak
        if h:  # expect: FG001
            h = -h
        signed = h.max() > 0 or h.min() < 0  # expect: FG001
        kept = [t for t in h if t.sum() > 0]  # expect: FG001
        return h * scale, signed, kept
