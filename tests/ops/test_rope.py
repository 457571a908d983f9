import math

import pytest
import torch

from fullgraph import ops
from fullgraph.ops.rope import RotaryEmbedding, apply_rope, qk_norm_rope, rope_native, rope_tables
from tests.kernels.reference import assert_close
from tests.kernels.test_rope import LAYOUTS, make_qk, make_tables, make_x, qk_ref, rope_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotary_dim", [40, 80])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_native_matches_float64(interleaved, layout, rotary_dim, dtype):
    x = make_x(2, 3, 77, 80, layout, "cpu", dtype)
    cos, sin = make_tables(77, rotary_dim, "cpu")
    out = rope_native(x, cos, sin, interleaved, LAYOUTS[layout])
    assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
    assert_close(out, rope_ref(x, cos, sin, interleaved, LAYOUTS[layout]), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotary_dim", [40, 80])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_the_eager_inference_form_matches_the_differentiable_one(interleaved, layout, rotary_dim, dtype):
    # Without autograd the native form writes into x's dtype half by half (out=); with it, the float32 form.
    x = make_x(2, 3, 29, 80, layout, "cpu", dtype)
    cos, sin = make_tables(29, rotary_dim, "cpu")
    saved = x.clone(), cos.clone(), sin.clone()
    fast = rope_native(x, cos, sin, interleaved, LAYOUTS[layout])
    assert all(torch.equal(a, b) for a, b in zip((x, cos, sin), saved, strict=True))
    slow = rope_native(x.clone().requires_grad_(), cos, sin, interleaved, LAYOUTS[layout]).detach()
    assert fast.dtype == slow.dtype == dtype and fast.is_contiguous()
    # float32 math rounded once either way; a fused multiply-add in one can move a float32 result across a rounding
    # boundary of x's dtype: one unit in the last place at most
    torch.testing.assert_close(fast, slow, rtol=torch.finfo(dtype).eps, atol=1e-6)
    assert torch.equal(fast[..., rotary_dim:], x[..., rotary_dim:])


def test_tables_follow_the_formula():
    cos, sin = rope_tables(77, 64, base=500.0)
    assert cos.shape == sin.shape == (77, 32) and cos.dtype == torch.float32
    for n, i in ((0, 0), (1, 0), (5, 3), (76, 31)):
        angle = n * 500.0 ** (-2 * i / 64)
        assert cos[n, i].item() == pytest.approx(math.cos(angle), abs=1e-6)
        assert sin[n, i].item() == pytest.approx(math.sin(angle), abs=1e-6)


def test_tables_are_cached():
    cos, sin = rope_tables(33, 16)
    again = rope_tables(33, 16, 10000.0, None, torch.float32)
    assert again[0] is cos and again[1] is sin
    other = rope_tables(33, 32)
    assert other[0].shape == (33, 16) and not torch.equal(other[0][:, :8], cos[:, :8])
    assert not torch.equal(rope_tables(33, 16, base=100.0)[0], cos)
    assert rope_tables(33, 16, dtype=torch.float64)[0].dtype == torch.float64
    m1, m2 = RotaryEmbedding(16, max_seq_len=33), RotaryEmbedding(16, max_seq_len=33)
    assert m1.cos is m2.cos is cos


def test_tables_built_in_inference_mode_support_backward():
    with torch.inference_mode():
        cos, sin = rope_tables(11, 8, base=123.0)
    x = torch.randn(1, 2, 11, 8, requires_grad=True)
    apply_rope(x, cos, sin).sum().backward()
    assert x.grad is not None


def test_relative_positions():
    # The point of RoPE: <rope(q) at m, rope(k) at n> depends only on m - n.
    cos, sin = rope_tables(20, 64)
    q, k = torch.randn(64, dtype=torch.float64), torch.randn(64, dtype=torch.float64)
    rows = torch.stack([q, k]).expand(20, 2, 64).transpose(0, 1)[None]  # [1, 2, 20, 64]: q, k at every position
    for interleaved in (False, True):
        out = rope_native(rows, cos, sin, interleaved, 2)[0]  # float32 math
        scores = [(out[0, m] @ out[1, m - 3]).item() for m in (3, 9, 19)]
        # float32 rounding scales with |q||k|, not with the score (which can be near 0): a relative bound on the
        # score failed 22 times in 4000 draws, this bound none
        assert scores == pytest.approx([scores[0]] * 3, abs=1e-5 * (q.norm() * k.norm()).item())
        # ...and it does depend on m - n: over offsets 0..19 the score moves by a sizeable share of |q||k|
        # (one pair of offsets can coincide by chance; the whole range cannot, for random q and k)
        by_offset = torch.stack([out[0, m] @ out[1, 0] for m in range(20)])
        assert (by_offset.max() - by_offset.min()).item() > 0.05 * (q.norm() * k.norm()).item()


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_apply_rope_follows_policy(triton_device, impl):
    x = make_x(2, 3, 7, 64, "bsnd", triton_device, torch.bfloat16)
    cos, sin = make_tables(7, 32, triton_device)
    before = ops.counters[("rope", "eager", impl)]
    with ops.policy(rope=impl):
        out = apply_rope(x, cos, sin, interleaved=True, layout="bsnd")
    assert ops.counters[("rope", "eager", impl)] == before + 1
    assert_close(out, rope_ref(x, cos, sin, True, 1), torch.bfloat16)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_module_matches_reference(triton_device, impl, layout):
    m = RotaryEmbedding(48, max_seq_len=100, base=1000.0, interleaved=True, layout=layout, policy=impl)
    m = m.to(triton_device)
    x = make_x(2, 3, 77, 64, layout, triton_device, torch.float16)
    cos, sin = rope_tables(77, 48, base=1000.0, device=triton_device)
    assert_close(m(x), rope_ref(x, cos, sin, True, LAYOUTS[layout]), torch.float16)
    assert m.state_dict() == {}
    assert "rotary_dim=48" in repr(m) and f"policy={impl}" in repr(m)


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_gradients_agree(triton_device, impl):
    # The kernel op differentiates through its native form: same gradients as float64 either way.
    x = make_x(2, 3, 7, 80, "bnsd", triton_device).requires_grad_()
    cos, sin = (t.requires_grad_() for t in make_tables(7, 48, triton_device))
    with ops.policy(rope=impl):
        out = apply_rope(x, cos, sin)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    refs = [t.detach().double().requires_grad_() for t in (x, cos, sin)]
    rope_ref(*refs, False, 2).backward(grad_out.double())
    for got, ref in zip((x, cos, sin), refs, strict=True):
        assert_close(got.grad, ref.grad, torch.float32, scale=10)


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_compiles_without_graph_breaks(triton_device, impl):
    torch._dynamo.reset()
    m = RotaryEmbedding(32, max_seq_len=16, layout="bsnd", policy=impl).to(triton_device)
    x = make_x(2, 3, 9, 48, "bsnd", triton_device)
    eager = m(x)
    before = ops.counters[("rope", "compiled", impl)]
    compiled = torch.compile(m, fullgraph=True)(x)
    assert ops.counters[("rope", "compiled", impl)] == before + 1
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    assert torch._dynamo.explain(m)(x).graph_break_count == 0


def bad_inputs():
    x = torch.randn(2, 3, 7, 64)
    cos, sin = torch.randn(7, 16), torch.randn(7, 16)
    return [
        ("rotary_dim_too_large", lambda: apply_rope(x, torch.randn(7, 40), torch.randn(7, 40)), "rotary_dim = 80"),
        ("odd_rotary_dim", lambda: RotaryEmbedding(7), "rotary_dim must be a positive even number"),
        ("odd_table_dim", lambda: rope_tables(7, 5), "rotary_dim must be a positive even number"),
        ("cos_length", lambda: apply_rope(x, torch.randn(8, 16), sin), r"cos must have shape \[N, rotary_dim / 2\]"),
        ("cos_ndim", lambda: apply_rope(x, torch.randn(7, 16, 1), sin), r"cos must have shape .*N = 7"),
        ("sin_shape", lambda: apply_rope(x, cos, torch.randn(7, 8)), r"sin must have cos's shape \(7, 16\)"),
        ("x_ndim", lambda: apply_rope(x[0], cos, sin), r"x must be 4-D \[B, H, N, D\]"),
        ("x_dtype", lambda: apply_rope(torch.randint(0, 9, (2, 3, 7, 64)), cos, sin), "x must be float32"),
        ("cos_dtype", lambda: apply_rope(x, torch.randint(0, 9, (7, 16)), sin), "cos must be a floating-point"),
        ("device", lambda: apply_rope(x, cos, sin.to("meta")), "sin is on meta"),
        ("layout", lambda: apply_rope(x, cos, sin, layout="bhsd"), "layout must be 'bnsd'"),
        ("module_layout", lambda: RotaryEmbedding(16, layout="sbhd"), "layout must be 'bnsd'"),
        ("max_seq_len", lambda: RotaryEmbedding(32, max_seq_len=5)(x), "max_seq_len = 5"),
        ("module_head_dim", lambda: RotaryEmbedding(128)(x), "exceeds x's head dim D = 64"),
    ]


@pytest.mark.parametrize("case", bad_inputs(), ids=lambda c: c[0])
def test_bad_input_names_the_argument(case):
    _, call, message = case
    with pytest.raises(ValueError, match=message):
        call()


# ---- qk_norm_rope ------------------------------------------------------------------------------------------------


def qk_case(device, dtype=torch.float32, layout="bsnd"):
    q, k = make_qk(2, 4, 2, 9, 64, layout, device, dtype)
    qw, kw = (torch.rand(64, device=device, dtype=dtype) + 0.5 for _ in range(2))
    cos, sin = make_tables(9, 48, device)
    return q, k, qw, kw, cos, sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_qk_norm_rope_native_matches_float64(layout, dtype):
    q, k, qw, kw, cos, sin = qk_case("cpu", dtype, layout)
    with ops.policy(qk_norm_rope="native"):
        q_out, k_out = qk_norm_rope(q, k, qw, kw, cos, sin, eps=1e-5, interleaved=True, layout=layout)
    assert_close(q_out, qk_ref(q, qw, 1e-5, cos, sin, True, LAYOUTS[layout]), dtype)
    assert_close(k_out, qk_ref(k, kw, 1e-5, cos, sin, True, LAYOUTS[layout]), dtype)


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_qk_norm_rope_follows_its_policy_and_counts_one_call(triton_device, impl):
    q, k, qw, kw, cos, sin = qk_case(triton_device, torch.bfloat16)
    before = dict(ops.counters)
    with ops.policy(qk_norm_rope=impl):
        q_out, k_out = qk_norm_rope(q, k, qw, kw, cos, sin, layout="bsnd")
    added = {key: n - before.get(key, 0) for key, n in ops.counters.items() if n != before.get(key, 0)}
    assert added == {("qk_norm_rope", "eager", impl): 1}  # one op, not its norms and rotations counted apart
    assert_close(q_out, qk_ref(q, qw, 1e-6, cos, sin, False, 1), torch.bfloat16)
    assert_close(k_out, qk_ref(k, kw, 1e-6, cos, sin, False, 1), torch.bfloat16)


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_qk_norm_rope_gradients_agree(triton_device, impl):
    q, k, qw, kw, cos, sin = qk_case(triton_device, layout="bnsd")
    leaves = [t.requires_grad_() for t in (q, k, qw, kw)]
    with ops.policy(qk_norm_rope=impl):
        q_out, k_out = qk_norm_rope(q, k, qw, kw, cos, sin)
    gq, gk = torch.randn_like(q_out), torch.randn_like(k_out)
    torch.autograd.backward((q_out, k_out), (gq, gk))
    refs = [t.detach().double().requires_grad_() for t in leaves]
    torch.autograd.backward(
        (qk_ref(refs[0], refs[2], 1e-6, cos, sin, False, 2), qk_ref(refs[1], refs[3], 1e-6, cos, sin, False, 2)),
        (gq.double(), gk.double()),
    )
    for got, ref in zip(leaves, refs, strict=True):
        assert_close(got.grad, ref.grad, torch.float32, scale=10)


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_qk_norm_rope_compiles_without_graph_breaks(triton_device, impl):
    torch._dynamo.reset()
    q, k, qw, kw, cos, sin = qk_case(triton_device)

    def f(q, k):
        return qk_norm_rope(q, k, qw, kw, cos, sin, layout="bsnd")

    with ops.policy(qk_norm_rope=impl):
        eager = f(q, k)
        before = ops.counters[("qk_norm_rope", "compiled", impl)]
        compiled = torch.compile(f, fullgraph=True)(q, k)
        assert ops.counters[("qk_norm_rope", "compiled", impl)] == before + 1
        assert torch._dynamo.explain(f)(q, k).graph_break_count == 0
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def qk_bad_inputs():
    q, k, qw, kw, cos, sin = qk_case("cpu", layout="bnsd")
    return [
        ("k_dtype", lambda: qk_norm_rope(q, k.half(), qw, kw, cos, sin), "q and k must have one dtype"),
        ("k_length", lambda: qk_norm_rope(q, k[:, :, :5], qw, kw, cos, sin), "k must match q in batch, sequence"),
        ("one_weight", lambda: qk_norm_rope(q, k, qw, None, cos, sin), "give both q_weight and k_weight"),
        ("weight_shape", lambda: qk_norm_rope(q, k, qw[:32], kw, cos, sin), r"q_weight must have shape \(64,\)"),
        ("weight_dtype", lambda: qk_norm_rope(q, k, qw, kw.long(), cos, sin), "k_weight must be float32"),
        ("k_device", lambda: qk_norm_rope(q, k.to("meta"), qw, kw, cos, sin), "k is on meta"),
        ("cos_length", lambda: qk_norm_rope(q, k, qw, kw, cos[:4], sin), r"cos must have shape \[N, rotary_dim / 2\]"),
        ("k_ndim", lambda: qk_norm_rope(q, k[0], qw, kw, cos, sin), r"x must be 4-D"),
    ]


@pytest.mark.parametrize("case", qk_bad_inputs(), ids=lambda c: c[0])
def test_qk_norm_rope_bad_input_names_the_argument(case):
    _, call, message = case
    with pytest.raises(ValueError, match=message):
        call()
