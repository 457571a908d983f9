"""One entry point for every subcommand: `fullgraph <command> ...`.

argparse prints usage and exits 2 on an unknown subcommand or flag. A `FullgraphError` raised by a command
becomes one line on stderr and exit code 2; `--verbose` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from fullgraph._capture import quiet_missing_numpy
from fullgraph._version import __version__
from fullgraph.errors import FullgraphError

# name -> module under fullgraph.cli; imported only when that command runs, so `fullgraph env` stays quick.
COMMANDS = {
    "env": ("fullgraph.cli.env_cmd", "show versions, the GPU, and what can run here (Triton, attention backends)"),
    "bench": ("fullgraph.cli.bench_cmd", "run a benchmark suite and append its rows to a CSV"),
    "lint": ("fullgraph.cli.lint_cmd", "static checks of forward code for graph breaks and recompiles"),
    "doctor": ("fullgraph.cli.doctor_cmd", "find graph breaks and recompiles, time every compile mode, recommend one"),
    "compile": ("fullgraph.cli.compile_cmd", "try one fullgraph.compile configuration: stats, speed, error, the code"),
    "tune": ("fullgraph.cli.tune_cmd", "search presets x modes x dtypes x op policies in a budget; write the fastest"),
    "export": ("fullgraph.cli.export_cmd", "build an AOTInductor package (.pt2) of a model, then load and check it"),
    "load": ("fullgraph.cli.export_cmd", "load an AOTInductor package safely and run it once: times and output shapes"),
    "cache": ("fullgraph.cli.cache_cmd", "a fleet's compile cache on Redis: warm it from one machine, show its stats"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fullgraph",
        description="Make PyTorch inference compile cleanly under torch.compile and run fast.",
    )
    parser.add_argument("--version", action="version", version=f"fullgraph {__version__}")
    parser.add_argument("--verbose", "-v", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        importlib.import_module(module).add_parser(sub, name, help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with quiet_missing_numpy():  # torch's first import warns when NumPy is absent, as on a base install
            return int(args.run(args) or 0)
    except FullgraphError as e:
        if args.verbose:
            raise
        print(f"fullgraph {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps Python's exit flush from raising again
        return 0
    except KeyboardInterrupt:
        print("fullgraph: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
