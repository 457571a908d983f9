"""gemm_gelu: the GEMM with the exact GELU in its epilogue against float64 on odd shapes (edge tiles in M and N, a K
that is not a multiple of BLOCK_K, grouped tile order over many tiles), strided operands, every output written."""

import pytest
import torch
import torch.nn.functional as F

from fullgraph.kernels import gemm_gelu
from fullgraph.kernels.gemm_gelu import config_for, gemm_gelu_fwd
from tests.kernels.reference import assert_close, poison_new_tensors

# tl.dot in bf16 is wrong under the CPU interpreter (NOTES): fp16 stands in for the half types there
HALF = torch.bfloat16 if torch.cuda.is_available() else torch.float16


def ref(x, w, b):
    return F.gelu(F.linear(x.double(), w.double(), b.double()))  # the exact (erf) GELU


def operands(m, k, n, dtype, device):
    x = torch.randn(m, k, device=device, dtype=dtype)
    w = (torch.randn(n, k, device=device) / k**0.5).to(dtype)
    b = torch.randn(n, device=device, dtype=dtype)
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
@pytest.mark.parametrize("m,k,n", [(1, 40, 37), (70, 64, 130), (33, 100, 20)])
def test_kernel_matches_float64(triton_device, monkeypatch, dtype, m, k, n):
    poison_new_tensors(monkeypatch)  # an element never written would show as NaN
    x, w, b = operands(m, k, n, dtype, triton_device)
    assert_close(gemm_gelu_fwd(x, w, b), ref(x, w, b), dtype)


@pytest.mark.parametrize("k", [32, 40])  # a whole number of BLOCK_K steps, and a K that masks its last step
def test_many_small_tiles_in_grouped_order(triton_device, monkeypatch, k):
    """16 x 16 tiles over a 70 x 37 output (5 x 3 tiles, the last group of row tiles short): each tile once."""
    monkeypatch.setattr(gemm_gelu, "CONFIGS", ((1 << 62, (16, 16, 16, 2, 4, 1)),))
    poison_new_tensors(monkeypatch)
    x, w, b = operands(70, k, 37, torch.float32, triton_device)
    assert_close(gemm_gelu_fwd(x, w, b), ref(x, w, b), torch.float32)


def test_strided_operands_and_fresh_outputs(triton_device):
    x_big = torch.randn(9, 2 * 48, device=triton_device)
    x = x_big[:, ::2]  # stride 2 along K: copied to unit stride
    w = torch.randn(48, 21, device=triton_device).t()  # [21, 48] with stride (1, 21): copied too
    b = torch.randn(2 * 21, device=triton_device)[::2]
    for _ in range(2):
        out = gemm_gelu_fwd(x, w, b)
        assert out.shape == (9, 21)
        assert_close(out, ref(x, w, b), torch.float32)
    assert gemm_gelu_fwd(x[:0], w, b).shape == (0, 21)


def test_fp32_follows_torchs_tf32_setting():
    matmul, saved = torch.backends.cuda.matmul, torch.backends.cuda.matmul.allow_tf32  # a property: no monkeypatch
    try:
        matmul.allow_tf32 = False
        assert gemm_gelu._ieee(torch.float32) and not gemm_gelu._ieee(torch.bfloat16)
        matmul.allow_tf32 = True
        assert not gemm_gelu._ieee(torch.float32)
    finally:
        matmul.allow_tf32 = saved


def test_configs_cover_every_row_count_and_fit_shared_memory():
    for rows in (1, 1024, 1025, 8192, 8193, 1 << 40):
        bm, bn, bk, group, warps, stages = config_for(rows)
        assert (bm + bn) * bk * 2 * stages <= 227 * 1024  # bf16 operand tiles per stage, H200's shared memory
        assert group >= 1 and warps in (4, 8)
