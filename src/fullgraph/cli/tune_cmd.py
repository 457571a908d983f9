"""`fullgraph tune [TARGET] --input SPEC`: search presets x modes x dtypes x op policies within a time budget and
write the fastest configuration within tolerance as a JSON result (`fullgraph.diagnose.tune`).

The result serves three readers: `fullgraph.compile(model, preset="auto", choice="tuned.json")` (compile settings),
`fullgraph.deploy.compile_tuned(model, "tuned.json")` (those and the op policies) and `fullgraph export TARGET
--tuned tuned.json` (dtype and op policies).
"""

from __future__ import annotations

from fullgraph.cli._args import add_target_args, check_search_flags
from fullgraph.cli.doctor_cmd import DEMO, _listed
from fullgraph.cli.export_cmd import deploy_errors_exit_1


def add_parser(sub, name: str, help_text: str) -> None:
    p = sub.add_parser(name, help=help_text, description=help_text)
    add_target_args(p, optional_target="the doctor's built-in demo model")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="seconds of search (default 480 on a GPU, 240 on the CPU); rows that would not fit are "
                        "left out, slowest first, and named")  # fmt: skip
    p.add_argument("--preset", action="append", default=[], metavar="P[,P]",
                   help="presets to try (default: all: dev, perception, planning, edge, fusion)")  # fmt: skip
    p.add_argument("--mode", action="append", default=[], metavar="M[,M]",
                   help="extra compile modes beyond the presets' (default max-autotune on a GPU; none on the CPU); "
                        "'none' for no extra mode")  # fmt: skip
    p.add_argument("--dtype", action="append", default=[], metavar="D[,D]",
                   help="dtypes to try (default fp32 and bf16 on a GPU, the inputs' on the CPU)")  # fmt: skip
    p.add_argument("--ops", action="append", default=[], metavar="SPEC",
                   help="an op-policy variant to try, in FULLGRAPH_OPS syntax (none = all native, all = all "
                        "kernel, +attention,-rope); repeat for several (default: none and all when the model calls "
                        "our ops)")  # fmt: skip
    p.add_argument("--reps", type=int, default=20, help="timed calls per configuration (default 20)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for compiling and timing (default: the cores no other work is using)")  # fmt: skip
    p.add_argument("--cache", action="store_true",
                   help="also save the pick's compile-cache artifacts beside the JSON (FILE.cache), compiled alone "
                        "in a child process so that they hold this model's only")  # fmt: skip
    p.add_argument("--serial", action="store_true",
                   help="compile every row in this process, one after another (default on a GPU: the autotuning "
                        "rows compile ahead in background processes; docs/tune.md)")  # fmt: skip
    p.add_argument("-o", "--output", default="fullgraph_tuned.json", help="the result's JSON file (%(default)s)")
    p.set_defaults(run=run)


@deploy_errors_exit_1  # the search ran; saving its cache artifacts failed: a runtime failure
def run(args) -> int:
    import torch

    from fullgraph._paths import display_path
    from fullgraph.cli.progress import progress_reporter
    from fullgraph.compile.presets import PRESETS
    from fullgraph.diagnose.configs import check_modes
    from fullgraph.diagnose.demo import DEMO_INPUTS
    from fullgraph.diagnose.target import load_target, parse_dtype
    from fullgraph.diagnose.tune import tune
    from fullgraph.errors import UsageError
    from fullgraph.ops.policies import parse_spec
    from fullgraph.timing import resolve_device

    device = resolve_device(args.device)
    target = args.target or DEMO
    specs = args.input or (list(DEMO_INPUTS) if args.target is None else [])
    presets = _listed(args.preset) or None
    unknown = [p for p in presets or () if p not in PRESETS]
    if unknown:
        raise UsageError(f"--preset: unknown {', '.join(unknown)}; choose from {', '.join(PRESETS)}")
    modes = _listed(args.mode)
    modes = [] if modes == ["none"] else modes or None
    check_modes(modes or [], flag="--mode")
    check_search_flags(args)
    dtypes = [parse_dtype(d) for d in _listed(args.dtype)] or None
    variants = [{k: v.value for k, v in parse_spec(s).items()} for s in args.ops] or None
    if variants:
        _check_op_names(variants)
    with progress_reporter() as say:
        say(f"loading {target} on {device}")
        model, example = load_target(target, specs, device)
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"{target} is a function; tune compiles modules: wrap it in an nn.Module")
        result = tune(model, example.args, example.kwargs, target=target, budget=args.budget, presets=presets,
                      modes=modes, dtypes=dtypes, ops=variants, reps=args.reps, threads=args.threads,
                      progress=say, ahead=False if args.serial else None)  # fmt: skip
        result.save(args.output)
        cache = _save_cache(args, target, specs, device, result, say) if args.cache else None
    print_result(result)
    out = display_path(args.output)
    print(f"\nwrote {out}. To use it:")
    print(f'  model = fullgraph.deploy.compile_tuned(model, "{out}")   # compile settings and op policies')
    print(f"  fullgraph export {target} --tuned {out} -o model.pt2")
    if cache is not None:
        print(f"  {cache}")
    return 0


