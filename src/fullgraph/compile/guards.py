"""The guards Dynamo need not check on every call of a model built from fullgraph's ops.

Dynamo guards what the code it traces reads, and checks every guard on every call. A model built from our ops
(`fullgraph.models`' DiT and ViT, or a user's own) traces through our dispatch: each function of ours it inlines
gets a guard on its code object, each module of ours reached through another one a guard that it is still the same
module, each default argument of ours a guard on its value. None of them can change while a process runs (nobody
replaces our functions), yet they were most of what a compiled DiT cost on the host beyond its plain twin with the
same Inductor code: on the CPU machine (torch 2.13, 4 blocks, a call that is all host time) ours took 491 us against
plain's 457 and 453 without these guards (`benchmarks/probes/dit_guard_cost.py`); on a GPU host the same gap was the
sweep's default-mode losses at its host-bound points (issue 32).

`trusted_code(entries)` is a `guard_filter_fn` (`torch.compile(options={"guard_filter_fn": ...})`, torch 2.9+) that
drops those identity guards only:
  - guards whose source is one of fullgraph's modules (`G['__import_fullgraph_dot_...']`) and whose kind checks an
    identity (code object, function, module, class, the aliasing of two names of one module) or a default argument;
  - identity guards on a global name (a module-level name of the traced code) whose value is a fullgraph function,
    class or module. An attribute that holds one of ours (`self.act = fullgraph.ops.gelu`) keeps its guard: a
    model may swap it.
It keeps every guard on state: the op policies (`ops.policies`: a policy change recompiles), tensors, shapes,
nn.Module attributes, global torch state, and anything of a user's. `fullgraph.compile` applies it (with the
user's own filter, if the options name one: a guard is kept only if both keep it); a user of plain `torch.compile`
passes `options={"guard_filter_fn": fullgraph.trusted_guards}`.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Sequence
from typing import Any

# guard kinds that check an object's identity, not a value that can change
IDENTITY = frozenset({"CLOSURE_MATCH", "FUNCTION_MATCH", "ID_MATCH", "MODULE_MATCH", "CLASS_MATCH", "DUPLICATE_INPUT"})
_ROOT = "__import_fullgraph_dot_"  # how Dynamo names a module of ours reached from traced code's globals
_STATE = ("fullgraph_dot_ops_dot_policies", "fullgraph.ops.policies")  # the op policies: state, always guarded


def _ours(value: Any) -> bool:
    """Is `value` a fullgraph module, or a function, class or code object defined in one (nothing a call replaces)?"""
    if isinstance(value, types.ModuleType):
        return value.__name__.startswith("fullgraph.")
    if isinstance(value, (types.FunctionType, type)):
        return (getattr(value, "__module__", None) or "").startswith("fullgraph.")
    if isinstance(value, types.CodeType):
        return "/fullgraph/" in value.co_filename
    return False


def keeps(entry: Any) -> bool:
    """Does `trusted_code` keep this guard (a `torch._dynamo.types.GuardFilterEntry`)?"""
    name = entry.name
    if any(s in name for s in _STATE):
        return True
    if _ROOT in name:
        return not (entry.guard_type in IDENTITY or ".__defaults__" in name)
    if entry.guard_type in IDENTITY and entry.has_value and name.startswith("G["):  # a global name, not an attribute
        return not _ours(entry.value)
    return True


def trusted_code(entries: Sequence[Any]) -> list[bool]:
    """A `guard_filter_fn`: keep every guard but the identity guards on fullgraph's own code (`keeps`)."""
    return [keeps(e) for e in entries]


def both(first: Callable[[Sequence[Any]], list[bool]], second: Callable[[Sequence[Any]], list[bool]]):
    """A guard filter keeping what both filters keep."""

    def keep_both(entries: Sequence[Any]) -> list[bool]:
        return [a and b for a, b in zip(first(entries), second(entries), strict=True)]

    return keep_both


@functools.cache
def supported() -> bool:
    """Does this torch take `options={"guard_filter_fn": ...}`?"""
    import torch._dynamo

    # torch.compiler's own filters came with the option (2.8); the signature says it where optimize is a function
    return hasattr(torch.compiler, "skip_guard_on_globals_unsafe") or (
        "guard_filter_fn" in inspect.signature(torch._dynamo.optimize).parameters
    )
