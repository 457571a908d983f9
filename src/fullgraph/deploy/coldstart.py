"""One cold start, measured inside a fresh process: the child side of `fullgraph bench coldstart` (issue 15).

    python -m fullgraph.deploy.coldstart ACTION --build MODULE:FUNCTION --inputs FILE [options]

prints one JSON line on stdout: the phases of this process in seconds and what torch's compile caches did. The
process is meant to be fresh, started by the suite with a clean environment whose TORCHINDUCTOR_CACHE_DIR says
which cache folder it sees (empty for a cold compile, filled for a warm one). The actions:

- `compile`: build the model on the device, `fullgraph.compile(model, preset)`, first call (cold or warm: the
  cache folder decides);
- `load-cache`: `load_cache(--cache)` into the (empty) cache folder, then the same;
- `load-package`: `fullgraph.deploy.load(--package)` and a first call, no model built; where the preset runs CUDA
  graphs (reduce-overhead, on a GPU), loaded with `cuda_graphs=True`: the first call runs plainly, the second
  captures, later ones replay;
- `save-cache`: compile and call as `compile`, then `save_cache(--cache)` (a setup step);
- `export`: `fullgraph.deploy.export(--package)` then `probe` (a setup step: the probe's verdict is cached in
  FULLGRAPH_CACHE_DIR, so `load-package` in the same folder skips it, as a deployment that probed at install does);
- `save-precompiled`: `save_precompiled(model, inputs, --precompiled)` with the preset's Inductor options less its
  CUDA graphs (a setup step);
- `load-precompiled`: build the model, `load_precompiled(--precompiled, model)` and a first call; where the preset
  runs CUDA graphs (reduce-overhead, on a GPU), the calls go through `fullgraph.compile.GraphedCall`, which captures
  from the second call on.
- `publish`: build the model and `fullgraph.deploy.publish` its precompiled code for the preset to the fleet's Redis
  (FULLGRAPH_REMOTE_CACHE and _KEY; a setup step: `fullgraph cache warm` on one machine);
- `serve`: build the model, `fullgraph.deploy.serve` (the published code fetched, checked and loaded, or the
  fallback compile) and a first call, timed together as `first_call_s`; `how` says which ran.

Phases: `device_s` the inputs put on the device (the device's own start-up: CUDA's context on a GPU), `build_s`
the model built and its weights on the device, `load_s` the file loaded, `first_call_s` from `fullgraph.compile`
(or the package's first call) to the first output, `first_output_s` = `load_s + first_call_s`: from a model on the
device, or from the call that loads the package, to the first output. Then `median_ms` (and `p20_ms`, `p80_ms`) of
`--reps` more calls. Every wait for the device is synchronized. Failures (a DeployError from a package that
crashed its probe, say) are reported in the JSON line (`ok: false`, `error`) with exit status 1.

Import times: under `python -m` the package `fullgraph.deploy` (and torch with it) is imported before this module
runs, so they are reported as null. The suite starts the child with a one-line bootstrap that times `import torch`,
then this module and `prepare(action)`: what the action imports, passing the clock to `main`. `load-package` imports
what a server that only loads packages does (`from fullgraph.deploy import load`: no Dynamo, Inductor or Triton);
the other actions fullgraph's compiler and our ops as well.

`--build` names a top-level function of any importable module (this layer imports no models): called with
`--build-kwargs` (a JSON object), it returns an fp32 `nn.Module` on the CPU; the child moves it to `--device` and
`--dtype`. `--inputs` is a `torch.save`d list of tensors (fp32, CPU), cast the same way. With `--out`, the first
output is saved (its tensors, in fp32 on the CPU) for the parent to compare against eager fp32. With `--hold`, an
action that ran a model stays alive after its JSON line (which then says `holding: true`) and answers each `time N`
line on stdin with `{"round_ms": ...}`, the median of N more calls, and each `profile N` line with
`{"profile_us": {kernel: us per call}}` over N calls under torch's profiler, until `exit` or the end of stdin:
`bench fleet` interleaves its replicas' steady states that way, then profiles each.

`code`: a fingerprint of the compiled code this process runs once its timed calls are done (`code_fingerprint`),
"GRAPH/LAUNCH": Inductor's modules loaded (their file names are hashes of their source), then the launch
configuration each Triton kernel's autotuner chose. Replicas that compile the same graph and time differently either
ran other code (GRAPH differs), the same code launched apart (LAUNCH differs) or the same launches; cuBLAS's and
cuDNN's choices are not in it. `pad`: Inductor's shape-padding choices (`pad_decisions`).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fullgraph.compile.graphs import GraphedCall
from fullgraph.compile.presets import get_preset
from fullgraph.deploy import package
from fullgraph.deploy._common import input_signature
from fullgraph.env import first_line
from fullgraph.errors import UsageError
from fullgraph.timing import first_call, measure

ACTIONS = (
    "compile",
    "load-cache",
    "load-package",
    "load-precompiled",
    "save-cache",
    "export",
    "save-precompiled",
    "publish",
    "serve",
)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# torch's counters that say whether a compile came from the caches (torch._dynamo.utils.counters[group][key]).
COUNTERS = (
    ("inductor", "fxgraph_cache_hit"),
    ("inductor", "fxgraph_cache_miss"),
    ("aot_autograd", "autograd_cache_hit"),
    ("aot_autograd", "autograd_cache_miss"),
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fullgraph.deploy.coldstart", description=__doc__.split("\n")[0])
    p.add_argument("action", choices=ACTIONS)
    p.add_argument("--build", required=True, help="module:function returning the fp32 model on the CPU")
    p.add_argument("--build-kwargs", default="{}", help="JSON object of the build function's keyword arguments")
    p.add_argument("--inputs", required=True, help="torch.save'd list of fp32 CPU input tensors")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    p.add_argument("--preset", default="dev", help="fullgraph.compile preset")
    p.add_argument("--reps", type=int, default=10, help="steady calls timed after the first (median)")
    p.add_argument("--cache", help="cache artifacts file (load-cache, save-cache)")
    p.add_argument("--package", help="AOTInductor package, .pt2 (load-package, export)")
    p.add_argument("--precompiled", help="precompiled file (load-precompiled, save-precompiled)")
    p.add_argument("--out", help="save the first output here (torch.save, fp32 CPU tensors)")
    p.add_argument(
        "--hold",
        action="store_true",
        help='after the JSON line, stay alive and answer `time N` on stdin with one line `{"round_ms": median}` '
        "of N more calls, until `exit` or the end of stdin (a parent interleaves processes' steady states)",
    )
    return p


class _Clock:
    """Phases of this process, in seconds, measured with the device synchronized at both ends."""

    def __init__(self, device: torch.device, report: dict[str, Any]):
        self.device, self.report = device, report

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, key: str, fn: Callable[[], Any]) -> Any:
        self.sync()
        start = time.perf_counter()
        value = fn()
        self.sync()
        self.report[key] = time.perf_counter() - start
        return value


def _build(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Import the build function's module (part of a cold start), build the model, put it on the device."""
    module, _, name = args.build.partition(":")
    if not module or not name:
        raise UsageError(f"--build {args.build!r}: give 'package.module:function' (it returns the model)")
    fn: Any = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    return fn(**json.loads(args.build_kwargs)).eval().to(device=device, dtype=dtype)


