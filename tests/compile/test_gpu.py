"""fullgraph.compile on a CUDA GPU: the perception preset's CUDA graphs, strict recompiles and Bucketed replay.

Marked gpu: skipped cleanly without CUDA; run on the H200 by `bash benchmarks/h200.sh tests`.
"""

import random

import pytest
import torch
from torch import nn

import fullgraph
from fullgraph.compile import Bucketed, StrictRecompileError
from tests.skips import requires_cuda

pytestmark = requires_cuda


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.LayerNorm(96), nn.Linear(96, 40)).cuda().eval()


def test_perception_runs_one_graph_under_cuda_graphs_and_matches_fp64():
    model = mlp()
    ref = mlp().double()
    cm = fullgraph.compile(model, "perception")
    x = torch.randn(13, 48, device="cuda")  # an odd batch
    for _ in range(3):  # the third call replays the recorded graph
        out = cm(x).clone()
    with torch.no_grad():
        expected = ref(x.double())
    st = cm.stats
    assert st.graphs == 1 and st.graph_breaks == 0 and st.cudagraph_skips == 0, st
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4)


def test_strict_recompiles_raise_on_a_new_shape_under_perception():
    cm = fullgraph.compile(mlp(), "perception", strict_recompiles=True)
    cm.warmup(torch.randn(8, 48, device="cuda"))
    cm(torch.randn(8, 48, device="cuda"))
    with pytest.raises(StrictRecompileError):
        cm(torch.randn(9, 48, device="cuda"))


def test_bucketed_perception_compiles_once_per_bucket_and_matches_eager():
    model = mlp()
    cm = fullgraph.compile(model, "perception")
    served = Bucketed(cm, dim=0, buckets=(1, 2, 4, 8, 16))
    rng = random.Random(7)
    sizes = [rng.randint(1, 16) for _ in range(30)]
    for n in sizes:
        x = torch.randn(n, 48, device="cuda")
        out = served(x)
        with torch.no_grad():
            expected = cm.original_module(x)
        assert out.shape == (n, 40)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    used = {served.bucket_for(n) for n in sizes}
    assert cm.stats.graphs == len(used) and len(cm.stats.recompiles) == len(used) - 1, cm.stats
