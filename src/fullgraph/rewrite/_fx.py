"""Helpers for rewriting Dynamo's (pre-grad, torch-level) FX graphs: arguments by name, example values, new nodes
with their example values and provenance, and where a node came from in the user's code."""

from __future__ import annotations

import abc
import functools
import hashlib
import inspect
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx

from fullgraph.compile.rewrites import Applied, Context, Skipped

_PROVENANCE = ("nn_module_stack", "stack_trace", "source_fn_stack", "seq_nr")


def call_args(node: fx.Node, names: Sequence[str], defaults: dict[str, Any]) -> dict[str, Any] | None:
    """`node`'s arguments by parameter name (positional ones first, then keywords, then `defaults`); None when it
    has arguments the names do not cover."""
    if len(node.args) > len(names) or set(node.kwargs) - set(names):
        return None
    out = dict(defaults)
    out.update(zip(names, node.args, strict=False))
    out.update(node.kwargs)
    return out if all(n in out for n in names) else None


def value(arg: Any) -> Any:
    """The example value Dynamo recorded for a node (a FakeTensor, a SymInt), or the argument itself."""
    if isinstance(arg, fx.Node):
        return arg.meta.get("example_value", arg.meta.get("val"))
    return arg


def static_ints(values: Any) -> tuple[int, ...] | None:
    """`values` as plain ints (a tuple, list or single int), or None if any is symbolic or not an int."""
    seq = values if isinstance(values, (tuple, list, torch.Size)) else (values,)
    return tuple(seq) if all(type(v) is int for v in seq) else None


def single_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


class Builder:
    """Adds torch-function nodes before `anchor`, each with its example value (computed on the inputs' fake tensors)
    and the anchor's provenance, so later passes and the user's stats see them as the replaced code."""

    def __init__(self, graph: fx.Graph, anchor: fx.Node):
        self.graph, self.anchor = graph, anchor

    def __call__(self, fn: Callable, *args: Any, **kwargs: Any) -> fx.Node:
        with self.graph.inserting_before(self.anchor):
            node = self.graph.call_function(fn, tuple(args), dict(kwargs))
        for key in _PROVENANCE:
            if key in self.anchor.meta:
                node.meta[key] = self.anchor.meta[key]
        try:
            vals = torch.fx.node.map_arg((args, kwargs), value)
            node.meta["example_value"] = fn(*vals[0], **vals[1])
        except Exception:  # an example value is a convenience for later passes, never a reason to fail the compile
            pass
        return node

    def replace(self, new: fx.Node) -> None:
        """Every use of the anchor now reads `new`; the anchor is erased."""
        self.anchor.replace_all_uses_with(new)
        self.graph.erase_node(self.anchor)


def where(node: fx.Node) -> tuple[str, str]:
    """(module path, "file.py:line") of the user's code a node was traced from; "" for what the graph lacks."""
    stack = node.meta.get("nn_module_stack") or {}
    path = ""
    if stack:
        path = list(stack.values())[-1][0]
        path = re.sub(r"^L\['[^']+'\]\.?", "", path)  # the module itself, whatever its forward names it
        path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path).lstrip(".")
        path = re.sub(r"\[\s*'?([^\]']+)'?\s*\]", r".\1", path).lstrip(".")
    line = ""
    trace = node.meta.get("stack_trace") or ""
    found = re.findall(r'File "([^"]+)", line (\d+)', trace)
    if found:
        file, number = found[-1]
        line = f"{Path(file).name}:{number}"
    return path, line


@functools.cache
def source_identity(*objects: Any) -> str:
    """A digest of the source files that define `objects` (modules, classes, functions) and of this file, read once
    per process (the code that runs is the code imported then)."""
    h = hashlib.sha256()
    files = {inspect.getsourcefile(o) for o in objects} | {__file__}
    for f in sorted(f for f in files if f):
        h.update(Path(f).read_bytes())
    return h.hexdigest()


class PatternRewrite(abc.ABC):
    """A rewrite of single matched nodes: `match` finds one (its data, or a reason it cannot be rewritten soundly),
    `refuse` says why to leave a sound one (the decision, a precision rule), `replace` edits the graph; `apply` runs
    them over a graph and records each place (fullgraph.compile.rewrites' protocol)."""

    name = ""
    measured_on = ("cuda",)  # device types where `auto` takes it (the rest were not measured)

    @abc.abstractmethod
    def match(self, node: fx.Node) -> Any:
        """None when `node` is not the pattern; a reason (str) when it is one that cannot be rewritten soundly; else
        what `refuse`, `replace` and `detail` read."""

    @abc.abstractmethod
    def refuse(self, found: Any, context: Context) -> str | None:
        """Why this sound match is left alone, or None to rewrite it."""

    @abc.abstractmethod
    def replace(self, graph: fx.Graph, node: fx.Node, found: Any) -> None:
        """Edit the graph: `node` replaced by the equivalent."""

    @abc.abstractmethod
    def detail(self, found: Any, context: Context) -> str:
        """What the match became, for `stats.rewrites`."""

    def not_measured(self, device: torch.device, context: Context) -> str | None:
        """`auto`'s refusal on a device where this rewrite was not measured (None when forced, or measured there)."""
        if context.forced or device.type in self.measured_on:
            return None
        return f"auto: not measured on {device.type} (rewrites=[{self.name!r}] forces it)"

    def identity(self) -> str:
        """A digest of the source of this rewrite's class and of every fullgraph class it inherits from (where its
        match and refusal may live)."""
        return source_identity(*(c for c in type(self).__mro__ if c.__module__.startswith("fullgraph.")))

    def apply(self, graph: fx.Graph, context: Context) -> list[Applied]:
        applied = []
        for node in list(graph.nodes):
            found = self.match(node)
            if found is None:
                continue
            path, line = where(node)
            reason = found if isinstance(found, str) else self.refuse(found, context)
            if reason:
                context.skipped.append(Skipped(self.name, path, line, reason))
                continue
            self.replace(graph, node, found)
            applied.append(Applied(self.name, path, line, self.detail(found, context)))
        return applied
