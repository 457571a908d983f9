import json

import pytest
import torch

from fullgraph.bench import ceilings
from fullgraph.bench.roofline import gemm_flops, tbps, tflops
from tests.skips import requires_cuda


def test_cpu_ceilings_are_consistent():
    c = ceilings.measure_ceilings("cpu", copy_bytes=8 << 20, gemm_n=256, reps=5)
    assert c.device == "cpu" and c.copy_timing.method == "cpu-clock"
    assert c.copy_tbps == pytest.approx(tbps(2 * c.copy_bytes, c.copy_timing.min_ms))  # the best, as ceilings_for's
    assert c.gemm_tflops == pytest.approx(tflops(gemm_flops(256, 256, 256), c.gemm_timing.min_ms))
    assert c.copy_timing.min_ms <= c.copy_timing.median_ms
    assert 0 < c.copy_tbps < 1.0 and 0 < c.gemm_tflops < 100  # a 2-core CPU is far from a GPU's figures


@requires_cuda
def test_gpu_ceilings_match_the_card():
    c = ceilings.measure_ceilings("cuda")
    name = torch.cuda.get_device_name(0)
    if "H200" not in name:
        pytest.skip(f"expected figures are for an H200, this is {name}")
    # DESIGN.md measured 4.27 TB/s and 724-788 TFLOP/s on this card.
    assert 3.8 < c.copy_tbps < 4.8
    assert 650 < c.gemm_tflops < 900


def test_ceilings_for_the_cpu_are_empty():
    assert ceilings.ceilings_for("cpu", torch.bfloat16) == {}


def test_dtype_tags():
    assert ceilings.dtype_tag(torch.bfloat16) == "bf16" and ceilings.dtype_tag(torch.float16) == "fp16"
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert ceilings.dtype_tag(torch.float32) == "fp32"
        torch.set_float32_matmul_precision("high")  # TF32 allowed: another GEMM ceiling
        assert ceilings.dtype_tag(torch.float32) == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)


def test_cached_ceilings_measure_once_per_key_and_survive_a_new_process(tmp_path, monkeypatch):
    path = str(tmp_path / "ceilings.json")
    measured = []

    def fake(value):
        def measure_now():
            measured.append(value)
            return {"copy_tbps": value, "gemm_tflops_bf16": 100 * value}

        return measure_now

    monkeypatch.setattr(ceilings, "_memory", {})
    assert ceilings.cached_ceilings("H200|bf16", fake(4.2), path) == {"copy_tbps": 4.2, "gemm_tflops_bf16": 420.0}
    assert ceilings.cached_ceilings("H200|bf16", fake(9.9), path)["copy_tbps"] == 4.2  # this process remembers
    monkeypatch.setattr(ceilings, "_memory", {})  # as a new process: read back from the file
    assert ceilings.cached_ceilings("H200|bf16", fake(9.9), path)["copy_tbps"] == 4.2
    assert ceilings.cached_ceilings("H200|fp16", fake(3.1), path)["copy_tbps"] == 3.1  # another dtype measures
    assert measured == [4.2, 3.1]
    with open(path) as f:
        assert set(json.load(f)["ceilings"]) == {"H200|bf16", "H200|fp16"}


def test_a_corrupt_ceilings_file_warns_and_is_measured_again(tmp_path, monkeypatch):
    path = tmp_path / "ceilings.json"
    path.write_text('{"ceilings": {"H200|bf16": "fast"}}')
    monkeypatch.setattr(ceilings, "_memory", {})
    with pytest.warns(UserWarning, match="ignoring the ceilings cache"):
        got = ceilings.cached_ceilings("H200|bf16", lambda: {"copy_tbps": 4.0}, str(path))
    assert got == {"copy_tbps": 4.0} and json.loads(path.read_text())["ceilings"]["H200|bf16"] == got


@requires_cuda
def test_gpu_ceilings_for_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("FULLGRAPH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ceilings, "_memory", {})
    got = ceilings.ceilings_for("cuda", torch.bfloat16)
    assert set(got) == {"copy_tbps", "l2_tbps", "l2_bytes", "gemm_tflops_bf16"}
    assert got["copy_tbps"] > 0.5 and got["gemm_tflops_bf16"] > 50 and got["l2_tbps"] >= got["copy_tbps"]
    saved = json.loads((tmp_path / "ceilings.json").read_text())["ceilings"]
    name = f"{torch.cuda.get_device_name(0)}|v{ceilings.CACHE_VERSION}"
    assert saved[f"{name}|bf16"] == {"gemm_tflops_bf16": got["gemm_tflops_bf16"]}
    assert saved[f"{name}|memory"]["l2_bytes"] == torch.cuda.get_device_properties(0).L2_cache_size
