"""RMSNorm, optionally fused with the residual add before it.

    s = x + residual                      (when a residual is given; s is returned too)
    y = s / sqrt(mean(s²) + eps) * w

Memory traffic per row of C elements: read x (and residual), write y (and s), read w once per program;
so 2·C·bytes (4·C·bytes fused). Accumulation is in float32 whatever the input dtype.

The kernel is LayerNorm's too (`layer_norm.py`): with CENTER it normalizes the row minus its mean, and
HAS_BIAS adds b after the weight. And it is the DiT's LayerNorm + adaLN modulation (`layer_norm_modulate_fwd`
below): with GATE the residual is gated (s = residual + gate · x, the gate one row per group of rows, as
modulation's parameters are), and with MODULATE the normalized row becomes y · (1 + scale) + shift, so a block's
gated residual, LayerNorm and modulation are one pass: read x and the residual, write s and y.
"""

from __future__ import annotations

import functools

import torch

from fullgraph.kernels._library import as_rows, kernel_op, launch, require_triton, row_launch_config
from fullgraph.kernels.modulate import groups


@functools.cache
def _row_norm_fwd_kernel():
    triton, tl = require_triton()

    @triton.jit
    def fullgraph_row_norm(
        X, R, W, B, Y, S, G, SHIFT, SCALE,
        n_rows, n_cols, stride_x, stride_r, stride_y, stride_s, rows_per_group, eps,
        CENTER: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
        GATE: tl.constexpr, MODULATE: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
        cols = tl.arange(0, BLOCK_N)[None, :]
        mask = (rows < n_rows) & (cols < n_cols)
        rows = rows.to(tl.int64)
        # the parameter row of each row's group (gate, shift, scale: [groups, n_cols], contiguous)
        param = (rows // rows_per_group) * n_cols + cols
        x = tl.load(X + rows * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(R + rows * stride_r + cols, mask=mask, other=0.0)
            if GATE:  # noqa: SIM108 (a constexpr branch: the other load is never built)
                x = r.to(tl.float32) + tl.load(G + param, mask=mask, other=0.0).to(tl.float32) * x
            else:
                x = x + r
            # round the sum to the stored dtype first, so y is the norm of exactly the s we return
            x = x.to(S.dtype.element_ty)
            tl.store(S + rows * stride_s + cols, x, mask=mask)
            x = x.to(tl.float32)
        if CENTER:  # LayerNorm: the biased variance is the mean square of the centered row
            x = tl.where(mask, x - (tl.sum(x, axis=1) / n_cols)[:, None], 0.0)
        # eps arrives as fp32 from a direct launch but fp64 from Inductor's wrapper; fp32 either way
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + tl.cast(eps, tl.float32))
        y = x * rstd[:, None]
        if HAS_WEIGHT:
            y *= tl.load(W + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(B + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        if MODULATE:
            scale = tl.load(SCALE + param, mask=mask, other=0.0).to(tl.float32)
            y = y * (1.0 + scale) + tl.load(SHIFT + param, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + rows * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)

    return fullgraph_row_norm


def launch_row_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    center: bool,
    gate: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, s): the norm of s = x (+ residual, or residual + gate · x) over the last dim, then y · (1 + scale) +
    shift where given; s is y itself when there is no residual. gate, shift and scale: one row of the last dim per
    group of x's rows (`modulate.groups`), any leading shape."""
    x2 = as_rows(x)
    r2 = as_rows(residual) if residual is not None else x2
    n_rows, n_cols = x2.shape
    # the kernel writes whole 2-D buffers, viewed as x's shape after: a write into a view would make
    # functionalization (torch.compile traces into the launcher) replay it with copies, two kernels per call
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    s = torch.empty_like(y) if residual is not None else y
    param = gate if gate is not None else shift
    n_groups, per_group = groups(x2, param) if param is not None else (1, n_rows)
    g, sh, sc = (p.reshape(n_groups, n_cols).contiguous() if p is not None else x2 for p in (gate, shift, scale))
    if n_rows:
        block_n, rows, num_warps = row_launch_config(n_cols, n_rows)
        grid = ((n_rows + rows - 1) // rows,)
        launch(_row_norm_fwd_kernel())[grid](
            x2, r2, weight if weight is not None else x2, bias if bias is not None else x2, y, s, g, sh, sc,
            n_rows, n_cols, x2.stride(0), r2.stride(0), y.stride(0), s.stride(0), max(per_group, 1), eps,
            CENTER=center, HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None,
            HAS_BIAS=bias is not None, GATE=gate is not None, MODULATE=shift is not None,
            ROWS=rows, BLOCK_N=block_n, num_warps=num_warps,
        )  # fmt: skip
    return y.view(x.shape), s.view(x.shape)


def _fake(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fake_residual(x, residual, weight, eps):
    return _fake(x, weight, eps), _fake(x, weight, eps)


@kernel_op("rms_norm", fake=_fake)
def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension. Inputs are checked by `fullgraph.ops.rms_norm`."""
    return launch_row_norm(x, weight, None, None, eps, center=False)[0]


@kernel_op("rms_norm_residual", fake=_fake_residual)
def rms_norm_residual_fwd(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual) in one pass."""
    return launch_row_norm(x, weight, None, residual, eps, center=False)
