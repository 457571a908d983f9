"""DiT adaLN modulation: the shift/scale before attention or MLP, and the gated residual after it.

    modulate:        y = x * (1 + scale) + shift
    gated_residual:  y = x + gate * h

x is viewed as [G, R, C] rows; shift, scale and gate as [G, C], one parameter row per group of R rows
(per batch element, or per frame of a video). Memory traffic per element: read x (and h), write y, so
2·bytes (3·bytes for gated_residual); the parameter rows are tiny next to x and come from L2. Math is in
float32 whatever the input dtypes; y has x's dtype. Each program covers BLOCK consecutive elements, so no width or
head dim pads anything: every lane holds an element but in the last program (100% at 1152, 1280, 1408, any width).
"""

from __future__ import annotations

import functools
import math

import torch

from fullgraph.kernels._library import kernel_op, launch, require_triton


def groups(x: torch.Tensor, param: torch.Tensor) -> tuple[int, int]:
    """(G, R): x as [G, R, C] rows takes its parameters from `param` as [G, C], row r from row r // R."""
    n_groups = math.prod(param.shape[:-1])
    n_rows = math.prod(x.shape[:-1])
    return n_groups, n_rows // n_groups if n_groups else 0


# Elements per program. Both ops are pure streaming with a broadcast, so they run as flat 1-D kernels (the
# shape Inductor gives such ops): on an H200, [ROWS, BLOCK_N] row tiles reached 90% of copy bandwidth at
# 16384x4096 bf16 where Inductor's flat kernels reached 96-100% (docs/ops-benchmark.md).
BLOCK = 1024
NUM_WARPS = 4


def param_rows(n_groups: int, n_cols: int, params: tuple, filler: torch.Tensor) -> tuple[tuple, int]:
    """The per-group parameters (gate, shift, scale: any leading shape) as [n_groups, n_cols] rows sharing one row
    stride, and that stride (the row norms' kernel and the modulation's). Views with unit column stride and one row
    stride (a DiT's adaLN chunks: rows 6·C apart) are read where they lie; anything else is copied contiguous. A
    copy is a kernel launch of its own: inside a compiled DiT the copies of the chunks were 20 of the norm kernel
    variant's 79 launches a call (4 blocks, H100, 2026-12-06), which a host-bound call in default mode pays in host
    time. `filler` stands in for a parameter not given."""
    rows = [p.reshape(n_groups, n_cols) if p is not None else None for p in params]
    given = [r for r in rows if r is not None]
    # strides read only as plain ints: a symbolic one (a dynamic dim, traced) takes the copy rather than a guard
    known = all(type(r.stride(0)) is int and type(r.stride(1)) is int for r in given)
    row_strides = {r.stride(0) for r in given} if known else set()
    if not given or len(row_strides) != 1 or any(r.stride(1) != 1 for r in given):
        return tuple(r.contiguous() if r is not None else filler for r in rows), n_cols
    return tuple(r if r is not None else filler for r in rows), row_strides.pop()


@functools.cache
def _modulation_fwd_kernel():
    require_triton()
    from fullgraph.kernels._modulate_jit import fullgraph_modulation

    return fullgraph_modulation


def _launch(x: torch.Tensor, a: torch.Tensor, param: torch.Tensor, gated: bool) -> torch.Tensor:
    """The kernel over x's elements: `param` has one row per group; `a` is x-shaped if `gated`, else one too."""
    x = x.contiguous()  # flat indexing: copies only odd strides
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    numel = out.numel()
    if numel:
        n_groups, rows_per_group = groups(x, param)
        n_cols = x.shape[-1]
        if gated:  # a is x-shaped, read flat
            (param,), stride_p = param_rows(n_groups, n_cols, (param,), x)
            a = a.contiguous()
        else:  # shift, a parameter row per group as scale is
            (param, a), stride_p = param_rows(n_groups, n_cols, (param, a), x)
        launch(_modulation_fwd_kernel())[((numel + BLOCK - 1) // BLOCK,)](
            x, a, param, out, numel, n_cols, rows_per_group * n_cols, stride_p,
            GATED=gated, BLOCK=BLOCK, WIDE=numel + BLOCK >= 2**31, num_warps=NUM_WARPS,
        )  # fmt: skip
    return out


def _fake(x: torch.Tensor, *others: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@kernel_op("modulate", fake=_fake)
def modulate_fwd(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`x * (1 + scale) + shift`. Inputs are checked by `fullgraph.ops.modulation.modulate`."""
    return _launch(x, shift, scale, gated=False)


@kernel_op("gated_residual", fake=_fake)
def gated_residual_fwd(x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """`x + gate * h`. Inputs are checked by `fullgraph.ops.modulation.gated_residual`."""
    return _launch(x, h, gate, gated=True)
