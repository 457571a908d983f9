import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fullgraph.bench import breakdown as bd
from fullgraph.bench.breakdown import Breakdown, Launch, find_flags, profile_breakdown, summarize
from fullgraph.bench.kernel_classes import classify
from tests.skips import requires_cuda


# Kernel names as the profiler reports them on an H200 (torch 2.11: cuBLAS, cuDNN, ATen, Inductor) and elsewhere.
def _seq(*kernels, calls=1):
    """Launches back to back, `calls` times over: (name, µs[, patch_conv]) each, one op per kernel."""
    out, t = [], 0.0
    for c in range(calls):
        for i, (name, us, *patch) in enumerate(kernels):
            out.append(Launch(name, t, us, classify(name), group=c * 100 + i, patch_conv=patch[0] if patch else ""))
            t += us
    return out


GEMM = "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN"
GELU = "triton_poi_fused_gelu_view_2"
NORM = "triton_per_fused_add_native_layer_norm_view_6"
NCHW = "void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>"


def _kinds(launches, calls=1, idle=0.05, cuda_graphs=False):
    return [f.kind for f in find_flags(launches, calls=calls, call_ms=1.0, idle_share=idle, cuda_graphs=cuda_graphs)]


def test_elementwise_between_gemms_is_an_epilogue_candidate():
    launches = _seq((GEMM, 300), (GELU, 40), ("Memset (Device)", 1), (GEMM, 300), calls=3)
    flags = find_flags(launches, calls=3, call_ms=1.0, idle_share=0.0)
    assert [f.kind for f in flags] == ["epilogue-candidate"]
    assert flags[0].ms == pytest.approx(0.040) and "_addmm_activation" in flags[0].fix
    assert "triton_poi_fused_gelu_view_2" in flags[0].message
    aten_gelu = "void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl(...)>(int)"
    gemm = Launch(GEMM, 0, 300, "gemm", 0, "aten::linear")
    launches = [gemm, Launch(aten_gelu, 300, 40, "elementwise", 1, "aten::gelu"), replace(gemm, start_us=340, group=2)]
    message = find_flags(launches, calls=1, call_ms=1.0, idle_share=0.0)[0].message  # the name shortened, with its op
    assert "(vectorized_elementwise_kernel (aten::gelu))" in message


def test_no_epilogue_flag_for_reductions_small_kernels_or_an_elementwise_tail():
    assert _kinds(_seq((GEMM, 300), (NORM, 40), (GEMM, 300))) == []  # LayerNorm needs whole rows
    assert _kinds(_seq((GEMM, 300), (GELU, 3), (GEMM, 300))) == []  # under FLAG_MIN_SHARE
    assert _kinds(_seq((GEMM, 300), (GEMM, 300), (GELU, 40))) == []  # not between two GEMMs


def test_control_sequence_gets_no_flags():
    assert _kinds(_seq(*[(GEMM, 300)] * 8, ("Memset (Device)", 2), calls=2)) == []


def test_layout_conversion_and_conv_as_gemm():
    assert _kinds(_seq((NCHW, 30), (GEMM, 300), (GEMM, 300))) == ["layout-conversion"]
    patch = "the patch-embedding convolution patch_embed.proj"
    flags = find_flags(_seq((NCHW, 30, patch), (GEMM, 300, patch), (GEMM, 600)), calls=1, call_ms=1.0, idle_share=0)
    assert [f.kind for f in flags] == ["conv-as-gemm"]  # its own conversions are part of it, not a second flag
    assert flags[0].ms == pytest.approx(0.33) and "F.linear" in flags[0].fix and "patch_embed.proj" in flags[0].message


def test_launch_bound_only_when_idle_and_not_already_graphed():
    launches = _seq((GEMM, 30), (GEMM, 30))
    assert _kinds(launches, idle=0.6) == ["launch-bound"]
    assert _kinds(launches, idle=0.6, cuda_graphs=True) == []
    assert _kinds(launches, idle=0.2) == []


