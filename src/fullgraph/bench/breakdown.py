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
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fullgraph._capture import quiet_profiler_lines
from fullgraph.bench.ceilings import ceilings_for, dtype_tag
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
REGION = "fullgraph.breakdown"


_GEMM_OPS = "mm addmm bmm baddbmm matmul linear _addmm_activation addmv mv einsum _scaled_mm _int_mm"
_COPY_OPS = r"""copy_ clone contiguous _to_copy to cat stack fill_ zero_ zeros zeros_like ones full _reshape_copy
constant_pad_nd to_mkldnn _to_dense repeat \w+_copy"""
_OTHER_OPS = r"""view _unsafe_view reshape t transpose permute as_strided_? expand squeeze unsqueeze select slice narrow
unbind split\w* chunk detach alias resolve_conj resolve_neg empty\w* new_empty\w* lift_fresh flatten unflatten
_local_scalar_dense item resize_ set_ \w*index\w* gather scatter\w* sort topk nonzero unique\w* embedding randperm"""
# removed from an Inductor kernel's fused-op list, longest first: nothing left means the kernel only moves data
_FUSED_COPIES = ["_to_copy", "_unsafe_view", "constant_pad_nd", "as_strided", "transpose", "unsqueeze", "squeeze"]
_FUSED_COPIES += ["permute", "expand", "select", "slice", "clone", "copy", "view", "cat", "t"]


def _names(words: str) -> str:
    return rf"::({'|'.join(words.split())})$"


_OP = re.compile(r"^\w+::[\w.]+$")  # "aten::addmm", "fullgraph::rms_norm": an op, not a kernel's name
_INDUCTOR = re.compile(r"^(?:graph_\d+_)?(?:triton|cpp)_(?:(poi|red|per|tem|for)_)?fused_?(\w*?)(?:_\d+)?$")
_KERNEL_RULES = [  # kernel names (not ops), first match wins
    (cls, re.compile(rule, re.I))
    for cls, rule in (
        ("attention", "sdpa|fmha|flash|attention|attn"),
        ("copy", "memcpy|memset|copy|nchwtonhwc|nhwctonchw|transpose|convert|tensortransform"),
        ("other", "at::native::.*(index|gather|scatter|sort|topk|embedding|nonzero|unique|radix)"),
        ("elementwise", "at::native::"),  # ATen's own kernels: elementwise, reductions, norms, softmax
        ("gemm", r"gemm|gemv|cutlass|cublas|nvjet|xmma|wgmma|conv|fprop|dgrad|wgrad|splitk|sm\d\d_"),
        ("elementwise", "elementwise|reduce|norm|softmax|gelu|silu|relu|rope|modulat|welford"),
    )
]
_OP_RULES = [  # op names ("ns::name"), first match wins
    (cls, re.compile(rule))
    for cls, rule in (
        ("attention", "attention|sdpa|flash|fmha"),
        ("gemm", _names(_GEMM_OPS) + "|conv"),
        ("copy", _names(_COPY_OPS)),
        ("other", _names(_OTHER_OPS)),
        ("elementwise", "^(aten|prims|fullgraph)::"),  # any other op of aten's or ours
        ("other", ""),
    )
]
_REDUCTION = re.compile(r"norm|softmax|sum|mean|var|std|amax|amin|max|min|reduce|welford|cumsum|prod|logsumexp")
_LAYOUT = re.compile(r"nchwtonhwc|nhwctonchw|transpose|convert|tensortransform", re.I)
_ATTENTION_OP = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention|fullgraph::sdpa")
_CONV_OP = re.compile(_names("conv1d conv2d conv3d convolution _convolution"))  # (x, w, b, stride, padding, ...)
_ITEMSIZE = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "bool": 1}
_ITEMSIZE |= {"short int": 2, "unsigned char": 1, "signed char": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1}


def inductor_kernel(name: str) -> tuple[str, str] | None:
    """(kind, fused ops) of an Inductor kernel name: "triton_poi_fused_add_gelu_3" -> ("poi", "add_gelu")."""
    m = _INDUCTOR.match(name)
    return (m.group(1) or "", m.group(2)) if m else None


def _copy_only(fused: str) -> bool:
    for op in _FUSED_COPIES:
        fused = fused.replace(op, "")
    return not fused.strip("_")


