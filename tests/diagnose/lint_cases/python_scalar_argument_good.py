"""FG010's clean twin: numbers fixed in __init__ or passed as tensors; flags and sizes a call site fixes; helpers may
take Python numbers."""

import torch
from torch import nn


class Scaled(nn.Module):
    def __init__(self, steps: int = 4, eps: float = 1e-6):
        super().__init__()
        self.steps = steps
        self.eps = eps

    def forward(
        self,
        x,
        scale: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache=None,
        use_cache: bool = False,  # a flag: two graphs at most, and a call site fixes it
        keep: int = 0,  # a size, only sliced with: fixed per call site (a new one recompiles once, then goes dynamic)
    ):
        for _ in range(self.steps):
            x = x * scale
        if mask is not None:
            x = x * mask
        if use_cache and keep > 0:
            x = x[:, -keep:]
        if self.training or x.shape[-1] > 4:
            x = self._mix(x)
        return x + self.eps

    def _mix(self, x, alpha: float = 0.5):  # called with a constant from forward: not an entry point
        return x * alpha


def example():
    """The model and a maker of fresh inputs, for the compile test."""
    return Scaled().eval(), lambda: (torch.randn(4, 8), torch.rand(()))
