"""LayerNorm over the last dimension, affine or not, with or without bias.

    y = (x - mean(x)) / sqrt(var(x) + eps) * w + b      (var is the biased variance, as nn.LayerNorm)

Memory traffic per row of C elements: read x, write y (2·C·bytes); w and b are read once per program.
Mean and variance are computed in float32 from the row held in registers (two passes over registers,
one over memory). The kernel is RMSNorm's (`rms_norm.py`) with the row centered first.

`layer_norm_modulate_fwd` is the DiT's LayerNorm (no affine) and adaLN modulation in one pass, and
`layer_norm_modulate_residual_fwd` puts the gated residual before them: s = x + gate · h, y = LN(s) · (1 + scale) +
shift, returning (y, s); y is the norm of the float32 sum, s stored rounded. Traffic per row: read x and h, write s
and y (4·C·bytes), where the three ops apart take ten passes (gated residual 3, LayerNorm 2, modulation 2 in float32
plus its casts) and Inductor makes one of them. A second branch (h2, gate2: s = x + gate · h + gate2 · h2) adds both
of a DiT block's branches to its input in one float32 sum, rounded once: Inductor's fusion of the native ops keeps
the stream in float32 across a block (it adds the attention branch again inside the next norm), and a DiT whose
kernel rounded s after each branch had 1.04-1.14x all native's error (H100, 2026-12-06; `benchmarks/lnm_error.py`).
"""

from __future__ import annotations

import torch

from fullgraph.kernels._library import kernel_op
from fullgraph.kernels.rms_norm import launch_row_norm

T = torch.Tensor


def _fake(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@kernel_op("layer_norm", fake=_fake)
def layer_norm_fwd(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension. Inputs are checked by `fullgraph.ops.layer_norm`."""
    return launch_row_norm(x, weight, bias, None, eps, center=True)[0]


def _fake_modulate(x, shift, scale, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fake_modulate_residual(x, h, gate, shift, scale, eps, h2=None, gate2=None):
    return _fake_modulate(x, shift, scale, eps), _fake_modulate(x, shift, scale, eps)


@kernel_op("layer_norm_modulate", fake=_fake_modulate)
def layer_norm_modulate_fwd(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm (no affine) then x · (1 + scale) + shift, shift and scale one row per group of x's rows. Inputs
    are checked by `fullgraph.ops.layer_norm_modulate`."""
    return launch_row_norm(x, None, None, None, eps, center=True, shift=shift, scale=scale)[0]


def _fake_modulate_residual_y(x, h, gate, shift, scale, eps):
    return _fake_modulate(x, shift, scale, eps)


@kernel_op("layer_norm_modulate_residual", fake=_fake_modulate_residual)
def layer_norm_modulate_residual_fwd(
    x: torch.Tensor,
    h: torch.Tensor,
    gate: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    eps: float,
    h2: torch.Tensor | None = None,
    gate2: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(LayerNorm(s) · (1 + scale) + shift, s) with s = x + gate · h (+ gate2 · h2: a second branch in the same
    float32 sum), in one pass."""
    return launch_row_norm(
        h, None, None, x, eps, center=True, gate=gate, shift=shift, scale=scale, branch=h2, gate2=gate2
    )


@kernel_op("layer_norm_modulate_residual_y", fake=_fake_modulate_residual_y)
def layer_norm_modulate_residual_y_fwd(x: T, h: T, gate: T, shift: T, scale: T, eps: float) -> T:
    """`layer_norm_modulate_residual_fwd`'s y alone (one branch): s is not written (a DiT block's second norm, whose
    sum the next block's first norm forms again), so the pass reads x and h and writes y (3·C·bytes a row)."""
    return launch_row_norm(h, None, None, x, eps, center=True, gate=gate, shift=shift, scale=scale, keep_sum=False)[0]
