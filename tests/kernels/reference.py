"""Float64 references and the per-dtype tolerance every kernel test compares against."""

import torch

# ||out - ref|| / ||ref|| bounds: float32 math rounds at ~1e-7; half types at their storage precision.
REL_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all(), "output has NaN or Inf"
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    err = rel_err(out, ref)
    assert err < REL_TOL[dtype] * scale, f"relative error {err:.3e} over {REL_TOL[dtype] * scale:.1e} for {dtype}"


def rms_norm_ref(x, weight=None, eps=1e-6):
    x = x.double()
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * weight.double() if weight is not None else y


def layer_norm_ref(x, weight=None, bias=None, eps=1e-5):
    x = x.double()
    y = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    return y + bias.double() if bias is not None else y


def poison_new_tensors(monkeypatch) -> None:
    """Make every float tensor `torch.empty` and `torch.empty_like` return start as NaN (the launchers allocate their
    outputs with them), so an element the kernel never writes shows as NaN instead of passing on leftover memory."""
    for name in ("empty", "empty_like"):
        make = getattr(torch, name)

        def poisoned(*args, make=make, **kwargs):
            t = make(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t

        monkeypatch.setattr(torch, name, poisoned)
