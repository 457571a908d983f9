"""Compiling with validated, scoped strategies: presets for the chapter's scenarios, option validation against the
installed torch (DESIGN.md, Layers: this package imports env, errors and the timing core only)."""

from fullgraph.compile.options import Resolved, resolve
from fullgraph.compile.presets import MODES, PRESETS, Preset, get_preset

__all__ = ["MODES", "PRESETS", "Preset", "Resolved", "get_preset", "resolve"]
