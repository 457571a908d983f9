"""Per-module plans and regional compilation through fullgraph.compile (issue 12; the chapter's exercise 2.7)."""

import importlib
import warnings
from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters

import fullgraph
from fullgraph.compile import CompileFallbackWarning, Preset, StrictRecompileError, check_plan
from fullgraph.compile.graphs import GraphedCall
from fullgraph.compile.regional import has_nested_compile_region
from fullgraph.errors import UsageError

# Recording backends, one per planned part: each keeps the graphs it was handed.
GRAPHS: dict[str, list[torch.fx.GraphModule]] = defaultdict(list)
BACKENDS = ("fgtest_vision", "fgtest_points", "fgtest_head", "fgtest_blocks")


def _recorder(name):
    def backend(gm, example_inputs):
        GRAPHS[name].append(gm)
        return gm.forward

    return backend


for _name in BACKENDS:
    if _name not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(_recorder(_name), name=_name)


# torch 2.13: resetting Dynamo resets a reduce-overhead Inductor backend that never compiled, which imports this
# module, whose `compiler.disable` registers a backend while reset iterates over them ("dictionary changed size").
importlib.import_module("torch._inductor.wrapper_benchmark")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    GRAPHS.clear()
    yield
    torch._dynamo.reset()


class Probe(nn.Module):
    """Records, on each call, whether its forward ran inside a Dynamo trace (True) or eagerly (False)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def note(self):
        self.seen.append(torch.compiler.is_compiling())


class Vision(Probe):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)

    def forward(self, image):  # image: [B, 3, H, W]
        self.note()
        return F.relu(self.conv2(F.relu(self.conv1(image)))).mean((2, 3))  # [B, 16]


class Points(Probe):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 32), nn.Linear(32, 16)

    def forward(self, pts):  # pts: [B, P, 3], P varies
        self.note()
        return self.fc2(F.gelu(self.fc1(pts))).amax(1)  # [B, 16]


class Fusion(Probe):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, a, b):
        self.note()
        return F.silu(self.fc(torch.cat([a, b], -1)))  # [B, 32]


class Head(Probe):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 6)

    def forward(self, z):
        self.note()
        return torch.tanh(self.fc(z))  # [B, 6]


class Robot(nn.Module):
    def __init__(self):
        super().__init__()
        self.vision, self.points, self.fusion, self.head = Vision(), Points(), Fusion(), Head()

    def forward(self, image, pts):
        return self.head(self.fusion(self.vision(image), self.points(pts)))


def inputs(n_points=37, batch=2):
    return torch.randn(batch, 3, 16, 16), torch.randn(batch, n_points, 3)


def ops(gm):
    return {str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")}


def test_a_plan_compiles_exactly_the_named_submodules_and_leaves_the_model_alone():
    robot = Robot()
    plan = {"vision": {"backend": "fgtest_vision"}, "points": Preset("pts", mode=None, backend="fgtest_points"),
            "fusion": "eager", "head": {"backend": "fgtest_head", "fullgraph": True}}  # fmt: skip
    cm = fullgraph.compile(robot, plan=plan)
    image, pts = inputs()
    got = cm(image, pts)
    parts = (robot.vision, robot.points, robot.fusion, robot.head)
    assert [m.seen for m in parts] == [[True], [True], [False], [True]]  # traced where planned, eager where not
    (vision,), (points,), (head,) = GRAPHS["fgtest_vision"], GRAPHS["fgtest_points"], GRAPHS["fgtest_head"]
    assert "<built-in method conv2d of type object at" in " ".join(ops(vision))
    assert not any("conv" in op for op in ops(points) | ops(head))
    assert any("amax" in op for op in ops(points)) and any("tanh" in op for op in ops(head))
    assert not any("cat" in op for g in (vision, points, head) for op in ops(g))  # fusion was not compiled
    # Graphs, not frames: Dynamo counts no "frames ok" for a fullgraph=True compile (the head's) in torch 2.13.
    assert cm.stats.graphs == 3 and cm.stats.graph_breaks == 0
    assert {p: s.graphs for p, s in cm.plan.stats.items()} == {"vision": 1, "points": 1, "head": 1}
    # Outside the CompiledModel's calls the model the user holds is unchanged and runs eagerly.
    assert all(m._compiled_call_impl is None for m in robot.modules())
    for m in parts:
        m.seen.clear()  # the probe's list length is guarded: keep it as it was when traced
    with torch.no_grad():
        expected = robot(image, pts)
    torch.testing.assert_close(got, expected)
    assert [m.seen for m in parts] == [[False]] * 4 and len(GRAPHS["fgtest_vision"]) == 1
    for m in parts:
        m.seen.clear()
    cm(*inputs())  # same shapes: every part reuses its graph
    assert cm.stats.graphs == 3 and cm.stats.recompiles == () and len(GRAPHS["fgtest_points"]) == 1


def test_describe_and_repr_say_which_path_got_what():
    cm = fullgraph.compile(Robot(), plan={"vision": "perception", "fusion": "eager", "head": {"backend": "cudagraphs"}})
    assert "plan: vision=perception, fusion=eager, head=backend='cudagraphs', rest eager" in repr(cm)
    assert "preset=" not in repr(cm)
    lines = cm.describe().splitlines()
    assert lines[0] == "vision: perception (inductor, reduce-overhead, fullgraph): 0 frame(s), 0 graph(s), " + (
        "0 recompile(s), 0.00 s"
    )
    assert lines[1] == "fusion: eager"
    assert lines[2].startswith("head: backend='cudagraphs' (cudagraphs): 0 frame(s)")
    assert lines[3] == "(rest): eager"
    whole = fullgraph.compile(Robot(), backend="eager")
    assert whole.plan is None and whole.describe().startswith("whole model: preset='dev', backend='eager'")


def test_a_plan_with_inductor_presets_equals_eager_and_compiles_points_once_for_varying_counts():
    robot = Robot()
    plan = {
        "vision": "perception",
        "points": {"preset": "planning", "dynamic": {"pts": {1: (2, 128)}}},
        "fusion": "eager",
        "head": {"backend": "cudagraphs"},
    }
    cm = fullgraph.compile(robot, plan=plan)
    for n in (37, 90, 5):
        image, pts = inputs(n)
        with torch.no_grad():
            expected = robot(image, pts)
        for m in robot.children():
            m.seen.clear()  # as when traced: the probe's list length is guarded
        torch.testing.assert_close(cm(image, pts), expected, rtol=1e-4, atol=1e-5)
    stats = cm.plan.stats
    assert stats["points"].graphs == 1 and stats["points"].recompiles == ()  # one symbolic graph for 5..90 points
    assert stats["vision"].graphs == 1 and stats["head"].graphs == 1
    assert "fusion" not in stats and cm.stats.graphs == 3
    assert all(m._compiled_call_impl is None for m in robot.modules())


def test_bad_plans_are_refused_before_anything_compiles():
    before = counters["frames"]["ok"]
    robot = Robot()
    for kwargs, message in [
        (dict(plan={"visoin": "dev"}), r"'visoin'.*did you mean 'vision'\?.*top-level: vision, points, fusion, head"),
        (dict(plan={"vision": "dev", "vision.conv1": "dev"}), r"overlap: 'vision\.conv1' lies inside 'vision'"),
        (dict(plan={"": "dev"}), "whole model"),
        (dict(plan={}), "give a dict"),
        (dict(plan={"head": 3}), "give a preset name"),
        (dict(plan={"head": "fast"}), r"plan\['head'\]: unknown preset 'fast'"),
        (dict(plan={"head": "auto"}), "needs a measured choice"),
        (dict(plan={"head": {"mode": "fast"}}), r"plan\['head'\]: unknown mode"),
        (dict(plan={"head": {"backend": "onnxrt"}}), r"plan\['head'\]: backend 'onnxrt' cannot run here"),
        (dict(plan={"head": {"options": {"freeze": True}}}), "did you mean 'freezing'"),
        (dict(plan={"head": {"recompile_limit": 0}}), "positive int"),
        (dict(plan={"head": {"speed": 1}}), "unknown key"),
        (dict(plan={"points": {"dynamic": {"pts": {1: (9, 2)}}}}), "min"),
        (dict(plan={"head": "dev"}, mode="max-autotune"), "with plan=, give mode per path"),
        (dict(plan={"head": "dev"}, regional=True), "do not combine"),
        (dict(plan={"head": "dev"}, preset="auto"), "does not combine"),
    ]:
        with pytest.raises(UsageError, match=message):
            fullgraph.compile(robot, **kwargs)
    with pytest.raises(UsageError, match=r"'blocks' is a ModuleList, which has no forward.*blocks\.0"):
        check_plan(_Stack(), {"blocks": "dev"})
    assert counters["frames"]["ok"] == before
    assert all(m._compiled_call_impl is None for m in robot.modules())


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 6)

    def forward(self, z):
        y = self.fc(z)
        return y.relu() if y.sum() > 0 else y.sigmoid()  # a break on a value: an error under fullgraph=True


def test_a_failing_part_falls_back_to_eager_with_one_warning():
    robot = Robot()
    robot.head = Broken()
    cm = fullgraph.compile(robot, plan={"head": {"backend": "eager", "fullgraph": True}}, on_error="eager")
    image, pts = inputs()
    with torch.no_grad():
        expected = robot(image, pts)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = cm(image, pts)
        cm(image, pts)
    assert [w.category for w in caught] == [CompileFallbackWarning]
    torch.testing.assert_close(got, expected)
    assert "eager after" in repr(cm) and robot.head._compiled_call_impl is None


def test_strict_recompiles_reach_the_planned_parts():
    robot = Robot()
    cm = fullgraph.compile(robot, plan={"points": {"backend": "fgtest_points"}}, strict_recompiles=True)
    cm.warmup(*inputs(37))
    robot.points.seen.clear()  # as when traced: the probe's list length is guarded
    cm(*inputs(37))
    robot.points.seen.clear()
    with pytest.raises(StrictRecompileError):
        cm(*inputs(12))  # a new point count: the points part would recompile


# -- regional ------------------------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class _Stack(nn.Module):
    def __init__(self, depth=4):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(depth))
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(1))


def test_regional_per_block_compiles_one_graph_for_n_blocks_and_leaves_the_model_alone():
    model = _Stack(depth=4)
    cm = fullgraph.compile(model, Preset("count", mode=None, backend="fgtest_blocks"), regional=True)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(cm(x), expected)
    cm(torch.randn(2, 5, 8))
    assert len(GRAPHS["fgtest_blocks"]) == 1 and cm.stats.frames_compiled == 1 and cm.stats.recompiles == ()
    assert cm.describe() == (
        "regional (per-block torch.compile): 4 x Block (blocks.0 ... blocks.3); the rest of the model runs eagerly"
    )
    assert "regional (per-block torch.compile)" in repr(cm) and "preset='count'" in repr(cm)
    assert all(b._compiled_call_impl is None for b in model.blocks)


@pytest.mark.skipif(not has_nested_compile_region(), reason="torch has no nested_compile_region")
def test_regional_nested_traces_the_block_once():
    model = _Stack(depth=4)
    cm = fullgraph.compile(model, Preset("count", mode=None, backend="fgtest_blocks"), regional="nested")
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(cm(x), expected)
    cm(torch.randn(2, 5, 8))
    (graph,) = GRAPHS["fgtest_blocks"]  # the whole model in one graph, compiled once
    calls = [n for n in graph.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
    assert len(calls) == 4 and len({n.args[0].target for n in calls}) == 1
    assert cm.describe() == "regional (nested_compile_region): 4 x Block (blocks.0 ... blocks.3)"
    assert all("forward" not in vars(b) for b in model.blocks)


def test_regional_inductor_equals_eager():
    model = _Stack(depth=3)
    cm = fullgraph.compile(model, "dev", regional=True)
    for _ in range(2):
        x = torch.randn(3, 7, 8)
        with torch.no_grad():
            expected = model(x)
        torch.testing.assert_close(cm(x), expected, rtol=1e-4, atol=1e-5)
    assert cm.stats.frames_compiled == 1


def test_regional_refusals():
    before = counters["frames"]["ok"]
    with pytest.raises(UsageError, match="no repeated blocks"):
        fullgraph.compile(Robot(), regional=True)
    with pytest.raises(UsageError, match="regional='whole'"):
        fullgraph.compile(_Stack(), regional="whole")
    with pytest.raises(UsageError, match="per-block regional"):
        fullgraph.compile(_Stack(), regional=True, dynamic={"x": {0: (2, 8)}})
    assert counters["frames"]["ok"] == before


def test_regional_per_block_with_the_cudagraphs_backend_graphs_the_whole_call_not_each_block():
    # The cudagraphs backend replays each compiled block from its own CUDA graph, which per-block regions cannot
    # do (they overwrite each other's outputs): like reduce-overhead, the blocks compile without graphs (backend
    # "eager") and one GraphedCall holds the whole call.
    model = _Stack(depth=3)
    cm = fullgraph.compile(model, Preset("g", mode=None, backend="cudagraphs"), regional=True)
    assert isinstance(cm._parts.call, GraphedCall), cm._parts
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(cm(x), expected)
        torch.testing.assert_close(cm(x), expected)
    assert cm.stats.frames_compiled == 1 and cm.stats.recompiles == ()
