"""`fullgraph export TARGET --input SPEC -o model.pt2` and `fullgraph load model.pt2`: AOTInductor packages from
the command line, through `fullgraph.deploy.export` and `fullgraph.deploy.load`.

`export` builds the package, then (unless --no-check) loads it as a user would (checked, probed in a child
process, loaded here) and compares its output with eager fp32. `load` loads a package and runs it once, on the
inputs given or, by default, on random inputs shaped as those it was exported with; it prints the load time, the
first call's time, the steady time and the output shapes.

Exit codes: 2 for a command line that cannot be used as given (a bad spec or flag, a TARGET that does not import,
a file that does not exist, inputs that do not fit the package's exported shapes), before anything is built or
run; 1 when the work itself fails (torch.export cannot capture the model, a package is refused, crashes its probe
or fails on its inputs, an output past the tolerance, the disk full while the package is written).
Both print one line on stderr; `fullgraph --verbose` adds the traceback.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from fullgraph._paths import display_path
from fullgraph.cli._args import add_target_args

# Under the names main.py registers: one module, two commands.
EXPORT, LOAD = "export", "load"


def add_parser(sub, name: str, help_text: str) -> None:
    p = sub.add_parser(name, help=help_text, description=help_text)
    if name == EXPORT:
        add_target_args(p)
        p.add_argument("-o", "--output", required=True, metavar="FILE.pt2", help="the package to write")
        p.add_argument("--dynamic", default=None, metavar="JSON",
                       help='dynamic dims with their ranges, e.g. \'{"x": {"0": [1, 32]}}\'')  # fmt: skip
        p.add_argument("--dtype", default=None, help="cast the model and floating inputs: fp32, bf16 or fp16")
        p.add_argument("--ops", default=None, metavar="SPEC",
                       help="op policies for the export, as FULLGRAPH_OPS: none (all native), +rms_norm")  # fmt: skip
        p.add_argument("--preset", default=None,
                       help="a fullgraph.compile preset whose Inductor options the build uses (edge: max-autotune, "
                            "freezing); CUDA graphs do not apply to a package")  # fmt: skip
        p.add_argument("--tuned", default=None, metavar="FILE.json",
                       help="take the dtype, op policies and preset from a `fullgraph tune` result")  # fmt: skip
        p.add_argument("--no-check", action="store_true", help="skip loading the package and comparing with eager")
        p.set_defaults(run=run_export)
    else:
        p.add_argument("package", metavar="FILE.pt2", help="an AOTInductor package (fullgraph export ... -o FILE.pt2)")
        p.add_argument("--input", action="append", default=[], metavar="SPEC",
                       help="an input, e.g. 4x3x224x224:fp32; repeat for several (default: random inputs of the "
                            "shapes it was exported with)")  # fmt: skip
        p.add_argument("--reps", type=int, default=20, help="timed calls after the first (default 20)")
        p.add_argument("--cuda-graphs", action="store_true",
                       help="replay the package's calls from CUDA graphs (a CUDA package; small batches gain "
                            "most)")  # fmt: skip
        p.set_defaults(run=run_load)


def _failed(args, e: Exception) -> int:
    """A runtime failure: one line and exit 1 (usage errors go through main: exit 2)."""
    if args.verbose:
        raise e
    print(f"fullgraph {args.command}: error: {e}", file=sys.stderr)
    return 1


def deploy_errors_exit_1(command: Callable[[Any], int]) -> Callable[[Any], int]:
    """`command` with its DeployError (work that failed: a package refused or crashing its probe, a child process
    that failed) and DiskFullError (a save that found no room) as one line and exit 1, through `_failed`."""

    @functools.wraps(command)
    def run(args) -> int:
        from fullgraph._files import DiskFullError
        from fullgraph.deploy import DeployError

        try:
            return command(args)
        except (DeployError, DiskFullError) as e:
            return _failed(args, e)

    return run


def _dynamic(text: str | None):
    """--dynamic as fullgraph.compile reads it, restricted to declared dims (export has no automatic dynamic)."""
    from fullgraph.cli.compile_cmd import parse_dynamic
    from fullgraph.errors import UsageError

    spec = parse_dynamic(text)
    if spec in ("preset", None, False):
        return None
    if not isinstance(spec, dict):
        raise UsageError(f'--dynamic {text}: export declares dims with ranges; give e.g. \'{{"x": {{"0": [1, 32]}}}}\'')
    return spec


def _tuned(args, dtype, policies):
    """--tuned's dtype, op policies, preset and mode; --dtype / --ops / --preset given beside it must agree."""
    from fullgraph.deploy.tuned import export_settings
    from fullgraph.errors import UsageError

    tuned = export_settings(args.tuned)
    tuned_dtype, tuned_ops = tuned["dtype"], tuned["ops"]
    if args.preset is not None and args.preset != tuned["preset"]:
        raise UsageError(f"--preset {args.preset} contradicts {args.tuned} (it chose {tuned['preset']}); "
                         "drop one of them")  # fmt: skip
    if dtype is not None and dtype != tuned_dtype:
        raise UsageError(f"--dtype {args.dtype} contradicts {args.tuned} (it chose {tuned_dtype}); drop one of them")
    if policies and {k: str(getattr(v, "value", v)) for k, v in policies.items()} != tuned_ops:
        raise UsageError(f"--ops {args.ops} contradicts {args.tuned} (it chose {tuned_ops or 'the defaults'}); "
                         "drop one of them")  # fmt: skip
    return tuned_dtype, tuned_ops, tuned["preset"], tuned["mode"]


