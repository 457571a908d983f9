"""fullgraph.models.robot: each part against a float64 reference written here, zero graph breaks per part, the
recommended plan through `fullgraph.compile` over a stream of resolutions and point counts (no recompile after
warm-up, outputs equal to eager), the control without declared dims (it does recompile), and bad input."""

import math

import pytest
import torch
import torch.nn.functional as F

import fullgraph
from fullgraph.compile import check_plan
from fullgraph.errors import UsageError
from fullgraph.models import RobotConfig, RobotModel, dynamic_spec, recommended_plan, robot_tiny
from fullgraph.models.robot import CONFIGS, config, example_inputs, random_stream

TINY = CONFIGS["robot_tiny"]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Dynamo caches per code object across tests; start and leave each test with an empty cache."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def on_backend(plan: dict, backend: str) -> dict:
    """`plan` with every compiled part on `backend` (its preset's mode dropped). Also keeps Inductor's wrappers out
    of tests that compile nothing: torch 2.13's `_dynamo.reset()` fails ("dictionary changed size during
    iteration") when an Inductor wrapper that never compiled is reset first in a process (its reset imports a
    module that registers a backend)."""
    entries = {path: {"preset": e} if isinstance(e, str) else dict(e) for path, e in plan.items() if e != "eager"}
    return {**plan, **{path: {**e, "backend": backend} for path, e in entries.items()}}