def _on_device(values: Sequence[Any], device: torch.device, dtype: torch.dtype) -> tuple[Any, ...]:
    return tuple(
        v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) if isinstance(v, torch.Tensor) else v
        for v in values
    )


def _need(args: argparse.Namespace, flag: str) -> str:
    value = getattr(args, flag)
    if not value:
        raise UsageError(f"{args.action} needs --{flag}")
    return value


def prepare(action: str) -> None:
    """Import what `action` needs (the bootstrap times it): nothing more for `load-package`; for the others
    fullgraph's compiler and the deploy modules that compile and save, with our ops (`fullgraph.deploy` imports them
    first), and so Inductor's compiler, which every compile and every load of compiled code runs through
    (`fullgraph.deploy.precompile` imports it with itself; torch imports it lazily, at the first one: ~500 modules,
    1-4 s without bytecode, that would otherwise fall inside the timed window of some routes and not others)."""
    if action != "load-package":
        import fullgraph.compile.compiled  # noqa: F401
        from fullgraph.deploy import build, cache, precompile  # noqa: F401 - precompile imports Inductor's compiler
    if action in ("publish", "serve"):
        from fullgraph.deploy import published  # noqa: F401


def _replays(preset: str) -> bool:
    """Does the preset run CUDA graphs (reduce-overhead)? Read from the preset: `resolve` imports Inductor."""
    return (get_preset(preset).mode or "default") == "reduce-overhead"


