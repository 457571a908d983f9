"""The Triton code of `gemm_gelu.py`'s GEMM with the exact GELU in its epilogue (the design: that module's docstring).

In a module of its own, at module level: imported only when the kernel is built (fullgraph imports without
triton), and found by its module and name, as torch finds a user kernel when it loads a precompiled model
(`torch.compiler.load_compiled_function` imports `fn.__module__` and reads `fn.__name__`)."""

import triton
import triton.language as tl


@triton.jit
def fullgraph_gemm_gelu(X, W, B, Y, M, N, K, stride_xm, stride_wn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
                        IEEE: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_m = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # rows and columns past the edge read a valid row instead (their results are not stored): no mask in the loop
    lm = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
    ln = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
    xs = X + lm[:, None] * stride_xm + rk[None, :]
    ws = W + ln[None, :] * stride_wn + rk[:, None]  # [BLOCK_K, BLOCK_N]: weight rows read as columns
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(xs)
            b = tl.load(ws)
        else:
            left = K - k * BLOCK_K
            a = tl.load(xs, mask=rk[None, :] < left, other=0.0)
            b = tl.load(ws, mask=rk[:, None] < left, other=0.0)
        if IEEE:  # noqa: SIM108 - a bool, not the string: Inductor writes user kernels' constexprs into its code
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        xs += BLOCK_K
        ws += BLOCK_K
    z = acc + tl.load(B + ln).to(tl.float32)[None, :]
    y = 0.5 * z * (1.0 + tl.math.erf(z * 0.7071067811865476))  # erf(z / sqrt 2)
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(Y + rm[:, None] * N + rn[None, :], y.to(Y.dtype.element_ty), mask=inside)
