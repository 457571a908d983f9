"""Compiling with validated, scoped strategies: presets for the chapter's scenarios, option validation against the
installed torch, `compile(model, preset) -> CompiledModel`, per-module plans and regional compilation (DESIGN.md,
Layers: this package imports env, errors and the timing core only).

This package is callable: `fullgraph.compile(model, ...)` is `fullgraph.compile.compile(model, ...)`. The top-level
name `fullgraph.compile` is this package once it is imported (Python binds a subpackage to its parent's attribute
on import), so the package itself answers the call rather than a function that the import would replace.
"""

import sys
import types

from fullgraph.compile.compiled import CompiledModel, CompileFallbackWarning, StrictRecompileError, compile
from fullgraph.compile.dynamic import Bucketed, declare_dynamic
from fullgraph.compile.graphs import CudaGraphSkipWarning, GraphedCall
from fullgraph.compile.options import Resolved, resolve
from fullgraph.compile.plan import PlannedPart, PlanResult, apply_plan, check_plan
from fullgraph.compile.presets import MODES, PRESETS, Preset, get_preset
from fullgraph.compile.stats import CompileStats, Recompile

__all__ = [
    "MODES",
    "PRESETS",
    "Bucketed",
    "CompileFallbackWarning",
    "CompileStats",
    "CompiledModel",
    "CudaGraphSkipWarning",
    "GraphedCall",
    "PlanResult",
    "PlannedPart",
    "Preset",
    "Recompile",
    "Resolved",
    "StrictRecompileError",
    "apply_plan",
    "check_plan",
    "compile",
    "declare_dynamic",
    "get_preset",
    "resolve",
]


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return compile(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
