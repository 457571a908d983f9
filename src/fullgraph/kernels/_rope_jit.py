"""The Triton code of `rope.py` (imported only when a kernel is built, so fullgraph imports without triton).

The rotary channels are held as (a, b) pair pieces: the pair indices 0 .. HALF-1 split into up to three
power-of-two pieces (`_library.row_pieces(HALF)`: 36 = 32 + 4 at head dim 72), each piece loaded as its a and b
halves together, so a pair never straddles two pieces and each rotation reads only registers of its own piece.
Rotate-half takes a piece's a channels at [OFF, OFF + P) and its b channels at HALF + [OFF, OFF + P); interleaved
takes the 2·P contiguous channels from 2·OFF and splits them in registers. Only the last piece can reach past HALF,
so only it masks columns. HEAD_DIM and HALF are constexprs: with them and ALIGN (a power of two dividing x's
strides, `tl.multiple_of`) Triton can prove rows 16-byte aligned at head dims such as 72, where a runtime head dim
that is not a multiple of 16 made every load and store one element wide.

Helpers live at module level because Triton resolves a jitted function's callees through its globals.
"""

import triton
import triton.language as tl


@triton.jit
def _pairs_in(x_row, row_ok, OFF: tl.constexpr, P: tl.constexpr, HALF: tl.constexpr, INTERLEAVED: tl.constexpr,
              ROWS: tl.constexpr):  # fmt: skip
    """A piece's (a, b) channels in float32, 0 past HALF: [ROWS, P] each."""
    if INTERLEAVED:
        # the pairs are neighbours: one contiguous (vectorizable) load, split apart in registers
        cols = 2 * OFF + tl.arange(0, 2 * P)[None, :]
        mask = row_ok & (cols < 2 * HALF) if OFF + P > HALF else row_ok
        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        xa, xb = tl.split(tl.reshape(x, (ROWS, P, 2)))
    else:
        pair = OFF + tl.arange(0, P)[None, :]
        mask = row_ok & (pair < HALF) if OFF + P > HALF else row_ok
        xa = tl.load(x_row + pair, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        xb = tl.load(x_row + HALF + pair, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    return xa, xb


@triton.jit
def _pairs_out(
    xa, xb, y_row, W, cos_row, sin_row, row_ok, rstd,
    OFF: tl.constexpr, P: tl.constexpr, HALF: tl.constexpr, INTERLEAVED: tl.constexpr, NORM: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """Scale a piece by rstd and the weight (NORM), rotate it by its cos/sin and store it."""
    pair = OFF + tl.arange(0, P)[None, :]
    mask = row_ok & (pair < HALF) if OFF + P > HALF else row_ok
    cos = tl.load(cos_row + pair, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    sin = tl.load(sin_row + pair, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if NORM:
        xa, xb = xa * rstd, xb * rstd
        if HAS_WEIGHT:
            if INTERLEAVED:
                wcols = 2 * OFF + tl.arange(0, 2 * P)
                w = tl.load(W + wcols, mask=wcols < 2 * HALF, other=0.0).to(tl.float32)
                wa, wb = tl.split(tl.reshape(w, (P, 2)))
                xa, xb = xa * wa[None, :], xb * wb[None, :]
            else:
                xa *= tl.load(W + pair, mask=pair < HALF, other=0.0).to(tl.float32)
                xb *= tl.load(W + HALF + pair, mask=pair < HALF, other=0.0).to(tl.float32)
    ya, yb = xa * cos - xb * sin, xb * cos + xa * sin
    if INTERLEAVED:
        cols = 2 * OFF + tl.arange(0, 2 * P)[None, :]
        cmask = row_ok & (cols < 2 * HALF) if OFF + P > HALF else row_ok
        y = tl.reshape(tl.join(ya, yb), (ROWS, 2 * P))
        tl.store(y_row + cols, y.to(y_row.dtype.element_ty), mask=cmask)
    else:
        tl.store(y_row + pair, ya.to(y_row.dtype.element_ty), mask=mask)
        tl.store(y_row + HALF + pair, yb.to(y_row.dtype.element_ty), mask=mask)


@triton.jit
def fullgraph_rope(
    Q, K, QW, KW, QY, KY, COS, SIN,
    q_rows, q_size1, q_size2, q_stride0, q_stride1, q_stride2,
    k_rows, k_size1, k_size2, k_stride0, k_stride1, k_stride2,
    stride_cos, stride_sin, q_eps, k_eps,
    SEQ_DIM: tl.constexpr, INTERLEAVED: tl.constexpr, NORM: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr, ALIGN: tl.constexpr, CS_ALIGN: tl.constexpr,
    P_A: tl.constexpr, P_B: tl.constexpr, P_C: tl.constexpr, BLOCK_P: tl.constexpr, TWO: tl.constexpr,
):  # fmt: skip
    # program axis 1 picks the tensor, 0 = q, 1 = k. Plain RoPE (TWO false) launches one tensor, its x as q, and its
    # code never names K, KW or KY: the launcher passes q's tensors there, and a kernel that could store through KY
    # as well as QY would, traced by torch.compile, have each output cloned apart (two clones of one tensor) and the
    # result read from the clone the kernel never wrote.
    if TWO:
        is_q = tl.program_id(1) == 0
        X, W, Y = tl.where(is_q, Q, K), tl.where(is_q, QW, KW), tl.where(is_q, QY, KY)
        n_rows, size1 = tl.where(is_q, q_rows, k_rows), tl.where(is_q, q_size1, k_size1)
        size2, eps = tl.where(is_q, q_size2, k_size2), tl.where(is_q, q_eps, k_eps)
        stride0, stride1 = tl.where(is_q, q_stride0, k_stride0), tl.where(is_q, q_stride1, k_stride1)
        stride2 = tl.where(is_q, q_stride2, k_stride2)
    else:
        X, W, Y = Q, QW, QY
        n_rows, size1, size2, eps = q_rows, q_size1, q_size2, q_eps
        stride0, stride1, stride2 = q_stride0, q_stride1, q_stride2

    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = (rows < n_rows)[:, None]
    rows = rows.to(tl.int64)
    # x's first three dims from the flat row index, so a strided x (a transposed view) needs no copy
    i2 = rows % size2
    i1 = (rows // size2) % size1
    i0 = rows // size2 // size1
    pos = i2 if SEQ_DIM == 2 else i1
    x_row = X + tl.multiple_of(i0 * stride0 + i1 * stride1 + i2 * stride2, ALIGN)[:, None]
    y_row = Y + (rows * HEAD_DIM)[:, None]
    cos_row = COS + tl.multiple_of(pos * stride_cos, CS_ALIGN)[:, None]
    sin_row = SIN + tl.multiple_of(pos * stride_sin, CS_ALIGN)[:, None]

    # masked-off lanes load 0 and add nothing to a mean square
    xa, xb = _pairs_in(x_row, row_ok, 0, P_A, HALF, INTERLEAVED, ROWS)
    if NORM:
        sum_sq = tl.sum(xa * xa + xb * xb, axis=1)
    if P_B > 0:
        xa1, xb1 = _pairs_in(x_row, row_ok, P_A, P_B, HALF, INTERLEAVED, ROWS)
        if NORM:
            sum_sq += tl.sum(xa1 * xa1 + xb1 * xb1, axis=1)
    if P_C > 0:
        xa2, xb2 = _pairs_in(x_row, row_ok, P_A + P_B, P_C, HALF, INTERLEAVED, ROWS)
        if NORM:
            sum_sq += tl.sum(xa2 * xa2 + xb2 * xb2, axis=1)
    if BLOCK_P > 0:  # channels past the rotary ones: not rotated (copied as they are, or normalized)
        pcols = 2 * HALF + tl.arange(0, BLOCK_P)[None, :]
        pmask = row_ok & (pcols < HEAD_DIM)
        xp = tl.load(x_row + pcols, mask=pmask, other=0.0, eviction_policy="evict_first")
        if NORM:
            xp = xp.to(tl.float32)
            sum_sq += tl.sum(xp * xp, axis=1)
    rstd = 1.0
    if NORM:
        # over all HEAD_DIM channels; eps arrives as fp32 from a direct launch but fp64 from Inductor's wrapper
        rstd = tl.rsqrt(sum_sq / HEAD_DIM + tl.cast(eps, tl.float32))[:, None]
    _pairs_out(xa, xb, y_row, W, cos_row, sin_row, row_ok, rstd, 0, P_A, HALF, INTERLEAVED, NORM, HAS_WEIGHT, ROWS)
    if P_B > 0:
        _pairs_out(xa1, xb1, y_row, W, cos_row, sin_row, row_ok, rstd, P_A, P_B, HALF, INTERLEAVED, NORM,
                   HAS_WEIGHT, ROWS)  # fmt: skip
    if P_C > 0:
        _pairs_out(xa2, xb2, y_row, W, cos_row, sin_row, row_ok, rstd, P_A + P_B, P_C, HALF, INTERLEAVED, NORM,
                   HAS_WEIGHT, ROWS)  # fmt: skip
    if BLOCK_P > 0:
        if NORM:
            xp = xp * rstd
            if HAS_WEIGHT:
                xp *= tl.load(W + pcols, mask=pcols < HEAD_DIM, other=0.0).to(tl.float32)
        tl.store(y_row + pcols, xp.to(Y.dtype.element_ty), mask=pmask)
