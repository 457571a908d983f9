"""Regional AOT: one AOTInductor package for a model's repeated block, its weights passed in per layer.

A transformer's AOTInductor build traces and lowers the same block N times, and the package holds every layer's
weights as constants. `export_regional` exports one block instead (the first of the model's largest group of
repeated blocks, found as regional compilation finds them: `fullgraph.compile.regional.find_repeated_blocks`),
with its parameters and buffers lifted to inputs (`torch.func.functional_call`), so the package holds code and
no weights, and its build costs about one block's. `load_regional(model, path)` loads it (checked and probed like
any package: `fullgraph.deploy.load`) and points every instance of the block at it, each call passing that
instance's own tensors; the rest of the model runs eagerly from its own code, which must be importable where it is
loaded (unlike a whole-model package). `RegionalPackage.restore()` puts the blocks back.

Shapes: the block is exported for the input shapes it saw on `example_inputs` (every instance must see the same:
checked), with `dynamic={"x": {0: (1, 64)}}` declaring dims of the block's inputs dynamic, by the names of its
forward's parameters.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fullgraph._files import write_atomic
from fullgraph.compile.regional import BlockGroup, find_repeated_blocks
from fullgraph.deploy._common import DeployError
from fullgraph.deploy.build import export
from fullgraph.deploy.package import LoadedPackage, load
from fullgraph.errors import UsageError

META_KEY = "fullgraph_regional"


class _Stateless(nn.Module):
    """`block` called with its parameters and buffers as trailing inputs: what the package computes."""

    def __init__(self, block: nn.Module, names: Sequence[str], n_inputs: int) -> None:
        super().__init__()
        self.block, self.names, self.n_inputs = block, tuple(names), n_inputs

    def forward(self, *flat: torch.Tensor) -> Any:
        inputs, state = flat[: self.n_inputs], flat[self.n_inputs :]
        return torch.func.functional_call(self.block, dict(zip(self.names, state, strict=True)), inputs)


def _state(block: nn.Module) -> tuple[list[str], list[torch.Tensor]]:
    named = list(block.named_parameters()) + list(block.named_buffers())
    return [n for n, _ in named], [t.detach() for _, t in named]


def _block_inputs(model: nn.Module, group: BlockGroup, example_inputs: Sequence[Any]) -> tuple[torch.Tensor, ...]:
    """The positional tensor inputs of the group's first instance on `example_inputs` (every instance checked to
    see the same shapes and dtypes, and none called with keyword inputs)."""
    seen: dict[str, tuple] = {}

    def hook(path: str) -> Callable:
        def record(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if kwargs or not all(isinstance(a, torch.Tensor) for a in args):
                raise UsageError(f"{path} is called with keyword or non-tensor inputs; regional export takes "
                                 "blocks called with tensors only: export the whole model instead")  # fmt: skip
            seen.setdefault(path, tuple(a.detach() for a in args))

        return record

    handles = [model.get_submodule(p).register_forward_pre_hook(hook(p), with_kwargs=True) for p in group.paths]
    try:
        with torch.no_grad():
            model(*example_inputs)
    finally:
        for h in handles:
            h.remove()
    missing = [p for p in group.paths if p not in seen]
    if missing:
        raise UsageError(f"the example inputs never reach {', '.join(missing)}; give inputs that run every block")
    first = seen[group.paths[0]]
    for path in group.paths[1:]:
        if [(a.shape, a.dtype) for a in seen[path]] != [(a.shape, a.dtype) for a in first]:
            raise UsageError(f"{path} sees inputs shaped unlike {group.paths[0]}'s; the blocks cannot share a package")
    return first


def export_regional(
    model: nn.Module,
    example_inputs: Sequence[Any],
    path: str | os.PathLike,
    *,
    dynamic: Mapping[str, Mapping[int, tuple[int, int]]] | None = None,
    preset: str | None = None,
) -> str:
    """Export the largest group of `model`'s repeated blocks as one weightless package at `path` (see the module
    docstring); returns the path. `preset` as in `fullgraph.export`."""
    if not isinstance(model, nn.Module):
        raise UsageError(f"export_regional takes an nn.Module, not {type(model).__name__}")
    groups = find_repeated_blocks(model)
    if not groups:
        raise UsageError(f"{type(model).__name__} repeats no block (see fullgraph.compile.regional); "
                         "export it whole with fullgraph.export")  # fmt: skip
    group = max(groups, key=lambda g: g.count * sum(p.numel() for p in model.get_submodule(g.paths[0]).parameters()))
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    inputs = _block_inputs(model.eval(), group, args)
    block = model.get_submodule(group.paths[0])
    names, state = _state(block)
    params = _forward_params(block)[: len(inputs)]
    wrapper = _Stateless(block, names, len(inputs))
    spec = {p: {int(d): r for d, r in dims.items()} for p, dims in (dynamic or {}).items()}
    unknown = sorted(set(spec) - set(params))
    if unknown:
        raise UsageError(f"dynamic= names {', '.join(unknown)}, not an input of {group.cls.__qualname__}.forward "
                         f"({', '.join(params)})")  # fmt: skip
    flat_spec = {f"flat[{i}]": spec[p] for i, p in enumerate(params) if p in spec} or None
    export(wrapper, (*inputs, *state), path, dynamic=flat_spec, preset=preset)
    _record(path, group, names, params)
    return os.fspath(path)


def _forward_params(block: nn.Module) -> list[str]:
    import inspect

    return [n for n, p in inspect.signature(block.forward).parameters.items() if p.kind in (p.POSITIONAL_ONLY,
            p.POSITIONAL_OR_KEYWORD)]  # fmt: skip


def _record(path: str | os.PathLike, group: BlockGroup, names: list[str], params: list[str]) -> None:
    """What load_regional checks, beside the package: the block's class, its state's names and its paths."""
    meta = {"class": group.class_name, "paths": list(group.paths), "state": names, "inputs": params}
    write_atomic(f"{os.fspath(path)}.json", json.dumps({META_KEY: meta}, indent=1))


@dataclass
class RegionalPackage:
    """A model whose repeated blocks run one loaded package; `restore()` puts their own forward back. Callable from
    many threads at once, as its package is (`LoadedPackage.__call__`): no lock of its own."""

    model: nn.Module
    package: LoadedPackage
    paths: tuple[str, ...]
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return self.model(*args, **kwargs)

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


def load_regional(model: nn.Module, path: str | os.PathLike, **load_options: Any) -> RegionalPackage:
    """Load the block package at `path` (`export_regional`'s) and run every instance of the block through it with
    its own weights; `load_options` go to `fullgraph.deploy.load` (probe, device_index, ...)."""
    try:
        with open(f"{os.fspath(path)}.json") as f:
            meta = json.load(f)[META_KEY]
    except (OSError, ValueError, KeyError) as e:
        raise DeployError(f"{path} has no regional description beside it ({path}.json: {e}); "
                          "export it with fullgraph.deploy.export_regional") from None  # fmt: skip
    package = load(path, **load_options)
    undo: list[Callable[[], None]] = []
    for p in meta["paths"]:
        try:
            block = model.get_submodule(p)
        except AttributeError:
            raise DeployError(f"{path} was exported for blocks at {p}, which {type(model).__name__} lacks") from None
        cls = f"{type(block).__module__}.{type(block).__qualname__}"
        names, state = _state(block)
        if cls != meta["class"] or names != meta["state"]:
            raise DeployError(f"{p} is a {cls} with state {names[:3]}...; {path} was exported for a {meta['class']}")
        block.forward = _runner(package, state)
        undo.append(lambda b=block: b.__dict__.pop("forward", None))
    return RegionalPackage(model, package, tuple(meta["paths"]), undo)


def _runner(package: LoadedPackage, state: list[torch.Tensor]) -> Callable:
    def forward(*inputs: torch.Tensor) -> Any:
        out = package(*inputs, *state)
        return out[0] if isinstance(out, (list, tuple)) and len(out) == 1 else out

    return forward
