"""Suite `load`: one callable driven from many threads at once, as a server's thread pool calls a model (issue 31).

The callable wraps the TARGET's model one way (KINDS): `fullgraph.compile` under a preset, `Bucketed` around that,
a precompiled model, an AOTInductor package (a .pt2 TARGET, or exported here), plain `torch.compile` with the
preset's mode, or the model as the TARGET gives it. Each thread calls it with its own turn through INPUT_SETS random
input sets of the TARGET's inputs (floating tensors drawn again; for `bucketed`, every other set one item shorter,
which Bucketed pads back). Per thread count, in phases:

- start: warm (default) calls it in one thread first, once for the whole run; `cold` takes a fresh callable per
  thread count (Dynamo's caches reset) whose first call all threads make at once, released by a barrier.
- references: each input set's output, called in one thread (after the cold calls, which keep a copy of theirs).
- timed: every thread calls in a loop for `seconds`, without checks; each call waits for its own output (the
  stream synchronized). Throughput (calls/s, items/s along dim 0) over the wall time, latency p50 / p99 per call,
  GPU memory (`torch.cuda.memory_allocated`) with no call in flight, after GROWTH_AFTER untimed calls made by the
  same threads just before (each at least one) and again at the end: the threads are a server's pool, made once
  (torch and the runtimes keep per-thread state: library handles, workspaces), and a reading taken while other
  threads' calls hold their activations would count those as the model's.
- memory over many calls (warm, `memory_calls`): once the rounds have run, a callable whose timed calls (every thread
  count's) number fewer than `memory_calls` is called untimed from the largest thread count until they do, memory
  read before and after; the line under the table then covers that many calls.
- check: every thread calls with each input set CHECK_ROUNDS times and compares each output, as soon as it has it,
  with that set's reference: wrong when the relative error (norm of the difference over the norm of the reference,
  all output tensors together) is above TOLERANCE or the shapes differ.

The threads, their tallies and the constants above live in `load_threads.py`. Exceptions are counted in every
phase, with the first one's message. The run fails (`fullgraph bench load` exits 1)
when any output was wrong or any call raised. What reads TARGETs and builds packages comes from the command line
(`Sources`): this layer imports neither diagnose nor deploy (DESIGN.md, Layers).
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

import fullgraph.compile as fg_compile
from fullgraph.bench.results import Result, make_rows
from fullgraph.bench.suites import parse_sizes
from fullgraph.bench.suites.load_threads import (
    CHECK_ROUNDS,
    GROWTH_AFTER,
    Driver,
    Inputs,
    Tally,
    batch_of,
    single,
    total,
)
from fullgraph.bench.table import format_table
from fullgraph.errors import UsageError
from fullgraph.serving import OwnerThread, copy_out
from fullgraph.timing import quantile, resolve_device

KINDS = {
    "compiled": "fullgraph.compile(model, preset)",
    "bucketed": "fullgraph.compile.Bucketed around fullgraph.compile(model, preset), buckets powers of two up to "
    "the batch",
    "precompiled": "fullgraph.deploy.save_precompiled with the preset's mode, then load_precompiled",
    "package": "an AOTInductor package: a .pt2 TARGET, or exported here (minutes on a GPU); with --cuda-graphs",
    "serial": "that package's one model instance run single-threaded (fullgraph.deploy.load(..., serial=True)): "
    "on a thread of its own fed by a queue, no per-call event, no wait inside the runtime for the previous call",
    "nogil": "that package run through its library's C interface with the GIL released during each run "
    "(fullgraph.deploy.load(..., release_gil=True)); with --runners",
    "nogil-serial": "serial with the GIL released during each run (load(..., serial=True, release_gil=True))",
    "nogil-locked": "nogil behind one lock, its outputs cloned inside it: the floor nogil's many callers must not fall "
    "below",
    "owner": "that package as `package` runs it (the runtime's pool), every call handed to one thread of its own "
    "(fullgraph.serving.OwnerThread around the loaded package)",
    "plain": "torch.compile(model, mode=the preset's mode), called under torch.no_grad(), for comparison",
    "locked": "torch.compile(model, mode=the preset's mode) behind one lock, outputs cloned inside it: what a server "
    "writes by hand, the floor fullgraph's callables must not fall below (a .pt2 TARGET: the package behind one lock)",
    "eager": "the TARGET's model as it is (or the callable it returns: your own wrapper), under torch.no_grad()",
}
# the kinds that load a package (exported here for a Python TARGET)
PACKAGE_LOADS = ("package", "serial", "owner", "nogil", "nogil-serial", "nogil-locked")
NOGIL = {"nogil", "nogil-locked"}  # the pool run with the GIL released: --runners applies
SERIAL = {"serial", "nogil-serial"}  # one model instance by design: no --runners
PACKAGE_KINDS = {*PACKAGE_LOADS, "locked"}  # what a .pt2 TARGET runs as
INPUT_SETS = 8
DEFAULT_ROUNDS = 3  # warm: two ~3% drifts in one run moved x 1 thread of one package from 0.89 to 1.13 (H100)
WARMUP_CALLS = 3  # in one thread: compile, then record or capture a CUDA graph (reduce-overhead, GraphedCall)


@dataclass(frozen=True)
class Sources:
    """What this suite needs from above the bench layer, passed in by `fullgraph bench load` (the command line may
    import everything): how to read a TARGET, and fullgraph.deploy's functions."""

    load_target: Callable[[str, Sequence[str], torch.device], tuple[Any, Any]]  # -> (model, Example on device)
    open_package: Callable[..., tuple[Any, Any]]  # (.pt2, --input, cuda_graphs=, runners=, serial=) -> (loaded, inputs)
    export: Callable[..., str]  # fullgraph.deploy.export(model, args, path, preset=)
    save_precompiled: Callable[..., Any]  # (model, args, path, mode=)
    load_precompiled: Callable[[str, torch.nn.Module], Callable]
    progress: Callable[[str], None]


