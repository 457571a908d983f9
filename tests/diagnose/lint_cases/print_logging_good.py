"""FG004's clean twin: logging happens at construction and in methods forward does not call."""

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)


class Noisy(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        logger.info("built with dim %d", dim)

    def forward(self, x):
        h = self.proj(x)
        if self.training:
            h = h * 0.5
        return self._tail(h)

    def _tail(self, h):
        return h + 1

    def describe(self):
        print(self)  # not reachable from forward: not scanned


def example():
    """The model and a maker of fresh inputs, for the compile test."""
    return Noisy(8).eval(), lambda: (torch.randn(4, 8),)
