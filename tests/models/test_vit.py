"""fullgraph.models.vit: the ops-built ViT and its plain twin against an fp64 reference written here from a state dict
with timm's names and layout, the state-dict round trips, AutoDrivingViT's two outputs, fullgraph=True with zero
breaks, bad input, and timm's own model where timm is installed."""

import math

import pytest
import torch
import torch.nn.functional as F

import fullgraph.models.vit as vit_module
from fullgraph import ops
from fullgraph.errors import UsageError
from fullgraph.models import AutoDrivingViT, PlainViT, ViT, load_timm_state_dict, vit_b16, vit_l16, vit_small, vit_tiny
from fullgraph.models.vit import config
from fullgraph.ops import direct
from tests.models._counts import buffer_bytes, inductor_buffers, policy_counts
from tests.skips import requires_cuda

SMALL = {"dim": 64, "heads": 4, "depth": 2, "patch": 8, "num_classes": 7}
SIZES = {"square": 32, "wide": (24, 40)}  # (24, 40): a 3 x 5 grid, so a transposed patch order shows


def timm_state_dict(cfg) -> dict[str, torch.Tensor]:
    """Random weights under timm's VisionTransformer names and shapes (the conv patch weight [D, C, p, p]); norms
    and biases random too, matrices scaled by 1/sqrt(fan-in) so activations stay O(1)."""
    d, c, p, hidden = cfg.dim, cfg.in_chans, cfg.patch, cfg.hidden
    shapes = {"cls_token": (1, 1, d), "pos_embed": (1, cfg.tokens, d)}
    shapes |= {"patch_embed.proj.weight": (d, c, p, p), "patch_embed.proj.bias": (d,)}
    for i in range(cfg.depth):
        b = f"blocks.{i}."
        shapes |= {b + "norm1.weight": (d,), b + "norm1.bias": (d,), b + "norm2.weight": (d,), b + "norm2.bias": (d,)}
        shapes |= {b + "attn.qkv.weight": (3 * d, d), b + "attn.qkv.bias": (3 * d,)}
        shapes |= {b + "attn.proj.weight": (d, d), b + "attn.proj.bias": (d,)}
        shapes |= {b + "mlp.fc1.weight": (hidden, d), b + "mlp.fc1.bias": (hidden,)}
        shapes |= {b + "mlp.fc2.weight": (d, hidden), b + "mlp.fc2.bias": (d,)}
    shapes |= {
        "norm.weight": (d,),
        "norm.bias": (d,),
        "head.weight": (cfg.num_classes, d),
        "head.bias": (cfg.num_classes,),
    }
    sd = {}
    for name, shape in shapes.items():
        t = torch.randn(shape)
        if name.endswith("weight") and len(shape) > 1:
            t /= math.sqrt(math.prod(shape[1:]))
        elif name.endswith("weight"):  # a LayerNorm's scale
            t = 1 + 0.3 * t
        else:
            t *= 0.3
        sd[name] = t
    return sd


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def gelu(x, form):
    if form == "erf":
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def reference(sd, cfg, img):
    """timm's ViT in float64, written out: conv patch embedding, attention by hand. Returns (features, logits)."""
    w = {k: v.double() for k, v in sd.items()}
    x = F.conv2d(img.double(), w["patch_embed.proj.weight"], w["patch_embed.proj.bias"], stride=cfg.patch)
    x = x.flatten(2).transpose(1, 2)  # [B, N, D]
    x = torch.cat((w["cls_token"].expand(x.shape[0], -1, -1), x), 1) + w["pos_embed"]
    heads, hd = cfg.heads, cfg.dim // cfg.heads
    for i in range(cfg.depth):
        b = f"blocks.{i}."
        h = layer_norm(x, w[b + "norm1.weight"], w[b + "norm1.bias"], cfg.eps)
        qkv = h @ w[b + "attn.qkv.weight"].T + w[b + "attn.qkv.bias"]
        q, k, v = qkv.unflatten(-1, (3, heads, hd)).permute(2, 0, 3, 1, 4)  # [B, H, N, hd] each
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), -1) @ v
        x = x + a.transpose(1, 2).flatten(2) @ w[b + "attn.proj.weight"].T + w[b + "attn.proj.bias"]
        h = layer_norm(x, w[b + "norm2.weight"], w[b + "norm2.bias"], cfg.eps)
        h = gelu(h @ w[b + "mlp.fc1.weight"].T + w[b + "mlp.fc1.bias"], cfg.gelu)
        x = x + h @ w[b + "mlp.fc2.weight"].T + w[b + "mlp.fc2.bias"]
    x = layer_norm(x, w["norm.weight"], w["norm.bias"], cfg.eps)
    return x, x[:, 0] @ w["head.weight"].T + w["head.bias"]


