"""What the doctor examines: a TARGET (`package.module:callable` or `path/file.py:callable`) and input specs.

The callable takes no arguments and returns the model (an nn.Module or any callable, a `torch.compile`-decorated
function included), `(model, args)` or `(model, args, kwargs)`; `args` is a tuple of arguments or one argument,
each any structure of tensors and Python values (a list of images, a float). A TARGET that itself needs arguments
(a function to examine, not a builder) or is an nn.Module instance is the model, and `--input` gives its inputs.
An input spec is `4x3x224x224:bf16` (dims, then a dtype; the dtype defaults to float32), or `name=spec` for a
keyword argument. Floating inputs are drawn from a normal distribution; integer ones from 0-999, or from an
inclusive range the spec gives (`token_type_ids=2x16:int64:0-1`). Every failure raises a `FullgraphError` whose
message is one line saying what to change.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from fullgraph.diagnose.inputs import Example
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


INT_VALUES = (0, 999)  # the integers an integer input spec without a range is drawn from, both included


def make_input(spec: str, device: torch.device) -> torch.Tensor:
    """A random tensor for `spec`: `2x16:int64`, or with an inclusive value range, `2x16:int64:0-1`."""
    head, values = spec, None
    if spec.count(":") == 2:
        head, _, text = spec.rpartition(":")
        low, dash, high = text.partition("-")
        if not (dash and low.isdigit() and high.isdigit() and int(low) <= int(high)):
            raise UsageError(f"input spec {spec!r}: the value range {text!r} does not parse; write LOW-HIGH, both "
                             "included, e.g. 2x16:int64:0-1")  # fmt: skip
        values = (int(low), int(high))
    shape, dtype = parse_input_spec(head)
    if values is not None and (dtype.is_floating_point or dtype == torch.bool):
        raise UsageError(f"input spec {spec!r}: a value range is for integer inputs; drop it for {dtype}")
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype, device=device)
    if dtype == torch.bool:
        return torch.rand(shape, device=device) > 0.5
    low, high = values or INT_VALUES
    return torch.randint(low, high + 1, shape, dtype=dtype, device=device)


def eager_failure(e: Exception, example: Example, hint: str = "") -> FullgraphError:
    """The one-line error for a model that fails in eager mode on inputs made from specs, ending with `hint` where
    the caller has one; else, where an index went out of range and some inputs are integers, how to bound what
    they are drawn from."""
    text = str(e)
    if not hint and (isinstance(e, IndexError) or "index out of range" in text or "out of bounds" in text):
        integers = [t for t in example.tensors() if not t.is_floating_point() and t.dtype != torch.bool]
        if integers:
            hint = (f"; integer inputs are drawn from {INT_VALUES[0]}-{INT_VALUES[1]} unless their spec gives a "
                    "range: e.g. --input token_type_ids=2x16:int64:0-1")  # fmt: skip
    return FullgraphError(f"the model fails in eager mode: {first_line(e, 300)}{hint}")


@contextlib.contextmanager
def _on_path(folder: str):
    """`folder` first on sys.path while a target file imports, so it can import its siblings."""
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


def _load_file(path: str):
    if not os.path.isfile(path):
        raise FullgraphError(f"TARGET file {path!r} does not exist")
    name = f"_fullgraph_target_{abs(hash(os.path.abspath(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so dataclasses and pickling inside the file can find it
    with _on_path(os.path.dirname(os.path.abspath(path))):
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


def unwrap_compiled(obj: Any) -> Any:
    """The original of a `torch.compile`d module or function: the doctor compiles it its own ways."""
    obj = getattr(obj, "_orig_mod", obj)
    return getattr(obj, "_torchdynamo_orig_callable", obj)


def _needs_arguments(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _build(fn: Any, target: str) -> tuple[Any, Any, Any]:
    """(model, args or None, kwargs or None) from what the TARGET names."""
    if (
        isinstance(fn, nn.Module)
        or (callable(fn) and unwrap_compiled(fn) is not fn)
        or (inspect.isfunction(fn) and _needs_arguments(fn))
    ):
        return unwrap_compiled(fn), None, None  # the model itself; --input gives its inputs
    try:
        built = fn()
    except Exception as e:
        raise FullgraphError(f"TARGET {target!r} raised while building the model: {first_line(e, 300)}") from e
    if isinstance(built, tuple) and len(built) in (2, 3) and callable(built[0]):
        return unwrap_compiled(built[0]), built[1], (built[2] if len(built) == 3 else None)
    return unwrap_compiled(built), None, None


def inputs_from_specs(input_specs: Sequence[str], device: torch.device) -> Example:
    """`--input 2x16:int64 --input attention_mask=2x16:int64`: positional specs in order, then `name=spec`."""
    args, kwargs = [], {}
    for spec in input_specs:
        name, eq, rest = spec.partition("=")
        if eq and not name.isidentifier():
            raise UsageError(f"--input {spec!r}: a keyword input is name=spec, e.g. attention_mask=2x16:int64")
        if eq:
            kwargs[name] = make_input(rest, device)
        elif kwargs:
            raise UsageError(f"--input {spec!r}: positional inputs come before keyword (name=spec) inputs")
        else:
            args.append(make_input(spec, device))
    return Example(tuple(args), kwargs)


def load_target(target: str, input_specs: Sequence[str], device: torch.device) -> tuple[Any, Example]:
    """Import TARGET, build the model on `device` (eval mode for a module), and its example inputs."""
    fn = _import_callable(target)
    model, args, kwargs = _build(fn, target)
    if not callable(model):
        raise FullgraphError(
            f"TARGET {target!r} returned {type(model).__name__}, not an nn.Module or a callable (or (model, inputs))"
        )
    if input_specs:
        example = inputs_from_specs(input_specs, device)
    elif args is None and kwargs is None:
        raise UsageError(f"TARGET {target!r} returned no example inputs; pass --input, e.g. --input 1x3x224x224:fp32")
    else:
        example = Example.of(args if args is not None else (), kwargs)
    if isinstance(model, nn.Module):
        model = model.to(device).eval()
    return model, example.to(device)
