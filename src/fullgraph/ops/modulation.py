"""DiT adaLN modulation: `modulate(x, shift, scale)` before a block and `gated_residual(x, h, gate)` after it, and
`layer_norm_modulate`, a block's gated residual, LayerNorm and modulation as one op.

    modulate:             x * (1 + scale) + shift
    gated_residual:       x + gate * h
    layer_norm_modulate:  modulate(layer_norm(s), shift, scale), s = x or gated_residual(x, h, gate)

The conditioning parameters (shift, scale, gate) hold one row of C per batch element or per video frame:
`[B, C]` or `[B, 1, C]` against x `[B, N, C]`; `[B, T, 1, C]` against x `[B, T, S, C]`, or against x
`[B, N, C]` whose N tokens are T frames of N / T tokens each. Math is in float32, rounded once to x's dtype
(in eager inference written straight into it: one pass over x).
"""

from __future__ import annotations

import torch

from fullgraph.errors import UsageError
from fullgraph.kernels._library import call_kernel
from fullgraph.kernels.layer_norm import (
    layer_norm_modulate_fwd,
    layer_norm_modulate_residual_fwd,
    layer_norm_modulate_residual_y_fwd,
)
from fullgraph.kernels.modulate import gated_residual_fwd, groups, modulate_fwd
from fullgraph.ops._autograd import backward_from_native
from fullgraph.ops._checks import check_float, check_same_device, check_same_shape
from fullgraph.ops.custom_op import CustomOp, eager_inference, run
from fullgraph.ops.norms import layer_norm_native
from fullgraph.ops.policies import KNOWN_OPS

PARAM_FORMS = "[B, C] or [B, 1, C] with x [B, N, C]; [B, T, 1, C] with x [B, T, S, C] or x [B, N, C] (N % T == 0)"


def check_param(name: str, p: torch.Tensor, x: torch.Tensor) -> None:
    """`p` must be one of the per-batch or per-frame forms in PARAM_FORMS for this x."""
    shape = tuple(p.shape)
    b, c = x.shape[0], x.shape[-1]
    if p.dim() == 0 or shape[-1] != c:
        raise UsageError(f"{name} must end in x's channel dimension C={c}, got shape {shape}")
    if x.dim() == 3 and shape in ((b, c), (b, 1, c)):
        return
    if p.dim() == 4 and shape[0] == b and shape[2] == 1:
        frames = shape[1]
        if x.dim() == 4 and x.shape[1] == frames:
            return
        if x.dim() == 3:
            if frames == 0 or x.shape[1] % frames:
                raise UsageError(
                    f"{name} has {frames} frames ([B, T, 1, C] = {shape}) but x {tuple(x.shape)} has "
                    f"N={x.shape[1]} tokens, not a multiple of T; the frames must split the tokens evenly"
                )
            return
    raise UsageError(f"{name} has shape {shape}, which does not fit x {tuple(x.shape)}; accepted: {PARAM_FORMS}")


def _check_x(x: torch.Tensor) -> None:
    check_float("x", x)
    if x.dim() not in (3, 4):
        raise UsageError(f"x must have shape [B, N, C] or [B, T, S, C], got {tuple(x.shape)}")


