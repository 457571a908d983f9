import pytest
import torch

from fullgraph.errors import UsageError
from fullgraph.ops import counters, policy
from fullgraph.ops.modulation import (
    GatedResidual,
    Modulate,
    gated_residual,
    gated_residual_native,
    layer_norm_modulate,
    modulate,
    modulate_native,
)
from tests.kernels.reference import assert_close as ref_close
from tests.kernels.test_layer_norm import layer_norm_modulate_ref
from tests.kernels.test_modulate import FORMS, assert_close, form_shapes, gated_residual_ref, modulate_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", FORMS)
def test_natives_match_float64(form, dtype):
    x_shape, p_shape = form_shapes(form, 63)
    x, h = torch.randn(x_shape, dtype=dtype) * 2 + 0.5, torch.randn(x_shape, dtype=dtype)
    shift, scale = torch.randn(p_shape, dtype=dtype), torch.randn(p_shape, dtype=dtype)
    y = modulate_native(x, shift, scale)
    assert y.dtype == dtype and y.shape == x.shape
    assert_close(y, modulate_ref(x, shift, scale), dtype)
    assert_close(gated_residual_native(x, h, scale), gated_residual_ref(x, h, scale), dtype)


def test_natives_take_float32_params_with_bfloat16_x():
    x = torch.randn(2, 15, 128, dtype=torch.bfloat16)
    shift, scale = torch.randn(2, 3, 1, 128), torch.randn(2, 3, 1, 128)
    y = modulate_native(x, shift, scale)
    assert y.dtype == torch.bfloat16
    assert_close(y, modulate_ref(x, shift, scale), torch.bfloat16)


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_functional_forms_and_modules_follow_policy(triton_device, impl):
    x = torch.randn(2, 3, 5, 64, device=triton_device, dtype=torch.bfloat16)
    h = torch.randn_like(x)
    shift, scale, gate = torch.randn(3, 2, 3, 1, 64, device=triton_device).unbind(0)
    before = {op: counters[(op, "eager", impl)] for op in ("modulate", "gated_residual")}
    with policy(modulate=impl, gated_residual=impl):
        outs = [modulate(x, shift, scale), Modulate()(x, shift, scale)]
        gated = [gated_residual(x, h, gate), GatedResidual()(x, h, gate)]
    assert {op: counters[(op, "eager", impl)] - n for op, n in before.items()} == {"modulate": 2, "gated_residual": 2}
    for y in outs:
        assert_close(y, modulate_ref(x, shift, scale), torch.bfloat16)
    for y in gated:
        assert_close(y, gated_residual_ref(x, h, gate), torch.bfloat16)


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_gradients_agree(triton_device, impl):
    # Kernel ops differentiate through their native form: same gradients either way.
    leaves = [torch.randn(s, device=triton_device, requires_grad=True) for s in [(2, 6, 32), (2, 6, 32)]]
    leaves += [torch.randn(2, 3, 1, 32, device=triton_device, requires_grad=True) for _ in range(3)]
    x, h, shift, scale, gate = leaves
    with policy(modulate=impl, gated_residual=impl):
        gated_residual(x, modulate(h, shift, scale), gate).square().sum().backward()
    refs = [t.detach().double().requires_grad_() for t in leaves]
    rx, rh, rshift, rscale, rgate = refs
    gated_residual_ref(rx, modulate_ref(rh, rshift, rscale), rgate).square().sum().backward()
    for ours, ref in zip(leaves, refs, strict=True):
        assert_close(ours.grad, ref.grad, torch.float32)


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_dit_block_compiles_without_graph_breaks(triton_device, impl):
    torch._dynamo.reset()
    c = 64
    attn = torch.nn.Linear(c, c, device=triton_device)
    ada = torch.nn.Linear(c, 3 * c, device=triton_device)

    def block(x, cond):
        shift, scale, gate = ada(cond).chunk(3, dim=-1)  # each [B, C], row stride 3C
        return gated_residual(x, attn(modulate(x, shift, scale)), gate)

    x, cond = torch.randn(2, 7, c, device=triton_device), torch.randn(2, c, device=triton_device)
    with policy(modulate=impl, gated_residual=impl), torch.no_grad():
        expect = block(x, cond)
        assert torch._dynamo.explain(block)(x, cond).graph_break_count == 0
        before = counters[("gated_residual", "compiled", impl)]
        got = torch.compile(block, fullgraph=True)(x, cond)
        assert counters[("gated_residual", "compiled", impl)] == before + 1
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)
    # the eager result itself is right, so matching it means something
    shift, scale, gate = ada(cond).detach().chunk(3, dim=-1)
    ref = gated_residual_ref(x, attn(modulate_ref(x, shift, scale).float()).detach(), gate)
    assert_close(expect, ref, torch.float32)