def _counters() -> dict[str, int]:
    if "torch._dynamo" not in sys.modules:  # the package route: nothing was compiled, and Dynamo stays unimported
        return {key: 0 for _, key in COUNTERS}
    counters = torch._dynamo.utils.counters
    return {key: int(counters[group][key]) for group, key in COUNTERS}


def _started(clock: _Clock, make: Callable[[], Callable[..., Any]], inputs: tuple[Any, ...]) -> tuple[Any, Any, float]:
    """(fn, its first output, seconds): `make()` (a compile, or a fetch and load) and the first call, timed together
    from a synchronized start to the synchronized first output."""
    clock.sync()
    before = len(sys.modules)
    start = time.perf_counter()
    fn = make()
    _, out = first_call(lambda: fn(*inputs), clock.device)
    seconds = time.perf_counter() - start
    clock.report["window_imports"] = len(sys.modules) - before  # modules first imported inside the window
    return fn, out, seconds


Timer = Callable[[int], float]  # the median ms of N more calls of the loaded model
PROFILE_TOP = 30  # kernels (ops on the CPU) a profile reports, the longest first


class Steady:
    """The loaded model's further calls, for --hold: `steady(N)` is the median ms of N calls; `steady.profile(N)`
    the time per call of each GPU kernel (each op's own time on the CPU) over N calls under torch's profiler, in
    microseconds, the PROFILE_TOP longest."""

    def __init__(self, fn: Callable[..., Any], inputs: tuple[Any, ...], device: torch.device):
        self.fn, self.inputs, self.device = fn, inputs, device

    def measure(self, reps: int):
        """`timing.measure` of `reps` more calls (at least one), gradients off."""
        with torch.no_grad():
            return measure(lambda: self.fn(*self.inputs), device=self.device, warmup=2, reps=max(reps, 1))

    def __call__(self, reps: int) -> float:
        return self.measure(reps).median_ms

    def profile(self, calls: int) -> dict[str, float]:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        calls, cuda = max(calls, 1), self.device.type == "cuda"
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
        with torch.no_grad():
            self.fn(*self.inputs)
            if cuda:
                torch.cuda.synchronize(self.device)
            with profile(activities=activities) as prof:
                for _ in range(calls):
                    self.fn(*self.inputs)
                if cuda:
                    torch.cuda.synchronize(self.device)
        us: dict[str, float] = {}
        if cuda:  # the kernels themselves (a CUDA graph's replay included), by name
            for e in prof.events():
                if e.device_type == DeviceType.CUDA:
                    took = getattr(e, "device_time", None)
                    took = getattr(e, "cuda_time", 0.0) if took is None else took
                    us[e.name] = us.get(e.name, 0.0) + took
        else:
            for e in prof.key_averages():
                us[e.key] = e.self_cpu_time_total
        top = sorted(us.items(), key=lambda kv: -kv[1])[:PROFILE_TOP]
        return {name[:120]: round(t / calls, 3) for name, t in top if t > 0}


