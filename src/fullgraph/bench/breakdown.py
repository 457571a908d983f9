"""Where a model's time goes: GPU kernel time per call by class, against the measured ceilings.

`profile_breakdown` warms a callable up, profiles a few steady-state calls with `torch.profiler` and sorts every
kernel (or, on the CPU, every op) into five classes: "gemm" (GEMM and convolution), "attention", "elementwise"
(fused elementwise and reductions: Inductor's, ours, ATen's), "copy" (copies, memsets, layout conversions) and
"other". Each class gets its achieved rate where the work is known: FLOPs of the aten op that launched a GEMM or
attention kernel (from its recorded shapes; SDPA counts 4·B·H·N·M·D), bytes of the tensors an elementwise or copy
kernel's op touches (an estimate: each argument read or written once). On CUDA `call_ms` is timed with CUDA
events apart from the profiler, and the GPU's idle share of that time says how launch-bound the call is.

Flags name waste a user can act on, each only when it costs at least `FLAG_MIN_SHARE` of the kernel time.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fullgraph._capture import quiet_profiler_lines
from fullgraph.bench.ceilings import ceilings_for, conv_dtype_tag, dtype_tag
from fullgraph.bench.kernel_classes import (
    CONV_OP,
    is_layout_conversion,
    is_pointwise,
    short_name,
)
from fullgraph.bench.profile_events import REGION, Events, Launch
from fullgraph.errors import UsageError
from fullgraph.timing import measure, resolve_device


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
    source: str = ""  # the aten op (outermost) that launched it, or the ops Inductor's kernel name says it fuses


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
    call_ms: float  # time per call: CUDA events apart from the profiler on CUDA, profiled wall time on the CPU
    kernel_ms: float  # summed device (GPU) or op (CPU) time per call
    idle_share: float | None  # share of wall time the GPU ran nothing (launch-bound); None on the CPU
    classes: list[ClassTime] = field(default_factory=list)
    top: list[KernelTime] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    ceilings: dict[str, float] = field(default_factory=dict)  # e.g. {"copy_tbps": 4.27, "gemm_tflops_bf16": 760}
    calls: int = 0  # steady-state calls profiled
    call_method: str = ""  # how call_ms was taken: "cuda-events" or "cpu-clock, profiled"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Breakdown:
        d = dict(d)
        d["classes"] = [ClassTime(**c) for c in d.get("classes", [])]
        d["top"] = [KernelTime(**k) for k in d.get("top", [])]
        d["flags"] = [Flag(**f) for f in d.get("flags", [])]
        return cls(**d)


CLASSES = ("gemm", "attention", "elementwise", "copy", "other")
# A flag names waste worth a change to the model: at least 1% of the summed kernel time (ViT-B/16 at batch 256:
# its GELU pass was 12.8%, its NCHW->NHWC conversion 2.8%, its patch-embedding convolution 6.9%; DESIGN.md).
FLAG_MIN_SHARE = 0.01
# ...and at least 5 us per call: a model whose whole kernel time is 20 us has no waste worth a change (the GPU
# idles: the launch-bound flag says what to do instead).
FLAG_MIN_US = 5.0
LAUNCH_BOUND_IDLE = 0.30  # launch-bound: the GPU ran nothing for more than 30% of the call
TOP_N = 10
TIMING_REPS = 20  # CUDA-event repetitions for call_ms, apart from the profiler


def _rate(cls: str, launches: list[Launch]) -> tuple[float | None, str]:
    if cls == "other":
        return None, ""
    known = [x for x in launches if x.work is not None and x.work > 0]
    us = sum(x.dur_us for x in known)
    if not known or us <= 0:
        return None, ""
    work = sum({x.work_key if x.work_key is not None else id(x): x.work for x in known}.values())
    scale = 1e12 * us * 1e-6
    return (work / scale, "TFLOP/s") if cls in ("gemm", "attention") else (work / scale, "TB/s")


_CONV_KERNEL = re.compile(r"conv|fprop|dgrad|wgrad", re.I)  # cuDNN's convolution kernels, by name


def _is_conv(x: Launch) -> bool:
    """A convolution's launch (its aten op, or a cuDNN kernel's name): it runs in cuDNN's math mode."""
    return bool(CONV_OP.search(x.source) or _CONV_KERNEL.search(x.name))


def _gemm_ceiling(ceilings: dict[str, float], tag: str) -> float | None:
    """The GEMM ceiling measured in math mode `tag`; with no tag given, the only one there is."""
    gemm = [v for k, v in ceilings.items() if k.startswith("gemm_tflops_")]
    return ceilings.get(f"gemm_tflops_{tag}") if tag else (gemm[0] if len(gemm) == 1 else None)


