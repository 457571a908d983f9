"""The graph rewrites `fullgraph.compile` applies inside a compiled graph, reached by name (DESIGN.md, Layers).

The rewrites live in `fullgraph.rewrite`, above `ops`, which this package may not import. What this module owns is
the registry (each name with the "module:attr" of its `Rewrite`, imported only when a compile uses it), the
`rewrites=` argument's resolution, and the Inductor pass that runs the chosen rewrites: a `CustomGraphPass` set as
Inductor's `pre_grad_custom_pass` for this model's compile only (an Inductor option, scoped by torch.compile).

Why pre-grad: the graph is still torch-level (`torch.conv2d`, `linear`, `gelu`, `scaled_dot_product_attention` as
Dynamo recorded them), so a replacement is written with torch functions and AOTAutograd traces and decomposes it
like the user's own code. The pass runs before Inductor's cache lookup (`pre_grad_pass_timing="early"` where torch
has that option, 2.13; torch 2.9-2.12 run pre-grad passes there anyway), so the cache key is that of the rewritten
graph, and the pass runs again in a warm process: `CompiledModel.stats.rewrites` lists what was applied also when
the compiled code came from the cache. `uuid()` (what torch hashes for a pass that runs after the lookup) covers the
names chosen, the options, and the source of every rewrite module with its decision data (`Rewrite.identity`).

A `Rewrite` (fullgraph.rewrite's) is an object with `name`, `identity() -> str` and `apply(graph, context) ->
list[Applied]`, which edits the graph in place.
"""

from __future__ import annotations

import hashlib
import importlib
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from fullgraph.errors import UsageError

if TYPE_CHECKING:
    from fullgraph.compile.options import Resolved

# name -> "module:attr" of its Rewrite; what each does: docs/rewrites.md
REGISTRY: dict[str, str] = {
    # first: the row-wise layers it slims are then what the other rewrites match, for the one token
    "token_select": "fullgraph.rewrite.token_select:REWRITE",
    "patch_gemm": "fullgraph.rewrite.patch:REWRITE",
    "gelu_formula": "fullgraph.rewrite.gelu_formula:REWRITE",  # before gelu_epilogue, which then sees an F.gelu
    "gelu_epilogue": "fullgraph.rewrite.gelu:REWRITE",
    # a pattern that holds another's runs first: the modulated LayerNorm before the LayerNorm alone
    "layer_norm_modulate_kernel": "fullgraph.rewrite.modulate:REWRITE",
    "layer_norm_kernel": "fullgraph.rewrite.norms:REWRITE",
    "attention_kernel": "fullgraph.rewrite.attention:REWRITE",
}


@dataclass(frozen=True)
class Applied:
    """One rewrite applied at one place of a graph: the module path and source line of the code it replaced."""

    rewrite: str
    where: str  # module path ("blocks.3.mlp"), or "" at the top level
    line: str  # "file.py:123", or "" when the graph carries no stack trace
    detail: str = ""  # what it became ("GEMM 196x768 @ 768x768", ...)


@dataclass(frozen=True)
class Skipped:
    """A place a rewrite matched but left alone, and why (its decision said no, or the fp32 precision rule)."""

    rewrite: str
    where: str
    line: str
    reason: str


@dataclass
class Context:
    """What a rewrite may read while it runs: the options given to `fullgraph.compile`."""

    forced: bool  # rewrites=[names]: apply wherever the pattern is sound, without the shape decision
    approximate_gelu: bool = False  # an exact (erf) GELU may become the tanh form (a changed function)
    skipped: list[Skipped] = field(default_factory=list)


ALL = tuple(REGISTRY)


def check_spec(rewrites: Any) -> tuple[str, ...] | None:
    """`rewrites=` checked: "auto" -> None (the preset's rewrites, each where its decision says it wins), a list
    of names -> those, forced; [] -> none. One UsageError naming the unknown name and the known ones."""
    if isinstance(rewrites, str):
        if rewrites == "auto":
            return None
        raise UsageError(f"rewrites={rewrites!r}: give 'auto', a list of names ({', '.join(REGISTRY)}) or []")
    if not isinstance(rewrites, Iterable):
        raise UsageError(f"rewrites={rewrites!r}: give 'auto', a list of names ({', '.join(REGISTRY)}) or []")
    names = tuple(rewrites)
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise UsageError(f"unknown rewrite {unknown[0]!r}; the rewrites are {', '.join(REGISTRY)} (docs/rewrites.md)")
    return names


