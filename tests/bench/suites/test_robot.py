import json

import pytest

from fullgraph.bench.suites import robot as suite
from fullgraph.cli.main import main
from fullgraph.errors import UsageError
from tests.bench.suites import run_suite


@pytest.mark.slow
def test_declared_ways_never_recompile_after_warm_up_and_match_eager(tmp_path, capsys):
    # "whole dynamic" is left out: its compile alone takes 10-40 s on a 2-core CPU (the suite's default runs it)
    rows, timed = run_suite(tmp_path, "robot", "--ways", "eager,declared,plan", "--n", "6", "--seed", "3")
    assert timed == {"eager", "whole declared", "plan"}
    by = {(r.variant, r.metric): r.value for r in rows}
    for way in ("whole declared", "plan"):
        assert by[(way, "recompiles_after_warmup")] == 0 and by[(way, "frames_after_warmup")] == 0
        assert by[(way, "graph_breaks")] == 0
        assert by[(way, "warmup_frames")] >= 1 and by[(way, "compile_seconds")] > 0
        assert by[(way, "max_abs_diff_vs_eager")] < 1e-4
    assert by[("eager", "max_abs_diff_vs_eager")] == 0 and by[("eager", "compile_seconds")] == 0
    for way in timed:
        assert 0 < by[(way, "p20_ms")] <= by[(way, "median_ms")] <= by[(way, "p80_ms")]
    params = json.loads(rows[0].params)
    assert (params["config"], params["requests"], params["warmup"], params["seed"]) == ("robot_tiny", 6, 2, 3)
    assert params["sizes"] > 1  # the requests really vary
    out = capsys.readouterr().out
    assert "robot_tiny (cpu, fp32, batch 1): 6 requests" in out
    assert "plan:\nvision: preset='planning'" in out and "fusion: eager" in out


def test_ways_parse_in_order_without_repeats():
    assert suite.parse_ways(None) == ("eager", "dynamic", "declared", "plan")
    assert suite.parse_ways("plan, eager,plan") == ("plan", "eager")


@pytest.mark.parametrize("spec", ["eager,fast", ","])
def test_bad_ways(spec):
    with pytest.raises(UsageError, match="--ways: unknown"):
        suite.parse_ways(spec)


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--n", "0"], "--n"), (["--warmup", "0"], "--warmup"), (["--config", "robot_huge"], "--config"),
     (["--ways", "jit"], "--ways")],
)  # fmt: skip
def test_bad_flags_are_one_error_naming_the_flag(tmp_path, capsys, flags, named):
    assert main(["bench", "robot", "--device", "cpu", *flags, "--csv", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert f"error: {named}" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.csv").exists()
