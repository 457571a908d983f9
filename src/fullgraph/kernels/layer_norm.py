"""LayerNorm over the last dimension, affine or not, with or without bias.

    y = (x - mean(x)) / sqrt(var(x) + eps) * w + b      (var is the biased variance, as nn.LayerNorm)

Memory traffic per row of C elements: read x, write y (2·C·bytes); w and b are read once per program.
Mean and variance are computed in float32 from the row held in registers (two passes over registers,
one over memory).
"""

from __future__ import annotations

import functools

import torch

from fullgraph.kernels._library import as_rows, kernel_op, launch, require_triton, row_launch_config


@functools.cache
def _layer_norm_fwd_kernel():
    triton, tl = require_triton()

    @triton.jit
    def kernel(
        X, W, B, Y,
        n_rows, n_cols, stride_x, stride_y, eps,
        HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
        cols = tl.arange(0, BLOCK_N)[None, :]
        mask = (rows < n_rows) & (cols < n_cols)
        rows = rows.to(tl.int64)
        x = tl.load(X + rows * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / n_cols
        xc = tl.where(mask, x - mean[:, None], 0.0)
        # eps arrives as fp32 from a direct launch but fp64 from Inductor's wrapper; fp32 either way
        rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / n_cols + tl.cast(eps, tl.float32))
        y = xc * rstd[:, None]
        if HAS_WEIGHT:
            y *= tl.load(W + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(B + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        tl.store(Y + rows * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)

    return kernel


def _fake(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@kernel_op("layer_norm", fake=_fake)
def layer_norm_fwd(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension. Inputs are checked by `fullgraph.ops.layer_norm`."""
    x2 = as_rows(x)
    n_rows, n_cols = x2.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y = out.view(-1, n_cols)
    if n_rows:
        block_n, rows, num_warps = row_launch_config(n_cols, n_rows)
        launch(_layer_norm_fwd_kernel())[((n_rows + rows - 1) // rows,)](
            x2, weight if weight is not None else x2, bias if bias is not None else x2, y,
            n_rows, n_cols, x2.stride(0), y.stride(0), eps,
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            ROWS=rows, BLOCK_N=block_n, num_warps=num_warps,
        )  # fmt: skip
    return out