def test_summary_sums_rates_and_json_round_trip():
    launches = [
        Launch(GEMM, 0, 1000, "gemm", 0, "aten::addmm", work_key=7, work=2e12 * 1e-3 * 500),  # 500 TFLOP/s
        Launch("kernel", 1000, 100, "gemm", 0, "aten::addmm", work_key=7, work=2e12 * 1e-3 * 500),  # same op
        Launch(GELU, 1100, 250, "elementwise", 1, "Inductor fusion: gelu_view", work_key=8, work=1e9),  # 4 TB/s
        Launch("Memset (Device)", 1350, 50, "copy", 2),
    ]
    b = summarize(
        launches,
        label="t",
        device="cuda",
        calls=2,
        call_ms=0.8,
        idle_share=0.1,
        ceilings={"copy_tbps": 4.0, "gemm_tflops_bf16": 800.0},
        dtype="bf16",
    )
    cls = {c.name: c for c in b.classes}
    assert sum(c.ms for c in b.classes) == pytest.approx(b.kernel_ms) == pytest.approx(0.7)
    assert sum(c.share for c in b.classes) == pytest.approx(1.0)
    assert cls["gemm"].kernels == 1 and cls["gemm"].rate == pytest.approx(1e12 / 1100e-6 / 1e12)
    assert cls["gemm"].unit == "TFLOP/s" and cls["gemm"].pct_of_ceiling == pytest.approx(cls["gemm"].rate / 8)
    assert cls["elementwise"].rate == pytest.approx(4.0) and cls["elementwise"].pct_of_ceiling == pytest.approx(100)
    assert cls["copy"].rate is None and cls["attention"].ms == 0
    assert b.top[0].name == GEMM and b.top[0].source == "aten::addmm"
    assert Breakdown.from_dict(json.loads(json.dumps(b.to_dict()))) == b


# ---- real profiles on the CPU -----------------------------------------------------------------------------


class Mlp(nn.Module):
    def __init__(self, dim, hidden, act=True):
        super().__init__()
        self.fc1, self.fc2, self.act = nn.Linear(dim, hidden), nn.Linear(hidden, dim), act

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(F.gelu(h) if self.act else h)


class Pointwise(nn.Module):
    def forward(self, x):
        for _ in range(4):
            x = torch.sin(x) * 1.5 + torch.cos(x).exp()
        return x


