"""torch.profiler's events read into launches: each GPU kernel (or, on the CPU, each op's own time) with its class,
the op that launched it, and that op's work (FLOPs of a GEMM or attention from its recorded shapes; bytes of the
tensors an elementwise or copy op touches). `breakdown` sums them per call and flags waste.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fullgraph.bench.kernel_classes import ATTENTION_OP, CONV_OP, ITEMSIZE, OP, classify, inductor_kernel

REGION = "fullgraph.breakdown"


@dataclass(frozen=True)
class Launch:
    """One kernel launch (or one CPU op's own time) in launch order, as the summary and the flags read it."""

    name: str
    start_us: float
    dur_us: float
    cls: str
    group: int = -1  # the outermost op that launched it: consecutive launches of one op are one step
    source: str = ""  # the aten op or Inductor fusion it comes from
    work_key: int | None = None  # the op whose work (FLOPs or bytes) this launch shares
    work: float | None = None  # FLOPs (gemm, attention) or bytes (elementwise, copy) of that op
    patch_conv: str = ""  # launched by a patch-embedding convolution: its description


def duration_us(k: Any) -> float:
    """A kineto event's duration in microseconds (nanoseconds where this torch keeps them)."""
    return k.duration_ns() / 1e3 if hasattr(k, "duration_ns") else k.duration_us()


def _arg(ci: Sequence[Any] | None, i: int) -> Any:
    return ci[i] if ci and len(ci) > i else None


def _gemm_flops(name: str, shapes: Sequence[Any], ci: Sequence[Any] | None) -> float | None:
    """FLOPs of a GEMM or convolution op from its recorded argument shapes (None where it cannot tell)."""
    short = name.split("::")[-1]
    mats = [list(s) if isinstance(s, (list, tuple)) else [] for s in shapes]
    a, b = ([*mats[0:2], [], []] if short in ("mm", "bmm") else [*mats[1:3], [], []])[:2]
    if short in ("mm", "addmm", "_addmm_activation") and len(a) == len(b) == 2:
        return 2.0 * a[0] * a[1] * b[1]
    if short in ("bmm", "baddbmm") and len(a) == len(b) == 3:
        return 2.0 * a[0] * a[1] * a[2] * b[2]
    stride, pad, dil = (_arg(ci, i) for i in (3, 4, 5))
    if CONV_OP.search(name) and len(mats) > 1 and all(isinstance(v, list) for v in (stride, pad, dil)):
        x, w = mats[0], mats[1]
        if ("convolution" in short and _arg(ci, 6)) or len(x) != len(w) or len(x) < 3:
            return None  # transposed, or shapes not recorded
        dims = zip(x[2:], w[2:], stride, pad, dil, strict=False)
        out = [(n + 2 * p - d * (k - 1) - 1) // st + 1 for n, k, st, p, d in dims]
        return 2.0 * x[0] * w[0] * math.prod(out) * math.prod(w[1:])
    return None


class Events:
    """The profile read once: CPU events (ops and annotations) and the ops device kernels link to."""

    def __init__(self, prof: Any, itemsize: int, patches: dict[tuple[int, ...], str]) -> None:
        self.itemsize, self.patches = itemsize, patches
        self.cpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU and not e.is_async]
        self.by_id: dict[int, Any] = {}
        for e in self.cpu:  # CUDA runtime calls may share an id with an op; the op wins
            if e.id not in self.by_id or not re.match(r"cu[A-Z]|cuda[A-Z]", e.name):
                self.by_id[e.id] = e
        # kineto's events carry what FunctionEvent lacks on older torch: argument dtypes, kernel->op links
        self.kineto = prof.profiler.kineto_results.events()
        cpu = torch.autograd.DeviceType.CPU
        self.dtypes = {(k.correlation_id(), k.name()): k.dtypes() for k in self.kineto if k.device_type() == cpu}

    def chain(self, e: Any) -> list[Any]:
        """`e` and the ops above it, innermost first."""
        out, p = [e], e.cpu_parent
        while p is not None:
            if OP.match(p.name):
                out.append(p)
            p = p.cpu_parent
        return out

    def source(self, chain: list[Any]) -> str:
        """The Inductor fusion a kernel's name lists, else the outermost op that launched it."""
        if found := inductor_kernel(chain[0].name):
            return f"Inductor fusion: {found[1] or chain[0].name}"
        return next((c.name for c in reversed(chain) if OP.match(c.name)), "")

    def op_bytes(self, e: Any) -> float | None:
        """Bytes an op's kernels move, estimated from its tensor arguments (read or written once each)."""
        types = getattr(e, "input_dtypes", None) or self.dtypes.get((e.id, e.name))
        sizes = []
        for i, shape in enumerate(e.input_shapes or []):
            if isinstance(shape, (list, tuple)) and shape and all(isinstance(n, int) for n in shape):
                size = ITEMSIZE.get(types[i]) if types and i < len(types) else None if types else self.itemsize
                if size:
                    sizes.append(math.prod(shape) * size)
        if not sizes:
            return None
        # Inductor's kernels take their outputs as arguments and in-place ops write an input; an aten op that
        # returns a new tensor writes one about the size of its largest input
        return sum(sizes) + (0 if inductor_kernel(e.name) or e.name.endswith("_") else max(sizes))

    def work(self, cls: str, chain: list[Any]) -> tuple[int | None, float | None]:
        """(op id, FLOPs or bytes) of the op whose work a launch of class `cls` does."""
        for c in chain if cls in ("gemm", "attention") else ():
            shapes = c.input_shapes or []
            if cls == "attention" and ATTENTION_OP.search(c.name) and len(shapes) > 1:
                q, k = shapes[0], shapes[1]
                if isinstance(q, list) and isinstance(k, list) and len(q) == len(k) == 4:
                    return c.id, 4.0 * q[0] * q[1] * q[2] * k[2] * q[3]
            if cls == "gemm" and (flops := _gemm_flops(c.name, shapes, getattr(c, "concrete_inputs", None)) or c.flops):
                return c.id, float(flops)
        op = chain[0]
        if cls in ("elementwise", "copy") and (inductor_kernel(op.name) or classify(op.name) == cls):
            return op.id, self.op_bytes(op)
        return None, None

    def patch_conv(self, chain: list[Any]) -> str:
        conv = next((c for c in chain if CONV_OP.search(c.name)), None)
        shapes = (conv.input_shapes or []) if conv is not None else []
        w = shapes[1] if len(shapes) > 1 and isinstance(shapes[1], list) and len(shapes[1]) > 2 else None
        if w is None:
            return ""
        ci = getattr(conv, "concrete_inputs", None)
        stride, pad, dil = (_arg(ci, i) for i in (3, 4, 5))
        if all(isinstance(v, list) for v in (stride, pad, dil)):
            full = "convolution" in conv.name
            groups, transposed = _arg(ci, 8 if full else 6), full and _arg(ci, 6)
            ok = stride == w[2:] and max(stride) > 1 and not any(pad) and set(dil) <= {1} and groups in (1, None)
            if not ok or transposed:
                return ""
        elif tuple(w) not in self.patches:
            return ""
        where = self.patches.get(tuple(w), conv.name)
        return f"the patch-embedding convolution {where} (weight {'x'.join(map(str, w))}, stride = kernel)"

    def launch(self, name: str, start_us: float, dur_us: float, op: Any | None, nbytes: float = 0) -> Launch:
        chain = self.chain(op) if op is not None else []
        outer = next((c for c in reversed(chain) if OP.match(c.name)), chain[0] if chain else None)
        cls = classify(name, [c.name for c in chain])
        key, work = (None, float(nbytes)) if nbytes > 0 else self.work(cls, chain) if chain else (None, None)
        group = outer.id if outer is not None else -1
        source, patch = (self.source(chain), self.patch_conv(chain)) if chain else ("", "")
        return Launch(name, start_us, dur_us, cls, group, source, key, work, patch)

    def gpu_launches(self) -> list[Launch]:
        out = []
        for k in self.kineto:
            if k.device_type() != torch.autograd.DeviceType.CUDA or _annotation(k):
                continue
            start_us = k.start_ns() / 1e3 if hasattr(k, "start_ns") else k.start_us()
            dur_us = duration_us(k)
            op = self.by_id.get(k.linked_correlation_id())
            out.append(self.launch(k.name(), start_us, dur_us, op, k.nbytes() if hasattr(k, "nbytes") else 0))
        return out

    def cpu_launches(self) -> list[Launch]:
        """One launch per op (and Inductor kernel) for its own time: its span less the ops inside it."""
        counted = [e for e in self.cpu if OP.match(e.name) or inductor_kernel(e.name) or _compiled_call(e.name)]
        ids = {id(e) for e in counted}
        inner_us: dict[int, float] = defaultdict(float)
        has_kernels: set[int] = set()
        for e in counted:
            p = e.cpu_parent
            while p is not None and id(p) not in ids:
                p = p.cpu_parent
            if p is not None:
                inner_us[id(p)] += e.time_range.elapsed_us()
                if inductor_kernel(e.name):
                    has_kernels.add(id(p))
        out = []
        for e in counted:
            x = self.launch(e.name, e.time_range.start, e.time_range.elapsed_us() - inner_us[id(e)], e)
            if _compiled_call(e.name):  # Inductor's C++ kernels run in here unless profiled one by one
                inside = id(e) in has_kernels
                how = "wrapper" if inside else f"C++ kernels and wrapper ({_CPP_KERNELS})"
                x = dataclasses.replace(x, cls="other" if inside else "elementwise", source=f"compiled graph's {how}")
            out.append(x)
        return out


_CPP_KERNELS = "to see each kernel, compile under torch._inductor.config.cpp.enable_kernel_profile=True"


def _compiled_call(name: str) -> bool:
    return name.startswith("## Call CompiledFxGraph")


def _annotation(k: Any) -> bool:
    """A record_function range shown on the GPU's timeline: it spans kernels, it is not one."""
    if hasattr(k, "is_user_annotation") and k.is_user_annotation():
        return True
    return k.name() == REGION or k.name().startswith(("## ", "ProfilerStep"))