@dataclass(frozen=True)
class Plan:
    """What the command line asked for, checked when made."""

    target: str
    kinds: tuple[str, ...]
    threads: tuple[int, ...]
    seconds: float
    cold: bool
    preset: str
    cuda_graphs: bool
    device: str
    input_specs: tuple[str, ...] = ()
    input_sets: int = INPUT_SETS
    package: str | None = None  # the package of kind "package" for a Python TARGET (default: exported here)
    runners: int = 1  # the package's model instances (`fullgraph.deploy.load(..., runners=)`)
    rounds: int = 1  # warm runs: the thread counts take turns this many times (each round seconds / rounds)
    memory_calls: int = 0  # warm runs: each callable's memory read over at least this many calls (0: the timed ones)

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds or len(set(self.kinds)) != len(self.kinds):
            raise UsageError(f"--callable {','.join(self.kinds)!r}: give one or more of {', '.join(KINDS)}, each once")
        if not (self.seconds > 0 and math.isfinite(self.seconds)):
            raise UsageError(f"--seconds {self.seconds:g}: give the seconds each thread count is timed, e.g. 30")
        if self.rounds < 1 or (self.cold and self.rounds != 1):
            why = "a cold run measures each thread count once, from a fresh callable" if self.cold else "give 1 or more"
            raise UsageError(f"--rounds {self.rounds}: {why}")
        if self.memory_calls < 0 or (self.cold and self.memory_calls):
            why = (
                "a cold run times each thread count once; memory over many calls is a warm run's"
                if self.cold
                else "give a number of calls, e.g. 10000 (0: the timed calls only)"
            )
            raise UsageError(f"--memory-calls {self.memory_calls}: {why}")
        if self.input_sets < 1:
            raise UsageError(f"--input-sets {self.input_sets}: give how many distinct input sets, e.g. 8")
        if self.target.endswith(".pt2") and not set(self.kinds) <= PACKAGE_KINDS:
            raise UsageError(f"{self.target} is a package: it runs as --callable package (or serial: single-threaded "
                             "on its own thread; owner: on its own thread; nogil: the GIL released; locked: behind one "
                             f"lock), not {','.join(self.kinds)}")  # fmt: skip
        if self.cuda_graphs and "package" not in self.kinds:
            raise UsageError("--cuda-graphs replays a package's calls: it goes with --callable package")
        if self.cuda_graphs and (set(PACKAGE_LOADS) - {"package"}) & set(self.kinds):
            raise UsageError("--cuda-graphs with --callable serial, owner or nogil: a replayed package runs behind its "
                             "lock; compare them as two runs")  # fmt: skip
        if self.runners != 1 and (
            not {"package", *NOGIL} & set(self.kinds) or self.cuda_graphs or SERIAL & set(self.kinds)
        ):
            raise UsageError(f"--runners {self.runners}: a package's model instances, for --callable package or nogil "
                             "without --cuda-graphs, and not beside serial (one instance by design)")  # fmt: skip
        if self.package is not None and (not set(PACKAGE_LOADS) & set(self.kinds) or not self.package.endswith(".pt2")):
            raise UsageError(
                f"--package {self.package}: give a FILE.pt2, for --callable package, serial, owner or nogil"
            )
        fg_compile.get_preset(self.preset)  # an unknown name is a UsageError listing the presets

    @property
    def package_options(self) -> dict[str, Any]:
        """How `fullgraph.deploy.load` opens the package: every option given, so that a kind means the same whatever
        load's defaults (torch's loader, which holds the GIL, unless the kind says otherwise)."""
        return {"cuda_graphs": self.cuda_graphs, "runners": self.runners, "release_gil": False}

    @property
    def mode(self) -> str | None:
        return fg_compile.resolve(self.preset).mode

    def label(self, kind: str) -> str:
        return {
            "compiled": f"compiled {self.preset}",
            "bucketed": f"bucketed {self.preset}",
            "precompiled": f"precompiled {self.mode or 'default'}",
            "package": "package cuda-graphs"
            if self.cuda_graphs
            else "package" + (f", {self.runners} runners" if self.runners != 1 else ""),
            "plain": f"torch.compile {self.mode or 'default'}",
            "serial": "package, serial",
            "nogil-serial": "package, serial, GIL released",
            "owner": "package, owner thread",
            "nogil": "package, GIL released" + (f", {self.runners} runners" if self.runners != 1 else ""),
            "nogil-locked": "package, GIL released, locked"
            + (f", {self.runners} runners" if self.runners != 1 else ""),
            "locked": "package, locked"
            if self.target.endswith(".pt2")
            else f"torch.compile {self.mode or 'default'}, locked",
            "eager": "eager",
        }[kind]


