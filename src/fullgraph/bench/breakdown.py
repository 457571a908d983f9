"""Where a model's time goes: GPU kernel time per call by class, against the measured ceilings.

(Contract only: the profiling and classification are being written; see the dataclasses for the shape.)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ClassTime:
    """One class of kernels: "gemm" (GEMM and convolution), "attention", "elementwise" (fused elementwise and
    reductions, Inductor's or ours), "copy" (copies and layout conversions), "other"."""

    name: str
    ms: float  # kernel time per call
    share: float  # of the summed kernel time
    kernels: int  # kernel launches per call
    rate: float | None = None  # achieved TFLOP/s (gemm, attention) or TB/s (the rest), where counted
    unit: str = ""  # "TFLOP/s" or "TB/s"
    pct_of_ceiling: float | None = None  # rate over the measured ceiling for this dtype, in percent


@dataclass(frozen=True)
class KernelTime:
    """One kernel (or CPU op) among the top ones: its time per call and where it comes from."""

    name: str
    cls: str
    ms: float
    calls: int  # launches per call of the model
    source: str = ""  # the aten op or model line it comes from, where the profiler or Inductor gives it


@dataclass(frozen=True)
class Flag:
    """Waste a user can act on."""

    kind: str  # "layout-conversion", "conv-as-gemm", "epilogue-candidate", "launch-bound"
    message: str
    ms: float  # time per call it accounts for
    fix: str


@dataclass(frozen=True)
class Breakdown:
    label: str  # the configuration profiled, e.g. "compile default bf16"
    device: str  # "cuda" or "cpu"
    call_ms: float  # wall time per call over the profiled calls
    kernel_ms: float  # summed device (GPU) or op (CPU) time per call
    idle_share: float | None  # share of wall time the GPU ran nothing (launch-bound); None on the CPU
    classes: list[ClassTime] = field(default_factory=list)
    top: list[KernelTime] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    ceilings: dict[str, float] = field(default_factory=dict)  # e.g. {"copy_tbps": 4.27, "gemm_tflops_bf16": 760}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Breakdown:
        d = dict(d)
        d["classes"] = [ClassTime(**c) for c in d.get("classes", [])]
        d["top"] = [KernelTime(**k) for k in d.get("top", [])]
        d["flags"] = [Flag(**f) for f in d.get("flags", [])]
        return cls(**d)
