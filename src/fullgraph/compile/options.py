"""A preset and a user's overrides, validated against the installed torch and merged into one set of compile
arguments, before anything compiles.

- Inductor options are checked against `torch._inductor.list_options()`, with close matches for a typo
  (`freeze` -> `freezing`); a mode expands through `torch._inductor.list_mode_options`, so edge's max-autotune,
  freezing and C++ wrapper combine with the user's options into one dict.
- A user's option overrides the preset's; an option that contradicts the mode's own expansion
  (`mode="reduce-overhead"` with `triton.cudagraphs=False`) is an error naming both.
- A backend must be registered here (`torch._dynamo.list_backends(exclude_tags=())`); the ones users reach for that
  are not are refused with what to install. Options for a backend other than Inductor are refused (torch would
  ignore them silently).
- Dynamo values (the recompile limit) are checked against `torch._dynamo.config`.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from fullgraph.compile import guards
from fullgraph.compile.presets import MODES, Preset, get_preset
from fullgraph.errors import UsageError

# Backends users ask for that this torch may not register, and what brings them (DESIGN.md, erratum 6).
NOT_REGISTERED = {
    "onnxrt": "torch's onnxrt backend is a commented-out placeholder since 2.13 (installing onnxruntime does not "
    "bring it back); export with torch.onnx.export instead",
    "tensorrt": "it is registered by torch-tensorrt: pip install torch-tensorrt",
    "torch_tensorrt": "it is registered by torch-tensorrt: pip install torch-tensorrt",
    "ipex": "it is registered by Intel's extension: pip install intel-extension-for-pytorch",
}
# Dynamo renamed cache_size_limit to recompile_limit (torch 2.6); presets say the new name.
DYNAMO_ALIASES = {"recompile_limit": "cache_size_limit"}
GUARD_FILTER = "guard_filter_fn"  # torch.compile takes it from `options` (compile/guards.py)


class DynamoConfig:
    """Dynamo config values set for the duration of a block, then put back: what `torch._dynamo.config.patch`
    does, for the hot path of every compiled call. torch's patch builds a class per use (~40 us of host time per
    call on the 2-core CPU, 2026-12-02; half of `fullgraph.compile`'s own time per call); this sets and restores
    the attributes, and skips those that already hold the value."""

    __slots__ = ("items", "saved")

    def __init__(self, items: dict[str, Any]):
        self.items = tuple(items.items())
        self.saved: list[tuple[str, Any]] = []

    @staticmethod
    def holds(items: dict[str, Any]) -> bool:
        """Do Dynamo's config values already equal `items` (nothing to set)?"""
        cfg = torch._dynamo.config
        return all(getattr(cfg, name) == value for name, value in items.items())

    def __enter__(self) -> None:
        cfg = torch._dynamo.config
        saved = []
        for name, value in self.items:
            old = getattr(cfg, name)
            if old != value:
                saved.append((name, old))
                setattr(cfg, name, value)
        self.saved = saved

    def __exit__(self, *exc) -> None:
        cfg = torch._dynamo.config
        for name, old in reversed(self.saved):
            setattr(cfg, name, old)


@dataclass(frozen=True)
class Resolved:
    """Everything `torch.compile` and the per-call config scope need, already validated."""

    preset: str
    backend: str
    mode: str | None
    fullgraph: bool
    dynamic: bool | None
    options: dict[str, Any] = field(default_factory=dict)  # Inductor options, the mode's expansion included
    dynamo: dict[str, Any] = field(default_factory=dict)  # Dynamo config applied around this model's calls
    # Inductor options of the graph-rewrite pass (fullgraph.compile.rewrites), added at compile: not part of the
    # configuration a preset or a pasted call names, so not compared
    rewrites: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def replays_cuda_graphs(self) -> bool:
        """Does this configuration run its compiled code from CUDA graphs (reduce-overhead, max-autotune, the
        triton.cudagraphs option, the cudagraphs backend)?"""
        return self.backend == "cudagraphs" or (
            self.backend == "inductor" and bool(self.options.get("triton.cudagraphs"))
        )

    def without_cuda_graphs(self) -> Resolved:
        """The same compile with its code run directly, not replayed from CUDA graphs (for parts that a caller
        captures in one graph of its own): the cudagraphs backend becomes "eager" (what it replays is the captured
        graph run as it is), Inductor's triton.cudagraphs option goes off."""
        if self.backend == "cudagraphs":
            return replace(self, backend="eager")
        if self.replays_cuda_graphs:
            return replace(self, options={**self.options, "triton.cudagraphs": False})
        return self

    def compile_kwargs(self) -> dict[str, Any]:
        """Arguments for torch.compile. The mode travels as its expanded options (torch refuses mode and options
        together), so `options` is the single source of what Inductor was told."""
        kwargs: dict[str, Any] = {"backend": self.backend, "fullgraph": self.fullgraph, "dynamic": self.dynamic}
        if self.backend == "inductor":
            kwargs["options"] = {**self.options, **(self.rewrites or {})}
            if guards.supported():  # no per-call check of the identity guards on our own code (compile/guards.py)
                own = kwargs["options"].get(GUARD_FILTER)
                ours = guards.trusted_code
                kwargs["options"][GUARD_FILTER] = ours if own is None else guards.both(own, ours)
        return kwargs


