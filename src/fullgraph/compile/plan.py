"""Per-module plans and regional compilation for `fullgraph.compile` (issue 12; the chapter's exercise 2.7).

**A plan** compiles submodules by path, each its own way, and leaves the rest of the model eager:

    fullgraph.compile(robot, plan={"vision": "perception", "points": {"preset": "planning",
                      "dynamic": {"x": {1: (2, 4096)}}}, "fusion": "eager", "head": {"backend": "cudagraphs"}})

A path is a name from `model.named_modules()`. A value is a preset name, a `Preset`, `"eager"` (left as it is,
said in the report), or a dict of `fullgraph.compile` overrides (`preset`, `mode`, `backend`, `options`,
`fullgraph`, `dynamic`, `recompile_limit`) on top of the preset given to `compile` (`"dev"` by default).
`dynamic` in an entry may declare dims of that submodule's own inputs, named by its `forward`'s arguments.
Every path and value is validated before anything compiles: an unknown path (close matches and the top-level
children are listed), the root, a container without a forward, or a path inside another planned path is an
error.

**What changes on the model.** Nothing outside a `CompiledModel`'s own calls. A planned submodule gets
`torch.compile(module._call_impl, ...)` (what `nn.Module.compile` builds) as its `_compiled_call_impl`
instance attribute only for the duration of each call, and the attribute is put back after, so the model object
the user holds (and anyone else calling it) runs eagerly as before. The model is not copied: parameters, buffers,
`.to()` and `state_dict()` are the model's own, as with `torch.compile`. Calls hold the process-wide lock of
`fullgraph.compile.compiled`, but a thread calling the bare model during such a call sees the compiled parts.

Each compiled part gets its preset's Dynamo config (its recompile limit) around its own calls and its own
stats (`PlanResult.stats[path]`); the `CompiledModel`'s stats cover all of them. What torch shares anyway:
Dynamo caches per code object, so two planned paths of one class share a cache (the second one's first compile
counts as a recompile of that code, against one recompile limit).

**Regional compilation** (`regional=True` or `"per-block"`, `regional="nested"`) is `compile_regions` with the
resolved preset's compile arguments; the instance attributes it sets are taken off again and, like a plan's,
put on only around the `CompiledModel`'s calls.
Per-block regions under a preset with CUDA graphs (`perception`, `mode="reduce-overhead"`) compile their
blocks without them and capture the whole call in one graph per input signature instead
(`fullgraph.compile.graphs.GraphedCall`): reduce-overhead's per-function graphs break when one compiled
block's output feeds the next call of it.
"""

from __future__ import annotations

import contextlib
import difflib
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fullgraph import replay
from fullgraph.compile.dynamic import check_dynamic_spec, declare_dynamic
from fullgraph.compile.graphs import GraphedCall
from fullgraph.compile.options import DynamoConfig, Resolved, resolve
from fullgraph.compile.presets import Preset
from fullgraph.compile.regional import MECHANISMS, RegionalResult, compile_regions
from fullgraph.compile.stats import CompileStats, Tracker
from fullgraph.errors import UsageError

EAGER = "eager"
ENTRY_KEYS = ("preset", "mode", "backend", "options", "fullgraph", "dynamic", "recompile_limit")
_MISSING = object()


@dataclass(frozen=True)
class PlannedPart:
    """One plan entry: the submodule's path, what the user asked for, and its validated configuration."""

    path: str
    label: str  # "perception", "eager", "backend='cudagraphs'", ...
    resolved: Resolved | None  # None: the submodule stays eager
    dynamic: dict[str, dict[int, tuple[int, int]]] | None = None  # declared dims of its own inputs

    def how(self) -> str:
        if self.resolved is None:
            return EAGER
        r = self.resolved
        mode = f", {r.mode}" if r.mode and r.mode != "default" else ""
        return f"{self.label} ({r.backend}{mode}{', fullgraph' if r.fullgraph else ''})"


class _Switch:
    """A submodule's `_compiled_call_impl` while its model's call runs: the compiled part on the thread making that
    call, the module's own call on any other."""

    __slots__ = ("compiled", "here", "module")

    def __init__(self, module: nn.Module, compiled: Callable, here: threading.local) -> None:
        self.module, self.compiled, self.here = module, compiled, here

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(self.here, "on", False):
            return self.compiled(*args, **kwargs)
        return self.module._call_impl(*args, **kwargs)


