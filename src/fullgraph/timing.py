"""Timing a callable: CUDA events on a GPU, a monotonic clock on the CPU.

The timing core sits on the package's floor (DESIGN.md, Layers) so that `ops` (attention's measured `auto`) and
`compile` can time without importing `bench`, which re-exports it.

Warm-up calls run first and are not timed, so module loading, autotuning and compilation stay out of the
steady-state numbers; `first_call` measures that cost on its own. Each repetition times `inner` calls and
divides, so kernels shorter than a launch can be timed as GPU work rather than Python dispatch; with
`graph=True` the `inner` calls are captured once in a CUDA graph and only replays are timed. `rotate`
cycles the calls over several input sets, so the bytes touched can exceed the L2 cache.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fullgraph.errors import UsageError

MOST_ROUNDS = 25  # round_medians' cap when a time budget sets the rounds


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values (q in [0, 1])."""
    if not sorted_values:
        raise UsageError("quantile of no values")
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class Timing:
    """Per-call time statistics, in milliseconds, over `reps` repetitions."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    mean_ms: float
    reps: int
    inner: int
    method: str  # "cuda-events", "cuda-graph" or "cpu-clock"
    samples_ms: tuple[float, ...] = field(default=(), repr=False, compare=False)  # per-call times, in call order

    @classmethod
    def from_samples(cls, samples_ms: Sequence[float], inner: int, method: str) -> Timing:
        s = sorted(samples_ms)
        return cls(
            median_ms=quantile(s, 0.5),
            p20_ms=quantile(s, 0.2),
            p80_ms=quantile(s, 0.8),
            min_ms=s[0],
            mean_ms=sum(s) / len(s),
            reps=len(s),
            inner=inner,
            method=method,
            samples_ms=tuple(samples_ms),
        )


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("device 'cuda' requested but torch sees no CUDA device; use --device cpu")
    return device


def _caller(fn: Callable[..., Any], rotate: Sequence[Sequence[Any]] | None) -> Callable[[int], Any]:
    if rotate is None:
        return lambda i: fn()
    if len(rotate) == 0:
        raise UsageError("rotate needs at least one input set")
    return lambda i: fn(*rotate[i % len(rotate)])


def measure(
    fn: Callable[..., Any],
    *,
    device: str | torch.device | None = None,
    warmup: int = 10,
    reps: int = 50,
    inner: int = 1,
    rotate: Sequence[Sequence[Any]] | None = None,
    graph: bool = False,
) -> Timing:
    """Time `fn` (called as `fn()` or `fn(*rotate[i])`) and return per-call statistics.

    `device` picks the clock: CUDA events on a CUDA device, `time.perf_counter_ns` on the CPU.
    """
    if reps < 1 or inner < 1 or warmup < 0:
        raise UsageError(f"need reps >= 1, inner >= 1, warmup >= 0 (got {reps}, {inner}, {warmup})")
    device = resolve_device(device)
    call = _caller(fn, rotate)
    if device.type != "cuda":
        if graph:
            raise UsageError("graph=True needs a CUDA device")
        return _measure_cpu(call, warmup, reps, inner)
    if graph:
        return _measure_cuda_graph(call, device, warmup, reps, inner)
    return _measure_cuda_events(call, device, warmup, reps, inner)


def _measure_cpu(call: Callable[[int], Any], warmup: int, reps: int, inner: int) -> Timing:
    for i in range(warmup):
        call(i)
    samples = []
    i = 0
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            call(i)
            i += 1
        samples.append((time.perf_counter_ns() - t0) / 1e6 / inner)
    return Timing.from_samples(samples, inner, "cpu-clock")


def _time_with_events(step: Callable[[], None], reps: int, inner: int, method: str) -> Timing:
    """Time `reps` runs of `step` (each `inner` calls) between CUDA event pairs on the current stream."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return Timing.from_samples([s.elapsed_time(e) / inner for s, e in zip(starts, ends, strict=True)], inner, method)


def _measure_cuda_events(
    call: Callable[[int], Any], device: torch.device, warmup: int, reps: int, inner: int
) -> Timing:
    with torch.cuda.device(device):
        for i in range(warmup):
            call(i)
        torch.cuda.synchronize()
        counter = iter(range(reps * inner))

        def step() -> None:
            for _ in range(inner):
                call(next(counter))

        return _time_with_events(step, reps, inner, "cuda-events")


