"""skinny_linear: the few-row linear kernel against float64 on odd shapes, its fallbacks, the op's checks and
registration, and the op inside a compiled graph."""

import pytest
import torch
import torch.nn.functional as F

from fullgraph import ops
from fullgraph.errors import UsageError
from fullgraph.kernels.skinny_linear import MAX_ROWS, skinny_linear_fwd
from fullgraph.ops.linear import skinny_applies, skinny_linear
from tests.kernels.reference import assert_close


def ref(x, w, b):
    return F.linear(x.double(), w.double(), None if b is None else b.double())


@pytest.mark.parametrize("rows", [1, 2, 3, 5, MAX_ROWS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_float64(triton_device, rows, dtype):
    k, n = 300, 37  # K not a multiple of any BLOCK_K, N not a multiple of any BLOCK_N
    x = torch.randn(rows, k, device=triton_device, dtype=dtype)
    w = torch.randn(n, k, device=triton_device, dtype=dtype) * 0.1
    b = torch.randn(n, device=triton_device, dtype=dtype)
    assert_close(skinny_linear_fwd(x, w, b), ref(x, w, b), dtype)
    assert_close(skinny_linear_fwd(x, w, None), ref(x, w, None), dtype)


def test_leading_dims_strided_weight_and_every_output_written(triton_device):
    x = torch.randn(2, 1, 70, device=triton_device)  # a [B, 1, C] conditioning: two rows
    big = torch.randn(2 * 41, 70, device=triton_device)
    w = big[::2]  # row stride 140: used as it is
    for _ in range(3):  # fresh outputs each time: a stale value would show as a mismatch
        out = skinny_linear_fwd(x, w, None)
        assert out.shape == (2, 1, 41)
        assert_close(out, ref(x, w, None), torch.float32)


def test_op_takes_the_kernel_only_where_it_applies_and_counts(triton_device):
    w = torch.randn(19, 33, device=triton_device)
    b = torch.randn(19, device=triton_device)
    few, many = torch.randn(3, 33, device=triton_device), torch.randn(MAX_ROWS + 1, 33, device=triton_device)
    assert skinny_applies(few, w, b) and not skinny_applies(many, w, b)
    assert not skinny_applies(few.double(), w, b)  # one dtype for all
    with torch.no_grad(), ops.policy(skinny_linear="kernel"):
        before = ops.counters[("skinny_linear", "eager", "kernel")]
        for x in (few, many):  # many rows: the kernel form runs F.linear, same values
            assert_close(skinny_linear(x, w, b), ref(x, w, b), torch.float32)
        assert ops.counters[("skinny_linear", "eager", "kernel")] == before + 2
    with ops.policy(skinny_linear="native"):
        torch.testing.assert_close(skinny_linear(few, w, b), F.linear(few, w, b))


def test_gradients_flow_through_the_native_form(triton_device):
    w = torch.randn(19, 33, device=triton_device, requires_grad=True)
    x = torch.randn(2, 33, device=triton_device)
    with ops.policy(skinny_linear="kernel"):
        skinny_linear(x, w).sum().backward()
    torch.testing.assert_close(w.grad, x.sum(0).expand(19, 33))


@pytest.mark.parametrize(
    "args, match",
    [
        ((torch.randn(2, 8), torch.randn(4, 9), None), "weight must be"),
        ((torch.randn(2, 8), torch.randn(4, 8), torch.randn(5)), "bias must be"),
        ((torch.randint(0, 3, (2, 8)), torch.randn(4, 8), None), "x"),
    ],
)
def test_bad_input_is_named(args, match):
    with pytest.raises(UsageError, match=match):
        skinny_linear(*args)


def test_opcheck(triton_device):
    x = torch.randn(3, 65, device=triton_device, dtype=torch.bfloat16)
    w = torch.randn(17, 65, device=triton_device, dtype=torch.bfloat16)
    b = torch.randn(17, device=triton_device, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.fullgraph.skinny_linear.default, (x, w, b))
    torch.library.opcheck(torch.ops.fullgraph.skinny_linear.default, (x, w, None))


def test_compiles_into_one_graph_under_the_kernel_policy(triton_device):
    w = torch.randn(23, 40, device=triton_device)
    b = torch.randn(23, device=triton_device)

    def f(c):
        return skinny_linear(F.silu(c), w, b) * 2

    c = torch.randn(2, 40, device=triton_device)
    torch._dynamo.reset()
    with torch.no_grad(), ops.policy(skinny_linear="kernel"):
        before = ops.counters[("skinny_linear", "compiled", "kernel")]
        out = torch.compile(f, fullgraph=True)(c)
        assert ops.counters[("skinny_linear", "compiled", "kernel")] == before + 1
    assert_close(out, ref(F.silu(c.double()), w, b) * 2, torch.float32)
