"""`fullgraph.compile(model, preset)`: a validated, scoped `torch.compile` with stats, warm-up and a way back to eager.

Scoped config. Dynamo and Inductor read their config when they compile, and they compile inside calls. This
model's Inductor options travel with its `torch.compile(options=...)`, which Inductor applies to its compiles
only; its Dynamo config (the recompile limit) is set around each of its calls and warm-ups where it differs from
the process's, and put back after, so other models and the rest of the process keep the defaults.

What torch shares anyway. Dynamo caches compiled code per code object, so every instance of one class shares one
cache: a second instance may run the code compiled for the first (and then compiles nothing), and their recompiles
count against one recompile limit. `stats` count what happened during this model's own calls, whichever instance
the cache entries were made for.

Threads (fullgraph.serving; docs/deploy.md, "Many threads"). A call holds its model's guard, one per model class
(instances of a class share compiled code), from the input checks through the compiled call to the copy of its
outputs: every caller gets its own result, and the first call of a shape compiles once while other threads wait.
Under a configuration that replays torch's CUDA-graph trees (reduce-overhead, `perception`), outputs live in the
graphs' memory, which the next replay overwrites: they are cloned inside the guard (`borrow()` yields them uncopied
while it holds the guard), and the trees' per-thread state is the guard's own, so any thread records and replays in
one memory pool per model class. Models of other classes run in parallel. Settings torch keeps process-wide (a
recompile limit other than the process's, `strict_recompiles`' stance after warm-up, `debug=`'s trace logger) make
that model's calls run alone in the process; `stats` of models called at the same moment may count each other's
compiles (Dynamo's counters are process-wide): warm up before serving.

Inference defaults. The model is put in `eval()` and called under `torch.no_grad()`, not `inference_mode()`:
inference tensors cannot be used by autograd or modified in place later, which breaks outputs kept as caches or
state and reused outside; the compiled graph records no autograd either way, and the doctor times its rows under
no_grad, so its recommendation reproduces here. Inputs are checked against the dtype and device each input had on
the first call (after the `dtype=` cast of floating inputs) and against the model's device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import keystr, tree_flatten_with_path, tree_map_only

from fullgraph import replay
from fullgraph.compile.choice import read_choice
from fullgraph.compile.dynamic import DynamicSpec, check_dynamic_spec, declare_dynamic
from fullgraph.compile.graphs import GraphedCall
from fullgraph.compile.options import DynamoConfig, Resolved, resolve
from fullgraph.compile.plan import PlanResult, build_parts
from fullgraph.compile.presets import Preset, get_preset
from fullgraph.compile.rewrites import Recorder, with_rewrites
from fullgraph.compile.rewrites import check_spec as check_rewrites
from fullgraph.compile.stats import CompileStats, Tracker
from fullgraph.compile.trace import TraceScope
from fullgraph.errors import FullgraphError, UsageError
from fullgraph.serving import copy_out, guard_for, hold_process, out_of_memory, release_process

ON_ERROR = ("raise", "eager")
_NOTHING = contextlib.nullcontext()  # reusable: it keeps no state


@contextlib.contextmanager
def _all_of(scopes: list[contextlib.AbstractContextManager]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for scope in scopes:
            stack.enter_context(scope)
        yield


class CompileFallbackWarning(UserWarning):
    """A model failed to compile and runs eagerly from now on (on_error="eager")."""


class UncompiledCallWarning(UserWarning):
    """A method reached through a CompiledModel runs the original module's uncompiled forward (`cm.generate`)."""


# Methods that call the model's forward themselves, so that reaching them through a CompiledModel runs no compiled
# code: said once per model, since a user calling them expects the compile to apply.
_RUN_UNCOMPILED = {
    "generate": "it is the module's own method, whose calls of the model run the uncompiled forward (as through "
    "torch.compile(model)); to compile the decoding steps, call the compiled model in your own loop (a KV cache "
    "compiles twice: its first use, then its length made dynamic), or compile the module's forward: "
    "model.forward = torch.compile(model.forward)",
}