def classify(name: str, ops: Sequence[str] = ()) -> str:
    """The class of a kernel (or op) `name`; `ops` are the ops that launched it, innermost first (a fallback)."""
    if _OP.match(name):
        return next(cls for cls, rule in _OP_RULES if rule.search(name))
    if found := inductor_kernel(name):
        kind, fused = found
        if kind == "tem":  # Inductor's templates: GEMM, convolution or flex attention
            return "attention" if re.search("attention|flex", fused) else "gemm"
        return "copy" if fused and _copy_only(fused) else "elementwise"
    for cls, rule in _KERNEL_RULES:
        if rule.search(name):
            return cls
    return next((classify(op) for op in ops if _OP.match(op)), "other")


def is_pointwise(name: str, cls: str) -> bool:
    """An elementwise kernel that reduces nothing: what a GEMM epilogue could absorb."""
    if cls != "elementwise":
        return False
    if found := inductor_kernel(name):  # Triton says so in the name; C++ kernels only through their ops
        return found[0] == "poi" or (found[0] == "" and not _REDUCTION.search(found[1]))
    if "elementwise_kernel" in name:  # ATen's TensorIterator kernels (reductions are reduce_kernel)
        return True
    return bool(_OP.match(name)) and not _REDUCTION.search(name)


def is_layout_conversion(name: str, cls: str) -> bool:
    found = inductor_kernel(name)
    if found and cls == "copy":
        return bool(re.search("clone|permute|transpose", found[1]))
    return cls == "copy" and bool(_LAYOUT.search(name))


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


def _ceiling(cls: str, ceilings: dict[str, float], dtype: str) -> float | None:
    if cls in ("gemm", "attention"):
        gemm = [v for k, v in ceilings.items() if k.startswith("gemm_tflops_")]
        return ceilings.get(f"gemm_tflops_{dtype}", gemm[0] if len(gemm) == 1 else None)
    return ceilings.get("copy_tbps") if cls in ("elementwise", "copy") else None


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
) -> Breakdown:
    """Per-call class totals, top kernels and flags from the launches of `calls` calls."""
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
        ceiling = _ceiling(cls, ceilings, dtype)
        pct = 100.0 * rate / ceiling if rate is not None and ceiling else None
        share = us / kernel_us if kernel_us > 0 else 0.0
        classes.append(ClassTime(cls, us / calls / 1e3, share, round(len(group) / calls), rate, unit, pct))
    flags = find_flags(launches, calls=calls, call_ms=call_ms, idle_share=idle_share, cuda_graphs=cuda_graphs)
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
    base = x.name.removeprefix("void ").split("<")[0].split("(")[0].split("::")[-1]
    return f"{base} ({x.source})" if base != x.name and x.source else base[:60]


FIXES = {
    "conv-as-gemm": "compute the patch embedding as a GEMM: reshape x into patches [B·N, C·p·p] and call "
    "F.linear(patches, conv.weight.flatten(1), conv.bias); DESIGN.md measured ViT-B/16 1.22x faster with this and "
    "the GELU epilogue",
    "layout-conversion": "give each op the layout it reads: channels_last input and weights before a convolution "
    "(x.to(memory_format=torch.channels_last)), or a producer that writes the layout its consumer reads",
    "epilogue-candidate": "fuse the activation into the GEMM before it: torch._addmm_activation(bias, x, weight.t(), "
    "use_gelu=True) runs GELU (tanh form) as a cuBLASLt epilogue (use_gelu=False: ReLU); DESIGN.md measured "
    "ViT-B/16 1.22x faster with this and the patch-embedding GEMM",
    "launch-bound": 'compile with mode="reduce-overhead" (CUDA graphs), or capture the call in a torch.cuda.CUDAGraph',
}


