"""Compile presets: the chapter's deployment scenarios as frozen dataclasses, each saying which of the chapter's
intentions it maps to which real mechanism, and what it drops and why (DESIGN.md, errata 4 and 6: several of the
chapter's option keys do not exist, and `backend="ipex"` / `"cudagraphs"` are not what its text wants).

Data only: `options.py` validates and merges a preset with a user's overrides against the installed torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fullgraph.compile.rewrites import ALL as REWRITES
from fullgraph.compile.rewrites import REGISTRY
from fullgraph.errors import UsageError

# torch.compile's modes (inductor backend only), simplest first.
MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")


@dataclass(frozen=True)
class Preset:
    """How to compile one kind of model. `options` are Inductor options on top of the mode's own; `dynamo` are
    Dynamo config values applied around this model's calls only (its recompile limit, say)."""

    name: str
    mode: str | None = "default"  # None for a backend without modes
    backend: str = "inductor"
    fullgraph: bool = False
    dynamic: bool | None = None  # torch.compile's: False static, True symbolic, None automatic after a recompile
    options: tuple[tuple[str, Any], ...] = ()
    dynamo: tuple[tuple[str, Any], ...] = ()
    summary: str = ""
    maps: tuple[tuple[str, str], ...] = ()  # (the chapter's intention, the mechanism used)
    drops: tuple[tuple[str, str], ...] = ()  # (what the chapter writes, why it is not used and what to use)
    rewrites: tuple[str, ...] = REWRITES  # graph rewrites `rewrites="auto"` considers (fullgraph.compile.rewrites)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise UsageError(f"preset name {self.name!r}: use letters, digits, '-' or '_'")
        if self.backend == "inductor" and self.mode not in MODES:
            raise UsageError(f"preset {self.name!r}: mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.backend != "inductor" and self.mode not in (None, "default"):
            raise UsageError(
                f"preset {self.name!r}: mode={self.mode!r} needs backend='inductor' (modes are Inductor's)"
            )
        unknown = [r for r in self.rewrites if r not in REGISTRY]
        if unknown:
            known = ", ".join(REGISTRY)
            raise UsageError(f"preset {self.name!r}: unknown rewrite {unknown[0]!r}; the rewrites are {known}")
        for table in (self.options, self.dynamo):
            keys = [k for k, _ in table]
            if len(keys) != len(set(keys)) or not all(isinstance(k, str) and k for k in keys):
                raise UsageError(f"preset {self.name!r}: option names must be unique, non-empty strings ({keys})")

    @classmethod
    def of(cls, name: str, *, options: Mapping[str, Any] | None = None, dynamo: Mapping[str, Any] | None = None,
           **fields: Any) -> Preset:  # fmt: skip
        """A preset from plain dicts (the tuples keep the dataclass hashable and frozen)."""
        return cls(name, options=tuple((options or {}).items()), dynamo=tuple((dynamo or {}).items()), **fields)

    def replace(self, **changes: Any) -> Preset:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["options"], d["dynamo"] = dict(self.options), dict(self.dynamo)
        d["maps"], d["drops"] = [list(m) for m in self.maps], [list(m) for m in self.drops]
        d["rewrites"] = list(self.rewrites)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Preset:
        d = dict(d)
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise UsageError(
                f"preset fields {sorted(unknown)} do not exist; known: {[f.name for f in dataclasses.fields(cls)]}"
            )
        d["options"] = tuple(dict(d.get("options") or {}).items())
        d["dynamo"] = tuple(dict(d.get("dynamo") or {}).items())
        d["maps"] = tuple(tuple(m) for m in d.get("maps") or ())
        d["drops"] = tuple(tuple(m) for m in d.get("drops") or ())
        if "rewrites" in d:
            d["rewrites"] = tuple(d["rewrites"])
        return cls(**d)


_INT8 = (
    "int8: True",
    "quantization is not a compile option: quantize with torchao (int8 weight-only or dynamic) first",
)
_AOT = ("aot_inductor: True", "ahead-of-time packages are `fullgraph.export` (deployment), not a torch.compile option")

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "dev",
            summary="iterate: default mode, graph breaks allowed; run `fullgraph doctor` to find them",
            maps=(("compile while developing", "mode='default', fullgraph=False"),),
        ),
        Preset.of(
            "perception",
            mode="reduce-overhead",
            fullgraph=True,
            dynamic=False,
            options={"shape_padding": True},
            dynamo={"recompile_limit": 8},
            summary="camera/lidar perception: fixed shapes, one graph, CUDA graphs; lowest latency per frame",
            maps=(
                ("minimal framework overhead, no CPU-GPU round trips", "mode='reduce-overhead' (CUDA graph trees)"),
                ("no graph breaks", "fullgraph=True: a break is an error at compile time, not a slow path"),
                ("fixed sensor shapes", "dynamic=False: one specialized graph; new shapes recompile (bounded)"),
                ("hardware-friendly sizes", "shape_padding=True"),
            ),
            drops=(
                (
                    "backend='cudagraphs'",
                    "that backend runs the graph eagerly under CUDA graphs, without Inductor's "
                    "fusion; reduce-overhead gives both",
                ),
                ("triton.cudagraphs / cudagraph_trees options", "already what mode='reduce-overhead' sets"),
            ),
        ),
        Preset.of(
            "planning",
            dynamic=None,
            options={"epilogue_fusion": True},
            dynamo={"recompile_limit": 16},
            summary="trajectory planning: variable numbers of obstacles and waypoints; declare the dynamic dims",
            maps=(
                (
                    "variable-length inputs",
                    "declared dims (fullgraph.compile(dynamic={'x': {1: (1, 512)}}) -> "
                    "mark_dynamic with min/max), or Bucketed; dynamic=True marks every dim, which costs speed",
                ),
                ("fuse post-processing", "epilogue_fusion=True (Inductor's default, stated)"),
            ),
            drops=(
                (
                    "max_autotune_gemm, coordinate_descent_tuning",
                    "minutes of autotuning per new shape: with dynamic "
                    "shapes it is paid again on recompiles; use 'edge' for a fixed-shape model",
                ),
            ),
        ),
        Preset.of(
            "edge",
            mode="max-autotune-no-cudagraphs",
            options={"freezing": True, "cpp_wrapper": True},
            summary="edge deployment: spend compile time once for the fastest kernels, weights folded as constants",
            maps=(
                ("aggressive optimization", "mode='max-autotune-no-cudagraphs' (GEMM and kernel autotuning)"),
                ("freeze weights into the code", "freezing=True (the chapter's 'freeze' is not an Inductor option)"),
                ("C++ wrapper for integration", "cpp_wrapper=True"),
            ),
            drops=(
                ("backend='ipex'", "needs Intel's extension, which registers it; Inductor compiles for CPUs too"),
                _INT8,
                _AOT,
            ),
        ),
        Preset.of(
            "fusion",
            options={"layout_optimization": True, "pattern_matcher": True},
            dynamo={"recompile_limit": 16},
            summary="multimodal fusion (camera + lidar + radar): default mode, graph breaks allowed between modalities",
            maps=(
                ("automatic memory layouts", "layout_optimization=True (Inductor's default, stated)"),
                ("pattern-matching optimizations", "pattern_matcher=True (Inductor's default, stated)"),
                ("per-modality strategies", "plan={'vision': 'perception', 'points': 'planning', ...}"),
            ),
            drops=(("joint_graph: True", "no such Inductor option; Inductor's joint-graph passes always run"),),
        ),
    )
}


def get_preset(name: str | Preset) -> Preset:
    """A preset by name (or the preset itself); an unknown name lists the presets."""
    if isinstance(name, Preset):
        return name
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        known = ", ".join([*PRESETS, "auto"])
        raise UsageError(f"unknown preset {name!r}; choose one of {known}, or pass a Preset(...)") from None
