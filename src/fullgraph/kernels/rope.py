"""Rotary position embedding (RoPE) on the first rotary_dim channels of each head; the rest pass through.

For position n and pair index i < h = rotary_dim / 2, with (a, b) the pair's two channels:

    out_a = x_a · cos[n, i] − x_b · sin[n, i]
    out_b = x_b · cos[n, i] + x_a · sin[n, i]

    rotate-half (GPT-NeoX, interleaved=False):  (a, b) = (i, i + h)
    interleaved (GPT-J,    interleaved=True):   (a, b) = (2i, 2i + 1)

x is [B, H, N, D] (seq_dim 2) or [B, N, H, D] (seq_dim 1) with any strides (only a channel stride other than 1
costs a copy first); a row is one head vector of D channels. Memory traffic per row: read x, write out, so
2·D·bytes; the cos/sin rows (rotary_dim·4 bytes for float32 tables) are shared by every (batch, head) at a
position and come from L2. Math is in float32 whatever the dtypes; out has x's dtype and is contiguous.
"""

from __future__ import annotations

import functools

import torch

from fullgraph.kernels._library import kernel_op, launch, require_triton, row_launch_config


@functools.cache
def _rope_fwd_kernel():
    triton, tl = require_triton()

    @triton.jit
    def kernel(
        X, COS, SIN, Y,
        n_rows, size1, size2, stride_x0, stride_x1, stride_x2, stride_cos, stride_sin, head_dim, half,
        SEQ_DIM: tl.constexpr, INTERLEAVED: tl.constexpr,
        ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        row_ok = rows < n_rows
        rows = rows.to(tl.int64)
        # x's first three dims from the flat row index, so a strided x (a transposed view) needs no copy
        i2 = rows % size2
        i1 = (rows // size2) % size1
        i0 = rows // size2 // size1
        pos = i2 if SEQ_DIM == 2 else i1
        x_row = (X + i0 * stride_x0 + i1 * stride_x1 + i2 * stride_x2)[:, None]
        y_row = (Y + rows * head_dim)[:, None]
        row_ok = row_ok[:, None]

        pair = tl.arange(0, BLOCK_H)[None, :]
        cs_mask = row_ok & (pair < half)
        cos = tl.load(COS + pos[:, None] * stride_cos + pair, mask=cs_mask, other=0.0, eviction_policy="evict_last")
        sin = tl.load(SIN + pos[:, None] * stride_sin + pair, mask=cs_mask, other=0.0, eviction_policy="evict_last")
        cos, sin = cos.to(tl.float32), sin.to(tl.float32)
        if INTERLEAVED:
            # the pairs are neighbours: load the rotary channels as one contiguous (vectorizable) block and
            # split the pairs apart in registers
            cols = tl.arange(0, 2 * BLOCK_H)[None, :]
            mask = row_ok & (cols < 2 * half)
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            xa, xb = tl.split(tl.reshape(x, (ROWS, BLOCK_H, 2)))
            y = tl.join(xa * cos - xb * sin, xb * cos + xa * sin)
            tl.store(y_row + cols, tl.reshape(y, (ROWS, 2 * BLOCK_H)).to(Y.dtype.element_ty), mask=mask)
        else:
            xa = tl.load(x_row + pair, mask=cs_mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            xb = tl.load(x_row + half + pair, mask=cs_mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            tl.store(y_row + pair, (xa * cos - xb * sin).to(Y.dtype.element_ty), mask=cs_mask)
            tl.store(y_row + half + pair, (xb * cos + xa * sin).to(Y.dtype.element_ty), mask=cs_mask)
        if BLOCK_P > 0:
            cols = 2 * half + tl.arange(0, BLOCK_P)[None, :]
            mask = row_ok & (cols < head_dim)
            tl.store(y_row + cols, tl.load(x_row + cols, mask=mask, eviction_policy="evict_first"), mask=mask)

    return kernel


def _fake(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, seq_dim: int) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@kernel_op("rope", fake=_fake)
def rope_fwd(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, seq_dim: int) -> torch.Tensor:
    """RoPE on x [B, H, N, D] (seq_dim 2) or [B, N, H, D] (seq_dim 1) with cos/sin [N, rotary_dim / 2].

    Inputs are checked by `fullgraph.ops.rope.apply_rope`.
    """
    triton, _ = require_triton()
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    size0, size1, size2, head_dim = x.shape
    half = cos.shape[-1]
    n_rows = size0 * size1 * size2
    if n_rows:
        _, rows, num_warps = row_launch_config(head_dim, n_rows)
        block_p = triton.next_power_of_2(head_dim - 2 * half) if head_dim > 2 * half else 0
        launch(_rope_fwd_kernel())[((n_rows + rows - 1) // rows,)](
            x, cos, sin, out,
            n_rows, size1, size2, x.stride(0), x.stride(1), x.stride(2), cos.stride(0), sin.stride(0), head_dim, half,
            SEQ_DIM=seq_dim, INTERLEAVED=interleaved,
            ROWS=rows, BLOCK_H=triton.next_power_of_2(half), BLOCK_P=block_p, num_warps=num_warps,
        )  # fmt: skip
    return out
