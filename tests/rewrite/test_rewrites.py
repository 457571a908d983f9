"""Graph rewrites (issue 33) on small models written as users write them, on the CPU: forced with rewrites=[names]
(auto applies them on CUDA only), compared with a float64 eager reference."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fullgraph
from fullgraph.compile import rewrites as registry
from fullgraph.errors import UsageError

BOTH = ["patch_gemm", "gelu_epilogue"]


class PatchEmbed(nn.Module):
    """A ViT's stem as timm writes it: a strided convolution, flattened to tokens."""

    def __init__(self, chans=3, dim=24, patch=4, **conv):
        super().__init__()
        self.proj = nn.Conv2d(chans, dim, patch, stride=conv.pop("stride", patch), **conv)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class Mlp(nn.Module):
    def __init__(self, dim=24, hidden=40, act=None, bias=True):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden, bias=bias), act or nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Vitish(nn.Module):
    def __init__(self, act=None, patch=4):
        super().__init__()
        self.embed, self.norm, self.mlp = PatchEmbed(patch=patch), nn.LayerNorm(24), Mlp(act=act)

    def forward(self, x):
        x = self.embed(x)
        return x + self.mlp(self.norm(x))


class TanhGelu(nn.Module):
    def forward(self, x):
        return F.gelu(x, approximate="tanh")


def reference(model, *inputs):
    with torch.no_grad():
        return copy.deepcopy(model).double()(*[x.double() for x in inputs])


def run(model, x, **kwargs):
    torch._dynamo.reset()
    cm = fullgraph.compile(model, "dev", **kwargs)
    with torch.no_grad():
        return cm(x), cm


def test_a_patch_embedding_and_a_gelu_mlp_become_gemms_and_match_fp64():
    torch.manual_seed(0)
    model, x = Vitish().eval(), torch.randn(3, 3, 16, 20)  # a 4x5 grid of patches: odd on purpose
    out, cm = run(model, x, rewrites=BOTH)
    ref = reference(model, x)
    assert (out.double() - ref).abs().max().item() < 1e-5 * ref.abs().max().item()
    assert cm.stats.rewrite_counts() == {"patch_gemm": 1, "gelu_epilogue": 1}
    places = {a.rewrite: a for a in cm.stats.rewrites}
    assert places["patch_gemm"].where == "embed.proj" and places["patch_gemm"].line.startswith("test_rewrites.py:")
    assert places["gelu_epilogue"].where == "mlp.act" and "GELU (erf)" in places["gelu_epilogue"].detail
    assert cm.stats.graph_breaks == 0


def test_a_dynamic_batch_keeps_the_rewrite_at_other_sizes():
    torch.manual_seed(1)
    model = Vitish().eval()
    torch._dynamo.reset()
    cm = fullgraph.compile(model, "dev", rewrites=["patch_gemm"], dynamic={"x": {0: (2, 8)}})
    with torch.no_grad():
        for batch in (2, 5, 7):
            x = torch.randn(batch, 3, 16, 16)
            ref = reference(model, x)
            assert (cm(x).double() - ref).abs().max().item() < 1e-5 * ref.abs().max().item()
    assert cm.stats.rewrite_counts() == {"patch_gemm": 1}


@pytest.mark.parametrize(
    "conv",
    [
        {"padding": 1},  # padded: not a patch embedding
        {"groups": 3},  # grouped
        {"dilation": 2, "stride": 8},  # dilated
        {"stride": 2},  # overlapping windows
    ],
)
def test_convolutions_that_almost_match_are_left_alone(conv):
    torch.manual_seed(2)
    model = nn.Sequential(PatchEmbed(chans=3, dim=6, patch=4, **conv)).eval()
    x = torch.randn(2, 3, 16, 16)
    out, cm = run(model, x, rewrites=["patch_gemm"])
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    assert cm.stats.rewrites == () and cm.stats.rewrites_skipped == ()


def test_symbolic_image_sizes_are_skipped_with_the_reason():
    model = nn.Sequential(PatchEmbed()).eval()
    _, cm = run(model, torch.randn(2, 3, 16, 16), rewrites=["patch_gemm"], dynamic=True)
    assert cm.stats.rewrites == ()
    assert [s.reason for s in cm.stats.rewrites_skipped] == ["the image's channels or size are symbolic (dynamic)"]