def rel_err(got, expected):
    return ((got.double() - expected).abs().max() / expected.abs().max()).item()


def loaded(cls, cfg, sd):
    return load_timm_state_dict(cls(cfg), sd).eval()


@pytest.mark.parametrize("gelu_form", ["erf", "tanh"])
@pytest.mark.parametrize("size", list(SIZES))
def test_ops_vit_and_plain_twin_match_an_fp64_reference(size, gelu_form):
    cfg = config("vit_tiny", **SMALL, img_size=SIZES[size], gelu=gelu_form)
    sd = timm_state_dict(cfg)
    img = torch.randn(3, 3, *cfg.img_size)
    features, logits = reference(sd, cfg, img)
    for cls in (ViT, PlainViT):
        model = loaded(cls, cfg, sd)
        with torch.no_grad():
            assert rel_err(model(img), logits) < 1e-5, cls.__name__
            assert rel_err(model.forward_features(img), features) < 1e-5, cls.__name__


def test_the_reference_tells_the_gelu_forms_and_the_patch_order_apart():
    # The comparison above (tolerance 1e-5) means something only if a wrong model fails it: the other GELU form
    # (at least 6.9e-5 away on 200 seeds), or the pixels of each patch read column-major, are well outside it.
    cfg = config("vit_tiny", **SMALL, img_size=SIZES["wide"])
    sd = timm_state_dict(cfg)
    img = torch.randn(2, 3, *cfg.img_size)
    features, _ = reference(sd, cfg, img)
    tanh_features, _ = reference(sd, config("vit_tiny", **SMALL, img_size=SIZES["wide"], gelu="tanh"), img)
    assert rel_err(tanh_features, features) > 3e-5
    transposed = dict(sd, **{"patch_embed.proj.weight": sd["patch_embed.proj.weight"].transpose(-1, -2)})
    model = loaded(ViT, cfg, transposed)
    with torch.no_grad():
        assert rel_err(model.forward_features(img), features) > 1e-3


def test_parameter_names_are_timms_and_state_dicts_load_across_forms():
    cfg = config("vit_tiny", **SMALL, img_size=SIZES["wide"])
    sd = timm_state_dict(cfg)
    ours, plain = ViT(cfg), PlainViT(cfg)
    assert ours.state_dict().keys() == plain.state_dict().keys() == sd.keys()
    d, c, p = cfg.dim, cfg.in_chans, cfg.patch
    assert ours.state_dict()["patch_embed.proj.weight"].shape == (d, c * p * p)  # the GEMM's layout
    assert plain.state_dict()["patch_embed.proj.weight"].shape == (d, c, p, p)  # the convolution's
    load_timm_state_dict(ours, sd).eval()
    plain.load_state_dict(ours.state_dict())  # [D, C·p·p] into the convolution
    back = ViT(cfg).eval()
    back.load_state_dict(plain.state_dict())  # and back
    assert torch.equal(back.state_dict()["patch_embed.proj.weight"], ours.state_dict()["patch_embed.proj.weight"])
    img = torch.randn(2, 3, *cfg.img_size)
    with torch.no_grad():
        assert torch.equal(back(img), ours(img))
        torch.testing.assert_close(plain.eval()(img), ours(img), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("change", "overrides", "message"),
    [
        (lambda sd: sd.pop("norm.bias"), {}, "missing ['norm.bias']"),
        (lambda sd: sd.update({"fc_norm.weight": torch.ones(64)}), {}, "unexpected ['fc_norm.weight']"),
        (None, {"num_classes": 5}, "head.weight"),
        (None, {"img_size": 40}, "pos_embed"),
    ],
)
def test_timm_weights_that_do_not_fit_are_one_clear_error(change, overrides, message):
    sd = timm_state_dict(config("vit_tiny", **SMALL, img_size=32))
    if change is not None:
        change(sd)
    model = ViT(config("vit_tiny", **{**SMALL, "img_size": 32, **overrides}))
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_timm_state_dict(model, sd)