def _ceiling(cls: str, group: Sequence[Launch], ceilings: dict[str, float], dtype: str, conv: str) -> float | None:
    """The rate the class would reach with every op at its own math mode's ceiling: convolutions at `conv`'s
    (cuDNN's flag), GEMMs and attention at `dtype`'s (the matmul precision). A class mixing both modes (fp32
    convolutions in TF32 beside fp32 GEMMs) gets the work-weighted ceiling; None where one is missing."""
    if cls not in ("gemm", "attention"):
        return _memory_ceiling(group, ceilings) if cls in ("elementwise", "copy") else None
    ops = {x.work_key if x.work_key is not None else id(x): x for x in group if x.work}
    modes = {k: conv if cls == "gemm" and _is_conv(x) else dtype for k, x in ops.items()}
    tops = {m: _gemm_ceiling(ceilings, m) for m in set(modes.values()) or {dtype}}
    if not all(tops.values()):
        return None
    if not ops:
        return tops[dtype]
    return sum(x.work for x in ops.values()) / sum(x.work / tops[modes[k]] for k, x in ops.items())


def _memory_ceiling(group: Sequence[Launch], ceilings: dict[str, float]) -> float | None:
    """The rate the class would reach with each op's bytes, up to the L2's size, moved at the L2's copy rate and the
    rest at memory's: an op whose tensors fit in L2 (an eager op reading what the op before it just wrote) can pass
    the memory's rate, and no more than the L2's size of its bytes can come from there. Without the L2's figures
    (an older cache entry), the copy from memory."""
    hbm, l2, l2_bytes = (ceilings.get(k) for k in ("copy_tbps", "l2_tbps", "l2_bytes"))
    ops = {x.work_key if x.work_key is not None else id(x): x.work for x in group if x.work}
    if not hbm or not l2 or not l2_bytes or not ops:
        return hbm
    ideal = sum(min(b, l2_bytes) / max(l2, hbm) + max(0.0, b - l2_bytes) / hbm for b in ops.values())
    return sum(ops.values()) / ideal


def summarize(
    launches: Sequence[Launch],
    *,
    label: str,
    device: str,
    calls: int,
    call_ms: float,
    idle_share: float | None,
    ceilings: dict[str, float] | None = None,
    dtype: str = "",
    cuda_graphs: bool = False,
    call_method: str = "",
    conv_dtype: str | None = None,
) -> Breakdown:
    """Per-call class totals, top kernels and flags from the launches of `calls` calls. `dtype` is the math mode
    of GEMMs ("tf32" for float32 under a TF32 matmul precision), `conv_dtype` that of convolutions (cuDNN's own
    flag; default: `dtype`); each kernel's rate is judged against its own mode's ceiling."""
    ceilings = dict(ceilings or {})
    kernel_us = sum(x.dur_us for x in launches)
    by_cls: dict[str, list[Launch]] = defaultdict(list)
    for x in launches:
        by_cls[x.cls].append(x)
    classes = []
    for cls in CLASSES:
        group = by_cls.get(cls, [])
        us = sum(x.dur_us for x in group)
        rate, unit = _rate(cls, group)
        ceiling = _ceiling(cls, group, ceilings, dtype, dtype if conv_dtype is None else conv_dtype)
        pct = 100.0 * rate / ceiling if rate is not None and ceiling else None
        share = us / kernel_us if kernel_us > 0 else 0.0
        classes.append(ClassTime(cls, us / calls / 1e3, share, round(len(group) / calls), rate, unit, pct))
    flags = find_flags(
        launches, calls=calls, call_ms=call_ms, idle_share=idle_share, cuda_graphs=cuda_graphs, device=device
    )
    top = _top(launches, calls)
    return Breakdown(
        label, device, call_ms, kernel_us / calls / 1e3, idle_share, classes, top, flags, ceilings, calls, call_method
    )


def _top(launches: Sequence[Launch], calls: int) -> list[KernelTime]:
    by_name: dict[str, list[Launch]] = defaultdict(list)
    for x in launches:
        by_name[x.name].append(x)
    rows = []
    for name, group in by_name.items():
        sources: dict[str, float] = defaultdict(float)
        for x in group:
            sources[x.source] += x.dur_us
        source = max(sources, key=sources.__getitem__)
        us = sum(x.dur_us for x in group)
        rows.append(KernelTime(name, group[0].cls, us / calls / 1e3, max(1, round(len(group) / calls)), source))
    return sorted(rows, key=lambda k: -k.ms)[:TOP_N]