def _measure_cuda_graph(call: Callable[[int], Any], device: torch.device, warmup: int, reps: int, inner: int) -> Timing:
    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the default stream, as graph capture requires
            for i in range(max(warmup, 1)):
                call(i)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(inner):
                call(i)
        g.replay()
        torch.cuda.synchronize()
        return _time_with_events(g.replay, reps, inner, "cuda-graph")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def round_medians(
    fns: Mapping[str, Callable[[], Any]],
    *,
    device: str | torch.device | None = None,
    rounds: int = 5,
    warmup: int = 2,
    reps: int = 20,
    graph: bool = False,
    budget_s: float | None = None,
    most_rounds: int = MOST_ROUNDS,
    around: Mapping[str, Callable[[], contextlib.AbstractContextManager]] | None = None,
) -> dict[str, list[float]]:
    """Time every callable once per round, all of them in turn in each round, so a busy spell slows the variants
    of its round alike: name -> the median ms of each of its rounds (take their median, min and max).

    `budget_s`: `rounds` is then the least, and as many more rounds (up to `most_rounds`) run as the first round says
    fit in that many seconds: a short call is timed over more rounds for next to nothing (a 1 ms DiT point's round
    of 7 variants takes ~0.2 s), where a host-bound call's round medians spread 10-70% (H100, 2026-12-07) and five
    of them put a median several percent off.

    `around`: name -> a context each of that callable's measurements (its warm-up and timed calls together) runs
    inside, for state a caller sets once rather than per call (an op policy: `with policy(...)` around every call
    added its enter and exit, 5-10 us, to each timed call of a variant and to none of the plain twin's).

    Each round starts one callable further along, so no callable holds one place in every round: in fixed order a
    place can carry a bias of its own (the DiT suite at 1024 tokens on the H200, where the first callable always
    ran right after the last one, an eager call: a second instance of that same first model measured 0.95-0.97x of
    it in all four calls of two sessions, benchmarks/results/dit_h200.txt, "plain again"). `graph=True`: each call
    replayed from a CUDA graph (`measure`'s)."""
    medians: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    total, r = (rounds if names else 0), 0
    while r < total:
        for name in names[r % len(names) :] + names[: r % len(names)]:
            with around[name]() if around and name in around else contextlib.nullcontext():
                timed = measure(fns[name], device=device, warmup=warmup, reps=reps, graph=graph)
            medians[name].append(timed.median_ms)
        if r == 0 and budget_s is not None:
            total = rounds_within(sum(m[0] for m in medians.values()) * (warmup + reps) / 1e3, budget_s, rounds,
                                  most_rounds)  # fmt: skip
        r += 1
    return medians


def rounds_within(round_s: float, budget_s: float, least: int, most: int = MOST_ROUNDS) -> int:
    """How many rounds of `round_s` seconds fit in `budget_s`, at least `least` and at most `most` (`least` where
    that is more)."""
    fit = int(budget_s / round_s) if round_s > 0 else most
    return max(least, min(most, fit))


def first_call(fn: Callable[[], Any], device: str | torch.device | None = None) -> tuple[float, Any]:
    """Seconds taken by one call of `fn`, device work included, and its result.

    Call it before anything else touches `fn` to get its cold cost: compilation for a compiled model.
    """
    device = resolve_device(device)
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t0, out


def peak_memory(fn: Callable[[], Any], device: str | torch.device | None = None) -> int | None:
    """Bytes of device memory allocated at the peak of one call of `fn`, above what was allocated before.

    None on the CPU, where torch keeps no allocator statistics.
    """
    device = resolve_device(device)
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


@dataclass(frozen=True)
class Measurement:
    """One benchmarked callable: its first call (compile time) apart from its steady state."""

    first_call_s: float
    timing: Timing
    peak_memory_bytes: int | None


def benchmark(
    fn: Callable[[], Any],
    *,
    device: str | torch.device | None = None,
    warmup: int = 10,
    reps: int = 50,
    inner: int = 1,
    graph: bool = False,
) -> Measurement:
    """First call (timed alone), peak memory of one steady call, then steady-state timing."""
    first_s, _ = first_call(fn, device)
    peak = peak_memory(fn, device)
    timing = measure(fn, device=device, warmup=warmup, reps=reps, inner=inner, graph=graph)
    return Measurement(first_call_s=first_s, timing=timing, peak_memory_bytes=peak)


# A core counts as taken by other work when it was busy this share of the sampled interval while we slept.
BUSY_CORE = 0.5


def _cpu_ticks() -> dict[str, tuple[int, int]]:
    """cpu name -> (busy, total) jiffies from /proc/stat (Linux); empty elsewhere."""
    try:
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if line.startswith("cpu") and not line.startswith("cpu ")]
    except OSError:
        return {}
    out = {}
    for name, *vals in lines:
        ticks = [int(v) for v in vals[:8]]
        idle = ticks[3] + ticks[4]  # idle + iowait
        out[name] = (sum(ticks) - idle, sum(ticks))
    return out


def busy_cores(interval_s: float = 0.25) -> int | None:
    """How many of this process's cores other work kept busy (BUSY_CORE of the time) while this process slept for
    `interval_s`; None without /proc/stat."""
    before = _cpu_ticks()
    if not before:
        return None
    time.sleep(interval_s)
    after = _cpu_ticks()
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(allowed)
    busy = 0
    for c in cores:
        b0, t0 = before.get(f"cpu{c}", (0, 0))
        b1, t1 = after.get(f"cpu{c}", (0, 0))
        busy += t1 > t0 and (b1 - b0) / (t1 - t0) >= BUSY_CORE
    return busy


def cpu_threads_available(interval_s: float = 0.25) -> tuple[int, str]:
    """How many threads CPU timing should use, and why: this process's cores less those other work keeps busy.

    torch's default (one thread per core) collapses when another process holds a core: its threads wait for
    each other at every parallel region (measured on a 2-core machine: 104 ms per call with a competing process
    against 2.9 ms with one thread). Sampled from /proc/stat while this process sleeps; outside Linux, torch's
    own thread count."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    default = min(torch.get_num_threads(), allowed)
    busy = busy_cores(interval_s)
    if busy is None:
        return default, f"{default} thread(s), torch's default (no /proc/stat to see other load)"
    # All cores idle: still leave one to the rest of the system, so a burst of other work cannot stall every
    # parallel region of every call (on 16 cores that costs a sixteenth; on 2 it buys stable timings).
    n = max(1, min(default, allowed - max(busy, 1)))
    why = f"{busy} of {allowed} core(s) busy with other work" if busy else f"{allowed} core(s) idle, one left free"
    return n, f"{n} thread(s): {why}"


@contextlib.contextmanager
def pinned_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `n` inside the block (restored after); None leaves it alone.

    Inductor bakes the thread count into the CPU kernels it compiles, so compile inside the block too."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
