"""Attention in the op-policy vocabulary: `policy(attention=...)`, `set_policy(all=...)` and FULLGRAPH_OPS reach
it (native = torch's SDPA, kernel = our Triton kernel, auto = measured); an explicit `backend=` still pins one."""

import math

import pytest
import torch

from fullgraph import env, ops
from fullgraph.errors import FullgraphError
from fullgraph.ops import counters, policies
from fullgraph.ops.attention import Attention, attention
from fullgraph.ops.attention_backends import clear_memory
from tests.kernels.reference import assert_close
from tests.ops.test_attention import reference


@pytest.fixture(autouse=True)
def fresh_choices(tmp_path, monkeypatch):
    monkeypatch.setenv("FULLGRAPH_CACHE_DIR", str(tmp_path))
    clear_memory()
    saved = policies.snapshot()
    yield
    policies.restore(saved)  # set_policy's class defaults undone for the other tests
    clear_memory()


def qkv(device="cpu", n=37, d=32, dtype=torch.float32):
    return [torch.randn(2, 3, n, d, device=device, dtype=dtype) for _ in range(3)]


def ran(kind: str = "eager") -> dict[str, int]:
    return {key[2]: c for key, c in counters.items() if key[:2] == ("attention", kind)}


def test_native_policy_runs_torch_sdpa_and_matches_fp64():
    q, k, v = qkv()
    before = ran().get("sdpa", 0)
    with ops.policy(attention="native"):
        out = attention(q, k, v, causal=True)
    assert ran().get("sdpa", 0) == before + 1
    assert_close(out, reference(q, k, v, True, None, 1 / math.sqrt(q.shape[-1])), torch.float32)


def test_set_policy_all_reaches_attention_and_backend_pins_over_it():
    q, k, v = qkv()
    ops.set_policy(all="native")
    before = ran()
    attention(q, k, v)
    attention(q, k, v, backend="sdpa-math")  # pinned: the policy does not apply
    after = ran()
    assert after.get("sdpa", 0) == before.get("sdpa", 0) + 1
    assert after.get("sdpa-math", 0) == before.get("sdpa-math", 0) + 1


def test_kernel_policy_runs_ours_or_says_why_not(request):
    if env.has_triton() and (env.has_cuda() or env.triton_interpret()):
        device = request.getfixturevalue("triton_device")
        q, k, v = qkv(device)
        before = ran().get("triton", 0)
        with ops.policy(attention="kernel"):
            out = attention(q, k, v)
        assert ran().get("triton", 0) == before + 1
        assert_close(out, reference(q, k, v, False, None, 1 / math.sqrt(q.shape[-1])), torch.float32)
    else:  # no kernel runs here: the one clear error the other ops give
        with ops.policy(attention="kernel"), pytest.raises(FullgraphError, match="attention: policy 'kernel'"):
            attention(*qkv())


def test_attention_module_follows_the_policy_under_torch_compile():
    torch.manual_seed(0)
    module = Attention(64, 4, qk_norm=True).eval()
    x = torch.randn(2, 19, 64)
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    before = ran("compiled")
    with ops.policy(attention="native"), torch.no_grad():
        out = compiled(x)
        expected = module(x)
    assert ran("compiled").get("sdpa", 0) == before.get("sdpa", 0) + 1  # traced once with torch's SDPA
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_policy_rejects_an_unknown_op_and_knows_attention():
    with pytest.raises(Exception, match="unknown op"), ops.policy(atention="native"):
        pass
    with ops.policy(attention="native"):  # no error: attention is a known op
        pass
