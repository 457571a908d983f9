"""The doctor's "where the time goes" judges each kernel against its own math mode's ceiling (issue 34, item 3).

RetinaNet eager fp32 on the H200 read "gemm 133 TFLOP/s, 259% of ceiling": its convolutions ran in TF32 (cuDNN's
`allow_tf32`, on by default) against the fp32 GEMM ceiling. Convolutions follow cuDNN's flag, GEMMs the matmul
precision; a rate above 105% of its ceiling (measurement noise) is a bug. (The breakdown's own tests sit in
tests/bench/; these hold the doctor's claims.)
"""

import contextlib

import pytest
import torch

from fullgraph.bench import ceilings as ceil
from fullgraph.bench.breakdown import Breakdown, profile_breakdown, summarize
from fullgraph.bench.profile_events import Launch
from tests.skips import requires_cuda

NOISE = 1.05  # a rate over 105% of its ceiling is not noise
H200 = {"copy_tbps": 4.3, "gemm_tflops_fp32": 51.2, "gemm_tflops_tf32": 400.0, "gemm_tflops_bf16": 760.0}


def assert_within_ceilings(b: Breakdown) -> None:
    over = [(c.name, round(c.pct_of_ceiling)) for c in b.classes if c.pct_of_ceiling and c.pct_of_ceiling > 100 * NOISE]
    assert not over, f"{b.label}: rates above {NOISE:.0%} of their ceiling: {over}"


@contextlib.contextmanager
def math_modes(matmul: str, cudnn_tf32: bool):
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


def _launch(name, start, us, source, key, tflops):
    return Launch(name, start, us, "gemm", key, source, work_key=key, work=tflops * 1e12 * us * 1e-6)


# RetinaNet-like fp32: convolutions in TF32 at 133 TFLOP/s, a GEMM in fp32 at 45.
CONV = _launch("sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc", 0, 800, "aten::convolution", 1, 133)
GEMM = _launch("sm90_xmma_gemm_f32f32_f32f32_f32_tn_n", 800, 200, "aten::addmm", 2, 45)


def _gemm(launches, dtype, conv_dtype):
    b = summarize(launches, label="fp32", device="cuda", calls=1, call_ms=1.2, idle_share=0.1, ceilings=H200,
                  dtype=dtype, conv_dtype=conv_dtype)  # fmt: skip
    return b, next(c for c in b.classes if c.name == "gemm")


@pytest.mark.parametrize(
    ("matmul", "cudnn_tf32", "gemm_tag", "conv_tag"),
    [("highest", True, "fp32", "tf32"), ("high", True, "tf32", "tf32"), ("highest", False, "fp32", "fp32"),
     ("high", False, "tf32", "fp32")],
)  # fmt: skip
def test_float32_math_modes_follow_their_own_flags(matmul, cudnn_tf32, gemm_tag, conv_tag):
    with math_modes(matmul, cudnn_tf32):
        assert (ceil.dtype_tag(torch.float32), ceil.conv_dtype_tag(torch.float32)) == (gemm_tag, conv_tag)
        assert ceil.dtype_tag(torch.bfloat16) == ceil.conv_dtype_tag(torch.bfloat16) == "bf16"
        assert ceil.conv_dtype_tag(torch.float16) == "fp16"


def test_tf32_convolutions_beside_fp32_gemms_are_judged_each_by_its_own_mode():
    b, gemm = _gemm([CONV, GEMM], "fp32", "tf32")
    assert_within_ceilings(b)
    work = CONV.work + GEMM.work
    expected = work / (CONV.work / 400e12 + GEMM.work / 51.2e12) / 1e12  # the work-weighted ceiling
    assert gemm.pct_of_ceiling == pytest.approx(100 * gemm.rate / expected)
    wrong, _ = _gemm([CONV, GEMM], "fp32", "fp32")  # the H200 report's mistake: TF32 convolutions, fp32 ceiling
    with pytest.raises(AssertionError, match="above 105% of their ceiling"):
        assert_within_ceilings(wrong)


def test_a_missing_ceiling_for_a_mode_in_use_gives_no_percentage():
    fp32_only = {k: v for k, v in H200.items() if k != "gemm_tflops_tf32"}
    b = summarize([CONV, GEMM], label="fp32", device="cuda", calls=1, call_ms=1.2, idle_share=0.1,
                  ceilings=fp32_only, dtype="fp32", conv_dtype="tf32")  # fmt: skip
    assert next(c for c in b.classes if c.name == "gemm").pct_of_ceiling is None  # never a fp32 ceiling for TF32


def test_each_mode_is_measured_in_that_mode_and_kept_apart(tmp_path, monkeypatch):
    """float32 with the matmul precision at "highest" and cuDNN's TF32 on needs two GEMM ceilings: fp32 for the
    GEMMs, tf32 for the convolutions, each measured with the matmul precision set to its mode, then restored."""
    seen = []

    def fake_measure(device, gemm_dtype, reps):
        seen.append((gemm_dtype, torch.get_float32_matmul_precision()))
        tflops = 400.0 if torch.get_float32_matmul_precision() == "high" else 51.2
        return type("C", (), {"copy_tbps": 4.3, "gemm_tflops": tflops})()

    monkeypatch.setenv("FULLGRAPH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ceil, "resolve_device", lambda d: torch.device("cuda"))
    monkeypatch.setattr(ceil, "measure_ceilings", fake_measure)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Fake H200")
    monkeypatch.setattr(ceil, "_memory", {})
    with math_modes("highest", True):
        got = ceil.ceilings_for("cuda", torch.float32)
        assert torch.get_float32_matmul_precision() == "highest"
    assert got == {"copy_tbps": 4.3, "gemm_tflops_fp32": 51.2, "gemm_tflops_tf32": 400.0}
    assert seen == [(torch.float32, "highest"), (torch.float32, "high")]


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_conv_and_linear_model_stays_within_its_ceilings(dtype):
    model = torch.nn.Sequential(
        torch.nn.Conv2d(64, 256, 3, padding=1), torch.nn.Flatten(2), torch.nn.Linear(56 * 56, 1024)
    ).to("cuda", dtype)
    x = torch.randn(32, 64, 56, 56, device="cuda", dtype=dtype)
    with torch.no_grad():
        b = profile_breakdown(lambda: model(x), device="cuda", label=f"conv+linear {dtype}", dtype=dtype)
    assert any(c.pct_of_ceiling for c in b.classes if c.name == "gemm")
    assert_within_ceilings(b)