@deploy_errors_exit_1
def run_export(args) -> int:
    import time

    import torch
    from torch import nn

    import fullgraph.ops
    from fullgraph import deploy
    from fullgraph.cli.progress import progress_reporter
    from fullgraph.deploy import DeployError
    from fullgraph.diagnose.configs import TOLERANCE, rel_err
    from fullgraph.diagnose.target import eager_failure, load_target, parse_dtype
    from fullgraph.errors import UsageError
    from fullgraph.ops.policies import parse_spec
    from fullgraph.timing import resolve_device

    dynamic = _dynamic(args.dynamic)
    dtype = parse_dtype(args.dtype) if args.dtype else None
    policies = parse_spec(args.ops) if args.ops else {}
    preset, mode = args.preset, None
    if args.tuned:
        dtype, policies, preset, mode = _tuned(args, dtype, policies)
    deploy.aot_options(preset, mode)  # a preset that does not exist is refused before the model is built
    device = resolve_device(args.device)
    with fullgraph.ops.policy(**policies), progress_reporter() as say:  # the policy checks the op names first
        say(f"loading {args.target} on {device}")
        model, example = load_target(args.target, args.input, device)
        if not isinstance(model, nn.Module):
            raise UsageError(f"{args.target} is a function; export takes an nn.Module (wrap it in one)")
        deploy.build.inputs_by_position(model, example.args, example.kwargs)  # usage, before anything runs
        reference = example
        own = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        if dtype is not None and own is not None:  # `--input ...:bf16 --dtype bf16`: the reference runs as built
            reference = example.cast(own)
        with torch.no_grad():
            try:
                ref = reference.call(model)
            except Exception as e:
                raise eager_failure(e, reference) from e
        x = example
        if dtype is not None:
            model, x = model.to(dtype), example.cast(dtype)
        say(f"exporting to {args.output} (torch.export, then AOTInductor builds it)")
        start = time.perf_counter()
        path = deploy.export(model, x.args, args.output, dynamic=dynamic, preset=preset, mode=mode, kwargs=x.kwargs)
        built_s = time.perf_counter() - start
        if not args.no_check:
            say("checking: loading it in a probe process, then here, and running it")
            start = time.perf_counter()
            loaded = deploy.load(path)
            load_s = time.perf_counter() - start
            _, out = run_once(loaded, x)
    size_mb = os.path.getsize(path) / 1e6
    declared = f", dynamic {args.dynamic}" if dynamic else ""
    inputs = ", ".join(x.describe())
    print(f"exported {args.target} to {path} ({size_mb:.1f} MB) in {built_s:.1f} s; inputs {inputs}{declared}")
    if args.no_check:
        print(f"not checked (--no-check); to load and run it: fullgraph load {path}")
        return 0
    err = rel_err(out, ref)
    tol = TOLERANCE.get(dtype or example.floating_dtype() or torch.float32, 1e-3)
    ops = ", ".join(loaded.custom_ops) or "none"
    print(f"custom ops it calls through Python: {ops}")
    print(f"loaded in {load_s:.1f} s ({_probe_text(loaded.verdict)})")
    print(f"error against eager fp32: {err:.2e} (tolerance {tol:g})")
    print(f'to run it: fullgraph load {path}; in Python: model = fullgraph.load("{path}")')
    if not err <= tol:
        raise DeployError(f"the package's output is {err:.2e} from eager fp32, past the tolerance {tol:g}")
    return 0


