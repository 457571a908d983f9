"""RMSNorm, optionally fused with the residual add before it.

    s = x + residual                      (when a residual is given; s is returned too, rounded to its dtype)
    y = s / sqrt(mean(s²) + eps) * w      (of the float32 sum, as Inductor's fusion of the unfused ops computes it)

Memory traffic per row of C elements: read x (and residual), write y (and s), read w once per program;
so 2·C·bytes (4·C·bytes fused). Accumulation is in float32 whatever the input dtype.

Rows are held as up to three power-of-two pieces (`_row_norm_jit.py`), not one block of next_power_of_2(C), and the
width and a power of two dividing the row strides are constexprs, so rows that are not 16 elements long still load
and store 16 bytes at a time. Lanes holding an element of the row (ROWS x pieces, num_warps from
`row_launch_config`), one block before, the pieces now; the bytes moved are the same either way (masked lanes move
nothing), the gain is in lanes, registers and instructions per byte:

    C         64    72    80    88    96   112   128   1152  1280  1408  3072
    before  100%   56%   62%   69%   75%   88%  100%    56%   62%   69%   75%
    after   100%  100%  100%  100%  100%  100%  100%   100%  100%  100%  100%

The Hopper build (sm_90 PTX, bf16, runtime argument specialization) at C = 72: 590 instructions with 17 one-element
loads and 16 one-element stores per thread before; 162 now, the 64-wide piece in 16-byte vectors and the 8-wide piece
one element per thread.

The kernel is LayerNorm's too (`layer_norm.py`): with CENTER it normalizes the row minus its mean, and
HAS_BIAS adds b after the weight. And it is the DiT's LayerNorm + adaLN modulation (`layer_norm_modulate_fwd`
below): with GATE the residual is gated (s = residual + gate · x, the gate one row per group of rows, as
modulation's parameters are), and with MODULATE the normalized row becomes y · (1 + scale) + shift, so a block's
gated residual, LayerNorm and modulation are one pass: read x and the residual, write s and y. With GATE2 a second
gated branch joins the sum (s = residual + gate · x + gate2 · x2): a DiT block's two branches added to its input in
one float32 sum, so the stream is rounded once a block, as Inductor's fusion of the native ops rounds it.
"""

from __future__ import annotations

import functools

import torch

from fullgraph.kernels._library import alignment, as_rows, kernel_op, launch, require_triton, row_launch_config
from fullgraph.kernels.modulate import groups, param_rows


@functools.cache
def _row_norm_fwd_kernel():
    require_triton()
    from fullgraph.kernels._row_norm_jit import fullgraph_row_norm

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
    branch: torch.Tensor | None = None,
    gate2: torch.Tensor | None = None,
    keep_sum: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, s): the norm of s = x (+ residual, or residual + gate · x, + gate2 · branch with a second branch) over
    the last dim, then y · (1 + scale) + shift where given; s is y itself when there is no residual. gate, gate2,
    shift and scale: one row of the last dim per group of x's rows (`modulate.groups`), any leading shape. With
    `keep_sum=False` s is not written (only y is wanted) and y is returned in its place."""
    x2 = as_rows(x)
    r2 = as_rows(residual) if residual is not None else x2
    b2 = as_rows(branch) if branch is not None else x2
    n_rows, n_cols = x2.shape
    # the kernel writes whole 2-D buffers, viewed as x's shape after: a write into a view would make
    # functionalization (torch.compile traces into the launcher) replay it with copies, two kernels per call
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    store_s = residual is not None and keep_sum
    s = torch.empty_like(y) if store_s else y
    param = gate if gate is not None else shift
    n_groups, per_group = groups(x2, param) if param is not None else (1, n_rows)
    (g, g2, sh, sc), stride_p = param_rows(n_groups, n_cols, (gate, gate2, shift, scale), x2)
    if n_rows:
        (block_a, block_b, block_c), rows, num_warps = row_launch_config(n_cols, n_rows)
        grid = ((n_rows + rows - 1) // rows,)
        strides = (x2.stride(0), r2.stride(0), y.stride(0), s.stride(0), b2.stride(0))
        launch(_row_norm_fwd_kernel())[grid](
            x2, r2, weight if weight is not None else x2, bias if bias is not None else x2, y, s, g, sh, sc, b2, g2,
            n_rows, *strides, stride_p, max(per_group, 1), eps,
            CENTER=center, HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None,
            HAS_BIAS=bias is not None, GATE=gate is not None, GATE2=branch is not None, STORE_S=store_s,
            MODULATE=shift is not None,
            ROWS=rows, N_COLS=n_cols, ALIGN=alignment(*strides), BLOCK_A=block_a, BLOCK_B=block_b, BLOCK_C=block_c,
            num_warps=num_warps,
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
