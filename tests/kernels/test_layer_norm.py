import pytest
import torch

import fullgraph.ops  # noqa: F401  (registers torch.ops.fullgraph.*)
from fullgraph.kernels.layer_norm import layer_norm_fwd
from tests.kernels.reference import assert_close, layer_norm_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(1, 63), (7, 128), (7, 3072), (3, 5120), (2, 3, 63)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", ["weight+bias", "weight", "none"])
def test_matches_float64(triton_device, shape, dtype, affine):
    # an offset mean checks that the variance is taken about the mean
    x = torch.randn(shape, device=triton_device, dtype=dtype) * 2 + 3
    w = torch.randn(shape[-1], device=triton_device, dtype=dtype) if affine != "none" else None
    b = torch.randn(shape[-1], device=triton_device, dtype=dtype) if affine == "weight+bias" else None
    out = layer_norm_fwd(x, w, b, 1e-5)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close(out, layer_norm_ref(x, w, b), dtype)


def test_non_contiguous_and_long_rows(triton_device):
    x = torch.randn(16384, 3, device=triton_device, dtype=torch.bfloat16).t()
    w = torch.randn(16384, device=triton_device)
    b = torch.randn(16384, device=triton_device)
    assert_close(layer_norm_fwd(x, w, b, 1e-5), layer_norm_ref(x, w, b), torch.bfloat16)


def test_every_element_written(triton_device):
    for n in (31, 33, 65):
        x = torch.randn(n, 128, device=triton_device)
        assert_close(layer_norm_fwd(x, None, None, 1e-5), layer_norm_ref(x), torch.float32)


def test_opcheck(triton_device):
    x = torch.randn(7, 63, device=triton_device, dtype=torch.float16)
    w = torch.randn(63, device=triton_device, dtype=torch.float16)
    torch.library.opcheck(torch.ops.fullgraph.layer_norm.default, (x, w, w.clone(), 1e-5))
    torch.library.opcheck(torch.ops.fullgraph.layer_norm.default, (x, None, None, 1e-5))
