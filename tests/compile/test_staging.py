"""fullgraph.compile.staging: inputs copied into static buffers for models replayed from CUDA graph trees."""

import pytest
import torch
from torch import nn

import fullgraph
from fullgraph.compile import staging
from fullgraph.compile.staging import Staging
from tests.skips import requires_cuda


def test_each_input_and_shape_gets_one_static_buffer_holding_a_copy():
    stage = Staging(["x", "y"], device_type="cpu")
    x, y = torch.randn(2, 3), torch.randn(4)
    z = torch.randn(5)
    (sx, sy), kw = stage((x, y), {"z": z})
    assert torch.equal(kw["z"], z) and kw["z"] is not z  # keyword inputs too
    assert torch.equal(sx, x) and torch.equal(sy, y) and sx is not x and sx.data_ptr() != x.data_ptr()
    assert getattr(sx, "_dynamo_static_input_type", None) == "unguarded"  # CUDA graph trees will not copy it
    x2 = torch.randn(2, 3)
    (sx2, _), _ = stage((x2, y), {})
    assert sx2 is sx and torch.equal(sx2, x2)  # the same buffer, refilled
    (sx3,), _ = stage((torch.randn(3, 3),), {})  # another shape: another buffer
    assert sx3 is not sx and len(stage) == 4
    assert torch.equal(x2, sx2)  # the caller's tensor is only read


def test_what_it_cannot_stage_passes_through_untouched():
    stage = Staging(["x"], device_type="cpu")
    expanded = torch.randn(1, 3).expand(4, 3)
    leaf = torch.randn(3, requires_grad=True)
    nested = [torch.randn(2)]
    args, _ = stage((expanded,), {})
    assert args[0] is expanded
    (a, b, c), _ = stage((leaf, nested, 3), {})
    assert a is leaf and b is nested and c == 3
    cuda_only = Staging(["x"])  # the default: CUDA tensors only
    t = torch.randn(2)
    assert cuda_only((t,), {})[0][0] is t and len(cuda_only) == 0


def test_buffers_per_input_are_bounded(monkeypatch):
    monkeypatch.setattr(staging, "MAX_SHAPES", 2)
    stage = Staging(["x"], device_type="cpu")
    first = stage((torch.randn(1),), {})[0][0]
    stage((torch.randn(2),), {})
    stage((torch.randn(3),), {})
    assert len(stage) == 2
    assert stage((torch.randn(1),), {})[0][0] is not first  # the oldest was dropped


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 128), nn.Linear(128, 64)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) + x


@requires_cuda
@pytest.mark.gpu
def test_perception_replays_without_the_trees_input_copy_and_stays_exact():
    torch.manual_seed(0)
    model = Net().cuda()
    reference = Net().cuda().double()
    reference.load_state_dict(model.state_dict())
    cm = fullgraph.compile(model, "perception")
    assert cm._staging is not None
    for _ in range(3):  # warm-up, record, replay
        cm(torch.randn(8, 64, device="cuda"))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        xs = [torch.randn(8, 64, device="cuda") for _ in range(3)]
        outs = [cm(x).clone() for x in xs]  # clone: a replay's output is overwritten by the next replay
        torch.cuda.synchronize()
    names = {e.name for e in prof.events()}
    assert "aten::_foreach_copy_" not in names and "aten::copy_" in names
    for x, out in zip(xs, outs, strict=True):
        expected = reference(x.double())
        assert ((out.double() - expected).norm() / expected.norm()).item() < 1e-5
    assert len(cm._staging) == 1


def test_an_output_that_is_a_staged_buffer_comes_back_as_a_copy():
    stage = Staging(["x"], device_type="cpu")
    x = torch.randn(4, 3)
    (sx,), _ = stage((x,), {})
    out = stage.checked((sx[1:], sx.sum()))  # a model returning a view of its input, and something of its own
    assert out[0].untyped_storage().data_ptr() != sx.untyped_storage().data_ptr() and torch.equal(out[0], x[1:])
    assert stage.aliased  # from now on every call is checked, not only a new buffer's first
    (sx2,), _ = stage((torch.randn(4, 3),), {})
    assert sx2 is sx and stage.checked(sx2) is not sx2
    quiet = Staging(["x"], device_type="cpu")
    (qx,), _ = quiet((x,), {})
    own = qx * 2
    assert quiet.checked(own) is own and not quiet.aliased  # outputs of its own pass untouched


class PassThrough(nn.Module):
    """Returns its input beside a result: the staged buffer must not reach the caller."""

    def forward(self, x):
        return x, x * 2


@requires_cuda
@pytest.mark.gpu
def test_a_model_returning_its_input_under_perception_hands_back_copies_that_stay():
    cm = fullgraph.compile(PassThrough().cuda(), "perception")
    kept = []
    for _ in range(4):  # warm-up, record, replays: each call's returned input must survive the next call
        x = torch.randn(8, 64, device="cuda")
        same, twice = cm(x)
        kept.append((x, same))
        assert torch.equal(twice, x * 2)
    torch.cuda.synchronize()
    assert all(torch.equal(x, same) for x, same in kept)
    assert cm._staging.aliased