def bad_inputs():
    x, p = torch.randn(2, 6, 8), torch.randn(2, 8)
    frames = torch.randn(2, 4, 1, 8)
    return [
        ("last_dim", lambda: modulate(x, torch.randn(2, 7), torch.randn(2, 7)), "shift must end in .* C=8"),
        ("gate_last_dim", lambda: gated_residual(x, x, torch.randn(2, 1, 9)), "gate must end in .* C=8"),
        ("shapes_differ", lambda: modulate(x, p, p[:, None]), r"shift and scale must have the same shape"),
        ("form", lambda: modulate(x, torch.randn(3, 8), torch.randn(3, 8)), r"shift has shape \(3, 8\).*\[B, C\]"),
        ("form_4d", lambda: modulate(x.view(2, 2, 3, 8), p, p), r"shift has shape \(2, 8\).*accepted"),
        ("frames", lambda: gated_residual(x, x, frames), "gate has 4 frames .* N=6 tokens"),
        ("frames_4d", lambda: modulate(x.view(2, 2, 3, 8), frames, frames), r"shift has shape \(2, 4, 1, 8\)"),
        ("h", lambda: gated_residual(x, x[:, :5], p), r"h must have x's shape \(2, 6, 8\)"),
        ("x_dim", lambda: modulate(x[0], p, p), r"x must have shape \[B, N, C\] or \[B, T, S, C\]"),
        ("x_dtype", lambda: modulate(x.int(), p, p), "x must be float32, float16 or bfloat16"),
        ("scale_dtype", lambda: modulate(x, p, p.long()), "scale must be float32, float16 or bfloat16"),
        ("gate_dtype", lambda: gated_residual(x, x, p.int()), "gate must be float32, float16 or bfloat16"),
        ("device", lambda: modulate(x, p.to("meta"), p), "shift is on meta"),
        ("h_device", lambda: gated_residual(x, x.to("meta"), p), "h is on meta"),
        ("module", lambda: Modulate(policy="native")(x, p, torch.randn(2, 9)), "shift and scale must have"),
        ("gate_module", lambda: GatedResidual(policy="native")(x, x, torch.randn(3, 8)), r"gate has shape \(3, 8\)"),
    ]


@pytest.mark.parametrize("case", bad_inputs(), ids=lambda c: c[0])
def test_bad_input_names_the_argument(case):
    _, call, message = case
    with pytest.raises(UsageError, match=message):
        call()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", FORMS)
def test_the_one_pass_eager_forms_leave_inputs_alone_and_match_the_differentiable_ones(form, dtype):
    # Eager inference writes the result straight into x's dtype (`out=`); with grad it takes the float32 form.
    x_shape, p_shape = form_shapes(form, 33)
    x, h = torch.randn(x_shape, dtype=dtype), torch.randn(x_shape, dtype=dtype)
    shift, scale = torch.randn(p_shape, dtype=dtype), torch.randn(p_shape, dtype=dtype)
    before = [t.clone() for t in (x, h, shift, scale)]
    fast = modulate_native(x, shift, scale), gated_residual_native(x, h, scale)
    for t, b in zip((x, h, shift, scale), before, strict=True):
        assert torch.equal(t, b)  # nothing written into the inputs (a float32 scale's .float() is itself)
    leaves = [t.clone().requires_grad_() for t in (x, h, shift, scale)]
    slow = modulate_native(leaves[0], leaves[2], leaves[3]), gated_residual_native(leaves[0], leaves[1], leaves[3])
    for f, s in zip(fast, slow, strict=True):
        assert f.dtype == s.dtype == dtype and f.shape == s.shape
        torch.testing.assert_close(f, s.detach(), rtol=0, atol=0)  # both: float32 math, one rounding


