"""`fullgraph bench SUITE`: run a suite, print its table, append its rows to a CSV."""

from __future__ import annotations

import importlib

from fullgraph.bench.suites import SUITES


def add_parser(sub, name: str, help_text: str) -> None:
    p = sub.add_parser(name, help=help_text, description=help_text)
    suites = p.add_subparsers(dest="suite", metavar="SUITE", required=True)
    for suite, (module, suite_help) in SUITES.items():
        sp = suites.add_parser(suite, help=suite_help, description=suite_help)
        sp.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
        sp.add_argument("--reps", type=int, default=30, help="timed repetitions per measurement (default 30)")
        sp.add_argument("--csv", default=f"fullgraph_{suite}.csv", help="results file to append to (long format)")
        importlib.import_module(module).add_arguments(sp)
        sp.set_defaults(run=run, suite_module=module)


def run(args) -> int:
    from fullgraph.bench.results import append_csv

    rows, table = importlib.import_module(args.suite_module).run(args)
    print(table)
    n = append_csv(args.csv, rows)
    print(f"\n{n} rows appended to {args.csv}")
    return 0
