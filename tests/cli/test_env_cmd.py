import importlib.util

import pytest

from fullgraph import env
from fullgraph.cli.env_cmd import attention_dispatch, format_dispatch, format_report
from fullgraph.ops.attention_backends import BACKENDS


@pytest.fixture(scope="module")
def probed():
    report = env.collect()
    return report, attention_dispatch(report.attention_device, report.attention)


def test_every_sdpa_probe_agrees_with_the_dispatch(probed):
    # Issue 11: the probes said "no" where the dispatch table said "yes". One answer per backend now, and the
    # capability table the dispatch decides from must match what a real call does on this machine.
    report, d = probed
    assert {p.name for p in report.attention} == {f"sdpa-{b}" for b in env.SDPA_BACKENDS}
    for p in report.attention:
        assert d["backends"][p.name]["runs"] == p.ok, (p.name, p.detail, d["backends"][p.name]["detail"])


def test_cpu_answers(probed):
    report, d = probed
    if report.attention_device != "cpu":
        pytest.skip("the CPU's answers")
    b = d["backends"]
    math = {"installed": True, "runs": True, "detail": "ran and matched float64 (float32 head dim 64 on cpu)"}
    assert b["sdpa-math"] == math
    for name in ("sdpa-efficient", "sdpa-cudnn"):
        assert b[name]["installed"] and not b[name]["runs"] and "does not run on cpu" in b[name]["detail"]
    assert b["triton"]["runs"] == env.triton_runs_on("cpu")[0]


def test_a_missing_package_is_neither_installed_nor_runnable(probed):
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed here")
    row = probed[1]["backends"]["flash_attn"]
    assert row == {"installed": False, "runs": False, "detail": "it is not installed (import flash_attn fails)"}


def test_a_probe_that_contradicts_the_capability_table_is_shown():
    device = "cuda" if env.has_cuda() else "cpu"
    d = attention_dispatch(device, [env.Probe("sdpa-math", False, "kernel launch failed")])
    row = d["backends"]["sdpa-math"]
    assert not row["runs"] and row["detail"] == "it can serve the call, but the probe failed: kernel launch failed"


def test_not_probed_still_answers_from_the_dispatch():
    d = attention_dispatch("cpu", [])
    assert d["backends"]["sdpa-math"]["runs"] and "not probed" in d["backends"]["sdpa-math"]["detail"]
    assert not d["backends"]["sdpa-cudnn"]["runs"]


def test_text_lists_each_backend_once(probed):
    report, d = probed
    text = format_report(report) + "\n\n" + format_dispatch(d)
    assert text.count("Attention backends") == 1  # one table, where there were two that disagreed
    lines = text.split("Attention backends")[1].splitlines()
    for name in BACKENDS:
        (row,) = [line for line in lines if line.split()[:1] == [name]]
        b = d["backends"][name]
        assert row.split()[1:3] == ["yes" if b["installed"] else "no", "yes" if b["runs"] else "no"], row
    assert "runs here" in text and "auto picks among those that run" in text
