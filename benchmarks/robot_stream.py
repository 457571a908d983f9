"""Issue 14's robot acceptance: a stream of requests whose image resolution and point count change on every request,
served four ways (eager, `torch.compile(dynamic=True)`, the whole model with declared dims, the per-part plan).

The measurement is the `robot` suite (`fullgraph.bench.suites.robot`, `fullgraph bench robot`; its docstring says
what is measured and how). This script keeps the flags and defaults it had before the suite existed: robot_base and
200 requests on whatever device there is. Its rows are the suite's (suite "robot").

Run: PYTHONPATH=src python benchmarks/robot_stream.py [--device cuda] [--n 200] [--config robot_base]
  [--dtype fp32|bf16] [--warmup 2] [--ways eager,dynamic,declared,plan] [--csv FILE].
  A CPU smoke run: --device cpu --n 10 --config robot_tiny.
"""

from __future__ import annotations

import argparse

from fullgraph.bench.results import append_csv
from fullgraph.bench.suites import robot
from fullgraph.errors import UsageError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--n", type=int, default=200, help="requests in the timed stream")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up requests per way (the first one square)")
    parser.add_argument("--config", default="robot_base", help="robot_base or robot_tiny")
    parser.add_argument("--ways", default=None, help="subset of eager,dynamic,declared,plan (default: all)")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", help="append long-format result rows here")
    args = parser.parse_args()
    try:
        rows, table = robot.run(args)
    except UsageError as e:
        parser.error(str(e))
    print(table)
    if args.csv:
        append_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