def test_an_image_that_is_not_whole_patches_is_skipped_with_the_reason():
    model = nn.Sequential(PatchEmbed()).eval()
    _, cm = run(model, torch.randn(2, 3, 18, 16), rewrites=["patch_gemm"])
    assert cm.stats.rewrites == ()
    assert [s.reason for s in cm.stats.rewrites_skipped] == ["the image (18x16) is not a whole number of 4x4 patches"]


def test_a_tanh_gelu_on_the_cpu_is_not_the_epilogues_gelu_and_is_left_with_the_reason():
    torch.manual_seed(3)
    model, x = Vitish(act=TanhGelu()).eval(), torch.randn(2, 3, 16, 16)
    out, cm = run(model, x, rewrites=["gelu_epilogue"])
    assert cm.stats.rewrites == ()
    (skip,) = cm.stats.rewrites_skipped
    assert (
        skip.where == "mlp.act" and "the tanh GELU, where the epilogue on cpu computes the exact (erf)" in skip.reason
    )
    ref = reference(model, x)
    assert (out.double() - ref).abs().max().item() < 1e-5 * ref.abs().max().item()


class SharedHidden(nn.Module):
    """fc1's output feeds the GELU and a second branch: the GELU cannot take its place."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)

    def forward(self, x):
        h = self.fc1(x)
        return F.gelu(h) + h.sum(-1, keepdim=True)


def test_a_gelu_whose_linear_output_is_used_elsewhere_or_has_no_bias_is_left_alone():
    torch.manual_seed(4)
    x = torch.randn(4, 8)
    shared = SharedHidden().eval()
    out, cm = run(shared, x, rewrites=["gelu_epilogue"])
    assert cm.stats.rewrites == () and cm.stats.rewrites_skipped == ()
    with torch.no_grad():
        torch.testing.assert_close(out, shared(x))
    no_bias = Mlp(dim=8, hidden=16, bias=False).eval()
    out, cm = run(no_bias, x, rewrites=["gelu_epilogue"])
    assert cm.stats.rewrites == ()
    assert [s.reason.split(":")[0] for s in cm.stats.rewrites_skipped] == ["no bias"]
    with torch.no_grad():
        torch.testing.assert_close(out, no_bias(x))


def test_auto_on_the_cpu_applies_nothing_and_says_why():
    model, x = Vitish().eval(), torch.randn(2, 3, 16, 16)
    _, cm = run(model, x)
    assert cm.stats.rewrites == ()
    assert {s.rewrite for s in cm.stats.rewrites_skipped} == {*BOTH, "layer_norm_kernel"}
    reasons = {s.rewrite: s.reason for s in cm.stats.rewrites_skipped}
    assert reasons["patch_gemm"].startswith("auto: not measured on cpu")
    assert reasons["gelu_epilogue"].startswith("auto: not measured on cpu")
    # the first norm reads the patch embedding's transposed output: rows not contiguous, the kernel's refusal
    assert reasons["layer_norm_kernel"] == "the rows are not contiguous (the kernel reads each row as one block)"


def test_no_rewrites_is_plain_torch_compile():
    torch.manual_seed(5)
    model, x = Vitish().eval(), torch.randn(2, 3, 16, 16)
    out, cm = run(model, x, rewrites=[])
    assert cm.resolved.rewrites is None and "pre_grad_custom_pass" not in cm.resolved.compile_kwargs()["options"]
    torch._dynamo.reset()
    with torch.no_grad():
        plain = torch.compile(model)(x)
    assert torch.equal(out, plain)


def test_bad_arguments_are_one_line_errors_naming_the_fix():
    with pytest.raises(
        UsageError, match=r"unknown rewrite 'patch'; the rewrites are token_select, patch_gemm, gelu_formula, "
    ):
        fullgraph.compile(Vitish(), "dev", rewrites=["patch"])
    with pytest.raises(UsageError, match=r"rewrites='all': give 'auto', a list of names"):
        fullgraph.compile(Vitish(), "dev", rewrites="all")
    with pytest.raises(UsageError, match=r"approximate_gelu='yes': give True or False"):
        fullgraph.compile(Vitish(), "dev", approximate_gelu="yes")


def test_the_pass_identity_covers_the_choice_and_the_rewrites_sources(monkeypatch):
    rec = registry.Recorder()
    ident = lambda *names, **kw: registry.make_pass(names, forced=True, recorder=rec, **kw).uuid()  # noqa: E731
    base = ident("patch_gemm", approximate_gelu=False)
    assert base == ident("patch_gemm", approximate_gelu=False)
    assert base != ident("patch_gemm", "gelu_epilogue", approximate_gelu=False)
    assert ident("gelu_epilogue", approximate_gelu=False) != ident("gelu_epilogue", approximate_gelu=True)
    patch = registry.load("patch_gemm")
    monkeypatch.setattr(type(patch), "identity", lambda self: "edited source")
    assert base != ident("patch_gemm", approximate_gelu=False)


def test_the_pass_pickles_as_its_identity_as_inductors_cache_keys_pickle_it():
    # torch 2.9-2.12 pickle Inductor's config, this pass included, into the FX-graph and AOTAutograd cache keys: a
    # pass that does not pickle bypassed both caches on every compile (H200, torch 2.11)
    import pickle

    rec = registry.Recorder()
    make = lambda *names: registry.make_pass(names, forced=False, approximate_gelu=False, recorder=rec)  # noqa: E731
    one, again, other = make("patch_gemm"), make("patch_gemm"), make("patch_gemm", "token_select")
    assert pickle.dumps(one) == pickle.dumps(again) != pickle.dumps(other)
    assert one.uuid().encode() in pickle.dumps(one)
    assert pickle.loads(pickle.dumps({"pre_grad_custom_pass": one})) == {"pre_grad_custom_pass": None}


def test_a_warm_inductor_cache_still_reports_the_rewrites(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(6)
    model, x = Vitish().eval(), torch.randn(2, 3, 16, 16)
    from torch._dynamo.utils import counters

    first, cold = run(model, x, rewrites=BOTH)
    before = dict(counters["inductor"])
    second, warm = run(model, x, rewrites=BOTH)  # Dynamo reset: traced again, Inductor's graph from its cache
    moved = {k: v - before.get(k, 0) for k, v in counters["inductor"].items() if v != before.get(k, 0)}
    assert moved.get("fxgraph_cache_hit", 0) >= 1 and not moved.get("fxgraph_cache_bypass"), moved
    assert torch.equal(first, second)
    assert warm.stats.rewrite_counts() == cold.stats.rewrite_counts() == {"patch_gemm": 1, "gelu_epilogue": 1}


def test_import_fullgraph_imports_no_rewrite_module():
    code = "import sys, fullgraph; print(sorted(m for m in sys.modules if m.startswith('fullgraph.rewrite')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_rewrite_that_fails_is_reported_and_the_compile_goes_on(monkeypatch):
    def broken(self, graph, context):
        raise RuntimeError("a bug in a rewrite")

    monkeypatch.setattr(type(registry.load("gelu_epilogue")), "apply", broken)
    torch.manual_seed(7)
    model, x = Vitish().eval(), torch.randn(2, 3, 16, 16)
    out, cm = run(model, x, rewrites=BOTH)
    assert cm.stats.rewrite_counts() == {"patch_gemm": 1}
    assert [s.reason for s in cm.stats.rewrites_skipped if s.rewrite == "gelu_epilogue"] == [
        "failed, graph left as it was: RuntimeError('a bug in a rewrite')"
    ]
    ref = reference(model, x)
    assert (out.double() - ref).abs().max().item() < 1e-5 * ref.abs().max().item()


def test_patch_gemm_auto_takes_the_kinds_measured_and_no_other():
    from fullgraph.rewrite.patch import measured

    # ViT-B/16's and CLIP-L/14's patch embeddings, ConvNeXt's and Swin's 4x4 stems, ConvNeXt-T's 2x2 downsamplings
    assert all(measured(c, k, k) for c, k in ((3, 16), (3, 14), (3, 4), (1, 8), (96, 2), (192, 2), (384, 2)))
    # 2x2 patches of an image, a 2x2 downsampling of ConvNeXt-B's widest map, a 4x4 over a feature map: not measured
    assert not any(measured(c, kh, kw) for c, kh, kw in ((3, 2, 2), (3, 4, 2), (1024, 2, 2), (96, 4, 4), (96, 2, 4)))


@pytest.mark.gpu
def test_on_cuda_auto_takes_both_where_exact_and_follows_the_tf32_settings(monkeypatch):
    torch.manual_seed(8)
    x = torch.randn(4, 3, 32, 32, device="cuda")
    tanh = Vitish(act=TanhGelu(), patch=8).eval().cuda()  # a ViT's patch embedding: 8x8 patches of an image
    ref = reference(tanh, x)
    out, cm = run(tanh.to(torch.bfloat16), x.to(torch.bfloat16))
    assert cm.stats.rewrite_counts() == {"patch_gemm": 1, "gelu_epilogue": 1}
    assert (out.double() - ref).norm().item() < 2e-2 * ref.norm().item()
    erf = Vitish(patch=8).eval().cuda().to(torch.bfloat16)  # exact GELU: no tanh epilogue without the opt-in
    _, cm = run(erf, x.to(torch.bfloat16))
    assert cm.stats.rewrite_counts() == {"patch_gemm": 1}
    _, cm = run(erf, x.to(torch.bfloat16), approximate_gelu=True)
    assert cm.stats.rewrite_counts() == {"patch_gemm": 1, "gelu_epilogue": 1}
    stem = Vitish(act=TanhGelu(), patch=4).eval().cuda().to(torch.bfloat16)  # a ConvNeXt-like 4x4 stem: measured
    _, cm = run(stem, x.to(torch.bfloat16))
    assert cm.stats.rewrite_counts() == {"patch_gemm": 1, "gelu_epilogue": 1}
    tiny = Vitish(act=TanhGelu(), patch=2).eval().cuda().to(torch.bfloat16)  # 2x2 patches of an image: not measured
    _, cm = run(tiny, x.to(torch.bfloat16))
    assert cm.stats.rewrite_counts() == {"gelu_epilogue": 1}
    assert any(s.reason.startswith("auto: measured on patch embeddings of images") for s in cm.stats.rewrites_skipped)
    _, cm = run(tiny, x.to(torch.bfloat16), rewrites=["patch_gemm"])
    assert cm.stats.rewrite_counts() == {"patch_gemm": 1}
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    _, cm = run(Vitish(act=TanhGelu(), patch=8).eval().cuda(), x)  # fp32, TF32 convolutions, full-fp32 matmuls
    assert "patch_gemm" not in cm.stats.rewrite_counts()
    assert any(s.reason.startswith("fp32: convolutions run TF32") for s in cm.stats.rewrites_skipped)


def test_an_exact_gelu_takes_our_gemm_under_the_ops_policy_and_matches_fp64(triton_device):
    torch.manual_seed(11)
    model, x = Vitish().eval().to(triton_device), torch.randn(2, 3, 16, 16, device=triton_device)
    with fullgraph.ops.policy(linear_gelu="kernel"):  # the vocabulary of our own ops: our kernel wherever it runs
        out, cm = run(model, x)
    assert [(a.rewrite, a.where) for a in cm.stats.rewrites if a.rewrite == "gelu_epilogue"] == [
        ("gelu_epilogue", "mlp.act")
    ]
    assert next(a.detail for a in cm.stats.rewrites if a.rewrite == "gelu_epilogue").endswith(
        "fullgraph's GEMM with the exact GELU"
    )
    ref = reference(model, x)  # fp32 matmuls without TF32 (torch's default) on CUDA too
    assert (out.double() - ref).abs().max().item() < 1e-5 * ref.abs().max().item()
    with fullgraph.ops.policy(linear_gelu="native"):  # native stops both routes, even forced
        _, cm = run(model, x, rewrites=["gelu_epilogue"])
    assert cm.stats.rewrites == ()
    assert [s.reason for s in cm.stats.rewrites_skipped] == ["op linear_gelu's policy is native"]


@pytest.mark.gpu
def test_on_cuda_an_exact_gelu_takes_our_gemm_only_where_measured_or_forced():
    torch.manual_seed(12)
    model = Vitish().eval().cuda().to(torch.bfloat16)
    x = torch.randn(4, 3, 32, 32, device="cuda")
    ref = reference(model, x)
    _, cm = run(model, x.to(torch.bfloat16))  # auto: no decision data for linear_gelu_erf at this width
    (skip,) = [s for s in cm.stats.rewrites_skipped if s.rewrite == "gelu_epilogue"]
    assert skip.reason.startswith("auto: no in-graph measurement says our kernel wins at width 24 on cuda")
    out, cm = run(model, x.to(torch.bfloat16), rewrites=["gelu_epilogue"])
    assert cm.stats.rewrite_counts() == {"gelu_epilogue": 1}
    assert (out.double() - ref).norm().item() < 2e-2 * ref.norm().item()


class TwoNorms(nn.Module):
    """nn.LayerNorm over the last dim (our kernel's pattern) and F.layer_norm over the last two (not it)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(24)

    def forward(self, x):
        return self.norm(x) + F.layer_norm(x, x.shape[-2:])


def test_layer_norm_follows_the_ops_policy_and_matches_fp64(triton_device):
    torch.manual_seed(9)
    model, x = TwoNorms().eval().to(triton_device), torch.randn(3, 7, 24, device=triton_device)
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    with fullgraph.ops.policy(layer_norm="kernel"):  # the vocabulary of our own ops
        out, cm = run(model, x)
    assert [(a.rewrite, a.where) for a in cm.stats.rewrites] == [("layer_norm_kernel", "norm")]
    ref = reference(model, x)
    assert (out.double() - ref).abs().max().item() < 1e-5 * ref.abs().max().item()
    with fullgraph.ops.policy(layer_norm="native"):  # native stops it, even forced
        _, cm = run(model, x, rewrites=["layer_norm_kernel"])
    assert cm.stats.rewrites == ()
    assert [s.reason for s in cm.stats.rewrites_skipped] == ["op layer_norm's policy is native"]


def artifact(text: str, name: str) -> str:
    """The payload (tab-indented lines) of the trace artifact `name` in a structured trace log."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if f'"name": "{name}"' in line)
    body = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        body.append(line[1:])
    return "\n".join(body)


def test_debug_shows_the_graph_before_and_after_the_rewrites(tmp_path):
    torch.manual_seed(10)
    model, x = Vitish().eval(), torch.randn(2, 3, 16, 16)
    torch._dynamo.reset()
    cm = fullgraph.compile(model, "dev", rewrites=BOTH, debug=tmp_path)
    with torch.no_grad():
        cm(x)
    (log,) = cm.debug_files
    text = Path(log).read_text()
    before, after = artifact(text, "before_pre_grad_graph"), artifact(text, "after_pre_grad_graph")
    assert "conv2d" in before and "_addmm_activation" not in before
    assert "conv2d" not in after and "_addmm_activation" in after


WARM_CHILD = """
import json, sys, torch, fullgraph
from torch._dynamo.utils import counters
from tests.rewrite.test_rewrites import Vitish
torch.manual_seed(6)
model, x = Vitish().eval(), torch.randn(2, 3, 16, 16)
cm = fullgraph.compile(model, "dev", rewrites=["patch_gemm", "gelu_epilogue"])
with torch.no_grad():
    out = cm(x)
places = sorted((a.rewrite, a.where, a.line) for a in cm.stats.rewrites)
print(json.dumps({"hit": counters["inductor"]["fxgraph_cache_hit"], "places": places, "sum": out.sum().item()}))
"""


@pytest.mark.slow
def test_a_second_process_with_a_warm_cache_reports_the_same_rewrites(tmp_path):
    """Issue 33: the stats are the same when the graph comes from the compile cache of an earlier process."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}

    def child() -> dict:
        done = subprocess.run([sys.executable, "-c", WARM_CHILD], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    cold, warm = child(), child()
    assert cold["hit"] == 0 and warm["hit"] >= 1
    assert warm["places"] == cold["places"] and {p[0] for p in cold["places"]} == {"patch_gemm", "gelu_epilogue"}
    assert warm["sum"] == cold["sum"]
