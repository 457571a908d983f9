"""Regional compilation: find a model's repeated blocks, compile one, reuse it for the others.

A transformer spends most of its cold compile time tracing and lowering the same block N times. Compiling
the block as a region compiles its code once and stamps it out for every instance, so the compile cost
of a 12-block model is about that of one block plus the rest.

**What counts as a repeated block** (`find_repeated_blocks`): two or more modules of one class, whose
class `forward` is the same code object, with the same parameter and buffer names, shapes and dtypes.
The children of an `nn.ModuleList` or `nn.Sequential` of one class are the common case, but siblings and
descendants anywhere in the model count too. A block must be more than a tiny leaf: it has at least
`min_submodules` (default 2) submodules, or at least `min_params` (default 4) parameter tensors of its own
(a layer that holds its weights as raw `nn.Parameter`s). So a lone `Linear` or `LayerNorm` is never a
block, however often it repeats. Containers without a `forward` (`ModuleList`, `ModuleDict`) are never
blocks. Groups never overlap: the outermost repeated unit wins (a ViT's `blocks.i`, not `blocks.i.mlp`),
and instances of an inner group that lie inside a chosen block are dropped from it.

**How blocks are compiled** (`compile_regions`, `mechanism=`):

- `"per-block"` (the default): each block instance is compiled in place with `nn.Module.compile`, which
  sets an instance attribute (`_compiled_call_impl`); the rest of the model runs eagerly. All instances
  run one code object (`nn.Module._call_impl` and the class's `forward`), and since Dynamo inlines
  `nn.Module`s, their parameters are graph inputs rather than constants: the first instance compiles one
  graph and the others pass its guards and reuse it (one graph for N blocks, tested with a counting
  backend). On the 2-core CPU, for a 12-block ViT, it cut compile seconds (after the compiler's one-time
  start) 4.0x against whole-model compilation (10.5 s -> 2.6 s; 2.96x in a run under load), at 0.95-0.96x
  the whole model's steady-state speed (benchmarks/regional_compile.py, results/regional_compile_cpu.csv); on
  the H200, timm's ViT-B/16 3.5-4.7x, at 1.001x the speed at batch 64 and 0.68x at batch 8 (launch-bound: twelve
  guarded calls). Not under CUDA graphs of its own (refused): reduce-overhead's trees start a new generation
  per block call and overwrite the previous block's output; `fullgraph.compile` captures the whole call in one
  graph instead (fullgraph.compile.graphs), 1.005x the whole model's reduce-overhead speed at batch 8.
- `"nested"`: `torch.compiler.nested_compile_region` wraps the class's `forward` once per group and each
  instance gets that wrapper, with itself as first argument, as an instance `forward`; the whole model is
  then compiled with `torch.compile`, which traces the region once (an `invoke_subgraph`) and reuses it
  for every instance. One graph for the whole model (what CUDA graphs want), but the region is a fusion
  boundary; on this CPU it cut compile seconds 2.1-2.5x at 0.97-0.99x the speed. Raises on a torch
  without the API.

Neither changes a block's class: another model with the same classes is unaffected (tested).
`RegionalResult.restore()` removes the instance attributes again. What torch shares anyway: Dynamo's
cache lives on the code object, so another model of the same class compiled later with the same backend
and settings may reuse these graphs (a cache hit, never a wrong result: guards still check each call).
"""

from __future__ import annotations

import functools
import types
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from fullgraph.errors import UsageError

Mechanism = Literal["per-block", "nested"]
MECHANISMS: tuple[str, ...] = ("per-block", "nested")
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


@dataclass(frozen=True)
class BlockGroup:
    """Instances of one repeated block: their module paths (in model order), their class and count."""

    cls: type[nn.Module]
    paths: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.paths)

    @property
    def class_name(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__}"

    def __str__(self) -> str:
        shown = ", ".join(self.paths) if self.count <= 3 else f"{self.paths[0]} ... {self.paths[-1]}"
        return f"{self.count} x {self.cls.__qualname__} ({shown})"


