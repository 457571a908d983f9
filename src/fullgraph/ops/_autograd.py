"""Backward for kernel ops, derived from the op's native form.

The kernels are forward-only. So that a model using them still compiles when its parameters require grad
(AOTAutograd traces a joint graph) and can be fine-tuned, each kernel op gets a backward that recomputes
the native form and differentiates it: correct by construction, not as fast as a fused backward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def backward_from_native(op_def, native: Callable) -> None:
    """Register on `op_def` (a custom or triton op) a backward that differentiates `native(*same args)`."""

    def setup_context(ctx, inputs, output):
        ctx.tensor_positions = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)]
        ctx.save_for_backward(*(inputs[i] for i in ctx.tensor_positions))
        ctx.inputs = [None if isinstance(a, torch.Tensor) else a for a in inputs]

    def backward(ctx, *grads):
        args = list(ctx.inputs)
        leaves = []
        for i, t in zip(ctx.tensor_positions, ctx.saved_tensors, strict=True):
            args[i] = t.detach().requires_grad_(ctx.needs_input_grad[i])
            if ctx.needs_input_grad[i]:
                leaves.append(i)
        with torch.enable_grad():
            out = native(*args)
        outs = out if isinstance(out, tuple) else (out,)
        pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if g is not None and o.requires_grad]
        result = [None] * len(args)
        if leaves and pairs:
            got = torch.autograd.grad(
                [o for o, _ in pairs], [args[i] for i in leaves], [g for _, g in pairs], allow_unused=True
            )
            for i, g in zip(leaves, got, strict=True):
                result[i] = g
        return tuple(result)

    op_def.register_autograd(backward, setup_context=setup_context)