class PlanResult:
    """The parts of a model compiled apart: a plan's entries or the regional blocks.

    `call` is what a `CompiledModel` calls inside `installed()`: the model itself (its root runs eagerly), or for
    regional "nested" the `torch.compile` wrapper of the whole model."""

    def __init__(self, model: nn.Module, call: Callable, swaps: list[tuple[nn.Module, str, Any]], *,
                 parts: tuple[PlannedPart, ...] = (), trackers: Mapping[str, Tracker] | None = None,
                 regional: RegionalResult | None = None) -> None:  # fmt: skip
        self.model = model
        self.call = call
        self.parts = parts
        self.regional = regional
        self._here = threading.local()  # .on inside this result's call, in that thread only
        # A part reached from eager code (its `_compiled_call_impl`) goes through a switch that takes the compiled
        # call only on the thread inside `installed()`: another thread calling the user's module meanwhile runs it
        # as written. A `forward` swapped for regional "nested" is traced by the compiled root, so it stays plain.
        self._swaps = [(m, name, _Switch(m, value, self._here) if name == "_compiled_call_impl" else value)
                       for m, name, value in swaps]  # fmt: skip
        self._trackers = dict(trackers or {})

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The compiled parts in place for one call on this thread; the model's own attributes are put back after.
        Calls of one model hold its guard (fullgraph.serving), so no two of its calls install at once."""
        saved = [(m, name, m.__dict__.get(name, _MISSING)) for m, name, _ in self._swaps]
        self._here.on = True
        try:
            for m, name, value in self._swaps:
                m.__dict__[name] = value
            yield
        finally:
            self._here.on = False
            for m, name, old in reversed(saved):
                if old is _MISSING:
                    m.__dict__.pop(name, None)
                else:
                    m.__dict__[name] = old

    @property
    def stats(self) -> dict[str, CompileStats]:
        """Per compiled plan path, over its calls only (regional blocks: see the CompiledModel's stats)."""
        return {path: t.stats for path, t in self._trackers.items()}

    def summary(self) -> str:
        """One line: which path got what."""
        if self.regional is not None:
            return self.regional.describe()
        return "plan: " + ", ".join(f"{p.path}={p.label}" for p in self.parts) + ", rest eager"

    def describe(self) -> str:
        """One line per planned path (how it compiles and what it has cost so far), then the rest."""
        if self.regional is not None:
            graphed = f"; {self.call.describe()}" if isinstance(self.call, GraphedCall) else ""
            eager_rest = "; the rest of the model runs eagerly" * (self.call is self.model)
            return self.regional.describe() + eager_rest + graphed
        lines = []
        for p in self.parts:
            t = self._trackers.get(p.path)
            s = t.stats if t is not None else None
            cost = "" if s is None else (f": {s.frames_compiled} frame(s), {s.graphs} graph(s), "
                                         f"{len(s.recompiles)} recompile(s), {s.compile_seconds:.2f} s")  # fmt: skip
            lines.append(f"{p.path}: {p.how()}{cost}")
        return "\n".join([*lines, "(rest): eager"])


def _closest(path: str, paths: list[str]) -> str:
    close = difflib.get_close_matches(path, paths, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


def _inside(path: str, other: str) -> bool:
    return path.startswith(other + ".")


def check_paths(model: nn.Module, paths: list[Any]) -> None:
    """Each path names a submodule with a forward, and none lies inside another."""
    modules = dict(model.named_modules())
    top = [name for name, _ in model.named_children()]
    for path in paths:
        if path == "":
            raise UsageError("plan path '' is the whole model: compile it without plan=, or name its submodules")
        if not isinstance(path, str) or path not in modules:
            raise UsageError(f"plan names {path!r}, which is not a submodule of {type(model).__name__}"
                             f"{_closest(str(path), list(modules))} (top-level: {', '.join(top) or 'none'}; "
                             "any name from model.named_modules())")  # fmt: skip
        if getattr(type(modules[path]), "forward", nn.Module.forward) is nn.Module.forward:
            kids = [f"{path}.{n}" for n, _ in modules[path].named_children()][:3]
            raise UsageError(f"plan path {path!r} is a {type(modules[path]).__name__}, which has no forward; plan "
                             f"its items ({', '.join(kids)}, ...) or use regional=True")  # fmt: skip
    for path in paths:
        for other in paths:
            if _inside(path, other):
                raise UsageError(f"plan paths overlap: {path!r} lies inside {other!r}; keep one of them")


def _entry(path: str, value: Any, base: str | Preset) -> PlannedPart:
    if isinstance(value, str) and value == EAGER:
        return PlannedPart(path, EAGER, None)
    if value == "auto":
        raise UsageError(f"plan[{path!r}]: preset 'auto' needs a measured choice; name a preset instead")
    if isinstance(value, (str, Preset)):
        value = {"preset": value}
    if not isinstance(value, Mapping):
        raise UsageError(f"plan[{path!r}] = {value!r}: give a preset name, a Preset, 'eager' or a dict of "
                         f"{', '.join(ENTRY_KEYS)}")  # fmt: skip
    unknown = sorted(set(value) - set(ENTRY_KEYS))
    if unknown:
        raise UsageError(f"plan[{path!r}]: unknown key(s) {', '.join(map(repr, unknown))}; use {', '.join(ENTRY_KEYS)}")
    given = dict(value)
    preset = given.pop("preset", base)
    if preset == EAGER and not given:
        return PlannedPart(path, EAGER, None)
    dynamic, spec = given.pop("dynamic", "preset"), None
    if isinstance(dynamic, Mapping):
        spec, dynamic = check_dynamic_spec(dynamic), None
    limit = given.pop("recompile_limit", None)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UsageError(f"plan[{path!r}]: recompile_limit={limit!r}: give a positive int")
    try:
        resolved = resolve(preset, dynamic=dynamic, dynamo=None if limit is None else {"recompile_limit": limit},
                           **given)  # fmt: skip
    except UsageError as e:
        raise UsageError(f"plan[{path!r}]: {e}") from None
    if isinstance(value, Mapping) and set(value) - {"preset"}:
        shown = {k: v.name if isinstance(v, Preset) else v for k, v in value.items()}
        label = ", ".join(f"{k}={v!r}" for k, v in shown.items())
    else:
        label = preset.name if isinstance(preset, Preset) else str(preset)
    return PlannedPart(path, label, resolved, spec)


def check_plan(model: nn.Module, plan: Mapping[str, Any], base: str | Preset = "dev") -> tuple[PlannedPart, ...]:
    """Every path and entry validated against the model and the installed torch; nothing is compiled."""
    if not isinstance(plan, Mapping) or not plan:
        raise UsageError(f"plan={plan!r}: give a dict of submodule path -> preset, e.g. {{'vision': 'perception'}}")
    check_paths(model, list(plan))
    return tuple(_entry(path, value, base) for path, value in plan.items())


def _scoped(compiled: Callable, module: nn.Module, part: PlannedPart, tracker: Tracker) -> Callable:
    """The compiled call with this part's Dynamo config, declared dims and stats around it."""
    dynamo = part.resolved.dynamo

    graphed = part.resolved.replays_cuda_graphs  # what ops may trade for it (fullgraph.replay)

    def call(*args: Any, **kwargs: Any) -> Any:
        with (
            DynamoConfig(dynamo) if dynamo else contextlib.nullcontext(),
            replay.replayed() if graphed else contextlib.nullcontext(),
        ):
            if part.dynamic:
                declare_dynamic(module, args, kwargs, part.dynamic)
            tracker.begin()
            try:
                return compiled(*args, **kwargs)
            finally:
                tracker.end()

    return call


def apply_plan(model: nn.Module, plan: Mapping[str, Any], base: str | Preset = "dev") -> PlanResult:
    """Validate `plan` (see the module docstring), then build each part's compiled call; nothing compiles until
    the first call. Run the model inside `result.installed()`; outside it the model is unchanged."""
    parts = check_plan(model, plan, base)
    swaps, trackers = [], {}
    for part in parts:
        if part.resolved is None:
            continue
        module = model.get_submodule(part.path)
        trackers[part.path] = Tracker()
        compiled = torch.compile(module._call_impl, **part.resolved.compile_kwargs())
        swaps.append((module, "_compiled_call_impl", _scoped(compiled, module, part, trackers[part.path])))
    return PlanResult(model, model, swaps, parts=parts, trackers=trackers)


def apply_regional(model: nn.Module, resolved: Resolved, mechanism: str) -> PlanResult:
    """`compile_regions` with `resolved`'s compile arguments, its instance attributes moved into the result
    (installed around calls only). No repeated blocks: a UsageError before anything compiles."""
    if mechanism not in MECHANISMS:
        raise UsageError(f"regional={mechanism!r}: give True, {', '.join(map(repr, MECHANISMS))} or False")
    graphed = mechanism == "per-block" and resolved.replays_cuda_graphs
    if graphed:  # the blocks compile without CUDA graphs; one graph holds the whole call (compile.graphs)
        resolved = resolved.without_cuda_graphs()
    result = compile_regions(model, mechanism=mechanism, compile_kwargs=resolved.compile_kwargs())
    name = "_compiled_call_impl" if mechanism == "per-block" else "forward"
    blocks = [model.get_submodule(p) for p in result.compiled_paths]
    swaps = [(b, name, b.__dict__[name]) for b in blocks]
    result.restore()
    call = GraphedCall(result.model, name=type(model).__name__) if graphed else result.model
    return PlanResult(model, call, swaps, regional=result)


def build_parts(model: nn.Module, preset: str | Preset, resolved: Resolved, *, plan: Mapping[str, Any] | None,
                regional: bool | str | None, given: Mapping[str, Any]) -> PlanResult | None:  # fmt: skip
    """What `fullgraph.compile` builds for `plan=` or `regional=` (None for neither). `given` holds the
    overrides compile() received (None where not given): a plan takes them in its entries instead."""
    if plan is not None and regional:
        raise UsageError("plan= and regional= do not combine: plan the parts, or compile repeated blocks")
    if plan is not None:
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            raise UsageError(f"with plan=, give {', '.join(extra)} per path (plan={{'vision': {{'preset': "
                             f"'perception', {extra[0]!r}: ...}}}}); the rest of the model runs eagerly")  # fmt: skip
        return apply_plan(model, plan, preset)
    if not regional:
        return None
    if isinstance(given.get("dynamic"), Mapping) and regional != "nested":
        raise UsageError("declared dynamic dims name the whole model's inputs, which per-block regional "
                         "compilation does not compile; use regional='nested' or dynamic=True/None")  # fmt: skip
    return apply_regional(model, resolved, "per-block" if regional is True else regional)
