import argparse

import pytest

from fullgraph.bench.results import read_csv
from fullgraph.cli import bench_cmd
from fullgraph.cli.main import main
from fullgraph.errors import FullgraphError


def test_bench_ceilings_appends_rows(tmp_path, capsys):
    path = tmp_path / "c.csv"
    args = ["bench", "ceilings", "--device", "cpu", "--copy-mib", "4", "--gemm-n", "128", "--reps", "3"]
    assert main([*args, "--csv", str(path)]) == 0
    assert main([*args, "--csv", str(path)]) == 0
    rows = read_csv(path)
    assert len(rows) == 16
    rates = [r for r in rows if r.metric in ("tbps", "tflops")]
    assert {r.variant for r in rates} == {"torch.copy_", "torch.mm"} and all(r.value > 0 for r in rates)
    out = capsys.readouterr().out
    assert "TB/s" in out and "TFLOP/s" in out and f"8 rows appended to {path}" in out


def test_unknown_suite_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "no-such-suite"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


FAKE_SUITE = """
import logging
import warnings

from fullgraph.errors import FullgraphError


def run(args):
    for i in range(12):
        warnings.warn(f"graph break number {i}", UserWarning)
    for _ in range(3):
        logging.getLogger("torch._dynamo.convert_frame").warning("torch._dynamo hit config.recompile_limit (8)")
    if args.fail:
        raise FullgraphError("the suite gave up")
    return [], "THE TABLE"
"""


def _fake_suite_args(tmp_path, monkeypatch, fail):
    (tmp_path / "fake_suite.py").write_text(FAKE_SUITE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return argparse.Namespace(suite_module="fake_suite", csv=str(tmp_path / "x.csv"), fail=fail)


def test_library_warnings_and_logs_are_one_line_each_after_the_table(tmp_path, monkeypatch, capfd):
    assert bench_cmd.run(_fake_suite_args(tmp_path, monkeypatch, fail=False)) == 0
    out, err = capfd.readouterr()
    assert "THE TABLE" in out and "no rows measured: nothing written" in out
    assert err.splitlines() == [
        "warnings: 12 × UserWarning from fake_suite: graph break number 0",
        "logs: 3 × WARNING from torch._dynamo: torch._dynamo hit config.recompile_limit (8)",
    ]


def test_the_summary_is_printed_when_the_suite_fails(tmp_path, monkeypatch, capfd):
    with pytest.raises(FullgraphError, match="the suite gave up"):
        bench_cmd.run(_fake_suite_args(tmp_path, monkeypatch, fail=True))
    out, err = capfd.readouterr()
    assert "THE TABLE" not in out
    assert "warnings: 12 × UserWarning" in err and "logs: 3 × WARNING from torch._dynamo" in err
    assert err.count("recompile_limit") == 1


POINTED_SUITE = """
from fullgraph.bench.results import make_rows


def run(args, save):
    rows = []
    for i in range(3):
        done = make_rows("sweep", f"point {i}", "plain", {"median_ms": (1.0 + i, "ms")}, {})
        rows += done
        save(done)
        if i == args.stop_after:
            raise KeyboardInterrupt  # the device call's time limit, as the process sees it
    return rows + make_rows("sweep", "summary", "ours", {"median_ratio": (1.0, "x")}, {}), "THE TABLE"
"""


@pytest.mark.parametrize("stop_after", [1, None])
def test_a_long_suite_keeps_each_points_rows_as_it_finishes(tmp_path, monkeypatch, capfd, stop_after):
    # sweep and zoo hand each point's rows to the command line's `save` at once: a run stopped by a time limit keeps
    # what it measured, and a run that ends writes every row once
    (tmp_path / "pointed_suite.py").write_text(POINTED_SUITE)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "sweep.csv"
    args = argparse.Namespace(suite="sweep", suite_module="pointed_suite", csv=str(path), stop_after=stop_after)
    if stop_after is not None:
        with pytest.raises(KeyboardInterrupt):
            bench_cmd.run(args)
        assert [r.case for r in read_csv(path)] == ["point 0", "point 1"]
        return
    assert bench_cmd.run(args) == 0
    assert [r.case for r in read_csv(path)] == ["point 0", "point 1", "point 2", "summary"]
    assert "4 rows appended" in capfd.readouterr().out
