"""Applying a tune result: its compile settings through `fullgraph.compile(preset="auto")`, its op policies through
`fullgraph.ops.policy` around this model's calls only (never a process-wide `set_policy`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from fullgraph import ops
from fullgraph.compile import CompiledModel, compile
from fullgraph.compile.choice import read_choice
from fullgraph.compile.tuned import TuneResult, as_tune_result
from fullgraph.errors import UsageError


def read_tuned(result: TuneResult | Mapping[str, Any] | str | os.PathLike) -> TuneResult:
    """`result` as a TuneResult: one already, its JSON dict, or the path of `fullgraph tune`'s JSON file."""
    tuned = as_tune_result(result)
    if tuned is None and isinstance(result, str):
        tuned = TuneResult.load(result)  # a path without .json: its own error if it is not one
    if tuned is None:
        raise UsageError(f"cannot read a tune result from {type(result).__name__}; give the JSON file "
                         "`fullgraph tune TARGET -o tuned.json` wrote, or its TuneResult")  # fmt: skip
    return tuned


def policies_of(tuned: TuneResult) -> Callable[[], contextlib.AbstractContextManager]:
    """A context factory that applies the result's op policies (checked now: an op this fullgraph lacks is named)."""
    policies = dict(tuned.ops)
    with ops.policy(**policies):  # checks the names and values once, here rather than at the first call
        pass
    return (lambda: ops.policy(**policies)) if policies else contextlib.nullcontext


def compile_tuned(model: nn.Module, result: TuneResult | Mapping[str, Any] | str | os.PathLike,
                  **options: Any) -> CompiledModel:  # fmt: skip
    """`model` compiled as `result` (a `fullgraph tune` result) chose: its preset or mode and dtype, and its op
    policies around every call and warm-up of this model. `options` go to `fullgraph.compile` (on_error,
    strict_recompiles, dynamic, ...); a mode or dtype that contradicts the result is refused there."""
    tuned = read_tuned(result)
    if "around" in options:
        raise UsageError("compile_tuned applies the result's op policies itself; compose yours with fullgraph.compile")
    return compile(model, "auto", choice=tuned, around=policies_of(tuned), **options)


def export_settings(result: TuneResult | Mapping[str, Any] | str | os.PathLike) -> dict[str, Any]:
    """What an AOT export takes from a tune result: {"dtype", "ops" (op policies), "preset", "mode"}; `fullgraph.export`
    passes the preset's and mode's Inductor options on, less CUDA graphs (a package has none). An eager pick gives
    no preset or mode."""
    tuned = read_tuned(result)
    c = read_choice(tuned)
    preset, mode = (None, None) if c.eager else (c.preset, c.mode)
    return {"dtype": c.dtype, "ops": dict(tuned.ops), "preset": preset, "mode": mode}