def _steps(launches: Sequence[Launch]) -> list[tuple[str, bool, float, Launch]]:
    """Launch order as (class, pointwise, µs, longest launch) per op: consecutive launches of one op are one step,
    of the class of its longest launch; memsets and ops of class "other" (views) are skipped."""
    steps: list[list[Launch]] = []
    for x in sorted(launches, key=lambda x: x.start_us):
        if x.cls == "other" or "memset" in x.name.lower():
            continue
        if steps and x.group >= 0 and steps[-1][0].group == x.group:
            steps[-1].append(x)
        else:
            steps.append([x])
    out = []
    for step in steps:
        main = max(step, key=lambda x: x.dur_us)
        out.append((main.cls, is_pointwise(main.name, main.cls), sum(x.dur_us for x in step), main))
    return out


def _short(x: Launch) -> str:
    """A kernel's name without its template arguments, with its op where the name alone says little."""
    base = short_name(x.name)
    return f"{base} ({x.source})" if base != x.name and x.source else base[:60]


FIXES = {
    "conv-as-gemm": "fullgraph.compile does it inside the compiled graph: rewrite patch_gemm, on by default on "
    "CUDA for image patch embeddings (rewrites=['patch_gemm'] for other stride = kernel convolutions; "
    "docs/rewrites.md); by hand, compute the patch embedding as a GEMM: reshape x into patches [B·N, C·p·p] "
    "and call F.linear(patches, conv.weight.flatten(1), conv.bias); measured on ViT-B/16 (H200): 1.22x faster with "
    "this and the GELU epilogue",
    "layout-conversion": "give each op the layout it reads: channels_last input and weights before a convolution "
    "(x.to(memory_format=torch.channels_last)), or a producer that writes the layout its consumer reads",
    "epilogue-candidate": "fuse the activation into the GEMM before it: fullgraph.compile's rewrite gelu_epilogue "
    "does it for a linear + tanh GELU (cuBLASLt's epilogue), and for an exact GELU runs our GEMM with the GELU in its "
    "epilogue where measured to win (or with fullgraph.ops.policy(linear_gelu='kernel'); approximate_gelu=True takes "
    "the tanh form instead: docs/rewrites.md); by hand, "
    "torch._addmm_activation(bias, x, weight.t(), use_gelu=True) runs GELU (tanh form) as a cuBLASLt epilogue "
    "(use_gelu=False: ReLU); measured on ViT-B/16 (H200): 1.22x faster with this and the patch-embedding GEMM",
    "launch-bound": 'compile with mode="reduce-overhead" (CUDA graphs), or capture the call in a torch.cuda.CUDAGraph',
}
# On the CPU there is no cuBLASLt, and its GELU epilogue is the tanh form, which changes an exact GELU: no fix is
# offered for the kernels between GEMMs there, only what was seen.
CPU_FIXES = FIXES | {
    "epilogue-candidate": "none offered on the CPU: a GEMM epilogue for the activation (cuBLASLt) needs CUDA",
}


def find_flags(
    launches: Sequence[Launch],
    *,
    calls: int,
    call_ms: float,
    idle_share: float | None,
    cuda_graphs: bool = False,
    device: str = "cuda",
) -> list[Flag]:
    """The flags that matter for these launches (`calls` calls of the model on `device`), largest first."""
    fixes = FIXES if device == "cuda" else CPU_FIXES
    total = sum(x.dur_us for x in launches)
    flags = []

    def add(kind: str, us: float, message: str) -> None:
        if total > 0 and us / total >= FLAG_MIN_SHARE and us / calls >= FLAG_MIN_US:
            ms = us / calls / 1e3
            share = f"{100 * us / total:.1f}% of kernel time"
            flags.append(Flag(kind, f"{message}: {ms:.3f} ms per call ({share})", ms, fixes[kind]))

    def some(launches: Sequence[Launch]) -> str:
        return ", ".join(sorted({_short(x) for x in launches})[:3])

    patch = [x for x in launches if x.patch_conv]
    what = min((x.patch_conv for x in patch), default="")
    add("conv-as-gemm", sum(x.dur_us for x in patch), f"{what} runs as a convolution, with its layout conversions")
    layout = [x for x in launches if is_layout_conversion(x.name, x.cls) and not x.patch_conv]
    n = round(len(layout) / calls)
    add("layout-conversion", sum(x.dur_us for x in layout), f"{n} layout conversions per call ({some(layout)})")
    steps = _steps(launches)
    between = [s for i, s in enumerate(steps[1:-1], 1) if s[1] and steps[i - 1][0] == "gemm" == steps[i + 1][0]]
    n, names = round(len(between) / calls), some([s[3] for s in between])
    add("epilogue-candidate", sum(s[2] for s in between), f"{n} standalone elementwise kernels between GEMMs ({names})")
    if idle_share is not None and idle_share > LAUNCH_BOUND_IDLE and not cuda_graphs:
        ms = idle_share * call_ms
        message = f"the GPU is idle {100 * idle_share:.0f}% of each call ({ms:.3f} ms), waiting for kernel launches"
        flags.append(Flag("launch-bound", message, ms, FIXES["launch-bound"]))
    return sorted(flags, key=lambda f: -f.ms)


