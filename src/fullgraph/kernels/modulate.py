"""DiT adaLN modulation: the shift/scale before attention or MLP, and the gated residual after it.

    modulate:        y = x * (1 + scale) + shift
    gated_residual:  y = x + gate * h

x is viewed as [G, R, C] rows; shift, scale and gate as [G, C], one parameter row per group of R rows
(per batch element, or per frame of a video). Memory traffic per row of C elements: read x (and h),
write y, so 2·C·bytes (3·C·bytes for gated_residual); the parameter rows are tiny next to x and are read
from L2 once per row. Math is in float32 whatever the input dtypes; y has x's dtype. Programs cover
[ROWS, BLOCK_N] tiles, long rows split over several programs.
"""

from __future__ import annotations

import functools
import math

import torch

from fullgraph.kernels._library import as_rows, kernel_op, launch, require_triton, row_launch_config


def groups(x: torch.Tensor, param: torch.Tensor) -> tuple[int, int]:
    """(G, R): x as [G, R, C] rows takes its parameters from `param` as [G, C], row r from row r // R."""
    n_groups = math.prod(param.shape[:-1])
    n_rows = math.prod(x.shape[:-1])
    return n_groups, n_rows // n_groups if n_groups else 0


# Columns per tile. An elementwise op needs no whole row in registers, so long rows are split across programs
# rather than given more warps: on an H200, C=16384 bf16 as whole rows (16 warps) ran at 85% of copy bandwidth,
# as 4096-column tiles at 93%. Rows up to this width keep row_launch_config's packing of short rows.
MAX_TILE_COLS = 4096


@functools.cache
def _modulate_fwd_kernel():
    triton, tl = require_triton()

    @triton.jit
    def kernel(
        X, SHIFT, SCALE, Y,
        n_rows, n_cols, rows_per_group, stride_x, stride_shift, stride_scale, stride_y,
        ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        mask = (rows < n_rows) & (cols < n_cols)
        rows = rows.to(tl.int64)
        group = rows // rows_per_group
        # x is streamed once; the parameter rows are reused by every row of their group, so keep them in L2
        x = tl.load(X + rows * stride_x + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        shift = tl.load(SHIFT + group * stride_shift + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        scale = tl.load(SCALE + group * stride_scale + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        y = x.to(tl.float32) * (1.0 + scale.to(tl.float32)) + shift.to(tl.float32)
        tl.store(Y + rows * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)

    return kernel


@functools.cache
def _gated_residual_fwd_kernel():
    triton, tl = require_triton()

    @triton.jit
    def kernel(
        X, H, GATE, Y,
        n_rows, n_cols, rows_per_group, stride_x, stride_h, stride_gate, stride_y,
        ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        mask = (rows < n_rows) & (cols < n_cols)
        rows = rows.to(tl.int64)
        group = rows // rows_per_group
        x = tl.load(X + rows * stride_x + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        h = tl.load(H + rows * stride_h + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        gate = tl.load(GATE + group * stride_gate + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        y = x.to(tl.float32) + gate.to(tl.float32) * h.to(tl.float32)
        tl.store(Y + rows * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)

    return kernel


def _launch(kernel, x: torch.Tensor, a: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`kernel(X, A, P, Y, ...)` over x's rows: `param` has one row per group; `a` is x-shaped or one too."""
    x2, a2, p2 = as_rows(x), as_rows(a), as_rows(param)
    n_rows, n_cols = x2.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y = out.view(-1, n_cols)
    if out.numel():
        _, rows_per_group = groups(x, param)
        block_n, rows, num_warps = row_launch_config(min(n_cols, MAX_TILE_COLS), n_rows)
        grid = ((n_rows + rows - 1) // rows, (n_cols + block_n - 1) // block_n)
        launch(kernel)[grid](
            x2, a2, p2, y,
            n_rows, n_cols, rows_per_group, x2.stride(0), a2.stride(0), p2.stride(0), y.stride(0),
            ROWS=rows, BLOCK_N=block_n, num_warps=num_warps,
        )  # fmt: skip
    return out


def _fake(x: torch.Tensor, *others: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@kernel_op("modulate", fake=_fake)
def modulate_fwd(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`x * (1 + scale) + shift`. Inputs are checked by `fullgraph.ops.modulation.modulate`."""
    return _launch(_modulate_fwd_kernel(), x, shift, scale)


@kernel_op("gated_residual", fake=_fake)
def gated_residual_fwd(x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """`x + gate * h`. Inputs are checked by `fullgraph.ops.modulation.gated_residual`."""
    return _launch(_gated_residual_fwd_kernel(), x, h, gate)
