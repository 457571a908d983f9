import pytest

from fullgraph.bench.suites import vit as suite
from fullgraph.errors import UsageError
from tests.bench.suites import run_suite


@pytest.mark.slow
def test_suite_times_the_reference_and_ours_eager_and_compiled(tmp_path, capsys):
    rows, timed = run_suite(tmp_path, "vit", "--batches", "3")
    assert timed == {"plain, eager fp32", "plain, compiled default fp32", "ours, compiled default fp32"}
    errors = {r.variant: r.value for r in rows if r.metric == "rel_err"}
    assert errors["plain, eager fp32"] == 0 and errors["plain, compiled default fp32"] < 1e-5, errors
    # ours runs the tanh GELU against the reference's exact one: close, and not identical (a wrong model is far off)
    assert 1e-7 < errors["ours, compiled default fp32"] < 1e-2, errors
    first = {r.variant: r.value for r in rows if r.metric == "first_call_s"}
    assert first["plain, compiled default fp32"] > first["plain, eager fp32"]  # the compile is in the first call
    throughput = {r.variant: r.value for r in rows if r.metric == "images_per_s"}
    median = {r.variant: r.value for r in rows if r.metric == "median_ms"}
    assert all(abs(throughput[v] * median[v] - 3e3) < 1e-6 * 3e3 for v in timed)
    assert "reference: plain" in capsys.readouterr().out


@pytest.mark.parametrize(("spec", "gpu", "match"), [("fast", True, "unknown fast"), ("reduce-overhead", False, "GPU")])
def test_bad_modes(spec, gpu, match):
    with pytest.raises(UsageError, match=match):
        suite.parse_modes(spec, gpu)


def test_default_modes():
    assert suite.parse_modes(None, gpu=True) == ("default", "reduce-overhead")
    assert suite.parse_modes(None, gpu=False) == ("default",)