def find_flags(
    launches: Sequence[Launch], *, calls: int, call_ms: float, idle_share: float | None, cuda_graphs: bool = False
) -> list[Flag]:
    """The flags that matter for these launches (`calls` calls of the model), largest first."""
    total = sum(x.dur_us for x in launches)
    flags = []

    def add(kind: str, us: float, message: str) -> None:
        if total > 0 and us / total >= FLAG_MIN_SHARE and us / calls >= FLAG_MIN_US:
            ms = us / calls / 1e3
            share = f"{100 * us / total:.1f}% of kernel time"
            flags.append(Flag(kind, f"{message}: {ms:.3f} ms per call ({share})", ms, FIXES[kind]))

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
) -> Breakdown:
    """Warm `fn` up, profile `calls` steady-state calls and say where the time goes, per call.

    `fn` runs as given (wrap it in `torch.no_grad()` for inference). `dtype` picks the GEMM ceiling (default: the
    model's parameters', else bf16); `model` lets patch-embedding convolutions be found by their modules;
    `ceilings` (e.g. {"copy_tbps": 4.27, "gemm_tflops_bf16": 760}) skips `ceilings_for`; `cuda_graphs=True`
    says the call already replays CUDA graphs, so low GPU occupancy is not blamed on launches.
    """
    if calls < 1 or warmup < 0:
        raise UsageError(f"need calls >= 1 and warmup >= 0 (got {calls}, {warmup})")
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
    events = _Events(prof, itemsize=(dtype or torch.float32).itemsize, patches=_patch_modules(model))
    launches = events.gpu_launches() if gpu else events.cpu_launches()
    call_ms, idle, method = wall_ms, None, "cpu-clock, profiled"
    if gpu:
        call_ms, method = measure(fn, device=device, warmup=1, reps=TIMING_REPS).median_ms, "cuda-events"
        idle = max(0.0, 1.0 - _busy_us(launches) / calls / 1e3 / call_ms)
        dtype = dtype or torch.bfloat16
    ceilings = ceilings_for(device, dtype) if ceilings is None else ceilings
    tag, kind = dtype_tag(dtype) if dtype else "", device.type
    args = dict(calls=calls, call_ms=call_ms, idle_share=idle, ceilings=ceilings, dtype=tag, cuda_graphs=cuda_graphs)
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
    if _CONV_OP.search(name) and len(mats) > 1 and all(isinstance(v, list) for v in (stride, pad, dil)):
        x, w = mats[0], mats[1]
        if ("convolution" in short and _arg(ci, 6)) or len(x) != len(w) or len(x) < 3:
            return None  # transposed, or shapes not recorded
        dims = zip(x[2:], w[2:], stride, pad, dil, strict=False)
        out = [(n + 2 * p - d * (k - 1) - 1) // st + 1 for n, k, st, p, d in dims]
        return 2.0 * x[0] * w[0] * math.prod(out) * math.prod(w[1:])
    return None


class _Events:
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
            if _OP.match(p.name):
                out.append(p)
            p = p.cpu_parent
        return out

    def source(self, chain: list[Any]) -> str:
        """The Inductor fusion a kernel's name lists, else the outermost op that launched it."""
        if found := inductor_kernel(chain[0].name):
            return f"Inductor fusion: {found[1] or chain[0].name}"
        return next((c.name for c in reversed(chain) if _OP.match(c.name)), "")

    def op_bytes(self, e: Any) -> float | None:
        """Bytes an op's kernels move, estimated from its tensor arguments (read or written once each)."""
        types = getattr(e, "input_dtypes", None) or self.dtypes.get((e.id, e.name))
        sizes = []
        for i, shape in enumerate(e.input_shapes or []):
            if isinstance(shape, (list, tuple)) and shape and all(isinstance(n, int) for n in shape):
                size = _ITEMSIZE.get(types[i]) if types and i < len(types) else None if types else self.itemsize
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
            if cls == "attention" and _ATTENTION_OP.search(c.name) and len(shapes) > 1:
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
        conv = next((c for c in chain if _CONV_OP.search(c.name)), None)
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
        outer = next((c for c in reversed(chain) if _OP.match(c.name)), chain[0] if chain else None)
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
            dur_us = k.duration_ns() / 1e3 if hasattr(k, "duration_ns") else k.duration_us()
            op = self.by_id.get(k.linked_correlation_id())
            out.append(self.launch(k.name(), start_us, dur_us, op, k.nbytes() if hasattr(k, "nbytes") else 0))
        return out

    def cpu_launches(self) -> list[Launch]:
        """One launch per op (and Inductor kernel) for its own time: its span less the ops inside it."""
        counted = [e for e in self.cpu if _OP.match(e.name) or inductor_kernel(e.name) or _compiled_call(e.name)]
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
