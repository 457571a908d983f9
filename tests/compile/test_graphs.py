"""GraphedCall: one CUDA graph around a whole call (per-block regional compilation under CUDA-graph presets).

The capture itself needs CUDA (marked gpu, run on the H200 by `bash benchmarks/h200.sh tests`); which calls may
be captured is decided on any machine.
"""

import warnings

import pytest
import torch

import fullgraph
from fullgraph.compile import Preset
from fullgraph.compile.graphs import CudaGraphSkipWarning, GraphedCall, _signature
from tests.compile.test_regional import TinyViT
from tests.skips import requires_cuda


class Counting:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def test_cpu_inputs_and_unhashable_arguments_are_never_captured():
    fn = Counting(lambda x, scale=1.0: x * scale)
    graphed = GraphedCall(fn)
    x = torch.randn(3, 5)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(graphed(x, scale=2.0), x * 2.0)
    assert fn.calls == 3 and not graphed.graphs and not graphed.skipped
    assert _signature([x]) is None  # a CPU tensor
    assert _signature([[1, 2]]) is None  # an unhashable argument


@requires_cuda
def test_signatures_differ_by_shape_stride_dtype_and_plain_arguments():
    x = torch.randn(4, 6, device="cuda")
    keys = {_signature([x]), _signature([x.t()]), _signature([x[:3]]), _signature([x.half()]),
            _signature([x, 2.0]), _signature([x, 3.0])}  # fmt: skip
    assert None not in keys and len(keys) == 6
    assert _signature([x]) == _signature([torch.randn(4, 6, device="cuda")])


@requires_cuda
def test_replays_a_captured_call_with_new_inputs_and_keeps_old_outputs():
    torch.manual_seed(0)
    w = torch.randn(24, 24, device="cuda", dtype=torch.float64)
    fn = Counting(lambda x: torch.tanh(x @ w) + x)
    graphed = GraphedCall(fn)
    outs, xs = [], [torch.randn(7, 24, device="cuda", dtype=torch.float64) for _ in range(5)]
    with torch.no_grad():
        for x in xs:
            outs.append(graphed(x))
    # call 1 runs plainly, call 2 warms up and captures (2 more calls of fn), calls 3-5 replay
    assert fn.calls == 3 and len(graphed.graphs) == 1
    for x, out in zip(xs, outs, strict=True):  # earlier outputs were cloned out, not overwritten by later replays
        torch.testing.assert_close(out, torch.tanh(x @ w) + x)


@requires_cuda
def test_a_host_sync_is_skipped_with_its_cause_and_still_right():
    fn = Counting(lambda x: x * float(x.sum().item()))
    graphed = GraphedCall(fn, name="syncing")
    x = torch.randn(5, device="cuda")
    with torch.no_grad():
        graphed(x)
        with pytest.warns(CudaGraphSkipWarning, match="syncing: runs without a CUDA graph.*synchronises with the host"):
            out = graphed(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once
            again = graphed(x)
    assert not graphed.graphs and len(graphed.skipped) == 1
    torch.testing.assert_close(out, x * x.sum())
    torch.testing.assert_close(again, x * x.sum())


@requires_cuda
def test_a_failed_capture_leaves_the_rng_and_the_stream_usable():
    def fn(x):  # random numbers inside the capture, then an op a capture refuses (not a host sync)
        noise = torch.rand_like(x)
        torch.cuda.current_stream().query()
        return x * 2 + 0 * noise

    graphed = GraphedCall(fn, name="querying")
    x = torch.randn(6, device="cuda")
    stream = torch.cuda.current_stream()
    with torch.no_grad():
        graphed(x)
        with pytest.warns(CudaGraphSkipWarning, match="querying: .*capture failed"):
            out = graphed(x)
    assert torch.cuda.current_stream() == stream
    torch.testing.assert_close(out, x * 2)
    torch.testing.assert_close(graphed(x), x * 2)
    assert torch.randn(3, device="cuda").isfinite().all()  # the CUDA generator works after the failed capture


@requires_cuda
@pytest.mark.parametrize(
    "preset", ["perception", Preset("graphs", mode=None, backend="cudagraphs")], ids=["perception", "graphs-backend"]
)
def test_regional_per_block_under_perception_captures_one_graph_and_matches_fp64(preset):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyViT(dim=32, depth=4).cuda().eval()
    ref = TinyViT(dim=32, depth=4).double().cuda().eval()
    ref.load_state_dict(model.state_dict())
    cm = fullgraph.compile(model, preset, regional=True)
    xs = [torch.randn(3, 10, 8, device="cuda") for _ in range(4)]
    outs = [cm(x) for x in xs]
    assert "1 captured" in cm.describe(), cm.describe()
    assert cm.stats.graphs == 1 and cm.stats.cudagraph_skips == 0, cm.stats  # one block graph, no Inductor graphs
    with torch.no_grad():
        for x, out in zip(xs, outs, strict=True):
            torch.testing.assert_close(out.double(), ref(x.double()), rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
