"""Input checks shared by the ops: each failure is a ValueError naming the argument and what it must be."""

from __future__ import annotations

import torch

from fullgraph.errors import UsageError

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_float(name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise UsageError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")


def check_same_device(x: torch.Tensor, **others: torch.Tensor | None) -> None:
    for name, t in others.items():
        if t is not None and t.device != x.device:
            raise UsageError(f"{name} is on {t.device} but x is on {x.device}; move both to one device")


def check_last_dim(name: str, t: torch.Tensor | None, size: int) -> None:
    """`t` must be a 1-D tensor of `size` elements (a per-channel weight or bias)."""
    if t is not None and tuple(t.shape) != (size,):
        raise UsageError(f"{name} must have shape ({size},) to match x's last dimension, got {tuple(t.shape)}")


def check_same_shape(name: str, t: torch.Tensor | None, x: torch.Tensor) -> None:
    if t is not None and t.shape != x.shape:
        raise UsageError(f"{name} must have x's shape {tuple(x.shape)}, got {tuple(t.shape)}")


def check_norm_inputs(x, weight=None, bias=None, residual=None) -> None:
    """One pass of plain comparisons on the hot path (eager calls pay for every check); the detailed checks
    below run only to name what is wrong."""
    dtype, device = x.dtype, x.device
    if dtype in FLOAT_DTYPES and x.dim():
        n = (x.shape[-1],)
        if (
            (weight is None or (weight.dtype in FLOAT_DTYPES and weight.device == device and weight.shape == n))
            and (bias is None or (bias.dtype in FLOAT_DTYPES and bias.device == device and bias.shape == n))
            and (
                residual is None
                or (residual.dtype == dtype and residual.device == device and residual.shape == x.shape)
            )
        ):
            return
    _explain_norm_inputs(x, weight, bias, residual)


def _explain_norm_inputs(x, weight, bias, residual) -> None:
    check_float("x", x)
    if x.dim() == 0:
        raise UsageError("x must have at least one dimension (the normalized one)")
    for name, t in (("weight", weight), ("bias", bias), ("residual", residual)):
        if t is not None:
            check_float(name, t)
    check_same_device(x, weight=weight, bias=bias, residual=residual)
    check_last_dim("weight", weight, x.shape[-1])
    check_last_dim("bias", bias, x.shape[-1])
    check_same_shape("residual", residual, x)
    if residual is not None and residual.dtype != x.dtype:
        raise UsageError(f"residual must have x's dtype {x.dtype}, got {residual.dtype}")