def load(name: str) -> Any:
    """The Rewrite registered as `name`, imported now."""
    module, attr = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), attr)


class Recorder:
    """What the pass applied, per compile of this model (every graph Inductor compiled for it), newest last."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.applied: list[Applied] = []
        self.skipped: list[Skipped] = []

    def add(self, applied: Sequence[Applied], skipped: Sequence[Skipped]) -> None:
        with self._lock:
            self.applied.extend(applied)
            self.skipped.extend(s for s in dict.fromkeys(skipped) if s not in self.skipped)  # each place once


def make_pass(chosen: tuple[str, ...], *, forced: bool, approximate_gelu: bool, recorder: Recorder,
              previous: Any = None):  # fmt: skip
    """The CustomGraphPass that runs the rewrites `chosen` (each where its decision says it wins, or wherever it is
    sound when `forced`) in the registry's order, then `previous` (a pre-grad pass the user set in `options`, kept)."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    chosen = tuple(sorted(set(chosen), key=list(REGISTRY).index))

    class RewritePass(CustomGraphPass):
        def __call__(self, graph: Any) -> None:
            context = Context(forced=forced, approximate_gelu=approximate_gelu)
            applied: list[Applied] = []
            for name in chosen:
                try:
                    done = load(name).apply(graph, context)
                    if done:  # what a rewrite left unused goes now: the next one matches on single uses
                        graph.eliminate_dead_code()
                    applied += done
                except Exception as e:  # a rewrite's bug never costs the user's compile: it is reported, not applied
                    context.skipped.append(Skipped(name, "", "", f"failed, graph left as it was: {e!r}"[:300]))
            if applied:  # dead code went after each rewrite that applied
                graph.lint()
                graph.owning_module.recompile()
            recorder.add(applied, context.skipped)
            if previous is not None:
                previous(graph)

        def uuid(self) -> str:
            h = hashlib.sha256(repr((chosen, forced, approximate_gelu)).encode())
            for name in chosen:
                h.update(load(name).identity().encode())
            if previous is not None:
                prev = previous.uuid() if hasattr(previous, "uuid") else None
                h.update(repr(prev).encode())
            return h.hexdigest()

        def __reduce__(self) -> tuple[Any, tuple[str]]:
            # Torch 2.9-2.12 pickle Inductor's config into the FX-graph and AOTAutograd cache keys, this pass with it
            # (2.13 leaves it out and hashes uuid()): a local class does not pickle, and every compile then bypassed
            # both caches (seen on the H200, torch 2.11). Pickled, the pass is its uuid.
            return _unpickled_pass, (self.uuid(),)

    return RewritePass()


def _unpickled_pass(uuid: str) -> None:
    """What a pickled rewrite pass becomes (`RewritePass.__reduce__`): nothing to run. Pickles of Inductor's config
    are cache keys; a compile never runs from one."""
    return None


def with_rewrites(resolved: Resolved, chosen: tuple[str, ...], *, forced: bool, approximate_gelu: bool,
                  recorder: Recorder) -> Resolved:  # fmt: skip
    """`resolved` with the rewrite pass's Inductor options (`Resolved.rewrites`, merged into torch.compile's
    options); unchanged when none is chosen or the backend is not Inductor (the rewrites are Inductor passes)."""
    if not chosen or resolved.backend != "inductor":
        return resolved
    import torch._inductor.config as inductor_config

    previous = resolved.options.get("pre_grad_custom_pass")
    extra: dict[str, Any] = {
        "pre_grad_custom_pass": make_pass(
            chosen, forced=forced, approximate_gelu=approximate_gelu, recorder=recorder, previous=previous
        )
    }
    if hasattr(inductor_config, "pre_grad_pass_timing"):
        extra["pre_grad_pass_timing"] = "early"  # before the cache lookup: stats from a warm cache too
    return replace(resolved, rewrites=extra)
