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

`qk_norm_rope_fwd` is the same kernel with NORM: between a QKV projection and attention, each head vector of q and
of k is RMSNorm-ed over all D channels (its own weight for q and for k) and then rotated, in one pass: read, mean
square in float32, scale by rstd and the weight, rotate, write once. Unfused that is four passes over q and k (each
norm and each rotation reads and writes); Inductor fuses the native forms into one reduction kernel of its own. One
launch serves both tensors (program axis 1: 0 = q, 1 = k); v is not touched (attention reads it as a view).
"""

from __future__ import annotations

import functools

import torch

from fullgraph.kernels._library import kernel_op, launch, require_triton, row_launch_config


@functools.cache
def _rope_fwd_kernel():
    triton, tl = require_triton()

    @triton.jit
    def fullgraph_rope(
        Q, K, QW, KW, QY, KY, COS, SIN,
        q_rows, q_size1, q_size2, q_stride0, q_stride1, q_stride2,
        k_rows, k_size1, k_size2, k_stride0, k_stride1, k_stride2,
        stride_cos, stride_sin, head_dim, half, q_eps, k_eps,
        SEQ_DIM: tl.constexpr, INTERLEAVED: tl.constexpr, NORM: tl.constexpr, HAS_WEIGHT: tl.constexpr,
        ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr,
    ):  # fmt: skip
        # program axis 1 picks the tensor, 0 = q, 1 = k (plain RoPE launches axis 1 of size 1, its x as q)
        is_q = tl.program_id(1) == 0
        X, W, Y = tl.where(is_q, Q, K), tl.where(is_q, QW, KW), tl.where(is_q, QY, KY)
        n_rows, size1 = tl.where(is_q, q_rows, k_rows), tl.where(is_q, q_size1, k_size1)
        size2, eps = tl.where(is_q, q_size2, k_size2), tl.where(is_q, q_eps, k_eps)
        stride0, stride1 = tl.where(is_q, q_stride0, k_stride0), tl.where(is_q, q_stride1, k_stride1)
        stride2 = tl.where(is_q, q_stride2, k_stride2)

        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        row_ok = rows < n_rows
        rows = rows.to(tl.int64)
        # x's first three dims from the flat row index, so a strided x (a transposed view) needs no copy
        i2 = rows % size2
        i1 = (rows // size2) % size1
        i0 = rows // size2 // size1
        pos = i2 if SEQ_DIM == 2 else i1
        x_row = (X + i0 * stride0 + i1 * stride1 + i2 * stride2)[:, None]
        y_row = (Y + rows * head_dim)[:, None]
        row_ok = row_ok[:, None]

        pair = tl.arange(0, BLOCK_H)[None, :]
        cs_mask = row_ok & (pair < half)
        cos = tl.load(COS + pos[:, None] * stride_cos + pair, mask=cs_mask, other=0.0, eviction_policy="evict_last")
        sin = tl.load(SIN + pos[:, None] * stride_sin + pair, mask=cs_mask, other=0.0, eviction_policy="evict_last")
        cos, sin = cos.to(tl.float32), sin.to(tl.float32)
        # the rotary channels as (a, b) pairs; masked-off lanes load 0 and add nothing to a mean square
        if INTERLEAVED:
            # the pairs are neighbours: load the rotary channels as one contiguous (vectorizable) block and
            # split the pairs apart in registers
            cols = tl.arange(0, 2 * BLOCK_H)[None, :]
            mask = row_ok & (cols < 2 * half)
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            if NORM:
                sum_sq = tl.sum(x * x, axis=1)
        else:
            xa = tl.load(x_row + pair, mask=cs_mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            xb = tl.load(x_row + half + pair, mask=cs_mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            if NORM:
                sum_sq = tl.sum(xa * xa, axis=1) + tl.sum(xb * xb, axis=1)
        if BLOCK_P > 0:  # channels past rotary_dim: not rotated (copied as they are, or normalized)
            pcols = 2 * half + tl.arange(0, BLOCK_P)[None, :]
            pmask = row_ok & (pcols < head_dim)
            xp = tl.load(x_row + pcols, mask=pmask, other=0.0, eviction_policy="evict_first")
            if NORM:
                xp = xp.to(tl.float32)
                sum_sq += tl.sum(xp * xp, axis=1)
        if NORM:
            # over all D channels; eps arrives as fp32 from a direct launch but fp64 from Inductor's wrapper
            rstd = tl.rsqrt(sum_sq / head_dim + tl.cast(eps, tl.float32))[:, None]
            if INTERLEAVED:
                x = x * rstd
                if HAS_WEIGHT:
                    x *= tl.load(W + cols, mask=cols < 2 * half, other=0.0).to(tl.float32)
            else:
                xa, xb = xa * rstd, xb * rstd
                if HAS_WEIGHT:
                    xa *= tl.load(W + pair, mask=pair < half, other=0.0).to(tl.float32)
                    xb *= tl.load(W + half + pair, mask=pair < half, other=0.0).to(tl.float32)
            if BLOCK_P > 0:
                xp = xp * rstd
                if HAS_WEIGHT:
                    xp *= tl.load(W + pcols, mask=pcols < head_dim, other=0.0).to(tl.float32)
        if INTERLEAVED:
            xa, xb = tl.split(tl.reshape(x, (ROWS, BLOCK_H, 2)))
            y = tl.join(xa * cos - xb * sin, xb * cos + xa * sin)
            tl.store(y_row + cols, tl.reshape(y, (ROWS, 2 * BLOCK_H)).to(Y.dtype.element_ty), mask=mask)
        else:
            tl.store(y_row + pair, (xa * cos - xb * sin).to(Y.dtype.element_ty), mask=cs_mask)
            tl.store(y_row + half + pair, (xb * cos + xa * sin).to(Y.dtype.element_ty), mask=cs_mask)
        if BLOCK_P > 0:
            tl.store(y_row + pcols, xp.to(Y.dtype.element_ty), mask=pmask)

    return fullgraph_rope


def _launch(q, k, q_weight, k_weight, cos, sin, q_eps, k_eps, interleaved, seq_dim, norm: bool):
    """The kernel over q (and k, where given: k None launches one tensor); returns the outputs, contiguous."""
    triton, _ = require_triton()
    tensors = (q,) if k is None else (q, k)
    tensors = tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors)
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    outs = tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors)
    head_dim, half = q.shape[-1], cos.shape[-1]
    n_rows = [t.shape[0] * t.shape[1] * t.shape[2] for t in tensors]
    if max(n_rows):
        _, rows, num_warps = row_launch_config(head_dim, max(n_rows))
        block_p = triton.next_power_of_2(head_dim - 2 * half) if head_dim > 2 * half else 0
        has_weight = q_weight is not None
        qt, kt = tensors[0], tensors[-1]  # one tensor: it stands in for k too, and axis 1 never reaches k
        per_tensor = []
        for t, n in ((qt, n_rows[0]), (kt, n_rows[-1])):
            per_tensor += [n, t.shape[1], t.shape[2], *t.stride()[:3]]
        launch(_rope_fwd_kernel())[((max(n_rows) + rows - 1) // rows, len(tensors))](
            qt, kt, q_weight if has_weight else qt, k_weight if has_weight else kt, outs[0], outs[-1], cos, sin,
            *per_tensor, cos.stride(0), sin.stride(0), head_dim, half, q_eps, k_eps,
            SEQ_DIM=seq_dim, INTERLEAVED=interleaved, NORM=norm, HAS_WEIGHT=has_weight,
            ROWS=rows, BLOCK_H=triton.next_power_of_2(half), BLOCK_P=block_p, num_warps=num_warps,
        )  # fmt: skip
    return outs


def _fake(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, seq_dim: int) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@kernel_op("rope", fake=_fake)
def rope_fwd(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, seq_dim: int) -> torch.Tensor:
    """RoPE on x [B, H, N, D] (seq_dim 2) or [B, N, H, D] (seq_dim 1) with cos/sin [N, rotary_dim / 2].

    Inputs are checked by `fullgraph.ops.rope.apply_rope`.
    """
    return _launch(x, None, None, None, cos, sin, 0.0, 0.0, interleaved, seq_dim, norm=False)[0]


def _qk_fake(q, k, q_weight, k_weight, cos, sin, q_eps, k_eps, interleaved, seq_dim):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype, device=k.device)


@kernel_op("qk_norm_rope", fake=_qk_fake)
def qk_norm_rope_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_eps: float,
    k_eps: float,
    interleaved: bool,
    seq_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RoPE(RMSNorm(q) * q_weight), RoPE(RMSNorm(k) * k_weight)) over the head dim, in one launch.

    q [B, Hq, N, D] and k [B, Hk, N, D] (seq_dim 2), or [B, N, Hq, D] and [B, N, Hk, D] (seq_dim 1), any strides
    with a unit channel stride (else copied first); the weights [D] (both given or neither); cos/sin [N, rotary_dim
    / 2]. Outputs are contiguous in the inputs' dtypes. Inputs are checked by `fullgraph.ops.rope.qk_norm_rope`.
    """
    return _launch(q, k, q_weight, k_weight, cos, sin, q_eps, k_eps, interleaved, seq_dim, norm=True)