def randomized(model: RobotModel) -> RobotModel:
    """Every parameter random (norm scales around 1, biases and position tables O(0.3), matrices scaled by
    1/sqrt(fan-in)), so no term of the reference can hide behind a zero or a one."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim > 1 and "pos_" not in name:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[1]))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    return model.eval()


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def vision_reference(w: dict, cfg: RobotConfig, image: torch.Tensor) -> torch.Tensor:
    """Patches by a stride-p convolution (the GEMM weight seen as [D, C, p, p]), the position tables summed per grid
    cell in a loop, attention written out; float64."""
    d, p, heads = cfg.vision_dim, cfg.patch, cfg.vision_heads
    x = F.conv2d(image.double(), w["vision.proj.weight"].view(d, cfg.in_chans, p, p), w["vision.proj.bias"], stride=p)
    _, _, gh, gw = x.shape
    pos = torch.stack([w["vision.pos_rows"][i] + w["vision.pos_cols"][j] for i in range(gh) for j in range(gw)])
    x = x.flatten(2).transpose(1, 2) + pos  # [B, N, D], row-major over the grid
    hd = d // heads
    for i in range(cfg.vision_depth):
        k = f"vision.blocks.{i}."
        h = layer_norm(x, w[k + "norm1.weight"], w[k + "norm1.bias"], cfg.eps)
        qkv = h @ w[k + "attn.qkv.weight"].T + w[k + "attn.qkv.bias"]
        q, kk, v = qkv.unflatten(-1, (3, heads, hd)).permute(2, 0, 3, 1, 4)  # [B, H, N, hd] each
        a = torch.softmax(q @ kk.transpose(-1, -2) / math.sqrt(hd), -1) @ v
        x = x + a.transpose(1, 2).flatten(2) @ w[k + "attn.proj.weight"].T + w[k + "attn.proj.bias"]
        h = layer_norm(x, w[k + "norm2.weight"], w[k + "norm2.bias"], cfg.eps)
        h = gelu_tanh(h @ w[k + "mlp.fc1.weight"].T + w[k + "mlp.fc1.bias"])
        x = x + h @ w[k + "mlp.fc2.weight"].T + w[k + "mlp.fc2.bias"]
    return layer_norm(x, w["vision.norm.weight"], w["vision.norm.bias"], cfg.eps).mean(1)


def points_reference(w: dict, cfg: RobotConfig, points: torch.Tensor) -> torch.Tensor:
    """One point at a time through the MLP, then the running maximum; float64."""
    feats = []
    for b in range(points.shape[0]):
        best = None
        for pt in points[b].double():
            x = pt
            for i in range(len(cfg.point_widths)):
                x = gelu_tanh(w[f"points.layers.{i}.weight"] @ x + w[f"points.layers.{i}.bias"])
            best = x if best is None else torch.maximum(best, x)
        feats.append(best)
    return layer_norm(torch.stack(feats), w["points.norm.weight"], w["points.norm.bias"], cfg.eps)


def head_reference(w: dict, cfg: RobotConfig, vision: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    f = layer_norm(torch.cat((vision, points), -1), w["fusion.norm.weight"], w["fusion.norm.bias"], cfg.eps)
    h = gelu_tanh(f @ w["head.fc1.weight"].T + w["head.fc1.bias"])
    return torch.tanh(h @ w["head.fc2.weight"].T + w["head.fc2.bias"])


def weights(model: RobotModel) -> dict:
    return {k: v.double() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(("h", "w", "n"), [(24, 40, 37), (64, 16, 8), (16, 64, 200)])
def test_each_part_matches_a_float64_reference(h, w, n):
    model = randomized(robot_tiny())
    cfg, sd = model.cfg, weights(model)
    image, points = example_inputs(cfg, 2, h, w, n)
    with torch.no_grad():
        v, q = model.vision(image), model.points(points)
        out = model(image, points)
    v_ref, q_ref = vision_reference(sd, cfg, image), points_reference(sd, cfg, points)
    assert v.shape == (2, cfg.vision_dim) and q.shape == (2, cfg.point_widths[-1]) and out.shape == (2, cfg.actions)
    torch.testing.assert_close(v.double(), v_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(q.double(), q_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.double(), head_reference(sd, cfg, v_ref, q_ref), rtol=1e-4, atol=1e-5)


def test_point_order_does_not_matter_and_resolution_does():
    model = randomized(robot_tiny())
    image, points = example_inputs(model.cfg, 1, 32, 48, 50)
    with torch.no_grad():
        out = model(image, points)
        shuffled = model(image, points[:, torch.randperm(50)])
        smaller = model(image[:, :, :16, :32], points)
    torch.testing.assert_close(shuffled, out, rtol=1e-5, atol=1e-6)
    assert (smaller - out).abs().max() > 1e-3  # the crop reaches the output (pooling hides nothing)


def test_every_part_and_the_whole_model_trace_into_one_graph():
    model = randomized(robot_tiny())
    cfg = model.cfg
    image, points = example_inputs(cfg, 2, 24, 40, 37)
    feats = (torch.randn(2, cfg.vision_dim), torch.randn(2, cfg.point_widths[-1]))
    calls = {"vision": (image,), "points": (points,), "fusion": feats, "head": (torch.randn(2, cfg.feature_dim),)}
    for name, args in [*calls.items(), ("", (image, points))]:
        part = model.get_submodule(name)
        with torch.no_grad():
            e = torch._dynamo.explain(part)(*args)
        assert (e.graph_count, e.graph_break_count) == (1, 0), (name or "whole model", e.break_reasons)


def test_recommended_plan_is_plain_data_that_compile_accepts():
    model = robot_tiny()
    plan = recommended_plan(model.cfg)
    assert plan["vision"]["dynamic"] == {"image": {2: TINY.height, 3: TINY.width}}
    assert plan["points"]["dynamic"] == {"points": {1: TINY.num_points}}
    assert plan["fusion"] == "eager" and plan["head"] == "perception"
    parts = {p.path: p for p in check_plan(model, plan)}
    assert parts["fusion"].resolved is None
    assert parts["vision"].resolved.fullgraph and parts["points"].resolved.fullgraph
    assert parts["head"].resolved.dynamic is False
    plan["vision"]["dynamic"]["image"][2] = (0, 0)  # a fresh dict per call: changing one leaves the next intact
    assert recommended_plan(model.cfg)["vision"]["dynamic"]["image"][2] == TINY.height


@pytest.mark.parametrize(
    ("backend", "requests", "depth"),
    [("aot_eager", 30, 2), pytest.param("inductor", 8, 1, marks=pytest.mark.slow)],  # inductor: 30-80 s on 2 cores
)
def test_recommended_plan_serves_a_stream_without_recompiling(backend, requests, depth):
    """The recommended plan (inductor: as it is; aot_eager: on that backend): warm-up on a square image compiles
    one graph per part; requests of other resolutions (non-square among them) and point counts compile nothing
    more (strict: a compile raises) and give eager's outputs."""
    model = randomized(robot_tiny(vision_depth=depth))
    cfg = model.cfg
    stream = random_stream(cfg, requests, seed=7)
    sizes = {(img.shape[2], img.shape[3], pts.shape[1]) for img, pts in stream}
    assert len(sizes) == requests and any(h != w for h, w, _ in sizes)
    with torch.no_grad():
        expected = [model(*x) for x in stream]
    plan = recommended_plan(cfg) if backend == "inductor" else on_backend(recommended_plan(cfg), backend)
    cm = fullgraph.compile(model, plan=plan, strict_recompiles=True)
    cm.warmup(*example_inputs(cfg, 1, 32, 32, 100))
    warm = cm.stats
    assert (warm.frames_compiled, warm.graph_breaks, warm.recompiles) == (3, 0, ())
    outs = [cm(*x) for x in stream]
    after = cm.stats
    assert (after.frames_compiled, after.recompiles, after.calls) == (3, (), requests + 1)
    assert {path: s.frames_compiled for path, s in cm.plan.stats.items()} == {"vision": 1, "points": 1, "head": 1}
    for out, ref in zip(outs, expected, strict=True):
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_the_whole_model_compiles_with_declared_dims_too():
    """One graph for the whole model over the declared ranges (the divisibility check must not become a guard,
    which Dynamo would refuse for declared dims), fullgraph=True, no recompile over varying requests."""
    model = randomized(robot_tiny())
    cm = fullgraph.compile(model, backend="eager", fullgraph=True, dynamic=dynamic_spec(model.cfg),
                           strict_recompiles=True)  # fmt: skip
    cm.warmup(*example_inputs(model.cfg, 1, 16, 16, 16))
    for x in random_stream(model.cfg, 6, seed=3):
        with torch.no_grad():
            expected = model(*x)
        torch.testing.assert_close(cm(*x), expected)
    assert (cm.stats.frames_compiled, cm.stats.graph_breaks, cm.stats.recompiles) == (1, 0, ())


