"""`fullgraph compile TARGET --input SPEC --preset P ...`: try one `fullgraph.compile` configuration on a model.

Everything is validated before anything compiles (an unknown preset, option or backend, a plan path the model does
not have, a dynamic range with min > max, an empty or unsorted bucket list: one line, exit 2). Then the model is
compiled, its output checked against eager fp32, eager and compiled timed side by side in interleaved rounds, and
`CompiledModel.stats` printed (graphs, breaks, recompiles with reasons, CUDA-graph skips, compile seconds) with
the Python call that reproduces the configuration. With `--buckets`, the compiled model is served through
`Bucketed` over a stream of random sizes along dim 0 of the first input, and the graphs it compiled are counted.
"""

from __future__ import annotations

import ast
import copy
import json
import random
import statistics
from typing import Any

from fullgraph.cli._args import add_target_args


def add_parser(sub, name: str, help_text: str) -> None:
    p = sub.add_parser(name, help=help_text, description=help_text)
    add_target_args(p)
    p.add_argument("--preset", default="dev", help="dev, perception, planning, edge or fusion (default dev)")
    p.add_argument("--mode", default=None, help="override the preset's mode (default, reduce-overhead, ...)")
    p.add_argument("--backend", default=None, help="override the preset's backend (inductor, eager, cudagraphs, ...)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="an Inductor option, e.g. freezing=True or max_autotune=True; repeat for several")  # fmt: skip
    p.add_argument("--dtype", default=None, help="cast the model and floating inputs: fp32, bf16 or fp16")
    p.add_argument("--dynamic", default=None, metavar="JSON",
                   help='declared dynamic dims, e.g. \'{"x": {"0": [1, 32]}}\'; or true / false')  # fmt: skip
    p.add_argument("--plan", default=None, metavar="JSON",
                   help='per-submodule presets, e.g. \'{"vision": "perception", "fusion": "eager"}\'')  # fmt: skip
    p.add_argument("--regional", nargs="?", const="per-block", default=None, choices=["per-block", "nested"],
                   help="compile the repeated blocks once (per-block by default, or nested)")  # fmt: skip
    p.add_argument("--recompile-limit", type=int, default=None, help="Dynamo's recompile limit for this model")
    p.add_argument(
        "--buckets",
        default=None,
        metavar="N,N,...",
        help="serve through Bucketed with these sizes along dim 0 of the inputs, e.g. 1,2,4,8",
    )
    p.add_argument("--stream", type=int, default=20, help="random sizes to serve with --buckets (default 20)")
    p.add_argument("--strict", action="store_true", help="strict_recompiles: any compile after warm-up raises")
    p.add_argument("--debug", default=None, metavar="DIR", help="write this model's compile trace for tlparse here")
    p.add_argument("--reps", type=int, default=20, help="timed calls per round, 5 rounds (default 20)")
    p.set_defaults(run=run)


def _value(text: str) -> Any:
    """`True`, `3`, `0.5`, `"x"` or a bare word: a Python literal when it parses as one, else the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return {"true": True, "false": False}.get(text.lower(), text)


def parse_options(items: list[str]) -> dict[str, Any] | None:
    from fullgraph.errors import UsageError

    options: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"--option {item!r}: give KEY=VALUE, e.g. --option freezing=True")
        options[key.strip()] = _value(value.strip())
    return options or None


def _json(flag: str, text: str) -> Any:
    from fullgraph.errors import UsageError

    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        example = '{"x": {"0": [1, 32]}}' if flag == "--dynamic" else '{"vision": "perception"}'
        raise UsageError(f"{flag}: not JSON ({e.msg} at column {e.colno}); quote it, e.g. '{example}'") from None


def parse_dynamic(text: str | None) -> Any:
    """`true`/`false`/`none`, or JSON `{"x": {"0": [1, 32]}}` (JSON keys are strings: dims become ints)."""
    from fullgraph.errors import UsageError

    if text is None:
        return "preset"
    if text.lower() in ("true", "false", "none"):
        return {"true": True, "false": False, "none": None}[text.lower()]
    spec = _json("--dynamic", text)
    if not isinstance(spec, dict):
        raise UsageError(f'--dynamic {text!r}: give {{"input": {{"dim": [min, max]}}}}, or true / false')
    out = {}
    for name, dims in spec.items():
        if not isinstance(dims, dict):
            raise UsageError(f'--dynamic: {name!r} maps to {dims!r}; give {{"dim": [min, max]}}, e.g. {{"0": [1, 32]}}')
        try:
            out[name] = {int(d): tuple(r) if isinstance(r, list) else r for d, r in dims.items()}
        except ValueError:
            raise UsageError(f"--dynamic: {name!r} has a dim that is not an int: {list(dims)}") from None
    return out


def parse_buckets(text: str | None) -> tuple[int, ...] | None:
    from fullgraph.compile.dynamic import check_buckets
    from fullgraph.errors import UsageError

    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--buckets {text!r}: give sizes as integers, e.g. 1,2,4,8") from None
    return check_buckets(values)


def _signature(args, options, dynamic, dtype, plan, buckets) -> str:
    """The Python call that reproduces this configuration."""
    parts = [f'"{args.preset}"']
    for flag, value in (("mode", args.mode), ("backend", args.backend)):
        if value is not None:
            parts.append(f'{flag}="{value}"')
    if options:
        parts.append(f"options={options!r}")
    if dtype is not None:
        parts.append(f"dtype={dtype}")
    if dynamic != "preset":
        parts.append(f"dynamic={dynamic!r}")
    if plan is not None:
        parts.append(f"plan={plan!r}")
    if args.regional:
        parts.append(f'regional="{args.regional}"')
    if args.recompile_limit is not None:
        parts.append(f"recompile_limit={args.recompile_limit}")
    if args.strict:
        parts.append("strict_recompiles=True")
    call = f"model = fullgraph.compile(model, {', '.join(parts)})"
    if buckets is not None:
        call += f"\nmodel = fullgraph.compile.Bucketed(model, dim=0, buckets={buckets!r})"
    return call


def run(args) -> int:
    import torch
    from torch import nn

    import fullgraph
    from fullgraph.cli.progress import progress_reporter
    from fullgraph.compile import Bucketed
    from fullgraph.diagnose.configs import TOLERANCE, rel_err
    from fullgraph.diagnose.target import eager_failure, load_target, parse_dtype
    from fullgraph.errors import FullgraphError, UsageError
    from fullgraph.timing import resolve_device, round_medians

    # What the flags alone can get wrong is checked before the model is loaded; fullgraph.compile checks the rest
    # (preset, options, backend, plan paths) before anything compiles.
    if args.reps < 1 or args.stream < 1:
        raise UsageError("--reps and --stream must be at least 1")
    options = parse_options(args.option)
    dynamic = parse_dynamic(args.dynamic)
    plan = _json("--plan", args.plan) if args.plan else None
    if plan is not None and not isinstance(plan, dict):
        raise UsageError(f'--plan {args.plan!r}: give {{"path": "preset", ...}}, e.g. {{"vision": "perception"}}')
    buckets = parse_buckets(args.buckets)
    if buckets is not None and dynamic == "preset":
        dynamic = False  # static shapes per bucket: one graph each (with automatic dynamic the second turns symbolic)
    if buckets is not None and args.recompile_limit is None and len(buckets) > 8:
        args.recompile_limit = len(buckets)  # Dynamo's default limit (8) would run the buckets past it eagerly
    dtype = parse_dtype(args.dtype) if args.dtype else None
    device = resolve_device(args.device)
    with progress_reporter() as say:
        say(f"loading {args.target} on {device}")
        model, example = load_target(args.target, args.input, device)
        if not isinstance(model, nn.Module):
            raise UsageError(f"{args.target} is a function; fullgraph.compile takes an nn.Module (wrap it in one)")
        if buckets is not None and not any(t.ndim for t in example.tensors()):
            raise UsageError("--buckets pads dim 0 of the inputs; give a tensor input with a batch dim")
        with torch.no_grad():
            try:
                ref = example.call(model)
            except Exception as e:
                raise eager_failure(e, example) from e
        cm = fullgraph.compile(  # validates everything; nothing compiles before the first call
            copy.deepcopy(model), args.preset, mode=args.mode, backend=args.backend, options=options, dtype=dtype,
            dynamic=dynamic, plan=plan, regional=args.regional or False, strict_recompiles=args.strict,
            debug=args.debug, recompile_limit=args.recompile_limit,
        )  # fmt: skip
        served = Bucketed(cm, dim=0, buckets=buckets) if buckets is not None else cm
        say(f"compiling ({cm.describe().splitlines()[0]})")
        x = example.cast(dtype) if dtype is not None else example
        with torch.no_grad():
            out = x.call(served)
            out = x.call(served)  # a second call: CUDA graphs record on the first, replay from here
        err = rel_err(out, ref)
        tol = TOLERANCE.get(dtype or example.floating_dtype() or torch.float32, 1e-3)
        say(f"timing eager and compiled in 5 interleaved rounds of {args.reps}")
        with torch.no_grad():
            medians = round_medians(
                {"eager": lambda: example.call(model), "compiled": lambda: x.call(served)},
                device=device, reps=args.reps,
            )  # fmt: skip
        stream = None
        if buckets is not None:
            say(f"serving {args.stream} random sizes in 1..{buckets[-1]} through Bucketed{buckets}")
            rng = random.Random(0)
            stream = [rng.randint(1, buckets[-1]) for _ in range(args.stream)]
            batch = next(t.shape[0] for t in x.tensors() if t.ndim)
            with torch.no_grad():
                for n in stream:  # rows of the example repeated to n along dim 0, in every input carrying the batch
                    rows_n = torch.arange(n, device=device) % batch
                    x.map_tensors(lambda t, r=rows_n: t[r] if t.ndim and t.shape[0] == batch else t).call(served)
    st = cm.stats
    print(cm.describe())
    print(f"graphs {st.graphs}, graph breaks {st.graph_breaks}, recompiles {len(st.recompiles)}, "
          f"CUDA-graph skips {st.cudagraph_skips}, compile seconds {st.compile_seconds:.1f}")  # fmt: skip
    for reason in st.break_reasons:
        print(f"  break: {reason}")
    for rec in st.recompiles:
        print(f"  recompile of {rec.function} ({rec.file}:{rec.line}): {rec.reason.splitlines()[0]}")
    e_ms, c_ms = statistics.median(medians["eager"]), statistics.median(medians["compiled"])
    print(f"eager {e_ms:.3f} ms, compiled {c_ms:.3f} ms: {e_ms / c_ms:.2f}x (median of 5 interleaved rounds)")
    if stream is not None:
        used = sorted({next(b for b in buckets if b >= n) for n in stream})
        print(f"stream of {len(stream)} sizes ({len(set(stream))} distinct) used buckets {used}: {st.graphs} graphs")
    print(f"error against eager fp32: {err:.2e} (tolerance {tol:g})")
    print(_signature(args, options, dynamic, dtype, plan, buckets))
    if not err <= tol:
        raise FullgraphError(f"the compiled output is {err:.2e} from eager, past the tolerance {tol:g}")
    return 0