def plan_from(args) -> Plan:
    device = resolve_device(args.device)
    kinds = args.callable or ("package" if args.target.endswith(".pt2") else "compiled")
    return Plan(
        target=args.target,
        kinds=tuple(k.strip() for k in kinds.split(",")),
        threads=parse_sizes("--threads", args.threads, "thread counts like 1,4,16"),
        seconds=args.seconds,
        cold=args.cold,
        preset=args.preset or ("perception" if device.type == "cuda" else "dev"),
        cuda_graphs=args.cuda_graphs,
        device=str(device),
        input_specs=tuple(args.input),
        input_sets=args.input_sets,
        package=args.package,
        runners=args.runners,
        rounds=(1 if args.cold else DEFAULT_ROUNDS) if getattr(args, "rounds", None) is None else args.rounds,
        memory_calls=getattr(args, "memory_calls", 0) or 0,
    )


# ---- inputs and the callable ---------------------------------------------------------------------------------------


def input_sets(example: Inputs, n: int, shorter: bool) -> list[Inputs]:
    """`n` input sets shaped as `example`: floating tensors drawn again (normal), others (ids, masks) copied; with
    `shorter`, every other set one item shorter along dim 0 in the tensors that carry the batch (batch > 2)."""
    torch.manual_seed(0)
    batch = batch_of(example)

    def fresh(t: torch.Tensor, cut: bool) -> torch.Tensor:
        if cut and t.ndim and t.shape[0] == batch:
            t = t[: batch - 1]
        return torch.randn_like(t) if t.is_floating_point() else t.clone()

    return [pytree.tree_map_only(torch.Tensor, lambda t, c=shorter and batch > 2 and i % 2 == 1: fresh(t, c), example)
            for i in range(n)]  # fmt: skip


