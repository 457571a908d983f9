"""RMSNorm and LayerNorm: modules that drop into a model, and functional forms.

Both compute in float32 and return x's dtype. `rms_norm(x, weight, residual=r)` returns
`(norm(x + r), x + r)`, the fused form used between transformer blocks.
"""

from __future__ import annotations

import torch
from torch import nn

from fullgraph.kernels._library import call_kernel
from fullgraph.kernels.layer_norm import layer_norm_fwd
from fullgraph.kernels.rms_norm import rms_norm_fwd, rms_norm_residual_fwd
from fullgraph.ops._autograd import backward_from_native
from fullgraph.ops._checks import check_norm_inputs
from fullgraph.ops.custom_op import CustomOp, run


def _same_dtype(x, weight, bias=None) -> bool:
    dtype = x.dtype  # two plain tests, not all() over a generator: this runs on every eager call
    return (weight is None or weight.dtype == dtype) and (bias is None or bias.dtype == dtype)


def rms_norm_native(x, weight=None, eps: float = 1e-6, residual=None):
    s = x if residual is None else x + residual  # rounded to x's dtype, as the unfused code would store it
    if _same_dtype(x, weight):  # torch's own op (float32 inside, x's dtype out): one call, what plain code runs
        # torch.rms_norm / torch.layer_norm: what F.rms_norm / F.layer_norm call after a __torch_function__ check
        # the torch.* bindings make themselves; called directly, an eager call costs ~1 µs less on the CPU
        y = torch.rms_norm(s, (s.shape[-1],), weight, eps)
        return y if residual is None else (y, s)
    x32 = s.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype) if residual is None else (y.to(x.dtype), s)


def rms_norm_kernel(x, weight=None, eps: float = 1e-6, residual=None):
    if residual is None:
        return call_kernel(rms_norm_fwd, x, weight, eps)
    return call_kernel(rms_norm_residual_fwd, x, residual, weight, eps)


def layer_norm_native(x, weight=None, bias=None, eps: float = 1e-5):
    if _same_dtype(x, weight, bias):  # torch's own op, as above; mixed dtypes take the explicit float32 path
        return torch.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    x32 = x.float()
    mean = x32.mean(-1, keepdim=True)
    var = (x32 - mean).pow(2).mean(-1, keepdim=True)
    y = (x32 - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def layer_norm_kernel(x, weight=None, bias=None, eps: float = 1e-5):
    return call_kernel(layer_norm_fwd, x, weight, bias, eps)


backward_from_native(rms_norm_fwd, rms_norm_native)
backward_from_native(rms_norm_residual_fwd, lambda x, r, w, eps: rms_norm_native(x, w, eps, r))
backward_from_native(layer_norm_fwd, layer_norm_native)


def rms_norm(x, weight=None, eps: float = 1e-6, residual=None):
    """RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) * weight` (policy of op `rms_norm`)."""
    check_norm_inputs(x, weight, residual=residual)
    return run("rms_norm", rms_norm_native, rms_norm_kernel, x, weight, eps, residual)


def layer_norm(x, weight=None, bias=None, eps: float = 1e-5):
    """LayerNorm over the last dimension, affine or not (policy of op `layer_norm`)."""
    check_norm_inputs(x, weight, bias)
    return run("layer_norm", layer_norm_native, layer_norm_kernel, x, weight, bias, eps)


class RMSNorm(CustomOp):
    """`nn.RMSNorm`-compatible module; `forward(x, residual=None)`."""

    name = "rms_norm"

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True, policy=None, **factory):
        super().__init__(policy)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, **factory)) if elementwise_affine else None

    def forward(self, x, residual=None):
        weight = self.weight  # read once: see CustomOp.choice
        check_norm_inputs(x, weight, residual=residual)
        norm = rms_norm_kernel if self.choice(x) == "kernel" else rms_norm_native
        return norm(x, weight, self.eps, residual)


class LayerNorm(CustomOp):
    """`nn.LayerNorm`-compatible module over the last dimension; `bias=False` or non-affine supported."""

    name = "layer_norm"

    def __init__(
        self, dim: int, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True, policy=None, **factory
    ):
        super().__init__(policy)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, **factory)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(dim, **factory)) if elementwise_affine and bias else None

    def forward(self, x):
        weight, bias = self.weight, self.bias  # read once: see CustomOp.choice
        check_norm_inputs(x, weight, bias)
        norm = layer_norm_kernel if self.choice(x) == "kernel" else layer_norm_native
        return norm(x, weight, bias, self.eps)