# ---- layer_norm_modulate -----------------------------------------------------------------------------------------


def lnm_case(form, c, dtype, device="cpu"):
    x_shape, p_shape = form_shapes(form, c)
    x, h = torch.randn(x_shape, device=device, dtype=dtype) * 2 + 1, torch.randn(x_shape, device=device, dtype=dtype)
    gate, shift, scale = (torch.randn(p_shape, device=device, dtype=dtype) for _ in range(3))
    return x, h, gate, shift, scale


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", FORMS)
def test_layer_norm_modulate_native_matches_float64(form, dtype):
    x, h, gate, shift, scale = lnm_case(form, 48, dtype)
    with policy(layer_norm_modulate="native"):
        y0 = layer_norm_modulate(x, shift, scale)
        y, s = layer_norm_modulate(x, shift, scale, h=h, gate=gate)
    ref_close(y0, layer_norm_modulate_ref(x, shift, scale)[0], dtype, scale=2)
    ref_close(s, gated_residual_ref(x, h, gate), dtype)
    ref_close(y, layer_norm_modulate_ref(s, shift, scale)[0], dtype, scale=2)


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_layer_norm_modulate_follows_its_policy_and_counts_one_call(triton_device, impl):
    x, h, gate, shift, scale = lnm_case("B_1_C", 64, torch.bfloat16, triton_device)
    before = dict(counters)
    with policy(layer_norm_modulate=impl):
        y, s = layer_norm_modulate(x, shift, scale, h=h, gate=gate)
    added = {key: n - before.get(key, 0) for key, n in counters.items() if n != before.get(key, 0)}
    assert added == {("layer_norm_modulate", "eager", impl): 1}  # one op, not its three parts
    ref_close(s, layer_norm_modulate_ref(x, shift, scale, h, gate)[1], torch.bfloat16)
    ref_close(y, layer_norm_modulate_ref(s, shift, scale)[0], torch.bfloat16, scale=2)


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_layer_norm_modulate_of_two_branches_is_their_one_sum(triton_device, impl):
    # s = x + gate * h + gate2 * h2: a DiT block's two gated residuals in one op (the stream rounded once a block)
    x, h, gate, shift, scale = lnm_case("B_1_C", 72, torch.bfloat16, triton_device)
    h2, gate2 = torch.randn_like(h), torch.randn_like(gate)
    before = dict(counters)
    with policy(layer_norm_modulate=impl):
        y, s = layer_norm_modulate(x, shift, scale, h=h, gate=gate, h2=h2, gate2=gate2)
    added = {key: n - before.get(key, 0) for key, n in counters.items() if n != before.get(key, 0)}
    assert added == {("layer_norm_modulate", "eager", impl): 1}
    s_ref = layer_norm_modulate_ref(x, shift, scale, h, gate, h2=h2, gate2=gate2)[1]
    ref_close(s, s_ref, torch.bfloat16, scale=2)
    ref_close(y, layer_norm_modulate_ref(s, shift, scale)[0], torch.bfloat16, scale=2)


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_layer_norm_modulate_without_the_sum_returns_y_alone(triton_device, impl):
    x, h, gate, shift, scale = lnm_case("B_1_C", 72, torch.bfloat16, triton_device)
    h2, gate2 = torch.randn_like(h), torch.randn_like(gate)
    with policy(layer_norm_modulate=impl):
        y, _ = layer_norm_modulate(x, shift, scale, h=h, gate=gate, h2=h2, gate2=gate2)
        alone = layer_norm_modulate(x, shift, scale, h=h, gate=gate, h2=h2, gate2=gate2, return_sum=False)
    assert isinstance(alone, torch.Tensor)
    torch.testing.assert_close(alone, y, rtol=0, atol=0)