def load_model(plan: Plan, sources: Sources) -> tuple[Any, Inputs]:
    """The TARGET's model and example inputs; for a package TARGET, the package loaded (the first callable)."""
    if plan.target.endswith(".pt2"):
        loaded, example = sources.open_package(plan.target, plan.input_specs, **plan.package_options)
        return loaded, _pair(example)
    model, example = sources.load_target(plan.target, plan.input_specs, torch.device(plan.device))
    x = _pair(example)
    for kind in plan.kinds:
        if kind in ("compiled", "bucketed", "precompiled", *PACKAGE_LOADS) and not isinstance(model, torch.nn.Module):
            raise UsageError(f"--callable {kind} takes an nn.Module; {plan.target} returned {type(model).__name__}")
        if kind in ("precompiled", *PACKAGE_LOADS) and x[1]:
            raise UsageError(f"--callable {kind} takes positional inputs only; {plan.target} has keyword inputs")
    return model, x


def opener(plan: Plan, kind: str, model: Any, x: Inputs, sources: Sources, work: str) -> Callable[[], Callable]:
    """A function that returns a fresh callable of `kind` (a cold run takes one per thread count); the slow part of a
    kind (a precompile, an export) happens here, once."""
    if plan.target.endswith(".pt2"):
        # the first kind's first callable is the one load_model loaded, not called yet; every other loads the file
        # again (a second kind starts from a package no call has touched, as --cold promises)
        first = iter([model] if kind == plan.kinds[0] else [])

        def package() -> Callable:
            if kind in (*SERIAL, *NOGIL):  # its own load: the runtime opened single-threaded, or called directly
                return _wrapped(plan, kind, sources.open_package(plan.target, (), **_load_options(plan, kind))[0])
            loaded = next(first, None) or sources.open_package(plan.target, (), **plan.package_options)[0]
            return _wrapped(plan, kind, loaded)

        return package
    if kind == "compiled":
        return lambda: fg_compile.compile(model, plan.preset)
    if kind == "bucketed":
        return lambda: fg_compile.Bucketed.from_range(fg_compile.compile(model, plan.preset), 0, (1, batch_of(x)))
    if kind == "plain":
        return lambda: _inference(torch.compile(model, mode=plan.mode))
    if kind == "locked":
        return lambda: _locked(_inference(torch.compile(model, mode=plan.mode)))
    if kind == "eager":
        return lambda: _inference(model)
    if kind == "precompiled":
        path = os.path.join(work, "model.fgpre")
        sources.progress(f"precompiling {type(model).__name__} ({plan.mode or 'default'} mode)")
        sources.save_precompiled(model, x[0], path, mode=plan.mode)
        return lambda: sources.load_precompiled(path, model)
    path = plan.package
    if path is None:  # exported here once, for every package kind alike
        path = os.path.join(work, "model.pt2")
        if not os.path.exists(path):
            sources.progress(f"exporting {type(model).__name__} into an AOTInductor package (minutes on a GPU)")
            path = sources.export(model, x[0], path, preset=plan.preset)
    options = _load_options(plan, kind)
    return lambda: _wrapped(plan, kind, sources.open_package(path, (), **options)[0])


