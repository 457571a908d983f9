"""The Triton code of `skinny_linear.py`'s GEMV (a linear layer of at most MAX_ROWS rows).

In a module of its own, at module level: imported only when the kernel is built (fullgraph imports without
triton), and found by its module and name, as torch finds a user kernel when it loads a precompiled model
(`torch.compiler.load_compiled_function` imports `fn.__module__` and reads `fn.__name__`)."""

import triton
import triton.language as tl


@triton.jit
def fullgraph_skinny_gemv(X, W, B, Y, M, N, K, stride_xm, stride_wn, HAS_BIAS: tl.constexpr, M_BLOCK: tl.constexpr,
           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, M_BLOCK)
    acc = tl.zeros([M_BLOCK, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(W + rn[:, None] * stride_wn + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K),
                    other=0.0)  # fmt: skip
        x = tl.load(X + rm[:, None] * stride_xm + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K),
                    other=0.0)  # fmt: skip
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    y = tl.sum(acc, axis=2)  # [M_BLOCK, BLOCK_N]
    if HAS_BIAS:
        y += tl.load(B + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    out_mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(Y + rm[:, None] * N + rn[None, :], y.to(Y.dtype.element_ty), mask=out_mask)
