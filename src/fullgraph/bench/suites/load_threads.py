"""The threads of suite `load` (`fullgraph.bench.suites.load`, whose docstring says what each phase does): a
`Driver` calls one callable on the input sets from `n` threads released together, a `Tally` per thread counts calls,
latencies, checked and wrong outputs and exceptions, `total` sums them."""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fullgraph.bench.suites.coldstart import rel_err
from fullgraph.env import first_line
from fullgraph.errors import UsageError

CHECK_ROUNDS = 3
TOLERANCE = 1e-2  # relative error, norm sense
GROWTH_AFTER = 100  # calls (all threads together, each at least one) before the memory baseline, nothing in flight
MAX_ERRORS = 10  # exceptions after which a thread stops its phase (a callable that always raises would spin)

Inputs = tuple[tuple, dict]  # one call's (args, kwargs)


def batch_of(x: Inputs) -> int:
    """Items per call: dim 0 of the first tensor input (1 without one)."""
    first = next((t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor) and t.ndim), None)
    return 1 if first is None else first.shape[0]


def single(what: str, step: Callable[[], Any]) -> None:
    """A step in one thread: if it raises, the callable does not work at all, and the run stops saying so."""
    try:
        step()
    except Exception as e:
        raise UsageError(f"{what} failed in one thread, before any threads ran: {first_line(e, 300)}") from e


@dataclass
class Tally:
    """What one thread counted in one phase (summed over threads with `total`)."""

    calls: int = 0
    items: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds per call
    checked: int = 0
    wrong: int = 0
    worst: float = 0.0  # the largest relative error checked
    exceptions: int = 0
    first_error: str | None = None

    def failed(self, e: Exception) -> bool:
        """Count `e`; True when this thread should stop its phase."""
        self.exceptions += 1
        self.first_error = self.first_error or first_line(e, 300)
        return self.exceptions >= MAX_ERRORS

    def check(self, out: list[torch.Tensor], ref: list[torch.Tensor]) -> None:
        err = rel_err([t.float() for t in out], ref)
        self.checked += 1
        if err is None or not err <= TOLERANCE:  # NaN is wrong too
            self.wrong += 1
        self.worst = max(self.worst, math.inf if err is None or math.isnan(err) else err)


def total(tallies: Sequence[Tally]) -> Tally:
    out = Tally()
    for t in tallies:
        for name in ("calls", "items", "checked", "wrong", "exceptions"):
            setattr(out, name, getattr(out, name) + getattr(t, name))
        out.worst = max(out.worst, t.worst)
        out.latencies += t.latencies
        out.first_error = out.first_error or t.first_error
    return out


def in_threads(n: int, work: Callable[[int, float], Tally]) -> tuple[list[Tally], float]:
    """`work(i, start)` in `n` threads released together by a barrier (`start`: the release time); their tallies and
    the wall time from the release until the last one ended."""
    released: list[float] = []
    barrier = threading.Barrier(n, action=lambda: released.append(time.perf_counter()))
    tallies = [Tally() for _ in range(n)]

    def body(i: int) -> None:
        barrier.wait()
        tallies[i] = work(i, released[0])

    threads = [threading.Thread(target=body, args=(i,), name=f"fullgraph-load-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tallies, time.perf_counter() - released[0]


class Driver:
    """Calls one callable on the input sets and waits for each output on the calling thread's stream."""

    def __init__(self, fn: Callable, sets: list[Inputs], device: torch.device):
        self.fn, self.sets, self.cuda = fn, sets, device.type == "cuda"
        self.items = [batch_of(x) for x in sets]
        self.refs: list[list[torch.Tensor]] = []

    def call(self, i: int) -> list[torch.Tensor]:
        args, kwargs = self.sets[i % len(self.sets)]
        out = [t for t in pytree.tree_leaves(self.fn(*args, **kwargs)) if isinstance(t, torch.Tensor)]
        if self.cuda:
            torch.cuda.current_stream().synchronize()
        return out

    def references(self) -> None:
        """Each set's output in this thread, kept as float32 copies."""
        self.refs = [[t.detach().float().clone() for t in self.call(i)] for i in range(len(self.sets))]

    def cold(self, n: int) -> tuple[Tally, float]:
        """The first call from `n` threads at once, each output copied at once (what a request reads), checked once
        the references exist; the slowest first call in seconds."""
        kept: list[tuple[int, list[torch.Tensor]]] = []
        took = [0.0] * n

        def work(i: int, start: float) -> Tally:
            tally = Tally()
            try:
                kept.append((i, [t.detach().clone() for t in self.call(i)]))
            except Exception as e:
                tally.failed(e)
            took[i] = time.perf_counter() - start
            return tally

        tallies, _ = in_threads(n, work)
        single("computing the references", self.references)
        for i, out in kept:
            tallies[i].check(out, self.refs[i % len(self.sets)])
        return total(tallies), max(took)

    def timed(self, n: int, seconds: float,
              calls: int | None = None) -> tuple[Tally, float, tuple[int | None, int | None]]:  # fmt: skip
        """In `n` threads, the same ones throughout, as a server's pool: GROWTH_AFTER calls among them (each thread at
        least one), the memory baseline once all have stopped, every thread calling for `seconds` (or until `calls`
        calls among them), the memory again once all have stopped. Returns the timed calls' sum (the first calls'
        exceptions included), the timed wall seconds and the two readings (None on the CPU)."""
        share = max(1, math.ceil(GROWTH_AFTER / n))
        taken = itertools.count()  # next() is atomic under the GIL: each call of the budget is taken once
        marks: dict[str, float] = {}
        readings: list[int | None] = []

        def mark(name: str) -> Callable[[], None]:
            def action() -> None:  # run by one thread once all have arrived: nothing is in flight
                readings.append(self.memory())
                marks[name] = time.perf_counter()

            return action

        settled, finished = threading.Barrier(n, action=mark("start")), threading.Barrier(n, action=mark("end"))

        def work(i: int, _: float) -> Tally:
            tally, j = Tally(), i
            for k in range(i, i + share):
                try:
                    self.call(k)
                except Exception as e:
                    if tally.failed(e):
                        break
            settled.wait()
            while time.perf_counter() - marks["start"] < seconds and tally.exceptions < MAX_ERRORS:
                if calls is not None and next(taken) >= calls:
                    break
                k, j = j, j + 1
                t0 = time.perf_counter()
                try:
                    self.call(k)
                except Exception as e:
                    tally.failed(e)
                    continue
                tally.latencies.append(time.perf_counter() - t0)
                tally.calls += 1
                tally.items += self.items[k % len(self.sets)]
            finished.wait()
            return tally

        tallies, _ = in_threads(n, work)
        return total(tallies), marks["end"] - marks["start"], (readings[0], readings[1])

    def memory(self) -> int | None:
        """Bytes allocated on the GPU once every stream's work is done; None on the CPU."""
        if not self.cuda:
            return None
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    def checked(self, n: int) -> Tally:
        def work(i: int, start: float) -> Tally:
            tally = Tally()
            for j in range(CHECK_ROUNDS * len(self.sets)):
                k = (i + j) % len(self.sets)
                try:
                    tally.check(self.call(k), self.refs[k])
                except Exception as e:
                    if tally.failed(e):
                        break
            return tally

        return total(in_threads(n, work)[0])
