"""Compiled `auto`'s decision data (ops/measured.py): the committed file, the user's override, `close`, and what a
dynamic dim reads."""

import json

import pytest
import torch
import torch._dynamo.testing

from fullgraph.kernels._library import ops_fingerprint
from fullgraph.models.dit import DiT, config
from fullgraph.ops import measured

H200 = "NVIDIA H200"
H100 = "NVIDIA H100 80GB HBM3"
DIT_3072 = (torch.bfloat16, 128, 3072)  # dtype, head dim, width of the committed measurements


def point(op="linear_gelu", head_dim=128, width=3072, rows=4096, mode="default", choice="kernel", dtype="bf16"):
    return {"op": op, "dtype": dtype, "head_dim": head_dim, "width": width, "rows": rows, "mode": mode,
            "choice": choice}  # fmt: skip


def user_decisions(tmp_path, monkeypatch, tables: list[dict]) -> None:
    """Write `tables` as the user's decision file in a fresh cache folder (what `bench sweep --write-decisions`
    leaves there) and point fullgraph at it."""
    monkeypatch.setenv("FULLGRAPH_CACHE_DIR", str(tmp_path))
    (tmp_path / measured.USER_FILE).write_text(json.dumps({"format": measured.FORMAT, "tables": tables}))


@pytest.fixture
def on_h200(monkeypatch, tmp_path):
    """cuda:0 reads as an H200 with the measured torch (2.11); no user file."""
    monkeypatch.setenv("FULLGRAPH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(measured, "_names", {0: H200, 1: "Unmeasured GPU"})
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu128")


def choice(op, rows, shape=DIT_3072, index=0):
    return measured.compiled_choice(op, torch.device("cuda", index), measured.Shape(*shape, rows))


def test_the_decision_reads_the_committed_file(on_h200):
    assert measured.DATA_FILE.is_file() and measured.DATA_FILE.suffix == ".json"
    committed = measured.read_points(measured.DATA_FILE)
    assert {p.gpu for p in committed} == {H200, H100} and set(measured.points()) == set(committed)
    # the former table at the DiT it was measured on: linear_gelu and the two fused ops' kernels at 1024-16384 tokens
    for rows in (1024, 4096, 16384):
        assert [choice(op, rows) for op in ("linear_gelu", "qk_norm_rope", "layer_norm_modulate")] == ["kernel"] * 3
        assert choice("skinny_linear", rows) == "native"
    # DiT-XL/2 (head dim 72): the fused ops lost there (issue 32), linear_gelu's epilogue won
    xl = (torch.bfloat16, 72, 1152)
    assert choice("qk_norm_rope", 2048, xl) == "native" and choice("linear_gelu", 2048, xl) == "kernel"


def test_an_h100_reads_its_own_points(on_h200, monkeypatch):
    # the sweep's default-mode points measured on an H100 (benchmarks/results/sweep_parts_h100.csv): linear_gelu's
    # epilogue won at 4096 rows at head dims 64-96, layer_norm_modulate lost everywhere; the H200's are not its
    monkeypatch.setattr(measured, "_names", {0: H100})
    for shape in ((torch.bfloat16, 72, 1152), (torch.bfloat16, 80, 1280), (torch.bfloat16, 96, 1536)):
        assert choice("linear_gelu", 4096, shape) == "kernel"
        assert choice("layer_norm_modulate", 4096, shape) == choice("skinny_linear", 4096, shape) == "native"
    assert choice("linear_gelu", 2048, (torch.bfloat16, 80, 1280)) == "native"  # within noise at 2048 rows there
    # the DiT 3072's video point, measured on the H100 too (sweep_dit_video_h100.csv): the epilogue +1.6%, the
    # fused norms within noise
    assert choice("linear_gelu", 16384) == "kernel"
    assert choice("layer_norm_modulate", 16384) == choice("qk_norm_rope", 16384) == "native"


def test_an_unmeasured_gpu_torch_or_shape_runs_native(on_h200, monkeypatch):
    assert choice("linear_gelu", 4096, index=1) == "native"  # a GPU nobody measured
    assert measured.compiled_choice("linear_gelu", torch.device("cpu"), measured.Shape(*DIT_3072, 4096)) == "native"
    assert choice("linear_gelu", 16384 * 4) == "native"  # rows far from every point
    assert choice("linear_gelu", 4096, (torch.bfloat16, 96, 1536)) == "native"  # a head dim nobody measured
    assert choice("linear_gelu", 4096, (torch.float16, 128, 3072)) == "native"  # nor in this dtype
    assert measured.compiled_choice("linear_gelu", torch.device("cuda", 0)) == "native"  # no shape given
    monkeypatch.setattr(torch, "__version__", "2.13.0")
    assert choice("linear_gelu", 4096) == "native"  # a torch version nobody measured


def test_close_is_same_everything_and_rows_within_a_factor_of_2():
    p = measured.Point(H200, "2.11", "rope", "bf16", 72, 1152, 1000, "default", "kernel")
    args = [H200, "2.11", "rope", "bf16", 72, 1152, 1000, "default"]
    assert measured.close(p, *args)
    for rows, expect in ((500, True), (2000, True), (499, False), (2001, False)):
        assert measured.close(p, *args[:6], rows, "default") is expect, rows
    for i, other in enumerate(["NVIDIA A100", "2.12", "rms_norm", "fp16", 64, 1280, None, "graphed"]):
        if other is not None:
            assert not measured.close(p, *args[:i], other, *args[i + 1 :]), other
    # the nearest close point decides, a tie goes to native
    near = [p, p._replace(rows=1900, choice="native")]
    assert measured.choice_among(near, *args[:6], 1300, "default") == "kernel"
    assert measured.choice_among(near, *args[:6], 1600, "default") == "native"
    assert measured.choice_among([p, p._replace(choice="native")], *args) == "native"
    assert measured.choice_among(near, *args[:6], 9000, "default") == "native"  # nothing close


def test_a_token_keyed_op_is_close_only_at_tokens_within_a_factor_of_2_known_on_both_sides():
    p = measured.Point(H200, "2.11", "sdpa_flash", "bf16", 72, 1152, 2048, "default", "kernel", 256)
    args = [H200, "2.11", "sdpa_flash", "bf16", 72, 1152, 2048, "default"]
    for tokens, expect in ((256, True), (128, True), (512, True), (127, False), (1024, False), (None, False)):
        assert measured.close(p, *args, tokens) is expect, tokens
    assert not measured.close(p._replace(tokens=None), *args, 256)  # a point that names no tokens speaks for none
    # an op that is not token keyed reads no tokens
    q = p._replace(op="linear_gelu", tokens=None)
    other = [*args[:2], "linear_gelu", *args[3:]]
    assert measured.close(q, *other, 1024) and measured.close(q, *other)
    assert "sdpa_flash" in measured.TOKEN_KEYED_OPS and "linear_gelu" not in measured.TOKEN_KEYED_OPS
    # a block's shape: tokens of one sequence where the tokens tensor has a batch dim
    assert measured.shape_of(torch.empty(8, 256, 64), 16, 64).tokens == 256
    assert measured.shape_of(torch.empty(256, 64), 16, 64).tokens is None
    # the spans a graph compares: boxes of rows and tokens, none for a shape without tokens
    assert measured.pick(((1024, 4096, 128, 512),), 2048, 256) == "kernel"
    assert measured.pick(((1024, 4096, 128, 512),), 2048, 1024) == measured.pick(((1024, 4096, 128, 512),), 2048) \
        == "native"  # fmt: skip


def test_the_users_file_replaces_the_committed_tables_of_the_gpus_it_names(on_h200, tmp_path, monkeypatch):
    assert choice("linear_gelu", 4096) == "kernel"
    user_decisions(tmp_path, monkeypatch, [
        {"gpu": H200, "torch": "2.11", "triton": "3.6", "points": [point(rows=4096, choice="native")]},
        {"gpu": "Unmeasured GPU", "torch": "2.11.0", "triton": "3.6", "points": [point(op="rope", rows=8192)]},
    ])  # fmt: skip
    assert choice("linear_gelu", 4096) == "native"
    assert choice("qk_norm_rope", 4096) == "native"  # the committed H200 points are all replaced
    assert choice("rope", 8192, index=1) == "kernel"
    (tmp_path / measured.USER_FILE).write_text("{not json")
    with pytest.warns(UserWarning, match="ignored"):
        assert choice("linear_gelu", 4096) == "kernel"  # a broken file is named and ignored


def test_a_changed_decision_file_changes_the_compile_cache_tag(tmp_path, monkeypatch):
    monkeypatch.setenv("FULLGRAPH_CACHE_DIR", str(tmp_path))
    before = ops_fingerprint()
    user_decisions(tmp_path, monkeypatch, [{"gpu": H200, "torch": "2.11", "points": [point()]}])
    first = ops_fingerprint()
    user_decisions(tmp_path, monkeypatch, [{"gpu": H200, "torch": "2.11", "points": [point(choice="native")]}])
    assert len({before, first, ops_fingerprint()}) == 3


def test_symbolic_rows_run_native_without_a_guard(on_h200):
    def fn(x):
        return x * 2, measured.compiled_choice("linear_gelu", torch.device("cuda", 0), measured.shape_of(x, 128, 3072))

    x = torch.randn(1024, 3072, dtype=torch.bfloat16)
    torch._dynamo.reset()
    assert torch.compile(fn, backend="eager", fullgraph=True, dynamic=False)(x)[1] == "kernel"  # static: measured
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("eager")
    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    for rows in (1024, 2000):
        _, picked = compiled(torch.randn(rows, 3072, dtype=torch.bfloat16))
        assert picked == "native"  # rows symbolic: reading them would guard
    assert counter.frame_count == 1


def test_a_dynamic_dit_at_two_token_counts_compiles_once():
    torch.manual_seed(0)
    model = DiT(config("dit_s", dim=64, heads=4, depth=2, rope="1d", max_tokens=64)).eval()
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for tokens in (16, 40):
            x, c = torch.randn(2, tokens, 64), torch.randn(2, 64)
            expected = model(x, c)  # eager first: a compile as the first call after a policy change traces
            # policies.version()'s lock (ops/policies.py), a graph break of its own
            torch.testing.assert_close(compiled(x, c), expected, rtol=1e-4, atol=1e-4)
    assert counter.frame_count == 1