@functools.cache
def inductor_options() -> frozenset[str]:
    import torch._inductor

    return frozenset(torch._inductor.list_options())


def mode_options(mode: str | None) -> dict[str, Any]:
    import torch._inductor

    return dict(torch._inductor.list_mode_options(mode)) if mode and mode != "default" else {}


def registered_backends() -> list[str]:
    return list(torch._dynamo.list_backends(exclude_tags=()))


def _suggest(name: str, known: list[str] | frozenset[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def check_backend(backend: str) -> None:
    known = registered_backends()
    if backend in known:
        return
    if backend in NOT_REGISTERED:
        raise UsageError(f"backend {backend!r} cannot run here: {NOT_REGISTERED[backend]}")
    raise UsageError(f"backend {backend!r} is not registered in this torch{_suggest(backend, known)} (known: "
                     f"{', '.join(sorted(known))})")  # fmt: skip


def check_options(options: Mapping[str, Any]) -> None:
    known = inductor_options()
    for key in options:
        if key == GUARD_FILTER:  # torch.compile's own, not Inductor's: it takes it from the same options
            if not callable(options[key]):
                raise UsageError(f"option {GUARD_FILTER} must be a function of the guard entries, got {options[key]!r}")
            continue
        if key not in known:
            raise UsageError(f"Inductor has no option {key!r}{_suggest(key, known)}")


def dynamo_config_name(key: str) -> str:
    """The name this torch's Dynamo config uses for `key` (recompile_limit was cache_size_limit before 2.6)."""
    cfg = torch._dynamo.config
    if hasattr(cfg, key):
        return key
    alias = DYNAMO_ALIASES.get(key)
    if alias and hasattr(cfg, alias):
        return alias
    known = [k for k in dir(cfg) if not k.startswith("_")]
    raise UsageError(f"Dynamo has no config {key!r}{_suggest(key, known)}")


def resolve(
    preset: str | Preset = "dev",
    *,
    mode: str | None = None,
    backend: str | None = None,
    options: Mapping[str, Any] | None = None,
    dynamo: Mapping[str, Any] | None = None,
    fullgraph: bool | None = None,
    dynamic: bool | str | None = "preset",
) -> Resolved:
    """The preset with the user's overrides, validated; raises a one-line UsageError before anything compiles.

    `dynamic` keeps the preset's unless given (None is a value: automatic dynamic)."""
    p = get_preset(preset)
    backend = backend or p.backend
    check_backend(backend)
    user = dict(options or {})
    if backend != "inductor":
        if mode not in (None, "default"):
            raise UsageError(f"mode={mode!r} applies to the inductor backend only, not {backend!r}")
        if user:
            raise UsageError(f"options apply to the inductor backend only; {backend!r} would ignore {sorted(user)}")
        mode = None
    else:
        mode = mode or p.mode or "default"
        if mode not in MODES:
            raise UsageError(f"unknown mode {mode!r}{_suggest(mode, list(MODES))}; choose one of {', '.join(MODES)}")
    check_options(user)
    expanded = mode_options(mode)
    for key, value in user.items():
        if key in expanded and expanded[key] != value:
            raise UsageError(f"option {key}={value!r} contradicts mode={mode!r}, which sets {key}={expanded[key]!r}; "
                             "drop one of them")  # fmt: skip
    merged = {**expanded, **(dict(p.options) if backend == "inductor" else {}), **user}
    check_options(merged)
    cfg = {**dict(p.dynamo), **dict(dynamo or {})}
    dyn = {dynamo_config_name(k): v for k, v in cfg.items()}
    return Resolved(
        preset=p.name, backend=backend, mode=mode, fullgraph=p.fullgraph if fullgraph is None else fullgraph,
        dynamic=p.dynamic if dynamic == "preset" else dynamic, options=merged, dynamo=dyn,
    )  # fmt: skip
