"""`fullgraph doctor [TARGET]`: lint, graph breaks, recompiles, CUDA-graph skips and every compile mode timed,
ending with the fastest configuration within tolerance, printed as code. Writes HTML and JSON reports.
"""

from __future__ import annotations

from fullgraph.cli._args import add_target_args, check_search_flags

DEMO = "fullgraph.diagnose.demo:demo"


def _listed(values: list[str]) -> list[str]:
    """`--mode eager,default --mode max-autotune` -> ["eager", "default", "max-autotune"]."""
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def add_parser(sub, name: str, help_text: str) -> None:
    p = sub.add_parser(name, help=help_text, description=help_text)
    add_target_args(p, optional_target="a built-in demo model")
    p.add_argument(
        "--dtype",
        action="append",
        default=[],
        metavar="D[,D]",
        help="dtypes to try, comma-separated or repeated: casts the model and floating inputs "
        "(default fp32 and bf16 on a GPU)",
    )
    p.add_argument(
        "--mode",
        action="append",
        default=[],
        metavar="M[,M]",
        help="modes or fullgraph.compile presets to time, comma-separated or repeated: eager, default, "
        "reduce-overhead, max-autotune-no-cudagraphs, max-autotune, dev, perception, planning, edge, fusion "
        "(default: every mode a GPU can run; eager, default on CPU)",
    )
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="batch|seq",
        help="also call with other batch sizes / sequence lengths (every input carrying that dim) to "
        "find recompiles; comma-separated or repeated",
    )
    p.add_argument("--reps", type=int, default=20, help="timed calls per configuration (default 20)")
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="bound the whole run: the slowest compile modes are skipped first, and the report says which",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for compiling and timing (default: the cores no other work is using)",
    )
    p.add_argument(
        "--with",
        dest="with_",
        action="append",
        default=[],
        metavar="FIX[,FIX]",
        help="also run every row with our fixes applied, timed beside it, and read the graph breaks again with them: "
        "nms (torchvision's batched_nms replaced by fullgraph's), roi_align (torchvision's roi_align in float32 for "
        "bf16 inputs), dynamic_output_shapes (torch's "
        "capture_dynamic_output_shape_ops, scoped); comma-separated or repeated",
    )
    p.add_argument("--no-profile", dest="profile", action="store_false", help="skip the profile of where the time goes")
    p.add_argument("--html", default="fullgraph_report.html", help="HTML report path (default %(default)s)")
    p.add_argument("--json", default="fullgraph_report.json", help="JSON report path (default %(default)s)")
    p.set_defaults(run=run)  # fmt: skip


def run(args) -> int:
    import torch

    from fullgraph._capture import capture_output
    from fullgraph.cli.progress import progress_reporter
    from fullgraph.diagnose.configs import build, check_modes
    from fullgraph.diagnose.demo import DEMO_INPUTS
    from fullgraph.diagnose.doctor import VARY, doctor
    from fullgraph.diagnose.fixes import applied, check_with, for_failure
    from fullgraph.diagnose.summary import print_summary
    from fullgraph.diagnose.target import eager_failure, load_target, parse_dtype
    from fullgraph.errors import UsageError
    from fullgraph.timing import resolve_device

    device = resolve_device(args.device)
    target = args.target or DEMO
    specs = args.input or (list(DEMO_INPUTS) if args.target is None else [])
    vary = _listed(args.vary) or (["batch"] if args.target is None else [])
    modes = _listed(args.mode)
    check_modes(modes, flag="--mode")
    unknown = [m for m in vary if m not in VARY]
    if unknown:
        raise UsageError(f"--vary: unknown {', '.join(unknown)}; choose from {', '.join(VARY)} (comma-separated)")
    check_search_flags(args)
    with_ = check_with(_listed(args.with_), flag="--with")
    dtypes = [parse_dtype(d) for d in _listed(args.dtype)] or None
    with progress_reporter() as say:
        say(f"loading {target} on {device}")
        model, example = load_target(target, specs, device)
        # A model that fails in eager mode is the user's bug to fix first: say so in one line. It runs in the dtype
        # asked for, else its inputs' (`--input 4x64:bf16` alone means a bf16 model).
        dtype = (dtypes or [example.floating_dtype() or torch.float32])[0]
        # The model's prints are held, not echoed before the report: the doctor counts them in its own calls.
        # With --with, it runs with those fixes applied: a failure they remove is measured in its row, not fatal.
        with torch.no_grad(), capture_output(stdout=True, stderr=False), applied(with_):
            try:
                example.cast(dtype).call(build(model, "eager", dtype))
            except Exception as e:
                names = for_failure(str(e))
                hint = f"; --with {','.join(names)} measures it with our fix" if names else ""
                raise eager_failure(e, example, hint) from e
        report = doctor(
            model, example.args, example.kwargs, target=target, modes=modes or None, dtypes=dtypes, vary=vary,
            reps=args.reps, budget=args.budget, threads=args.threads, profile=args.profile, progress=say,
            with_=with_,
        )  # fmt: skip
        say("writing the reports")
        report.save_json(args.json)
        report.save_html(args.html)
    print_summary(report)
    print(f"\nreports: {args.html}, {args.json}")
    return 0
