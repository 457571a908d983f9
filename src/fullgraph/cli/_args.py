"""Arguments more than one command takes: the model target and its inputs."""

from __future__ import annotations

TARGET_HELP = (
    "package.module:callable or path/file.py:callable returning a model, (model, args) or (model, args, kwargs)"
)


def add_target_args(p, *, optional_target: str | None = None) -> None:
    """TARGET (optional, with `optional_target` naming its default, when given), --input and --device."""
    if optional_target is None:
        p.add_argument("target", help=TARGET_HELP)
    else:
        p.add_argument("target", nargs="?", default=None, help=f"{TARGET_HELP}; default: {optional_target}")
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="SPEC",
        help="an input, e.g. 4x3x224x224:fp32; name=SPEC for a keyword input; repeat for several",
    )
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")


def check_search_flags(args) -> None:
    """--reps, --budget and --threads of the commands that time configurations (doctor, tune): one error each."""
    from fullgraph.errors import UsageError

    if args.reps < 1:
        raise UsageError("--reps must be at least 1")
    if args.budget is not None and args.budget <= 0:
        raise UsageError("--budget must be a positive number of seconds")
    if args.threads is not None and args.threads < 1:
        raise UsageError("--threads must be at least 1")
