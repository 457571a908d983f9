"""The Triton code of the row norms in `rms_norm.py` (imported only when a kernel is built, so fullgraph imports
without triton).

A row of N_COLS elements is held as up to three power-of-two pieces (`_library.row_pieces`: 72 = 64 + 8, 1152 =
1024 + 128), each a [ROWS, BLOCK] tensor at its own column offset: every lane holds an element, where one block of
next_power_of_2(N_COLS) columns left up to half of them idle. Only the last piece can reach past the row, so only it
masks columns. The row statistics are sums over the pieces; the pieces' reductions meet in one layout (a few floats
per row through shared memory), which is cheap next to the row itself.

Helpers live at module level because Triton resolves a jitted function's callees through its globals.
"""

import triton
import triton.language as tl


@triton.jit
def _piece_in(
    X, R, S, G, X2, G2, rows, row_ok, group_row, stride_x, stride_r, stride_s, stride_x2,
    N_COLS: tl.constexpr, ALIGN: tl.constexpr, OFF: tl.constexpr, BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, GATE: tl.constexpr, GATE2: tl.constexpr, STORE_S: tl.constexpr,
):  # fmt: skip
    """One piece of the rows, float32, 0 past the row: x, or s = x + residual (residual + gate · x, and + gate2 · x2
    with a second branch), stored to S unless the caller needs only y (STORE_S false)."""
    cols = OFF + tl.arange(0, BLOCK)[None, :]
    mask = row_ok & (cols < N_COLS) if OFF + BLOCK > N_COLS else row_ok
    x = tl.load(X + tl.multiple_of(rows * stride_x, ALIGN)[:, None] + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(R + tl.multiple_of(rows * stride_r, ALIGN)[:, None] + cols, mask=mask, other=0.0)
        if GATE:  # noqa: SIM108 (a constexpr branch: the other load is never built)
            x = r.to(tl.float32) + tl.load(G + group_row + cols, mask=mask, other=0.0).to(tl.float32) * x
        else:
            x = x + r
        if GATE2:  # both branches of a DiT block in one sum: one rounding of the stream a block, as Inductor's fusion
            x2 = tl.load(X2 + tl.multiple_of(rows * stride_x2, ALIGN)[:, None] + cols, mask=mask, other=0.0)
            x += tl.load(G2 + group_row + cols, mask=mask, other=0.0).to(tl.float32) * x2.to(tl.float32)
        # s is stored rounded to its dtype, and y is the norm of the float32 sum, as Inductor's fusion of the native
        # ops computes it: normalising the rounded s added its rounding to y's error, and the DiT's output error
        # grew 1.06-1.19x over all native with this kernel alone (H100 sweep, 2026-12-06)
        if STORE_S:
            tl.store(S + tl.multiple_of(rows * stride_s, ALIGN)[:, None] + cols, x.to(S.dtype.element_ty), mask=mask)
    return x


@triton.jit
def _piece_out(
    x, Y, W, B, SHIFT, SCALE, rows, row_ok, group_row, stride_y, mean, rstd,
    N_COLS: tl.constexpr, ALIGN: tl.constexpr, OFF: tl.constexpr, BLOCK: tl.constexpr, CENTER: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, MODULATE: tl.constexpr,
):  # fmt: skip
    """Normalize one piece ((x - mean) · rstd), then weight, bias and modulation, and store it to Y."""
    cols = OFF + tl.arange(0, BLOCK)[None, :]
    col_ok = cols < N_COLS
    mask = row_ok & col_ok if OFF + BLOCK > N_COLS else row_ok
    if CENTER:
        x = x - mean
    y = x * rstd
    if HAS_WEIGHT:
        y *= tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y += tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)
    if MODULATE:
        scale = tl.load(SCALE + group_row + cols, mask=mask, other=0.0).to(tl.float32)
        y = y * (1.0 + scale) + tl.load(SHIFT + group_row + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + tl.multiple_of(rows * stride_y, ALIGN)[:, None] + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _square_sum(x, mean, OFF: tl.constexpr, BLOCK: tl.constexpr, N_COLS: tl.constexpr, CENTER: tl.constexpr):
    """Σ (x - mean)² over one piece's columns inside the row (x is 0 past the row, x - mean is not)."""
    if CENTER:
        x = x - mean
        if OFF + BLOCK > N_COLS:
            x = tl.where(OFF + tl.arange(0, BLOCK)[None, :] < N_COLS, x, 0.0)
    return tl.sum(x * x, axis=1)


@triton.jit
def fullgraph_row_norm(
    X, R, W, B, Y, S, G, SHIFT, SCALE, X2, G2,
    n_rows, stride_x, stride_r, stride_y, stride_s, stride_x2, stride_p, rows_per_group, eps,
    CENTER: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    GATE: tl.constexpr, GATE2: tl.constexpr, STORE_S: tl.constexpr, MODULATE: tl.constexpr, ROWS: tl.constexpr,
    N_COLS: tl.constexpr, ALIGN: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = (rows < n_rows)[:, None]
    rows = rows.to(tl.int64)  # 1-D: each row's offset is stated a multiple of ALIGN before it meets the columns
    # the parameter row of each row's group (gate, shift, scale: [groups, N_COLS] rows stride_p apart, unit columns)
    group_row = ((rows // rows_per_group) * stride_p)[:, None]
    a = _piece_in(X, R, S, G, X2, G2, rows, row_ok, group_row, stride_x, stride_r, stride_s, stride_x2, N_COLS, ALIGN,
                  0, BLOCK_A, HAS_RESIDUAL, GATE, GATE2, STORE_S)  # fmt: skip
    total = tl.sum(a, axis=1)
    if BLOCK_B > 0:
        b = _piece_in(X, R, S, G, X2, G2, rows, row_ok, group_row, stride_x, stride_r, stride_s, stride_x2, N_COLS,
                      ALIGN, BLOCK_A, BLOCK_B, HAS_RESIDUAL, GATE, GATE2, STORE_S)  # fmt: skip
        total += tl.sum(b, axis=1)
    if BLOCK_C > 0:
        c = _piece_in(X, R, S, G, X2, G2, rows, row_ok, group_row, stride_x, stride_r, stride_s, stride_x2, N_COLS,
                      ALIGN, BLOCK_A + BLOCK_B, BLOCK_C, HAS_RESIDUAL, GATE, GATE2, STORE_S)  # fmt: skip
        total += tl.sum(c, axis=1)
    # LayerNorm: the biased variance is the mean square of the centered row; RMSNorm: mean 0
    mean = (total / N_COLS)[:, None] if CENTER else 0.0
    sum_sq = _square_sum(a, mean, 0, BLOCK_A, N_COLS, CENTER)
    if BLOCK_B > 0:
        sum_sq += _square_sum(b, mean, BLOCK_A, BLOCK_B, N_COLS, CENTER)
    if BLOCK_C > 0:
        sum_sq += _square_sum(c, mean, BLOCK_A + BLOCK_B, BLOCK_C, N_COLS, CENTER)
    # eps arrives as fp32 from a direct launch but fp64 from Inductor's wrapper; fp32 either way
    rstd = tl.rsqrt(sum_sq / N_COLS + tl.cast(eps, tl.float32))[:, None]
    _piece_out(a, Y, W, B, SHIFT, SCALE, rows, row_ok, group_row, stride_y, mean, rstd, N_COLS, ALIGN, 0, BLOCK_A,
               CENTER, HAS_WEIGHT, HAS_BIAS, MODULATE)  # fmt: skip
    if BLOCK_B > 0:
        _piece_out(b, Y, W, B, SHIFT, SCALE, rows, row_ok, group_row, stride_y, mean, rstd, N_COLS, ALIGN, BLOCK_A,
                   BLOCK_B, CENTER, HAS_WEIGHT, HAS_BIAS, MODULATE)  # fmt: skip
    if BLOCK_C > 0:
        _piece_out(c, Y, W, B, SHIFT, SCALE, rows, row_ok, group_row, stride_y, mean, rstd, N_COLS, ALIGN,
                   BLOCK_A + BLOCK_B, BLOCK_C, CENTER, HAS_WEIGHT, HAS_BIAS, MODULATE)  # fmt: skip
