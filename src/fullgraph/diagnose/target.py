"""What the doctor examines: a TARGET (`package.module:callable` or `path/file.py:callable`) and input specs.

The callable takes no arguments and returns a module, or a module and its example inputs (a tensor or a
tuple of tensors). An input spec is `4x3x224x224:bf16` (dims, then a dtype; the dtype defaults to float32).
Every failure raises a `FullgraphError` whose message is one line saying what to change.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence

import torch
from torch import nn

from fullgraph.env import first_line
from fullgraph.errors import FullgraphError, UsageError

DTYPES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "bool": torch.bool,
}  # fmt: skip


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name.strip().lower()]
    except KeyError:
        raise UsageError(f"unknown dtype {name!r}; use one of {', '.join(sorted(DTYPES))}") from None


def parse_input_spec(spec: str) -> tuple[tuple[int, ...], torch.dtype]:
    """`4x3x224x224:bf16` -> ((4, 3, 224, 224), torch.bfloat16)."""
    dims, _, dtype = spec.partition(":")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise UsageError(f"input spec {spec!r} does not parse; write dims and a dtype, e.g. 4x3x224x224:bf16") from None
    if not shape or any(d < 0 for d in shape):
        raise UsageError(f"input spec {spec!r} has no valid dims; write e.g. 4x3x224x224:bf16")
    return shape, parse_dtype(dtype) if dtype else torch.float32


def make_input(spec: str, device: torch.device) -> torch.Tensor:
    shape, dtype = parse_input_spec(spec)
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype, device=device)
    if dtype == torch.bool:
        return torch.rand(shape, device=device) > 0.5
    return torch.randint(0, 1000, shape, dtype=dtype, device=device)


def spec_of(t: torch.Tensor) -> str:
    return "x".join(str(d) for d in t.shape) + ":" + str(t.dtype).removeprefix("torch.")


def _load_file(path: str):
    if not os.path.isfile(path):
        raise FullgraphError(f"TARGET file {path!r} does not exist")
    name = f"_fullgraph_target_{abs(hash(os.path.abspath(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so dataclasses and pickling inside the file can find it
    spec.loader.exec_module(module)
    return module


def _import_callable(target: str):
    if ":" not in target:
        raise UsageError(f"TARGET {target!r} needs a callable: write package.module:function or path/file.py:function")
    where, _, name = target.rpartition(":")
    is_file = where.endswith(".py") or os.sep in where
    try:
        module = _load_file(where) if is_file else importlib.import_module(where)
    except FullgraphError:
        raise
    except Exception as e:  # the user's module raised while importing: say so in one line
        raise FullgraphError(f"TARGET {where!r} does not import: {first_line(e, 300)}") from e
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        raise FullgraphError(f"TARGET {target!r}: {where} has no callable named {name!r}")
    return fn


def load_target(
    target: str, input_specs: Sequence[str], device: torch.device
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Import TARGET, build the model on `device` in eval mode, and its example inputs."""
    fn = _import_callable(target)
    try:
        built = fn()
    except Exception as e:
        raise FullgraphError(f"TARGET {target!r} raised while building the model: {first_line(e, 300)}") from e
    model, inputs = built if isinstance(built, tuple) and len(built) == 2 else (built, None)
    if not isinstance(model, nn.Module):
        raise FullgraphError(
            f"TARGET {target!r} returned {type(model).__name__}, not an nn.Module (or (module, inputs))"
        )
    if input_specs:
        inputs = tuple(make_input(s, device) for s in input_specs)
    elif inputs is None:
        raise UsageError(f"TARGET {target!r} returned no example inputs; pass --input, e.g. --input 1x3x224x224:fp32")
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    if not all(isinstance(t, torch.Tensor) for t in inputs):
        raise FullgraphError(f"TARGET {target!r}: example inputs must be tensors")
    return model.to(device).eval(), tuple(t.to(device) for t in inputs)