def run_once(loaded, x) -> tuple[float, object]:
    """(seconds, output) of one call of a loaded package on inputs `x` (an Example). Inputs that do not fit the
    package are a UsageError (exit 2: `fullgraph.deploy.load` turns the package's input checks on); any other
    failure a DeployError (exit 1)."""
    import torch

    from fullgraph.deploy import DeployError
    from fullgraph.env import first_line
    from fullgraph.errors import UsageError
    from fullgraph.timing import first_call

    shown = display_path(loaded.path)
    with torch.no_grad():
        try:
            return first_call(lambda: x.call(loaded), x.device)
        except UsageError:  # the package's input checks: inputs of other shapes, dtypes or ranges than exported
            raise
        except Exception as e:
            raise DeployError(f"{shown} loaded but failed on inputs {', '.join(x.describe())}: {first_line(e)}") from e


def _probe_text(verdict) -> str:
    if verdict is None:
        return "no probe"
    if verdict.get("cached"):
        return f"probe verdict cached from an earlier load; that probe took {verdict['seconds']:.1f} s"
    return f"of which {verdict['seconds']:.1f} s loading it first in a probe process"


def recorded_specs(loaded: Any, shown: str) -> list[str]:
    """Input specs from the signature `export` records ("4x8:float32@cpu, 2x16:int64@cpu"), integer ones with the
    range of values the example held ("2x16:int64:0-1"), so that random inputs index within the model's tables."""
    from fullgraph.deploy.package import recorded
    from fullgraph.errors import UsageError

    signature = loaded.inputs
    values = recorded(loaded.metadata, "int_values", dict)

    if not signature:
        raise UsageError(f"{shown} does not record its inputs (not made by fullgraph export); give them with --input")
    specs = []
    for part in signature.split(", "):
        spec, at, _ = part.rpartition("@")
        if not at or ":" not in spec or not spec.split(":")[0]:
            raise UsageError(f"{shown} was exported with inputs {signature!r}; give them with --input")
        bounds = values.get(str(len(specs)))
        if isinstance(bounds, list) and len(bounds) == 2 and all(isinstance(v, int) and v >= 0 for v in bounds):
            spec += f":{bounds[0]}-{bounds[1]}"
        specs.append(spec)
    return specs


@deploy_errors_exit_1
def run_load(args) -> int:
    import time

    import torch

    from fullgraph import deploy
    from fullgraph.cli.progress import progress_reporter
    from fullgraph.diagnose.target import inputs_from_specs
    from fullgraph.errors import UsageError
    from fullgraph.timing import measure

    path, shown = args.package, display_path(args.package)
    if args.reps < 1:
        raise UsageError("--reps must be at least 1")
    if not os.path.exists(path):
        raise UsageError(f"{shown} does not exist; give the path of a package (fullgraph export ... -o FILE.pt2)")
    with progress_reporter() as say:
        say(f"loading {shown} (checked, probed in a child process once per file, then loaded here)")
        start = time.perf_counter()
        loaded = deploy.load(path, cuda_graphs=args.cuda_graphs)
        load_s = time.perf_counter() - start
        device = torch.device(loaded.metadata.get("AOTI_DEVICE_KEY") or "cpu")
        specs = args.input or recorded_specs(loaded, shown)
        x = inputs_from_specs(specs, device)
        say(f"running it on {', '.join(x.describe())}")
        first_s, out = run_once(loaded, x)
        with torch.no_grad():
            steady = measure(lambda: x.call(loaded), device=device, warmup=2, reps=args.reps)
    print(f"loaded {shown} in {load_s:.2f} s ({_probe_text(loaded.verdict)}); runs {loaded.route}")
    if args.input:
        print(f"inputs {', '.join(x.describe())}")
    else:  # the recorded specs: integers carry the range of values the example held (LOW-HIGH)
        ranged = any(spec.count(":") == 2 for spec in specs)
        print(f"inputs {', '.join(specs)} (shaped as exported, random values"
              + (", integers within the example's range)" if ranged else ")"))  # fmt: skip
    print(f"first call {first_s * 1e3:.2f} ms, then {steady.median_ms:.3f} ms (median of {args.reps})")
    print(f"output {deploy.input_signature(out)}")
    return 0
