import math

import pytest
import torch

from fullgraph.diagnose import doctor as doc
from fullgraph.diagnose.demo import demo
from fullgraph.diagnose.report import ConfigResult, Report
from tests.diagnose import models


@pytest.fixture(scope="module")
def demo_report():
    model, inputs = demo()
    return doc.doctor(model, inputs, vary=["batch"], reps=3)


def test_demo_report_finds_breaks_recompiles_and_recommends(demo_report):
    r = demo_report
    assert r.graph_break_count == 2 and len(r.graph_breaks) == 2
    assert {b.source.split("#")[0].strip() for b in r.graph_breaks} == {
        "if h.mean() > 0:",
        "scale = h.abs().amax().item()",
    }
    assert r.recompiles and all(c.trigger == "batch" for c in r.recompiles)
    assert [c.name for c in r.configs] == ["eager fp32", "compile default fp32"]
    assert all(c.ok and c.median_ms > 0 for c in r.configs)
    assert r.configs[1].compile_s > 0 and r.configs[0].compile_s is None
    fastest = min(r.configs, key=lambda c: c.median_ms)
    assert r.recommendation.config == fastest.name
    assert ("torch.compile" in r.recommendation.code) == (fastest.mode != "eager")
    status = {c.item: c.status for c in r.checklist}
    assert status["Graph breaks analysed and removed"] == "fail"
    assert status["Dynamic shapes handled (fixed, bucketed or declared dynamic)"] == "fail"
    assert status["CUDA graphs run without skips"] == "not-measured"


def test_report_json_round_trip(demo_report):
    assert Report.from_json(demo_report.to_json()) == demo_report


def test_clean_model_passes_its_checks():
    model = models.Clean()
    r = doc.doctor(model, (torch.randn(4, 16),), modes=["eager"], vary=["batch"], reps=3)
    assert r.graph_break_count == 0 and r.graph_breaks == []
    status = {c.item: c.status for c in r.checklist}
    assert status["Graph breaks analysed and removed"] == "pass"


def cfg(name, ms, err, tol=1e-3, mode="default", dtype="fp32"):
    return ConfigResult(name, mode, dtype, median_ms=ms, rel_err=err, tolerance=tol)


def test_recommendation_is_the_fastest_within_tolerance():
    configs = [
        cfg("eager fp32", 10.0, 0.0, mode="eager"),
        cfg("compile default fp32", 6.0, 1e-6),
        cfg("compile max-autotune bf16", 2.0, 0.5, tol=4e-2, mode="max-autotune", dtype="bf16"),  # over tolerance
        cfg("compile reduce-overhead bf16", 3.0, 1e-2, tol=4e-2, mode="reduce-overhead", dtype="bf16"),
        ConfigResult("compile max-autotune fp32", "max-autotune", "fp32", error="RuntimeError: boom"),
    ]
    rec = doc.recommend(configs)
    assert rec.config == "compile reduce-overhead bf16"
    assert math.isclose(rec.speedup, 10.0 / 3.0) and rec.baseline == "eager fp32"
    assert rec.versus == "3.33x eager fp32"
    assert 'mode="reduce-overhead"' in rec.code and "torch.bfloat16" in rec.code
    assert doc.recommend([configs[2]]) is None


def test_speedup_is_over_the_eager_row_the_table_has():
    bf16 = [
        cfg("eager bf16", 4.0, 1e-2, tol=4e-2, mode="eager", dtype="bf16"),
        cfg("compile reduce-overhead bf16", 0.5, 1e-2, tol=4e-2, mode="reduce-overhead", dtype="bf16"),
    ]
    rec = doc.recommend(bf16)  # --dtype bf16: no eager fp32 row, so not "x eager fp32"
    assert rec.baseline == "eager bf16" and math.isclose(rec.speedup, 8.0) and rec.versus == "8.00x eager bf16"
    rec = doc.recommend(bf16[1:])  # --mode without eager: no speed-up claimed at all
    assert rec.speedup is None and rec.baseline is None and rec.versus == ""
    rec = doc.recommend([bf16[0]])  # eager itself is the best: no "1.00x eager bf16"
    assert rec.config == "eager bf16" and rec.versus == "" and "did not beat eager" in rec.code


def test_rel_err_never_passes_nan():
    ref = torch.randn(5)
    assert doc._rel_err(ref.clone(), ref) == 0
    assert doc._rel_err(torch.full((5,), float("nan")), ref) == float("inf")
    assert doc._rel_err((ref, ref), ref) == float("inf")  # structure mismatch


def test_vary_inputs():
    x = torch.randn(4, 7, 16)
    (b,) = doc.vary_inputs((x,), "batch")
    (s,) = doc.vary_inputs((x,), "seq")
    (d,) = doc.vary_inputs((x,), "dtype")
    assert b.shape == (9, 7, 16) and s.shape == (4, 15, 16) and d.dtype == torch.float16
    assert doc.vary_inputs((torch.randn(3),), "seq") is None
