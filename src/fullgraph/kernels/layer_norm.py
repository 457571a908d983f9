"""LayerNorm over the last dimension, affine or not, with or without bias.

    y = (x - mean(x)) / sqrt(var(x) + eps) * w + b      (var is the biased variance, as nn.LayerNorm)

Memory traffic per row of C elements: read x, write y (2·C·bytes); w and b are read once per program.
Mean and variance are computed in float32 from the row held in registers (two passes over registers,
one over memory). The kernel is RMSNorm's (`rms_norm.py`) with the row centered first.
"""

from __future__ import annotations

import torch

from fullgraph.kernels._library import kernel_op
from fullgraph.kernels.rms_norm import launch_row_norm


def _fake(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@kernel_op("layer_norm", fake=_fake)
def layer_norm_fwd(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension. Inputs are checked by `fullgraph.ops.layer_norm`."""
    return launch_row_norm(x, weight, bias, None, eps, center=True)[0]