@pytest.mark.parametrize("branches", [1, 2])
@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_layer_norm_modulate_gradients_agree(triton_device, impl, branches):
    x, h, gate, shift, scale = (t.requires_grad_() for t in lnm_case("frames", 40, torch.float32, triton_device))
    extra = [torch.randn_like(h).requires_grad_(), torch.randn_like(gate).requires_grad_()] if branches == 2 else []
    with policy(layer_norm_modulate=impl):
        y, s = layer_norm_modulate(x, shift, scale, h=h, gate=gate, **dict(zip(("h2", "gate2"), extra, strict=False)))
    gy, gs = torch.randn_like(y), torch.randn_like(s)
    torch.autograd.backward((y, s), (gy, gs))
    leaves = (x, h, gate, shift, scale, *extra)
    refs = [t.detach().double().requires_grad_() for t in leaves]
    y_ref, s_ref = layer_norm_modulate_ref(refs[0], refs[3], refs[4], refs[1], refs[2], 1e-6, *refs[5:])
    torch.autograd.backward((y_ref, s_ref), (gy.double(), gs.double()))
    for got, ref in zip(leaves, refs, strict=True):
        ref_close(got.grad, ref.grad, torch.float32)


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_layer_norm_modulate_compiles_without_graph_breaks(triton_device, impl):
    torch._dynamo.reset()
    x, h, gate, shift, scale = lnm_case("B_C", 64, torch.float32, triton_device)

    def f(x, h):
        y, s = layer_norm_modulate(x, shift, scale, h=h, gate=gate)
        return layer_norm_modulate(s, shift, scale) + y

    with policy(layer_norm_modulate=impl):
        eager = f(x, h)
        before = counters[("layer_norm_modulate", "compiled", impl)]
        compiled = torch.compile(f, fullgraph=True)(x, h)
        assert counters[("layer_norm_modulate", "compiled", impl)] == before + 2
        assert torch._dynamo.explain(f)(x, h).graph_break_count == 0
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def lnm_bad_inputs():
    x, h, gate, shift, scale = lnm_case("B_1_C", 16, torch.float32)
    return [
        ("h_without_gate", lambda: layer_norm_modulate(x, shift, scale, h=h), "give h and gate together"),
        (
            "h2_without_gate2",
            lambda: layer_norm_modulate(x, shift, scale, h=h, gate=gate, h2=h),
            "give h2 and gate2 together",
        ),
        ("h2_without_h", lambda: layer_norm_modulate(x, shift, scale, h2=h, gate2=gate), "give h and gate too"),
        (
            "gate2_shape",
            lambda: layer_norm_modulate(x, shift, scale, h=h, gate=gate, h2=h, gate2=gate[:, 0]),
            "gate2 must have shift's",
        ),
        ("gate_shape", lambda: layer_norm_modulate(x, shift, scale, h=h, gate=gate[:, 0]), "gate must have shift's"),
        ("h_shape", lambda: layer_norm_modulate(x, shift, scale, h=h[:, :1], gate=gate), "h must have x's shape"),
        ("scale_shape", lambda: layer_norm_modulate(x, shift, scale[..., :8]), "shift and scale must have the same"),
        ("x_dtype", lambda: layer_norm_modulate(x.long(), shift, scale), "x must be float32"),
    ]


@pytest.mark.parametrize("case", lnm_bad_inputs(), ids=lambda c: c[0])
def test_layer_norm_modulate_bad_input_names_the_argument(case):
    _, call, message = case
    with pytest.raises(UsageError, match=message):
        call()


@pytest.mark.parametrize("impl", ["native", "kernel"])
def test_layer_norm_modulate_without_the_sum_has_the_gradients_of_y(triton_device, impl):
    x, h, gate, shift, scale = (t.requires_grad_() for t in lnm_case("frames", 40, torch.float32, triton_device))
    with policy(layer_norm_modulate=impl):
        y = layer_norm_modulate(x, shift, scale, h=h, gate=gate, return_sum=False)
    gy = torch.randn_like(y)
    y.backward(gy)
    refs = [t.detach().double().requires_grad_() for t in (x, h, gate, shift, scale)]
    layer_norm_modulate_ref(refs[0], refs[3], refs[4], refs[1], refs[2])[0].backward(gy.double())
    for got, ref in zip((x, h, gate, shift, scale), refs, strict=True):
        ref_close(got.grad, ref.grad, torch.float32)
