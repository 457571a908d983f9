"""What compiling one model cost, counted around that model's own calls.

Dynamo keeps process-wide counters (frames, graphs, graph breaks, CUDA-graph skips), a record of each frame
compile (a recompile with its reason) and compile-time metrics. A `Tracker` reads them before and after each call of a
`CompiledModel` and keeps the difference, so two models compiled in one process each count their own compiles.
What happens on another thread during a call is counted too (see `fullgraph.compile.compiled` on threads).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass

from fullgraph.compile.rewrites import Applied, Skipped

# Dynamo's timer around one frame's whole compile (tracing and the backend).
_COMPILE_TIMER = "_compile.compile_inner"


@dataclass(frozen=True)
class Recompile:
    """One recompile: the function whose guards failed and why (Dynamo's guard-failure text)."""

    function: str
    file: str
    line: int
    reason: str


@dataclass(frozen=True)
class CompileStats:
    """Counts for one `CompiledModel`, over its calls and warm-ups only."""

    calls: int = 0
    frames_compiled: int = 0  # frames Dynamo converted (a graph break splits a function into several)
    graphs: int = 0  # graphs handed to the backend
    graph_breaks: int = 0  # places where a graph broke, each counted when its continuation is built
    break_reasons: tuple[str, ...] = ()  # distinct reasons (first lines), first seen first
    recompiles: tuple[Recompile, ...] = ()
    cudagraph_skips: int = 0  # Inductor's count; the reasons are in its log (TORCH_LOGS=perf_hints)
    compile_seconds: float = 0.0  # Dynamo's timer for each frame's compile, backend included
    fell_back: str | None = None  # why the model runs eagerly, once on_error="eager" fired
    rewrites: tuple[Applied, ...] = ()  # graph rewrites applied, each place (fullgraph.compile.rewrites)
    rewrites_skipped: tuple[Skipped, ...] = ()  # places a rewrite matched and left alone, with why

    def rewrite_counts(self) -> dict[str, int]:
        """Rewrite name -> places it was applied."""
        return dict(Counter(a.rewrite for a in self.rewrites))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _counters():
    from torch._dynamo.utils import counters

    return counters


def compile_records() -> list:
    """Dynamo's record of each frame compile, oldest first (its last 64): `co_name`, `co_filename`,
    `co_firstlineno`, and for a recompile `recompile_reason` (the newest cache entry's guard failure, as Dynamo logs
    it). One record per recompile, where Dynamo's guard-failure table holds one failure per cache entry tried (the
    k-th recompile of a function adds k)."""
    from torch._dynamo import utils

    return utils.get_compilation_metrics() if hasattr(utils, "get_compilation_metrics") else []


def last_record() -> object | None:
    """A marker for `recompiles_since`: the newest compile record now."""
    records = compile_records()
    return records[-1] if records else None


def recompiles_since(last: object | None, own: set[str] | None = None) -> list:
    """The records of the recompiles made after `last` (a `last_record()`), oldest first.

    `own`, when given: the compile ids of one model's compiles so far, updated here with those made after `last`; a
    recompile then counts only when the cache entry whose guards failed is one of them. Dynamo keeps its cache entries
    per code object, so a function that two models share (a library decorator's `wrapper`, which transformers runs
    most models' forwards through) fails the first model's guards on the second model's first call: Dynamo records a
    recompile, and for the second model it is its first compile (transformers' T5 doctored after Whisper on the CPU:
    "recompiles: 1, first call" on a model that compiles once)."""
    records = compile_records()
    new = records
    for i in range(len(records) - 1, -1, -1):
        if records[i] is last:
            new = records[i + 1 :]
            break
    # else `last` left Dynamo's bounded record (or a reset cleared it): all it still has is new
    if own is not None:
        own.update(str(m.compile_id) for m in new if getattr(m, "compile_id", None))
    return [m for m in new if getattr(m, "recompile_reason", None) and _failed_here(m.recompile_reason, own)]


# Dynamo writes a guard failure as "<compile id of the cache entry that failed>: <guards>" (str(CompileId): "3/1", or
# "!0/3/1" under compiled autograd).
_FAILED_ENTRY = re.compile(r"\s*(!?\d+(?:/\d+)*):\s")


def _failed_here(reason: str, own: set[str] | None) -> bool:
    """Whether a recompile's failed cache entry is one of `own` (every recompile counts when `own` is None, or when
    the text names no entry)."""
    if own is None:
        return True
    m = _FAILED_ENTRY.match(str(reason))
    return m is None or m[1] in own


def _snapshot() -> tuple:
    from torch._dynamo.utils import compilation_time_metrics

    c = _counters()
    return (
        c["frames"]["ok"],
        c["stats"]["unique_graphs"],
        {**c["unimplemented"], **c["graph_break"]},
        dict(c["resumes"]),
        last_record(),
        c["inductor"]["cudagraph_skips"],
        len(compilation_time_metrics.get(_COMPILE_TIMER, ())),
    )


_HIT = CompileStats(calls=1)  # what a call that compiled nothing adds


_live: list = []  # Dynamo's counters and compile-time table: module-level dicts, cleared in place, never replaced


def _activity() -> tuple[int, int]:
    """Two numbers that move whenever Dynamo does anything worth counting: the frames it was asked to convert (a
    cache miss, a recompile, a recompile limit reached) and the frames it compiled. O(1), unlike `_snapshot`,
    whose guard-failure table grows with every compiled function in the process; read twice per compiled call,
    so the two tables are looked up once per process."""
    if not _live:
        from torch._dynamo.utils import compilation_time_metrics, counters

        _live[:] = (counters, compilation_time_metrics)
    counters, times = _live
    return counters["frames"]["total"], len(times.get(_COMPILE_TIMER, ()))


class Tracker:
    """Accumulates the difference of Dynamo's counters across `begin()`/`end()` pairs (one per call).

    Steady-state calls hit Dynamo's cache and change nothing: when Dynamo's activity numbers did not move, a call
    costs two counter reads, and the full snapshot is taken again only after something compiled (here or in
    another model)."""

    def __init__(self) -> None:
        self._stats = CompileStats()
        self._before: tuple | None = None
        self._activity: tuple[int, int] | None = None  # Dynamo's activity when `_before` was taken
        self._hits = 0  # calls that compiled nothing, counted apart: the hot path builds no dataclass
        self._own: set[str] = set()  # the compile ids of this model's compiles (see recompiles_since)

    @property
    def stats(self) -> CompileStats:
        return dataclasses.replace(self._stats, calls=self._stats.calls + self._hits)

    def begin(self) -> None:
        now = _activity()
        if self._before is None or now != self._activity:
            self._before, self._activity = _snapshot(), now

    def end(self) -> CompileStats:
        """Fold what happened since `begin()` into the totals; returns this call's own counts."""
        if _activity() == self._activity:  # a cache hit: nothing compiled, nothing to diff
            self._hits += 1
            return _HIT
        from torch._dynamo.utils import compilation_time_metrics

        frames0, graphs0, reasons0, resumes0, last0, skips0, timed0 = self._before
        self._before = None  # taken again at the next begin()
        c = _counters()
        # Dynamo files a break's reason under "graph_break" or, for some (a branch on a tensor's value in 2.13),
        # "unimplemented"; every break in the middle of a frame builds a continuation, counted under "resumes".
        reasons = {**c["unimplemented"], **c["graph_break"]}
        new_reasons = [r.strip().splitlines()[0] for r, n in reasons.items() if n > reasons0.get(r, 0) and r.strip()]
        breaks = sum(1 for r, n in c["resumes"].items() if n > resumes0.get(r, 0))
        recompiles = tuple(
            Recompile(m.co_name or "?", m.co_filename or "?", m.co_firstlineno or 0, str(m.recompile_reason).strip())
            for m in recompiles_since(last0, self._own)
        )
        times = compilation_time_metrics.get(_COMPILE_TIMER, [])
        call = CompileStats(
            calls=1,
            # torch 2.13 leaves frames["ok"] alone for a fullgraph=True compile; its compile timer still ticks
            frames_compiled=max(c["frames"]["ok"] - frames0, len(times) - timed0),
            graphs=c["stats"]["unique_graphs"] - graphs0,
            graph_breaks=breaks,
            break_reasons=tuple(dict.fromkeys(new_reasons)),
            recompiles=recompiles,
            cudagraph_skips=c["inductor"]["cudagraph_skips"] - skips0,
            compile_seconds=float(sum(times[timed0:])),
        )
        self._stats = merge(self._stats, call)
        return call

    def fell_back(self, cause: str) -> None:
        self._stats = dataclasses.replace(self._stats, fell_back=cause)


def merge(a: CompileStats, b: CompileStats) -> CompileStats:
    return CompileStats(
        calls=a.calls + b.calls,
        frames_compiled=a.frames_compiled + b.frames_compiled,
        graphs=a.graphs + b.graphs,
        graph_breaks=a.graph_breaks + b.graph_breaks,
        break_reasons=tuple(dict.fromkeys(a.break_reasons + b.break_reasons)),
        recompiles=a.recompiles + b.recompiles,
        cudagraph_skips=a.cudagraph_skips + b.cudagraph_skips,
        compile_seconds=a.compile_seconds + b.compile_seconds,
        fell_back=b.fell_back or a.fell_back,
    )