def _run(args: argparse.Namespace, report: dict[str, Any]) -> Steady | None:
    """The action, its phases in `report`; the steady-state timer of the model it ran, where it ran one."""
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    clock = _Clock(device, report)
    loaded = torch.load(args.inputs, weights_only=True)
    inputs = clock.time("device_s", lambda: _on_device(loaded, device, dtype))
    signature = input_signature(inputs)
    fn: Callable[..., Any]
    if args.action == "load-package":
        report["build_s"] = None  # the weights are in the package
        graphs = device.type == "cuda" and _replays(args.preset)
        fn = clock.time("load_s", lambda: package.load(_need(args, "package"), cuda_graphs=graphs))
        return _finish(args, report, fn, inputs, device, *first_call(lambda: fn(*inputs), device))
    import fullgraph.compile
    from fullgraph.compile import resolve
    from fullgraph.deploy import build, cache, precompile

    if args.action == "export":
        model = clock.time("build_s", lambda: _build(args, device, dtype))
        path = _need(args, "package")
        clock.time("export_s", lambda: build.export(model, inputs, path))
        verdict = clock.time("probe_s", lambda: package.probe(path))
        report.update(probe_ok=verdict["ok"], probe_detail=verdict["detail"], file_bytes=os.path.getsize(path))
        return None
    if args.action == "save-precompiled":
        model = clock.time("build_s", lambda: _build(args, device, dtype))
        path = _need(args, "precompiled")
        options = {k: v for k, v in resolve(args.preset).options.items() if not k.startswith("triton.cudagraph")}
        clock.time("save_s", lambda: precompile.save_precompiled(model, inputs, path, options=options))
        report["file_bytes"] = os.path.getsize(path)
        return None
    if args.action == "publish":
        from fullgraph.deploy import published

        model = clock.time("build_s", lambda: _build(args, device, dtype))
        key, size = clock.time("publish_s", lambda: published.publish(model, inputs, preset=args.preset))
        report.update(key=key, file_bytes=size)
        return None
    if args.action == "serve":
        from fullgraph.deploy import published

        model = clock.time("build_s", lambda: _build(args, device, dtype))
        report["load_s"] = 0.0  # the fetch and load are part of the first call's window, as a replica sees them
        fn, out, first_s = _started(clock, lambda: published.serve(model, inputs, preset=args.preset), inputs)
        report["how"] = fn.how
    elif args.action == "load-precompiled":
        model = clock.time("build_s", lambda: _build(args, device, dtype))
        fn = clock.time("load_s", lambda: precompile.load_precompiled(_need(args, "precompiled"), model))
        if device.type == "cuda" and _replays(args.preset):
            fn = GraphedCall(fn, name="precompiled")
        first_s, out = first_call(lambda: fn(*inputs), device)
    else:
        model = clock.time("build_s", lambda: _build(args, device, dtype))
        if args.action == "load-cache":
            path = _need(args, "cache")
            clock.time("load_s", lambda: cache.load_cache(path, preset=args.preset, signature=signature))
        else:
            report["load_s"] = 0.0
        fn, out, first_s = _started(clock, lambda: fullgraph.compile(model, args.preset), inputs)
    if args.action == "save-cache":
        _finish(args, report, fn, inputs, device, first_s, out, timed=False)
        path = _need(args, "cache")
        meta = clock.time("save_s", lambda: cache.save_cache(path, preset=args.preset, signature=signature))
        report.update(file_bytes=os.path.getsize(path), artifacts=meta.artifacts)
        return None
    return _finish(args, report, fn, inputs, device, first_s, out)


def _finish(args: argparse.Namespace, report: dict[str, Any], fn: Callable[..., Any], inputs: tuple[Any, ...],
            device: torch.device, first_s: float, out: Any, timed: bool = True) -> Steady | None:  # fmt: skip
    """Report the first call (and save its output with --out), then time `--reps` more calls unless not `timed`;
    the timer of further calls."""
    report["first_call_s"] = first_s
    report["first_output_s"] = report["load_s"] + first_s
    report["counters"] = _counters()
    if args.out:
        leaves = [t.detach().float().cpu() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        torch.save(leaves, args.out)
    if not timed:
        return None

    steady = Steady(fn, inputs, device)
    timing = steady.measure(args.reps)
    report.update(
        median_ms=timing.median_ms,
        p20_ms=timing.p20_ms,
        p80_ms=timing.p80_ms,
        code=code_fingerprint(),
        pad=pad_decisions(),
    )
    return steady


def code_fingerprint() -> str | None:
    """ "GRAPH/LAUNCH", 8 hex digits each: over the file names of Inductor's loaded modules (hashes of their source:
    the compiled code) and over each Triton kernel's chosen launch configuration (a timing each process takes on a
    kernel's first runs, so replicas running one graph's code may launch it apart); None where Inductor was never
    imported (a package's lean route) or loaded no module. Apart since 2026-12-06: one digest over both differed
    between nearly every pair of the H100 fleet's replicas, those that loaded one graph from Redis included."""
    codecache = sys.modules.get("torch._inductor.codecache")
    modules = list(getattr(getattr(codecache, "PyCodeCache", None), "modules", None) or [])
    if not modules:
        return None
    names, chosen, seen = set(), set(), set()
    for module in modules:
        names.add(os.path.basename(getattr(module, "__file__", "") or ""))
        for name, value in list(vars(module).items()):
            try:  # a module global of any kind: a lazy object may raise more than AttributeError
                launchers = getattr(value, "launchers", None)
            except Exception:
                continue
            if not isinstance(launchers, list) or id(value) in seen:
                continue
            seen.add(id(value))
            chosen.add(f"{name}:{';'.join(str(getattr(launcher, 'config', '?')) for launcher in launchers)}")
    return f"{_digest(names)}/{_digest(chosen)}"


def _digest(lines: Iterable[str]) -> str:
    """8 hex digits over `lines`, whatever their order."""
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:8]


