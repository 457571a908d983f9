import importlib

import pytest

from fullgraph.bench.results import make_rows, read_csv
from fullgraph.bench.suites import all_suites
from fullgraph.cli.bench_cmd import SUITES
from fullgraph.cli.main import build_parser, main

COMMON = ["--device", "cpu", "--reps", "3"]


@pytest.fixture
def calls(monkeypatch):
    """Every suite `all` runs, replaced by one that records its arguments and returns one row and a table."""
    seen = []
    for suite in all_suites.SUITES:
        module = importlib.import_module(f"fullgraph.bench.suites.{suite}")

        def fake(args, suite=suite):
            seen.append((suite, vars(args)))
            return make_rows(suite, "case", "variant", {"median_ms": (1.0, "ms")}), f"table of {suite}"

        monkeypatch.setattr(module, "run", fake)
    return seen


def parsed_defaults(suite: str, csv: str) -> dict:
    """What `fullgraph bench SUITE` with only the common flags hands its suite."""
    args = vars(build_parser().parse_args(["bench", suite, *COMMON, "--csv", csv]))
    return {k: v for k, v in args.items() if k not in ("command", "verbose", "suite", "run", "suite_module")}


def test_runs_every_suite_in_turn_with_its_command_line_defaults(tmp_path, capsys, calls):
    csv = str(tmp_path / "all.csv")
    assert main(["bench", "all", *COMMON, "--csv", csv]) == 0
    assert [suite for suite, _ in calls] == ["vit", "nms", "robot", "dit"]
    for suite, args in calls:  # all's defaults are the CLI's: a flag added to a suite must be added to DEFAULTS
        assert args == parsed_defaults(suite, csv), suite
    out = capsys.readouterr().out
    positions = [out.index(f"== {s} ==\ntable of {s}") for s in all_suites.SUITES]
    assert positions == sorted(positions)
    assert out.index("== all ==") > positions[-1] and "4 rows appended" in out
    assert {r.suite for r in read_csv(csv)} == set(all_suites.SUITES)


def test_a_failing_suite_is_reported_and_the_others_still_run(tmp_path, capsys, calls, monkeypatch):
    def broken(args):
        raise RuntimeError("out of memory\nsecond line")

    monkeypatch.setattr(importlib.import_module("fullgraph.bench.suites.nms"), "run", broken)
    csv = tmp_path / "all.csv"
    assert main(["bench", "all", *COMMON, "--csv", str(csv)]) == 0
    assert [suite for suite, _ in calls] == ["vit", "robot", "dit"]
    out = capsys.readouterr().out
    assert "nms failed: RuntimeError: out of memory\n" in out
    summary = out.split("== all ==", 1)[1]
    assert "failed: RuntimeError: out of memory" in summary and summary.count(" ok ") == 3
    assert {r.suite for r in read_csv(csv)} == {"vit", "robot", "dit"}


def test_every_suite_it_runs_is_registered_and_all_takes_only_the_common_flags():
    assert set(all_suites.SUITES) <= set(SUITES) and SUITES["all"][2] == []
    assert set(all_suites.DEFAULTS) == set(all_suites.SUITES)
