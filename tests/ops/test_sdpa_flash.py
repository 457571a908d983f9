"""Op `sdpa_flash` (ops/direct.py): a model block's SDPA pinned to FlashAttention ("kernel") or left to torch's pick
("native"), eager and compiled, and compiled `auto` taking the pin only where the decision data says so."""

import json

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from fullgraph import ops
from fullgraph.models.dit import config
from fullgraph.ops import direct, measured
from tests.kernels.reference import rel_err
from tests.models._counts import policy_counts
from tests.models.test_dit import randomized, twin

SMALL = {"dim": 64, "heads": 4, "depth": 2, "rope": "1d"}


def small_dit(seed: int):
    return randomized(config("dit_s", **SMALL), seed=seed)


@pytest.fixture
def torch_picks_math():
    """torch's own SDPA pick is the math path (FlashAttention turned off where nothing pins it), so a graph shows
    which of the two forms ran."""
    flash = torch.backends.cuda.flash_sdp_enabled()
    torch.backends.cuda.enable_flash_sdp(False)
    yield
    torch.backends.cuda.enable_flash_sdp(flash)


def test_the_kernel_form_pins_flash_attention_in_the_graph_and_native_leaves_torchs_pick(torch_picks_math):
    model = small_dit(1)
    x, c = torch.randn(2, 37, SMALL["dim"]), torch.randn(2, SMALL["dim"])
    with torch.no_grad():
        ref = twin(model, dtype=torch.float64)(x.double(), c.double())
    graphs = {}
    for form in ("native", "kernel"):
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)
        with ops.policy(all="native", sdpa_flash=form), torch.no_grad():
            (out, code), counts = policy_counts(lambda f=compiled: run_and_get_code(f, x, c))
            eager, eager_counts = policy_counts(lambda: model(x, c))
        graphs[form] = "\n".join(code)
        assert rel_err(out, ref) < 1e-5 and rel_err(eager, ref) < 1e-5  # the pin changes the kernel, not the function
        backend = "sdpa-flash-pinned" if form == "kernel" else "sdpa"
        traced = {k: n for k, n in counts.items() if k[0] == "attention"}
        assert traced == {("attention", "compiled", backend): SMALL["depth"]}
        assert eager_counts[("attention", "eager", backend)] == SMALL["depth"]
        assert ("attention", "eager", "sdpa" if form == "kernel" else "sdpa-flash-pinned") not in eager_counts
    assert "flash_attention" in graphs["kernel"] and "flash_attention" not in graphs["native"]


def test_the_pin_applies_only_where_attentions_policy_runs_torchs_sdpa():
    model = small_dit(2)
    x, c = torch.randn(2, 37, SMALL["dim"]), torch.randn(2, SMALL["dim"])
    with ops.policy(all="native", attention="auto", sdpa_flash="kernel"), torch.no_grad():
        _, counts = policy_counts(lambda: model(x, c))
    # eager auto chose a backend by timing it (FlashAttention among them): the pin does not replace that choice
    assert not any(impl == "sdpa-flash-pinned" for (op, _, impl) in counts if op == "attention")


H200 = "NVIDIA H200"


@pytest.fixture
def on_h200_with_a_flash_point(monkeypatch, tmp_path):
    """cuda:0 reads as an H200 with torch 2.11, and the user's decision file says the pin won at 2048 rows of 256
    tokens (batch 8) of a 1152-wide, head-dim-72 block in default mode (and lost under CUDA graphs); a point that
    names no tokens (written before they were recorded) says the pin won at 1280 wide."""
    monkeypatch.setenv("FULLGRAPH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(measured, "_names", {0: H200})
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu128")
    points = [
        {"op": "sdpa_flash", "dtype": "bf16", "head_dim": 72, "width": 1152, "rows": 2048, "mode": mode,
         "choice": choice, "tokens": 256}
        for mode, choice in (("default", "kernel"), ("graphed", "native"))
    ] + [{"op": "sdpa_flash", "dtype": "bf16", "head_dim": 72, "width": 1280, "rows": 2048, "mode": "default",
          "choice": "kernel"}]  # fmt: skip
    table = {"gpu": H200, "torch": "2.11", "triton": "3.6.0", "points": points}
    (tmp_path / measured.USER_FILE).write_text(json.dumps({"format": measured.FORMAT, "tables": [table]}))


@pytest.mark.parametrize(
    ("rows", "tokens", "width", "graphed", "pinned"),
    [(2048, 256, 1152, False, True), (3000, 375, 1152, False, True), (16384, 256, 1152, False, False),
     (2048, 256, 1280, False, False), (2048, 256, 1152, True, False),
     (2048, 1024, 1152, False, False),  # 2 x 1024 tokens: the rows of the measured point, 4x its sequence
     (2048, None, 1152, False, False)],  # tokens unknown (symbolic): native
)  # fmt: skip
def test_compiled_auto_pins_flash_only_at_a_close_measured_point(on_h200_with_a_flash_point, monkeypatch, rows,
                                                                 tokens, width, graphed, pinned):  # fmt: skip
    monkeypatch.setattr(direct.replay, "under_graphs", lambda: graphed)
    shape = measured.Shape(torch.bfloat16, 72, width, rows, tokens)
    plan = direct._traced(torch.device("cuda", 0), "layer_norm_modulate:2", (), shape)
    assert (plan.attention is direct._attention_traced_flash) == pinned
    with ops.policy(sdpa_flash="native"):  # a policy overrides the data
        assert direct._traced(torch.device("cuda", 0), "layer_norm_modulate:2", (), shape).attention is (
            direct._attention_traced)  # fmt: skip
