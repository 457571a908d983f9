"""`preset="auto"`: the configuration a doctor report (or a tune result) measured best, read by duck typing so this
layer never imports `fullgraph.diagnose` (DESIGN.md, Layers).

A report's recommendation names a row as "eager fp32" or "compile <mode or preset> <dtype>"
("compile reduce-overhead bf16").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fullgraph.compile.presets import MODES, PRESETS
from fullgraph.compile.tuned import as_tune_result
from fullgraph.errors import UsageError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
REWRITES_OFF = "rewrites=off"  # a row's last word when it ran with rewrites=[] (the doctor's twin of a rewrite row)


@dataclass(frozen=True)
class Choice:
    """What a recommendation asks for: a preset (and mode) or no compile at all, in one dtype."""

    config: str  # the row's name, as the report wrote it
    preset: str = "dev"
    mode: str | None = None
    dtype: torch.dtype | None = None
    eager: bool = False
    rewrites_off: bool = False  # the row ran without graph rewrites ("... rewrites=off")


def _no_choice(why: str) -> UsageError:
    known = ", ".join(PRESETS)
    return UsageError(f"preset='auto' {why}; pass choice=<a doctor Report or tune result> or pick a preset: {known}")


def read_choice(choice: Any) -> Choice:
    """The configuration of `choice`: a doctor `Report` (its `.recommendation.config`), a recommendation itself, a
    tune result (a `TuneResult`, its JSON dict, or the path of its .json file), or the row's name as a string."""
    if choice is None:
        raise _no_choice("needs a measured choice")
    rec = as_tune_result(choice) or getattr(choice, "recommendation", choice)
    if rec is None:
        raise _no_choice("was given a report without a recommendation")
    config = rec if isinstance(rec, str) else getattr(rec, "config", None)
    if not isinstance(config, str):
        raise _no_choice(f"cannot read a configuration from {type(choice).__name__}")
    words = config.split()
    off = bool(words) and words[-1] == REWRITES_OFF
    words = words[:-1] if off else words
    dtype = DTYPES.get(words[-1]) if words else None
    if dtype is None:
        raise _no_choice(f"cannot read {config!r}: expected 'eager <dtype>' or 'compile <mode> <dtype>' "
                         f"with a dtype among {', '.join(DTYPES)}")  # fmt: skip
    if words == ["eager", words[-1]]:
        return Choice(config, dtype=dtype, eager=True)
    if len(words) == 3 and words[0] == "compile":
        if words[1] in MODES:
            return Choice(config, mode=words[1], dtype=dtype, rewrites_off=off)
        if words[1] in PRESETS:
            return Choice(config, preset=words[1], dtype=dtype, rewrites_off=off)
    raise _no_choice(f"cannot read {config!r}: expected 'eager <dtype>' or 'compile <mode or preset> <dtype>'")