def _load_options(plan: Plan, kind: str) -> dict[str, Any]:
    """What `fullgraph.deploy.load` takes for a package kind: the plan's package options and the kind's own."""
    own = {"serial": {"serial": True}, "nogil": {"release_gil": True}, "nogil-locked": {"release_gil": True},
           "nogil-serial": {"serial": True, "release_gil": True}}.get(kind, {})  # fmt: skip
    return {**plan.package_options, **own}


def _wrapped(plan: Plan, kind: str, loaded: Callable) -> Callable:
    """A loaded package as `kind` calls it: behind one lock (locked, nogil-locked), on an owner thread, or as is."""
    if kind in ("locked", "nogil-locked"):
        return _locked(loaded)
    return _owned(plan, loaded) if kind == "owner" else loaded


def _threads(n: int) -> str:
    return f"{n} thread{'s' * (n != 1)}"


def packages_only(plan: Plan) -> set[str]:
    """The kinds that load a package and compile nothing in this process (so several can be timed in turns)."""
    return set(PACKAGE_LOADS) | ({"locked"} if plan.target.endswith(".pt2") else set())


def _owned(plan: Plan, loaded: Callable) -> Callable:
    """`loaded` with every call run on one thread of its own, on its caller's CUDA stream."""
    device = torch.device(plan.device)
    index = (
        (device.index if device.index is not None else torch.cuda.current_device()) if device.type == "cuda" else None
    )
    return OwnerThread(loaded, cuda_index=index, name="fullgraph bench owner")


