import pytest
import torch

import fullgraph.ops  # noqa: F401  (registers torch.ops.fullgraph.*)
from fullgraph.kernels.rms_norm import rms_norm_fwd, rms_norm_residual_fwd
from tests.kernels.reference import REL_TOL, assert_close, poison_new_tensors, rms_norm_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(1, 63), (7, 128), (7, 3072), (3, 5120), (2, 3, 63)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64(triton_device, shape, dtype):
    x = torch.randn(shape, device=triton_device, dtype=dtype) * 3 + 0.5
    w = torch.randn(shape[-1], device=triton_device, dtype=dtype)
    out = rms_norm_fwd(x, w, 1e-6)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close(out, rms_norm_ref(x, w), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_without_weight_and_with_float32_weight(triton_device, dtype):
    x = torch.randn(7, 63, device=triton_device, dtype=dtype)
    assert_close(rms_norm_fwd(x, None, 1e-5), rms_norm_ref(x, eps=1e-5), dtype)
    w = torch.randn(63, device=triton_device)
    assert_close(rms_norm_fwd(x, w, 1e-6), rms_norm_ref(x, w), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_residual(triton_device, dtype):
    x = torch.randn(7, 3072, device=triton_device, dtype=dtype)
    r = torch.randn(7, 3072, device=triton_device, dtype=dtype)
    w = torch.randn(3072, device=triton_device, dtype=dtype)
    y, s = rms_norm_residual_fwd(x, r, w, 1e-6)
    expect_s = x.double() + r.double()
    assert_close(s, expect_s, dtype)
    assert_close(y, rms_norm_ref(expect_s, w), dtype)  # the norm of the float32 sum, s rounded only as stored


def test_non_contiguous_input(triton_device):
    base = torch.randn(128, 14, device=triton_device, dtype=torch.bfloat16)
    x = base.t()  # [14, 128] with a column stride: needs a copy to unit stride
    w = torch.randn(128, device=triton_device, dtype=torch.bfloat16)
    assert_close(rms_norm_fwd(x, w, 1e-6), rms_norm_ref(x, w), torch.bfloat16)
    sliced = torch.randn(7, 200, device=triton_device)[:, :128]  # row stride 200: used in place
    assert_close(rms_norm_fwd(sliced, w.float(), 1e-6), rms_norm_ref(sliced, w), torch.float32)


def test_long_rows(triton_device):
    x = torch.randn(2, 16384, device=triton_device, dtype=torch.bfloat16)
    w = torch.randn(16384, device=triton_device, dtype=torch.bfloat16)
    assert_close(rms_norm_fwd(x, w, 1e-6), rms_norm_ref(x, w), torch.bfloat16)


def test_every_element_written(triton_device):
    # Row counts around the rows-per-program boundary: a missed tail row would stay NaN.
    for n in (31, 33, 65):
        x = torch.randn(n, 128, device=triton_device)
        out = rms_norm_fwd(x, None, 1e-6)
        assert torch.isfinite(out).all()
        assert_close(out, rms_norm_ref(x), torch.float32)


def test_opcheck(triton_device):
    x = torch.randn(7, 63, device=triton_device, dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(63, device=triton_device, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.fullgraph.rms_norm.default, (x, w, 1e-6))
    torch.library.opcheck(torch.ops.fullgraph.rms_norm.default, (x, None, 1e-6))
    torch.library.opcheck(torch.ops.fullgraph.rms_norm_residual.default, (x, r, w, 1e-6))


def test_tolerances_are_tight_enough_to_catch_a_wrong_eps(triton_device):
    # A kernel that ignored eps would still pass a loose check: this one must see the difference.
    x = torch.randn(7, 128, device=triton_device) * 1e-2
    out = rms_norm_fwd(x, None, 1e-2)
    assert_close(out, rms_norm_ref(x, eps=1e-2), torch.float32)
    wrong = rms_norm_ref(x, eps=1e-6)
    assert ((out.double() - wrong).norm() / wrong.norm()).item() > REL_TOL[torch.float32] * 100


# head dims of real models (q/k norms) and their widths (DiT-XL 1152, ViT-H 1280, 1408), and an odd width: rows held
# as power-of-two pieces (72 = 64 + 8, 1408 = 1024 + 256 + 128, 123 = 64 + 32 + 32 masked)
@pytest.mark.parametrize("width", [64, 72, 80, 88, 96, 112, 128, 123, 1152, 1280, 1408])
def test_every_head_dim_and_width(triton_device, monkeypatch, width):
    poison_new_tensors(monkeypatch)
    for dtype in (torch.float32, torch.bfloat16):
        x, r = (torch.randn(5, width, device=triton_device, dtype=dtype) * 2 + 0.5 for _ in range(2))
        w = torch.randn(width, device=triton_device, dtype=dtype)
        assert_close(rms_norm_fwd(x, w, 1e-6), rms_norm_ref(x, w), dtype)
        y, s = rms_norm_residual_fwd(x, r, w, 1e-6)
        assert_close(s, x.double() + r.double(), dtype)
        assert_close(y, rms_norm_ref(x.double() + r.double(), w), dtype)
