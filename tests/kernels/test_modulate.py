import pytest
import torch

import fullgraph.ops.modulation  # noqa: F401  (registers the backward of torch.ops.fullgraph.modulate, ...)
from fullgraph.kernels.modulate import gated_residual_fwd, modulate_fwd

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# ||out - ref|| / ||ref|| bounds: float32 math rounds at ~1e-7; half types at their storage precision.
REL_TOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}

# (x shape, parameter shape) for each broadcast form, C filled in by `form_shapes`.
FORMS = {
    "B_C": ((2, 7), (2,)),  # one row per batch element
    "B_1_C": ((2, 7), (2, 1)),
    "single_token": ((3, 1), (3, 1)),
    "frames": ((2, 3, 5), (2, 3, 1)),  # x [B, T, S, C], one row per (b, t)
    "flat_frames": ((2, 15), (2, 3, 1)),  # x [B, N, C] holding T=3 frames of 5 tokens
}


def form_shapes(form: str, c: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    x_lead, p_lead = FORMS[form]
    return (*x_lead, c), (*p_lead, c)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all(), "output has NaN or Inf"
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    err = rel_err(out, ref)
    assert err < REL_TOL[dtype], f"relative error {err:.3e} over {REL_TOL[dtype]:.1e} for {dtype}"


def _broadcastable(x: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x and p in float64, shaped so that plain broadcasting pairs each row of x with its parameter row."""
    x64, p64 = x.double(), p.double()
    if p.dim() == 2:  # [B, C] against [B, N, C]
        return x64, p64[:, None]
    if p.dim() == 4 and x.dim() == 3:  # [B, T, 1, C] against T frames of N / T tokens
        return x64.unflatten(1, (p.shape[1], -1)), p64
    return x64, p64


def modulate_ref(x, shift, scale):
    x64, shift64 = _broadcastable(x, shift)
    scale64 = _broadcastable(x, scale)[1]
    return (x64 * (1 + scale64) + shift64).reshape(x.shape)


def gated_residual_ref(x, h, gate):
    x64, gate64 = _broadcastable(x, gate)
    return (x64 + gate64 * h.double().reshape(x64.shape)).reshape(x.shape)


def _inputs(form, c, dtype, param_dtype=None, device="cpu"):
    x_shape, p_shape = form_shapes(form, c)
    x = torch.randn(x_shape, device=device, dtype=dtype) * 2 + 0.5
    params = [torch.randn(p_shape, device=device, dtype=param_dtype or dtype) for _ in range(2)]
    return x, *params


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", [63, 128, 3072, 5120])
@pytest.mark.parametrize("form", FORMS)
def test_modulate_matches_float64(triton_device, form, c, dtype):
    x, shift, scale = _inputs(form, c, dtype, device=triton_device)
    out = modulate_fwd(x, shift, scale)
    assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
    assert_close(out, modulate_ref(x, shift, scale), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", [63, 128, 3072, 5120])
@pytest.mark.parametrize("form", FORMS)
def test_gated_residual_matches_float64(triton_device, form, c, dtype):
    x, gate, _ = _inputs(form, c, dtype, device=triton_device)
    h = torch.randn_like(x)
    out = gated_residual_fwd(x, h, gate)
    assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
    assert_close(out, gated_residual_ref(x, h, gate), dtype)


@pytest.mark.parametrize("form", ["B_C", "flat_frames"])
def test_float32_params_with_bfloat16_x(triton_device, form):
    x, shift, scale = _inputs(form, 128, torch.bfloat16, torch.float32, device=triton_device)
    out = modulate_fwd(x, shift, scale)
    assert out.dtype == torch.bfloat16
    assert_close(out, modulate_ref(x, shift, scale), torch.bfloat16)
    h = torch.randn_like(x)
    assert_close(gated_residual_fwd(x, h, shift), gated_residual_ref(x, h, shift), torch.bfloat16)


def test_non_contiguous_inputs(triton_device):
    dev = triton_device
    x_t = torch.randn(2, 128, 7, device=dev).transpose(1, 2)  # [2, 7, 128] with a channel stride: copied
    x_s = torch.randn(2, 7, 200, device=dev)[..., :128]  # row stride 200: used in place
    # DiT's adaLN output chunked into shift/scale/gate: [B, C] views with a row stride of 3C
    shift, scale, gate = torch.randn(2, 3 * 128, device=dev).chunk(3, dim=-1)
    strided = torch.randn(2, 256, device=dev)[:, ::2]  # a parameter with a channel stride of 2
    for x in (x_t, x_s):
        assert_close(modulate_fwd(x, shift, scale), modulate_ref(x, shift, scale), torch.float32)
        assert_close(modulate_fwd(x, strided, strided), modulate_ref(x, strided, strided), torch.float32)
        h = torch.randn(2, 128, 7, device=dev).transpose(1, 2)
        assert_close(gated_residual_fwd(x, h, gate), gated_residual_ref(x, h, gate), torch.float32)
        assert_close(gated_residual_fwd(x, h, strided), gated_residual_ref(x, h, strided), torch.float32)


def test_per_frame_params_with_strides(triton_device):
    # [B, T, 1, C] cut from a [B, T, 2C] tensor: a frame stride of 2C, not C
    x = torch.randn(2, 3, 5, 64, device=triton_device)
    shift, scale = torch.randn(2, 3, 1, 128, device=triton_device).chunk(2, dim=-1)
    assert_close(modulate_fwd(x, shift, scale), modulate_ref(x, shift, scale), torch.float32)


@pytest.mark.parametrize("c", [5000, 16384])
def test_long_rows_split_into_tiles(triton_device, c):
    x, shift, scale = _inputs("B_1_C", c, torch.bfloat16, device=triton_device)
    assert_close(modulate_fwd(x, shift, scale), modulate_ref(x, shift, scale), torch.bfloat16)
    h = torch.randn_like(x)
    assert_close(gated_residual_fwd(x, h, scale), gated_residual_ref(x, h, scale), torch.bfloat16)


def test_every_row_takes_its_own_group(triton_device):
    # Many short rows packed per program, groups that straddle program boundaries: a wrong r // R shows.
    x = torch.randn(3, 7 * 11, 63, device=triton_device)
    gate = torch.randn(3, 7, 1, 63, device=triton_device)
    h = torch.randn_like(x)
    assert_close(gated_residual_fwd(x, h, gate), gated_residual_ref(x, h, gate), torch.float32)


@pytest.mark.parametrize("form", ["B_1_C", "flat_frames"])
def test_opcheck(triton_device, form):
    x, shift, scale = _inputs(form, 63, torch.bfloat16, device=triton_device)
    h = torch.randn_like(x)
    torch.library.opcheck(torch.ops.fullgraph.modulate.default, (x, shift, scale))
    torch.library.opcheck(torch.ops.fullgraph.gated_residual.default, (x, h, scale))
    grads = [t.float().requires_grad_() for t in (x, shift, scale, h)]  # the backward, too
    torch.library.opcheck(torch.ops.fullgraph.modulate.default, tuple(grads[:3]))
    torch.library.opcheck(torch.ops.fullgraph.gated_residual.default, (grads[0], grads[3], grads[2]))
