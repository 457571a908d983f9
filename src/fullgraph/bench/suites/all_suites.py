"""Suite `all`: the model suites one after another (SUITES), each with the defaults `fullgraph bench SUITE` gives it
on this device, each table printed as soon as its suite finishes; the rows of all of them go to one CSV.

Only the common arguments apply (--device, --reps, --csv). A suite that fails is reported in its place and in the
closing summary (the error's first line) and the others still run, so one failure does not lose the other suites'
rows; the summary table, printed last, says which suites ran and which failed.
"""

from __future__ import annotations

import argparse
import importlib
import time

from fullgraph.bench.results import Result
from fullgraph.bench.table import format_table
from fullgraph.env import first_line

SUITES = ("vit", "nms", "robot", "dit")

# Each suite's own arguments as `fullgraph bench SUITE` sets them when none is given. The command line declares
# them (fullgraph.cli.bench_cmd.SUITES), which this package may not import (DESIGN.md, Layers);
# tests/bench/suites/test_all_suites.py keeps the two in step.
DEFAULTS = {
    "vit": {
        "batches": None,
        "config": None,
        "modes": None,
        "dtype": None,
        "breakdown": False,
        "presets": None,
        "policies": None,
    },
    "nms": {"boxes": None, "batches": None, "iou": 0.5, "score_threshold": 0.05, "top_k": 1000, "capacity": 100},
    "robot": {"config": None, "n": None, "warmup": 2, "ways": None, "dtype": "fp32", "seed": 0},
    "dit": {
        "tokens": None,
        "mode": None,
        "config": None,
        "depth": None,
        "rope": "1d",
        "batch": 1,
        "dtype": None,
        "breakdown": False,
        "policies": None,
    },
}


def suite_args(suite: str, args: argparse.Namespace) -> argparse.Namespace:
    """The arguments `suite` runs with: its defaults, and the common ones given to `all`."""
    return argparse.Namespace(device=args.device, reps=args.reps, csv=args.csv, **DEFAULTS[suite])


def run(args) -> tuple[list[Result], str]:
    rows: list[Result] = []
    summary = []
    for suite in SUITES:
        print(f"\n== {suite} ==", flush=True)
        t0 = time.perf_counter()
        try:
            suite_rows, table = importlib.import_module(f"fullgraph.bench.suites.{suite}").run(suite_args(suite, args))
        except Exception as e:  # reported, and the next suite runs: the others' rows are still written
            status, suite_rows, table = f"failed: {first_line(e, 150)}", [], f"{suite} failed: {first_line(e, 300)}"
        else:
            status = "ok"
        print(table, flush=True)
        rows += suite_rows
        summary.append([suite, status, len(suite_rows), time.perf_counter() - t0])
    return rows, "\n== all ==\n" + format_table(["suite", "status", "rows", "seconds"], summary)
