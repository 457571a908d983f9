"""Linear + GELU as one GEMM: `gelu(x @ weight.T + bias)` with the activation in the GEMM's epilogue.

In a transformer MLP the GELU between the two GEMMs is a full extra pass over the widest activation (4x the model
width): compiled, Inductor writes fc1's output, reads it back for the GELU and writes it again. cuBLASLt can apply
a bias and a GELU while the GEMM's tile is still in registers (`torch._addmm_activation(..., use_gelu=True)`, the
GELU_BIAS epilogue), so the pass disappears. Inductor keeps that aten op as one extern call (it has no
decomposition for it in Inductor's table), so the fusion survives torch.compile.

The epilogue computes GELU's tanh approximation, so the kernel form applies to `approximate="tanh"` only, on CUDA,
with a bias and one floating dtype for x, weight and bias, in inference (no grad); everything else runs the
native form, `F.gelu(F.linear(...))`. On the CPU `_addmm_activation` computes the exact (erf) GELU, so it is never
used there. Which form runs is op `linear_gelu`'s policy; compiled `auto` takes the kernel form only where an
in-graph measurement on this GPU says so (`measured.py`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fullgraph.errors import UsageError
from fullgraph.kernels._library import call_kernel
from fullgraph.kernels.skinny_linear import MAX_ROWS, skinny_linear_fwd
from fullgraph.ops._autograd import backward_from_native
from fullgraph.ops._checks import check_float, check_same_device
from fullgraph.ops.custom_op import CustomOp, run
from fullgraph.ops.policies import KNOWN_OPS

APPROXIMATIONS = ("none", "tanh")
_EPILOGUE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_linear_gelu_inputs(x, weight, bias, approximate: str) -> None:
    if approximate not in APPROXIMATIONS:
        raise UsageError(f"approximate={approximate!r}: use 'none' (exact GELU) or 'tanh'")
    check_linear_inputs(x, weight, bias)


def linear_gelu_native(x, weight, bias=None, approximate: str = "tanh"):
    return F.gelu(F.linear(x, weight, bias), approximate=approximate)


def epilogue_applies(x, weight, bias, approximate: str) -> bool:
    """Can cuBLASLt's GELU epilogue compute this call (see the module docstring)?"""
    return (
        approximate == "tanh"
        and bias is not None
        and x.is_cuda
        and x.dtype in _EPILOGUE_DTYPES
        and x.dtype == weight.dtype == bias.dtype
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or bias.requires_grad))
    )


def linear_gelu_kernel(x, weight, bias=None, approximate: str = "tanh"):
    if not epilogue_applies(x, weight, bias, approximate):
        return linear_gelu_native(x, weight, bias, approximate)
    y = torch._addmm_activation(bias, x.reshape(-1, x.shape[-1]), weight.t(), use_gelu=True)
    return y.view(*x.shape[:-1], weight.shape[0])


def linear_gelu(x, weight, bias=None, approximate: str = "tanh"):
    """`F.gelu(F.linear(x, weight, bias), approximate=approximate)`, one GEMM where the policy of op `linear_gelu`
    takes the kernel form and cuBLASLt's epilogue applies (module docstring)."""
    check_linear_gelu_inputs(x, weight, bias, approximate)
    return run("linear_gelu", linear_gelu_native, linear_gelu_kernel, x, weight, bias, approximate)


def check_linear_inputs(x, weight, bias) -> None:
    check_float("x", x)
    check_float("weight", weight)
    if weight.dim() != 2 or x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise UsageError(
            f"weight must be [out, in] with in = x's last dimension, got weight {tuple(weight.shape)} "
            f"and x {tuple(x.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise UsageError(f"bias must be [out] = [{weight.shape[0]}], got {tuple(bias.shape)}")
    check_same_device(x, weight=weight, bias=bias)


def skinny_linear_native(x, weight, bias=None):
    return F.linear(x, weight, bias)


def skinny_applies(x, weight, bias) -> bool:
    """Can the skinny kernel compute this call: at most MAX_ROWS rows of x, one dtype, inference?"""
    return (
        x.numel() <= MAX_ROWS * x.shape[-1]
        and x.dtype == weight.dtype
        and (bias is None or bias.dtype == x.dtype)
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    )


def skinny_linear_kernel(x, weight, bias=None):
    if not skinny_applies(x, weight, bias):
        return skinny_linear_native(x, weight, bias)
    return call_kernel(skinny_linear_fwd, x, weight, bias)


backward_from_native(skinny_linear_fwd, skinny_linear_native)


def skinny_linear(x, weight, bias=None):
    """`F.linear(x, weight, bias)` for an input of a few rows (at most `kernels.skinny_linear.MAX_ROWS`), where the
    layer is a read of the weight: a DiT's adaLN projection of the conditioning. Policy of op `skinny_linear`; the
    kernel form runs `F.linear` for inputs it does not take (more rows, mixed dtypes, autograd recording)."""
    check_linear_inputs(x, weight, bias)
    return run("skinny_linear", skinny_linear_native, skinny_linear_kernel, x, weight, bias)


KNOWN_OPS.add("skinny_linear")  # a functional op without a module: named here so policies may name it


class LinearGELU(CustomOp):
    """`nn.Linear` followed by GELU (`approximate="tanh"` by default, the form the epilogue computes)."""

    name = "linear_gelu"

    def __init__(self, in_features: int, out_features: int, bias: bool = True, approximate: str = "tanh",
                 policy=None, **factory):  # fmt: skip
        super().__init__(policy)
        if approximate not in APPROXIMATIONS:
            raise UsageError(f"approximate={approximate!r}: use 'none' (exact GELU) or 'tanh'")
        self.approximate = approximate
        linear = nn.Linear(in_features, out_features, bias=bias, **factory)  # nn.Linear's initialisation
        self.weight, self.bias = linear.weight, linear.bias

    def check_inputs(self, x):
        check_linear_gelu_inputs(x, self.weight, self.bias, self.approximate)

    def forward_native(self, x):
        return linear_gelu_native(x, self.weight, self.bias, self.approximate)

    def forward_kernel(self, x):
        return linear_gelu_kernel(x, self.weight, self.bias, self.approximate)

    def extra_repr(self) -> str:
        out, inp = self.weight.shape
        return f"in_features={inp}, out_features={out}, approximate={self.approximate!r}" + (
            f", policy={self.policy}" if self.policy else ""
        )