# ---- profiling --------------------------------------------------------------------------------------------


def profile_breakdown(
    fn: Callable[[], Any],
    *,
    device: str | torch.device | None,
    label: str,
    calls: int = 5,
    warmup: int = 3,
    ceilings: dict[str, float] | None = None,
    dtype: torch.dtype | None = None,
    model: torch.nn.Module | None = None,
    cuda_graphs: bool = False,
    timing_reps: int = TIMING_REPS,
) -> Breakdown:
    """Warm `fn` up, profile `calls` steady-state calls and say where the time goes, per call.

    `fn` runs as given (wrap it in `torch.no_grad()` for inference). `dtype` picks the GEMM ceiling (default: the
    model's parameters', else bf16); `model` lets patch-embedding convolutions be found by their modules;
    `ceilings` (e.g. {"copy_tbps": 4.27, "gemm_tflops_bf16": 760}) skips `ceilings_for`; `cuda_graphs=True`
    says the call already replays CUDA graphs, so low GPU occupancy is not blamed on launches. On a GPU the call's
    time comes from `timing_reps` calls timed by CUDA events, apart from the profiler.
    """
    if calls < 1 or warmup < 0 or timing_reps < 1:
        raise UsageError(f"need calls >= 1, warmup >= 0 and timing_reps >= 1 (got {calls}, {warmup}, {timing_reps})")
    device = resolve_device(device)
    gpu = device.type == "cuda"
    for _ in range(warmup):
        fn()
    _sync(device)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
    # no with_stack: its Python tracer keeps raw pointers to code objects, which can be freed before the events are
    # read (torch's UnicodeDecodeError in _parse_kineto_results, pytorch/pytorch#136040; seen here on torch 2.13)
    profile = torch.profiler.profile(activities=activities, record_shapes=True, with_flops=True)
    with quiet_profiler_lines(), profile as prof, torch.profiler.record_function(REGION):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        wall_ms = (time.perf_counter() - t0) * 1e3 / calls
    params = model.parameters() if model is not None else ()
    dtype = dtype or next((p.dtype for p in params if p.is_floating_point()), None)
    events = Events(prof, itemsize=(dtype or torch.float32).itemsize, patches=_patch_modules(model))
    launches = events.gpu_launches() if gpu else events.cpu_launches()
    call_ms, idle, method = wall_ms, None, "cpu-clock, profiled"
    if gpu:
        call_ms, method = measure(fn, device=device, warmup=1, reps=timing_reps).median_ms, "cuda-events"
        idle = max(0.0, 1.0 - _busy_us(launches) / calls / 1e3 / call_ms)
        dtype = dtype or torch.bfloat16
    ceilings = ceilings_for(device, dtype) if ceilings is None else ceilings
    tag, conv = (dtype_tag(dtype), conv_dtype_tag(dtype)) if dtype else ("", "")
    kind = device.type
    args = dict(calls=calls, call_ms=call_ms, idle_share=idle, ceilings=ceilings, dtype=tag, cuda_graphs=cuda_graphs)
    args["conv_dtype"] = conv
    return summarize(launches, label=label, device=kind, call_method=method, **args)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _busy_us(launches: Sequence[Launch]) -> float:
    """Time at least one kernel ran: the union of the launches' intervals, over all streams."""
    busy, end = 0.0, float("-inf")
    for x in sorted(launches, key=lambda x: x.start_us):
        lo, hi = max(x.start_us, end), x.start_us + x.dur_us
        busy += max(0.0, hi - lo)
        end = max(end, hi)
    return busy


def _patch_modules(model: torch.nn.Module | None) -> dict[tuple[int, ...], str]:
    """Weight shape -> module name of the convolutions that cut an image into patches (kernel == stride > 1)."""
    found = {}
    for name, m in model.named_modules() if model is not None else ():
        if isinstance(m, torch.nn.modules.conv._ConvNd) and not m.transposed and m.groups == 1:
            pad = m.padding in ("valid", 0) or all(p == 0 for p in m.padding)
            if pad and tuple(m.kernel_size) == tuple(m.stride) and max(m.stride) > 1 and set(m.dilation) == {1}:
                found[tuple(m.weight.shape)] = name
    return found
