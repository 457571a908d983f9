"""`fullgraph doctor [TARGET]`: lint, graph breaks, recompiles, CUDA-graph skips and every compile mode timed,
ending with the fastest configuration within tolerance, printed as code. Writes HTML and JSON reports.
"""

from __future__ import annotations

import sys
import time

DEMO = "fullgraph.diagnose.demo:demo"


def add_parser(sub, name: str, help_text: str) -> None:
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.add_argument("target", nargs="?", default=None, help="package.module:callable or path/file.py:callable "
                   "returning a module, or (module, inputs); default: a built-in demo model")  # fmt: skip
    p.add_argument("--input", action="append", default=[], metavar="SPEC", help="an input, e.g. 4x3x224x224:fp32")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", action="append", default=[], help="dtypes to try (default fp32 and bf16 on a GPU)")
    p.add_argument(
        "--mode",
        action="append",
        default=[],
        help="modes to time: eager, default, reduce-overhead, "
        "max-autotune-no-cudagraphs, max-autotune (default: all a GPU can run; eager, default on CPU)",
    )
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        choices=["batch", "seq", "dtype"],
        help="also call with another batch size / sequence length / dtype to find recompiles",
    )
    p.add_argument("--reps", type=int, default=20, help="timed repetitions per configuration (default 20)")
    p.add_argument("--html", default="fullgraph_report.html", help="HTML report path (default %(default)s)")
    p.add_argument("--json", default="fullgraph_report.json", help="JSON report path (default %(default)s)")
    p.set_defaults(run=run)  # fmt: skip


def _progress(start: float):
    def say(msg: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    return say


def run(args) -> int:
    import torch

    from fullgraph.diagnose.demo import DEMO_INPUTS
    from fullgraph.diagnose.doctor import GPU_MODES, doctor
    from fullgraph.diagnose.summary import format_summary
    from fullgraph.diagnose.target import load_target, parse_dtype
    from fullgraph.env import first_line
    from fullgraph.errors import FullgraphError, UsageError
    from fullgraph.timing import resolve_device

    device = resolve_device(args.device)
    target = args.target or DEMO
    specs = args.input or (list(DEMO_INPUTS) if args.target is None else [])
    vary = args.vary or (["batch"] if args.target is None else [])
    unknown = sorted(set(args.mode) - set(GPU_MODES))
    if unknown:
        raise UsageError(f"--mode: unknown {', '.join(unknown)}; choose from {', '.join(GPU_MODES)}")
    if args.reps < 1:
        raise UsageError("--reps must be at least 1")
    dtypes = [parse_dtype(d) for d in args.dtype] or None
    say = _progress(time.monotonic())
    say(f"loading {target} on {device}")
    model, inputs = load_target(target, specs, device)
    with torch.no_grad():  # a model that fails in eager is the user's bug to fix first; say so in one line
        try:
            model(*inputs)
        except Exception as e:
            raise FullgraphError(f"the model fails in eager mode: {first_line(e, 300)}") from e
    report = doctor(
        model, inputs, target=target, modes=args.mode or None, dtypes=dtypes, vary=vary, reps=args.reps, progress=say
    )
    report.save_json(args.json)
    report.save_html(args.html)
    print(format_summary(report))
    print(f"\nreports: {args.html}, {args.json}")
    return 0