def check_modulate_inputs(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> None:
    _check_x(x)
    check_float("shift", shift)
    check_float("scale", scale)
    check_same_device(x, shift=shift, scale=scale)
    if shift.shape != scale.shape:
        raise UsageError(
            f"shift and scale must have the same shape, got shift {tuple(shift.shape)}, scale {tuple(scale.shape)}"
        )
    check_param("shift", shift, x)


def check_gated_residual_inputs(x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor) -> None:
    _check_x(x)
    check_float("h", h)
    check_float("gate", gate)
    check_same_device(x, h=h, gate=gate)
    check_same_shape("h", h, x)
    check_param("gate", gate, x)


def _grouped(x: torch.Tensor, *params: torch.Tensor):
    """x as [G, R, C] (a view where one exists) and each parameter (all of one shape) as [G, 1, C], all in their own
    dtypes, to broadcast row-wise."""
    if x.dim() == 3 and params[0].shape[0] == x.shape[0]:
        if params[0].dim() == 2:  # the common [B, C]: views only
            return x, *[p.unsqueeze(1) for p in params]  # unsqueeze: a third of p[:, None]'s host time
        if params[0].dim() == 3:  # [B, 1, C] (check_param's only 3-D form for x [B, N, C]): as it is
            return (x, *params)
    n_groups, rows_per_group = groups(x, params[0])
    c = x.shape[-1]
    return x.reshape(n_groups, rows_per_group, c), *(p.reshape(n_groups, 1, c) for p in params)


def modulate_native(x, shift, scale):
    xg, shift_g, scale_g = _grouped(x, shift, scale)  # xg: [G, R, C]; shift_g, scale_g: [G, 1, C]
    if eager_inference(x, shift, scale):
        # One pass over x: float32 math (1 + scale is float32, so addcmul computes in float32) rounded once into
        # x's dtype; three launches, as the plain formula takes, where an upcast result and a cast back take two
        # passes more.
        out = torch.empty(xg.shape, dtype=x.dtype, device=x.device)
        torch.addcmul(shift_g, xg, scale_g.float() + 1, out=out)
        return out if xg is x else out.view(x.shape)
    if torch.compiler.is_compiling():  # a trace-time constant: no guard
        # the formula as plain code writes it, in the inputs' dtypes: Inductor computes it in float32 and rounds once,
        # as the float32 form below, and emits the plain twin's very kernels (an addcmul of upcast parameters
        # compiled to differently named ones, tuned apart from the twin's; issue 32, item 3)
        return (xg * (1 + scale_g) + shift_g).reshape(x.shape).to(x.dtype)
    return torch.addcmul(shift_g.float(), xg, 1 + scale_g.float()).reshape(x.shape).to(x.dtype)  # in float32


def gated_residual_native(x, h, gate):
    xg, gate_g = _grouped(x, gate)
    hg = h if xg is x else h.reshape(xg.shape)
    if eager_inference(x, h, gate):  # one pass, float32 math rounded once (gate upcast: a [G, 1, C] copy)
        out = torch.empty(xg.shape, dtype=x.dtype, device=x.device)
        torch.addcmul(xg, gate_g.float(), hg, out=out)
        return out if xg is x else out.view(x.shape)
    if torch.compiler.is_compiling():  # as plain code writes it (modulate_native says why)
        return (xg + gate_g * hg).reshape(x.shape).to(x.dtype)
    return torch.addcmul(xg, gate_g.float(), hg).reshape(x.shape).to(x.dtype)  # x + gate·h in float32


def modulate_kernel(x, shift, scale):
    return call_kernel(modulate_fwd, x, shift, scale)


def gated_residual_kernel(x, h, gate):
    return call_kernel(gated_residual_fwd, x, h, gate)


backward_from_native(modulate_fwd, modulate_native)
backward_from_native(gated_residual_fwd, gated_residual_native)


def modulate(x, shift, scale):
    """`x * (1 + scale) + shift`, shift and scale per batch element or frame (policy of op `modulate`)."""
    check_modulate_inputs(x, shift, scale)
    return run("modulate", modulate_native, modulate_kernel, x, shift, scale)


def gated_residual(x, h, gate):
    """`x + gate * h`, h of x's shape, gate per batch element or frame (policy of op `gated_residual`)."""
    check_gated_residual_inputs(x, h, gate)
    return run("gated_residual", gated_residual_native, gated_residual_kernel, x, h, gate)


def layer_norm_modulate_native(
    x, shift, scale, eps: float = 1e-6, h=None, gate=None, h2=None, gate2=None, return_sum: bool = True
):
    """The ops apart, each native: (gated_residual, and a second one for h2), LayerNorm without affine, modulate;
    Inductor fuses them (and adds both branches in one float32 sum)."""
    s = x if h is None else gated_residual_native(x, h, gate)
    if h2 is not None:
        s = gated_residual_native(s, h2, gate2)
    y = modulate_native(layer_norm_native(s, None, None, eps), shift, scale)
    return (y, s) if h is not None and return_sum else y


def layer_norm_modulate_kernel(
    x, shift, scale, eps: float = 1e-6, h=None, gate=None, h2=None, gate2=None, return_sum: bool = True
):
    """One pass (`kernels/layer_norm.py`): read x (and h, h2), write y (and s), float32 math rounded once each."""
    if h is None:
        return call_kernel(layer_norm_modulate_fwd, x, shift, scale, eps)
    if return_sum or h2 is not None:  # the y-only form takes one branch (a DiT block's second norm)
        y_s = call_kernel(layer_norm_modulate_residual_fwd, x, h, gate, shift, scale, eps, h2, gate2)
        return y_s if return_sum else y_s[0]
    return call_kernel(layer_norm_modulate_residual_y_fwd, x, h, gate, shift, scale, eps)


backward_from_native(layer_norm_modulate_fwd, layer_norm_modulate_native)
backward_from_native(
    layer_norm_modulate_residual_fwd,
    lambda x, h, gate, shift, scale, eps, h2=None, gate2=None: layer_norm_modulate_native(
        x, shift, scale, eps, h, gate, h2, gate2
    ),
)
backward_from_native(
    layer_norm_modulate_residual_y_fwd,
    lambda x, h, gate, shift, scale, eps: layer_norm_modulate_native(x, shift, scale, eps, h, gate, return_sum=False),
)
KNOWN_OPS.add("layer_norm_modulate")  # a functional op without a module: named here so policies may name it


def layer_norm_modulate(x, shift, scale, eps: float = 1e-6, *, h=None, gate=None, h2=None, gate2=None,
                        return_sum: bool = True):  # fmt: skip
    """`modulate(layer_norm(x), shift, scale)` (LayerNorm without affine, as adaLN uses it); with `h` and `gate`,
    of s = `gated_residual(x, h, gate)`, returning (y, s): a DiT block's residual, norm and modulation as one op
    (policy of op `layer_norm_modulate`). With `h2` and `gate2` too, s = x + gate * h + gate2 * h2: a block's two
    branches in one sum, rounded once (the kernel's, as Inductor's fusion of the native ops). `return_sum=False`
    returns y alone and the kernel does not write s. Parameters as `modulate`'s, gate and gate2 of shift's shape."""
    check_modulate_inputs(x, shift, scale)
    for name, gate_name, branch, g in (("h", "gate", h, gate), ("h2", "gate2", h2, gate2)):
        if (branch is None) != (g is None):
            raise UsageError(f"give {name} and {gate_name} together (the gated residual x + gate * h), or neither")
        if branch is not None:
            check_gated_residual_inputs(x, branch, g)
            if g.shape != shift.shape:
                raise UsageError(f"{gate_name} must have shift's shape {tuple(shift.shape)}, got {tuple(g.shape)}")
    if h2 is not None and h is None:
        raise UsageError("h2 and gate2 are a second branch: give h and gate too")
    return run("layer_norm_modulate", layer_norm_modulate_native, layer_norm_modulate_kernel, x, shift, scale, eps, h,
               gate, h2, gate2, return_sum)  # fmt: skip


class Modulate(CustomOp):
    """`modulate` as a module, with no parameters of its own; `forward(x, shift, scale)`."""

    name = "modulate"
    check_inputs = staticmethod(check_modulate_inputs)
    forward_native = staticmethod(modulate_native)
    forward_kernel = staticmethod(modulate_kernel)


class GatedResidual(CustomOp):
    """`gated_residual` as a module, with no parameters of its own; `forward(x, h, gate)`."""

    name = "gated_residual"
    check_inputs = staticmethod(check_gated_residual_inputs)
    forward_native = staticmethod(gated_residual_native)
    forward_kernel = staticmethod(gated_residual_kernel)