def test_auto_driving_vit_returns_logits_in_training_and_patch_features_in_inference():
    cfg = config("vit_tiny", **SMALL, img_size=SIZES["wide"])
    sd = timm_state_dict(cfg)
    img = torch.randn(2, 3, *cfg.img_size)
    features, logits = reference(sd, cfg, img)
    model = load_timm_state_dict(AutoDrivingViT(cfg), sd)
    with torch.no_grad():
        out = model.train()(img)
        assert out.shape == (2, cfg.num_classes) and rel_err(out, logits) < 1e-5
        out = model.eval()(img)
        assert out.shape == (2, cfg.grid[0] * cfg.grid[1], cfg.dim) and rel_err(out, features[:, 1:]) < 1e-5
    with torch.device("meta"):
        default = AutoDrivingViT()
    assert (default.cfg.dim, default.cfg.depth, default.cfg.heads, default.head.out_features) == (768, 12, 12, 10)


@pytest.mark.parametrize(
    ("build", "dims", "params"),  # timm's vit_{tiny,small,base,large}_patch16_224 parameter counts
    [
        (vit_tiny, (192, 12, 3), 5_717_416),
        (vit_small, (384, 12, 6), 22_050_664),
        (vit_b16, (768, 12, 12), 86_567_656),
        (vit_l16, (1024, 24, 16), 304_326_632),
    ],
)
def test_named_configs_have_timms_shapes(build, dims, params):
    with torch.device("meta"):
        model, plain = build(), build(plain=True)
    cfg = model.cfg
    assert (cfg.dim, cfg.depth, cfg.heads, cfg.patch, cfg.img_size, cfg.tokens) == (*dims, 16, (224, 224), 197)
    assert (cfg.hidden, cfg.eps, cfg.gelu) == (4 * dims[0], 1e-6, "erf")
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in plain.parameters()) == params


@pytest.mark.parametrize("form", ["ViT", "PlainViT", "AutoDrivingViT.train", "AutoDrivingViT.eval"])
def test_traces_as_one_graph_with_zero_breaks(form):
    cls = {"ViT": ViT, "PlainViT": PlainViT}.get(form, AutoDrivingViT)
    cfg = config("vit_tiny", **SMALL, img_size=SIZES["wide"])
    model = loaded(cls, cfg, timm_state_dict(cfg)).train(form.endswith("train"))
    img = torch.randn(2, 3, *cfg.img_size)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(img)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(img), model(img), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_compiles_with_inductor_and_matches_eager():
    cfg = config("vit_tiny", **{**SMALL, "depth": 1}, img_size=SIZES["wide"])
    sd = timm_state_dict(cfg)
    model = loaded(ViT, cfg, sd)
    img = torch.randn(3, 3, *cfg.img_size)
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(model, fullgraph=True)(img)
        assert rel_err(out, reference(sd, cfg, img)[1]) < 1e-5


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: config("vit_h14"), "unknown ViT config 'vit_h14'"),
        (lambda: config("vit_tiny", dim=100, heads=3), "multiple of heads"),
        (lambda: config("vit_tiny", img_size=(224, 200)), "each a positive multiple of patch (16)"),
        (lambda: config("vit_tiny", gelu="relu"), "gelu='relu'"),
        (lambda: config("vit_tiny", depth=0), "depth must be at least 1"),
        (lambda: vit_tiny(**SMALL, img_size=32)(torch.randn(1, 3, 32, 40)), "img must be [B, 3, 32, 32]"),
        (lambda: vit_tiny(**SMALL, img_size=32)(torch.randn(1, 1, 32, 32)), "img must be [B, 3, 32, 32]"),
    ],
)
def test_bad_configs_and_inputs_are_one_clear_error(build, message):
    escaped = message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(UsageError, match=escaped):
        build()


def timm_vit_b16():
    """timm's vit_base_patch16_224 with random weights (no download), its norms and biases randomized too."""
    timm = pytest.importorskip("timm")
    model = timm.create_model("vit_base_patch16_224", pretrained=False).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:  # biases are zero and norm scales one at init: that would hide a swapped parameter
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
    return model


@pytest.mark.slow
def test_timm_vit_b16_weights_give_timms_outputs():
    ref = timm_vit_b16()
    ours = load_timm_state_dict(vit_b16(), ref).eval()
    img = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected = ref(img)
        assert rel_err(ours(img), expected.double()) < 1e-4
        torch.testing.assert_close(ours.forward_features(img), ref.forward_features(img), rtol=1e-4, atol=1e-4)