@dataclass
class RegionalResult:
    """What `compile_regions` did. Call `model` (the module itself for "per-block", a compiled wrapper of
    it for "nested"); `compiled_paths` and `mechanism` are what a report says."""

    model: nn.Module | Any
    mechanism: Mechanism
    groups: tuple[BlockGroup, ...]
    compiled_paths: tuple[str, ...]
    _undo: list[Any] = field(default_factory=list, repr=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def describe(self) -> str:
        how = "nested_compile_region" if self.mechanism == "nested" else "per-block torch.compile"
        return f"regional ({how}): " + "; ".join(str(g) for g in self.groups)

    def restore(self) -> None:
        """Remove the instance attributes this compilation set; the blocks run eagerly again."""
        while self._undo:
            self._undo.pop()()


def _forward_code(module: nn.Module) -> types.CodeType | None:
    forward = getattr(type(module), "forward", None)
    return getattr(forward, "__code__", None)


def _signature(module: nn.Module) -> tuple:
    tensors = [(n, tuple(p.shape), p.dtype) for n, p in module.named_parameters()]
    tensors += [(n, tuple(b.shape), b.dtype) for n, b in module.named_buffers()]
    structure = tuple((n, type(m)) for n, m in module.named_modules() if n)
    return (type(module), _forward_code(module), tuple(tensors), structure)


def _is_block(module: nn.Module, min_submodules: int, min_params: int) -> bool:
    if isinstance(module, _CONTAINERS) or _forward_code(module) is None:
        return False
    submodules = sum(1 for _ in module.modules()) - 1
    own_params = sum(1 for _ in module.parameters(recurse=False))
    return submodules >= min_submodules or own_params >= min_params


def _inside(path: str, other: str) -> bool:
    """Whether module `path` is `other` or lies inside it ("" is the root)."""
    return other == "" or path == other or path.startswith(other + ".")


def find_repeated_blocks(
    model: nn.Module, *, min_count: int = 2, min_submodules: int = 2, min_params: int = 4
) -> list[BlockGroup]:
    """Groups of repeated blocks in `model`, outermost first, never overlapping (see the module docstring
    for the rule). An empty list when the model repeats nothing that qualifies."""
    if min_count < 2:
        raise UsageError(f"min_count must be at least 2 (a block repeats), got {min_count}")
    by_signature: dict[tuple, list[str]] = defaultdict(list)
    for path, module in model.named_modules():
        if path and _is_block(module, min_submodules, min_params):
            by_signature[_signature(module)].append(path)
    candidates = [(sig[0], paths) for sig, paths in by_signature.items() if len(paths) >= min_count]
    # Outermost first: the shallowest instance, then the larger group.
    candidates.sort(key=lambda c: (min(p.count(".") for p in c[1]), -len(c[1])))
    chosen: list[BlockGroup] = []
    taken: list[str] = []
    for cls, paths in candidates:
        free = [p for p in paths if not any(_inside(p, t) or _inside(t, p) for t in taken)]
        if len(free) >= min_count:
            chosen.append(BlockGroup(cls, tuple(free)))
            taken.extend(free)
    return chosen


def _check_groups(model: nn.Module, groups: list[BlockGroup]) -> None:
    seen: list[str] = []
    for group in groups:
        for path in group.paths:
            try:
                module = model.get_submodule(path)
            except AttributeError:
                raise UsageError(f"no submodule {path!r} in {type(model).__name__}") from None
            if path == "":
                raise UsageError("a block cannot be the whole model; compile it whole instead")
            if type(module) is not group.cls:
                raise UsageError(f"{path!r} is a {type(module).__qualname__}, not a {group.cls.__qualname__}")
            if any(_inside(path, s) or _inside(s, path) for s in seen):
                raise UsageError(f"block {path!r} overlaps another block; groups must not nest")
            seen.append(path)


def has_nested_compile_region() -> bool:
    """Whether the installed torch has `torch.compiler.nested_compile_region` (called here with the
    function alone, which every version from 2.9 to 2.14 accepts; 2.12 added keyword options)."""
    return callable(getattr(torch.compiler, "nested_compile_region", None))


def compile_regions(
    model: nn.Module,
    groups: list[BlockGroup] | None = None,
    *,
    mechanism: Mechanism = "per-block",
    compile_kwargs: dict[str, Any] | None = None,
) -> RegionalResult:
    """Compile each repeated block of `model` once and reuse it for every instance of its group.

    `groups` defaults to `find_repeated_blocks(model)`; `compile_kwargs` go to `torch.compile` (backend,
    mode, options, dynamic, fullgraph). The model is changed in place through instance attributes only
    (undo with `restore()`); call `result.model`. No repeated block, an unknown path or overlapping
    groups raise `UsageError` before anything compiles.
    """
    if mechanism not in MECHANISMS:
        raise UsageError(f"unknown mechanism {mechanism!r}; choose one of {', '.join(MECHANISMS)}")
    if mechanism == "nested" and not has_nested_compile_region():
        raise UsageError(f"torch {torch.__version__} has no torch.compiler.nested_compile_region; use 'per-block'")
    groups = list(find_repeated_blocks(model) if groups is None else groups)
    if not groups:
        raise UsageError(f"{type(model).__name__} has no repeated blocks to compile as regions; compile it whole")
    _check_groups(model, groups)
    kwargs = dict(compile_kwargs or {})
    cudagraphs = (
        kwargs.get("backend") == "cudagraphs"
        or kwargs.get("mode") in ("reduce-overhead", "max-autotune")
        or (kwargs.get("options") or {}).get("triton.cudagraphs")
    )
    if mechanism == "per-block" and cudagraphs:
        raise UsageError("per-block regions under CUDA graphs (reduce-overhead) overwrite each other's outputs: "
                         "compile them without and wrap the model in fullgraph.compile.graphs.GraphedCall, as "
                         "fullgraph.compile(model, 'perception', regional=True) does")  # fmt: skip
    undo: list[Any] = []
    paths = tuple(p for g in groups for p in g.paths)
    if mechanism == "per-block":
        for path in paths:
            block = model.get_submodule(path)
            block.compile(**kwargs)
            undo.append(lambda b=block: setattr(b, "_compiled_call_impl", None))
        return RegionalResult(model, mechanism, tuple(groups), paths, undo)
    for group in groups:
        # One wrapper per group, shared by its instances: the region's reuse cache lives on it.
        region = torch.compiler.nested_compile_region(group.cls.forward)
        for path in group.paths:
            block = model.get_submodule(path)
            # An instance attribute; the class keeps its forward. The block goes in as an explicit argument:
            # bound as `self` (MethodType) or captured by a closure, torch 2.13 reused the first block's
            # parameters for every instance (silently wrong outputs, tested).
            block.forward = functools.partial(region, block)
            undo.append(lambda b=block: b.__dict__.pop("forward", None))
    return RegionalResult(torch.compile(model, **kwargs), mechanism, tuple(groups), paths, undo)