def cache_path(output: str) -> str:
    return output.removesuffix(".json") + ".cache"


def _save_cache(args, target: str, specs: list[str], device, result, say) -> str:
    """Compile the pick alone in a child process and save its cache artifacts beside the JSON; returns the line
    that loads them (or says why there are none)."""
    import subprocess
    import sys

    from fullgraph._paths import display_path
    from fullgraph.compile.choice import read_choice
    from fullgraph.deploy import DeployError

    if read_choice(result).eager:
        return f"# no cache artifacts: the pick, {result.name}, does not compile"
    path = cache_path(args.output)
    say(f"saving the pick's cache artifacts to {display_path(path)} (compiled alone in a child process)")
    request = repr({"target": target, "inputs": specs, "device": str(device), "tuned": args.output, "path": path})
    code = "import sys; from fullgraph.cli.tune_cmd import cache_child; cache_child(sys.argv[1])"
    done = subprocess.run([sys.executable, "-c", code, request], capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise DeployError(f"compiling the pick in a child process failed: {lines[-1] if lines else 'no output'}")
    return (f'fullgraph.deploy.load_cache("{display_path(path)}", preset="{read_choice(result).preset}")  '
            "# before compile_tuned, in the serving process")  # fmt: skip


def cache_child(request: str) -> None:
    """In the child: build the target, compile it as the result says, warm it up, save this process's artifacts."""
    import ast

    import torch

    from fullgraph.compile.choice import read_choice
    from fullgraph.deploy import compile_tuned, input_signature, read_tuned, save_cache
    from fullgraph.diagnose.target import load_target

    req = ast.literal_eval(request)
    model, example = load_target(req["target"], req["inputs"], torch.device(req["device"]))
    tuned = read_tuned(req["tuned"])
    compile_tuned(model, tuned).warmup(*example.args, **example.kwargs)
    save_cache(req["path"], preset=read_choice(tuned).preset, signature=input_signature(example.args, example.kwargs))


def _check_op_names(variants) -> None:
    import fullgraph.ops  # noqa: F401 - defines every op, so the policies know them all
    from fullgraph.errors import UsageError
    from fullgraph.ops.policies import _check_ops

    for v in variants:
        try:
            _check_ops(v)
        except UsageError as e:
            raise UsageError(f"--ops: {e}") from None


def print_result(result) -> None:
    """The table (fastest first), the pick with its reason, and the notes."""
    from fullgraph.bench.table import format_table

    rows = sorted(result.table, key=lambda r: (r["median_ms"] is None, r["median_ms"] or 0.0))
    body = []
    for r in rows:
        spread = f"{r['p20_ms']:.3f}-{r['p80_ms']:.3f}" if r["median_ms"] else "-"
        status = r["error"] or ("ok" if r["ok"] else f"error {r['rel_err']:.1e} > {r['tolerance']:g}")
        mark = "*" if r["name"] == result.name else ""
        body.append([mark, r["name"], r["median_ms"], spread, r["compile_s"], r["rel_err"],
                     status + (" (noisy)" if r["noisy"] else "")])  # fmt: skip
    print(format_table(["", "configuration", "ms", "p20-p80", "compile s", "rel err", "status"], body))
    versus = f", {result.speedup:.2f}x {result.baseline}" if result.speedup and result.baseline else ""
    print(f"\npick: {result.name}{versus} ({result.reason})")
    searched = f"searched {len(result.table)} configuration(s)"
    print(f"{searched} in {result.elapsed_s:.0f} s of a {result.budget_s:g} s budget")
    for note in result.notes:
        print(f"note: {note}")