def _inference(fn: Callable) -> Callable:
    """`fn` called under `torch.no_grad()`, as a server calls a model and as fullgraph's callables run. With autograd
    on, a reduce-overhead `torch.compile` keeps a backward pending after every call and its CUDA-graph trees never
    take their fast path (H100, ViT-S/16 b4: 18.8 calls/s against 1307 for `compiled`; torch warns "pending,
    uninvoked backwards"): a baseline no server runs."""

    def call(*args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return fn(*args, **kwargs)

    return call


def _locked(fn: Callable) -> Callable:
    """`fn` behind one lock, its outputs cloned inside it (the hand-written server's guard)."""
    lock = threading.Lock()

    def call(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return copy_out(fn(*args, **kwargs))

    return call


def _pair(example: Any) -> Inputs:
    return tuple(example.args), dict(example.kwargs)


# ---- the run ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One thread count's phases."""

    threads: int
    timed: Tally
    wall_s: float
    checks: Tally  # the check phase and the cold calls' checks
    first_call_s: float | None  # cold: the slowest first call
    mem_after: int | None  # bytes allocated after GROWTH_AFTER calls, nothing in flight (GPU)
    mem_end: int | None
    round_rates: tuple[float, ...] = ()  # calls/s in each round, in the order the rounds ran

    @property
    def calls_per_s(self) -> float:
        return self.timed.calls / self.wall_s

    @property
    def exceptions(self) -> int:
        return self.timed.exceptions + self.checks.exceptions

    @property
    def first_error(self) -> str | None:
        return self.timed.first_error or self.checks.first_error

    @property
    def growth(self) -> float | None:
        """Memory at the end over memory after the first calls, less one."""
        return None if not self.mem_after or self.mem_end is None else self.mem_end / self.mem_after - 1


@dataclass
class Round:
    """One timed round of one thread count."""

    timed: Tally
    wall_s: float
    mem: tuple[int | None, int | None]


def time_round(plan: Plan, driver: Driver, n: int, r: int, say: Callable[[str], None]) -> Round:
    """Thread count `n`'s round `r` (0-based): its share of the seconds, timed without checks. The first round
    of a warm driver warms it up and computes the references in one thread first; a cold point's first calls were
    made by `Driver.cold` before it."""
    threads = _threads(n)
    if not plan.cold and not driver.refs:
        say(f"warm-up ({WARMUP_CALLS} calls) and references in one thread")
        single("the warm-up", lambda: [driver.call(0) for _ in range(WARMUP_CALLS)])
        single("computing the references", driver.references)
    seconds = plan.seconds / plan.rounds
    which = f" (round {r + 1} of {plan.rounds})" if plan.rounds > 1 else ""
    say(f"{threads}: calling for {seconds:g} s{which} (timed, no checks)")
    timed, wall, mem = driver.timed(n, seconds)
    return Round(timed, wall, mem)


def point_of(driver: Driver, n: int, rounds: Sequence[Round], cold: tuple[Tally, float | None],
             say: Callable[[str], None]) -> Point:  # fmt: skip
    """Thread count `n`'s point from its rounds, its outputs checked once they have all run."""
    say(f"{_threads(n)}: checking {n * CHECK_ROUNDS * len(driver.sets)} outputs against the references")
    checks = total([cold[0], driver.checked(n)])
    rates = tuple(r.timed.calls / r.wall_s for r in rounds)
    # memory over the point's own calls: each round's threads are new (a server's pool keeps its own: per-thread
    # state made at a thread's first calls, before each round's baseline, is no growth), and other thread counts'
    # rounds ran between this one's; so the end is the first baseline plus what each round added during its calls
    first, added = rounds[0].mem[0], [r.mem[1] - r.mem[0] for r in rounds if None not in r.mem]
    end = first + sum(added) if first is not None and len(added) == len(rounds) else None
    return Point(n, total([r.timed for r in rounds]), sum(r.wall_s for r in rounds), checks, cold[1], first, end,
                 rates)  # fmt: skip


def vs_one_thread(p: Point, base: Point | None) -> float | None:
    """Point `p`'s calls/s against one thread's: the median of the rounds' ratios, each round's thread counts run
    one after another, where both have the same rounds; else the ratio of the totals."""
    if base is None or not base.calls_per_s:
        return None
    if len(p.round_rates) == len(base.round_rates) > 1 and all(base.round_rates):
        return quantile(sorted(a / b for a, b in zip(p.round_rates, base.round_rates, strict=True)), 0.5)
    return p.calls_per_s / base.calls_per_s


def kind_growth(points: Sequence[Point], more: Round | None = None) -> tuple[float, int] | None:
    """GPU memory over all of one warm callable's timed calls, every thread count's, and the untimed calls `more`
    made for memory_calls: (growth, calls). The base is the first point's reading after its first GROWTH_AFTER calls;
    each point (and `more`) then adds what its own calls added (other readings fall between them: a new thread pool's
    first calls make per-thread state, which is no growth). None on the CPU or where a reading is missing."""
    if not points or any(p.mem_after is None or p.mem_end is None for p in points) or not points[0].mem_after:
        return None
    if more is not None and None in more.mem:
        return None
    base = points[0].mem_after
    end = base + sum(p.mem_end - p.mem_after for p in points) + (more.mem[1] - more.mem[0] if more else 0)
    return end / base - 1, sum(p.timed.calls for p in points) + (more.timed.calls if more else 0)


def describe(x: Inputs) -> str:
    tensors = [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]
    specs = ["x".join(map(str, t.shape)) + ":" + str(t.dtype).removeprefix("torch.") for t in tensors[:3]]
    return ", ".join(specs) + (", ..." if len(tensors) > 3 else "")


def report(plan: Plan, example: Inputs, results: dict[str, list[Point]],
           more: dict[str, Round] | None = None) -> tuple[list[Result], str, str | None]:  # fmt: skip
    """Rows, the table, and a one-line failure when any output was wrong or any call raised; `more`: each kind's
    untimed calls for memory_calls."""
    more = more or {}
    case = f"{os.path.basename(plan.target)} {describe(example)} {plan.device}"
    start = "cold" if plan.cold else "warm"
    rows: list[Result] = []
    table, notes, failed = [], [], []
    for kind, points in results.items():
        variant = f"{plan.label(kind)}, {start}"
        base = next((p for p in points if p.threads == 1), None)
        for p in points:
            lat = sorted(p.timed.latencies) or [math.nan]
            p50, p99 = quantile(lat, 0.5) * 1e3, quantile(lat, 0.99) * 1e3
            ratio = vs_one_thread(p, base)
            metrics = {"calls": (p.timed.calls, ""), "calls_per_s": (p.calls_per_s, "1/s"),
                       "items_per_s": (p.timed.items / p.wall_s, "1/s"), "p50_ms": (p50, "ms"),
                       "p99_ms": (p99, "ms"), "checked": (p.checks.checked, ""), "wrong": (p.checks.wrong, ""),
                       "max_rel_err": (p.checks.worst, ""), "exceptions": (p.exceptions, "")}  # fmt: skip
            optional = {"ratio_vs_1_thread": (ratio, "x"), "first_call_s": (p.first_call_s, "s"),
                        "mem_after_first_bytes": (p.mem_after, "B"), "mem_end_bytes": (p.mem_end, "B"),
                        "mem_growth": (p.growth, "")}  # fmt: skip
            metrics |= {k: v for k, v in optional.items() if v[0] is not None}
            params = {"target": plan.target, "callable": kind, "preset": plan.preset, "cuda_graphs": plan.cuda_graphs,
                      "runners": plan.runners,
                      "start": start, "threads": p.threads, "seconds": plan.seconds, "rounds": plan.rounds,
                      "input_sets": plan.input_sets,
                      **({"error": p.first_error} if p.first_error else {})}  # fmt: skip
            threads = _threads(p.threads)
            rows += make_rows("load", case, f"{variant}, {threads}", metrics, params)
            growth = "n/a" if p.growth is None else f"{p.growth:+.1%}"
            table.append([plan.label(kind), p.threads, p.calls_per_s, p.timed.items / p.wall_s, ratio, p50, p99,
                          f"{p.checks.wrong}/{p.checks.checked}", p.exceptions, growth, p.first_call_s])  # fmt: skip
        extra = more.get(kind)
        overall = None if plan.cold else kind_growth(points, extra)
        if overall is not None:  # the "after 10,000 calls": every thread count's calls of one callable
            growth, calls = overall
            untimed = extra.timed.calls if extra else 0
            rows += make_rows("load", case, f"{variant}, all thread counts",
                              {"mem_growth": (growth, ""), "calls": (calls, ""), "untimed_calls": (untimed, "")},
                              {"target": plan.target, "callable": kind, "start": start, "threads": "all",
                               "memory_calls": plan.memory_calls})  # fmt: skip
            of = f", {untimed} of them untimed from {_threads(max(plan.threads))}" if untimed else ""
            notes.append(f"{variant}: GPU memory {growth:+.1%} over {calls} calls after the first {GROWTH_AFTER} "
                         f"(all thread counts{of})")  # fmt: skip
        checks, raised = total([p.checks for p in points]), sum(p.exceptions for p in points)
        raised += extra.timed.exceptions if extra else 0  # the untimed calls for memory_calls raise as any other
        first = next((p.first_error for p in points if p.first_error), extra.timed.first_error if extra else None)
        if first:
            notes.append(f"{variant}: first exception: {first}")
        if checks.wrong or raised:
            wrong = f"{checks.wrong} wrong output{'s' * (checks.wrong != 1)} of {checks.checked}"
            failed.append(f"{variant}: {wrong}, {raised} exception{'s' * (raised != 1)}")
    if plan.memory_calls and not plan.cold and not more and not plan.device.startswith("cuda"):
        notes.append(f"--memory-calls {plan.memory_calls}: no GPU memory to read on {plan.device}")
    headers = ["callable", "threads", "calls/s", "items/s", "x 1 thread", "p50 ms", "p99 ms", "wrong/checked",
               "exceptions", "GPU mem growth", "cold 1st call s"]  # fmt: skip
    rounds = f" in {plan.rounds} rounds (x 1 thread: the median of the rounds' ratios)" if plan.rounds > 1 else ""
    about = f"{case}, {start} start: {plan.input_sets} input sets, {plan.seconds:g} s per thread count{rounds}"
    text = "\n".join([about, format_table(headers, table), *notes])
    return rows, text, "; ".join(failed) or None


def run(args, *, sources: Sources) -> tuple[list[Result], str, str | None]:
    plan = plan_from(args)
    device, say = torch.device(plan.device), sources.progress
    results: dict[str, list[Point]] = {}
    more: dict[str, Round] = {}  # each kind's untimed calls for plan.memory_calls

    def done(kind: str, point: Point) -> None:
        results[kind].append(point)
        # each point as it ends: a process that dies later (a CUDA abort in torch) still leaves its figures
        threads = _threads(point.threads)
        say(f"{plan.label(kind)}, {threads}: {point.calls_per_s:.1f} calls/s, {point.checks.wrong} wrong of "
            f"{point.checks.checked}, {point.exceptions} exceptions")  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="fullgraph-load-") as work:
        say(f"{plan.target}: the model and its inputs")
        model, example = load_model(plan, sources)

        def driver_of(kind: str) -> tuple[Callable[[], Callable], list[Inputs]]:
            say(f"{plan.label(kind)}: the callable")
            return opener(plan, kind, model, example, sources, work), input_sets(
                example, plan.input_sets, shorter=kind == "bucketed"
            )

        def warm(kinds: Sequence[str]) -> None:
            """The kinds' callables alive together, every (kind, thread count) taking its turn in each round, the
            kinds' order reversed every other round."""
            drivers = {}
            for kind in kinds:
                open_callable, sets = driver_of(kind)
                torch._dynamo.reset()  # Dynamo's code caches outlive a callable: a fresh one starts from none
                drivers[kind] = Driver(open_callable(), sets, device)
            rounds: dict[tuple[str, int], list[Round]] = {(k, n): [] for k in kinds for n in plan.threads}
            for r in range(plan.rounds):
                for kind in kinds if r % 2 == 0 else kinds[::-1]:
                    for n in plan.threads:
                        got = time_round(plan, drivers[kind], n, r, say)
                        rounds[(kind, n)].append(got)
                        say(f"{plan.label(kind)}, {_threads(n)}, round {r + 1}: "
                            f"{got.timed.calls / got.wall_s:.1f} calls/s")  # fmt: skip
            for kind in kinds:
                results[kind] = []
                for n in plan.threads:
                    done(kind, point_of(drivers[kind], n, rounds[(kind, n)], (Tally(), None), say))
                calls = sum(r.timed.calls for n in plan.threads for r in rounds[(kind, n)])
                if plan.memory_calls > calls and drivers[kind].memory() is not None:
                    n = max(plan.threads)
                    say(f"{plan.label(kind)}: {plan.memory_calls - calls} more calls from {_threads(n)} (untimed), "
                        f"for its memory after {plan.memory_calls} calls")  # fmt: skip
                    more[kind] = Round(*drivers[kind].timed(n, math.inf, plan.memory_calls - calls))

        together = not plan.cold and len(plan.kinds) > 1 and set(plan.kinds) <= packages_only(plan)
        if together:  # packages: no Dynamo state between them, so their rounds interleave (a drift hits all alike)
            warm(plan.kinds)
        for kind in () if together else plan.kinds:
            if plan.cold:  # a fresh callable per thread count, its first calls from all threads at once
                open_callable, sets = driver_of(kind)
                results[kind] = []
                for n in plan.threads:
                    driver = None
                    torch._dynamo.reset()  # Dynamo's code caches outlive a callable: a fresh one starts from none
                    driver = Driver(open_callable(), sets, device)
                    say(f"{_threads(n)}: the first call from all at once (cold), then references")
                    cold = driver.cold(n)
                    done(kind, point_of(driver, n, [time_round(plan, driver, n, 0, say)], cold, say))
                driver = None
            else:  # one callable; the thread counts take turns, round after round
                warm([kind])
            if device.type == "cuda":  # the next kind's memory readings start without this one's graphs
                torch.cuda.empty_cache()
    return report(plan, example, results, more)