@requires_cuda
@pytest.mark.slow
def test_bf16_error_against_timms_fp32_is_within_timms_own_bf16_error():
    # The numerics criterion: our bf16 ViT (eager and compiled) against timm's fp32 output, at most 1.1x the
    # error of timm's own model in bf16 against the same reference.
    ref = timm_vit_b16().cuda()
    ours = load_timm_state_dict(vit_b16(), ref).eval().cuda().to(torch.bfloat16)
    img = torch.randn(8, 3, 224, 224, device="cuda")
    torch._dynamo.reset()
    with torch.no_grad():
        expected = ref(img)
        err = lambda out: ((out.float() - expected).norm() / expected.norm()).item()  # noqa: E731
        timm_err = err(ref.to(torch.bfloat16)(img.bfloat16()))
        for fn in (ours, torch.compile(ours, fullgraph=True)):
            assert err(fn(img.bfloat16())) <= 1.1 * timm_err, timm_err


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("policy", ["native", "kernel"])
def test_inference_blocks_call_the_chosen_forms_directly_as_the_checked_modules_compute(
    policy, compiled, triton_device, monkeypatch
):
    cfg = config("vit_tiny", **SMALL, img_size=(24, 40), gelu="tanh")
    model = loaded(ViT, cfg, timm_state_dict(cfg))
    img = torch.randn(2, 3, *cfg.img_size)

    def run():
        torch._dynamo.reset()
        fn = torch.compile(model, fullgraph=True, backend="aot_eager") if compiled else model
        with torch.no_grad():
            return fn(img)

    with ops.policy(all=policy):
        direct_out, direct_counts = policy_counts(run)
        monkeypatch.setattr(direct, "usable", lambda: False)  # the checked modules, as when autograd records
        checked_out, checked_counts = policy_counts(run)
    torch.testing.assert_close(direct_out, checked_out, rtol=1e-6, atol=1e-6)
    assert direct_counts == checked_counts
    assert {impl for (op, _, impl) in direct_counts if op != "attention"} == {policy}


def test_a_customized_block_takes_its_own_modules():
    cfg = config("vit_tiny", **SMALL)
    model = loaded(ViT, cfg, timm_state_dict(cfg))
    img = torch.randn(1, 3, *cfg.img_size)
    with torch.no_grad():
        expected = model(img)
    model.blocks[0].attn.backend = "sdpa-math"  # pinned: the direct path would not honour it
    with torch.no_grad():
        out, counts = policy_counts(lambda: model(img))
    assert counts[("attention", "eager", "sdpa-math")] == 1  # block 0 ran its own module
    assert sum(n for (op, _, impl), n in counts.items() if op == "attention" and impl != "sdpa-math") == 1
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def full_logits(model, img):
    """Every token through every block, then the class token's row: what timm computes."""
    return model.head(model.forward_features(img)[:, 0])


def test_logits_carry_only_the_class_token_through_the_last_block():
    from torch.utils.flop_counter import FlopCounterMode

    cfg = config("vit_tiny", **{**SMALL, "depth": 3})
    model = loaded(ViT, cfg, timm_state_dict(cfg))
    img = torch.randn(2, 3, *cfg.img_size)
    flops = {}
    for name, fn in (("ours", model), ("full", lambda i: full_logits(model, i))):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            out = fn(img)
        flops[name] = (counter.get_total_flops(), out)
    torch.testing.assert_close(flops["ours"][1], flops["full"][1], rtol=1e-5, atol=1e-5)
    # the last block's GEMMs: proj, fc1, fc2 for one row per image instead of T (the fused QKV stays whole)
    t, d, hidden, b = cfg.tokens, cfg.dim, cfg.hidden, 2
    saved = 2 * b * (t - 1) * (d * d + 2 * d * hidden)
    assert flops["full"][0] - flops["ours"][0] >= 0.9 * saved, (flops["full"][0], flops["ours"][0], saved)


def test_training_gradients_through_the_class_token_shortcut_are_the_full_models():
    # autograd records: the checked modules take the shortcut too, and every parameter gets the full path's grad
    cfg = config("vit_tiny", **SMALL)
    model = loaded(ViT, cfg, timm_state_dict(cfg)).train()
    img = torch.randn(2, 3, *cfg.img_size)
    grads = []
    for fn in (model, lambda i: full_logits(model, i)):
        model.zero_grad()
        fn(img).square().sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-5, msg=name)


