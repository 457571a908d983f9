"""Compiling with validated, scoped strategies: presets for the chapter's scenarios, option validation against the
installed torch, `compile(model, preset) -> CompiledModel`, per-module plans and regional compilation (DESIGN.md,
Layers: this package imports env, errors and the timing core only).

This package is callable: `fullgraph.compile(model, ...)` is `fullgraph.compile.compile(model, ...)`. The top-level
name `fullgraph.compile` is this package once it is imported (Python binds a subpackage to its parent's attribute
on import), so the package itself answers the call rather than a function that the import would replace.

Its names are imported on first use (`__getattr__`): `fullgraph.deploy.load` wraps packages in `GraphedCall`
(`graphs.py`, which needs no compiler), and a process that only loads packages should not import `compiled.py`,
which reaches Dynamo (docs/deploy.md, "Process start on the package route").
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

# name -> the module under fullgraph.compile that defines it
_NAMES = {
    "CompiledModel": "compiled",
    "CompileFallbackWarning": "compiled",
    "StrictRecompileError": "compiled",
    "UncompiledCallWarning": "compiled",
    "compile": "compiled",
    "Bucketed": "dynamic",
    "declare_dynamic": "dynamic",
    "CudaGraphSkipWarning": "graphs",
    "GraphedCall": "graphs",
    "Resolved": "options",
    "resolve": "options",
    "PlannedPart": "plan",
    "PlanResult": "plan",
    "apply_plan": "plan",
    "check_plan": "plan",
    "MODES": "presets",
    "PRESETS": "presets",
    "Preset": "presets",
    "get_preset": "presets",
    "CompileStats": "stats",
    "Recompile": "stats",
}

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
    "UncompiledCallWarning",
    "apply_plan",
    "check_plan",
    "compile",
    "declare_dynamic",
    "get_preset",
    "resolve",
]


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = f"{__name__}.{_NAMES[name]}"
    __import__(module)  # the import statement's path: `python -X importtime` reports it (import_module's it does not)
    value = getattr(sys.modules[module], name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return self.compile(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

if TYPE_CHECKING:  # what type checkers and IDEs read; nothing here runs
    from fullgraph.compile.compiled import (
        CompiledModel,
        CompileFallbackWarning,
        StrictRecompileError,
        UncompiledCallWarning,
        compile,
    )
    from fullgraph.compile.dynamic import Bucketed, declare_dynamic
    from fullgraph.compile.graphs import CudaGraphSkipWarning, GraphedCall
    from fullgraph.compile.options import Resolved, resolve
    from fullgraph.compile.plan import PlannedPart, PlanResult, apply_plan, check_plan
    from fullgraph.compile.presets import MODES, PRESETS, Preset, get_preset
    from fullgraph.compile.stats import CompileStats, Recompile
