import pytest
import torch

from fullgraph import ops
from fullgraph.ops.norms import layer_norm_native, rms_norm_native
from tests.kernels.reference import assert_close, layer_norm_ref, rms_norm_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_natives_match_float64(dtype):
    x = torch.randn(7, 63, dtype=dtype) + 1
    w, b = torch.randn(63, dtype=dtype), torch.randn(63, dtype=dtype)
    assert_close(rms_norm_native(x, w), rms_norm_ref(x, w), dtype)
    assert_close(layer_norm_native(x, w, b), layer_norm_ref(x, w, b), dtype)
    assert_close(layer_norm_native(x), layer_norm_ref(x), dtype)


def test_modules_match_torch_modules(triton_device):
    x = torch.randn(3, 5, 128, device=triton_device)
    ref = torch.nn.LayerNorm(128, device=triton_device)
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
    ours = ops.LayerNorm(128, device=triton_device)
    ours.load_state_dict(ref.state_dict())
    for p in ("native", "kernel"):
        with ops.policy(layer_norm=p):
            torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    assert ops.LayerNorm(128, bias=False).bias is None
    assert ops.RMSNorm(128, elementwise_affine=False).weight is None


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_functional_forms_follow_policy(triton_device, impl):
    x = torch.randn(7, 128, device=triton_device, dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(128, device=triton_device, dtype=torch.bfloat16)
    before = ops.counters[("rms_norm", "eager", impl)]
    with ops.policy(rms_norm=impl, layer_norm=impl):
        y, s = ops.rms_norm(x, w, residual=r)
        z = ops.layer_norm(x, w, w)
    assert ops.counters[("rms_norm", "eager", impl)] == before + 1
    assert_close(s, x.double() + r.double(), torch.bfloat16)
    assert_close(y, rms_norm_ref(s, w), torch.bfloat16)
    assert_close(z, layer_norm_ref(x, w, w), torch.bfloat16)


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_gradients_agree(triton_device, impl):
    # Kernel ops differentiate through their native form: same gradients either way.
    x = torch.randn(7, 63, device=triton_device, requires_grad=True)
    m = ops.RMSNorm(63, policy=impl).to(triton_device)
    with torch.no_grad():
        m.weight.normal_()
    m(x).square().sum().backward()
    ref_x = x.detach().double().requires_grad_()
    ref_w = m.weight.detach().double().requires_grad_()
    rms_norm_ref(ref_x, ref_w).square().sum().backward()
    assert_close(x.grad, ref_x.grad, torch.float32, scale=10)
    assert_close(m.weight.grad, ref_w.grad, torch.float32, scale=10)


def bad_inputs():
    x = torch.randn(4, 64)
    return [
        ("weight", lambda: ops.rms_norm(x, torch.randn(63)), r"weight must have shape \(64,\)"),
        ("bias", lambda: ops.layer_norm(x, torch.randn(64), torch.randn(32)), r"bias must have shape \(64,\)"),
        ("dtype", lambda: ops.rms_norm(torch.randint(0, 9, (4, 64))), "x must be float32, float16 or bfloat16"),
        ("residual", lambda: ops.rms_norm(x, residual=torch.randn(4, 32)), r"residual must have x's shape"),
        ("device", lambda: ops.rms_norm(x, torch.randn(64, device="meta")), "weight is on meta"),
    ]


@pytest.mark.parametrize("case", bad_inputs(), ids=lambda c: c[0])
def test_bad_input_names_the_argument(case):
    _, call, message = case
    with pytest.raises(ValueError, match=message):
        call()