def pad_decisions() -> str | None:
    """Inductor's shape-padding choices made in this process, "padded/decided" and 8 hex digits over the padded
    matmuls' keys; None where none was made. Each is a timing taken while compiling (`pad_mm` benchmarks a matmul
    padded and as it is) and kept in the local cache only, so replicas compiling at once on one GPU can choose apart
    where replicas compiling one after another agree (issue 35's `together` replicas, 2026-12-06)."""
    pad = sys.modules.get("torch._inductor.fx_passes.pad_mm")
    try:
        cache = pad.get_pad_cache().get_local_cache() if pad is not None else {}
    except Exception:  # a private cache: any change in its form leaves the column empty, never the replica failed
        return None
    decided = {k: v for k, v in (cache or {}).items() if isinstance(v, bool)}
    if not decided:
        return None
    padded = [k for k, v in decided.items() if v]
    return f"{len(padded)}/{len(decided)} {_digest(padded)}"


def _hold(steady: Timer, lines: Iterable[str]) -> None:
    """--hold: answer `time N` with the median of N more calls and `profile N` with the time per call of each kernel
    over N calls (where `steady` profiles: `Steady`), one JSON line each, until `exit` or the end."""
    for line in lines:
        words = line.split()
        if words[:1] == ["exit"]:
            return
        asked = len(words) == 2 and words[1].isdigit()
        if asked and words[0] == "time":
            print(json.dumps({"round_ms": steady(int(words[1]))}), flush=True)
        elif asked and words[0] == "profile" and hasattr(steady, "profile"):
            print(json.dumps({"profile_us": steady.profile(int(words[1]))}), flush=True)
        elif words:
            print(json.dumps({"error": f"--hold: unknown request {line.strip()[:80]!r}; send `time N`, `profile N` "
                              "or `exit`"}), flush=True)  # fmt: skip


def bytecode_cache() -> dict[str, Any]:
    """Whether this Python can reuse compiled bytecode: when torch has no .pyc (and none is written), every new
    process compiles each module it imports from source, and import and load times include that."""
    pyc = importlib.util.cache_from_source(torch.__file__)
    return {
        "dont_write": bool(sys.flags.dont_write_bytecode or sys.dont_write_bytecode),
        "prefix": sys.pycache_prefix,
        "torch_pyc": os.path.exists(pyc),
    }


def main(argv: Sequence[str] | None = None, clock: Sequence[float] | None = None,
         after: Callable[[], None] | None = None) -> int:  # fmt: skip
    """Run one action and print its JSON line; 0 when it worked, 1 when it failed (the line says why).

    `clock`: perf_counter values before `import torch`, after it, and after importing fullgraph's compile and
    deploy layers, taken by a bootstrap before this module was imported; without it the import times are null.
    `after`: called once the line is printed (a bootstrap's own line), before --hold holds; the line says
    `holding: true` when it will."""
    args = _parser().parse_args(argv)
    report: dict[str, Any] = {"action": args.action, "ok": False, "error": None, "pid": os.getpid()}
    report["bytecode"] = bytecode_cache()
    if clock is not None:
        report["import_torch_s"], report["import_fullgraph_s"] = clock[1] - clock[0], clock[2] - clock[1]
    else:
        report["import_torch_s"] = report["import_fullgraph_s"] = None
    steady = None
    try:
        steady = _run(args, report)
        report["ok"] = True
    except Exception as e:  # a DeployError, or whatever the model or torch raised: reported, not raised
        traceback.print_exc()
        report["error"] = first_line(e, 400)
    hold = bool(args.hold and steady and report["ok"])
    report["holding"] = hold
    print(json.dumps(report), flush=True)
    if after is not None:
        after()
    if hold:
        _hold(steady, sys.stdin)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
