"""linear_gelu: numerics against float64, the epilogue's conditions, errors, and one GEMM inside a compiled graph."""

import pytest
import torch
import torch.nn.functional as F

from fullgraph import ops
from fullgraph.errors import UsageError
from fullgraph.ops.linear import LinearGELU, epilogue_applies, linear_gelu
from tests.kernels.reference import rel_err
from tests.skips import requires_cuda


def reference(x, w, b, approximate):
    return F.gelu(F.linear(x.double(), w.double(), None if b is None else b.double()), approximate=approximate)


def device_for(policy: str, request) -> str:
    """Where a test of `policy` runs: policy kernel needs a device our kernels run on (a GPU, or the CPU under
    TRITON_INTERPRET=1: `triton_device`); the native form runs on the CPU anywhere."""
    return request.getfixturevalue("triton_device") if policy == "kernel" else "cpu"


def fp32_tol(device: str) -> float:
    """float32 against float64: 1e-6 on the CPU; a GPU's float32 tanh GELU measured 1.6e-6 and 2.7e-6 on an H100
    (torch 2.11), so 5e-6 there, still 20x below the gap between the two GELU forms (checked below)."""
    return 1e-6 if device == "cpu" else 5e-6


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("policy", ["native", "kernel"])
def test_matches_float64_on_odd_shapes(approximate, policy, request):
    device = device_for(policy, request)
    x, w, b = (t.to(device) for t in (torch.randn(3, 5, 37), torch.randn(29, 37) / 6, torch.randn(29)))
    with ops.policy(linear_gelu=policy):
        out = linear_gelu(x, w, b, approximate)
    assert out.shape == (3, 5, 29)
    assert rel_err(out, reference(x, w, b, approximate)) < fp32_tol(device)
    # the two GELU forms differ by far more than that, so a swapped approximation would fail here
    other = "tanh" if approximate == "none" else "none"
    assert rel_err(out, reference(x, w, b, other)) > 1e-4


def test_the_epilogue_applies_only_where_cublaslt_computes_the_same_function():
    x, w, b = torch.randn(4, 8), torch.randn(16, 8), torch.randn(16)
    assert not epilogue_applies(x, w, b, "tanh")  # the CPU's _addmm_activation computes the erf GELU
    meta = [t.to("meta") for t in (x, w, b)]
    assert not epilogue_applies(*meta, "tanh")


def test_module_loads_an_nn_linear_state_dict_and_counts_its_policy():
    linear = torch.nn.Linear(24, 40)
    module = LinearGELU(24, 40, approximate="none", policy="native")
    module.load_state_dict(linear.state_dict())
    x = torch.randn(7, 24)
    before = ops.counters[("linear_gelu", "eager", "native")]
    torch.testing.assert_close(module(x), F.gelu(linear(x)), rtol=1e-6, atol=1e-6)
    assert ops.counters[("linear_gelu", "eager", "native")] == before + 1
    assert "approximate='none'" in repr(module)


def test_bad_inputs_name_the_problem():
    x, w = torch.randn(4, 8), torch.randn(16, 8)
    with pytest.raises(UsageError, match="approximate='erf'"):
        linear_gelu(x, w, None, "erf")
    with pytest.raises(UsageError, match="weight must be \\[out, in\\]"):
        linear_gelu(x, torch.randn(16, 9))
    with pytest.raises(UsageError, match="bias must be \\[out\\] = \\[16\\]"):
        linear_gelu(x, w, torch.randn(8))
    with pytest.raises(UsageError, match="x must be float32"):
        linear_gelu(x.long(), w)


@pytest.mark.parametrize("policy", ["native", "kernel", "auto"])
def test_compiles_without_a_break(policy, request):
    torch._dynamo.reset()
    device = device_for(policy, request)
    module = LinearGELU(32, 48).to(device)
    x = torch.randn(2, 9, 32, device=device)
    with ops.policy(linear_gelu=policy), torch.no_grad():
        explained = torch._dynamo.explain(module)(x)
        out = torch.compile(module, fullgraph=True, backend="eager")(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert rel_err(out, reference(x, module.weight, module.bias, "tanh")) < fp32_tol(device)


@requires_cuda
@pytest.mark.parametrize("shape", [(1, 1024, 256), (3, 37, 200)])  # the second: rows and columns cuBLASLt may refuse
def test_gpu_epilogue_in_bf16_is_as_accurate_as_the_two_passes(shape):
    b_, n, k = shape
    x = torch.randn(b_, n, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(4 * k + 8, k, device="cuda") / k**0.5).bfloat16()
    b = torch.randn(4 * k + 8, device="cuda", dtype=torch.bfloat16)
    ref = reference(x, w, b, "tanh")
    with torch.no_grad():
        assert epilogue_applies(x, w, b, "tanh")
        with ops.policy(linear_gelu="kernel"):
            fused = linear_gelu(x, w, b)
        with ops.policy(linear_gelu="native"):
            plain = linear_gelu(x, w, b)
    assert rel_err(fused, ref) <= 1.1 * rel_err(plain, ref) + 1e-4


@requires_cuda
def test_gpu_compiled_graph_calls_one_fused_gemm():
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    module = LinearGELU(256, 1024).cuda().bfloat16()
    x = torch.randn(2, 64, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        codes = {}
        for policy in ("kernel", "native"):
            with ops.policy(linear_gelu=policy):
                out, code = run_and_get_code(torch.compile(module, fullgraph=True), x)
            codes[policy] = "\n".join(code)
            assert rel_err(out, reference(x, module.weight, module.bias, "tanh")) < 1e-2
    assert "_addmm_activation" in codes["kernel"] and "_addmm_activation" not in codes["native"]