class StrictRecompileError(FullgraphError, RuntimeError):
    """A compile after warm-up under strict_recompiles=True."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def _is_stance_failure(e: BaseException) -> bool:
    recompile_error = getattr(torch._dynamo.exc, "RecompileError", ())
    return isinstance(e, recompile_error) or "fail_on_recompile" in str(e)


class CompiledModel(nn.Module):
    """`model` compiled with one resolved configuration; behaves like `model`.

    - Attribute reads fall through to the model (`cm.num_classes`); setting one the model has sets it there.
      Methods reached that way (`cm.generate(...)`) run the original module, not the compiled call; for `generate`
      an `UncompiledCallWarning` says so, once.
    - `state_dict()` / `load_state_dict()` are the model's own, with its keys. `.to()`, `.cuda()`, `.half()` move or
      cast the model: the next call compiles again (a recompile Dynamo's guards ask for) and the input checks
      start over. Parameters and submodules also appear under `_orig_mod.`, as with `torch.compile`.
    - `warmup(*args, **kwargs)` runs one call that may compile; run it for every shape and path serving will take.
    - `stats` is a frozen `CompileStats` over this model's calls and warm-ups.
    """

    def __init__(self, model: nn.Module, resolved: Resolved, *, dtype: torch.dtype | None = None,
                 on_error: str = "raise", strict_recompiles: bool = False, trace: TraceScope | None = None,
                 eager: bool = False, label: str | None = None,
                 dynamic: DynamicSpec | None = None, parts: PlanResult | None = None,
                 around: Callable[[], contextlib.AbstractContextManager] | None = None,
                 rewrites: Recorder | None = None) -> None:  # fmt: skip
        super().__init__()
        if dtype is not None:
            model.to(dtype)
        model.eval()
        self._orig_mod = model
        self._resolved = resolved
        self._label = label or resolved.preset
        self._dtype = dtype
        self._on_error = on_error
        self._strict = strict_recompiles
        self._trace = trace
        self._tracker = Tracker()
        self._rewrites = rewrites  # what the graph-rewrite pass applied in this model's compiles
        self._eager = eager
        self._warmed = False
        self._signature: dict[str, tuple[torch.dtype, torch.device]] = {}
        self._names = _positional_names(model)
        self._dynamic = dynamic
        self._parts = parts  # a plan's or regional compilation's parts, installed around each call
        self._around = around  # the caller's context around each call (deploy's op policies)
        # Kept out of nn.Module's registry: the compiled wrapper holds the same model, moved and saved through it.
        whole = None if eager or parts is not None else torch.compile(model, **resolved.compile_kwargs())
        self.__dict__["_compiled"] = parts.call if parts is not None and not eager else whole
        self.__dict__["_run"] = (self._compiled, _direct(self._compiled))  # (what it runs, for whom)
        self.__dict__["_replays"] = resolved.replays_cuda_graphs  # read on every call
        # Threads (see the module docstring). Regional blocks under CUDA graphs replay one GraphedCall, which copies
        # its outputs itself; any other configuration that replays CUDA graphs does so through torch's trees.
        planned = parts.parts if parts is not None else ()
        trees = resolved.replays_cuda_graphs or any(p.resolved and p.resolved.replays_cuda_graphs for p in planned)
        trees = trees and not (parts is not None and isinstance(parts.call, GraphedCall))
        self.__dict__["_guard"] = guard = guard_for(type(model))
        guard.graph_trees = guard.graph_trees or trees
        self.__dict__["_copies"] = trees
        self.__dict__["_parts_config"] = any(p.resolved and p.resolved.dynamo for p in planned)

    # -- calls -------------------------------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(args, kwargs, warming=False)

    def warmup(self, *args: Any, **kwargs: Any) -> CompiledModel:
        """One call that may compile (never strict); returns self. Reach every path serving will take: with
        strict_recompiles=True a first compile after warm-up raises like a recompile."""
        self._call(args, kwargs, warming=True)
        return self

    @contextlib.contextmanager
    def borrow(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """`with cm.borrow(x) as out:` the output without the copy a CUDA-graph configuration makes of it, valid
        inside the block: the model's guard is held until the block ends, so no other call can overwrite it."""
        with self._guard:
            yield self._call(args, kwargs, warming=False, copy=False)

    def _call(self, args: tuple, kwargs: dict, *, warming: bool, copy: bool = True) -> Any:
        with self._guard:
            if torch.is_grad_enabled():  # (a nullcontext entered instead costs two Python calls on the hot path)
                with torch.no_grad():
                    return self._held_call(args, kwargs, warming, copy)
            return self._held_call(args, kwargs, warming, copy)

    def _held_call(self, args: tuple, kwargs: dict, warming: bool, copy: bool) -> Any:
        held = self._hold(warming)
        try:
            out = self._locked_call(args, kwargs, warming, held)
            return copy_out(out) if copy and self._copies and not self._eager else out
        finally:
            release_process()

    def _hold(self, warming: bool) -> bool:
        """Takes the process hold this call needs: alone in the process when the call sets a setting torch keeps
        process-wide (see the module docstring), shared otherwise. Returns whether Dynamo's config already holds this
        model's values, read once (~2 us on the 2-core CPU) under the hold, where no other call can change it: a
        shared hold whose config does not hold becomes an exclusive one. Holds nothing when it raises."""
        if self._eager:
            hold_process(False)
            return True
        alone = self._trace is not None or self._parts_config or (self._strict and self._warmed and not warming)
        dynamo = self._resolved.dynamo
        for exclusive in (alone, True):
            hold_process(exclusive)
            try:
                held = not dynamo or DynamoConfig.holds(dynamo)
            except BaseException:
                release_process()
                raise
            if held or exclusive:
                return held
            release_process()  # shared, and this call must set Dynamo's config: again, alone
        raise AssertionError("unreachable: the second hold is exclusive")

    def _locked_call(self, args: tuple, kwargs: dict, warming: bool, held: bool) -> Any:
        args, kwargs = self._inputs(args, kwargs)
        if self._copies and self.__dict__.get("_cuda"):
            self._guard.follow_stream()
        if self._dynamic and not self._eager:
            declare_dynamic(self._orig_mod, args, kwargs, self._dynamic)  # marks live on this call's tensors
        if self._eager:
            fn = self._orig_mod
        else:  # the direct form of `_compiled`, unless something put another callable there since
            compiled, direct = self._run
            fn = direct if compiled is self._compiled else self._compiled
        strict = self._strict and self._warmed and not warming and not self._eager
        self._tracker.begin()
        try:
            out = _within(self._scope(strict, held), fn, args, kwargs)
            if self._copies and self._guard.warmed_up():  # record on this thread now (CallGuard.warmed_up)
                del out
                out = _within(self._scope(strict, held), fn, args, kwargs)
        except torch.OutOfMemoryError as e:  # the inputs do not fit: not a compile failure, never a fallback
            self._tracker.end()
            if self._copies:
                self._guard.recover_trees()
            raise out_of_memory(self._name(), args, kwargs, e) from None
        except Exception as e:
            self._tracker.end()
            out = self._failed(e, strict, args, kwargs)
        else:
            call = self._tracker.end()
            if strict and call.frames_compiled:  # a new frame's first compile, on a torch whose stance lets it
                raise StrictRecompileError(
                    f"{self._name()}: compiled {call.frames_compiled} new frame(s) after warm-up "
                    "(strict_recompiles=True); warm up every path serving will take"
                )
        if not self._warmed:  # nn.Module.__setattr__ is slow on the hot path: set it once
            self._warmed = True
        return out

    def _scope(self, strict: bool, held: bool) -> contextlib.AbstractContextManager:
        """The contexts around one call, as one context manager. The hot path (a steady call under a preset) needs
        one or none: a generator context manager and an ExitStack around them cost 10-30 us of host time per call on
        the 2-core CPU (2026-12-03, benchmarks/wrapper_overhead.py), so those serve only calls that need several."""
        scopes: list[contextlib.AbstractContextManager] = []
        if not held:  # Dynamo's config differs from this model's (read under the process hold, CompiledModel._hold)
            scopes.append(DynamoConfig(self._resolved.dynamo))
        if strict:
            scopes.append(torch.compiler.set_stance("fail_on_recompile"))
        if self._parts is not None and not self._eager:
            scopes.append(self._parts.installed())
        # the whole model (or its regional blocks) replayed from CUDA graphs, which ops may trade for (replay.py);
        # a plan's parts each say it for themselves
        if self._replays and not self._eager and not (self._parts and self._parts.parts):
            scopes.append(replay.replayed())
        if self._trace is not None:
            scopes.append(self._trace.active())
        if self._around is not None:
            scopes.append(self._around())
        if len(scopes) > 1:
            return _all_of(scopes)
        return scopes[0] if scopes else _NOTHING

    def _failed(self, e: Exception, strict: bool, args: tuple, kwargs: dict) -> Any:
        if strict and _is_stance_failure(e):
            raise StrictRecompileError(
                f"{self._name()}: a compile after warm-up (strict_recompiles=True): {_first_line(e)}; warm up every "
                "shape and path serving will take, or declare the changing dims dynamic"
            ) from e
        if self._on_error != "eager" or self._eager:
            raise e
        out = self._orig_mod(*args, **kwargs)  # fails too: the inputs are at fault, not the compiler; that error
        cause = _first_line(e)
        self._eager = True
        self._tracker.fell_back(cause)
        warnings.warn(
            f"fullgraph.compile: {self._name()} (preset {self._label!r}) failed to compile and runs eagerly from "
            f"now on: {cause}",
            CompileFallbackWarning,
            stacklevel=2,
        )
        return out

    # -- inputs ------------------------------------------------------------------------------------------------

    def _inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Floating inputs cast to `dtype=`; every tensor checked against what it was on the first call."""
        raw = _key(args) if not kwargs else None
        raw = raw if raw is not None and _MIXED not in raw else None  # the usual call: positional tensors, scalars
        if raw is not None and raw == self.__dict__.get("_ready"):  # as the last checked call, with nothing to cast
            return args, kwargs
        flat = all(isinstance(a, _LEAVES) for a in args) and all(isinstance(v, _LEAVES) for v in kwargs.values())
        if self._dtype is not None:
            args, kwargs = _cast(args, kwargs, self._dtype, flat)
        # the usual call, positional tensors and scalars, as the last checked one: nothing new to check
        key = _key(args) if raw is not None else None  # (the cast keeps tensors tensors)
        if key is not None and key == self.__dict__.get("_checked"):
            return args, kwargs
        seen: dict[str, tuple[torch.dtype, torch.device]] = {}
        device = None if self._signature else _only_device(self._orig_mod)
        for name, t in self._tensors(args, kwargs):
            got = (t.dtype, t.device)
            want = self._signature.get(name)
            if want is None:
                if device is not None and t.device != device:
                    raise UsageError(f"input {name!r} is on {t.device} but the model is on {device}; move it there "
                                     f"(.to({str(device)!r}))")  # fmt: skip
                seen[name] = got
            elif want != got:
                raise UsageError(f"input {name!r}: the model was compiled for {want[0]} on {want[1]}, got "
                                 f"{got[0]} on {got[1]}")  # fmt: skip
        self._signature.update(seen)
        # kept out of nn.Module's attribute machinery: read and set on the hot path
        self.__dict__["_cuda"] = any(d.type == "cuda" for _, d in self._signature.values())
        self.__dict__["_checked"] = key
        # the cast changed no dtype: the next call with these inputs' kinds skips it and the checks
        self.__dict__["_ready"] = raw if raw is not None and raw == key else None
        return args, kwargs

    def _tensors(self, args: tuple, kwargs: dict) -> Iterator[tuple[str, torch.Tensor]]:
        named = [(self._names[i] if i < len(self._names) else f"args[{i}]", a) for i, a in enumerate(args)]
        for name, value in [*named, *kwargs.items()]:
            if isinstance(value, torch.Tensor):
                yield name, value
            elif isinstance(value, (list, tuple, dict)):
                leaves, _ = tree_flatten_with_path(value)
                yield from ((name + keystr(path), x) for path, x in leaves if isinstance(x, torch.Tensor))

    # -- behaving like the model -------------------------------------------------------------------------------

    def _apply(self, fn, recurse=True):  # .to(), .cuda(), .half(), ...: all go through here
        out = super()._apply(fn, recurse)
        self._signature = {}
        self.__dict__["_checked"] = self.__dict__["_ready"] = None
        self._warmed = False
        if self._dtype is not None:
            floats = [p.dtype for p in self._orig_mod.parameters() if p.is_floating_point()]
            self._dtype = floats[0] if floats else self._dtype
        return out

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            model = self.__dict__.get("_modules", {}).get("_orig_mod")
            if model is None:
                raise
            value = getattr(model, name)
            if name in _RUN_UNCOMPILED and not self.__dict__.get(f"_said_{name}"):
                self.__dict__[f"_said_{name}"] = True
                warnings.warn(f"{type(model).__name__}.{name} through fullgraph.compile: {_RUN_UNCOMPILED[name]}",
                              UncompiledCallWarning, stacklevel=2)  # fmt: skip
            return value

    def __setattr__(self, name: str, value: Any) -> None:
        model = self.__dict__.get("_modules", {}).get("_orig_mod")
        own = name.startswith("_") or name in self.__dict__ or hasattr(type(self), name)
        if model is not None and not own and hasattr(model, name):
            setattr(model, name, value)
        else:
            super().__setattr__(name, value)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False):
        return self._orig_mod.load_state_dict(state_dict, strict=strict, assign=assign)

    def extra_repr(self) -> str:
        r, planned = self._resolved, self._parts is not None and self._parts.regional is None
        parts = [] if planned else [f"preset={self._label!r}", f"backend={r.backend!r}"]
        parts += [f"mode={r.mode!r}"] if r.mode and not planned else []
        parts += [] if planned else [f"fullgraph={r.fullgraph}"]
        parts += [self._parts.summary()] if self._parts is not None else []
        parts += [f"dtype={self._dtype}"] + (["strict_recompiles=True"] if self._strict else [])
        if self._eager:
            parts.append("eager" if self.stats.fell_back is None else f"eager after: {self.stats.fell_back!r}")
        return ", ".join(parts)

    # -- what it did -------------------------------------------------------------------------------------------

    @property
    def stats(self) -> CompileStats:
        stats = self._tracker.stats
        if self._rewrites is None:
            return stats
        return dataclasses.replace(stats, rewrites=tuple(self._rewrites.applied),
                                   rewrites_skipped=tuple(self._rewrites.skipped))  # fmt: skip

    @property
    def plan(self) -> PlanResult | None:
        """The parts compiled apart (`plan=` or `regional=`), with per-path stats; None for a whole-model compile."""
        return self._parts

    def describe(self) -> str:
        """Which part compiles how: one line per planned path with its costs, the regional blocks, or the model."""
        return self._parts.describe() if self._parts is not None else f"whole model: {self.extra_repr()}"

    @property
    def resolved(self) -> Resolved:
        """The validated configuration (options with the mode expanded, Dynamo config) this model compiles with."""
        return self._resolved

    @property
    def original_module(self) -> nn.Module:
        return self._orig_mod

    @property
    def debug_files(self) -> list[str]:
        """The trace files written for `debug=` (tlparse reads them), or [] without it."""
        return self._trace.files() if self._trace is not None else []

    def _name(self) -> str:
        return type(self._orig_mod).__name__


_LEAVES = (torch.Tensor, int, float, bool, str, type(None))
_SCALARS = _LEAVES[1:]
_MIXED = object()  # in an input key: an argument that is neither a tensor nor a scalar (a list, a dict)


def _within(scope: contextlib.AbstractContextManager, fn: Callable, args: tuple, kwargs: dict) -> Any:
    """`fn(*args, **kwargs)` inside `scope`; the usual steady call has none to enter (`_NOTHING`)."""
    if scope is _NOTHING:
        return fn(*args, **kwargs)
    with scope:
        return fn(*args, **kwargs)


def _direct(compiled: Any) -> Any:
    """What calling `compiled` runs, without the call machinery around it: for torch.compile's OptimizedModule, its
    Dynamo-wrapped `forward` (an instance attribute since torch 2.0), skipping `OptimizedModule.__call__`'s global-hook
    check, its generator context manager (a flag only torch.distributed's ModTracker reads) and nn.Module's hook
    dispatch, ~3 us of host time a call on the 2-core CPU, paid on top of this model's own call. Anything else, or a
    torch that keeps no such attribute: `compiled` itself."""
    forward = getattr(compiled, "__dict__", {}).get("forward")
    if callable(forward) and isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule):
        return forward
    return compiled


def _key(args: tuple) -> tuple:
    """What the input checks depend on, per positional argument: a tensor's dtype and device, None for a scalar."""
    return tuple(
        (a.dtype, a.device) if isinstance(a, torch.Tensor) else None if isinstance(a, _SCALARS) else _MIXED
        for a in args
    )


def _cast(args: tuple, kwargs: dict, dtype: torch.dtype, flat: bool) -> tuple[tuple, dict]:
    """Floating tensors among the arguments cast to `dtype`, at any depth. Arguments that are all tensors or scalars
    (`flat`, the usual call) skip pytree: its flatten and unflatten took ~45 us of host time per call on the 2-core
    CPU (2026-12-03), most of `fullgraph.compile`'s own time per call."""

    def one(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t

    if flat:
        args = tuple(one(a) if isinstance(a, torch.Tensor) else a for a in args)
        return args, {k: one(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()} if kwargs else kwargs
    return tree_map_only(torch.Tensor, one, (args, kwargs))


def _positional_names(model: nn.Module) -> list[str]:
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds]


def _only_device(model: nn.Module) -> torch.device | None:
    """The model's device when all its parameters and buffers are on one (a model split across devices: None)."""
    devices = {t.device for t in (*model.parameters(), *model.buffers())}
    return devices.pop() if len(devices) == 1 else None


def compile(
    model: nn.Module,
    preset: str | Preset = "dev",
    *,
    mode: str | None = None,
    backend: str | None = None,
    options: Mapping[str, Any] | None = None,
    dtype: torch.dtype | None = None,
    dynamic: bool | str | DynamicSpec | None = "preset",
    fullgraph: bool | None = None,
    plan: Mapping[str, Any] | None = None,
    regional: bool | str = False,
    on_error: str = "raise",
    strict_recompiles: bool = False,
    debug: str | os.PathLike | None = None,
    recompile_limit: int | None = None,
    choice: Any = None,
    around: Callable[[], contextlib.AbstractContextManager] | None = None,
    rewrites: str | Sequence[str] = "auto",
    approximate_gelu: bool = False,
) -> CompiledModel:
    """Compile `model` with a preset (see fullgraph.compile.PRESETS) and the overrides given; everything is
    validated before anything compiles, and nothing compiles until the first call or `warmup`.

    - `mode`, `backend`, `options` (Inductor's), `dynamic` (True/False/None, "preset" keeps the preset's),
      `fullgraph` and `recompile_limit` override the preset's.
    - `dynamic={"x": {0: (1, 32)}}` declares input dims dynamic with ranges, marked on each call's inputs
      (fullgraph.compile.dynamic.declare_dynamic: sizes 0 and 1 compile apart); other dims stay automatic.
    - `dtype=torch.bfloat16` casts the model (in place) and its floating inputs on every call. An input of another
      dtype is cast into a new tensor, so a forward that writes into its inputs writes into that copy, not into
      the caller's tensor: pass inputs already in `dtype` where the forward's writes must be seen.
    - `on_error="eager"`: a compile failure warns once (CompileFallbackWarning, naming the cause) and the model runs
      eagerly from then on; "raise" lets the error through.
    - `strict_recompiles=True`: after warm-up (or the first call), any compile raises StrictRecompileError
      (torch.compiler.set_stance("fail_on_recompile") around this model's calls).
    - `debug=folder`: this model's compile trace, in the form tlparse reads (`tlparse folder/*.log`). torch's trace
      logger is process-wide; it is attached around this model's calls only (fullgraph.compile.trace).
    - `preset="auto"` with `choice=` a doctor Report (or its recommendation), or a tune result (`TuneResult`, or
      the path of `fullgraph tune`'s JSON): the configuration it measured best. A tune result's op policies are
      applied by `fullgraph.deploy.compile_tuned`, not here (this layer does not import the ops).
    - `around=`: a callable returning a context manager entered around each call and warm-up of this model only
      (`around=lambda: fullgraph.ops.policy(attention="native")`); compiled code guards on what it sets.
    - `rewrites="auto"`: the preset's graph rewrites (`Preset.rewrites`), each applied inside the compiled graph
      where its decision says it wins; `rewrites=["patch_gemm", ...]` forces those wherever they are sound; `[]`
      none. `approximate_gelu=True` lets an exact GELU become the tanh form (a changed function) where that is what
      the GELU epilogue computes. What was applied, where: `stats.rewrites` (docs/rewrites.md).
    - `plan={"vision": "perception", "fusion": "eager", "head": {"backend": "cudagraphs"}}` compiles those
      submodules each its own way (dict entries override `preset`) and runs the rest eagerly;
      `regional=True` ("per-block") or "nested" compiles the repeated blocks once (fullgraph.compile.plan).
    """
    if not isinstance(model, nn.Module):
        raise UsageError(f"fullgraph.compile takes an nn.Module, not {type(model).__name__}; for a function, use "
                         "torch.compile or wrap it in a module")  # fmt: skip
    if isinstance(model, CompiledModel):
        raise UsageError("this model is already a CompiledModel; compile its .original_module instead")
    if plan is not None and preset == "auto":
        raise UsageError("plan= takes a preset per path; preset='auto' does not combine with it")
    given = dict(mode=mode, backend=backend, options=options, fullgraph=fullgraph, recompile_limit=recompile_limit,
                 dynamic=None if isinstance(dynamic, str) and dynamic == "preset" else dynamic)  # fmt: skip
    spec = check_dynamic_spec(dynamic) if isinstance(dynamic, Mapping) else None
    dynamic = None if spec is not None else dynamic  # declared dims are marked; the rest stay automatic
    if on_error not in ON_ERROR:
        raise UsageError(f"on_error={on_error!r}: choose one of {', '.join(map(repr, ON_ERROR))}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise UsageError(f"dtype={dtype!r}: give a floating torch dtype (torch.bfloat16, torch.float16, ...)")
    if not isinstance(strict_recompiles, bool):
        raise UsageError(f"strict_recompiles={strict_recompiles!r}: give True or False")
    if strict_recompiles and not hasattr(torch.compiler, "set_stance"):
        raise UsageError(
            f"strict_recompiles=True needs torch.compiler.set_stance (torch 2.6+), not in {torch.__version__}"
        )
    if recompile_limit is not None and (isinstance(recompile_limit, bool) or not isinstance(recompile_limit, int)
                                        or recompile_limit < 1):  # fmt: skip
        raise UsageError(f"recompile_limit={recompile_limit!r}: give a positive int")
    if around is not None and not callable(around):
        raise UsageError(f"around={around!r}: give a callable that returns a context manager")
    if choice is not None and preset != "auto":
        raise UsageError(f"choice= goes with preset='auto', not preset={preset!r}")
    eager, label = False, None
    if preset == "auto":
        picked = read_choice(choice)
        for given, chosen, name in ((mode, picked.mode, "mode"), (dtype, picked.dtype, "dtype")):
            if given is not None and chosen is not None and given != chosen:
                raise UsageError(f"{name}={given!r} contradicts the choice {picked.config!r}; drop one of them")
        preset, mode, dtype = picked.preset, mode or picked.mode, dtype or picked.dtype
        eager, label = picked.eager, f"auto: {picked.config}"
        if picked.rewrites_off and isinstance(rewrites, str) and rewrites == "auto":
            rewrites = []  # the row measured without rewrites
    if not isinstance(approximate_gelu, bool):
        raise UsageError(f"approximate_gelu={approximate_gelu!r}: give True or False")
    dynamo = {"recompile_limit": recompile_limit} if recompile_limit is not None else None
    resolved = resolve(preset, mode=mode, backend=backend, options=options, dynamo=dynamo, dynamic=dynamic,
                       fullgraph=fullgraph)  # fmt: skip
    forced = check_rewrites(rewrites)
    recorder = Recorder()
    chosen = get_preset(preset).rewrites if forced is None else forced
    resolved = with_rewrites(resolved, chosen, forced=forced is not None, approximate_gelu=approximate_gelu,
                             recorder=recorder)  # fmt: skip
    parts = build_parts(model, preset, resolved, plan=plan, regional=regional, given=given)
    trace = TraceScope(debug) if debug is not None else None
    return CompiledModel(model, resolved, dtype=dtype, on_error=on_error, strict_recompiles=strict_recompiles,
                         trace=trace, eager=eager, label=label, dynamic=spec, parts=parts,
                         around=around, rewrites=recorder)  # fmt: skip


__all__ = ["CompileFallbackWarning", "CompiledModel", "StrictRecompileError", "compile"]