@pytest.fixture(autouse=True)
def one_thread():
    """Op times on a loaded 2-core machine are steadier without a second thread waiting for a core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _profile(fn, label, **kw):
    with torch.no_grad():
        return profile_breakdown(fn, device="cpu", label=label, calls=3, warmup=2, **kw)


def _check_sums(b):
    assert b.device == "cpu" and b.idle_share is None and b.ceilings == {} and b.call_ms > 0 and b.calls == 3
    assert b.kernel_ms > 0 and sum(c.ms for c in b.classes) == pytest.approx(b.kernel_ms)
    assert sum(c.share for c in b.classes) == pytest.approx(1.0)
    assert [c.name for c in b.classes] == list(bd.CLASSES)
    return max(b.classes, key=lambda c: c.ms).name


def test_cpu_eager_gemm_and_elementwise_models():
    mlp = nn.Sequential(*[Mlp(1024, 1024, act=False) for _ in range(2)]).eval()
    x = torch.randn(128, 1024)
    b = _profile(lambda: mlp(x), "eager mlp", model=mlp)
    assert _check_sums(b) == "gemm" and b.flags == []
    gemm = next(c for c in b.classes if c.name == "gemm")
    assert gemm.unit == "TFLOP/s" and 0 < gemm.rate < 10
    addmm = next(k for k in b.top if k.name == "aten::addmm")  # on the CPU each op's own time is one "launch"
    assert addmm.calls == 4 and addmm.cls == "gemm" and addmm.source == "aten::linear"
    assert Breakdown.from_dict(json.loads(json.dumps(b.to_dict()))) == b
    y = torch.randn(1 << 20)
    assert _check_sums(_profile(lambda: Pointwise()(y), "eager pointwise")) == "elementwise"


def test_cpu_eager_flags_gelu_between_linears_and_a_patch_convolution():
    mlp = Mlp(256, 2048).eval()
    b = _profile(lambda: mlp(torch.randn(512, 256)), "eager gelu mlp")
    assert "epilogue-candidate" in [f.kind for f in b.flags]
    patchify = nn.Sequential(nn.Conv2d(3, 96, 8, stride=8), nn.Flatten(2)).eval()
    img = torch.randn(8, 3, 128, 128)
    b = _profile(lambda: patchify(img), "eager patchify")
    conv = [f for f in b.flags if f.kind == "conv-as-gemm"]
    assert conv and "96x3x8x8" in conv[0].message
    same = nn.Conv2d(3, 96, 3, padding=1).eval()  # an ordinary convolution: no flag
    assert "conv-as-gemm" not in [f.kind for f in _profile(lambda: same(img), "eager conv", model=same).flags]


@pytest.mark.slow
def test_cpu_compiled_models():
    mlp = torch.compile(nn.Sequential(*[Mlp(1024, 1024, act=False) for _ in range(2)]).eval())
    x = torch.randn(128, 1024)
    assert _check_sums(_profile(lambda: mlp(x), "compiled mlp")) == "gemm"
    y = torch.randn(1 << 20)
    pointwise = torch.compile(Pointwise())
    b = _profile(lambda: pointwise(y), "compiled pointwise")
    assert _check_sums(b) == "elementwise" and "compiled graph's C++ kernels" in b.top[0].source
    # with each C++ kernel profiled, the kernels appear by name and the wrapper's own time is "other"
    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        pointwise = torch.compile(Pointwise())
        b = _profile(lambda: pointwise(y), "compiled pointwise, kernels profiled")
    assert _check_sums(b) == "elementwise" and "cpp_fused" in b.top[0].name


# ---- on the GPU -------------------------------------------------------------------------------------------


class ConvLinear(nn.Module):
    """An NCHW convolution (cuDNN converts to NHWC and back on Hopper) and a Linear on a transposed view (eager
    copies it, runs the GEMM, then adds the bias in a separate kernel: most of the time, seen on the H200)."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(64, 256, 3, padding=1), nn.Linear(256, 4096)

    def forward(self, x):
        return self.fc(self.conv(x).flatten(2).transpose(1, 2))


@requires_cuda
def test_gpu_class_totals_match_cuda_event_time():
    model = ConvLinear().cuda().to(torch.bfloat16).eval()
    x = torch.randn(64, 64, 56, 56, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        b = profile_breakdown(lambda: model(x), device="cuda", label="conv+linear", dtype=torch.bfloat16)
    assert b.kernel_ms == pytest.approx(b.call_ms, rel=0.05) and b.idle_share < 0.1
    cls = {c.name: c for c in b.classes}
    assert cls["gemm"].rate > 50 and 0 < cls["gemm"].pct_of_ceiling < 110 and cls["gemm"].kernels >= 2
    assert cls["elementwise"].unit == "TB/s" and 0 < cls["elementwise"].pct_of_ceiling < 110
    assert [f.kind for f in b.flags] == ["layout-conversion"]


@requires_cuda
def test_gpu_control_gets_no_flags_and_gelu_mlp_does():
    stack = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(8)]).cuda().to(torch.bfloat16).eval()
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        b = profile_breakdown(lambda: stack(x), device="cuda", label="control", model=stack)
        assert b.flags == [] and next(c for c in b.classes if c.name == "gemm").share > 0.95
        mlp = Mlp(4096, 16384).cuda().to(torch.bfloat16).eval()
        b = profile_breakdown(lambda: mlp(x), device="cuda", label="gelu mlp", model=mlp)
    assert "epilogue-candidate" in [f.kind for f in b.flags]
