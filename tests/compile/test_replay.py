"""fullgraph.replay: fullgraph.compile tells traced code when its calls replay CUDA graphs, and ops' compiled choices
that trade host time for GPU time (linear_gelu's epilogue below its size floor) follow it."""

import warnings

import pytest
import torch
from torch import nn

import fullgraph
from fullgraph import replay
from fullgraph.ops import measured


class Says(nn.Module):
    """x + 1 where the code traced for it will replay CUDA graphs, x - 1 otherwise."""

    def forward(self, x):
        return x + (1.0 if replay.under_graphs() else -1.0)


@pytest.mark.parametrize(
    ("kwargs", "graphs"),
    [
        ({"mode": "reduce-overhead"}, True),
        ({"mode": "default"}, False),
        ({"options": {"triton.cudagraphs": True}}, True),
        ({"plan": {"inner": {"mode": "reduce-overhead"}}}, True),
        ({"plan": {"inner": "dev"}}, False),
    ],
)
def test_compiled_code_is_traced_knowing_whether_cuda_graphs_replay_it(kwargs, graphs):
    torch._dynamo.reset()
    model = nn.Sequential()
    model.inner = Says()
    x = torch.randn(5)
    # On the CPU, Inductor's CUDA graph trees skip the graph and run the code: the trace is what is checked.
    out = fullgraph.compile(model, **kwargs)(x)
    torch.testing.assert_close(out, x + (1.0 if graphs else -1.0))
    assert replay.under_graphs() is False  # only around the model's calls
    assert torch.equal(model(x), x - 1.0)  # and not around the model itself, called eagerly


@pytest.mark.parametrize(
    ("kwargs", "graphs"),
    [
        ({}, False),
        ({"mode": "reduce-overhead"}, True),
        ({"mode": "max-autotune"}, True),
        ({"mode": "max-autotune-no-cudagraphs"}, False),
        ({"options": {"triton.cudagraphs": True}}, True),
        ({"backend": "cudagraphs"}, True),
        ({"backend": "aot_eager"}, False),
    ],
)
def test_plain_torch_compile_is_read_from_the_compile_tracing(kwargs, graphs):
    # no fullgraph.compile around the calls: the traced code asks the compile itself (Dynamo's backend, Inductor's
    # options), so ops choose for CUDA graphs under a plain torch.compile(mode="reduce-overhead") too
    torch._dynamo.reset()
    model, x = Says(), torch.randn(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU's "skipping cudagraphs" notes
        out = torch.compile(model, **kwargs)(x)
    torch.testing.assert_close(out, x + (1.0 if graphs else -1.0))
    assert replay.under_graphs() is False


def test_the_same_model_compiled_both_ways_gets_each_its_answer():
    torch._dynamo.reset()
    model, x = Says(), torch.randn(5)
    default, graphed = torch.compile(model), torch.compile(model, mode="reduce-overhead")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):  # Dynamo keeps one cache entry per backend: neither serves the other's trace
            torch.testing.assert_close(default(x), x - 1.0)
            torch.testing.assert_close(graphed(x), x + 1.0)


def test_linear_gelu_takes_its_epilogue_at_vit_b4_only_under_cuda_graphs(monkeypatch, tmp_path):
    monkeypatch.setenv("FULLGRAPH_CACHE_DIR", str(tmp_path))  # the committed decision data alone
    monkeypatch.setattr(measured, "gpu_name", lambda index: "NVIDIA H200")
    monkeypatch.setattr(torch, "__version__", "2.11.0")  # the measured torch
    gpu = torch.device("cuda", 0)
    vit_b4 = measured.Shape(torch.bfloat16, 64, 768, 788)  # ViT-B/16's tokens at batch 4
    dit_1024 = measured.Shape(torch.bfloat16, 128, 3072, 1024)  # the DiT's at 1024 tokens
    assert measured.compiled_choice("linear_gelu", gpu, vit_b4) == "native"
    assert measured.compiled_choice("linear_gelu", gpu, dit_1024) == "kernel"
    with replay.replayed():
        assert measured.compiled_choice("linear_gelu", gpu, vit_b4) == "kernel"
        assert measured.compiled_choice("layer_norm", gpu, dit_1024) == "native"  # no measurement: native still
        with replay.replayed(False):
            assert measured.compiled_choice("linear_gelu", gpu, vit_b4) == "native"
    assert measured.compiled_choice("linear_gelu", torch.device("cpu"), dit_1024) == "native"


def test_attention_takes_our_kernel_only_for_short_inputs_under_cuda_graphs(monkeypatch):
    from fullgraph.ops.attention import compiled_auto
    from fullgraph.ops.attention_backends import serve_reason, spec_of

    monkeypatch.setattr(measured, "gpu_name", lambda index: "NVIDIA H200")
    gpu = torch.device("cuda", 0)
    vit_b4, vit_b256 = 4 * 12 * 197 * 64, 256 * 12 * 197 * 64  # ViT-B/16's q: our kernel won at batch 4, lost at 256
    assert not measured.graphed_kernel_fits("attention", gpu, vit_b4)  # not replayed from CUDA graphs: no entry
    with replay.replayed():
        assert measured.graphed_kernel_fits("attention", gpu, vit_b4)
        assert not measured.graphed_kernel_fits("attention", gpu, vit_b256)
        assert not measured.graphed_kernel_fits("linear_gelu", gpu, vit_b4)  # no such entry
        assert not measured.graphed_kernel_fits("attention", torch.device("cpu"), vit_b4)
    monkeypatch.setattr(measured, "gpu_name", lambda index: "Unmeasured GPU")
    with replay.replayed():
        assert not measured.graphed_kernel_fits("attention", gpu, vit_b4)
    q = torch.randn(1, 2, 5, 64, dtype=torch.bfloat16)  # a head dim (64, 128) and a precision it was measured at
    spec = spec_of(q, q, None, False)
    assert compiled_auto(spec, q.device) == "sdpa"
    assert compiled_auto(spec, q.device, graphed_fit=True) == ("sdpa" if serve_reason("triton", *spec) else "triton")
    full = q.float()  # fp32: not measured (our kernel's exact fp32 products run without tensor cores)
    assert compiled_auto(spec_of(full, full, None, False), q.device, graphed_fit=True) == "sdpa"
    odd = torch.randn(1, 2, 5, 72)  # not measured there: never ours, even where the size fits
    assert compiled_auto(spec_of(odd, odd, None, False), odd.device, graphed_fit=True) == "sdpa"
