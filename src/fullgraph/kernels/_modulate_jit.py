"""The Triton code of `modulate.py`'s modulation kernel (modulate and gated_residual, one flat pass).

In a module of its own, at module level: imported only when the kernel is built (fullgraph imports without
triton), and found by its module and name, as torch finds a user kernel when it loads a precompiled model
(`torch.compiler.load_compiled_function` imports `fn.__module__` and reads `fn.__name__`)."""

import triton
import triton.language as tl


@triton.jit
def fullgraph_modulation(
    X, A, P, Y, numel, n_cols, group_numel, stride_p, GATED: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr
):
    """GATED: y = x + p * a with a x-shaped (gated_residual); else y = x * (1 + p) + a, a per group (modulate).
    The per-group parameters are rows stride_p apart with unit columns (adaLN chunks read where they lie)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if WIDE:  # past 2**31 elements, offsets need 64 bits
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    p = (offs // group_numel) * stride_p + offs % n_cols  # the parameter element for each x element
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + (offs if GATED else p), mask=mask, other=0.0).to(tl.float32)
    param = tl.load(P + p, mask=mask, other=0.0).to(tl.float32)
    y = x + param * a if GATED else x * (1.0 + param) + a
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)