def shortcut_case():
    """A small ViT with timm-layout weights, an input, and its logits the full way (`full_logits`)."""
    cfg = config("vit_tiny", **SMALL)
    model = loaded(ViT, cfg, timm_state_dict(cfg))
    img = torch.randn(2, 3, *cfg.img_size)
    with torch.no_grad():
        return model, img, full_logits(model, img)


def test_a_hooked_or_replaced_last_block_gets_its_usual_call():
    # tools that watch the last block (a forward hook) or replace its forward see the call they expect: (x) alone
    model, img, expected = shortcut_case()
    seen = []
    handle = model.blocks[-1].register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs), with_kwargs=True)
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, rtol=1e-5, atol=1e-5)
    handle.remove()
    assert seen == [{}]
    block = model.blocks[-1]
    block.forward = lambda x: type(block).forward(block, x)  # an instance forward that takes x alone
    with torch.no_grad():
        torch.testing.assert_close(model(img), expected, rtol=1e-5, atol=1e-5)


def test_per_block_regional_compile_keeps_one_graph_for_every_block():
    # the last block's first_only form would be a second graph (a recompile) under per-block compilation
    import fullgraph

    model, img, expected = shortcut_case()
    torch._dynamo.reset()
    cm = fullgraph.compile(model, "dev", regional=True)
    for _ in range(2):
        torch.testing.assert_close(cm(img), expected, rtol=1e-4, atol=1e-5)
    assert cm.stats.frames_compiled == 1 and cm.stats.recompiles == ()


def test_a_customized_last_block_computes_every_token_and_keeps_the_first():
    cfg = config("vit_tiny", **SMALL)
    model = loaded(ViT, cfg, timm_state_dict(cfg))
    model.blocks[-1].attn.backend = "sdpa-math"  # pinned: neither the direct path nor the shortcut apply
    img = torch.randn(2, 3, *cfg.img_size)
    with torch.no_grad():
        out, counts = policy_counts(lambda: model(img))
        expected = full_logits(model, img)
    assert counts[("attention", "eager", "sdpa-math")] == 1
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


PATCH_BUFFERS = {
    "ours": [("2, 4, 4, 3, 8, 8", "bfloat16"), ("32, 64", "bfloat16")],  # the patch gather and its GEMM's output
    "plain": [("2, 3, 32, 32", "bfloat16"), ("64, 3, 8, 8", "bfloat16")],  # the convolution's input and weight layouts
}


@pytest.mark.slow
def test_all_native_compiles_to_the_plain_twins_kernels_and_stores_less(monkeypatch):
    """Issue 32, item 3, for the ViT (the DiT's test is in test_dit.py): with every op native, ours launches the
    plain twin's kernels and stores no more in any dtype, the patch embedding apart (a gather and a GEMM where plain
    runs a convolution: measured faster on the GPU); its last block computing the class token alone stores less."""
    model = ViT(config("vit_tiny", **SMALL, img_size=32)).eval().to(torch.bfloat16)
    plain = PlainViT(model.cfg).eval().to(torch.bfloat16)
    plain.load_state_dict(model.state_dict())
    img = torch.randn(2, 3, 32, 32, dtype=torch.bfloat16)
    n_plain, plain_buffers = inductor_buffers(plain, img)
    with ops.policy(all="native"):
        n_ours, ours_buffers = inductor_buffers(model, img)
        monkeypatch.setattr(vit_module, "must_call_as_usual", lambda block: True)  # every token through the last block
        n_all, all_buffers = inductor_buffers(model, img)

    def rest(buffers, patch, dtype):
        left = list(buffers)
        for b in patch:
            left.remove(b)  # fails if the patch embedding's buffers are not there
        return buffer_bytes([b for b in left if b[1] == dtype])

    assert n_all == n_plain
    for dtype in ("float32", "bfloat16"):  # no extra copy in either (the DiT's RoPE once stored float32 halves)
        cls_token = buffer_bytes([("2, 1, 64", dtype)])  # ours slices the class token before the final norm
        assert rest(all_buffers, PATCH_BUFFERS["ours"], dtype) <= rest(plain_buffers, PATCH_BUFFERS["plain"], dtype) + (
            cls_token
        )
    assert buffer_bytes(ours_buffers) < buffer_bytes(all_buffers)  # the class token alone through the last block
    assert n_ours <= n_plain + 1  # on the CPU its few rows take one pass of their own (their GELU)