def test_without_declared_dims_the_same_stream_recompiles():
    """The control: the plan without the points' declared dim recompiles that part on the second point count (the
    count the stream test relies on is live), and only that part."""
    model = robot_tiny()
    plan = on_backend(recommended_plan(model.cfg), "aot_eager")
    del plan["points"]["dynamic"]
    cm = fullgraph.compile(model, plan=plan)
    for n in (40, 60, 80):
        cm(*example_inputs(model.cfg, 1, 16, 16, n))
    assert len(cm.plan.stats["points"].recompiles) >= 1
    assert cm.plan.stats["vision"].recompiles == () and cm.plan.stats["head"].recompiles == ()


@pytest.mark.parametrize(
    ("image_shape", "n", "match"),
    [
        ((1, 3, 72, 32), 50, "height 72 is outside the declared range"),
        ((1, 3, 32, 20), 50, "width 20 is outside the declared range .* or not a multiple of the patch"),
        ((1, 4, 32, 32), 50, "image has 4 channels; this model takes 3"),
        ((1, 3, 32, 32), 600, "600 points is outside the declared range"),
        ((1, 3, 32, 32), 1, "1 points is outside the declared range"),
        ((2, 3, 32, 32), 50, "image batch 2 and points batch 1 differ"),
        ((3, 32, 32), 50, "image must be a 4-D float tensor"),
    ],
)
def test_bad_input_is_a_usage_error_eager_and_compiled(image_shape, n, match):
    model = robot_tiny()
    image, points = torch.randn(image_shape), torch.randn(1, n, 3)
    with pytest.raises(UsageError, match=match):
        model(image, points)
    cm = fullgraph.compile(model, plan=on_backend(recommended_plan(model.cfg), "eager"))
    with pytest.raises(UsageError, match=match):
        cm(image, points)  # checked before any part runs: nothing compiles
    assert cm.stats.frames_compiled == 0


def test_parts_check_what_their_graphs_keep_static():
    model = robot_tiny()
    with pytest.raises(UsageError, match="image has 1 channels"):
        model.vision(torch.randn(1, 1, 16, 16))
    with pytest.raises(UsageError, match="points have 6 features each; this model takes 3"):
        model.points(torch.randn(1, 20, 6))
    with pytest.raises(UsageError, match="points must be a 3-D float tensor"):
        model.points(torch.randint(0, 9, (1, 20, 3)))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"height": (20, 64)}, "multiples of patch"),
        ({"width": (8, 64)}, "at least 16"),
        ({"num_points": (1, 64)}, "at least 2 points"),
        ({"num_points": (64, 8)}, "need 0 < min <= max"),
        ({"vision_heads": 3}, "multiple of vision_heads"),
        ({"point_widths": ()}, "sizes must be positive"),
    ],
)
def test_bad_config_is_a_usage_error(overrides, match):
    with pytest.raises(UsageError, match=match):
        config("robot_tiny", **overrides)
    with pytest.raises(UsageError, match="unknown robot config 'robot_xl'"):
        config("robot_xl")
